"""`murmur smoke` through the `scaleway` provider against the emulator, with a real worker.

The issue's CI form of the smoke test: the real SDK provisions on tests/fleet/emulator.py,
whose "instance" runs a real CPU worker from the rendered cloud-init env file
(tests/fleet/worker_host.py); the worker reports ready to a real API, takes the job from the
broker under its own Redis user, transcribes the bundled fixture, and the smoke run deletes
everything and reads the provider back. The services are built by the same
`process_services` the command uses; the command's `validate-config` gate is left out
because it rightly refuses a CPU server type and a loopback broker for Scaleway, which is
what this test must use to run a worker on this machine.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import select
from werkzeug.serving import make_server

from app import create_app
from app.db import Database
from app.fleet.broker_users import broker_db, user_name
from app.fleet.smoke import PHASES, process_services, render, run_smoke
from app.models import Worker, WorkerState
from tests.conftest import FIXTURES, REDIS_URL, free_port, make_settings
from tests.fleet.conftest import ACCESS_KEY, PROJECT_ID, SECRET_KEY, WORKER_IMAGE
from tests.fleet.emulator import CATALOG, InstanceEmulator
from tests.fleet.worker_host import LocalWorkerHost, env_file_of

pytestmark = pytest.mark.slow

AUDIO = FIXTURES / "speech-short.wav"
NOTHING = {"servers": 0, "ips": 0, "volumes": 0}


@pytest.fixture()
def host(tmp_path: Path) -> Iterator[LocalWorkerHost]:
    workers = LocalWorkerHost(tmp_path / "instances")
    yield workers
    workers.close()


@pytest.fixture()
def emulator(host: LocalWorkerHost) -> Iterator[InstanceEmulator]:
    emu = InstanceEmulator(secret_key=SECRET_KEY, project_id=PROJECT_ID, host=host)
    emu.start()
    yield emu
    emu.stop()


def _config(emulator: InstanceEmulator, path: Path) -> Path:
    group = emulator.add_security_group("fr-par-1", "murmur-workers")
    path.write_text(
        f"""
[api]
allow_private_urls = true

[scaleway]
api_url = "{emulator.url}"
project_id = "{PROJECT_ID}"

[security_groups.workers-par1]
id = "{group}"
zone = "fr-par-1"

# A CPU server type the emulator sells, so that the worker runs on this machine's CPU and
# its runtime matches the profile (the catalog has no such Scaleway type: not for production).
[[profiles]]
name = "cpu-par1"
provider = "scaleway"
zone = "fr-par-1"
server_type = "DEV1-S"
image = "ubuntu_jammy"
worker_image = "{WORKER_IMAGE}"
security_group = "workers-par1"
model = "tiny.en"
compute_type = "int8"
vad = "silero"
alignment_device = "none"
batch_size = 1
max_workers = 1
hourly_cost_eur = {CATALOG["fr-par-1"]["DEV1-S"]}
"""
    )
    return path


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_smoke_on_the_emulator_transcribes_with_a_real_worker_and_leaves_nothing(
    database_url: str,
    clean_redis: redis.Redis,
    tmp_path: Path,
    emulator: InstanceEmulator,
    host: LocalWorkerHost,
) -> None:
    port = free_port()
    settings = make_settings(
        database_url,
        REDIS_URL,
        tmp_path,
        MURMUR_CONFIG=str(_config(emulator, tmp_path / "murmur.toml")),
        MURMUR_PORT=str(port),
        MURMUR_PUBLIC_URL=f"http://127.0.0.1:{port}",
        SCW_ACCESS_KEY=ACCESS_KEY,
        SCW_SECRET_KEY=SECRET_KEY,
    )
    api_db = Database(settings.database_url)
    server = make_server("127.0.0.1", port, create_app(settings, db=api_db), threaded=True)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    svc = process_services(settings)
    lines: list[str] = []
    try:
        (result,) = run_smoke(
            svc, list(settings.profiles), AUDIO, timeout=240, max_eur=0.1, poll=0.2,
            teardown_timeout=60, echo=lines.append,
        )  # fmt: skip
        report = render([result])
        with svc.db.reader() as s:
            (worker,) = s.scalars(select(Worker)).all()
    finally:
        svc.celery.close()
        svc.db.dispose()
        server.shutdown()
        api_db.dispose()

    # Provisioned through the real SDK, its worker ran from the user data it was given.
    assert result.ok, report + "\n" + "\n".join(lines)
    assert host.started == [worker.instance_id]
    env = host.environments[worker.instance_id]
    assert env["MURMUR_WORKER_ID"] == worker.id and env["MURMUR_INSTANCE_ID"] == worker.instance_id
    # It took the job from the broker under its own Redis user (removed at teardown below).
    broker_user = user_name(worker.id, broker_db(env["MURMUR_BROKER_URL"]))
    assert f"//{broker_user}:" in env["MURMUR_BROKER_URL"]
    assert worker.runtime is not None and worker.runtime["device"] == "cpu"
    assert worker.runtime["compute_type"] == "int8" and worker.runtime["profile"] == "cpu-par1"
    # tiny.en hears "quick round fox" in this recording; these words it gets right.
    assert all(w in (result.transcript or "").lower() for w in ("quick", "fox", "lazy", "noon"))
    # Lifecycle timings in order, and a cost.
    timings = [result.timings[name] for name in PHASES]
    assert all(t is not None for t in timings), report
    assert timings == sorted(timings)  # type: ignore[type-var]
    assert 0 < result.cost_eur < 0.01 and f"cost {result.cost_eur:.4f} EUR" in report
    # Nothing left: the provider read back, the emulator's inventory, the worker process,
    # the worker's own broker user.
    assert worker.state == WorkerState.DELETED.value and worker.delete_reason == "smoke"
    assert result.left == []
    assert emulator.inventory() == NOTHING
    ops = [op for op, _, sid in emulator.events if sid == worker.instance_id]
    assert ops[:3] == ["create", "user_data", "poweron"] and "terminate" in ops
    host.settle()
    assert host.processes_left() == []
    assert clean_redis.acl_getuser(broker_user) is None


def test_the_env_file_is_read_from_cloud_init_as_rendered() -> None:
    from app.config import Profile
    from app.fleet.cloudinit import render_user_data

    profile = Profile(
        name="cpu-par1", provider="scaleway", zone="fr-par-1", server_type="DEV1-S",
        image="ubuntu_jammy", worker_image=WORKER_IMAGE, security_group="g", model="tiny.en",
        compute_type="int8", vad="silero", alignment_device="none", batch_size=1,
        max_workers=1, hourly_cost_eur=0.01,
    )  # fmt: skip
    env = {"MURMUR_WORKER_ID": "wrk_1", "MURMUR_CONTROL_URL": "http://127.0.0.1:1/x=y"}
    parsed = env_file_of(render_user_data(env, profile).encode())
    assert parsed["MURMUR_WORKER_ID"] == "wrk_1"
    assert parsed["MURMUR_CONTROL_URL"] == "http://127.0.0.1:1/x=y"
