"""Planner rules for provider faults (issue 11): stopped before boot, unneeded boots."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.fleet.planner import InstanceSnapshot, JobCounts, MarkDead, plan_fleet
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
        "stopped in place before it booted: out of stock too",
        [prof(A)],
        workers=[booting("w1")],  # type: ignore[list-item]
        inventory=[stopped("w1", "", "stopped in place")],
        expect={"dead w1 (out of stock)", "delete w1 (out of stock)"},
    ),
    Case(
        "stopped after it booted: instance stopped, not stock",
        [prof(A)],
        workers=[booting("w1", booted_at=ago(30))],  # type: ignore[list-item]
        inventory=[stopped("w1", "")],
        expect={"dead w1 (instance stopped)", "delete w1 (instance stopped)"},
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
    after_boot = CASES[2]
    (mark,) = [a for a in plan_fleet(build(after_boot)).actions if isinstance(a, MarkDead)]
    assert not mark.capacity


def test_a_boot_timeout_is_a_failed_boot() -> None:
    case = Case(
        "boot timeout",
        [prof(A)],
        workers=[booting("w1", requested_at=NOW - timedelta(seconds=901))],  # type: ignore[list-item]
    )
    (mark,) = [a for a in plan_fleet(build(case)).actions if isinstance(a, MarkDead)]
    assert mark.failed_boot and not mark.capacity
