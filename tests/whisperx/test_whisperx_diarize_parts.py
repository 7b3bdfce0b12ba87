"""A diarized long file cut into parts keeps one set of speaker labels (issue 34, point 3), on the
real stack: API -> control worker -> local provider -> a worker under the real-library venv,
which transcribes the parts and diarizes the whole file as the job's speakers part.

The file is tests/fixtures/two-voices.wav three times over (91 s, 18 alternating turns of two
voices), cut at 30 s: each part holds turns of both voices, so a label that changed meaning at
a seam (a per-part diarization numbered on its own) would show as a voice whose turns carry two
labels. Each true turn's owner must alternate A, B, A, ... across all three copies.
"""

from __future__ import annotations

import json
import time
import wave
from pathlib import Path

import pytest

from app.fleet.providers.local import LocalProvider
from gpu_worker.diarization_error import diarization_error
from gpu_worker.speakers import SpeakerTurn
from scripts import stack
from tests.conftest import FIXTURES, ROOT, LiveApi, Proc, api_get
from tests.whisperx.test_whisperx_diarize_stack import (
    MAX_DER,
    WORKER_PYTHON,
    _owners,
    finished,
    submit_diarized,
)

pytestmark = pytest.mark.slow

COPIES = 3
PART_SECONDS = 30


@pytest.fixture()
def live_api_env(tmp_path: Path) -> dict[str, str]:
    env = {
        "MURMUR_LOCAL_STATE_DIR": str(tmp_path / "instances"),
        "MURMUR_PART_SECONDS": str(PART_SECONDS),
    }
    line = stack.add_diarization(
        env, ROOT / "config" / "local.toml", python=WORKER_PYTHON, var=tmp_path / "var"
    )
    assert line.startswith("diarization: on"), line
    return env


def _repeated(path: Path) -> tuple[Path, list[SpeakerTurn]]:
    """The fixture `COPIES` times over, and its true turns shifted to each copy."""
    with wave.open(str(FIXTURES / "two-voices.wav"), "rb") as src:
        params, frames = src.getparams(), src.readframes(src.getnframes())
        seconds = src.getnframes() / src.getframerate()
    with wave.open(str(path), "wb") as out:
        out.setparams(params)
        out.writeframes(frames * COPIES)
    truth = json.loads((FIXTURES / "two-voices.json").read_text())["turns"]
    turns = [
        SpeakerTurn(t["start"] + k * seconds, t["end"] + k * seconds, t["speaker"])
        for k in range(COPIES)
        for t in truth
    ]
    return path, turns


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_diarized_long_file_keeps_its_speaker_labels_across_parts(
    live_api: LiveApi, control_worker: Proc, tmp_path: Path
) -> None:
    audio, reference = _repeated(tmp_path / "meeting.wav")
    started = time.monotonic()
    try:
        job_id = submit_diarized(live_api, audio)
        shown = api_get(live_api, f"/v1/jobs/{job_id}").json()
        assert shown["parts"]["count"] == COPIES + 1  # three spans and the speakers
        job = finished(live_api, control_worker, job_id, 900)
        print(f"diarized parted job {job.get('status')} in {time.monotonic() - started:.1f} s")
        assert job.get("status") == "succeeded", (job, control_worker.output()[-3000:])
        assert job["parts"] == {"count": COPIES + 1, "done": COPIES + 1, "running": 0}

        transcript = api_get(
            live_api, f"/v1/jobs/{job_id}/transcript", params={"format": "verbose_json"}
        ).json()
        assert transcript["speakers"] == ["SPEAKER_00", "SPEAKER_01"]
        segments = transcript["segments"]
        found = [SpeakerTurn(s["start"], s["end"], s["speaker"]) for s in segments]
        error = diarization_error(reference, found)
        print(f"DER of the parted job's segments: {error.rate:.3f} ({error})")
        assert error.rate <= MAX_DER, error
        # One label per voice over the whole file: the owners alternate across every seam.
        owners = _owners(reference, found)
        names = [owner for owner, _ in owners]
        assert all(share >= 0.8 for _, share in owners), owners
        assert names[0::2] == [names[0]] * (len(names) // 2), owners
        assert names[1::2] == [names[1]] * (len(names) // 2), owners
        assert names[0] != names[1]
        text = " ".join(s["text"] for s in segments).lower()
        assert text.count("delivery schedule") == COPIES, text  # no seam lost or doubled it
    finally:
        provider = LocalProvider(live_api.settings, state_dir=tmp_path / "instances", term_grace=10)
        for instance in provider.list_by_tag(frozenset()):
            provider.delete(instance.instance_id, instance.resources)
