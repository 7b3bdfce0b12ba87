"""Real transcription with faster-whisper and Whisper tiny.en: accuracy, silence, words, shape."""

from __future__ import annotations

import numpy as np
import pytest
from faster_whisper import decode_audio

from gpu_worker.runtime import load_runtime_profile
from gpu_worker.transcriber import (
    FasterWhisperTranscriber,
    UnsupportedLanguage,
    WhisperXSettings,
    backend_for,
    missing_packages,
    vad_asset_for,
)

pytestmark = pytest.mark.slow

MAX_WER = 0.25


@pytest.fixture(scope="module")
def transcribers(tiny_en_dir):
    # One model per compute type for the whole module: loading is the slow part.
    return {
        compute_type: FasterWhisperTranscriber(
            tiny_en_dir, compute_type=compute_type, cpu_threads=2, model_name="tiny.en"
        )
        for compute_type in ("int8", "float32")
    }


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
@pytest.mark.parametrize("fixture", ["speech-short", "speech-90s"])
def test_speech_is_transcribed_within_the_wer_bound(
    transcribers, fixtures_dir, word_error_rate, compute_type, fixture
):
    # Decoded first, as the task does.
    audio = decode_audio(str(fixtures_dir / f"{fixture}.wav"))
    reference = (fixtures_dir / f"{fixture}.txt").read_text()

    transcript = transcribers[compute_type].transcribe(
        audio, language="en", prompt=None, word_timestamps=False
    )

    assert word_error_rate(reference, transcript.text) <= MAX_WER
    assert transcript.language == "en"
    assert transcript.duration == pytest.approx(audio.shape[0] / 16000)
    assert transcript.segments
    starts = [segment.start for segment in transcript.segments]
    assert starts == sorted(starts)
    assert all(segment.start <= segment.end for segment in transcript.segments)


def test_silence_gives_empty_text_and_no_segments(transcribers, fixtures_dir):
    transcript = transcribers["int8"].transcribe(
        str(fixtures_dir / "silence-5s.wav"), language=None, prompt=None, word_timestamps=False
    )

    assert transcript.text == ""
    assert transcript.segments == []
    assert transcript.duration == pytest.approx(5.0)


def test_empty_audio_is_an_empty_transcript(transcribers):
    transcript = transcribers["int8"].transcribe(
        np.zeros(0, dtype=np.float32), language=None, prompt=None, word_timestamps=True
    )

    assert transcript.to_json() == {"text": "", "language": "en", "duration": 0.0, "segments": []}


def test_word_timestamps_are_present_and_monotonic_when_asked(transcribers, fixtures_dir):
    transcript = transcribers["int8"].transcribe(
        str(fixtures_dir / "speech-short.wav"), language="en", prompt=None, word_timestamps=True
    )

    words = [word for segment in transcript.segments for word in segment.words or []]
    assert len(words) >= 10
    times = [t for word in words for t in (word.start, word.end)]
    assert times == sorted(times)
    for segment in transcript.segments:
        assert segment.words
        assert segment.start <= segment.words[0].start
        assert segment.words[-1].end <= segment.end + 0.01
    assert all(0.0 <= word.probability <= 1.0 for word in words)


def test_transcript_json_has_the_protocol_shape(transcribers, fixtures_dir):
    path = str(fixtures_dir / "speech-short.wav")
    with_words = transcribers["int8"].transcribe(
        path, language=None, prompt=None, word_timestamps=True
    )
    without_words = transcribers["int8"].transcribe(
        path, language=None, prompt=None, word_timestamps=False
    )

    body = with_words.to_json()
    assert set(body) == {
        "text",
        "language",
        "language_probability",  # null: an English-only model does not detect
        "task",
        "duration",
        "segments",
    }
    assert (body["language"], body["language_probability"], body["task"]) == (
        "en",
        None,
        "transcribe",
    )
    segment = body["segments"][0]
    assert set(segment) == {
        "id",
        "start",
        "end",
        "text",
        "tokens",
        "avg_logprob",
        "no_speech_prob",
        "compression_ratio",
        "temperature",
        "words",
    }
    assert segment["id"] == 0
    assert all(isinstance(token, int) for token in segment["tokens"])
    assert set(segment["words"][0]) == {"word", "start", "end", "probability"}
    assert all("words" not in s for s in without_words.to_json()["segments"])


def test_a_prompt_is_accepted(transcribers, fixtures_dir, word_error_rate):
    transcript = transcribers["int8"].transcribe(
        str(fixtures_dir / "speech-short.wav"),
        language="en",
        prompt="Quarterly report, Friday noon.",
        word_timestamps=False,
    )

    reference = (fixtures_dir / "speech-short.txt").read_text()
    assert word_error_rate(reference, transcript.text) <= MAX_WER


def test_english_only_model_refuses_another_language(transcribers, fixtures_dir):
    with pytest.raises(
        UnsupportedLanguage,
        match=r"^language 'fr' is not supported by model tiny.en \(English only\)$",
    ):
        transcribers["int8"].transcribe(
            str(fixtures_dir / "speech-short.wav"),
            language="fr",
            prompt=None,
            word_timestamps=False,
        )


def test_batched_profile_transcribes_too(tiny_en_dir, fixtures_dir, word_error_rate):
    batched = FasterWhisperTranscriber(
        tiny_en_dir, compute_type="int8", cpu_threads=2, batch_size=4
    )

    transcript = batched.transcribe(
        str(fixtures_dir / "speech-short.wav"), language=None, prompt=None, word_timestamps=False
    )

    reference = (fixtures_dir / "speech-short.txt").read_text()
    assert word_error_rate(reference, transcript.text) <= MAX_WER


@pytest.fixture(scope="module")
def local_cpu_batched(tiny_en_dir):
    from app.config import LOCAL_CPU_PROFILE

    assert LOCAL_CPU_PROFILE.batch_size > 1  # the default CPU profile runs batched
    return FasterWhisperTranscriber(
        tiny_en_dir,
        compute_type=LOCAL_CPU_PROFILE.compute_type,
        cpu_threads=2,
        batch_size=LOCAL_CPU_PROFILE.batch_size,
    )


@pytest.mark.parametrize("fixture", ["speech-short", "speech-90s"])
def test_the_default_batched_profile_keeps_wer_within_0_02_of_sequential(
    transcribers, local_cpu_batched, fixtures_dir, word_error_rate, fixture
):
    audio = decode_audio(str(fixtures_dir / f"{fixture}.wav"))
    reference = (fixtures_dir / f"{fixture}.txt").read_text()
    options = {"language": "en", "prompt": None, "word_timestamps": False}

    sequential = transcribers["int8"].transcribe(audio, **options)
    batched = local_cpu_batched.transcribe(audio, **options)

    assert word_error_rate(reference, batched.text) <= (
        word_error_rate(reference, sequential.text) + 0.02
    )


def test_the_batched_profile_calls_the_checkpoint_and_a_raise_stops_the_job(
    local_cpu_batched, fixtures_dir
):
    from gpu_worker.holding import JobCancelled

    path = str(fixtures_dir / "speech-short.wav")
    calls = []
    transcript = local_cpu_batched.transcribe(
        path, language="en", prompt=None, word_timestamps=False, checkpoint=lambda: calls.append(1)
    )
    assert len(calls) == len(transcript.segments) >= 1

    def cancelled():
        raise JobCancelled("job_1 is no longer held by this worker")

    with pytest.raises(JobCancelled):
        local_cpu_batched.transcribe(
            path, language="en", prompt=None, word_timestamps=False, checkpoint=cancelled
        )


def gpu_profile(cpu_env, **settings):
    env = dict(cpu_env)
    env.update({f"MURMUR_{key.upper()}": value for key, value in settings.items()})
    return load_runtime_profile(env, model_names=("tiny.en",), require_identity=False)


@pytest.mark.parametrize(
    ("settings", "backend", "vad_asset"),
    [
        ({}, "faster-whisper", "faster-whisper-silero"),
        ({"device": "cuda", "compute_type": "float16"}, "whisperx", "silero-vad"),
        (
            {"device": "cuda", "compute_type": "float32", "vad": "pyannote"},
            "whisperx",
            "pyannote-vad",
        ),
        ({"alignment_device": "cpu"}, "whisperx", "silero-vad"),
        ({"vad": "pyannote"}, "whisperx", "pyannote-vad"),
    ],
)
def test_backend_and_vad_follow_the_profile(cpu_env, settings, backend, vad_asset):
    profile = gpu_profile(cpu_env, **settings)

    assert backend_for(profile) == backend
    assert vad_asset_for(profile) == vad_asset


def test_cpu_backend_needs_no_extra_packages(cpu_env):
    assert missing_packages(gpu_profile(cpu_env)) == []


def test_whisperx_settings_pass_the_compute_type_explicitly(cpu_env):
    p100 = gpu_profile(cpu_env, device="cuda", compute_type="float32", batch_size="8")

    kwargs = WhisperXSettings.from_profile(p100).load_model_kwargs(english_only=True)

    assert kwargs["compute_type"] == "float32"  # never WhisperX's "default" (float16 on CUDA)
    assert kwargs["device"] == "cuda"
    assert kwargs["language"] == "en"
    assert kwargs["local_files_only"] is True
    assert kwargs["vad_method"] == "silero"
    assert WhisperXSettings.from_profile(p100).batch_size == 8
