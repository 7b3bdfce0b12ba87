"""The policies of issue 22: boot time learned, work-aware scaling, idle by break-even.

Pure functions of the snapshot, so tables and properties, no services (the learned figures'
reader runs against the real database at the end).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from app.db import Database
from app.fleet.boot_policy import boot_estimate
from app.fleet.learned import IMAGES_KEY, LEARNED_KEY, compute_learned, read_learned
from app.fleet.planner import (
    ActiveJob,
    Death,
    Delete,
    Dispatch,
    FleetRules,
    FleetState,
    InstanceSnapshot,
    JobCounts,
    MarkDead,
    ProfileSnapshot,
    Provision,
    Requeue,
    WaitingJob,
    WorkerSnapshot,
    plan_fleet,
)
from app.fleet.scaling_policy import drain, workers_wanted
from app.models import Job, JobPart, JobStatus, PartStatus, Worker, WorkerState

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RULES = FleetRules(
    idle_timeout=timedelta(seconds=60),
    boot_timeout=timedelta(seconds=900),
    create_timeout=timedelta(seconds=180),
    heartbeat_timeout=timedelta(seconds=90),
    max_hourly_eur=100.0,
    target_wait=timedelta(seconds=300),
    idle_floor=timedelta(seconds=10),
)
BOOTS = (118.0, 120.0, 121.0, 125.0)  # learned: p95 125 s × 1.5 = 187.5 s


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def profile(name: str = "l4", **kw: object) -> ProfileSnapshot:
    base: dict[str, object] = {
        "provider": "scaleway",
        "enabled": True,
        "max_workers": 3,
        "hourly_cost_eur": 0.75,
        "boot_samples": BOOTS,
        "speed": 30.0,
    }
    base.update(kw)
    return ProfileSnapshot(name=name, **base)  # type: ignore[arg-type]


def ready(wid: str, name: str = "l4", idle_for: float = 5.0) -> WorkerSnapshot:
    return WorkerSnapshot(
        id=wid,
        profile=name,
        provider="scaleway",
        state=WorkerState.READY.value,
        requested_at=ago(900),
        instance_id=f"i-{wid}",
        hourly_cost_eur=0.75,
        created_at=ago(890),
        booted_at=ago(800),
        ready_at=ago(780),
        idle_since=ago(idle_for),
        last_seen_at=ago(2),
    )


def jobs(*audio: float | None, waited: float = 0.0) -> tuple[WaitingJob, ...]:
    return tuple(
        WaitingJob(
            id=f"j{i}", submitted_at=ago(waited) + timedelta(microseconds=i), audio_seconds=a
        )
        for i, a in enumerate(audio)
    )


def state(
    profiles: list[ProfileSnapshot], waiting: tuple[WaitingJob, ...], **kw: object
) -> FleetState:
    base: dict[str, object] = {
        "queued": len(waiting),
        "oldest_queued_at": min((j.submitted_at for j in waiting), default=None),
        "waiting_jobs": waiting,
        "inventory_known": frozenset({"scaleway"}),
    }
    base.update(kw)
    return FleetState(now=NOW, rules=RULES, profiles=tuple(profiles), **base)  # type: ignore[arg-type]


def provisions(plan_state: FleetState) -> list[Provision]:
    return [a for a in plan_fleet(plan_state).actions if isinstance(a, Provision)]


# --- boot time learned -----------------------------------------------------------------------


def test_the_boot_estimate_is_p95_times_the_margin_within_the_bounds() -> None:
    assert boot_estimate((), RULES) == 900  # nothing measured: the configured boot timeout
    assert boot_estimate((100.0, 110.0), RULES) == 900  # too few boots to say
    assert boot_estimate(BOOTS, RULES) == 187.5
    assert boot_estimate((10.0, 12.0, 11.0), RULES) == 60  # the floor
    assert boot_estimate((800.0, 700.0, 750.0), RULES) == 900  # the ceiling


def test_the_learned_estimate_is_the_boot_timeout() -> None:
    booting = WorkerSnapshot(
        id="w1",
        profile="l4",
        provider="scaleway",
        state=WorkerState.BOOTING.value,
        requested_at=ago(200),
        instance_id="i-w1",
        created_at=ago(199),
    )
    running = (InstanceSnapshot("scaleway", "i-w1", "running", worker_id="w1", profile="l4"),)
    slow = state([profile()], (), workers=(booting,), inventory=running)
    (dead,) = [a for a in plan_fleet(slow).actions if isinstance(a, MarkDead)]
    assert dead.death is Death.BOOT_TIMEOUT  # 200 s > 187.5 s learned
    unlearned = replace(slow, profiles=(profile(boot_samples=()),))
    assert not [a for a in plan_fleet(unlearned).actions if isinstance(a, MarkDead)]


# --- work-aware scaling ----------------------------------------------------------------------


def test_short_jobs_share_one_worker_instead_of_one_each() -> None:
    # Ten 5-minute jobs are 100 s of work at 30x: one worker drains them long before a second
    # one would have booted.
    (p,) = provisions(state([profile()], jobs(*[300.0] * 10)))
    assert p.profile == "l4" and p.rule.startswith("first worker")


def test_a_long_backlog_gets_another_worker_when_it_drains_sooner_by_more_than_a_boot() -> None:
    # 30 jobs of 30 min: 1800 s of work; each worker added saves far more than a boot.
    added = provisions(state([profile()], jobs(*[1800.0] * 30)))
    assert len(added) == 3  # max_workers
    assert any(p.rule.startswith(("drain", "target wait")) for p in added)


def test_jobs_that_waited_long_get_workers_for_the_target_and_spill_past_the_bound() -> None:
    waited = jobs(*[60.0] * 8, waited=290)  # about to pass the 300 s target
    added = provisions(state([profile(max_workers=1), profile("p100", max_workers=2)], waited))
    assert [p.profile for p in added] == ["l4", "p100", "p100"]
    assert all(p.rule.startswith(("target wait", "first worker")) for p in added)


def test_a_waiting_job_in_parts_is_sized_as_its_parts_spread_over_the_workers() -> None:
    # A 2-hour job (240 s of work at 30x) then a 10-minute one, both just submitted, no worker
    # yet (boot 187.5 s). Whole, two workers start both at once. In 24 parts the first job
    # takes every worker until its last part, so the second starts when the parts are done:
    # 307.5 s on two workers, past the 300 s target; a third worker brings it to 267.5 s.
    whole = jobs(7200.0, 600.0)
    parted = (replace(whole[0], parts=24), whole[1])
    assert len(provisions(state([profile()], whole))) == 2
    added = provisions(state([profile()], parted))
    assert len(added) == 3 and added[-1].rule.startswith("target wait")


def test_unknown_work_keeps_one_worker_per_job() -> None:
    assert len(provisions(state([profile()], jobs(300.0, None)))) == 2
    assert len(provisions(state([profile(speed=None)], jobs(300.0, 300.0)))) == 2


def test_a_job_only_some_profiles_can_serve_is_sized_on_those() -> None:
    only_p100 = (WaitingJob("j0", NOW, 300.0, profiles=("p100",)),)
    added = provisions(state([profile(), profile("p100")], only_p100))
    assert [p.profile for p in added] == ["p100"]


def test_a_job_no_profile_can_serve_gets_no_worker() -> None:
    # Its profile was disabled or removed: routes say nobody, which is not "anybody".
    stranded = (WaitingJob("j0", NOW, 300.0, profiles=()),)
    assert provisions(state([profile(), profile("p100")], stranded)) == []


def test_another_profiles_free_slot_does_not_cancel_a_restricted_jobs_worker() -> None:
    # l4 has an idle ready worker; the one waiting job only p100 serves (diarize, say). The
    # free l4 slot cannot take it, so p100 still gets a worker (work unknown: no speed yet).
    idle = WorkerSnapshot(
        id="w1", profile="l4", provider="scaleway", state="ready", requested_at=ago(600),
        instance_id="i1", ready_at=ago(500), idle_since=ago(5), last_seen_at=ago(5),
        hourly_cost_eur=0.75,
    )  # fmt: skip
    alive = InstanceSnapshot("scaleway", "i1", "running", worker_id="w1", profile="l4")
    only_p100 = (WaitingJob("j0", NOW, None, profiles=("p100",)),)
    plan_state = state(
        [profile(speed=None), profile("p100", speed=None)],
        only_p100,
        workers=(idle,),
        inventory=(alive,),
        dispatchable=("j0",),
        routes={"j0": frozenset({"p100"})},
    )
    assert [p.profile for p in provisions(plan_state)] == ["p100"]


def test_a_held_profile_stops_the_walk_and_a_stock_out_moves_on() -> None:
    held = profile(retry_at=NOW + timedelta(minutes=5), last_error="boot failed")
    assert provisions(state([held, profile("p100")], jobs(300.0))) == []
    out = profile(backoff_until=NOW + timedelta(minutes=5))
    assert [p.profile for p in provisions(state([out, profile("p100")], jobs(300.0)))] == ["p100"]


queue_st = st.lists(st.tuples(st.floats(0, 600), st.floats(0.5, 120)), min_size=1, max_size=40)
free_st = st.lists(st.floats(0, 300), max_size=4)


@settings(max_examples=300, deadline=None)
@given(queue_st, free_st, st.floats(30, 400), st.floats(60, 900), st.integers(0, 6))
def test_never_fewer_workers_than_the_target_needs_never_more_than_room(
    queue: list[tuple[float, float]], free_in: list[float], boot: float, target: float, room: int
) -> None:
    queue = sorted(queue, key=lambda q: -q[0])  # oldest first
    n, rule = workers_wanted(free_in, queue, boot, target, room)
    assert 0 <= n <= room
    assert (n > 0) == bool(rule)
    if n < room:
        # Stopped below the bound: the target holds, and one more worker would not pay its boot.
        now = drain(free_in + [boot] * n, queue)
        assert now.max_wait <= target
        if free_in or n:
            more = drain(free_in + [boot] * (n + 1), queue)
            assert now.seconds - more.seconds <= boot


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(10, 3600), min_size=1, max_size=60),
    st.integers(0, 4),
    st.integers(0, 3),
    st.floats(0.5, 6.0),
    st.floats(0, 900),
)
def test_the_plan_stays_within_max_workers_and_budget(
    audio: list[float], max_a: int, max_b: int, budget: float, waited: float
) -> None:
    rules = replace(RULES, max_hourly_eur=budget)
    profiles = [
        profile("a", max_workers=max_a, hourly_cost_eur=0.75),
        profile("b", max_workers=max_b, hourly_cost_eur=1.25, speed=15.0),
    ]
    plan = plan_fleet(replace(state(profiles, jobs(*audio, waited=waited)), rules=rules))
    added = [a for a in plan.actions if isinstance(a, Provision)]
    assert sum(p.profile == "a" for p in added) <= max_a
    assert sum(p.profile == "b" for p in added) <= max_b
    assert plan.planned_hourly_eur <= budget + 1e-9
    # Jobs that would wait past the target with room and budget left: never.
    if plan.waiting:
        bound = len(added) == max_a + max_b or any(
            "budget" in h or "per round" in h for h in plan.held_back
        )
        assert bound, plan.held_back


# --- idle by break-even ----------------------------------------------------------------------


def idle_plan(arrivals: int | None, idle_for: float) -> list[Delete]:
    s = state([profile()], (), workers=(ready("w1", idle_for=idle_for),), recent_arrivals=arrivals)
    s = replace(s, inventory=(InstanceSnapshot("scaleway", "i-w1", "running", "w1", "l4"),))
    return [a for a in plan_fleet(s).actions if isinstance(a, Delete)]


def test_a_sparse_trickle_deletes_an_idle_worker_after_the_floor() -> None:
    # 3 jobs in 30 min: one every 600 s, more than a 187.5 s boot: keeping it costs more.
    (gone,) = idle_plan(3, idle_for=15)
    assert gone.reason == "idle" and gone.rule.startswith("break-even")
    assert idle_plan(3, idle_for=5) == []  # the floor (10 s) still holds


def test_a_busy_stream_keeps_an_idle_worker_up_to_the_idle_timeout() -> None:
    # 30 jobs in 30 min: one a minute, within a boot: kept, up to the 60 s ceiling.
    assert idle_plan(30, idle_for=30) == []
    (gone,) = idle_plan(30, idle_for=61)
    assert "next job expected in 60 s" in gone.rule
    # Unknown arrivals: the idle timeout for all, as before.
    assert idle_plan(None, idle_for=30) == []


def test_each_decision_says_which_rule_made_it() -> None:
    plan = plan_fleet(state([profile()], jobs(*[300.0] * 4)))
    assert any("first worker" in d for d in plan.decisions)
    (summary,) = plan.profiles
    assert summary.boot_estimate_seconds == 187.5 and summary.speed == 30.0


# --- parts of long jobs (issue 34) -------------------------------------------------------------


def warm(plan_state: FleetState) -> FleetState:
    """The state with one ready, idle worker `w1` of l4, listed by the provider."""
    listed = (InstanceSnapshot("scaleway", "i-w1", "running", "w1", "l4"),)
    return replace(plan_state, workers=(ready("w1"),), inventory=listed)


def parts_on(n: int, seconds: float, name: str = "l4", waited: float = 0.0) -> JobCounts:
    """`n` parts holding `seconds` of audio in all, waiting on `name`'s queue."""
    return JobCounts(name, parts_waiting=n, parts_waiting_seconds=seconds, parts_since=ago(waited))


def test_a_long_file_in_parts_boots_the_workers_that_pay_for_their_boot() -> None:
    # 2 h in 24 parts at 30x: 240 s of work. One worker (boot 187.5 s) would start the last part
    # 417.5 s after submission, past the 300 s target: a second one; a third would drain the
    # parts 40 s sooner, less than its boot: not booted.
    idle = state([profile(max_workers=8)], (), job_counts=(parts_on(24, 7200.0),))
    added = provisions(idle)
    assert [p.profile for p in added] == ["l4", "l4"]
    assert all(p.rule.startswith("parts: target wait") for p in added)
    decisions = plan_fleet(idle).decisions
    assert any(d.startswith("provision 2 x l4: parts: target wait") for d in decisions)


def test_a_short_job_in_parts_never_boots_a_worker_per_part() -> None:
    # 10 min in 2 parts: 20 s of work, done by one worker long before another would boot.
    (only,) = provisions(state([profile(max_workers=8)], (), job_counts=(parts_on(2, 600.0),)))
    assert only.rule == "parts: first worker for the waiting jobs"
    # An idle ready worker takes them: nothing boots.
    assert provisions(warm(state([profile()], (), job_counts=(parts_on(2, 600.0),)))) == []


def test_parts_boot_within_max_workers_and_budget() -> None:
    capped = state([profile(max_workers=1)], (), job_counts=(parts_on(24, 7200.0),))
    assert len(provisions(capped)) == 1
    poor = replace(
        capped, profiles=(profile(max_workers=8),), rules=replace(RULES, max_hourly_eur=0.8)
    )
    assert len(provisions(poor)) == 1  # one worker costs 0.75 EUR/h
    assert any("budget" in h for h in plan_fleet(poor).held_back)


def test_parts_of_unknown_speed_boot_only_a_first_worker() -> None:
    unknown = state([profile(speed=None)], (), job_counts=(parts_on(24, 7200.0),))
    (first,) = provisions(unknown)
    assert first.rule == "parts: first worker for the parts on its queue"
    assert provisions(warm(unknown)) == []


def test_a_free_worker_takes_the_parts_on_its_queue_before_a_new_job() -> None:
    base = warm(state([profile()], jobs(60.0), dispatchable=("j0",)))
    dispatched = [a for a in plan_fleet(base).actions if isinstance(a, Dispatch)]
    assert [d.job_id for d in dispatched] == ["j0"]  # without parts, the free worker takes it
    waiting = replace(base, job_counts=(parts_on(3, 900.0),))
    assert not [a for a in plan_fleet(waiting).actions if isinstance(a, Dispatch)]


def test_parts_never_wait_for_a_boot_beside_a_free_ready_worker() -> None:
    booting = WorkerSnapshot(
        id="w2",
        profile="p100",
        provider="scaleway",
        state=WorkerState.BOOTING.value,
        requested_at=ago(20),
        instance_id="i-w2",
        created_at=ago(19),
    )
    listed = (
        InstanceSnapshot("scaleway", "i-w1", "running", "w1", "l4"),
        InstanceSnapshot("scaleway", "i-w2", "starting", "w2", "p100"),
    )

    def on_p100(parted: bool) -> FleetState:
        job = ActiveJob(
            id="j9",
            profile="p100",
            status=JobStatus.DISPATCHED.value,
            dispatched_at=ago(15),
            audio_seconds=900.0,
            submitted_at=ago(15),
            parted=parted,
        )
        counts = (parts_on(3, 900.0, "p100", waited=15),) if parted else ()
        return state(
            [profile(), profile("p100")],
            (),
            workers=(ready("w1"), booting),
            inventory=listed,
            active_jobs=(job,),
            job_counts=counts,
        )

    def on_l4(plan_state: FleetState) -> FleetState:
        """The same, the other way round: the preferred l4 boots, p100's worker is free."""
        swapped = tuple(
            replace(w, profile="l4" if w.profile == "p100" else "p100") for w in plan_state.workers
        )
        listed_swapped = tuple(
            replace(i, profile="l4" if i.profile == "p100" else "p100")
            for i in plan_state.inventory
        )
        jobs_swapped = tuple(replace(a, profile="l4") for a in plan_state.active_jobs)
        counts = tuple(replace(c, profile="l4") for c in plan_state.job_counts)
        return replace(
            plan_state,
            workers=swapped,
            inventory=listed_swapped,
            active_jobs=jobs_swapped,
            job_counts=counts,
        )

    plan = plan_fleet(on_p100(parted=True))
    (requeue,) = [a for a in plan.actions if isinstance(a, Requeue)]
    assert requeue.job_id == "j9" and "ready worker of l4 is free" in requeue.reason
    assert [(a.job_id, a.profile) for a in plan.actions if isinstance(a, Dispatch)] == [
        ("j9", "l4")
    ]
    # A whole job too; never towards a later profile (a fallback's ready worker gets no work
    # the preferred profile can have).
    assert [a for a in plan_fleet(on_p100(parted=False)).actions if isinstance(a, Requeue)]
    assert not [a for a in plan_fleet(on_l4(on_p100(True))).actions if isinstance(a, Requeue)]


# --- what the fleet learned, from the database ------------------------------------------------


def test_boots_speed_and_arrivals_are_learned_from_the_history(db: Database) -> None:
    with db.session() as s:
        for i, seconds in enumerate((100.0, 130.0, 120.0)):
            s.add(
                Worker(
                    profile="l4",
                    provider="scaleway",
                    state=WorkerState.DELETED.value,
                    requested_at=ago(3600 + i),
                    ready_at=ago(3600 + i) + timedelta(seconds=seconds),
                )
            )
        s.add(Worker(profile="l4", provider="scaleway", state="booting", requested_at=ago(50)))
        for audio, took, when in ((600.0, 20.0, 4000), (300.0, 10.0, 600), (900.0, 60.0, 60)):
            s.add(
                Job(
                    owner="t",
                    source="upload",
                    audio_key="x",
                    status=JobStatus.SUCCEEDED.value,
                    profile="l4" if took < 60 else "p100",
                    duration_seconds=audio,
                    processing_seconds=took,
                    created_at=ago(when),
                    finished_at=ago(when - 30),
                )
            )
    learned = compute_learned(db, NOW)
    assert sorted(learned.boots["l4"]) == [100.0, 120.0, 130.0]
    assert learned.speed == {"l4": 30.0, "p100": 15.0}
    assert learned.arrivals == 2  # submitted within the last 30 minutes


def test_a_job_in_parts_teaches_the_speed_of_its_parts_not_of_its_wall_time(
    db: Database,
) -> None:
    # 900 s of audio in three parts run at once on three workers, 20 s each: the worker speed
    # is 15x, though the job took 25 s from its first claim to its last result.
    with db.session() as s:
        s.add(
            Job(
                id="job_parted", owner="t", source="upload", audio_key="x",
                status=JobStatus.SUCCEEDED.value, profile="l4", duration_seconds=900.0,
                processing_seconds=60.0, created_at=ago(100), started_at=ago(60),
                finished_at=ago(35),
            )
        )  # fmt: skip
        for i in range(3):
            s.add(
                JobPart(
                    id=f"job_parted.{i}", job_id="job_parted", index=i, kind="transcribe",
                    start_seconds=300.0 * i, end_seconds=300.0 * (i + 1),
                    status=PartStatus.SUCCEEDED.value, attempts=1, processing_seconds=20.0,
                    created_at=ago(100), started_at=ago(60 - i), finished_at=ago(40 - i),
                )
            )  # fmt: skip
        # Its speakers part (diarization, not transcription) does not count.
        s.add(
            JobPart(
                id="job_parted.3", job_id="job_parted", index=3, kind="speakers",
                start_seconds=0.0, end_seconds=900.0, status=PartStatus.SUCCEEDED.value,
                attempts=1, processing_seconds=25.0, created_at=ago(100), started_at=ago(60),
                finished_at=ago(35),
            )
        )  # fmt: skip
    assert compute_learned(db, NOW).speed == {"l4": 15.0}


def test_a_new_worker_image_is_learned_anew(db: Database, redis_url: str) -> None:
    """A new image is pulled cold: the old image's boots must not make its timeout tight."""
    client = redis.Redis.from_url(redis_url)
    client.delete(LEARNED_KEY, IMAGES_KEY)
    old, new = (
        "rg.fr-par.scw.cloud/m/w@sha256:" + "a" * 64,
        "rg.fr-par.scw.cloud/m/w@sha256:" + "b" * 64,
    )

    def boot(requested: datetime, seconds: float) -> None:
        with db.session() as s:
            s.add(
                Worker(
                    profile="l4",
                    provider="scaleway",
                    state=WorkerState.DELETED.value,
                    requested_at=requested,
                    ready_at=requested + timedelta(seconds=seconds),
                )
            )

    for i, seconds in enumerate((100.0, 130.0, 120.0)):
        boot(ago(3600 + i), seconds)

    def boots(at: datetime, image: str, *, note: bool) -> tuple[float, ...]:
        return read_learned(db, client, at, {"l4": image}, note=note).boots.get("l4", ())

    # First seen (a new installation, an upgrade): the history stands.
    assert sorted(boots(NOW, old, note=True)) == [100.0, 120.0, 130.0]
    # `murmur fleet` with another configuration sees no boots of its image, and moves no note.
    assert boots(NOW + timedelta(seconds=1), new, note=False) == ()
    assert sorted(boots(NOW + timedelta(seconds=2), old, note=True)) == [100.0, 120.0, 130.0]
    # The control plane runs the new image: learned anew, the boot timeout is the ceiling again.
    rolled = NOW + timedelta(seconds=3)
    assert boots(rolled, new, note=True) == ()
    assert boot_estimate((), RULES) == 900
    boot(rolled + timedelta(seconds=10), 300.0)  # its first, cold pull, slower than 187.5 s
    assert boots(rolled + timedelta(minutes=5), new, note=True) == (300.0,)
    # And it stays learned from the new image's boots only, across restarts (Redis holds it).
    assert boots(rolled + timedelta(minutes=10), new, note=True) == (300.0,)


def test_a_worker_s_processing_seconds_is_bounded_by_its_claim_to_result(db: Database) -> None:
    """Issue 32 §6: a lying worker said 10 years; the learned speed must not believe it."""
    with db.session() as s:
        for took in (3e8, 60.0):
            s.add(
                Job(
                    owner="t",
                    source="upload",
                    audio_key="x",
                    status=JobStatus.SUCCEEDED.value,
                    profile="l4",
                    duration_seconds=600.0,
                    processing_seconds=took,
                    created_at=ago(200),
                    started_at=ago(160),
                    finished_at=ago(100),  # claimed 60 s before its result
                )
            )
    learned = compute_learned(db, NOW)
    assert learned.speed == {"l4": 10.0}  # 1200 s of audio in 2 x 60 s
