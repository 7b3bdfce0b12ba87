"""The control-plane image ships every first-party package that app/ and tasks/ import."""

from __future__ import annotations

import ast
import re
import sys
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


def test_the_wire_contract_imports_nothing_heavy() -> None:
    # Both images load it: pydantic, the standard library and its own modules, nothing else
    # (no torch, faster-whisper, numpy, Celery or Flask). The model manifest's reader is part
    # of it: what a profile can serve follows from the manifest (protocol/capabilities.py).
    allowed_first_party = {"gpu_worker.protocol", "gpu_worker.manifest"}
    contract = [*(ROOT / "gpu_worker" / "protocol").glob("*.py"), ROOT / "gpu_worker/manifest.py"]
    for path in contract:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "gpu_worker":
                    assert any(name.startswith(a) for a in allowed_first_party), (path, name)
                else:
                    assert top in ({"pydantic", "__future__"} | sys.stdlib_module_names), (
                        path,
                        name,
                    )
