"""The real-library tier: WhisperX, pyannote and Silero on the CPU, offline, in their own venv.

`make test-whisperx` builds `.venv-whisperx` from requirements/worker-whisperx-cpu.txt and runs
this directory with MURMUR_WHISPERX_TIER=1; CI runs it (.ci/run). Under that variable a missing
whisperx is an error and the run fails unless every test ran and none was skipped, so the tier
can never pass by skipping. In the default venv (no torch) the tier is skipped, with a reason.

Nothing here may reach a network: gpu_worker pins HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE and
PYANNOTE_METRICS_ENABLED before any model library is imported, and the Makefile sets them too.
Test modules import torch and whisperx only inside fixtures, so collection works without them.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gpu_worker  # noqa: F401  (pins the hub offline before any model library is imported)
from gpu_worker.manifest import load_manifest, verify_asset

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
TIER = os.environ.get("MURMUR_WHISPERX_TIER") == "1"
AVAILABLE = importlib.util.find_spec("whisperx") is not None

_outcomes = {"passed": 0, "skipped": 0}


def _in_tier(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if AVAILABLE:
        return
    if TIER:
        raise pytest.UsageError(
            "MURMUR_WHISPERX_TIER=1 but whisperx is not installed: run `make test-whisperx`"
        )
    skip = pytest.mark.skip(
        reason="whisperx is not installed here; `make test-whisperx` runs this tier"
    )
    for item in items:
        if _in_tier(item):
            item.add_marker(skip)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not TIER or not report.nodeid.startswith("tests/whisperx/"):
        return
    if report.skipped:
        _outcomes["skipped"] += 1
    elif report.when == "call" and report.passed:
        _outcomes["passed"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if TIER and exitstatus == 0 and (_outcomes["passed"] == 0 or _outcomes["skipped"]):
        print(
            f"\nthe WhisperX tier must run every test: {_outcomes['passed']} passed, "
            f"{_outcomes['skipped']} skipped"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def tiny_en_dir() -> Path:
    return verify_asset(load_manifest().asset("tiny.en")).root


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


@pytest.fixture(scope="session")
def word_error_rate() -> Callable[[str, str], float]:
    """WER after lower-casing and dropping punctuation (as tests/worker scores it)."""
    import jiwer

    def score(reference: str, hypothesis: str) -> float:
        return float(jiwer.wer(_words(reference), _words(hypothesis)))

    return score


@pytest.fixture(scope="session")
def decoded() -> Callable[[str], Any]:
    """A fixture's samples, decoded once per session as the worker's task decodes them."""
    from faster_whisper import decode_audio

    cache: dict[str, Any] = {}

    def load(name: str) -> Any:
        if name not in cache:
            cache[name] = decode_audio(str(FIXTURES / f"{name}.wav"), sampling_rate=16000)
        return cache[name]

    return load
