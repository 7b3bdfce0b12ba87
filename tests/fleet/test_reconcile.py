"""Reconcile against real Redis, SQLite and PostgreSQL, the emulator and the real Scaleway SDK."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from app.credentials import InstanceCredential
from app.fleet.cloudinit import USER_DATA_LIMIT_BYTES
from app.fleet.providers.base import worker_tags
from app.fleet.reconcile import LISTENING_KEY, LOCK_KEY, listening_since
from app.fleet.service import read_plan
from app.models import Job, JobStatus, Worker, WorkerState
from app.observability.store import FRESHNESS_KEY, PROVISION_ATTEMPTS_KEY, snapshot_key
from tests.conftest import T0
from tests.fleet.conftest import (
    FOREIGN_TAGS,
    L4,
    P100,
    SIGNING_KEY,
    Fleet,
    MakeFleet,
    foreign_server,
)

LIVE = (
    WorkerState.REQUESTED.value,
    WorkerState.CREATING.value,
    WorkerState.BOOTING.value,
    WorkerState.READY.value,
)


def live(fleet: Fleet, profile: str | None = None) -> list[Worker]:
    return [w for w in fleet.workers(*LIVE) if profile is None or w.profile == profile]


def servers_in(fleet: Fleet, zone: str) -> list[str]:
    assert fleet.emulator is not None
    with fleet.emulator.lock:
        return [s for s, srv in fleet.emulator.servers.items() if srv.data["zone"] == zone]


def settle_teardown(fleet: Fleet, rounds: int = 5) -> None:
    for _ in range(rounds):
        if not fleet.workers(WorkerState.DELETING.value, WorkerState.FAILED.value):
            return
        fleet.reconcile()


# -- fallback on capacity only ----------------------------------------------------------------


def test_out_of_stock_on_create_moves_to_the_next_profile(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject("create", "out_of_stock", zone="fr-par-2")
    fleet.add_jobs(1)

    report = fleet.reconcile()

    assert [w.profile for w in live(fleet)] == ["p100-par1"]
    assert servers_in(fleet, "fr-par-2") == [] and len(servers_in(fleet, "fr-par-1")) == 1
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_stockouts == 1
    assert state.backoff_until is not None
    assert state.backoff_until.replace(tzinfo=T0.tzinfo) == T0.replace(minute=1)
    assert "out_of_stock" in (state.last_error or "")
    failed = fleet.workers(WorkerState.FAILED.value)
    assert [(w.profile, w.delete_reason) for w in failed] == [("l4-par2", "out of stock")]
    assert report.plan is not None
    assert any("l4-par2: out of stock" in r for r in report.plan.held_back)
    assert fleet.svc.redis.hgetall(PROVISION_ATTEMPTS_KEY) == {
        b"l4-par2|out_of_stock": b"1",
        b"p100-par1|succeeded": b"1",
    }


def test_a_shortage_hint_creates_nothing_and_falls_back(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.set_availability("fr-par-2", "L4-1-24G", "shortage")
    fleet.add_jobs(1)

    fleet.reconcile()

    assert not [e for e in fleet.emulator.events if e[1] == "fr-par-2"]  # not even a create
    assert not [r for r in fleet.emulator.requests if r == ("POST", _SERVERS_PAR2)]
    assert [w.profile for w in live(fleet)] == ["p100-par1"]
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_stockouts == 1
    assert state.backoff_until is not None and state.availability == "shortage"
    assert "scaleway: the provider reports a shortage of L4-1-24G" in (state.last_error or "")


@pytest.mark.parametrize("hint", ["scarce", "unknown"])
def test_a_scarce_or_unknown_hint_still_creates(make_fleet: MakeFleet, hint: str) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    if hint == "unknown":  # the availability call fails: no hint at all
        fleet.emulator.inject("availability", "server_error", zone="fr-par-2")
    else:
        fleet.emulator.set_availability("fr-par-2", "L4-1-24G", hint)
    fleet.add_jobs(1)

    fleet.reconcile()

    assert [w.profile for w in live(fleet)] == ["l4-par2"]
    assert ("POST", _SERVERS_PAR2) in fleet.emulator.requests
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_stockouts == 0
    assert state.availability == (None if hint == "unknown" else hint)


_SERVERS_PAR2 = "/instance/v1/zones/fr-par-2/servers"


def test_out_of_stock_on_power_on_deletes_the_server_and_falls_back(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "out_of_stock", zone="fr-par-2")
    fleet.add_jobs(1)

    fleet.reconcile()

    ops = [(op, zone) for op, zone, _ in fleet.emulator.events]
    assert ops[:5] == [
        ("create", "fr-par-2"),
        ("user_data", "fr-par-2"),
        ("delete", "fr-par-2"),
        ("gone", "fr-par-2"),
        ("delete_volume", "fr-par-2"),
    ]
    assert ops[5:8] == [("create", "fr-par-1"), ("user_data", "fr-par-1"), ("poweron", "fr-par-1")]
    assert servers_in(fleet, "fr-par-2") == []
    assert [w.profile for w in live(fleet)] == ["p100-par1"]
    # The created server's Block volume went with it: only the p100 server's volume remains.
    assert fleet.emulator.inventory() == {"servers": 1, "ips": 0, "volumes": 1}


def test_back_off_doubles_then_clears_when_stock_returns(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fault = fleet.emulator.inject("create", "out_of_stock", zone="fr-par-2")
    fleet.add_jobs(3)

    fleet.reconcile()
    assert [w.profile for w in live(fleet)] == ["p100-par1", "p100-par1"]  # its max_workers

    fleet.reconcile(advance=30)  # still backing off: l4 not tried
    assert fault.hits == 1

    fleet.reconcile(advance=31)  # 61 s: tried again, out of stock again
    state = fleet.profile_state("l4-par2")
    assert fault.hits == 2 and state is not None and state.consecutive_stockouts == 2
    assert state.backoff_until is not None
    assert (state.backoff_until.replace(tzinfo=T0.tzinfo) - fleet.clock()).total_seconds() == 120

    fleet.emulator.clear_faults()
    fleet.reconcile(advance=121)
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_stockouts == 0 and state.backoff_until is None
    assert [w.profile for w in live(fleet, "l4-par2")] == ["l4-par2"]


ERRORS = [
    ("quota", "create", "QuotaExceeded", "quotas_exceeded", "quota_exceeded"),
    ("permission", "create", "PermissionDenied", "permissions_denied", "permission_denied"),
    ("server_error", "create", "ProviderUnavailable", "HTTP 500", "provider_unavailable"),
    (
        "bad_gateway",
        "create",
        "ProviderUnavailable",
        "HTTP 502, non-JSON body",
        "provider_unavailable",
    ),
    ("invalid", "create", "InvalidArgument", "invalid_arguments", "invalid_argument"),
    ("permission", "poweron", "PermissionDenied", "permissions_denied", "permission_denied"),
    ("server_error", "user_data", "ProviderUnavailable", "HTTP 500", "provider_unavailable"),
]


@pytest.mark.parametrize(("kind", "op", "error", "text", "outcome"), ERRORS)
def test_other_errors_stop_without_fallback(
    make_fleet: MakeFleet,
    kind: str,
    op: str,
    error: str,
    text: str,
    outcome: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject(op, kind, zone="fr-par-2")
    fleet.add_jobs(2)

    report = fleet.reconcile()

    assert live(fleet) == []  # no jump to p100-par1
    assert fleet.emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}
    state = fleet.profile_state("l4-par2")
    assert state is not None and text in (state.last_error or "")
    assert state.backoff_until is None and state.consecutive_stockouts == 0
    assert state.retry_at is not None
    failed = fleet.workers(WorkerState.FAILED.value)
    assert len(failed) == 1 and text in (failed[0].error or "")
    assert error in caplog.text and "no fallback" in caplog.text
    assert report.plan is not None and report.outcomes[0].errors
    counted = fleet.svc.redis.hgetall(PROVISION_ATTEMPTS_KEY)
    assert counted == {f"l4-par2|{outcome}".encode(): b"1"}

    # Held, not re-routed: the next round neither retries nor falls back.
    plan = fleet.reconcile(advance=30).plan
    assert plan is not None and live(fleet) == []
    assert any("not falling back" in r for r in plan.held_back)
    assert len(fleet.workers(WorkerState.FAILED.value)) == 1

    fleet.emulator.clear_faults()
    fleet.reconcile(advance=31)
    assert {w.profile for w in live(fleet)} == {"l4-par2"}


def test_slow_create_times_out_and_the_late_server_is_swept(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject("create", "slow", zone="fr-par-2", delay=3.0, times=1)
    fleet.add_jobs(1)

    fleet.reconcile()
    failed = fleet.workers(WorkerState.FAILED.value)
    assert len(failed) == 1 and "no answer within 2s" in (failed[0].error or "")
    assert live(fleet) == []  # a timeout is not out of stock

    # The emulator finishes the create after the client gave up: a tagged server nobody owns.
    deadline = time.monotonic() + 10
    while not servers_in(fleet, "fr-par-2") and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = servers_in(fleet, "fr-par-2")
    assert len(leaked) == 1
    assert f"murmur-worker={failed[0].id}" in fleet.emulator.server(leaked[0])["tags"]

    fleet.reconcile(advance=61)
    settle_teardown(fleet)
    assert leaked[0] not in fleet.emulator.servers
    orphans = [w for w in fleet.workers() if w.delete_reason == "orphan"]
    assert [w.instance_id for w in orphans] == leaked
    assert orphans[0].state == WorkerState.DELETED.value


# -- instance setup ---------------------------------------------------------------------------


def test_zone_security_group_tags_and_user_data(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([L4, P100])
    assert fleet.emulator is not None
    fleet.emulator.inject("create", "out_of_stock", zone="fr-par-2", times=1)
    fleet.add_jobs(2)
    fleet.reconcile()  # l4 out of stock once: p100 gets both
    fleet.reconcile(advance=61)  # nothing waits any more: no l4 worker
    fleet.add_jobs(1)
    fleet.reconcile()  # l4 is first again and in stock

    groups = fleet.svc.settings.security_groups
    for w in live(fleet):
        profile = fleet.svc.settings.profile(w.profile)
        assert w.instance_id is not None
        server = fleet.emulator.server(w.instance_id)
        assert server["zone"] == profile.zone
        assert server["commercial_type"] == profile.server_type
        assert server["security_group"]["id"] == groups[profile.security_group].id
        assert server["project"] == fleet.svc.settings.scaleway.project_id
        assert server["tags"] == worker_tags(w.id, w.profile)
        assert [v["volume_type"] for v in server["volumes"].values()] == ["sbs_volume"]
        assert w.resources is not None and w.resources["zone"] == profile.zone
        events = [op for op, _, sid in fleet.emulator.events if sid == w.instance_id]
        assert events[:3] == ["create", "user_data", "poweron"]  # user data before power-on
        data = fleet.emulator.user_data(w.instance_id)["cloud-init"]
        assert len(data) < USER_DATA_LIMIT_BYTES
        token = InstanceCredential.derive(SIGNING_KEY, w.id, w.instance_id).token
        assert data.startswith(b"#cloud-config") and token.encode() in data
        assert SIGNING_KEY.encode() not in data
        assert f"MURMUR_PROFILE={profile.name}".encode() in data
    assert sorted(w.profile for w in live(fleet)) == ["l4-par2", "p100-par1", "p100-par1"]


def test_user_data_never_logged(make_fleet: MakeFleet, caplog: pytest.LogCaptureFixture) -> None:
    fleet = make_fleet()
    fleet.add_jobs(1)
    with caplog.at_level("DEBUG"):
        fleet.reconcile()
    (w,) = live(fleet)
    assert w.instance_id is not None
    token = InstanceCredential.derive(SIGNING_KEY, w.id, w.instance_id).token
    assert "provision l4-par2" in caplog.text
    assert token not in caplog.text and "cloud-config" not in caplog.text


# -- readiness --------------------------------------------------------------------------------


def test_incompatible_hardware_is_rejected_then_deleted(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.add_jobs(1)
    fleet.reconcile()
    (w,) = live(fleet)

    # The instance came up on a P100 (capability 6.0): float16 cannot run there.
    problems = fleet.report_ready(w.id, cuda_capability=[6, 0], gpu_name="P100")
    assert problems == [
        "compute_type: float16 needs CUDA capability >= 7.0; the worker's GPU has 6.0"
    ]
    (rejected,) = fleet.workers(WorkerState.FAILED.value)
    assert rejected.error is not None and rejected.error.startswith("runtime rejected: ")

    fleet.reconcile(advance=5)
    settle_teardown(fleet)
    (gone,) = [x for x in fleet.workers() if x.id == w.id]
    assert gone.state == WorkerState.DELETED.value and gone.delete_reason == "runtime rejected"
    assert gone.instance_id not in fleet.emulator.servers


def test_ready_worker_gets_lifecycle_timestamps(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.boot_observations = 2  # create's own look after poweron is one of them
    (job_id,) = fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)  # the provider still says starting
    (w,) = live(fleet)
    assert w.booted_at is None
    fleet.reconcile(advance=5)  # now running: booted
    (w,) = live(fleet)
    assert w.created_at is not None and w.booted_at is not None
    assert w.booted_at.replace(tzinfo=T0.tzinfo) == fleet.clock()
    fleet.clock.advance(20)
    assert fleet.report_ready(w.id) == []
    fleet.reconcile()
    assert fleet.claim_all() == 1
    fleet.clock.advance(30)
    assert fleet.finish_all() == 1
    fleet.reconcile(advance=61)
    settle_teardown(fleet)
    (done,) = fleet.workers()
    stamps = [
        done.requested_at,
        done.created_at,
        done.booted_at,
        done.ready_at,
        done.first_job_at,
        done.idle_since,
        done.delete_requested_at,
        done.deleted_at,
    ]
    assert all(s is not None for s in stamps)
    assert stamps == sorted(stamps)  # type: ignore[type-var]
    assert done.delete_reason == "idle"
    assert [j.status for j in fleet.jobs()] == [JobStatus.SUCCEEDED.value]
    assert job_id == fleet.jobs()[0].id


# -- teardown ---------------------------------------------------------------------------------


def test_teardown_removes_server_flexible_ip_and_volume(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "attach_flexible_ip", zone="fr-par-2")
    fleet.add_jobs(2)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    assert fleet.emulator.inventory() == {"servers": 2, "ips": 2, "volumes": 2}
    fleet.ready_all()
    assert fleet.claim_all() == 2
    assert fleet.finish_all() == 2
    for w in fleet.workers():  # their usage reports, which retirement must drop
        fleet.svc.redis.set(snapshot_key(w.id), "{}")

    fleet.reconcile(advance=61)  # idle: deleted
    settle_teardown(fleet)
    assert all(not fleet.svc.redis.exists(snapshot_key(w.id)) for w in fleet.workers())

    assert fleet.emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}
    assert {w.state for w in fleet.workers()} == {WorkerState.DELETED.value}


def test_a_failed_delete_is_retried_until_confirmed(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    fleet.ready_all()
    fleet.claim_all()
    fleet.finish_all()
    fleet.emulator.inject("terminate", "server_error", times=1)

    fleet.reconcile(advance=61)
    (w,) = fleet.workers()
    assert w.state == WorkerState.DELETING.value and "HTTP 500" in (w.error or "")
    assert fleet.emulator.inventory()["servers"] == 1

    fleet.reconcile(advance=5)
    settle_teardown(fleet)
    (w,) = fleet.workers()
    assert w.state == WorkerState.DELETED.value
    assert fleet.emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}


def test_server_stuck_starting_hits_boot_timeout_and_its_job_moves(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "never_start", zone="fr-par-2", times=1)
    (job,) = fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    (w,) = live(fleet)
    assert w.state == WorkerState.BOOTING.value and w.booted_at is None
    assert [j.status for j in fleet.jobs()] == [JobStatus.DISPATCHED.value]

    fleet.reconcile(advance=901)
    settle_teardown(fleet)
    dead = [x for x in fleet.workers() if x.id == w.id][0]
    assert dead.state == WorkerState.DELETED.value and dead.delete_reason == "boot timeout"
    assert dead.instance_id not in fleet.emulator.servers
    # Its job went back, and onto the replacement worker once that one exists.
    assert [j.status for j in fleet.jobs()] == [JobStatus.QUEUED.value]
    fleet.reconcile(advance=5)
    (replacement,) = live(fleet)
    (j,) = fleet.jobs()
    assert j.id == job and j.status == JobStatus.DISPATCHED.value
    assert j.profile == replacement.profile


def _heard(fleet: Fleet, *workers: Worker) -> None:
    """What an accepted usage report records: its arrival, in Redis."""
    for worker in workers:
        fleet.svc.redis.hset(FRESHNESS_KEY, worker.id, fleet.clock().timestamp())


def _busy_fleet(make_fleet: MakeFleet, workers: int) -> Fleet:
    """`workers` ready workers reporting every 30 s, each running a job."""
    fleet = make_fleet(observability={"enabled": True, "report_interval_seconds": 30})
    fleet.add_jobs(workers)
    fleet.reconcile()
    fleet.ready_all()
    fleet.reconcile(advance=1)
    assert fleet.claim_all() == workers
    return fleet


def test_silent_worker_is_dead_and_its_job_redispatched(make_fleet: MakeFleet) -> None:
    fleet = _busy_fleet(make_fleet, 2)
    silent, talking = sorted(live(fleet), key=lambda w: w.id)

    # Two reports lost in a row are survived (3 intervals with their jitter, each with a
    # report's timeout: 123 s); the third is not. The other worker keeps reporting.
    for _ in range(3):
        _heard(fleet, talking)
        fleet.reconcile(advance=40)
    assert silent.id in {w.id for w in live(fleet)}
    _heard(fleet, talking)
    fleet.reconcile(advance=4)
    settle_teardown(fleet)
    dead = [x for x in fleet.workers() if x.id == silent.id][0]
    assert dead.delete_reason == "no heartbeat" and dead.state == WorkerState.DELETED.value
    assert talking.id in {w.id for w in live(fleet)}
    (j,) = [j for j in fleet.jobs() if j.worker_id != talking.id]
    assert j.status == JobStatus.QUEUED.value and j.worker_id is None
    _heard(fleet, talking)
    fleet.reconcile(advance=5)
    (j,) = [j for j in fleet.jobs() if j.worker_id != talking.id]
    assert j.status == JobStatus.DISPATCHED.value
    assert len(live(fleet)) == 2 and silent.id not in {w.id for w in live(fleet)}


def test_rounds_further_apart_than_the_heartbeat_timeout_still_find_dead_workers(
    make_fleet: MakeFleet,
) -> None:
    # A slow provider or a busy control queue can space rounds out; that is not a stop.
    fleet = _busy_fleet(make_fleet, 2)
    silent, talking = sorted(live(fleet), key=lambda w: w.id)
    fleet.clock.advance(150)  # longer than the 123 s heartbeat timeout
    _heard(fleet, talking)
    fleet.reconcile()
    settle_teardown(fleet)
    assert [w.delete_reason for w in fleet.workers() if w.id == silent.id] == ["no heartbeat"]


def test_listening_restarts_only_after_a_stop(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(observability={"enabled": True, "report_interval_seconds": 30})
    t0 = fleet.clock()
    at = lambda seconds: t0 + timedelta(seconds=seconds)  # noqa: E731
    assert listening_since(fleet.svc, t0) == t0  # the first round ever
    assert listening_since(fleet.svc, at(250)) == t0  # a slow round is not a stop
    assert listening_since(fleet.svc, at(200)) == t0  # nor is a clock stepping back
    assert listening_since(fleet.svc, at(200 + 3600)) == at(3800)  # an hour without rounds is
    fleet.svc.redis.set(LISTENING_KEY, b"{not json")
    assert listening_since(fleet.svc, at(3810)) == at(3810)


def test_when_no_worker_is_heard_the_control_plane_is_suspected_first(
    make_fleet: MakeFleet,
) -> None:
    # Everyone silent at once looks like the API or the network failing, not every worker:
    # deleting them all would lose their jobs, and in a shortage their GPUs.
    fleet = _busy_fleet(make_fleet, 1)
    (w,) = live(fleet)
    for _ in range(9):  # 9 intervals of silence: past 3, within the 10 tolerated
        fleet.reconcile(advance=30)
    assert [x.id for x in live(fleet)] == [w.id]
    fleet.reconcile(advance=31)
    settle_teardown(fleet)
    assert [x.delete_reason for x in fleet.workers() if x.id == w.id] == ["no heartbeat"]


def test_a_control_plane_back_from_a_long_stop_does_not_delete_every_worker(
    make_fleet: MakeFleet,
) -> None:
    fleet = _busy_fleet(make_fleet, 2)
    workers = live(fleet)
    # The whole control plane stops for 20 minutes: no reconcile, and no report is heard.
    report = fleet.reconcile(advance=20 * 60)
    assert {w.id for w in live(fleet)} == {w.id for w in workers}
    assert report is not None
    # Reports resume; from here on silence counts again.
    _heard(fleet, *workers)
    fleet.reconcile(advance=30)
    _heard(fleet, workers[0])
    for _ in range(4):
        fleet.reconcile(advance=30)
        _heard(fleet, workers[0])
    settle_teardown(fleet)
    now_live = {w.id for w in live(fleet)}
    assert workers[0].id in now_live and workers[1].id not in now_live
    assert [w.delete_reason for w in fleet.workers() if w.id == workers[1].id] == ["no heartbeat"]


def test_instance_that_vanished_is_dead(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.ready_all()
    (w,) = live(fleet)
    assert w.instance_id is not None
    with fleet.emulator.lock:  # someone deleted it in the console
        fleet.emulator._remove(fleet.emulator.servers[w.instance_id])

    fleet.reconcile(advance=5)
    settle_teardown(fleet)
    gone = [x for x in fleet.workers() if x.id == w.id][0]
    assert gone.delete_reason == "instance gone" and gone.state == WorkerState.DELETED.value
    assert fleet.emulator.inventory()["volumes"] == 1  # its volume deleted, the new one's left


def test_orphan_instances_are_deleted(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    provider = fleet.svc.providers["scaleway"]
    profile = fleet.svc.settings.profile("l4-par2")
    unknown = provider.create(profile, "wrk_from_a_lost_database", lambda i, r: {})
    fleet.reconcile()
    settle_teardown(fleet)
    assert unknown.instance_id not in fleet.emulator.servers
    assert fleet.emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}
    (adopted,) = fleet.workers()
    assert adopted.id == "wrk_from_a_lost_database" and adopted.delete_reason == "orphan"


@pytest.mark.parametrize("tag_filter", [True, False], ids=["filtered", "filter-ignored"])
def test_servers_the_fleet_did_not_make_are_never_deleted(
    make_fleet: MakeFleet, tag_filter: bool
) -> None:
    """Whatever the listing returns, only servers whose own tags carry the fleet tag and a
    worker id are swept; a real orphan next to them still goes."""
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.list_tag_filter = tag_filter
    foreign = {
        foreign_server(fleet.emulator, zone, tags)
        for zone in ("fr-par-2", "fr-par-1")
        for tags in FOREIGN_TAGS
    }
    provider = fleet.svc.providers["scaleway"]
    lost = provider.create(fleet.svc.settings.profile("l4-par2"), "wrk_lost", lambda i, r: {})

    fleet.reconcile()
    settle_teardown(fleet)
    fleet.reconcile(advance=61)

    assert lost.instance_id not in fleet.emulator.servers
    assert foreign <= set(fleet.emulator.servers)
    touched = [e for e in fleet.emulator.events if e[2] in foreign]
    assert {op for op, _, _ in touched} == {"create", "poweron"}
    assert not [w for w in fleet.workers() if w.instance_id in foreign]


def test_instance_of_a_deleted_worker_is_an_orphan(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.add_jobs(1)
    fleet.reconcile()
    (w,) = live(fleet)
    with fleet.db.session() as s:  # the row says deleted, the provider disagrees
        s.execute(
            update(Worker)
            .where(Worker.id == w.id)
            .values(state=WorkerState.DELETED.value, deleted_at=fleet.clock())
        )
        s.execute(update(Job).values(status=JobStatus.CANCELLED.value))
    fleet.reconcile(advance=5)
    settle_teardown(fleet)
    assert fleet.emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}


# -- scale -------------------------------------------------------------------------------------


def test_burst_of_50_jobs_scales_to_the_caps_and_back_to_zero(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.add_jobs(50)
    peak: dict[str, int] = {}
    for _ in range(60):
        report = fleet.reconcile(advance=5)
        assert report.plan is not None
        assert report.plan.planned_hourly_eur <= 10.0
        counts = {p: len(live(fleet, p)) for p in ("l4-par2", "p100-par1")}
        assert counts["l4-par2"] <= 3 and counts["p100-par1"] <= 2
        for p, n in counts.items():
            peak[p] = max(peak.get(p, 0), n)
        fleet.ready_all()
        fleet.finish_all()
        fleet.claim_all()
        if not fleet.jobs(
            JobStatus.QUEUED.value, JobStatus.DISPATCHED.value, JobStatus.RUNNING.value
        ):
            break
    assert peak == {"l4-par2": 3, "p100-par1": 2}
    assert len(fleet.jobs(JobStatus.SUCCEEDED.value)) == 50

    fleet.reconcile(advance=61)
    settle_teardown(fleet)
    assert live(fleet) == []
    assert fleet.emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}
    assert {w.delete_reason for w in fleet.workers()} == {"idle"}
    assert len(fleet.workers()) == 5  # no worker was created beyond the caps


def test_budget_holds_back_and_says_so(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(budget=3.0)
    fleet.add_jobs(10)
    report = fleet.reconcile()
    assert report.plan is not None
    assert [w.profile for w in live(fleet)] == ["l4-par2"] * 3
    assert report.plan.planned_hourly_eur == pytest.approx(2.25)
    assert any("p100-par1: budget of 3.00 EUR/h reached" in r for r in report.plan.held_back)
    published = read_plan(fleet.svc.redis)
    assert published is not None and published["planned_hourly_eur"] == pytest.approx(2.25)
    assert any("budget" in r for r in published["held_back"])


def test_dispatched_jobs_sit_on_the_profile_queue(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    fleet.add_jobs(3)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    dispatched = fleet.jobs(JobStatus.DISPATCHED.value)
    assert len(dispatched) == 3
    assert {j.profile for j in dispatched} == {"l4-par2"}
    assert fleet.svc.redis.llen("transcribe.l4-par2") == 3


def test_one_run_at_a_time(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    fleet.add_jobs(1)
    held = fleet.svc.redis.lock(LOCK_KEY, timeout=30)
    assert held.acquire(blocking=False)
    try:
        assert fleet.reconcile().ran is False
        assert fleet.workers() == []
    finally:
        held.release()
    assert fleet.reconcile().ran is True
    assert len(fleet.workers()) == 1


def test_an_idle_worker_that_got_work_since_the_plan_is_kept(make_fleet: MakeFleet) -> None:
    """The plan saw the worker idle; the API dispatched to its profile before the apply."""
    from app.fleet.apply import _teardown

    fleet = make_fleet()
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    fleet.ready_all()
    assert fleet.claim_all() == 1 and fleet.finish_all() == 1
    (worker,) = live(fleet)
    (job_id,) = fleet.add_jobs(1)
    with fleet.db.session() as s:  # what the API's immediate dispatch does
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=JobStatus.DISPATCHED.value, profile=worker.profile)
        )
    assert _teardown(fleet.svc, worker.id, "idle") is False
    assert [w.id for w in live(fleet)] == [worker.id]
    with fleet.db.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.SUCCEEDED.value))
    _teardown(fleet.svc, worker.id, "idle")
    assert live(fleet) == []


def test_a_usage_report_in_redis_counts_as_the_heartbeat(make_fleet: MakeFleet) -> None:
    """Reports refresh liveness in Redis only; the snapshot takes the later of both records."""
    from datetime import timedelta

    from app.fleet.snapshot import read_snapshot
    from app.observability.store import FRESHNESS_KEY

    fleet = make_fleet()
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    fleet.ready_all()
    (worker,) = live(fleet)
    old = fleet.clock() - timedelta(minutes=10)
    with fleet.db.session() as s:
        s.execute(update(Worker).where(Worker.id == worker.id).values(last_seen_at=old))
    reported = fleet.clock() - timedelta(seconds=3)
    fleet.svc.redis.hset(FRESHNESS_KEY, worker.id, reported.timestamp())
    (seen,) = [
        w for w in read_snapshot(fleet.svc, fleet.clock()).state.workers if w.id == worker.id
    ]
    assert seen.last_seen_at == reported
    fleet.svc.redis.hdel(FRESHNESS_KEY, worker.id)
    (seen,) = [
        w for w in read_snapshot(fleet.svc, fleet.clock()).state.workers if w.id == worker.id
    ]
    assert seen.last_seen_at == old


def test_a_worker_refused_at_readiness_while_its_teardown_starts_is_still_torn_down(
    make_fleet: MakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The teardown moves the row to `deleting` from whatever state it is in by then: a
    readiness refusal landing after the teardown read the row must not leave a row that says
    `failed` (and never deleted) for an instance the teardown deletes."""
    import app.fleet.apply as apply

    fleet = make_fleet()
    if fleet.svc.db.url.startswith("sqlite"):
        pytest.skip("SQLite sessions take the write lock at BEGIN: no refusal can land between")
    assert fleet.emulator is not None
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    fleet.ready_all()
    (worker,) = fleet.workers(WorkerState.READY.value)

    def refused_meanwhile(session: object, row: Worker) -> bool:
        # Runs after the teardown loaded the row as `ready`, before it moves it: the worker's
        # repeated ready report is refused in another session right then.
        assert fleet.report_ready(worker.id, device="cpu")
        return False  # still idle

    monkeypatch.setattr(apply, "_has_work", refused_meanwhile)
    deleted = apply._teardown(fleet.svc, worker.id, "idle")
    monkeypatch.undo()
    for _ in range(20):
        if deleted:
            break
        fleet.clock.advance(5)
        deleted = apply._teardown(fleet.svc, worker.id, "idle")
    (row,) = fleet.workers()
    assert (row.state, row.deleted_at is not None) == (WorkerState.DELETED.value, True)
    assert fleet.emulator.inventory()["servers"] == 0
