"""Table tests of routing by capability in the planner: a job only some profiles can serve
(its language, task, model or diarize; `FleetState.routes`) is dispatched, re-routed and
provisioned for on those profiles only, in allowlist order; other jobs behave as before.

Profile `en` stands for an English-only model first in the allowlist, `multi` for a
multilingual one after it; a German job is routed to `multi` only.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.fleet.planner import ActiveJob, JobCounts, plan_fleet
from tests.fleet.test_planner import NOW, Case, ago, build, describe, prof, wkr

EN, MULTI = "en", "multi"
ONLY_MULTI = frozenset({MULTI})

# (case, routes): routes maps job ids to the profiles that can serve them.
CASES: list[tuple[Case, dict[str, frozenset[str]]]] = [
    (
        Case(
            "a German job skips the idle English-only worker and gets a multilingual one",
            [prof(EN), prof(MULTI)],
            workers=[wkr("e1", EN)],
            queued=1,
            expect={"provision multi x1"},
        ),
        {"j0": ONLY_MULTI},
    ),
    (
        Case(
            "with no worker anywhere, a German job provisions the profile that serves it",
            [prof(EN), prof(MULTI)],
            queued=1,
            ids=0,
            expect={"provision multi x1"},
        ),
        {"j0": ONLY_MULTI},
    ),
    (
        Case(
            "an English job and a German one: each goes to its own profile",
            [prof(EN), prof(MULTI)],
            workers=[wkr("e1", EN), wkr("m1", MULTI)],
            queued=2,
            expect={"dispatch j0->multi", "dispatch j1->en"},
        ),
        {"j0": ONLY_MULTI},
    ),
    (
        Case(
            "the German job is dispatched to the multilingual worker although en is preferred",
            [prof(EN), prof(MULTI)],
            workers=[wkr("m1", MULTI)],
            queued=1,
            expect={"dispatch j0->multi"},
        ),
        {"j0": ONLY_MULTI},
    ),
    (
        Case(
            "a job no profile serves is never dispatched, and nothing is provisioned for it",
            [prof(EN), prof(MULTI)],
            workers=[wkr("e1", EN), wkr("m1", MULTI)],
            queued=1,
            expect=set(),
            held=["1 job(s) waiting with no worker slot"],
        ),
        {"j0": frozenset()},
    ),
    (
        Case(
            "a re-routed German job goes back to a multilingual profile, never to en",
            [prof(EN), prof(MULTI, max_workers=2)],
            workers=[wkr("e1", EN), wkr("m2", MULTI)],
            active=[ActiveJob("g1", MULTI, "running", worker_id="gone", dispatched_at=ago(60))],
            counts=[JobCounts(MULTI, running=1)],
            expect={"requeue g1 from multi", "dispatch g1->multi"},
        ),
        {"g1": ONLY_MULTI},
    ),
    (
        Case(
            "the held English-only profile does not stop a German job's walk",
            [prof(EN, retry_at=NOW.replace(year=NOW.year + 1)), prof(MULTI)],
            queued=1,
            ids=0,
            expect={"provision multi x1"},
        ),
        {"j0": ONLY_MULTI},
    ),
    (
        Case(
            "an idle English-only worker retires while only a German job waits",
            [prof(EN), prof(MULTI)],
            workers=[wkr("e1", EN, idle_since=ago(3600))],
            queued=1,
            expect={"provision multi x1", "delete e1 (idle)"},
        ),
        {"j0": ONLY_MULTI},
    ),
]


@pytest.mark.parametrize(("case", "routes"), CASES, ids=[c.name for c, _ in CASES])
def test_routing(case: Case, routes: dict[str, frozenset[str]]) -> None:
    plan = plan_fleet(replace(build(case), routes=routes))

    assert describe(plan) == case.expect
    for fragment in case.held:
        assert any(fragment in line for line in plan.held_back), plan.held_back


def test_without_routes_the_plan_is_unchanged() -> None:
    case = Case("any job", [prof(EN), prof(MULTI)], workers=[wkr("e1", EN)], queued=2)
    plain = plan_fleet(build(case))
    routed = plan_fleet(replace(build(case), routes={"j0": frozenset({EN, MULTI})}))

    assert describe(plain) == describe(routed) == {"dispatch j0->en", "provision en x1"}
