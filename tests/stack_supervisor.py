"""`make up`'s supervision with cheap children, for tests that SIGKILL one of them.

Usage: python -m tests.stack_supervisor LOG_DIR. Starts "api" (a sleeper) and "control" (a
sleeper that spawns a grandchild, as celery -B did with its beat); each prints its pid, which
the stack echoes. Exits with what `scripts.stack.supervise` returns, after stopping everything.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from scripts.stack import Stack, supervise

SLEEPER = "import os, time; print('pid', os.getpid(), flush=True); time.sleep(600)"
SPAWNER = (
    "import os, subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
    "print('pid', os.getpid(), flush=True); time.sleep(600)"
)


def main(logs: str) -> int:
    stack = Stack(dict(os.environ), echo=("pid",), logs=Path(logs))
    try:
        stack.start("api", [sys.executable, "-c", SLEEPER])
        stack.start("control", [sys.executable, "-c", SPAWNER])
        return supervise(stack)
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
