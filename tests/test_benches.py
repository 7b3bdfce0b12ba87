"""Every benchmark in bench/ still runs: each one's `--smoke` mode, in a subprocess, exits 0.

A bench is a script of bench/ with an `if __name__ == "__main__":` block whose name does not
start with `_`; the modules the benches import (`_stack.py`, `baseline_app.py`, ...) have no
such block and are left out. A new bench is picked up by its presence alone, so it must accept
`--smoke`: a bounded run (seconds to a minute) of its real path that exits non-zero when that
path breaks, and gives no verdict on speed (a loaded CI machine is no place for one). The
figures themselves come from full runs, recorded in the docs each bench names.

Serial: the benches start gunicorn and worker processes and wait on real timeouts, so they run
alone after the parallel part of `make test`. Each gets the test session's Redis database
(MURMUR_BENCH_REDIS_URL), which it may empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
# Wall-clock bound of one smoke run: about three times the slowest one on a loaded 2-core box.
SMOKE_TIMEOUT_SECONDS = 240
MAIN_BLOCK = 'if __name__ == "__main__":'


def bench_scripts() -> list[Path]:
    """The runnable benches: a main block, not a private module."""
    return sorted(
        path
        for path in BENCH.glob("*.py")
        if not path.name.startswith("_") and MAIN_BLOCK in path.read_text(encoding="utf-8")
    )


def test_the_benches_are_found() -> None:
    names = {path.name for path in bench_scripts()}
    # Two that must be there, and two helpers that must not (imported, never run).
    assert {"fleet_economics.py", "reconcile.py"} <= names
    assert not names & {"_stack.py", "baseline_app.py"}


@pytest.mark.parametrize("script", bench_scripts(), ids=lambda path: path.stem)
def test_every_bench_names_a_smoke_mode(script: Path) -> None:
    # A script that ignored the flag would run its full length in CI and hit the timeout.
    assert "--smoke" in script.read_text(encoding="utf-8"), f"{script.name} has no --smoke"


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("script", bench_scripts(), ids=lambda path: path.stem)
def test_bench_smoke_run_exits_0(script: Path, redis_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MURMUR_BENCH_REDIS_URL": redis_url,
        "OUT": str(tmp_path),  # gpu_check writes there
        "TMPDIR": str(tmp_path),
    }
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(script), "--smoke"],
            cwd=BENCH,
            env=env,
            capture_output=True,
            text=True,
            timeout=SMOKE_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-3000:]
        pytest.fail(f"{script.name} --smoke ran past {SMOKE_TIMEOUT_SECONDS} s; output:\n{out!r}")
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, (
        f"{script.name} --smoke exited {done.returncode} after "
        f"{time.monotonic() - started:.0f} s:\n{tail}"
    )
