"""WhisperXTranscriber on multilingual Whisper base, real whisperx, CPU, offline: each job
without a language is detected anew, and the task is each job's own.

WhisperX keeps its pipeline's tokenizer (language and task) from one call to the next; a
worker serves many jobs with one resident pipeline, so a Spanish job after a German one
must not inherit German, and a transcription after a translation must not translate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from faster_whisper import decode_audio

from gpu_worker.manifest import load_manifest, verify_asset
from gpu_worker.transcriber import WhisperXSettings, WhisperXTranscriber

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GERMAN = ROOT / "samples" / "guten-morgen.wav"
SPANISH = ROOT / "tests" / "fixtures" / "speech-es.wav"


def test_language_and_task_are_each_jobs_own() -> None:
    settings = WhisperXSettings(
        device="cpu",
        compute_type="int8",
        vad="silero",
        alignment_device="none",
        batch_size=8,
        cpu_threads=2,
    )
    base = verify_asset(load_manifest().asset("base")).root
    transcriber = WhisperXTranscriber(
        base, settings=settings, alignment_dir=None, model_name="base"
    )
    german, spanish = (decode_audio(str(p), sampling_rate=16000) for p in (GERMAN, SPANISH))
    options = {"language": None, "prompt": None, "word_timestamps": False}

    first = transcriber.transcribe(german, **options, task="translate")
    second = transcriber.transcribe(spanish, **options)

    assert (first.language, first.task) == ("de", "translate")
    assert "morning" in first.text.lower() and "Guten" not in first.text, first.text
    assert (second.language, second.task) == ("es", "transcribe")
    assert "Madrid" in second.text, second.text
