"""docs/iam-policy.md covers every Scaleway SDK method the provider calls."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from scaleway.block.v1 import BlockV1API
from scaleway.instance.v1.custom_api import InstanceUtilsV1API

ROOT = Path(__file__).resolve().parents[2]
PROVIDER = ROOT / "app" / "fleet" / "providers" / "scaleway.py"
POLICY = ROOT / "docs" / "iam-policy.md"
APIS = {"_instance": ("instance", InstanceUtilsV1API), "_block": ("block", BlockV1API)}


def sdk_calls() -> set[str]:
    """`instance.x` / `block.x` for every `self._instance.x(...)` / `self._block.x(...)`."""
    calls: set[str] = set()
    for node in ast.walk(ast.parse(PROVIDER.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if (
            isinstance(owner, ast.Attribute)
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
            and owner.attr in APIS
        ):
            calls.add(f"{APIS[owner.attr][0]}.{node.func.attr}")
    return calls


def documented() -> dict[str, str]:
    """SDK method -> the permission-set column of its row in the policy table."""
    rows = {}
    for line in POLICY.read_text().splitlines():
        m = re.match(r"^\| `((?:instance|block)\.[a-z_]+)` \|.*\| ([^|]+) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_every_sdk_call_is_in_the_policy() -> None:
    calls = sdk_calls()
    assert "instance.create_server" in calls and "block.delete_volume" in calls
    missing = calls - set(documented())
    assert not missing, f"add these to docs/iam-policy.md: {sorted(missing)}"


def test_documented_methods_exist_and_name_a_granted_set() -> None:
    classes = {prefix: cls for prefix, cls in APIS.values()}
    granted = ("InstancesFullAccess", "InstancesReadOnly", "BlockStorage")
    for method, permission in documented().items():
        prefix, name = method.split(".")
        assert callable(getattr(classes[prefix], name, None)), method
        assert any(g in permission for g in granted), (method, permission)
