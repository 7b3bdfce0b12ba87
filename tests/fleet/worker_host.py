"""Real workers on emulated servers: an `InstanceHost` for tests/fleet/emulator.py.

When the emulator accepts a `poweron`, the server's cloud-init user data is read the way the
instance would read it — the root-only env file it writes (app/fleet/cloudinit.py) — and a
real `python -m gpu_worker run` is started with exactly that environment through the local
provider (app/fleet/providers/local.py), which already knows how to start, track and stop one.
There is no Docker here: the env file is what reaches the worker either way. When the server
is asked to stop, its worker gets SIGTERM (SIGKILL after the grace), as systemd would send.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import yaml

from app.config import LOCAL_CPU_PROFILE
from app.fleet.cloudinit import ENV_FILE
from app.fleet.providers.local import LocalProvider
from app.fleet.providers.scaleway import USER_DATA_KEY


def env_file_of(user_data: bytes) -> dict[str, str]:
    """The variables of the env file a cloud-init document writes (KEY=value lines)."""
    document = yaml.safe_load(user_data.decode())
    (entry,) = [f for f in document["write_files"] if f["path"] == ENV_FILE]
    env: dict[str, str] = {}
    for line in str(entry["content"]).splitlines():
        if line.strip():
            key, _, value = line.partition("=")
            env[key] = value
    return env


class LocalWorkerHost:
    """Runs each powered-on emulated server's worker as a local process."""

    def __init__(self, state_dir: Path, *, term_grace: float = 10.0) -> None:
        self.processes = LocalProvider(state_dir=state_dir, term_grace=term_grace)
        self._running: dict[str, str] = {}  # server id -> local instance id
        self._stopping: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.started: list[str] = []  # server ids, in order
        self.environments: dict[str, dict[str, str]] = {}  # what each server's worker got

    def power_on(self, server_id: str, user_data: dict[str, bytes]) -> None:
        env = env_file_of(user_data[USER_DATA_KEY])
        profile = LOCAL_CPU_PROFILE.model_copy(update={"name": env["MURMUR_PROFILE"]})
        instance = self.processes.create(profile, env["MURMUR_WORKER_ID"], lambda _i, _r: env)
        with self._lock:
            self._running[server_id] = instance.instance_id
            self.started.append(server_id)
            self.environments[server_id] = env

    def power_off(self, server_id: str) -> None:
        with self._lock:
            local_id = self._running.pop(server_id, None)
        if local_id is None:
            return
        # The API answers at once; the machine shuts down meanwhile.
        thread = threading.Thread(target=self._stop, args=(local_id,), daemon=True)
        thread.start()
        self._stopping.append(thread)

    def _stop(self, local_id: str, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.processes.delete(local_id, {}).confirmed:
                return
            time.sleep(0.2)

    def settle(self, within: float = 60.0) -> None:
        """Wait for the workers of stopped servers to be gone (or `within` each)."""
        for thread in list(self._stopping):
            thread.join(within)

    def close(self, within: float = 60.0) -> None:
        """Stop every worker still running (a test that failed half-way) and wait for them."""
        with self._lock:
            left = list(self._running)
        for server_id in left:
            self.power_off(server_id)
        self.settle(within)

    def processes_left(self) -> list[str]:
        return [i.instance_id for i in self.processes.list_by_tag(frozenset())]
