"""Provider faults through a whole reconcile (issue 11): each ends with nothing left billed.

Real Redis, SQLite and PostgreSQL, the emulator and the real Scaleway SDK, as in
test_reconcile.py; the faults are the ones the emulator models after recorded traffic.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from app.fleet.apply import apply_plan
from app.fleet.cli import render
from app.fleet.planner import Delete, plan_fleet
from app.fleet.service import fleet_overview
from app.fleet.snapshot import as_utc, read_snapshot
from app.jobs.dispatch import dispatch_job
from app.jobs.service import cancel_job
from app.models import JobStatus, WorkerState
from app.observability.collector import MurmurCollector
from app.observability.exposition import encode_text
from tests.fleet.conftest import L4, P100, Fleet, MakeFleet

NOTHING = {"servers": 0, "ips": 0, "volumes": 0}


def settle(fleet: Fleet, rounds: int = 5) -> None:
    for _ in range(rounds):
        if not fleet.workers(WorkerState.DELETING.value, WorkerState.FAILED.value):
            return
        fleet.reconcile()


def test_a_server_stuck_starting_is_deleted_after_the_boot_timeout(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(fleet={"boot_timeout_seconds": 20.0})
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "never_start", times=1)
    fleet.add_jobs(1)
    fleet.reconcile()
    (w,) = fleet.workers()
    assert fleet.emulator.server(w.instance_id or "")["state"] == "starting"
    assert fleet.emulator.inventory() == {"servers": 1, "ips": 0, "volumes": 1}

    fleet.reconcile(advance=21)
    settle(fleet)
    dead = next(x for x in fleet.workers() if x.id == w.id)
    assert dead.state == WorkerState.DELETED.value and dead.delete_reason == "boot timeout"
    assert "the provider reports it starting" in (dead.error or "")
    # Its replacement is the only server left; without it, nothing at all.
    left = [s for s in fleet.emulator.servers if s != w.instance_id]
    assert w.instance_id not in fleet.emulator.servers
    assert fleet.emulator.inventory() == {"servers": len(left), "ips": 0, "volumes": len(left)}


def test_a_held_error_keeps_its_detail_and_backs_off_exponentially(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(fleet={"backoff_seconds": 60.0, "backoff_max_seconds": 200.0})
    assert fleet.emulator is not None
    fleet.emulator.inject("create", "image_not_found", zone="fr-par-2")
    fleet.add_jobs(1)
    waits = []
    for _ in range(4):
        fleet.reconcile()
        state = fleet.profile_state("l4-par2")
        assert state is not None and state.retry_at is not None
        assert "image: image not found" in (state.last_error or "")
        assert "HTTP 400 invalid_arguments" in (state.last_error or "")
        retry_at = as_utc(state.retry_at)
        assert retry_at is not None
        waits.append((retry_at - fleet.clock()).total_seconds())
        fleet.clock.now = retry_at  # the next round is the first allowed to try again
    assert waits == [60.0, 120.0, 200.0, 200.0]
    assert fleet.emulator.inventory() == NOTHING

    fleet.emulator.clear_faults()
    fleet.reconcile()
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_errors == 0 and state.retry_at is None


def test_a_rate_limit_holds_for_its_retry_after_and_is_no_error_in_a_row(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(fleet={"backoff_seconds": 60.0, "backoff_max_seconds": 200.0})
    assert fleet.emulator is not None
    fleet.add_jobs(1)
    waits = []
    # Retry-After 17 s, then two 429s that say nothing, then one that asks for too long.
    for header in ("17", None, None, "3600"):
        fleet.emulator.inject(
            "create", "rate_limited", zone="fr-par-2", times=1, retry_after=header
        )
        fleet.reconcile()
        state = fleet.profile_state("l4-par2")
        assert state is not None and "HTTP 429 too_many_requests" in (state.last_error or "")
        assert state.consecutive_errors == 0 and state.consecutive_stockouts == 0
        assert not [w for w in fleet.workers() if w.profile == "p100-par1"]  # no fallback
        retry_at = as_utc(state.retry_at)
        assert retry_at is not None
        waits.append((retry_at - fleet.clock()).total_seconds())
        fleet.clock.now = retry_at
    # As the API asked; the first step of the back-off, not doubled; capped like every hold.
    assert waits == [17.0, 60.0, 60.0, 200.0]

    fleet.reconcile()
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.retry_at is None
    assert [w.profile for w in fleet.workers(WorkerState.BOOTING.value)] == ["l4-par2"]
    assert fleet.emulator.inventory() == {"servers": 1, "ips": 0, "volumes": 1}


def test_a_rate_limit_does_not_lengthen_the_hold_of_a_real_error(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(fleet={"backoff_seconds": 60.0, "backoff_max_seconds": 900.0})
    assert fleet.emulator is not None
    fleet.add_jobs(1)
    waits = []
    for kind in ("image_not_found", "rate_limited", "image_not_found"):
        fleet.emulator.inject("create", kind, zone="fr-par-2", times=1)
        fleet.reconcile()
        state = fleet.profile_state("l4-par2")
        assert state is not None
        retry_at = as_utc(state.retry_at)
        assert retry_at is not None
        waits.append(((retry_at - fleet.clock()).total_seconds(), state.consecutive_errors))
        fleet.clock.now = retry_at
    # The 429 waits the next step of the streak without becoming part of it.
    assert waits == [(60.0, 1), (120.0, 1), (120.0, 2)]


# -- an out-of-stock after an accepted poweron (finding 3) ------------------------------------


def test_a_server_back_to_stopped_before_booting_is_out_of_stock(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "stock_after_poweron", commercial_type="L4-1-24G")
    (job,) = fleet.add_jobs(1)
    fleet.reconcile()
    (l4,) = fleet.workers()
    assert l4.profile == "l4-par2" and l4.state == WorkerState.BOOTING.value

    # The next read shows it stopped, "out of stock": within this run the L4 server goes,
    # its profile backs off, and the next profile in order gets the job.
    fleet.reconcile(advance=5)
    settle(fleet)
    gone = next(w for w in fleet.workers() if w.id == l4.id)
    assert gone.state == WorkerState.DELETED.value and gone.delete_reason == "out of stock"
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_stockouts == 1
    assert state.backoff_until is not None and "out of stock" in (state.last_error or "")
    (p100,) = [w for w in fleet.workers(WorkerState.BOOTING.value)]
    assert p100.profile == "p100-par1"
    assert fleet.emulator.inventory() == {"servers": 1, "ips": 0, "volumes": 1}
    fleet.reconcile(advance=5)
    (j,) = fleet.jobs()
    assert j.id == job and j.profile == "p100-par1"

    # No new L4 worker during the back-off: the same profile is not created again at once.
    fleet.reconcile(advance=30)
    assert not [w for w in fleet.workers() if w.profile == "l4-par2" and w.id != l4.id]


# -- a booting worker whose demand vanished (finding 4) ---------------------------------------


def test_a_booting_worker_whose_job_was_cancelled_is_retired(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "never_start", times=1)  # it would boot for 15 minutes
    (job,) = fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    (w,) = fleet.workers()
    assert w.state == WorkerState.BOOTING.value
    assert [j.status for j in fleet.jobs()] == [JobStatus.DISPATCHED.value]

    cancel_job(fleet.db, job, "test", now=fleet.clock())
    fleet.reconcile(advance=5)
    settle(fleet)
    (w,) = fleet.workers()
    assert w.state == WorkerState.DELETED.value and w.delete_reason == "not needed"
    assert fleet.emulator.inventory() == NOTHING


# -- a profile that never boots (finding 4) ---------------------------------------------------


def _metric(fleet: Fleet, name: str, **labels: str) -> float | None:
    registry = CollectorRegistry(auto_describe=False)
    collector = MurmurCollector(
        fleet.svc.settings, fleet.db, fleet.svc.redis, clock=lambda: fleet.clock().timestamp()
    )
    registry.register(collector)
    for family in text_string_to_metric_families(encode_text(registry).decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_a_profile_that_never_boots_is_held_and_its_job_fails(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(
        [L4],
        fleet={"boot_timeout_seconds": 20.0, "max_failed_boots": 2, "max_attempts": 2},
    )
    assert fleet.emulator is not None
    # A broken image: the servers run, no worker on them ever reports ready.
    (job,) = fleet.add_jobs(1)

    for boot in (1, 2):
        fleet.reconcile()
        fleet.reconcile(advance=5)
        assert [j.status for j in fleet.jobs()] == [JobStatus.DISPATCHED.value]
        fleet.reconcile(advance=21)  # boot timeout
        settle(fleet)
        state = fleet.profile_state("l4-par2")
        assert state is not None and state.consecutive_failed_boots == boot

    # Held after the second failed boot in a row, with the reason where operators look.
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.retry_at is not None
    assert "2 workers in a row never became ready" in (state.last_error or "")
    assert "the provider reports it running" in (state.last_error or "")
    view = fleet_overview(fleet.svc.settings, fleet.db, fleet.svc.redis, fleet.clock())
    (l4,) = view["profiles"]
    assert l4["consecutive_failed_boots"] == 2 and l4["retry_at"] is not None
    assert "never became ready" in l4["last_error"]
    assert "failed boots: 2" in render(view)
    assert _metric(fleet, "murmur_fleet_profile_failed_boots", profile="l4-par2") == 2
    assert _metric(fleet, "murmur_fleet_max_failed_boots") == 2
    held = {
        reason: _metric(fleet, "murmur_fleet_profile_held", profile="l4-par2", reason=reason)
        for reason in ("backoff", "error", "failed_boots")
    }
    assert held == {"backoff": 0, "error": 0, "failed_boots": 1}

    # Each failed boot counted as an attempt of the job it would have run: it fails, clearly.
    (j,) = fleet.jobs()
    assert j.id == job and j.status == JobStatus.FAILED.value
    assert j.error_code == "worker_boot_failed" and j.attempts == 2
    assert "no worker of profile l4-par2 became ready" in (j.error_message or "")

    # No new worker while held; nothing left billed.
    fleet.add_jobs(1)
    fleet.reconcile(advance=5)
    assert not fleet.workers(WorkerState.REQUESTED.value, WorkerState.BOOTING.value)
    assert fleet.emulator.inventory() == NOTHING


def test_a_ready_worker_resets_the_failed_boots(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([L4], fleet={"boot_timeout_seconds": 20.0})
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "never_start", times=1)
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    fleet.reconcile(advance=21)
    settle(fleet)
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_failed_boots == 1
    assert state.retry_at is None  # one failed boot is not yet a pattern
    fleet.reconcile(advance=5)
    assert fleet.ready_all() == 1
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_failed_boots == 0


def test_of_two_booting_workers_for_two_jobs_one_goes_when_a_job_is_cancelled(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet([L4])
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "never_start", times=2)
    first, second = fleet.add_jobs(2)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    assert len(fleet.workers(WorkerState.BOOTING.value)) == 2
    assert [j.status for j in fleet.jobs()] == [JobStatus.DISPATCHED.value] * 2

    cancel_job(fleet.db, second, "test", now=fleet.clock())
    fleet.reconcile(advance=5)
    settle(fleet)
    kept = fleet.workers(WorkerState.BOOTING.value)
    retired = [w for w in fleet.workers(WorkerState.DELETED.value) if w.delete_reason]
    assert len(kept) == 1 and [w.delete_reason for w in retired] == ["not needed"]
    assert kept[0].requested_at <= retired[0].requested_at  # the older one stays
    assert fleet.emulator.inventory() == {"servers": 1, "ips": 0, "volumes": 1}


def test_a_booting_worker_that_got_a_job_since_the_plan_is_kept(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([L4])
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "never_start", times=1)
    (job,) = fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    cancel_job(fleet.db, job, "test", now=fleet.clock())
    snapshot = read_snapshot(fleet.svc, fleet.clock())
    plan = plan_fleet(snapshot.state)
    assert [a.reason for a in plan.actions if isinstance(a, Delete)] == ["not needed"]
    # Meanwhile the API sends a new job straight to the profile that has a worker.
    (late,) = fleet.add_jobs(1)
    assert dispatch_job(fleet.db, fleet.svc.celery, late, "l4-par2", now=fleet.clock())

    apply_plan(fleet.svc, snapshot, plan)
    (w,) = fleet.workers()
    assert w.state == WorkerState.BOOTING.value


def test_a_worker_rejected_at_readiness_is_a_failed_boot(make_fleet: MakeFleet) -> None:
    """Review of issue 11, H3: an image that boots but cannot serve its profile (here a
    CPU-only worker on a GPU profile) is counted, held, charged to the job, never looped."""
    fleet = make_fleet(
        [L4, P100],
        fleet={"max_failed_boots": 2, "boot_timeout_seconds": 600, "backoff_seconds": 600},
    )
    assert fleet.emulator is not None
    (job,) = fleet.add_jobs(1)
    created: list[str] = []
    for _ in range(6):  # bounded: more cycles than the hold needs
        fleet.reconcile(advance=10)
        for w in fleet.workers(WorkerState.BOOTING.value, WorkerState.CREATING.value):
            if w.id not in created:
                created.append(w.id)
            assert fleet.report_ready(w.id, device="cpu")  # refused
        fleet.reconcile(advance=10)
        settle(fleet)

    assert len(created) == 2  # held after the second (for 600 s), no fallback to the P100
    assert {w.profile for w in fleet.workers()} == {"l4-par2"}
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_failed_boots == 2
    assert state.retry_at is not None
    assert "2 workers in a row never became ready" in (state.last_error or "")
    assert "runtime rejected: device: worker runs on 'cpu'" in (state.last_error or "")
    # The second boot was for the job (the first came and went before it was dispatched).
    (j,) = fleet.jobs()
    assert j.id == job and j.attempts == 1
    assert all(w.state == WorkerState.DELETED.value for w in fleet.workers())
    assert fleet.emulator.inventory() == NOTHING


def test_a_gone_server_with_a_stuck_volume_costs_no_gpu(make_fleet: MakeFleet) -> None:
    """Review of issue 11, M3: once the server is confirmed gone, its worker no longer counts
    its GPU price against the budget while its volume's teardown is stuck (here a Block
    policy without delete rights); the pending deletion stays visible."""
    fleet = make_fleet([L4], budget=1.0)  # one L4 (0.75 EUR/h) fits, two do not
    assert fleet.emulator is not None
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=1)
    assert fleet.ready_all() == 1 and fleet.claim_all() == 1 and fleet.finish_all() == 1
    fleet.emulator.inject("get_volume", "permission")
    for _ in range(5):  # bounded: idle timeout, then the teardown that cannot finish
        fleet.reconcile(advance=70)
    assert fleet.emulator.inventory()["servers"] == 0
    (w,) = fleet.workers(WorkerState.DELETING.value)
    assert (w.error or "").startswith("teardown: ")

    fleet.add_jobs(1)
    report = fleet.reconcile(advance=1)
    assert report.plan is not None
    assert report.plan.current_hourly_eur == 0.0
    assert not any("budget" in r for r in report.plan.held_back)
    assert len(fleet.workers(WorkerState.REQUESTED.value, WorkerState.BOOTING.value)) == 1
    view = fleet_overview(fleet.svc.settings, fleet.db, fleet.svc.redis, fleet.clock())
    assert view["profiles"][0]["current_hourly_eur"] == 0.75
    # Still pending, so still alerted on.
    assert _metric(fleet, "murmur_worker_delete_pending_seconds", profile="l4-par2", worker=w.id)
    assert _metric(fleet, "murmur_fleet_cost_euros_per_hour", profile="l4-par2") == 0.75
    (w,) = fleet.workers(WorkerState.DELETING.value)
    assert (w.resources or {}).get("server_gone_at")  # when, for an operator


def test_a_power_on_that_shows_late_is_neither_out_of_stock_nor_backed_off(
    make_fleet: MakeFleet,
) -> None:
    """Review of issue 11, L4: a server that reads `stopped` (nothing said) before it shows
    `starting` boots normally; only a fall back after `starting`, or a stock detail, is a
    stock-out."""
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.boot_observations = 2
    fleet.emulator.inject("poweron", "lagging_poweron", times=1)
    fleet.add_jobs(1)
    fleet.reconcile()
    (w,) = fleet.workers()
    assert w.profile == "l4-par2" and w.state == WorkerState.BOOTING.value
    for _ in range(6):  # bounded: stopped, stopped, starting, ..., running
        fleet.reconcile(advance=5)
    (w,) = fleet.workers()
    assert w.state == WorkerState.BOOTING.value and w.booted_at is not None
    assert (w.resources or {}).get("seen_starting_at")
    state = fleet.profile_state("l4-par2")
    assert state is None or (state.consecutive_stockouts == 0 and state.backoff_until is None)
    assert fleet.ready_all() == 1
