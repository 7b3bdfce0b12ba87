"""The broker as deployed: the repository's redis.conf and ACL file, TLS only, on a real server.

The test makes a throw-away CA and a server certificate for 127.0.0.1 with the `openssl` CLI,
renders docker/redis/users.acl.template with docker/redis/render-users-acl, and starts
redis-server with docker/redis/redis.conf, overriding only paths and the port. Then: the
control plane (redis-py and a Celery round trip) works over rediss:// with CA verification;
a worker user made by the fleet code runs a real Celery worker over TLS with the CA that its
cloud-init carries, and reaches nothing else; a wrong CA is refused, whatever the URL says;
the default user cannot log in. The same commands are in docs/deploy-workers.md.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from celery import Celery

from app.broker import redis_client
from app.celery_config import make_celery
from app.config import Settings, broker_tls_problems
from app.db import Database
from app.fleet import broker_users, cloudinit
from app.fleet.cloudinit import render_user_data, worker_environment
from app.fleet.liveness import record_reconciled
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.scaleway import ScalewayProvider
from app.fleet.reconcile import LOCK_KEY
from app.fleet.service import PLAN_KEY
from app.migrate import upgrade
from app.models import utcnow
from app.observability.store import count_rejection, snapshot_key
from app.services import build_services
from gpu_worker.celery_app import make_celery as make_worker_celery
from gpu_worker.jobs import Outcome
from gpu_worker.runtime import RuntimeProfileError, load_runtime_profile
from tests.conftest import FakeClock
from tests.fleet.conftest import L4, PROJECT_ID, SECRET_KEY, Fleet, fleet_settings
from tests.fleet.emulator import InstanceEmulator
from tests.worker.conftest import CPU_ENV

ROOT = Path(__file__).resolve().parents[2]
REDIS_DIR = ROOT / "docker" / "redis"
DB = 3
QUEUE = "transcribe.l4-par2"

CONTROL_WORKER = """
import sys
from app.config import Settings
from app.celery_config import make_celery

url, ca, out = sys.argv[1:4]
app = make_celery(Settings.model_validate({"redis_url": url, "redis_ca_certs": ca}))

@app.task(name="murmur.control.echo")
def echo(text):
    with open(out, "a") as f:
        f.write(text + "\\n")

app.Worker(hostname="control@test", pool_cls="solo", concurrency=1, queues=["control", "io"],
           loglevel="INFO", without_mingle=True, without_gossip=True).start()
"""

GPU_WORKER = """
import sys
from gpu_worker.celery_app import make_celery
from gpu_worker.jobs import Outcome

url, ca, queue, hostname, out = sys.argv[1:6]

def run_job(job_id):
    with open(out, "a") as f:
        f.write(job_id + "\\n")
    return Outcome.SUCCEEDED

app = make_celery(url, queue, run_job, on_retired=lambda: None, broker_ca_certs=ca)
app.Worker(hostname=hostname, pool_cls="solo", concurrency=1, queues=[queue],
           loglevel="INFO", without_mingle=True, without_gossip=True).start()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(*args: str | Path, cwd: Path) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{args[0]} failed: {done.stderr[-2000:]}"
    return done.stdout


def _make_ca(where: Path, name: str) -> None:
    _run(
        "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=where,
    )  # fmt: skip


@dataclass
class Pki:
    ca: Path
    other_ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate it signed for 127.0.0.1/localhost, and an unrelated CA."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is not installed")
    where = tmp_path_factory.mktemp("pki")
    _make_ca(where, "ca")
    _make_ca(where, "other-ca")
    (where / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _run(
        "openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=where,
    )  # fmt: skip
    _run(
        "openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext",
        cwd=where,
    )  # fmt: skip
    return Pki(where / "ca.pem", where / "other-ca.pem", where / "server.crt", where / "server.key")


@dataclass
class Broker:
    port: int
    password: str
    pki: Pki

    def url(self, user: str | None = None, password: str | None = None, query: str = "") -> str:
        auth = f"{user}:{password}@" if user else ""
        return f"rediss://{auth}127.0.0.1:{self.port}/{DB}{query}"

    @property
    def control_url(self) -> str:
        return self.url("murmur-control", self.password)

    def settings(self, ca: Path | None = None, **fields: Any) -> Settings:
        ca = self.pki.ca if ca is None else ca
        return Settings.model_validate(
            {"redis_url": self.control_url, "redis_ca_certs": str(ca), **fields}
        )

    def tls_client(self, ca: Path | None = None, **kw: Any) -> redis.Redis:
        """A redis-py client built by hand (not through Murmur's code), verifying `ca`."""
        return redis.Redis(
            host="127.0.0.1", port=self.port, db=DB, ssl=True, ssl_cert_reqs="required",
            ssl_ca_certs=str(ca or self.pki.ca), socket_timeout=5, **kw,
        )  # fmt: skip

    def control(self) -> redis.Redis:
        return self.tls_client(username="murmur-control", password=self.password)

    def admin(self) -> redis.Redis:
        return self.tls_client(username="test-admin", password=f"{self.password}-admin")


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed")
    where = tmp_path_factory.mktemp("redis")
    password = secrets.token_hex(24)
    (where / "control-password").write_text(password + "\n")
    acl = _run(REDIS_DIR / "render-users-acl", where / "control-password", cwd=where)
    assert password not in acl
    # The test's own observer (ACL LOG, GETUSER), added to the rendered file only.
    admin = f"user test-admin on >{password}-admin +@all ~* &*\n"
    (where / "users.acl").write_text(acl + admin)
    port = _free_port()
    proc = subprocess.Popen(
        [binary, REDIS_DIR / "redis.conf", "--port", "0", "--tls-port", str(port),
         "--bind", "127.0.0.1", "--tls-cert-file", pki.cert, "--tls-key-file", pki.key,
         "--tls-ca-cert-file", pki.ca, "--aclfile", where / "users.acl", "--dir", where,
         "--appendonly", "no", "--save", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    server = Broker(port, password, pki)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                if ">>> 'tls-" in out:  # the first tls-* directive of redis.conf is unknown
                    pytest.skip(f"redis-server is built without TLS: {out[-300:]}")
                pytest.fail(f"redis-server exited: {out[-2000:]}")
            try:
                server.control().ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not answer over TLS")
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture()
def admin(broker: Broker) -> Iterator[redis.Redis]:
    """The test's observer: not a Murmur user (it exists only in the test's rendered ACL)."""
    client = broker.admin()
    client.flushdb()
    client.acl_log_reset()
    yield client
    for name in _users(client):
        if name.startswith(broker_users.USER_PREFIX):
            client.acl_deluser(name)
    client.close()


def _users(admin: redis.Redis) -> set[str]:
    return {n.decode() if isinstance(n, bytes) else str(n) for n in admin.acl_users()}  # type: ignore[union-attr]


def _wait(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _spawn(script: str, *args: str | Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *(str(a) for a in args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    return err.decode(errors="replace")


def test_the_control_plane_works_over_tls_with_ca_verification(
    broker: Broker, admin: redis.Redis, tmp_path: Path
) -> None:
    settings = broker.settings()
    client = redis_client(settings, socket_timeout=5)
    # The control plane's own keys, as the API and reconcile write them.
    record_reconciled(client, utcnow())
    count_rejection(client, "unauthorized")
    client.set(PLAN_KEY, "{}")
    assert client.get(PLAN_KEY) == b"{}"
    # Exactly its rights: no admin command, no key outside Murmur's and Celery's.
    for call in (lambda: client.config_get("*"), lambda: client.get("other:key")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
    admin.acl_log_reset()

    out = tmp_path / "echo.txt"
    consumer = _spawn(CONTROL_WORKER, broker.control_url, broker.pki.ca, out)
    producer = make_celery(settings)
    try:
        producer.send_task("murmur.control.echo", args=["over tls"], queue="control")
        producer.send_task("murmur.control.echo", args=["on io"], queue="io")  # the I/O worker's
        _wait(
            lambda: out.exists() and sorted(out.read_text().splitlines()) == ["on io", "over tls"],
            60,
            "both tasks to run",
        )
        _wait(lambda: not admin.hlen("unacked"), 10, "the message to be acknowledged")
        # Remote control is off (a broker shared with workers must not carry shutdown/revoke).
        assert not producer.control.inspect(timeout=2).ping()
    finally:
        err = _stop(consumer)
        producer.close()
        client.close()
    assert admin.acl_log() == [], "the control plane's user lacks a right it used"
    assert "NOPERM" not in err and "Traceback" not in err, err[-2000:]


def _worker_user_data(broker: Broker, worker_id: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The fleet's own path: create the worker's user, render its environment and cloud-init."""
    settings = broker.settings(
        worker_broker_url=broker.url(),
        profiles=[L4],
        signing_key="signing-key-" + "b" * 32,
        api={"public_url": "https://murmur.example.com"},
    )
    profile = settings.profile("l4-par2")
    user = broker_users.create_user(
        broker.control(), broker.url(), profile.queue, worker_id, settings.reveal("signing_key")
    )
    url = broker_users.worker_broker_url(settings, user)
    env = worker_environment(settings, profile, worker_id, "inst-1", url)
    config = yaml.safe_load(render_user_data(env, profile))
    files = {f["path"]: f for f in config["write_files"]}
    rendered = dict(
        line.split("=", 1) for line in files[cloudinit.ENV_FILE]["content"].splitlines()
    )
    return rendered, files


def test_a_worker_user_consumes_only_its_queue_over_tls_with_the_ca_from_cloud_init(
    broker: Broker, admin: redis.Redis, tmp_path: Path
) -> None:
    admin.rpush("control", "reconcile")
    admin.set(LOCK_KEY, "token")
    admin.set(snapshot_key("wrk_b"), "{}")
    admin.rpush("transcribe.p100-par1", "someone else's job")
    env, files = _worker_user_data(broker, "wrk_a")

    # The CA reaches the instance through cloud-init and the container through a read-only mount.
    assert env["MURMUR_BROKER_CA_CERTS"] == cloudinit.BROKER_CA_FILE
    shipped = files[cloudinit.BROKER_CA_FILE]
    assert shipped["permissions"] == "0644" and shipped["content"] == broker.pki.ca.read_text()
    mount = f"--volume {cloudinit.BROKER_CA_FILE}:{cloudinit.BROKER_CA_FILE}:ro"
    assert mount in files[cloudinit.UNIT_FILE]["content"]
    assert broker.password not in str(files)
    instance_ca = tmp_path / "broker-ca.pem"
    instance_ca.write_text(shipped["content"])

    url = env["MURMUR_BROKER_URL"]
    assert url.startswith(f"rediss://{broker_users.user_name('wrk_a', DB)}:")
    out = tmp_path / "jobs.txt"
    worker = _spawn(GPU_WORKER, url, instance_ca, QUEUE, "wrk_a@inst-1", out)
    producer = make_celery(broker.settings())
    try:
        producer.send_task("murmur.transcribe", args=["job-1"], queue=QUEUE)
        _wait(lambda: out.exists() and out.read_text() == "job-1\n", 60, "the job to run")
        # The worker keeps its in-flight messages under its queue's own keys
        # (gpu_worker/protocol/broker.py).
        _wait(lambda: not admin.hlen(f"unacked.{QUEUE}"), 10, "the message to be acknowledged")
        assert not producer.control.inspect(timeout=2).ping()  # remote control is off
    finally:
        err = _stop(worker)
        producer.close()
    assert admin.acl_log() == [], "the worker's user lacks a right Celery used"
    assert "NOPERM" not in err and "NoPermissionError" not in err, err[-2000:]

    user = url.split("//", 1)[1].split("@", 1)[0]
    name, password = user.split(":", 1)
    client = broker.tls_client(instance_ca, username=name, password=password)
    assert client.rpush(QUEUE, "x") == 1
    denied: list[Callable[[], object]] = [
        lambda: client.llen("transcribe.p100-par1"),
        lambda: client.lpop("transcribe.p100-par1"),
        lambda: client.lrange("control", 0, -1),
        lambda: client.get(LOCK_KEY),
        lambda: client.get(snapshot_key("wrk_b")),
        lambda: client.get(PLAN_KEY),
        lambda: client.keys("*"),
        lambda: client.acl_list(),
    ]
    for call in denied:
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
    assert admin.llen("transcribe.p100-par1") == 1 and admin.llen("control") == 1
    client.close()


def _no_job(job_id: str) -> Outcome:
    raise AssertionError(f"no job runs here ({job_id})")


def _refused(check: Callable[[], object]) -> str:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - each client raises its own type
        check()
    return repr(caught.value) + repr(caught.value.__cause__) + repr(caught.value.__context__)


def test_a_wrong_ca_is_refused_by_every_client_whatever_the_url_says(broker: Broker) -> None:
    wrong = broker.settings(ca=broker.pki.other_ca)
    assert "certificate verify failed" in _refused(lambda: redis_client(wrong).ping())
    # A URL asking for no verification does not get it (kombu and redis-py obey the query).
    lax = broker.control_url + "?ssl_cert_reqs=none&ssl_check_hostname=false"
    lax_settings = broker.settings(ca=broker.pki.other_ca, redis_url=lax)
    assert "certificate verify failed" in _refused(lambda: redis_client(lax_settings).ping())

    def connects(app: Celery) -> None:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)

    # Celery on the control plane and on the worker; without a CA, the system's CAs (which
    # do not know this one) — kombu alone would connect without any verification.
    for app in (
        make_celery(wrong),
        make_celery(lax_settings),
        make_worker_celery(broker.url(), QUEUE, _no_job, broker_ca_certs=str(broker.pki.other_ca)),
        make_worker_celery(broker.url(), QUEUE, _no_job),
    ):
        assert "certificate verify failed" in _refused(lambda: connects(app))  # noqa: B023
    # No fallback to plain text: the broker has no plain port and refuses plain on TLS.
    plain = redis.Redis(port=broker.port, socket_timeout=3)
    _refused(lambda: plain.ping())


def test_the_default_user_cannot_authenticate(broker: Broker, admin: redis.Redis) -> None:
    anonymous = broker.tls_client()
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    for password in ("", "default", broker.password):
        with pytest.raises(redis.AuthenticationError):
            broker.tls_client(username="default", password=password).ping()
    default = admin.acl_getuser("default")
    assert default is not None and "off" in default["flags"]  # type: ignore[operator]


def test_validate_config_wants_tls_with_verification_for_workers(tmp_path: Path) -> None:
    def problems(**fields: Any) -> list[str]:
        return broker_tls_problems(Settings.model_validate(fields))

    good = "rediss://broker.example.com:6380/0"
    assert problems(worker_broker_url=good) == []
    assert problems(worker_broker_url="redis://broker.example.com:6379/0") == [
        "worker_broker_url: workers reach the broker over the internet: use rediss:// (TLS)"
    ]
    assert problems(redis_url=good + "?ssl_cert_reqs=none", worker_broker_url=good) == [
        "redis_url: ssl_cert_reqs=none turns certificate verification off; use required"
    ]
    assert problems(worker_broker_url=good + "?ssl_cert_reqs=CERT_OPTIONAL") == [
        "worker_broker_url: ssl_cert_reqs=CERT_OPTIONAL turns certificate verification off; "
        "use required"
    ]
    assert problems(worker_broker_url=good + "?ssl_check_hostname=false") == [
        "worker_broker_url: ssl_check_hostname=false skips the host name check"
    ]
    missing = tmp_path / "nope.pem"
    assert problems(worker_broker_url=good, redis_ca_certs=str(missing)) == [
        f"redis_ca_certs: cannot read {missing}: No such file or directory"
    ]
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    assert problems(worker_broker_url=good, redis_ca_certs=str(tmp_path / "key.pem")) == [
        f"redis_ca_certs: {tmp_path / 'key.pem'} holds no PEM certificate"
    ]


def test_the_worker_refuses_a_ca_file_it_cannot_read(tmp_path: Path) -> None:
    env = {**CPU_ENV, "MURMUR_BROKER_URL": "rediss://127.0.0.1:6380/0"}
    missing = tmp_path / "broker-ca.pem"
    with pytest.raises(RuntimeProfileError) as caught:
        load_runtime_profile(
            {**env, "MURMUR_BROKER_CA_CERTS": str(missing)},
            model_names=["tiny.en"],
            require_identity=True,
        )
    assert (
        str(caught.value) == f"MURMUR_BROKER_CA_CERTS: {str(missing)!r} is not a readable CA file"
    )
    missing.write_text("-----BEGIN CERTIFICATE-----\n")
    identity = load_runtime_profile(
        {**env, "MURMUR_BROKER_CA_CERTS": str(missing)},
        model_names=["tiny.en"],
        require_identity=True,
    ).identity
    assert identity is not None and identity.broker_ca_certs == str(missing)


def test_no_user_data_without_the_ca_it_should_carry(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "worker_broker_url": "rediss://broker.example.com:6380/0",
            "redis_ca_certs": str(tmp_path / "absent.pem"),
            "profiles": [L4],
            "signing_key": "signing-key-" + "b" * 32,
        }
    )
    profile = settings.profile("l4-par2")
    env = worker_environment(settings, profile, "wrk_1", "inst-1")
    with pytest.raises(ValueError, match="redis_ca_certs: cannot read .*absent.pem"):
        render_user_data(env, profile)
    # A plain redis:// broker (the local demo) gets no CA.
    plain = settings.model_copy(update={"worker_broker_url": "redis://127.0.0.1:6379/0"})
    assert "MURMUR_BROKER_CA_CERTS" not in worker_environment(plain, profile, "wrk_1", "inst-1")


def test_the_redis_cli_checks_in_the_docs(broker: Broker) -> None:
    """docs/deploy-workers.md's checks: the password travels in REDISCLI_AUTH, not argv."""
    if shutil.which("redis-cli") is None:
        pytest.fail("redis-cli is not installed")

    def cli(ca: Path, user: str | None = None) -> str:
        args = [
            "redis-cli",
            "--tls",
            "--cacert",
            str(ca),
            "-h",
            "127.0.0.1",
            "-p",
            str(broker.port),
        ]
        env = dict(os.environ)
        if user is not None:
            args += ["--user", user]
            env["REDISCLI_AUTH"] = broker.password
        done = subprocess.run(
            [*args, "PING"], capture_output=True, text=True, timeout=30, env=env, check=False
        )
        return (done.stdout + done.stderr).strip()

    assert cli(broker.pki.ca, "murmur-control") == "PONG"
    assert "NOAUTH" in cli(broker.pki.ca)
    assert "certificate verify failed" in cli(broker.pki.other_ca, "murmur-control")


def test_the_fleet_runs_a_worker_lifecycle_over_tls_within_its_rights(
    broker: Broker, admin: redis.Redis, tmp_path: Path
) -> None:
    """Reconcile, dispatch and teardown through the control plane's user on the TLS broker."""
    emulator = InstanceEmulator(secret_key=SECRET_KEY, project_id=PROJECT_ID)
    emulator.start()
    upgrade(f"sqlite:///{tmp_path}/fleet.db")
    db = Database(f"sqlite:///{tmp_path}/fleet.db")
    groups = {
        "workers-par2": {"id": emulator.add_security_group("fr-par-2", "m"), "zone": "fr-par-2"}
    }
    settings = fleet_settings(emulator.url, groups, [L4]).model_copy(
        update={
            "redis_url": broker.control_url,
            "redis_ca_certs": str(broker.pki.ca),
            "worker_broker_url": broker.url(),
            "storage_path": str(tmp_path / "audio"),
        }
    )
    svc = build_services(
        settings,
        make_celery(settings),
        db=db,
        providers=ProviderRegistry(
            settings,
            {"scaleway": ScalewayProvider(settings, poll_interval=0.01, teardown_wait=1.0)},
        ),
        clock=FakeClock(),
    )
    fleet = Fleet(svc, svc.clock, emulator)  # type: ignore[arg-type]
    try:
        fleet.add_jobs(2)
        fleet.reconcile()
        workers = fleet.workers()
        assert len(workers) == 2
        names = {broker_users.user_name(w.id, DB) for w in workers}
        assert names <= _users(admin)
        for w in workers:
            assert w.instance_id is not None
            data = yaml.safe_load(emulator.user_data(w.instance_id)["cloud-init"].decode())
            files = {f["path"]: f["content"] for f in data["write_files"]}
            assert files[cloudinit.BROKER_CA_FILE] == broker.pki.ca.read_text()
        fleet.ready_all()
        fleet.reconcile(advance=5)  # dispatch: Celery messages over TLS
        assert admin.llen(QUEUE) == 2
        assert fleet.claim_all() == 2 and fleet.finish_all() == 2
        fleet.reconcile(advance=61)  # idle: deleted
        for _ in range(5):
            fleet.reconcile()
        assert emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}
        assert not names & _users(admin)
        assert admin.acl_log() == [], "the control plane's user lacks a right the fleet used"
    finally:
        svc.celery.close()
        svc.redis.close()
        db.dispose()
        emulator.stop()
