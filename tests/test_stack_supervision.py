"""`make up` never runs half a stack: one process dies, everything stops (real processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOUND_SECONDS = 10.0


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_child_stops_the_whole_stack_and_what_it_spawned(tmp_path: Path) -> None:
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "tests.stack_supervisor", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(supervisor.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    pids: dict[str, list[int]] = {}
    try:
        # Three Python processes start on two loaded cores: generous, it only bounds a hang.
        deadline = time.monotonic() + 120
        while sum(len(v) for v in pids.values()) < 3:  # api, control and its grandchild
            assert supervisor.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
            pids = {}
            for line in list(lines):
                found = re.match(r"\[(\w+)\] pid (\d+)", line)
                if found:
                    pids.setdefault(found[1], []).append(int(found[2]))
        everyone = [pid for group in pids.values() for pid in group]
        assert all(_alive(pid) for pid in everyone)
        # The grandchild prints under the same name; the child leads its process group.
        control = next(p for p in pids["control"] if os.getpgid(p) == p)

        os.kill(control, signal.SIGKILL)
        killed = time.monotonic()
        code = supervisor.wait(BOUND_SECONDS)
        took = time.monotonic() - killed
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(5)
    reader.join(5)
    output = "".join(lines)
    assert code == 1, output
    assert re.search(
        r"control exited with -9; see .*control\.log: stopping the whole stack", output
    )
    assert took < BOUND_SECONDS
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in everyone) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in everyone if _alive(pid)]
    assert left == [], f"still running after the stack stopped: {left}"


def test_a_broker_that_stops_answering_stops_the_stack(tmp_path: Path) -> None:
    from scripts.stack import Stack

    stack = Stack(dict(os.environ), echo=(), logs=tmp_path)
    answers = iter([True, False, False, False])
    stack.probes["broker"] = lambda: next(answers, False)
    stack.start("api", [sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = time.monotonic()
        problem = stack.watch(poll=0.02, probe_every=0.05, probe_failures=3)
        took = time.monotonic() - started
        assert problem == "broker stopped answering"
        assert took < BOUND_SECONDS
        assert stack.dead() is None  # the caller stops the children
    finally:
        stack.stop()
    assert stack.procs[0][1].poll() is not None
