"""Issue 32: properties of dispatch, over generated fleets (the planner is pure: no services).

(a) work-conserving: no free worker is left idle while a queued job it can serve waits, unless
    the allowlist's preference sends that job to an earlier profile that can still get a worker
    or is held after an error (docs/fleet.md: "New work prefers the first profile");
(b) fair between tokens: after a round, an owner with a job still waiting has at most one job
    fewer dispatched or running than any owner served this round: nobody waits behind another
    token's backlog;
(c) bounded: never more workers than a profile's max_workers, never over the budget; and no
    worker is booted on a profile for jobs it cannot serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from app.fleet.dispatch_order import due_order, fair_order
from app.fleet.planner import (
    Dispatch,
    FleetRules,
    FleetState,
    ProfileSnapshot,
    Provision,
    WaitingJob,
    WorkerSnapshot,
    plan_fleet,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def rules(budget: float) -> FleetRules:
    return FleetRules(
        idle_timeout=timedelta(seconds=600),
        boot_timeout=timedelta(seconds=900),
        create_timeout=timedelta(seconds=180),
        heartbeat_timeout=timedelta(seconds=90),
        max_hourly_eur=budget,
    )


def worker(wid: str, profile: str, kind: str) -> WorkerSnapshot:
    ready = kind != "booting"
    return WorkerSnapshot(
        id=wid,
        profile=profile,
        provider="scaleway",
        state="ready" if ready else "booting",
        requested_at=ago(600 if ready else 60),
        instance_id=f"i-{wid}",
        hourly_cost_eur=1.0,
        busy=kind == "busy",
        created_at=ago(590 if ready else 55),
        booted_at=ago(500) if ready else None,
        ready_at=ago(400) if ready else None,
        idle_since=ago(10) if kind == "idle" else None,
        last_seen_at=ago(5) if ready else None,
    )


@dataclass(frozen=True)
class Job:
    id: str
    owner: str
    profiles: frozenset[str] | None  # None: any profile


@st.composite
def fleets(draw: st.DrawFn, *, one_profile: bool = False) -> FleetState:
    n_profiles = 1 if one_profile else draw(st.integers(1, 3))
    names = [f"p{i}" for i in range(n_profiles)]
    profiles = []
    workers: list[WorkerSnapshot] = []
    for name in names:
        status = "ok" if one_profile else draw(st.sampled_from(["ok", "ok", "held", "backoff"]))
        max_workers = draw(st.integers(1 if one_profile else 0, 3))
        profiles.append(
            ProfileSnapshot(
                name=name,
                provider="scaleway",
                enabled=one_profile or draw(st.integers(0, 5)) > 0,
                max_workers=max_workers,
                hourly_cost_eur=1.0,
                retry_at=NOW + timedelta(seconds=600) if status == "held" else None,
                backoff_until=NOW + timedelta(seconds=600) if status == "backoff" else None,
            )
        )
        kinds = draw(st.lists(st.sampled_from(["idle", "busy", "booting"]), max_size=3))
        workers += [worker(f"{name}-w{i}", name, k) for i, k in enumerate(kinds)]
    owners = [f"o{i}" for i in range(draw(st.integers(1, 4)))]
    route = (
        st.none() if one_profile else st.one_of(st.none(), st.frozensets(st.sampled_from(names)))
    )
    jobs = [
        Job(f"j{i:03d}", draw(st.sampled_from(owners)), draw(route))
        for i in range(draw(st.integers(0, 14)))
    ]
    return FleetState(
        now=NOW,
        rules=rules(draw(st.sampled_from([1.0, 3.0, 5.0, 100.0]))),
        profiles=tuple(profiles),
        workers=tuple(workers),
        queued=len(jobs),
        oldest_queued_at=ago(300) if jobs else None,
        dispatchable=tuple(j.id for j in jobs),
        waiting_jobs=tuple(
            WaitingJob(
                j.id,
                ago(300 - i),
                profiles=None if j.profiles is None else tuple(sorted(j.profiles)),
            )
            for i, j in enumerate(jobs)
        ),
        routes={j.id: j.profiles for j in jobs if j.profiles is not None},
        owners={j.id: j.owner for j in jobs},
        in_service={o: draw(st.integers(0, 3)) for o in owners},
        last_served={o: draw(st.floats(0, 100)) for o in owners if draw(st.booleans())},
    )


def serves(state: FleetState, job_id: str, profile: str) -> bool:
    allowed = state.routes.get(job_id)
    return allowed is None or profile in allowed


def is_open(state: FleetState, p: ProfileSnapshot) -> bool:
    """Whether a job it serves prefers it over later profiles: it could get a worker now, or
    it is held after an error (app/fleet/planner.py `_dispatch`)."""
    if not p.enabled:
        return False
    if p.retry_at is not None and p.backoff_until is None:
        return True
    live = sum(1 for w in state.workers if w.profile == p.name)
    billed = sum(w.hourly_cost_eur for w in state.workers)
    return (
        p.backoff_until is None
        and live < p.max_workers
        and billed + p.hourly_cost_eur <= state.rules.max_hourly_eur
    )


def dispatched(state: FleetState) -> dict[str, str]:
    plan = plan_fleet(state)
    return {a.job_id: a.profile for a in plan.actions if isinstance(a, Dispatch)}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(fleets())
def test_a_ready_worker_never_idles_beside_a_job_it_serves(state: FleetState) -> None:
    sent = dispatched(state)
    for i, p in enumerate(state.profiles):
        if not p.enabled:
            continue
        free = sum(1 for w in state.workers if w.profile == p.name and not w.busy)
        if sum(1 for to in sent.values() if to == p.name) >= free:
            continue  # every free worker of p got a job
        earlier = state.profiles[:i]
        for job_id in state.dispatchable:
            if job_id in sent or not serves(state, job_id, p.name):
                continue
            # Only the allowlist's preference may keep it from p's free worker.
            assert any(serves(state, job_id, q.name) and is_open(state, q) for q in earlier), (
                job_id,
                p.name,
            )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(fleets(one_profile=True))
def test_no_token_waits_behind_another_tokens_backlog(state: FleetState) -> None:
    sent = dispatched(state)
    got = {o: sum(1 for j in sent if state.owners[j] == o) for o in state.in_service}
    waiting = {state.owners[j] for j in state.dispatchable if j not in sent}
    for x in waiting:
        for y, n in got.items():
            if n:
                assert state.in_service[y] + n <= state.in_service[x] + got[x] + 1, (x, y)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(fleets())
def test_never_more_workers_than_max_workers_or_the_budget_allow(state: FleetState) -> None:
    plan = plan_fleet(state)
    new = [a for a in plan.actions if isinstance(a, Provision)]
    billed = sum(w.hourly_cost_eur for w in state.workers)
    if new:
        assert billed + sum(a.hourly_cost_eur for a in new) <= state.rules.max_hourly_eur + 1e-9
    sent = {a.job_id for a in plan.actions if isinstance(a, Dispatch)}
    for p in state.profiles:
        mine = [a for a in new if a.profile == p.name]
        live = sum(1 for w in state.workers if w.profile == p.name)
        assert len(mine) <= max(0, p.max_workers - live)
        if mine:
            # Booted only for jobs it can serve, never for jobs no profile can.
            assert p.enabled and p.retry_at is None and p.backoff_until is None
            assert any(serves(state, j, p.name) for j in state.dispatchable if j not in sent), (
                p.name
            )


def test_a_single_job_goes_before_a_thousand_job_backlog() -> None:
    backlog = [f"a{i:04d}" for i in range(1000)]
    owners = {**{j: "token-a" for j in backlog}, "b0": "token-b"}
    ids = [*backlog, "b0"]  # oldest first: token A queued all of its jobs before B
    # A holds a worker already: B's job is first.
    assert fair_order(ids, owners, {"token-a": 1})[0] == "b0"
    # Neither holds one and A was served last: B's job is first.
    assert fair_order(ids, owners, {}, {"token-a": 10.0, "token-b": 5.0})[0] == "b0"
    # Neither was ever served: A's oldest goes first, B's second (one job's turn).
    assert fair_order(ids, owners, {})[:2] == ["a0000", "b0"]
    # Within one owner: oldest first.
    assert fair_order(ids, owners, {})[2:5] == ["a0001", "a0002", "a0003"]


def test_within_an_owner_a_burst_is_taken_in_the_order_its_jobs_would_finish() -> None:
    # A 30-minute file, then a 1-minute one 10 s later, at 30x: the short one goes first.
    heads = [("long", ago(20), 1800.0), ("short", ago(10), 60.0), ("unknown", ago(5), None)]
    assert due_order(heads, 30.0) == ["short", "unknown", "long"]
    # No speed measured yet: oldest first, as submitted.
    assert due_order(heads, None) == ["long", "short", "unknown"]
    # A short file submitted after the long one's processing time has passed never goes first.
    assert due_order([("long", ago(100), 1800.0), ("late", ago(30), 1.0)], 30.0)[0] == "long"


@given(
    st.lists(
        st.tuples(st.floats(0, 3600), st.floats(1, 7200)),
        min_size=1,
        max_size=40,
    ),
    st.floats(1, 100),
)
def test_due_order_never_puts_a_job_behind_one_submitted_after_its_own_finish(
    jobs: list[tuple[float, float]], speed: float
) -> None:
    # Bounded waits: whatever arrives later than a job's submission plus its processing time
    # (at the fleet's measured speed) is taken after it; nothing starves.
    heads = sorted(
        ((f"j{i}", NOW + timedelta(seconds=at), audio) for i, (at, audio) in enumerate(jobs)),
        key=lambda h: h[1],
    )
    order = due_order(heads, speed)
    assert sorted(order) == sorted(h[0] for h in heads)
    position = {job_id: i for i, job_id in enumerate(order)}
    for a_id, a_at, a_audio in heads:
        for b_id, b_at, _ in heads:
            if b_at > a_at + timedelta(seconds=a_audio / speed):
                assert position[a_id] < position[b_id]


# --- make up's two local profiles (docs/runtime.md "Diarization on a laptop") ----------------


def laptop(workers: list[WorkerSnapshot], jobs: dict[str, bool]) -> dict[str, str]:
    """`local-cpu` then `local-cpu-diarize`, one worker each at most; `jobs`: id -> diarize."""
    profiles = tuple(
        ProfileSnapshot(name, "local", True, 1, 0.0) for name in ("local-cpu", "local-cpu-diarize")
    )
    state = FleetState(
        now=NOW,
        rules=rules(100.0),
        profiles=profiles,
        workers=tuple(workers),
        queued=len(jobs),
        oldest_queued_at=ago(60) if jobs else None,
        dispatchable=tuple(jobs),
        routes={j: frozenset({"local-cpu-diarize"}) for j, diarize in jobs.items() if diarize},
        owners={j: "token" for j in jobs},
    )
    return dispatched(state)


def test_plain_jobs_go_to_the_plain_profile_while_it_has_a_free_worker() -> None:
    workers = [worker("c", "local-cpu", "idle"), worker("d", "local-cpu-diarize", "idle")]
    sent = laptop(workers, {"plain": False, "speakers": True})
    assert sent == {"plain": "local-cpu", "speakers": "local-cpu-diarize"}


def test_the_diarizing_worker_takes_a_diarize_job_before_an_older_plain_one() -> None:
    workers = [worker("c", "local-cpu", "busy"), worker("d", "local-cpu-diarize", "idle")]
    assert laptop(workers, {"plain": False, "speakers": True}) == {"speakers": "local-cpu-diarize"}


def test_a_plain_job_takes_the_idle_diarizing_worker_when_the_plain_profile_is_full() -> None:
    """local-cpu is at max_workers (1) and busy: the plain job does not idle beside the free
    diarizing worker (work-conserving; docs/runtime.md says so)."""
    workers = [worker("c", "local-cpu", "busy"), worker("d", "local-cpu-diarize", "idle")]
    assert laptop(workers, {"plain": False}) == {"plain": "local-cpu-diarize"}
