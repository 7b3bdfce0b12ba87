"""Planner rules for provider faults (issue 11): stopped before boot, unneeded boots."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.fleet.planner import InstanceSnapshot, JobCounts, MarkDead, MarkStarting, plan_fleet
from tests.fleet.test_planner import NOW, Case, ago, build, describe, prof, wkr

A, B = "a", "b"


def booting(wid: str, profile: str = A, **kw: object) -> object:
    base: dict[str, object] = {
        "state": "booting",
        "requested_at": ago(60),
        "booted_at": None,
        "ready_at": None,
        "idle_since": None,
    }
    base.update(kw)
    return wkr(wid, profile, **base)  # type: ignore[arg-type]


def starting(*wids: str) -> list[InstanceSnapshot]:
    return [InstanceSnapshot("scaleway", f"i-{w}", "starting", w, A) for w in wids]


def stopped(wid: str, detail: str = "out of stock", state: str = "stopped") -> InstanceSnapshot:
    return InstanceSnapshot("scaleway", f"i-{wid}", state, wid, A, detail)


CASES = [
    # -- a server that falls back to stopped before it booted is out of stock -----------------
    Case(
        "stopped before it booted: out of stock",
        [prof(A), prof(B)],
        workers=[booting("w1")],  # type: ignore[list-item]
        inventory=[stopped("w1")],
        expect={"dead w1 (out of stock)", "delete w1 (out of stock)"},
    ),
    Case(
        "stopped in place after it was seen starting: out of stock too",
        [prof(A)],
        workers=[booting("w1", seen_starting=True)],  # type: ignore[list-item]
        inventory=[stopped("w1", "", "stopped in place")],
        expect={"dead w1 (out of stock)", "delete w1 (out of stock)"},
    ),
    # Review of issue 11, L4: right after an accepted power-on a read may still show the
    # server `stopped`, nothing said: that is not a stock-out (the boot timeout still bounds it).
    Case(
        "stopped, nothing said, never seen starting: the power-on does not show yet",
        [prof(A), prof(B)],
        workers=[booting("w1")],  # type: ignore[list-item]
        counts=[JobCounts(A, dispatched=1)],
        inventory=[stopped("w1", "")],
        expect=set(),
    ),
    Case(
        "stopped, nothing said, after it was seen starting: out of stock",
        [prof(A), prof(B)],
        workers=[booting("w1", seen_starting=True)],  # type: ignore[list-item]
        counts=[JobCounts(A, dispatched=1)],
        inventory=[stopped("w1", "")],
        expect={"dead w1 (out of stock)", "delete w1 (out of stock)", "provision a x1"},
    ),
    Case(
        "stopped with a shortage said, never seen starting: out of stock",
        [prof(A)],
        workers=[booting("w1")],  # type: ignore[list-item]
        inventory=[stopped("w1", "node shortage")],
        expect={"dead w1 (out of stock)", "delete w1 (out of stock)"},
    ),
    Case(
        "ran, then stopped before it was ready: a failed boot, not stock (issue 32 §2)",
        [prof(A)],
        workers=[booting("w1", booted_at=ago(30))],  # type: ignore[list-item]
        inventory=[stopped("w1", "")],
        expect={"dead w1 (boot failed)", "delete w1 (boot failed)"},
    ),
    Case(
        "still starting: nothing yet",
        [prof(A)],
        workers=[booting("w1")],  # type: ignore[list-item]
        counts=[JobCounts(A, dispatched=1)],
        inventory=[InstanceSnapshot("scaleway", "i-w1", "starting", "w1", A)],
        expect=set(),
    ),
    # -- a booting worker nothing waits for is retired now ------------------------------------
    Case(
        "its only job was cancelled: retired",
        [prof(A)],
        workers=[booting("w1")],  # type: ignore[list-item]
        inventory=starting("w1"),
        expect={"delete w1 (not needed)"},
    ),
    Case(
        "a job waits on its queue: kept",
        [prof(A)],
        workers=[booting("w1")],  # type: ignore[list-item]
        counts=[JobCounts(A, dispatched=1)],
        inventory=starting("w1"),
        expect=set(),
    ),
    Case(
        "jobs wait unassigned: kept, and given one",
        [prof(A)],
        workers=[booting("w1")],  # type: ignore[list-item]
        queued=1,
        inventory=starting("w1"),
        expect={"dispatch j0->a"},
    ),
    Case(
        "two booting for one job: the younger goes",
        [prof(A)],
        workers=[booting("w1", requested_at=ago(100)), booting("w2", requested_at=ago(50))],  # type: ignore[list-item]
        counts=[JobCounts(A, dispatched=1)],
        inventory=starting("w1", "w2"),
        expect={"delete w2 (not needed)"},
    ),
    Case(
        "a free ready worker takes the job: the booting one goes",
        [prof(A)],
        workers=[wkr("w1"), booting("w2")],  # type: ignore[list-item]
        counts=[JobCounts(A, dispatched=1)],
        inventory=starting("w1", "w2"),
        expect={"delete w2 (not needed)"},
    ),
    Case(
        "a busy booting worker (claimed early) is kept",
        [prof(A)],
        workers=[booting("w1", busy=True)],  # type: ignore[list-item]
        counts=[JobCounts(A, running=1)],
        inventory=starting("w1"),
        expect=set(),
    ),
    Case(
        "a disabled profile's booting worker goes even while jobs wait",
        [prof(A, enabled=False), prof(B)],
        workers=[booting("w1")],  # type: ignore[list-item]
        queued=1,
        inventory=starting("w1"),
        expect={"delete w1 (not needed)", "provision b x1"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    assert describe(plan_fleet(build(case))) == case.expect


def test_only_a_stop_before_boot_is_a_capacity_death() -> None:
    case = CASES[0]
    (mark,) = [a for a in plan_fleet(build(case)).actions if isinstance(a, MarkDead)]
    assert mark.capacity and not mark.failed_boot
    assert "out of stock" in mark.reason
    after_boot = next(c for c in CASES if c.name.startswith("ran, then stopped"))
    (mark,) = [a for a in plan_fleet(build(after_boot)).actions if isinstance(a, MarkDead)]
    assert not mark.capacity
    # ...and a failed boot, confirmed (one holds the profile, the job is charged): before
    # issue 32 §2 it was an uncounted `instance stopped`, and a worker that exits at start
    # was replaced again and again (66 boots in 300 s, jobs queued with 0 attempts).
    assert mark.failed_boot and mark.death.confirmed
    assert "stopped before it was ready" in mark.reason


def test_a_boot_timeout_is_a_failed_boot() -> None:
    case = Case(
        "boot timeout",
        [prof(A)],
        workers=[booting("w1", requested_at=NOW - timedelta(seconds=901))],  # type: ignore[list-item]
    )
    (mark,) = [a for a in plan_fleet(build(case)).actions if isinstance(a, MarkDead)]
    assert mark.failed_boot and not mark.capacity


def test_a_worker_rejected_at_readiness_is_a_failed_boot() -> None:
    """Review of issue 11, H3: a runtime the profile refuses is a boot that failed."""
    rejected = wkr(
        "w1",
        A,
        state="failed",
        ready_at=None,
        idle_since=None,
        error="runtime rejected: device: worker runs on 'cpu', profile a runs on a GPU (cuda)",
        delete_reason="runtime rejected",
    )
    case = Case("runtime rejected", [prof(A)], workers=[rejected])
    plan = plan_fleet(build(case))
    (mark,) = [a for a in plan.actions if isinstance(a, MarkDead)]
    assert mark.failed_boot and not mark.capacity
    assert mark.reason.startswith("runtime rejected: device: worker runs on 'cpu'")
    assert describe(plan) == {"dead w1 (runtime rejected)", "delete w1 (runtime rejected)"}


def test_an_instance_seen_starting_is_recorded_once() -> None:
    case = Case("seen starting", [prof(A)], workers=[booting("w1")], inventory=starting("w1"))  # type: ignore[list-item]
    marks = [a for a in plan_fleet(build(case)).actions if isinstance(a, MarkStarting)]
    assert marks == [MarkStarting("w1")]
    seen = Case(
        "seen before",
        [prof(A)],
        workers=[booting("w1", seen_starting=True)],  # type: ignore[list-item]
        inventory=starting("w1"),
    )
    assert not [a for a in plan_fleet(build(seen)).actions if isinstance(a, MarkStarting)]
