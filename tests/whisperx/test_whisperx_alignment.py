"""Alignment fails closed with the real packages installed: refused at `check` and at start.

CI has no wav2vec2 weights and no NLTK punkt_tab (nothing may be downloaded), which is what a
worker image missing them looks like: the worker must name both assets and how to install
them before it loads a model, instead of failing at the first job that asks for words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ENV = {
    "MURMUR_MODEL": "tiny.en",
    "MURMUR_DEVICE": "cpu",
    "MURMUR_COMPUTE_TYPE": "int8",
    "MURMUR_VAD": "pyannote",
    "MURMUR_ALIGNMENT_DEVICE": "cpu",
    "MURMUR_BATCH_SIZE": "8",
    "MURMUR_CPU_THREADS": "2",
    "MURMUR_PROFILE": "local-whisperx",
    "MURMUR_WORKER_ID": "wrk_test1",
    "MURMUR_INSTANCE_ID": "local-0001",
    "MURMUR_WORKER_TOKEN": "ab" * 32,
    # Nothing listens there: the worker must stop before it reports anything.
    "MURMUR_CONTROL_URL": "http://127.0.0.1:9",
    "MURMUR_BROKER_URL": "redis://127.0.0.1:9/0",
}


def gpu_worker(command: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MURMUR_")}
    # An empty NLTK data directory, whatever the machine has installed elsewhere.
    env.update(ENV, NLTK_DATA=str(tmp_path))
    return subprocess.run(
        [sys.executable, "-m", "gpu_worker", command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(
    Path("/opt/murmur/assets/wav2vec2").exists(),
    reason="runs where the wav2vec2 files are absent (CI); the image has them",
)
@pytest.mark.parametrize("command", ["check", "run"])
def test_alignment_without_its_assets_is_refused_naming_each_and_how_to_install(command, tmp_path):
    result = gpu_worker(command, tmp_path)

    assert result.returncode == 1
    problems = result.stderr.splitlines()[1:]
    assert len(problems) == 2, result.stderr  # whisperx, torch and nltk are all installed
    wav2vec2, punkt = problems
    assert wav2vec2.startswith("wav2vec2-en: not installed (/opt/murmur/assets/wav2vec2 ")
    assert 'install it with: python -c "import torchaudio; ' in wav2vec2
    assert punkt == (
        "nltk-punkt-tab: not installed (word alignment needs NLTK's punkt_tab; "
        "docker/worker.Dockerfile bakes it in); install it with: python -m nltk.downloader "
        "-d /opt/murmur/assets/nltk_data punkt_tab and set NLTK_DATA=/opt/murmur/assets/nltk_data"
    )
    if command == "check":
        assert json.loads(result.stdout)["problems"] == problems
    else:
        assert "Loading" not in result.stderr and "ready" not in result.stderr.lower()
