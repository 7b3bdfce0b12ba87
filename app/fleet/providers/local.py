"""The `local` provider: an "instance" is a transcription worker subprocess on this machine.

`python -m gpu_worker run` starts with the same environment cloud-init would write, in its own
process group; `python` is the profile's `worker_python` when it names one (a venv with torch
and pyannote, say), else the control worker's own interpreter. Each instance is recorded in a
state directory (`var/local-instances/<id>.json`: pid and process start time), so a restarted
control worker still lists and deletes it. Delete sends SIGTERM to the group, SIGKILL after a
grace period, and confirms nothing is left.
The worker runs under a small `/bin/sh` that writes its exit status to `<id>.exit` when it ends,
so an instance that stopped says why (`Instance.detail`: the exit code or signal and the last
line of its log, redacted), even to a control worker restarted since; a worker that stopped
before it was ready is then a failed boot with that reason (app/fleet/boot_policy.py).

Stock can be simulated per profile (`MURMUR_LOCAL_OUT_OF_STOCK=a,b`) to watch the fallback: such
a profile's stock hint is `shortage` (the fleet then never asks to create), and a create asked
anyway answers out of stock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from app.config import Profile, Settings
from app.fleet.providers.base import (
    Bind,
    Instance,
    InstanceState,
    OutOfStock,
    ProviderUnavailable,
    StockHint,
    Teardown,
)
from gpu_worker.protocol.environment import CPU_THREADS_VAR, DRAIN_TIMEOUT_VAR
from gpu_worker.protocol.redaction import clean_log_line

log = logging.getLogger("murmur.fleet.local")

OUT_OF_STOCK_ENV = "MURMUR_LOCAL_OUT_OF_STOCK"
STATE_DIR_ENV = "MURMUR_LOCAL_STATE_DIR"
DEFAULT_STATE_DIR = "var/local-instances"
DEFAULT_COMMAND = (sys.executable, "-m", "gpu_worker", "run")
# Worker settings a developer may set for the subprocess; every other MURMUR_* / SCW_* variable
# of the control plane (tokens, signing key, database URL, provider keys) stays out of it.
_INHERITED_WORKER_VARS = frozenset({CPU_THREADS_VAR, DRAIN_TIMEOUT_VAR})


LOCAL_TERM_GRACE_SECONDS = 30.0
LOCAL_DRAIN_TIMEOUT_SECONDS = 20.0
# Runs the worker (`"$@"`) and records its exit status in the file named by `$0`; a status
# over 128 is a signal's (the shell's convention).
_EXIT_RECORDER = 'status=0; "$@" || status=$?; echo "$status" > "$0.tmp" && mv "$0.tmp" "$0"'
# How much of the log's end is read for its last line.
_LOG_TAIL_BYTES = 4096


def out_of_stock_from_env(env: Mapping[str, str]) -> frozenset[str]:
    return frozenset(p.strip() for p in env.get(OUT_OF_STOCK_ENV, "").split(",") if p.strip())


def child_environment(parent: Mapping[str, str], worker: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment without control-plane secrets, plus the worker's variables."""
    env = {
        k: v
        for k, v in parent.items()
        if not (k.startswith("SCW_") or k.startswith("MURMUR_")) or k in _INHERITED_WORKER_VARS
    }
    env.update(worker)
    # A draining worker must finish (or hand back) its job before the SIGKILL that follows
    # SIGTERM after the provider's grace period, or the job waits out the visibility timeout.
    env.setdefault(DRAIN_TIMEOUT_VAR, str(LOCAL_DRAIN_TIMEOUT_SECONDS))
    return env


class LocalProvider:
    name = "local"

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        command: Sequence[str] = DEFAULT_COMMAND,
        out_of_stock: frozenset[str] | None = None,
        term_grace: float = LOCAL_TERM_GRACE_SECONDS,
        teardown_wait: float = 5.0,
    ) -> None:
        self._dir = Path(state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)
        # command[0] is the interpreter: a profile's worker_python takes its place.
        self._command = list(command)
        self._out_of_stock = (
            out_of_stock if out_of_stock is not None else out_of_stock_from_env(os.environ)
        )
        self._grace = term_grace
        self._wait = teardown_wait

    # -- state files ------------------------------------------------------------------------

    def _path(self, instance_id: str) -> Path:
        if not instance_id.startswith("local-") or "/" in instance_id:
            raise ValueError(f"not a local instance id: {instance_id!r}")
        return self._dir / f"{instance_id}.json"

    def _read(self, instance_id: str) -> dict[str, Any] | None:
        try:
            record: dict[str, Any] = json.loads(self._path(instance_id).read_text())
        except (OSError, ValueError):
            return None
        return record

    def _write(self, record: dict[str, Any]) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._path(record["instance_id"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)  # atomic: a reader sees the old or the new record, never half

    # -- processes --------------------------------------------------------------------------

    @staticmethod
    def _alive(record: Mapping[str, Any]) -> bool:
        """Is the recorded process (same pid AND same start time) still running?"""
        pid = int(record["pid"])
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our exited child
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - float(record["create_time"])) > 1.0:
                return False  # the pid was reused by another process
            return bool(proc.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    @staticmethod
    def _group_alive(record: Mapping[str, Any]) -> bool:
        """Does any live (non-zombie) process remain in the worker's process group?

        A zombie still answers kill(0), and only its parent can reap it; the parent may be
        another pool process of the control worker, so zombies count as gone. Processes older
        than the worker are not its children: the group id was reused, leave them alone.
        """
        pgid = int(record["pid"])
        born = float(record["create_time"]) - 1.0
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        for proc in psutil.process_iter(["status", "create_time"]):
            try:
                if (
                    os.getpgid(proc.pid) == pgid
                    and proc.info["status"] != psutil.STATUS_ZOMBIE
                    and proc.info["create_time"] >= born
                ):
                    return True
            except (OSError, psutil.Error):
                continue
        return False

    def _instance(self, record: Mapping[str, Any]) -> Instance:
        alive = self._alive(record)
        return Instance(
            instance_id=record["instance_id"],
            state=InstanceState.RUNNING if alive else InstanceState.STOPPED,
            worker_id=record.get("worker_id"),
            profile=record.get("profile"),
            resources={"worker_id": record.get("worker_id")},
            detail="" if alive else self._exit_detail(record["instance_id"]),
        )

    def _exit_detail(self, instance_id: str) -> str:
        """Why a stopped worker stopped: its exit status and the last line of its log."""
        try:
            code = int((self._dir / f"{instance_id}.exit").read_text().strip())
        except (OSError, ValueError):
            said = "the worker process ended; its exit status is unknown"
        else:
            if code > 128:
                said = f"the worker process was killed by signal {code - 128}"
            else:
                said = f"the worker process exited with code {code}"
        last = _last_line(self._dir / f"{instance_id}.log")
        return clean_log_line(f"{said}: {last}" if last else said)

    def _command_for(self, profile: Profile) -> list[str]:
        """The worker's command line: the profile's interpreter, when it names one."""
        if profile.worker_python is None:
            return self._command
        # Absolute, so that a bare name is never looked up on PATH (check_settings checked
        # this very file) and the working directory it was relative to is the one logged.
        return [os.path.abspath(profile.worker_python), *self._command[1:]]

    # -- the interface ----------------------------------------------------------------------

    def create(self, profile: Profile, worker_id: str, bind: Bind) -> Instance:
        if profile.name in self._out_of_stock:
            raise OutOfStock(
                f"local: {profile.name} is out of stock (simulated by {OUT_OF_STOCK_ENV})"
            )
        instance_id = f"local-{uuid.uuid4().hex[:16]}"
        resources = {"worker_id": worker_id}
        environment = bind(instance_id, resources)
        self._dir.mkdir(parents=True, exist_ok=True)
        log_path = self._dir / f"{instance_id}.log"
        command = self._command_for(profile)
        if not os.access(command[0], os.X_OK) or os.path.isdir(command[0]):
            # Said here, as Popen would have: under the shell it would only be exit code 127.
            raise ProviderUnavailable(
                f"local: cannot start the worker ({command[0]}): not an executable file"
            )
        exit_path = self._dir / f"{instance_id}.exit"
        try:
            with open(log_path, "ab") as out:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", _EXIT_RECORDER, str(exit_path), *command],
                    env=child_environment(os.environ, environment),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    # Its own process group: a Ctrl-C aimed at the control worker does not
                    # kill a job mid-way, and teardown can signal the worker and its children.
                    start_new_session=True,
                )
        except OSError as exc:
            raise ProviderUnavailable(
                f"local: cannot start the worker ({command[0]}): {exc.strerror}"
            ) from None
        try:
            create_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            create_time = time.time()
        self._write(
            {
                "instance_id": instance_id,
                "worker_id": worker_id,
                "profile": profile.name,
                "pid": proc.pid,
                "create_time": create_time,
                "started_at": time.time(),
                "log": str(log_path),
            }
        )
        log.info(
            "local instance %s: worker %s (%s) pid %s, %s",
            instance_id,
            worker_id,
            profile.name,
            proc.pid,
            command[0],
        )
        return Instance(instance_id, InstanceState.RUNNING, worker_id, profile.name, resources)

    def get(self, instance_id: str, resources: Mapping[str, Any]) -> Instance | None:
        record = self._read(instance_id)
        return None if record is None else self._instance(record)

    def list_by_tag(self, scopes: frozenset[str]) -> list[Instance]:
        if not self._dir.is_dir():
            return []
        records = (self._read(p.stem) for p in sorted(self._dir.glob("local-*.json")))
        return [self._instance(r) for r in records if r is not None]

    def availability(self, profile: Profile) -> str | None:
        return StockHint.SHORTAGE if profile.name in self._out_of_stock else StockHint.AVAILABLE

    def delete(self, instance_id: str, resources: Mapping[str, Any]) -> Teardown:
        record = self._read(instance_id)
        if record is None:
            return Teardown(True)
        pid = int(record["pid"])
        deadline = time.monotonic() + self._wait
        if self._alive(record) or self._group_alive(record):
            now = time.time()
            if "term_sent_at" not in record:
                record["term_sent_at"] = now
                self._write(record)
                self._signal(pid, signal.SIGTERM)
            elif now - float(record["term_sent_at"]) >= self._grace:
                self._signal(pid, signal.SIGKILL)
            while (
                self._alive(record) or self._group_alive(record)
            ) and time.monotonic() < deadline:
                time.sleep(0.05)
                if time.time() - float(record["term_sent_at"]) >= self._grace:
                    self._signal(pid, signal.SIGKILL)
            if self._alive(record) or self._group_alive(record):
                return Teardown(False, resources, f"pid {pid} still running after SIGTERM")
        with contextlib.suppress(OSError):
            self._path(instance_id).unlink()
        for suffix in (".log", ".exit"):
            with contextlib.suppress(OSError):
                (self._dir / f"{instance_id}{suffix}").unlink()
        return Teardown(True)

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _last_line(path: Path) -> str:
    """The last non-empty line of a log file, or "" when there is none to read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""
