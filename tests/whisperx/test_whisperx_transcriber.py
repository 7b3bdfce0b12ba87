"""WhisperXTranscriber on the real whisperx, pyannote and silero-vad, on the CPU, offline.

What the stand-ins in tests/worker/test_worker_whisperx.py assume about WhisperX's API is
checked here against the real packages; only the CUDA branches and wav2vec2 alignment (whose
model cannot be fetched in CI) stay with the stand-ins.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_worker.transcriber import UnsupportedLanguage, WhisperXSettings, WhisperXTranscriber

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# tiny.en int8 on speech-short.wav: 0.12 sequential (tests/worker), 0.12 to 0.18 batched here.
MAX_WER = 0.25
VADS = ("pyannote", "silero")
BATCH_SIZES = (1, 8)


@pytest.fixture(scope="module")
def transcribers(tiny_en_dir: Path) -> Callable[[str, int], WhisperXTranscriber]:
    """One resident transcriber per (VAD, batch size), built on first use, as a worker does."""
    built: dict[tuple[str, int], WhisperXTranscriber] = {}

    def get(vad: str, batch_size: int) -> WhisperXTranscriber:
        if (vad, batch_size) not in built:
            settings = WhisperXSettings(
                device="cpu",
                compute_type="int8",
                vad=vad,
                alignment_device="none",
                batch_size=batch_size,
                cpu_threads=2,
            )
            built[vad, batch_size] = WhisperXTranscriber(
                tiny_en_dir, settings=settings, alignment_dir=None, model_name="tiny.en"
            )
        return built[vad, batch_size]

    return get


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("vad", VADS)
def test_speech_is_transcribed_with_each_vad_and_batch_size(
    transcribers, decoded, word_error_rate, vad, batch_size
):
    audio = decoded("speech-short")
    reference = (FIXTURES / "speech-short.txt").read_text()

    transcript = transcribers(vad, batch_size).transcribe(
        audio, language=None, prompt=None, word_timestamps=False
    )

    assert word_error_rate(reference, transcript.text) <= MAX_WER
    assert transcript.language == "en"  # English-only model: no language detection ran
    assert transcript.duration == pytest.approx(audio.shape[0] / 16000)
    assert transcript.segments
    for segment in transcript.segments:
        assert 0.0 <= segment.start <= segment.end <= transcript.duration + 0.01
        # The batched pass gives text and avg_logprob only; nothing else is invented.
        assert segment.tokens == []
        assert segment.avg_logprob is not None and segment.avg_logprob < 0
        assert segment.no_speech_prob is None and segment.compression_ratio is None
        assert segment.words is None
    body = transcript.to_json()
    assert body["text"] == transcript.text and transcript.text.strip()


def test_the_packaged_silero_model_runs_not_torch_hub(transcribers, monkeypatch):
    torch = importlib.import_module("torch")
    silero_vad = importlib.import_module("silero_vad")

    def no_hub(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("torch.hub.load was called")

    monkeypatch.setattr(torch.hub, "load", no_hub)
    threads = torch.get_num_threads()
    transcriber = transcribers("silero", 8)

    vad = transcriber._pipeline.vad_model
    assert type(vad.vad_pipeline) is type(silero_vad.load_silero_vad(onnx=False))
    assert vad.get_speech_timestamps is silero_vad.get_speech_timestamps
    # Importing silero_vad pins torch to one thread; the transcriber puts the count back.
    assert torch.get_num_threads() == threads


def test_the_prompt_steers_one_job_only(transcribers, decoded):
    transcriber = transcribers("silero", 8)
    audio = decoded("speech-short")

    plain = transcriber.transcribe(audio, language=None, prompt=None, word_timestamps=False)
    # Whisper continues the prompt's style: an upper-case prompt gives upper-case text.
    shouted = transcriber.transcribe(
        audio, language=None, prompt="THE QUICK BROWN FOX.", word_timestamps=False
    )
    after = transcriber.transcribe(audio, language=None, prompt=None, word_timestamps=False)

    assert "QUICK BROWN FOX" in shouted.text
    assert "QUICK BROWN FOX" not in plain.text
    assert after.text == plain.text
    assert transcriber._pipeline.options.initial_prompt is None


@pytest.mark.parametrize("language", [None, "en"])
def test_an_english_only_model_answers_english(transcribers, decoded, language):
    transcript = transcribers("silero", 8).transcribe(
        decoded("speech-short"), language=language, prompt=None, word_timestamps=False
    )

    assert transcript.language == "en"


@pytest.mark.parametrize("language", ["fr", "de"])
def test_another_language_is_refused_before_any_work(transcribers, decoded, language):
    with pytest.raises(
        UnsupportedLanguage,
        match=rf"^language '{language}' is not supported by model tiny.en \(English only\)$",
    ):
        transcribers("pyannote", 8).transcribe(
            decoded("speech-short"), language=language, prompt=None, word_timestamps=False
        )


@pytest.mark.parametrize("vad", VADS)
def test_without_an_alignment_model_words_come_from_faster_whisper(
    transcribers, decoded, word_error_rate, vad
):
    """What a client gets: faster-whisper's word timing, with tokens and no-speech probability.

    WhisperX's batched pass has no timestamps inside a chunk, so a profile without alignment
    answers word_timestamps with a sequential pass of the same resident model (Silero ONNX VAD
    inside faster-whisper, whatever the profile's VAD), not with empty word lists.
    """
    audio = decoded("speech-short")
    reference = (FIXTURES / "speech-short.txt").read_text()

    transcript = transcribers(vad, 8).transcribe(
        audio, language="en", prompt=None, word_timestamps=True
    )

    assert word_error_rate(reference, transcript.text) <= MAX_WER
    words = [word for segment in transcript.segments for word in segment.words or []]
    assert len(words) >= 10
    assert "".join(word.word for word in words).strip() == transcript.text
    times = [t for word in words for t in (word.start, word.end)]
    assert times == sorted(times)
    for segment in transcript.segments:
        assert segment.words
        assert segment.start <= segment.words[0].start
        assert segment.words[-1].end <= segment.end + 0.01
        assert segment.tokens and segment.no_speech_prob is not None
    assert all(word.probability is not None and 0 <= word.probability <= 1 for word in words)


@pytest.mark.parametrize("vad", VADS)
def test_silence_gives_no_segments(transcribers, decoded, vad):
    transcript = transcribers(vad, 8).transcribe(
        decoded("silence-5s"), language=None, prompt=None, word_timestamps=False
    )

    assert transcript.to_json() == {
        "text": "",
        "language": "en",
        "task": "transcribe",
        "duration": 5.0,
        "segments": [],
    }


@pytest.mark.parametrize("vad", VADS)
@pytest.mark.parametrize("word_timestamps", [False, True])
def test_empty_audio_is_an_empty_transcript(transcribers, vad, word_timestamps):
    transcript = transcribers(vad, 1).transcribe(
        np.zeros(0, dtype=np.float32), language=None, prompt=None, word_timestamps=word_timestamps
    )

    assert transcript.to_json() == {"text": "", "language": "en", "duration": 0.0, "segments": []}


def test_the_checkpoint_runs_after_each_batch_and_a_raise_stops_the_job(transcribers, decoded):
    from gpu_worker.holding import JobCancelled

    transcriber = transcribers("silero", 1)
    audio = decoded("speech-90s")  # several VAD chunks
    calls: list[int] = []

    transcript = transcriber.transcribe(
        audio, language="en", prompt=None, word_timestamps=False, checkpoint=lambda: calls.append(1)
    )

    # WhisperX reports progress once per VAD chunk (one segment each), as batches complete.
    assert len(calls) == len(transcript.segments) >= 2

    def cancelled() -> None:
        raise JobCancelled("job_1 is no longer held by this worker")

    with pytest.raises(JobCancelled):
        transcriber.transcribe(
            audio, language="en", prompt=None, word_timestamps=False, checkpoint=cancelled
        )
    assert transcriber._pipeline.options.initial_prompt is None


def test_a_file_path_is_decoded_by_the_worker_not_by_whisperx_ffmpeg(transcribers, monkeypatch):
    # whisperx.load_audio shells out to an ffmpeg binary the worker image need not have.
    audio_module = importlib.import_module("whisperx.audio")
    monkeypatch.setattr(audio_module, "load_audio", lambda *a, **k: pytest.fail("ffmpeg"))

    transcript = transcribers("silero", 8).transcribe(
        str(FIXTURES / "speech-short.wav"), language=None, prompt=None, word_timestamps=False
    )

    assert transcript.text.strip()


def test_whisperx_api_has_what_the_transcriber_and_its_stand_ins_rely_on():
    """The alignment path cannot run in CI (no wav2vec2 model): check its calls' shape."""
    alignment = importlib.import_module("whisperx.alignment")
    asr = importlib.import_module("whisperx.asr")
    vads = importlib.import_module("whisperx.vads")

    load_align = inspect.signature(alignment.load_align_model).parameters
    assert {"language_code", "device", "model_dir", "model_cache_only"} <= set(load_align)
    align = list(inspect.signature(alignment.align).parameters)
    assert align[:5] == ["transcript", "model", "align_model_metadata", "audio", "device"]
    assert "return_char_alignments" in align
    transcribe = inspect.signature(asr.FasterWhisperPipeline.transcribe).parameters
    assert {"batch_size", "language", "chunk_size", "progress_callback"} <= set(transcribe)
    load_model = set(inspect.signature(asr.load_model).parameters)
    assert {"model", "vad_model", "vad_method", "vad_options", "local_files_only"} <= load_model
    assert "threads" in load_model
    # PackagedSilero subclasses whisperx.vads.Silero and calls Vad.__init__ directly.
    assert issubclass(vads.Silero, vads.Vad)
    options = importlib.import_module("faster_whisper.transcribe").TranscriptionOptions
    assert "initial_prompt" in {field.name for field in dataclasses.fields(options)}
