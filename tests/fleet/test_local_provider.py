"""The `local` provider: worker subprocesses, their state files, teardown, simulated stock."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from app.config import LOCAL_CPU_PROFILE, Profile, Settings
from app.credentials import InstanceCredential
from app.fleet.cloudinit import worker_environment
from app.fleet.providers.base import OutOfStock, ProviderUnavailable
from app.fleet.providers.local import LocalProvider, out_of_stock_from_env
from app.models import WorkerState
from tests.fleet.conftest import SIGNING_KEY, MakeFleet

FAKE_WORKER = """
import json, os, signal, sys, time
mode = os.environ.get("FAKE_WORKER_MODE", "normal")
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = os.path.join(os.environ["FAKE_WORKER_DIR"], os.environ["MURMUR_WORKER_ID"] + ".json")
with open(out + ".tmp", "w") as f:
    json.dump(dict(os.environ), f)
os.replace(out + ".tmp", out)
if mode == "exit":
    print("worker: cannot load model, HF_TOKEN=hf_leakme123 refused", flush=True)
    sys.exit(3)
while True:
    time.sleep(0.05)
"""


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


@pytest.fixture()
def fake_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("FAKE_WORKER_DIR", str(out))
    return [sys.executable, str(script)]


def settings() -> Settings:
    return Settings(profiles=(LOCAL_CPU_PROFILE,), signing_key=SIGNING_KEY)  # type: ignore[arg-type]


def binder(s: Settings, profile: Profile, worker_id: str) -> Any:
    def bind(instance_id: str, resources: Mapping[str, Any]) -> Mapping[str, str]:
        return worker_environment(s, profile, worker_id, instance_id)

    return bind


def env_of(tmp_path: Path, worker_id: str) -> dict[str, str]:
    path = tmp_path / "out" / f"{worker_id}.json"
    wait_for(path.exists, "the worker to start")
    env: dict[str, str] = json.loads(path.read_text())
    return env


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_worker_starts_with_its_environment_and_no_control_plane_secrets(
    tmp_path: Path, fake_worker: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MURMUR_SIGNING_KEY", SIGNING_KEY)
    monkeypatch.setenv("MURMUR_API_TOKEN", "api-token-" + "x" * 32)
    monkeypatch.setenv("MURMUR_DATABASE_URL", "postgresql://secret@db/murmur")
    monkeypatch.setenv("SCW_SECRET_KEY", "8f6e2d3c-1b2a-4c5d-9e8f-7a6b5c4d3e2f")
    monkeypatch.setenv("MURMUR_CPU_THREADS", "2")
    s = settings()
    provider = LocalProvider(s, state_dir=tmp_path / "state", command=fake_worker)
    instance = provider.create(LOCAL_CPU_PROFILE, "wrk_a", binder(s, LOCAL_CPU_PROFILE, "wrk_a"))
    try:
        assert instance.state == "running" and instance.instance_id.startswith("local-")
        env = env_of(tmp_path, "wrk_a")
        token = InstanceCredential.derive(SIGNING_KEY, "wrk_a", instance.instance_id).token
        assert env["MURMUR_WORKER_TOKEN"] == token
        assert env["MURMUR_INSTANCE_ID"] == instance.instance_id
        assert env["MURMUR_PROFILE"] == "local-cpu" and env["MURMUR_DEVICE"] == "cpu"
        assert env["MURMUR_CPU_THREADS"] == "2" and "PATH" in env
        leaked = {"MURMUR_SIGNING_KEY", "MURMUR_API_TOKEN", "MURMUR_DATABASE_URL", "SCW_SECRET_KEY"}
        assert leaked.isdisjoint(env)
    finally:
        provider.delete(instance.instance_id, instance.resources)


def test_a_profile_worker_python_runs_its_worker(
    tmp_path: Path, fake_worker: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another interpreter (a venv with torch, say): here a link to this one, by another name.
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    monkeypatch.setenv("MURMUR_CPU_THREADS", "2")
    profile = LOCAL_CPU_PROFILE.model_copy(
        update={"name": "local-diarize", "worker_python": str(python), "cpu_threads": 1}
    )
    s = Settings(profiles=(LOCAL_CPU_PROFILE, profile), signing_key=SIGNING_KEY)  # type: ignore[arg-type]
    provider = LocalProvider(s, state_dir=tmp_path / "state", command=fake_worker)
    created = []
    try:
        diarizing = provider.create(profile, "wrk_p", binder(s, profile, "wrk_p"))
        created.append(diarizing)
        plain = provider.create(LOCAL_CPU_PROFILE, "wrk_q", binder(s, LOCAL_CPU_PROFILE, "wrk_q"))
        created.append(plain)
        env = env_of(tmp_path, "wrk_p")
        # The profile's thread count wins over the one the control plane's environment sets.
        assert env["MURMUR_PROFILE"] == "local-diarize" and env["MURMUR_CPU_THREADS"] == "1"
        assert env_of(tmp_path, "wrk_q")["MURMUR_CPU_THREADS"] == "2"
        pids = {
            i.worker_id: json.loads((tmp_path / "state" / f"{i.instance_id}.json").read_text())[
                "pid"
            ]
            for i in (diarizing, plain)
        }

        # The recorded pid is the shell that records the worker's exit status; the worker is
        # its child.
        def worker_cmdline(pid: int) -> list[str]:
            (child,) = psutil.Process(pid).children()
            return list(child.cmdline())

        assert worker_cmdline(pids["wrk_p"]) == [str(python), *fake_worker[1:]]
        assert worker_cmdline(pids["wrk_q"]) == fake_worker
    finally:  # whatever was started, even when the second create fails
        for instance in created:
            provider.delete(instance.instance_id, instance.resources)


def test_a_worker_python_that_cannot_start_is_a_provider_error(tmp_path: Path) -> None:
    profile = LOCAL_CPU_PROFILE.model_copy(update={"worker_python": str(tmp_path / "nope")})
    provider = LocalProvider(settings(), state_dir=tmp_path / "state")
    with pytest.raises(ProviderUnavailable, match=r"cannot start the worker \(/.*/nope\)"):
        provider.create(profile, "wrk_n", lambda i, r: {})


def test_a_restarted_control_worker_finds_and_deletes_it(
    tmp_path: Path, fake_worker: list[str]
) -> None:
    s = settings()
    first = LocalProvider(s, state_dir=tmp_path / "state", command=fake_worker)
    instance = first.create(LOCAL_CPU_PROFILE, "wrk_b", binder(s, LOCAL_CPU_PROFILE, "wrk_b"))
    assert env_of(tmp_path, "wrk_b")["MURMUR_WORKER_ID"] == "wrk_b"
    pid = json.loads((tmp_path / "state" / f"{instance.instance_id}.json").read_text())["pid"]

    again = LocalProvider(s, state_dir=tmp_path / "state", command=fake_worker)
    (listed,) = again.list_by_tag(frozenset())
    assert (listed.instance_id, listed.worker_id, listed.profile, listed.state) == (
        instance.instance_id,
        "wrk_b",
        "local-cpu",
        "running",
    )
    result = again.delete(instance.instance_id, listed.resources)
    assert result.confirmed and gone(pid)
    assert again.list_by_tag(frozenset()) == []
    assert again.get(instance.instance_id, {}) is None


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace(
    tmp_path: Path, fake_worker: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_WORKER_MODE", "stubborn")
    s = settings()
    provider = LocalProvider(
        s, state_dir=tmp_path / "state", command=fake_worker, term_grace=0.3, teardown_wait=5.0
    )
    instance = provider.create(LOCAL_CPU_PROFILE, "wrk_c", binder(s, LOCAL_CPU_PROFILE, "wrk_c"))
    env_of(tmp_path, "wrk_c")  # its SIGTERM handler is in place
    pid = json.loads((tmp_path / "state" / f"{instance.instance_id}.json").read_text())["pid"]
    assert provider.delete(instance.instance_id, instance.resources).confirmed
    assert gone(pid)


def test_a_worker_that_exited_is_reported_stopped(
    tmp_path: Path, fake_worker: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_WORKER_MODE", "exit")
    s = settings()
    provider = LocalProvider(s, state_dir=tmp_path / "state", command=fake_worker)
    instance = provider.create(LOCAL_CPU_PROFILE, "wrk_d", binder(s, LOCAL_CPU_PROFILE, "wrk_d"))

    def stopped() -> bool:
        found = provider.get(instance.instance_id, {})
        return found is not None and found.state == "stopped"

    wait_for(stopped, "the exited worker to show as stopped")
    # It says why (issue 32 §2): its exit code and its last log line, redacted.
    found = provider.get(instance.instance_id, {})
    assert found is not None
    assert found.detail.startswith("the worker process exited with code 3: worker: cannot load")
    assert "hf_leakme123" not in found.detail
    (listed,) = provider.list_by_tag(frozenset())
    assert listed.detail == found.detail
    assert provider.delete(instance.instance_id, instance.resources).confirmed
    assert list((tmp_path / "state").glob(f"{instance.instance_id}*")) == []
    assert provider.list_by_tag(frozenset()) == []


def test_simulated_out_of_stock(tmp_path: Path) -> None:
    assert out_of_stock_from_env({"MURMUR_LOCAL_OUT_OF_STOCK": " a, b ,"}) == {"a", "b"}
    provider = LocalProvider(
        settings(), state_dir=tmp_path / "state", out_of_stock=frozenset({"local-cpu"})
    )
    with pytest.raises(OutOfStock, match="local-cpu is out of stock"):
        provider.create(LOCAL_CPU_PROFILE, "wrk_e", lambda i, r: {})
    assert provider.availability(LOCAL_CPU_PROFILE) == "shortage"
    assert provider.list_by_tag(frozenset()) == []


def test_local_fleet_falls_back_and_cleans_up(
    make_fleet: MakeFleet,
    tmp_path: Path,
    fake_worker: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    preferred = {**LOCAL_CPU_PROFILE.model_dump(), "name": "local-preferred"}
    provider = LocalProvider(
        state_dir=tmp_path / "state",
        command=fake_worker,
        out_of_stock=frozenset({"local-preferred"}),
    )
    fleet = make_fleet([preferred, LOCAL_CPU_PROFILE.model_dump()], providers={"local": provider})
    fleet.add_jobs(1)
    with caplog.at_level("INFO", logger="murmur.fleet"):
        fleet.reconcile()
    assert "local-preferred out_of_stock" in caplog.text
    # Its `shortage` hint stops it before the provider is asked to create anything.
    assert "local: the provider reports a shortage of local-cpu in local" in caplog.text
    assert "fallback to the next profile" in caplog.text
    assert "provision local-cpu" in caplog.text
    (worker,) = fleet.workers(WorkerState.BOOTING.value)
    assert worker.profile == "local-cpu" and worker.booted_at is not None
    env = env_of(tmp_path, worker.id)
    assert env["MURMUR_PROFILE"] == "local-cpu"
    pid = json.loads((tmp_path / "state" / f"{worker.instance_id}.json").read_text())["pid"]

    fleet.report_ready(worker.id)
    fleet.reconcile(advance=1)
    fleet.claim_all()
    fleet.finish_all()
    fleet.reconcile(advance=61)
    (done,) = [w for w in fleet.workers() if w.id == worker.id]
    assert done.state == WorkerState.DELETED.value and done.delete_reason == "idle"
    assert gone(pid) and provider.list_by_tag(frozenset()) == []


SPAWNER = """
import json, sys, time
from app.config import LOCAL_CPU_PROFILE
from app.fleet.providers.local import LocalProvider
provider = LocalProvider(None, state_dir=sys.argv[1], command=json.loads(sys.argv[2]))
instance = provider.create(LOCAL_CPU_PROFILE, "wrk_z", lambda i, r: {"MURMUR_WORKER_ID": "wrk_z"})
print(instance.instance_id, flush=True)
time.sleep(120)  # alive and never reaping, like another pool process of the control worker
"""


def test_a_worker_started_by_another_process_is_deleted(
    tmp_path: Path, fake_worker: list[str]
) -> None:
    import subprocess

    root = Path(__file__).resolve().parents[2]
    spawner = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, str(tmp_path / "state"), json.dumps(fake_worker)],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert spawner.stdout is not None
        instance_id = spawner.stdout.readline().strip()
        env_of(tmp_path, "wrk_z")
        provider = LocalProvider(state_dir=tmp_path / "state", command=fake_worker)
        pid = json.loads((tmp_path / "state" / f"{instance_id}.json").read_text())["pid"]
        assert provider.delete(instance_id, {}).confirmed  # its zombie is not ours to reap
        assert gone(pid) and provider.list_by_tag(frozenset()) == []
    finally:
        spawner.kill()
        spawner.wait()


def test_stopping_the_stack_deletes_every_local_worker(
    tmp_path: Path, fake_worker: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy import select

    from app.db import Database
    from app.fleet.teardown import delete_all_local_workers
    from app.migrate import upgrade
    from app.models import Worker

    url = f"sqlite:///{tmp_path}/murmur.db"
    upgrade(url)
    db = Database(url)
    monkeypatch.setenv("MURMUR_DATABASE_URL", url)
    monkeypatch.setenv("MURMUR_LOCAL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("MURMUR_CONFIG", raising=False)
    provider = LocalProvider(command=fake_worker)
    instance = provider.create(
        LOCAL_CPU_PROFILE, "wrk_s", lambda i, r: {"MURMUR_WORKER_ID": "wrk_s"}
    )
    env_of(tmp_path, "wrk_s")
    with db.session() as s:
        s.add(
            Worker(
                id="wrk_s",
                profile="local-cpu",
                provider="local",
                instance_id=instance.instance_id,
                state=WorkerState.READY.value,
            )
        )
    assert delete_all_local_workers() == 1
    assert provider.list_by_tag(frozenset()) == []
    with db.session() as s:
        row = s.scalars(select(Worker)).one()
        assert row.state == WorkerState.DELETED.value and row.delete_reason == "stack stopped"
    db.dispose()
