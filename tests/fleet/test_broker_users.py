"""Each worker's own broker user, against a private redis-server with ACLs (not a mock).

The server is started by the test on a free loopback port; the default user is switched off,
so the control plane works only through its own user, which may manage ACLs. Real Celery
workers (gpu_worker's app, events on, acks_late, no remote control) run under workers' users
in subprocesses.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import event

from app.config import LOCAL_CPU_PROFILE, Settings
from app.fleet import broker_users
from app.fleet.reconcile import LOCK_KEY
from app.observability.store import snapshot_key
from gpu_worker.broker import unacked_keys
from tests.fleet.conftest import L4, Fleet, MakeFleet

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


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


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

    user = broker_users.create_user(control, acl_redis.base_url, "transcribe.a", "wrk_a")
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
    user = broker_users.create_user(acl_redis.control, acl_redis.base_url, "transcribe.a", "w1")
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
    broker_users.create_user(acl_redis.control, acl_redis.base_url, "transcribe.x", "wrk_lost")
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
        broker_users.create_user(control, acl_redis.base_url, queue, "wrk_1"),
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
            broker_users.create_user(control, acl_redis.base_url, queue, "wrk_2"),
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
        broker_users.create_user(acl_redis.control, acl_redis.base_url, "transcribe.x", "wrk_new")

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
    broker_users.create_user(acl_redis.control, other_deployment, "transcribe.x", "wrk_theirs")
    broker_users.create_user(acl_redis.control, acl_redis.base_url, "transcribe.x", "wrk_stray")
    assert broker_users.sweep_users(fleet.svc) == ["wrk_stray"]
    assert acl_redis.users() == sorted(
        ["default", "murmur-control", broker_users.user_name("wrk_theirs", 3)]
    )
