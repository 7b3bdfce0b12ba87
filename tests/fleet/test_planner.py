"""Table-driven tests of the pure planner: every fleet rule, no services."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from app.fleet.planner import (
    ActiveJob,
    Delete,
    DeleteOrphan,
    Dispatch,
    FleetPlan,
    FleetRules,
    FleetState,
    InstanceSnapshot,
    JobCounts,
    MarkBooted,
    MarkDead,
    ProfileSnapshot,
    Provision,
    Requeue,
    WorkerSnapshot,
    plan_fleet,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RULES = FleetRules(
    idle_timeout=timedelta(seconds=60),
    boot_timeout=timedelta(seconds=900),
    create_timeout=timedelta(seconds=180),
    heartbeat_timeout=timedelta(seconds=90),
    max_hourly_eur=10.0,
)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def prof(name: str, **kw: object) -> ProfileSnapshot:
    base: dict[str, object] = {
        "provider": "scaleway",
        "enabled": True,
        "max_workers": 2,
        "hourly_cost_eur": 1.0,
    }
    base.update(kw)
    return ProfileSnapshot(name=name, **base)  # type: ignore[arg-type]


def wkr(wid: str, profile: str = "a", state: str = "ready", **kw: object) -> WorkerSnapshot:
    base: dict[str, object] = {
        "provider": "scaleway",
        "requested_at": ago(600),
        "instance_id": f"i-{wid}",
        "hourly_cost_eur": 1.0,
        "created_at": ago(590),
        "booted_at": ago(500),
        "ready_at": ago(400) if state in ("ready", "draining") else None,
        "idle_since": ago(10) if state == "ready" else None,
        "last_seen_at": ago(5),
    }
    base.update(kw)
    return WorkerSnapshot(id=wid, profile=profile, state=state, **base)  # type: ignore[arg-type]


@dataclass
class Case:
    name: str
    profiles: list[ProfileSnapshot]
    workers: list[WorkerSnapshot] = field(default_factory=list)
    queued: int = 0
    ids: int | None = None  # how many queued ids are offered (default: min(queued, 200))
    counts: list[JobCounts] = field(default_factory=list)
    active: list[ActiveJob] = field(default_factory=list)
    inventory: list[InstanceSnapshot] | None = None  # default: every worker's instance running
    known: frozenset[str] = frozenset({"scaleway"})
    rules: FleetRules = RULES
    listening_since: datetime | None = None
    expect: set[str] = field(default_factory=set)
    held: list[str] = field(default_factory=list)  # substrings expected in held_back


def build(case: Case) -> FleetState:
    inventory = case.inventory
    if inventory is None:
        inventory = [
            InstanceSnapshot("scaleway", w.instance_id, "running", w.id, w.profile)
            for w in case.workers
            if w.instance_id is not None and w.state != "deleted"
        ]
    n_ids = min(case.queued, 200) if case.ids is None else case.ids
    return FleetState(
        now=NOW,
        rules=case.rules,
        profiles=tuple(case.profiles),
        workers=tuple(case.workers),
        inventory=tuple(inventory),
        inventory_known=case.known,
        queued=case.queued,
        oldest_queued_at=ago(30) if case.queued else None,
        dispatchable=tuple(f"j{i}" for i in range(n_ids)),
        job_counts=tuple(case.counts),
        active_jobs=tuple(case.active),
        listening_since=case.listening_since,
    )


def describe(plan: FleetPlan) -> set[str]:
    """Actions as short strings; provisions are counted per profile."""
    out: set[str] = set()
    provisions: dict[str, int] = {}
    for a in plan.actions:
        if isinstance(a, Provision):
            provisions[a.profile] = provisions.get(a.profile, 0) + 1
        elif isinstance(a, Dispatch):
            out.add(f"dispatch {a.job_id}->{a.profile}")
        elif isinstance(a, Requeue):
            out.add(f"requeue {a.job_id} from {a.from_profile}")
        elif isinstance(a, Delete):
            out.add(f"delete {a.worker_id} ({a.reason})")
        elif isinstance(a, MarkDead):
            out.add(f"dead {a.worker_id} ({a.reason.split(':')[0]})")
        elif isinstance(a, MarkBooted):
            out.add(f"booted {a.worker_id}")
        elif isinstance(a, DeleteOrphan):
            out.add(f"orphan {a.instance_id}")
    out.update(f"provision {p} x{n}" for p, n in provisions.items())
    return out


A, B, C = "a", "b", "c"

CASES = [
    # -- order and fallback -------------------------------------------------------------------
    Case(
        "first profile in order gets the worker",
        [prof(A), prof(B)],
        queued=1,
        expect={"provision a x1"},
    ),
    Case(
        "spill to the next profile at max_workers",
        [prof(A, max_workers=1), prof(B)],
        queued=3,
        expect={"provision a x1", "provision b x2"},
        held=["a: at max_workers (1)"],
    ),
    Case(
        "profile in back-off is skipped",
        [prof(A, backoff_until=NOW + timedelta(seconds=30)), prof(B)],
        queued=1,
        expect={"provision b x1"},
        held=["a: out of stock, backing off until"],
    ),
    Case(
        "expired back-off is tried again",
        [prof(A, backoff_until=ago(1)), prof(B)],
        queued=1,
        expect={"provision a x1"},
    ),
    Case(
        "held after a non-capacity error: no fallback",
        [prof(A, retry_at=NOW + timedelta(seconds=60), last_error="quota exceeded"), prof(B)],
        queued=2,
        expect=set(),
        held=["a: last provisioning failed (quota exceeded)", "not falling back"],
    ),
    Case(
        "held profile expired retries itself",
        [prof(A, retry_at=ago(1)), prof(B)],
        queued=1,
        expect={"provision a x1"},
    ),
    Case(
        "disabled profile is skipped",
        [prof(A, enabled=False), prof(B)],
        queued=1,
        expect={"provision b x1"},
        held=["a: disabled"],
    ),
    Case(
        "max_workers 0 is skipped",
        [prof(A, max_workers=0), prof(B)],
        queued=1,
        expect={"provision b x1"},
        held=["a: max_workers is 0"],
    ),
    Case(
        "nothing allowed anywhere",
        [prof(A, enabled=False), prof(B, max_workers=0)],
        queued=1,
        expect=set(),
        held=["1 job(s) waiting with no worker slot"],
    ),
    Case("no demand, no worker", [prof(A), prof(B)], expect=set()),
    # -- cost bounds --------------------------------------------------------------------------
    Case(
        "never above max_workers",
        [prof(A, max_workers=2)],
        workers=[wkr("w1", busy=True), wkr("w2", busy=True)],
        counts=[JobCounts(A, running=2)],
        queued=5,
        expect=set(),
        held=["a: at max_workers (2)"],
    ),
    Case(
        "budget stops a profile, a cheaper one still fits",
        [prof(A, hourly_cost_eur=6.0, max_workers=5), prof(B, hourly_cost_eur=3.0)],
        workers=[wkr("w1", hourly_cost_eur=6.0, busy=True)],
        counts=[JobCounts(A, running=1)],
        queued=2,
        expect={"provision b x1"},
        held=["a: budget of 10.00 EUR/h reached", "b: budget of 10.00 EUR/h reached"],
    ),
    Case(
        "budget counts workers still being deleted",
        [prof(A, hourly_cost_eur=5.0, max_workers=5)],
        workers=[wkr("w1", state="deleting", hourly_cost_eur=6.0)],
        queued=1,
        expect={"delete w1 (failed)"},
        held=["a: budget of 10.00 EUR/h reached"],
    ),
    Case(
        "budget fills exactly",
        [prof(A, hourly_cost_eur=2.5, max_workers=10)],
        queued=9,
        expect={"provision a x4"},
        held=["budget of 10.00 EUR/h reached"],
    ),
    Case(
        "at most max_provisions per round",
        [prof(A, max_workers=50, hourly_cost_eur=0.0)],
        queued=30,
        rules=replace(RULES, max_provisions=10),
        expect={"provision a x10"},
        held=["at most 10 new workers per round"],
    ),
    # -- dispatch -----------------------------------------------------------------------------
    Case(
        "dispatch to a free ready worker, no provisioning",
        [prof(A)],
        workers=[wkr("w1")],
        queued=1,
        expect={"dispatch j0->a"},
    ),
    Case(
        "dispatch to a booting worker",
        [prof(A)],
        workers=[wkr("w1", state="booting", ready_at=None, idle_since=None)],
        queued=1,
        expect={"dispatch j0->a"},
    ),
    Case(
        "one job per free worker, provision for the rest",
        [prof(A, max_workers=4)],
        workers=[wkr("w1"), wkr("w2")],
        queued=4,
        expect={"dispatch j0->a", "dispatch j1->a", "provision a x2"},
    ),
    Case(
        "no dispatch to a profile without a live worker",
        [prof(A)],
        queued=2,
        expect={"provision a x2"},
    ),
    Case(
        "a job already waiting on the queue takes the free slot",
        [prof(A)],
        workers=[wkr("w1")],
        counts=[JobCounts(A, dispatched=1)],
        queued=1,
        expect={"provision a x1"},
    ),
    Case(
        "no dispatch to a disabled profile's worker",
        [prof(A, enabled=False), prof(B)],
        workers=[wkr("w1", busy=True)],
        counts=[JobCounts(A, running=1)],
        queued=1,
        expect={"provision b x1"},
    ),
    Case(
        "dispatch limited by max_dispatch",
        [prof(A, max_workers=3)],
        workers=[wkr("w1"), wkr("w2"), wkr("w3")],
        queued=3,
        rules=replace(RULES, max_dispatch=2),
        expect={"dispatch j0->a", "dispatch j1->a"},
    ),
    Case(
        "jobs already on a queue beyond its workers scale that profile",
        [prof(A, max_workers=3), prof(B)],
        workers=[wkr("w1", busy=True)],
        counts=[JobCounts(A, dispatched=4, running=1)],
        expect={"provision a x2"},
    ),
    Case(
        "a queue backlog never scales a profile in back-off",
        [prof(A, max_workers=3, backoff_until=NOW + timedelta(seconds=30)), prof(B)],
        workers=[wkr("w1", busy=True)],
        counts=[JobCounts(A, dispatched=4, running=1)],
        expect=set(),
    ),
    # -- re-route -----------------------------------------------------------------------------
    Case(
        "dispatched job on a profile with no live worker is re-routed",
        [prof(A, backoff_until=NOW + timedelta(seconds=60)), prof(B)],
        workers=[wkr("w1", profile=B)],
        counts=[JobCounts(A, dispatched=1)],
        active=[ActiveJob("jx", A, "dispatched")],
        expect={"requeue jx from a", "dispatch jx->b"},
    ),
    Case(
        "re-routed job waits for a new worker when none is free",
        [prof(A, backoff_until=NOW + timedelta(seconds=60)), prof(B)],
        counts=[JobCounts(A, dispatched=1)],
        active=[ActiveJob("jx", A, "dispatched")],
        expect={"requeue jx from a", "provision b x1"},
    ),
    Case(
        "dispatched job stays while its profile has a booting worker",
        [prof(A)],
        workers=[wkr("w1", state="booting", ready_at=None, idle_since=None)],
        counts=[JobCounts(A, dispatched=1)],
        active=[ActiveJob("jx", A, "dispatched")],
        expect=set(),
    ),
    Case(
        "running job of a vanished worker is re-routed",
        [prof(A)],
        workers=[wkr("w2")],
        counts=[JobCounts(A, running=1)],
        active=[ActiveJob("jx", A, "running", worker_id="w-gone")],
        expect={"requeue jx from a", "dispatch jx->a"},
    ),
    # -- teardown -----------------------------------------------------------------------------
    Case(
        "idle worker past the timeout is deleted",
        [prof(A)],
        workers=[wkr("w1", idle_since=ago(61))],
        expect={"delete w1 (idle)"},
    ),
    Case(
        "idle worker within the timeout stays",
        [prof(A)],
        workers=[wkr("w1", idle_since=ago(59))],
        expect=set(),
    ),
    Case(
        "idle measured from ready when no job ever ran",
        [prof(A)],
        workers=[wkr("w1", idle_since=None, ready_at=ago(61))],
        expect={"delete w1 (idle)"},
    ),
    Case(
        "busy worker is never idle",
        [prof(A)],
        workers=[wkr("w1", idle_since=ago(600), busy=True)],
        counts=[JobCounts(A, running=1)],
        expect=set(),
    ),
    Case(
        "idle worker kept for a job waiting on its queue",
        [prof(A)],
        workers=[wkr("w1", idle_since=ago(600))],
        counts=[JobCounts(A, dispatched=1)],
        active=[ActiveJob("jx", A, "dispatched")],
        expect=set(),
    ),
    Case(
        "only the surplus idle workers go",
        [prof(A, max_workers=3)],
        workers=[wkr("w1", idle_since=ago(600)), wkr("w2", idle_since=ago(300))],
        counts=[JobCounts(A, dispatched=1)],
        expect={"delete w1 (idle)"},
    ),
    Case(
        "idle workers kept while jobs still wait for a slot",
        [prof(A)],
        workers=[wkr("w1", idle_since=ago(600))],
        queued=3,
        ids=0,
        expect={"provision a x1"},
        held=["1 job(s) waiting"],
    ),
    Case(
        "free worker of a disabled profile goes at once",
        [prof(A, enabled=False), prof(B)],
        workers=[wkr("w1", idle_since=ago(1)), wkr("w2", busy=True)],
        counts=[JobCounts(A, running=1)],
        expect={"delete w1 (profile disabled)"},
    ),
    Case(
        "worker of a removed profile goes when free",
        [prof(B)],
        workers=[wkr("w1", profile="gone", idle_since=ago(1))],
        expect={"delete w1 (profile removed)"},
    ),
    Case(
        "drained worker goes",
        [prof(A)],
        workers=[wkr("w1", state="draining")],
        expect={"delete w1 (drained)"},
    ),
    Case(
        "teardown not confirmed is retried",
        [prof(A)],
        workers=[wkr("w1", state="deleting", delete_reason="idle")],
        expect={"delete w1 (idle)"},
    ),
    Case(
        "worker rejected at readiness is dead (a failed boot) and deleted",
        [prof(A)],
        workers=[
            wkr(
                "w1",
                state="failed",
                error="runtime rejected: compute_type ...",
                delete_reason="runtime rejected",
            )
        ],
        expect={"dead w1 (runtime rejected)", "delete w1 (runtime rejected)"},
    ),
    # -- dead workers -------------------------------------------------------------------------
    Case(
        "no heartbeat for 3 report intervals",
        [prof(A)],
        workers=[wkr("w1", last_seen_at=ago(91), busy=True)],
        counts=[JobCounts(A, running=1)],
        active=[ActiveJob("jx", A, "running", "w1")],
        expect={
            "dead w1 (no heartbeat)",
            "delete w1 (no heartbeat)",
            "requeue jx from a",
            "provision a x1",
        },
    ),
    Case(
        "a silent worker among heard ones is dead after 3 intervals",
        [prof(A)],
        workers=[wkr("w1", last_seen_at=ago(91)), wkr("w2", last_seen_at=ago(20))],
        rules=replace(RULES, outage_timeout=timedelta(seconds=300)),
        expect={"dead w1 (no heartbeat)", "delete w1 (no heartbeat)"},
    ),
    Case(
        "nobody heard: the control plane is suspected, up to the outage timeout",
        [prof(A)],
        workers=[wkr("w1", last_seen_at=ago(299)), wkr("w2", last_seen_at=ago(120))],
        rules=replace(RULES, outage_timeout=timedelta(seconds=300)),
        expect=set(),
    ),
    Case(
        "nobody heard past the outage timeout",
        [prof(A)],
        workers=[wkr("w1", last_seen_at=ago(301)), wkr("w2", last_seen_at=ago(120))],
        rules=replace(RULES, outage_timeout=timedelta(seconds=300)),
        expect={"dead w1 (no heartbeat)", "delete w1 (no heartbeat)"},
    ),
    Case(
        "a booting worker's silence does not make the ready ones look heard",
        [prof(A)],
        workers=[
            wkr("w1", last_seen_at=ago(91), busy=True),
            wkr("w2", state="booting", requested_at=ago(10), ready_at=None, idle_since=None),
        ],
        counts=[JobCounts(A, dispatched=1, running=1)],  # w2 is wanted: it is not retired
        rules=replace(RULES, outage_timeout=timedelta(seconds=300)),
        expect=set(),
    ),
    Case(
        "silence from before the fleet came back does not count",
        [prof(A)],
        workers=[wkr("w1", last_seen_at=ago(1200))],
        listening_since=ago(60),
        expect=set(),
    ),
    Case(
        "silence since the fleet came back counts",
        [prof(A)],
        workers=[wkr("w1", last_seen_at=ago(1200))],
        listening_since=ago(91),
        expect={"dead w1 (no heartbeat)", "delete w1 (no heartbeat)"},
    ),
    Case(
        "heartbeat rule off without usage reports",
        [prof(A)],
        workers=[wkr("w1", last_seen_at=ago(900), busy=True)],
        counts=[JobCounts(A, running=1)],
        rules=replace(RULES, heartbeat_timeout=None),
        expect=set(),
    ),
    Case(
        "boot timeout",
        [prof(A)],
        workers=[
            wkr(
                "w1",
                state="booting",
                requested_at=ago(901),
                booted_at=None,
                ready_at=None,
                idle_since=None,
            )
        ],
        expect={"dead w1 (boot timeout)", "delete w1 (boot timeout)"},
    ),
    Case(
        "still booting within the timeout",
        [prof(A)],
        workers=[wkr("w1", state="booting", requested_at=ago(899), ready_at=None, idle_since=None)],
        counts=[JobCounts(A, dispatched=1)],  # a job waits for it
        expect=set(),
    ),
    Case(
        "instance gone from the provider",
        [prof(A)],
        workers=[wkr("w1")],
        inventory=[],
        expect={"dead w1 (instance gone)", "delete w1 (instance gone)"},
    ),
    Case(
        "unknown inventory proves nothing",
        [prof(A)],
        workers=[wkr("w1")],
        inventory=[],
        known=frozenset(),
        expect=set(),
    ),
    Case(
        "instance stopped after it booted",
        [prof(A)],
        workers=[wkr("w1")],
        inventory=[InstanceSnapshot("scaleway", "i-w1", "stopped", "w1", A)],
        expect={"dead w1 (instance stopped)", "delete w1 (instance stopped)"},
    ),
    Case(
        "interrupted create",
        [prof(A)],
        workers=[
            wkr(
                "w1",
                state="creating",
                requested_at=ago(181),
                instance_id=None,
                created_at=None,
                booted_at=None,
            )
        ],
        expect={"dead w1 (provisioning interrupted)", "delete w1 (provisioning interrupted)"},
    ),
    Case(
        "provider says running: booted",
        [prof(A)],
        workers=[wkr("w1", state="booting", booted_at=None, ready_at=None, idle_since=None)],
        counts=[JobCounts(A, dispatched=1)],  # a job waits for it
        expect={"booted w1"},
    ),
    # -- orphans ------------------------------------------------------------------------------
    Case(
        "tagged instance no worker owns",
        [prof(A)],
        inventory=[InstanceSnapshot("scaleway", "i-x", "running", "w-unknown", A)],
        expect={"orphan i-x"},
    ),
    Case(
        "instance owned by a worker being deleted is no orphan",
        [prof(A)],
        workers=[wkr("w1", state="deleting", delete_reason="idle")],
        expect={"delete w1 (idle)"},
    ),
    Case(
        "orphans only from a provider listed this round",
        [prof(A)],
        inventory=[InstanceSnapshot("scaleway", "i-x", "running", "w-unknown", A)],
        known=frozenset(),
        expect=set(),
    ),
    Case(
        "an instance that names no worker was not made by the fleet: never an orphan",
        [prof(A)],
        inventory=[InstanceSnapshot("scaleway", "i-x", "running", None, None)],
        expect=set(),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    plan = plan_fleet(build(case))
    assert describe(plan) == case.expect
    for text in case.held:
        assert any(text in reason for reason in plan.held_back), (text, plan.held_back)


def test_plan_reports_costs() -> None:
    case = Case(
        "costs",
        [prof(A, hourly_cost_eur=0.75, max_workers=3)],
        workers=[wkr("w1", hourly_cost_eur=0.75, busy=True)],
        counts=[JobCounts(A, running=1)],
        queued=2,
    )
    plan = plan_fleet(build(case))
    assert plan.current_hourly_eur == pytest.approx(0.75)
    assert plan.planned_hourly_eur == pytest.approx(2.25)
    summary = {p.name: p for p in plan.profiles}[A]
    assert (summary.live_workers, summary.new_workers) == (1, 2)


def test_actions_are_ordered_dead_then_requeue_then_dispatch() -> None:
    case = Case(
        "order",
        [prof(A, max_workers=3)],
        workers=[wkr("w1", last_seen_at=ago(100), busy=True), wkr("w2")],
        counts=[JobCounts(A, running=1)],
        active=[ActiveJob("jx", A, "running", "w1")],
    )
    kinds = [type(a).__name__ for a in plan_fleet(build(case)).actions]
    assert kinds.index("MarkDead") < kinds.index("Requeue") < kinds.index("Dispatch")
    assert kinds.index("Dispatch") < kinds.index("Delete")


def test_random_states_never_break_the_bounds() -> None:
    rng = random.Random(7)
    for _ in range(400):
        profiles = [
            prof(
                n,
                max_workers=rng.randint(0, 4),
                hourly_cost_eur=rng.choice([0.5, 1.0, 3.0]),
                enabled=rng.random() > 0.2,
                backoff_until=NOW + timedelta(seconds=30) if rng.random() < 0.2 else None,
            )
            for n in (A, B, C)
        ]
        workers = [
            wkr(
                f"w{i}",
                profile=rng.choice([A, B, C]),
                state=rng.choice(["ready", "booting", "deleting"]),
                hourly_cost_eur=rng.choice([0.5, 1.0, 3.0]),
                busy=rng.random() < 0.5,
            )
            for i in range(rng.randint(0, 6))
        ]
        rules = replace(RULES, max_hourly_eur=rng.choice([2.0, 5.0, 10.0]))
        case = Case("random", profiles, workers=workers, queued=rng.randint(0, 40), rules=rules)
        state = build(case)
        plan = plan_fleet(state)
        new = [a for a in plan.actions if isinstance(a, Provision)]
        billed = sum(w.hourly_cost_eur for w in workers)
        if new:  # a plan only adds cost while it fits the budget
            assert plan.planned_hourly_eur <= rules.max_hourly_eur + 1e-9
        assert plan.planned_hourly_eur == pytest.approx(
            billed + sum(p.hourly_cost_eur for p in new)
        )
        for p in profiles:
            live = sum(
                1
                for w in workers
                if w.profile == p.name
                and w.state in ("ready", "booting")
                and not any(isinstance(a, MarkDead) and a.worker_id == w.id for a in plan.actions)
            )
            added = sum(1 for a in new if a.profile == p.name)
            assert added == 0 or live + added <= p.max_workers
            if added:
                assert p.enabled and p.backoff_until is None


@pytest.mark.parametrize(
    ("depth", "sent_ago", "requeued"),
    [
        (0, 300, True),  # empty queue, long since sent: the message was lost
        (0, 30, False),  # just sent: a worker may be about to claim it
        (1, 300, False),  # still on the queue behind other work
        (None, 300, False),  # queue depth unknown: no guess
    ],
)
def test_a_dispatched_job_whose_message_was_lost_is_routed_again(
    depth: int | None, sent_ago: float, requeued: bool
) -> None:
    case = Case(
        "lost message",
        [prof(A, queue_depth=depth)],
        workers=[wkr("w1")],
        counts=[JobCounts(A, dispatched=1)],
        active=[ActiveJob("jx", A, "dispatched", None, dispatched_at=ago(sent_ago))],
    )
    assert ("requeue jx from a" in describe(plan_fleet(build(case)))) is requeued


def test_a_worker_whose_server_is_gone_costs_no_gpu() -> None:
    """Review of issue 11, M3: volumes or IPs left behind are storage, not a GPU."""
    pending = dict(state="deleting", delete_reason="idle", hourly_cost_eur=9.0)
    case = Case(
        "server gone, volume left",
        [prof(A, hourly_cost_eur=1.0)],
        workers=[wkr("w1", server_gone=True, **pending), wkr("w2", **pending)],  # type: ignore[arg-type]
        queued=1,
    )
    plan = plan_fleet(build(case))
    assert plan.current_hourly_eur == pytest.approx(9.0)  # w2's server may still run
    assert describe(plan) == {"delete w1 (idle)", "delete w2 (idle)", "provision a x1"}
