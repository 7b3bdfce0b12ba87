"""The control-plane image ships every first-party package that app/ and tasks/ import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = {"app", "tasks", "gpu_worker"}


def _imported_packages(package: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found |= {name.split(".")[0] for name in names} & FIRST_PARTY
    return found


def test_the_control_image_copies_what_the_control_plane_imports() -> None:
    dockerfile = (ROOT / "docker" / "control.Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, flags=re.MULTILINE))
    needed = _imported_packages("app") | _imported_packages("tasks")
    assert "gpu_worker" in needed  # the wire contract lives in the worker package
    assert needed <= copied, f"not copied into the control image: {sorted(needed - copied)}"
