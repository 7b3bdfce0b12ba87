"""The quick tier (`make check`) is decided by rules, not a list: tests/conftest.py marks a
test `slow` by the fixtures it uses or the directory it lives in, and in the quick tier a test
that still starts a stack process is skipped with a note."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import conftest

TESTS = Path(conftest.__file__).resolve().parent


@dataclass
class _Item:
    path: Path
    fixturenames: list[str]
    markers: list[str] = field(default_factory=list)

    def add_marker(self, marker: Any) -> None:
        self.markers.append(marker.name)


@pytest.mark.parametrize(
    ("path", "fixtures", "slow"),
    [
        ("test_api_input.py", ["client", "settings"], False),
        ("test_webhooks.py", ["live_api", "control_worker"], True),
        ("fleet/test_local_end_to_end.py", ["start_worker"], True),
        ("worker/test_worker_transcription.py", ["tiny_en_dir"], True),
        ("deploy/test_compose.py", [], True),
        ("whisperx/test_whisperx_memory.py", [], True),
    ],
)
def test_a_test_is_slow_by_its_fixtures_or_its_directory(
    path: str, fixtures: list[str], slow: bool
) -> None:
    item = _Item(TESTS / path, fixtures)
    conftest.pytest_collection_modifyitems(None, [item])  # type: ignore[arg-type, list-item]
    assert ("slow" in item.markers) is slow


def test_the_quick_tier_recognises_a_stack_process() -> None:
    assert conftest._stack_program([sys.executable, "-m", "celery"]) is not None
    assert conftest._stack_program(["/usr/bin/redis-server", "--port", "0"]) == "redis-server"
    assert conftest._stack_program(["gunicorn", "app:create_app()"]) == "gunicorn"
    assert conftest._stack_program(["ffmpeg", "-i", "x"]) is None
    assert conftest._stack_program("openssl version") is None
    assert conftest._stack_program([]) is None
