"""Table tests of the planner's preference: new work goes to the first profile that can take it.

A fallback profile serves new jobs, and grows, only while every profile before it is
unavailable (backed off, held, at max_workers, over budget); once the preferred profile can
get a worker again, the fallback finishes what it holds and is retired when idle.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.fleet.planner import JobCounts, plan_fleet
from tests.fleet.test_planner import NOW, Case, ago, build, describe, prof, wkr

A, B = "a", "b"
LATER = NOW + timedelta(seconds=30)

CASES = [
    Case(
        "preferred back in stock: a new job waits for it, not for the idle fallback",
        [prof(A), prof(B)],
        workers=[wkr("f1", B)],
        queued=1,
        expect={"provision a x1"},
    ),
    Case(
        "preferred back in stock: the busy fallback does not grow for its queue",
        [prof(A), prof(B)],
        workers=[wkr("f1", B, busy=True, idle_since=None)],
        counts=[JobCounts(B, dispatched=1, running=1)],
        expect=set(),
        held=["b: not grown for the 1 job(s) on its queue; a is preferred"],
    ),
    Case(
        "preferred back in stock: new jobs and the fallback's queue, only the preferred grows",
        [prof(A), prof(B)],
        workers=[wkr("f1", B, busy=True, idle_since=None)],
        counts=[JobCounts(B, dispatched=1, running=1)],
        queued=2,
        expect={"provision a x2"},
    ),
    Case(
        "preferred back in stock: the idle fallback is retired although jobs wait",
        [prof(A), prof(B)],
        workers=[wkr("f1", B, idle_since=ago(120))],
        queued=1,
        expect={"provision a x1", "delete f1 (idle)"},
    ),
    Case(
        "preferred has a booting worker: the job waits on its queue",
        [prof(A), prof(B)],
        workers=[
            wkr("p1", A, state="booting", ready_at=None, idle_since=None, last_seen_at=None),
            wkr("f1", B),
        ],
        queued=1,
        expect={"dispatch j0->a"},
    ),
    Case(
        "a fallback worker still booting takes a job it was created for, the preferred the rest",
        [prof(A), prof(B)],
        workers=[
            wkr("f1", B, state="booting", ready_at=None, idle_since=None, last_seen_at=None),
            wkr("f2", B),
        ],
        queued=2,
        expect={"dispatch j0->b", "provision a x1"},
    ),
    Case(
        "preferred still backed off: the fallback takes new work",
        [prof(A, backoff_until=LATER), prof(B)],
        workers=[wkr("f1", B)],
        queued=1,
        expect={"dispatch j0->b"},
    ),
    Case(
        "preferred still backed off: the fallback grows for its queue",
        [prof(A, backoff_until=LATER), prof(B)],
        workers=[wkr("f1", B, busy=True, idle_since=None)],
        counts=[JobCounts(B, dispatched=1, running=1)],
        expect={"provision b x1"},
    ),
    Case(
        "preferred at max_workers: the fallback takes new work",
        [prof(A, max_workers=1), prof(B)],
        workers=[wkr("p1", A, busy=True, idle_since=None), wkr("f1", B)],
        counts=[JobCounts(A, running=1)],
        queued=1,
        expect={"dispatch j0->b"},
    ),
    Case(
        "preferred over budget: the fallback takes new work",
        [prof(A, hourly_cost_eur=9.5), prof(B)],
        workers=[wkr("f1", B)],
        queued=1,
        expect={"dispatch j0->b"},
    ),
    Case(
        "preferred disabled: the fallback takes new work",
        [prof(A, enabled=False), prof(B)],
        workers=[wkr("f1", B)],
        queued=1,
        expect={"dispatch j0->b"},
    ),
    Case(
        "a fallback worker that holds a job is kept, the preferred gets the new one",
        [prof(A), prof(B)],
        workers=[wkr("f1", B, busy=True, idle_since=None)],
        counts=[JobCounts(B, running=1)],
        queued=1,
        expect={"provision a x1"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_preference(case: Case) -> None:
    plan = plan_fleet(build(case))
    assert describe(plan) == case.expect
    for text in case.held:
        assert any(text in reason for reason in plan.held_back), (text, plan.held_back)
