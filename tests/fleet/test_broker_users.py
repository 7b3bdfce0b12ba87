"""Each worker's own broker user, against a private redis-server with ACLs (not a mock).

The server is started by the test on a free loopback port; the default user is switched off,
so the control plane works only through its own user, which may manage ACLs. Real Celery
workers (gpu_worker's app, events on, acks_late, no remote control) run under workers' users
in subprocesses.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import event

from app.config import LOCAL_CPU_PROFILE, Settings
from app.credentials import InstanceCredential, broker_password
from app.fleet import broker_users
from app.fleet.apply import _teardown
from app.fleet.reconcile import LOCK_KEY
from app.models import WorkerState
from app.observability.store import BROKER_USERS_RECREATED_KEY, snapshot_key
from app.transitions import move_worker
from gpu_worker.protocol.broker import unacked_keys
from tests.fleet.conftest import L4, SIGNING_KEY, Fleet, MakeFleet

CONTROL_PASSWORD = "control-plane-password-" + "c" * 24
WORKER_SCRIPT = """
import sys
import time
from pathlib import Path
from gpu_worker.celery_app import make_celery
from gpu_worker.jobs import Outcome

url, queue, hostname, out = sys.argv[1:5]
hold = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0  # seconds each job takes
visibility = float(sys.argv[6]) if len(sys.argv) > 6 else None

def run_job(job_id):
    with open(out, "a") as f:
        f.write(job_id + "\\n")
    time.sleep(hold)
    return Outcome.SUCCEEDED

app = make_celery(url, queue, run_job, on_retired=lambda: None)
if visibility is not None:  # a test's short stand-in for the 4 h visibility timeout
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options, "visibility_timeout": visibility
    }
app.Worker(hostname=hostname, pool_cls="solo", concurrency=1, queues=[queue],
           loglevel="INFO", without_mingle=True, without_gossip=True).start()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AclRedis:
    def __init__(self, port: int) -> None:
        self.port = port
        self.base_url = f"redis://127.0.0.1:{port}/2"
        self.control_url = f"redis://murmur-control:{CONTROL_PASSWORD}@127.0.0.1:{port}/2"
        self.control = redis.Redis.from_url(self.control_url)

    def as_user(self, name: str, password: str) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=2, username=name, password=password)

    def users(self) -> list[str]:
        names = self.control.acl_users()
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names)  # type: ignore[union-attr]

    def denials(self) -> list[dict[bytes, object]]:
        return list(self.control.acl_log())  # type: ignore[arg-type]


@pytest.fixture()
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    admin = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        # The control plane's own user may do anything, ACLs included; nobody else may.
        admin.acl_setuser(
            "murmur-control",
            enabled=True,
            passwords=[f"+{CONTROL_PASSWORD}"],
            categories=["+@all"],
            keys=["*"],
            channels=["*"],
        )
        admin.acl_setuser("default", enabled=False, reset=True)
        server = AclRedis(port)
        yield server
        server.control.close()
    finally:
        admin.close()
        proc.terminate()
        proc.wait(timeout=10)


def _wait(
    condition: object, timeout: float, what: str, detail: Callable[[], str] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}" + (f"; {detail()}" if detail else ""))


def test_a_worker_user_runs_a_real_celery_worker_and_reaches_nothing_else(
    acl_redis: AclRedis, tmp_path: Path
) -> None:
    control = acl_redis.control
    # What else lives on the broker: the control queue, the fleet's lock, another worker's
    # usage report and another profile's queue.
    control.rpush("control", "reconcile")
    control.set(LOCK_KEY, "token")
    control.set(snapshot_key("wrk_b"), "{}")
    control.rpush("transcribe.b", "someone else's job")

    user = broker_users.create_user(
        control, acl_redis.base_url, "transcribe.a", "wrk_a", SIGNING_KEY
    )
    out = tmp_path / "jobs.txt"
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER_SCRIPT, user.url(acl_redis.base_url), "transcribe.a",
         "wrk_a@instance-a", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip
    sender = Celery("control", set_as_current=False)
    sender.conf.update(broker_url=acl_redis.control_url, task_send_sent_event=True)
    try:
        sender.send_task("murmur.transcribe", args=["job-1"], queue="transcribe.a")
        _wait(lambda: out.exists() and out.read_text() == "job-1\n", 60, "the job to run")
        # Acknowledged (acks_late) under the profile's own keys; the shared ones stay unused.
        unacked = unacked_keys("transcribe.a")["unacked_key"]
        _wait(lambda: out.exists() and not control.hlen(unacked), 10, "the ack")
        assert not control.exists("unacked", "unacked_index")
        # No remote control: a broadcast gets no answer (and the worker needs no pidbox right).
        assert not sender.control.inspect(timeout=1).ping()
        assert acl_redis.denials() == []
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=30)
        sender.close()
    assert b"NoPermissionError" not in err and b"NOPERM" not in err, err.decode()[-2000:]

    client = acl_redis.as_user(user.name, user.password)
    assert client.rpush("transcribe.a", "x") == 1
    denied = [
        lambda: client.llen("transcribe.b"),
        lambda: client.lpop("transcribe.b"),
        lambda: client.lrange("control", 0, -1),
        lambda: client.rpush("control", "x"),
        lambda: client.get(LOCK_KEY),
        lambda: client.get(snapshot_key("wrk_b")),
        lambda: client.keys("*"),
        lambda: client.flushdb(),
        lambda: client.acl_list(),
        lambda: client.config_get("*"),
        lambda: client.publish("/2.other", "x"),
        lambda: client.llen("wrk_b@instance-b.celery.pidbox"),
        # Remote control: a broadcast (shutdown, revoke) to every worker and the control worker.
        lambda: client.publish("/2.celery.pidbox", "x"),
        lambda: client.rpush("control.celery.pidbox", "x"),
        # Forging in-flight entries a consumer would restore onto `control` (the control
        # worker's keys), or reading and forging another profile's.
        lambda: client.hset("unacked", "tag", '[{}, "control", "control"]'),
        lambda: client.zadd("unacked_index", {"tag": 1}),
        lambda: client.hset(unacked_keys("transcribe.b")["unacked_key"], "tag", "[]"),
        lambda: client.zadd(unacked_keys("transcribe.b")["unacked_index_key"], {"tag": 1}),
        lambda: client.hgetall(unacked_keys("transcribe.b")["unacked_key"]),
    ]
    for call in denied:
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
    assert control.llen("transcribe.b") == 1
    client.close()


def test_deleting_the_user_closes_its_connections(acl_redis: AclRedis) -> None:
    user = broker_users.create_user(
        acl_redis.control, acl_redis.base_url, "transcribe.a", "w1", SIGNING_KEY
    )
    client = acl_redis.as_user(user.name, user.password)
    assert client.ping()
    broker_users.delete_user(acl_redis.control, acl_redis.base_url, "w1")
    with pytest.raises(redis.RedisError):
        client.ping()
    with pytest.raises(redis.AuthenticationError):
        acl_redis.as_user(user.name, user.password).ping()
    assert user.password not in repr(user)


def _fleet_on(make_fleet: MakeFleet, acl_redis: AclRedis, **settings_kw: object) -> Fleet:
    fleet = make_fleet([L4], **settings_kw)
    fleet.svc.redis = acl_redis.control
    fleet.svc.settings = fleet.svc.settings.model_copy(
        update={"worker_broker_url": acl_redis.base_url}
    )
    return fleet


def test_each_worker_gets_its_own_user_and_loses_it_when_retired(
    make_fleet: MakeFleet, acl_redis: AclRedis
) -> None:
    fleet = _fleet_on(make_fleet, acl_redis)
    assert fleet.emulator is not None
    fleet.add_jobs(2)
    fleet.reconcile()
    workers = fleet.workers()
    assert len(workers) == 2
    assert acl_redis.users() == sorted(
        ["murmur-control", "default", *(broker_users.user_name(w.id, 2) for w in workers)]
    )
    for w in workers:
        assert w.instance_id is not None
        data = fleet.emulator.user_data(w.instance_id)["cloud-init"].decode()
        (line,) = [x for x in data.splitlines() if "MURMUR_BROKER_URL=" in x]
        url = line.split("=", 1)[1].strip()
        client = redis.Redis.from_url(url)
        assert client.rpush("transcribe.l4-par2", "x") >= 1  # its own password works
        client.close()
        assert CONTROL_PASSWORD not in data
        other = next(o for o in workers if o.id != w.id)
        assert broker_users.user_name(other.id, 2) not in data

    fleet.ready_all()
    fleet.reconcile(advance=5)  # dispatch to the ready workers
    assert fleet.claim_all() == 2
    assert fleet.finish_all() == 2
    fleet.reconcile(advance=61)  # idle: deleted
    for _ in range(5):
        fleet.reconcile()
    assert fleet.emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}
    assert acl_redis.users() == ["default", "murmur-control"]


def test_a_failed_create_leaves_no_user_and_the_sweep_removes_strays(
    make_fleet: MakeFleet, acl_redis: AclRedis
) -> None:
    fleet = _fleet_on(make_fleet, acl_redis)
    assert fleet.emulator is not None
    fleet.emulator.inject("create", "quota", zone="fr-par-2")
    # A user left by a control worker that died between ACL SETUSER and the create call.
    broker_users.create_user(
        acl_redis.control, acl_redis.base_url, "transcribe.x", "wrk_lost", SIGNING_KEY
    )
    fleet.add_jobs(1)
    fleet.reconcile()
    assert fleet.workers()[0].state == "failed"
    assert acl_redis.users() == ["default", "murmur-control"]


def test_no_server_without_the_right_to_create_the_user(
    make_fleet: MakeFleet, acl_redis: AclRedis
) -> None:
    fleet = _fleet_on(make_fleet, acl_redis)
    assert fleet.emulator is not None
    acl_redis.control.acl_setuser("murmur-control", commands=["-acl"])
    fleet.add_jobs(1)
    fleet.reconcile()
    assert fleet.emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.last_error is not None
    assert "cannot create the worker's Redis user" in state.last_error
    (worker,) = fleet.workers()
    password = broker_password(SIGNING_KEY, 2, worker.id)
    assert worker.error is not None and password not in worker.error
    assert password not in state.last_error


def test_on_for_cloud_profiles_off_for_local_unless_configured() -> None:
    local = LOCAL_CPU_PROFILE.model_dump()
    cloud = Settings.model_validate({"profiles": [L4]})
    assert broker_users.enabled(cloud, cloud.profiles[0])
    demo = Settings.model_validate({"profiles": [local]})
    assert not broker_users.enabled(demo, LOCAL_CPU_PROFILE)
    assert not broker_users.in_use(demo)
    forced = Settings.model_validate({"profiles": [local], "fleet": {"worker_broker_users": True}})
    assert broker_users.enabled(forced, LOCAL_CPU_PROFILE)
    off = Settings.model_validate({"profiles": [L4], "fleet": {"worker_broker_users": False}})
    assert not broker_users.enabled(off, off.profiles[0])


def _start_worker(acl_redis: AclRedis, user: broker_users.BrokerUser, *args: str) -> Any:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER_SCRIPT, user.url(acl_redis.base_url), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def test_a_job_held_by_a_worker_that_died_is_redelivered_to_the_next_worker(
    acl_redis: AclRedis, tmp_path: Path
) -> None:
    """The dead worker's in-flight entry is under its profile's keys, which the control worker
    no longer reads: the next worker of the profile restores it, under its own user."""
    control = acl_redis.control
    queue = "transcribe.a"
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"
    first = _start_worker(
        acl_redis,
        broker_users.create_user(control, acl_redis.base_url, queue, "wrk_1", SIGNING_KEY),
        queue, "wrk_1@i-1", str(first_out), "600", "1",
    )  # fmt: skip
    sender = Celery("control", set_as_current=False)
    sender.conf.update(broker_url=acl_redis.control_url)
    second = None
    try:
        sender.send_task("murmur.transcribe", args=["job-1"], queue=queue)
        _wait(lambda: first_out.exists() and first_out.read_text() == "job-1\n", 60, "job-1")
        assert control.hlen(unacked_keys(queue)["unacked_key"]) == 1
        first.kill()  # SIGKILL mid-job: no ack, no restore at shutdown
        first.wait(timeout=30)
        assert control.llen(queue) == 0
        time.sleep(1.5)  # older than the (test's) visibility timeout
        second = _start_worker(
            acl_redis,
            broker_users.create_user(control, acl_redis.base_url, queue, "wrk_2", SIGNING_KEY),
            queue, "wrk_2@i-2", str(second_out), "0", "1",
        )  # fmt: skip
        _wait(lambda: second_out.exists() and second_out.read_text() == "job-1\n", 60, "redelivery")
        _wait(lambda: not control.hlen(unacked_keys(queue)["unacked_key"]), 10, "the ack")
        assert acl_redis.denials() == []
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
        sender.close()


def test_the_sweep_spares_a_worker_provisioned_while_it_runs(
    make_fleet: MakeFleet, acl_redis: AclRedis
) -> None:
    fleet = _fleet_on(make_fleet, acl_redis)
    raced: list[str] = []

    def provision_meanwhile(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # Another process (murmur smoke, an overlapping run) inserts a worker row and creates
        # its user right after the sweep has read the worker rows.
        if raced or "FROM workers" not in statement:
            return
        raced.append("wrk_new")
        broker_users.create_user(
            acl_redis.control, acl_redis.base_url, "transcribe.x", "wrk_new", SIGNING_KEY
        )

    event.listen(fleet.db.engine, "after_cursor_execute", provision_meanwhile)
    try:
        broker_users.sweep_users(fleet.svc)
    finally:
        event.remove(fleet.db.engine, "after_cursor_execute", provision_meanwhile)
    assert raced
    assert broker_users.user_name("wrk_new", 2) in acl_redis.users()


def test_the_sweep_leaves_other_databases_users_alone(
    make_fleet: MakeFleet, acl_redis: AclRedis
) -> None:
    fleet = _fleet_on(make_fleet, acl_redis)  # its broker is database 2
    other_deployment = f"redis://127.0.0.1:{acl_redis.port}/3"
    broker_users.create_user(
        acl_redis.control, other_deployment, "transcribe.x", "wrk_theirs", SIGNING_KEY
    )
    broker_users.create_user(
        acl_redis.control, acl_redis.base_url, "transcribe.x", "wrk_stray", SIGNING_KEY
    )
    assert broker_users.sweep_users(fleet.svc) == ["wrk_stray"]
    assert acl_redis.users() == sorted(
        ["default", "murmur-control", broker_users.user_name("wrk_theirs", 3)]
    )


# ---- Users lost by a broker restart or a Sentinel failover --------------------------------
# `ACL DELUSER` of every worker user is what a restart does (compose renders its ACL file with
# the control user alone) and what a failover does (the replica never had them).


def _worker_url(fleet: Fleet, worker: Any) -> str:
    """The broker URL the fleet put into the worker's user data."""
    assert fleet.emulator is not None and worker.instance_id is not None
    data = fleet.emulator.user_data(worker.instance_id)["cloud-init"].decode()
    (line,) = [x for x in data.splitlines() if "MURMUR_BROKER_URL=" in x]
    return line.split("=", 1)[1].strip()


def _lose_every_worker_user(acl_redis: AclRedis) -> None:
    lost = [u for u in acl_redis.users() if u.startswith(broker_users.USER_PREFIX)]
    assert lost
    acl_redis.control.acl_deluser(*lost)


def _assert_consumes_only_its_queue(url: str, queue: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        assert client.rpush(queue, "x") >= 1
        assert client.brpop([queue], timeout=1) is not None  # how kombu consumes
        for forbidden in ("transcribe.other", "control"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.llen(forbidden)
    finally:
        client.close()


def test_a_lost_user_comes_back_with_the_same_url_and_rights_at_the_next_reconcile(
    make_fleet: MakeFleet, acl_redis: AclRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fleet = _fleet_on(make_fleet, acl_redis)
    fleet.add_jobs(1)
    fleet.reconcile()
    (worker,) = fleet.workers()
    url = _worker_url(fleet, worker)
    name = broker_users.user_name(worker.id, 2)
    password = broker_password(SIGNING_KEY, 2, worker.id)
    assert f"//{name}:{password}@" in url  # derived, so the control plane can rebuild it
    before = acl_redis.control.acl_getuser(name)
    connected = redis.Redis.from_url(url)
    assert connected.ping()

    _lose_every_worker_user(acl_redis)
    with pytest.raises(redis.RedisError):
        connected.ping()  # Redis closed the connection with the user
    connected.close()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url).ping()

    caplog.clear()
    fleet.reconcile(advance=5)
    assert acl_redis.control.acl_getuser(name) == before  # password hash, commands, keys
    _assert_consumes_only_its_queue(url, "transcribe.l4-par2")
    recreated = [r for r in caplog.records if "re-created" in r.getMessage()]
    assert [(r.levelno, worker.id in r.getMessage()) for r in recreated] == [
        (logging.WARNING, True)
    ]
    fleet.reconcile(advance=5)  # nothing lost any more: nothing re-created, nothing logged
    assert not [r for r in caplog.records if "re-created" in r.getMessage()][1:]
    # murmur_broker_users_recreated_total{profile="l4-par2"}
    assert acl_redis.control.hgetall(BROKER_USERS_RECREATED_KEY) == {b"l4-par2": b"1"}
    for record in caplog.records:
        assert password not in record.getMessage() and password not in caplog.text


def test_a_deleted_workers_user_is_not_re_created(
    make_fleet: MakeFleet, acl_redis: AclRedis
) -> None:
    fleet = _fleet_on(make_fleet, acl_redis)
    fleet.add_jobs(2)
    fleet.reconcile()
    gone, kept = fleet.workers()
    for _ in range(20):  # the fleet's own teardown: instance deleted, row deleted, user deleted
        if _teardown(fleet.svc, gone.id, "test"):
            break
    assert fleet.workers(WorkerState.DELETED.value)[0].id == gone.id
    assert broker_users.user_name(gone.id, 2) not in acl_redis.users()

    _lose_every_worker_user(acl_redis)
    assert broker_users.sweep_users(fleet.svc) == []
    assert acl_redis.users() == sorted(
        ["default", "murmur-control", broker_users.user_name(kept.id, 2)]
    )
    _assert_consumes_only_its_queue(_worker_url(fleet, kept), "transcribe.l4-par2")


class _Interleaved(redis.Redis):
    """The real client; runs `before` once just ahead of the first `ACL SETUSER` it sends."""

    before: list[Callable[[], None]]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[:2] == ("ACL", "SETUSER") and self.before:
            self.before.pop()()
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def test_a_worker_retired_while_its_user_is_re_created_loses_it_again(
    make_fleet: MakeFleet, acl_redis: AclRedis
) -> None:
    fleet = _fleet_on(make_fleet, acl_redis)
    fleet.add_jobs(1)
    fleet.reconcile()
    (worker,) = fleet.workers()
    _lose_every_worker_user(acl_redis)

    def retire() -> None:
        # Another run retires the worker after the sweep read it as live: row first, then
        # user (the order of app.fleet.apply), both before the sweep's ACL SETUSER.
        with fleet.db.session() as s:
            move_worker(
                s, worker.id, [WorkerState.BOOTING, WorkerState.CREATING], WorkerState.DELETING
            )
            move_worker(
                s, worker.id, [WorkerState.DELETING], WorkerState.DELETED, deleted_at=fleet.clock()
            )
        broker_users.retire_user(fleet.svc, worker.id)

    client = _Interleaved.from_url(acl_redis.control_url)
    client.before = [retire]
    fleet.svc.redis = client
    try:
        broker_users.sweep_users(fleet.svc)
    finally:
        client.close()
    assert not client.before  # the retirement did run in between
    assert acl_redis.users() == ["default", "murmur-control"]


def test_a_sweep_that_cannot_re_create_users_says_so_without_the_password(
    make_fleet: MakeFleet, acl_redis: AclRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fleet = _fleet_on(make_fleet, acl_redis)
    fleet.add_jobs(1)
    fleet.reconcile()
    (worker,) = fleet.workers()
    password = broker_password(SIGNING_KEY, 2, worker.id)
    _lose_every_worker_user(acl_redis)
    # A control-plane user that may list and delete users but not create them.
    acl_redis.control.acl_setuser(
        "murmur-limited",
        enabled=True,
        passwords=[f"+{CONTROL_PASSWORD}"],
        categories=["+@all"],
        commands=["-acl|setuser"],
        keys=["*"],
        channels=["*"],
    )
    limited = redis.Redis.from_url(
        acl_redis.control_url.replace("murmur-control", "murmur-limited")
    )
    fleet.svc.redis = limited
    caplog.clear()
    try:
        assert broker_users.sweep_users(fleet.svc) == []  # logged, never raised
        assert "cannot sweep broker users: NoPermissionError" in caplog.text
        # The error redis-py raises for the refused command does not carry it either.
        with pytest.raises(redis.RedisError) as refused:
            broker_users.create_user(
                limited, acl_redis.base_url, "transcribe.l4-par2", worker.id, SIGNING_KEY
            )
    finally:
        limited.close()
    assert password not in caplog.text
    assert password not in str(refused.value) and password not in repr(refused.value)

    fleet.svc.redis = acl_redis.control  # the right is back: the next sweep heals it
    broker_users.sweep_users(fleet.svc)
    _assert_consumes_only_its_queue(_worker_url(fleet, worker), "transcribe.l4-par2")


def test_the_broker_password_is_bound_to_key_database_and_worker() -> None:
    other_key = "another-signing-key-" + "k" * 32
    password = broker_password(SIGNING_KEY, 2, "wrk_a")
    assert len(password) == 64 and int(password, 16) >= 0
    assert password == broker_password(SIGNING_KEY, 2, "wrk_a")
    others = {
        broker_password(other_key, 2, "wrk_a"),
        broker_password(SIGNING_KEY, 3, "wrk_a"),
        broker_password(SIGNING_KEY, 2, "wrk_b"),
        InstanceCredential.derive(SIGNING_KEY, "2", "wrk_a").token,  # another label
    }
    assert password not in others and len(others) == 4
    with pytest.raises(ValueError):
        broker_password("", 2, "wrk_a")


def test_a_real_worker_consumes_again_once_the_sweep_re_created_its_user(
    make_fleet: MakeFleet, acl_redis: AclRedis, tmp_path: Path
) -> None:
    """The Celery worker keeps the URL it booted with: it reconnects by itself after the loss."""
    fleet = _fleet_on(make_fleet, acl_redis)
    fleet.add_jobs(1)
    fleet.reconcile()
    (worker,) = fleet.workers()
    url, queue, out = _worker_url(fleet, worker), "transcribe.l4-par2", tmp_path / "jobs.txt"
    log = tmp_path / "worker.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_SCRIPT, url, queue, f"{worker.id}@i-1", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
    sender = Celery("control", set_as_current=False)
    sender.conf.update(broker_url=acl_redis.control_url)
    try:
        sender.send_task("murmur.transcribe", args=["job-1"], queue=queue)
        _wait(lambda: out.exists() and out.read_text() == "job-1\n", 60, "job-1")
        # The job's file is written before its ack: lose the user only once the ack is in, so
        # the worker is idle. A user lost mid-job loses the ack, and kombu's consumer then
        # stalls for good; that is gpu_worker/liveness.py's case, which this bare worker lacks
        # (tests/worker/test_worker_broker_loss.py runs it with the real worker).
        unacked = unacked_keys(queue)["unacked_key"]
        _wait(lambda: not acl_redis.control.hlen(unacked), 10, "job-1's ack")
        _lose_every_worker_user(acl_redis)  # its connections are closed with it
        sender.send_task("murmur.transcribe", args=["job-2"], queue=queue)
        time.sleep(3)
        assert out.read_text() == "job-1\n"  # no user, no consuming
        assert proc.poll() is None  # it keeps trying
        healed = time.monotonic()
        broker_users.sweep_users(fleet.svc)
        _wait(
            lambda: out.read_text() == "job-1\njob-2\n",
            60,
            "job-2 after the sweep",
            lambda: f"jobs run: {out.read_text()!r}; worker log:\n{log.read_text()[-4000:]}",
        )
        print(f"\nworker consuming again {time.monotonic() - healed:.1f} s after the sweep")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        sender.close()
    assert broker_password(SIGNING_KEY, 2, worker.id).encode() not in log.read_bytes()
