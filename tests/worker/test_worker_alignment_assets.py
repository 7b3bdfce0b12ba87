"""Alignment fails closed: a profile with alignment and no wav2vec2 files is refused up front.

`check` and `run` both refuse it before any model loads, naming the asset and how to install
it, so a missing alignment model is never discovered at the first job. The real-library tier
(tests/whisperx/test_whisperx_alignment.py) checks the same with whisperx and NLTK installed.
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
MISSING_WAV2VEC2 = (
    "wav2vec2-en: not installed (/opt/murmur/assets/wav2vec2 does not exist; it comes from "
    'docker/worker.Dockerfile (baked at build time)); install it with: python -c "import '
    "torchaudio; torchaudio.pipelines.WAV2VEC2_ASR_BASE_960H.get_model(dl_kwargs={'model_dir': "
    "'/opt/murmur/assets/wav2vec2'})\""
)


def gpu_worker(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MURMUR_")}
    return subprocess.run(
        [sys.executable, "-m", "gpu_worker", command],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(
    Path("/opt/murmur/assets/wav2vec2").exists(),
    reason="runs where the wav2vec2 files are absent (CI); the image has them",
)
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_profile_with_alignment_and_no_wav2vec2_is_refused(cpu_env, command):
    env = {**cpu_env, "MURMUR_ALIGNMENT_DEVICE": "cpu"}

    result = gpu_worker(command, env)

    assert result.returncode == 1
    assert MISSING_WAV2VEC2 in result.stderr.splitlines()
    if command == "check":
        assert MISSING_WAV2VEC2 in json.loads(result.stdout)["problems"]
    else:
        assert result.stderr.startswith("worker cannot start:\n")
