"""No decoding loops on a corpus built to provoke them, with real faster-whisper and Whisper base.

The default CPU profile (batched) decodes the demo's German sample (translated and
transcribed), silence, music-like tones over noise and a long monotone hum around speech; no
4-word sequence may come back 3 times unless the reference text says it 3 times. The checks
here count words themselves, independently of gpu_worker/repetition.py.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from faster_whisper import BatchedInferencePipeline, decode_audio

from gpu_worker.manifest import load_manifest, verify_asset
from gpu_worker.transcriber import DECODING, SAMPLE_RATE, FasterWhisperTranscriber

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GERMAN = REPO / "samples" / "guten-morgen.wav"


def repeats(text: str) -> int:
    """How often the most frequent 4-word run occurs (lower-cased, punctuation dropped)."""
    words = re.sub(r"[^\w' ]+", " ", text.lower()).split()
    runs = Counter(tuple(words[i : i + 4]) for i in range(len(words) - 3))
    return max(runs.values(), default=0)


def allowed(reference: str) -> int:
    return max(2, repeats(reference))


@pytest.fixture(scope="module")
def base_dir() -> Path:
    from app.config import LOCAL_CPU_PROFILE

    return verify_asset(load_manifest().asset(LOCAL_CPU_PROFILE.model)).root


@pytest.fixture(scope="module")
def default_profile(base_dir):
    from app.config import LOCAL_CPU_PROFILE

    return FasterWhisperTranscriber(
        base_dir,
        compute_type=LOCAL_CPU_PROFILE.compute_type,
        cpu_threads=2,
        batch_size=LOCAL_CPU_PROFILE.batch_size,
        model_name=LOCAL_CPU_PROFILE.model,
    )


def music_like(seconds: float) -> np.ndarray:
    """Chords of harmonics with a tremolo over quiet noise: what makes Whisper write lyrics."""
    rng = np.random.default_rng(33)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    audio = np.zeros_like(t)
    for bar, root in enumerate((220.0, 196.0, 174.6, 246.9) * int(seconds // 8 + 1)):
        span = (t >= bar * 2.0) & (t < bar * 2.0 + 2.0)
        for ratio in (1.0, 1.25, 1.5, 2.0):
            audio[span] += np.sin(2 * np.pi * root * ratio * t[span]) / (4 * ratio)
    audio *= 0.6 + 0.4 * np.sin(2 * np.pi * 4.0 * t)
    audio += 0.05 * rng.standard_normal(t.shape)
    return (0.5 * audio / np.abs(audio).max()).astype(np.float32)


def monotone_around(speech: np.ndarray, seconds: float) -> np.ndarray:
    """A steady 120 Hz hum with harmonics for `seconds`, the speech in its middle."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    hum = sum(np.sin(2 * np.pi * 120.0 * k * t) / k for k in (1, 2, 3)) * 0.05
    audio = hum.astype(np.float32)
    middle = (audio.shape[0] - speech.shape[0]) // 2
    audio[middle : middle + speech.shape[0]] += speech
    return audio


def test_the_engines_batched_first_pass_loops_on_the_demo_translation(base_dir, default_profile):
    # Why the guard exists: faster-whisper's batched pipeline honours only the first
    # temperature, so nothing of its own catches this loop.
    batched = BatchedInferencePipeline(default_profile.model)
    pieces, _info = batched.transcribe(
        decode_audio(str(GERMAN)),
        batch_size=8,
        task="translate",
        vad_filter=True,
        **DECODING.first_pass(),
    )
    assert repeats(" ".join(piece.text for piece in pieces)) >= 3


@pytest.mark.parametrize("cpu_threads", [1, 2])
def test_the_demos_german_translation_is_english_without_a_loop(base_dir, cpu_threads):
    transcriber = FasterWhisperTranscriber(
        base_dir, compute_type="int8", cpu_threads=cpu_threads, batch_size=8, model_name="base"
    )
    for words in (False, True):
        transcript = transcriber.transcribe(
            str(GERMAN), language=None, prompt=None, word_timestamps=words, task="translate"
        )
        assert transcript.language == "de"
        assert transcript.text.lower().startswith("good morning")
        assert "berlin" in transcript.text.lower()
        assert repeats(transcript.text) <= 2, transcript.text


def test_the_demos_german_transcription_has_no_loop(default_profile):
    reference = GERMAN.with_suffix(".txt").read_text()
    transcript = default_profile.transcribe(
        str(GERMAN), language=None, prompt=None, word_timestamps=True
    )
    assert transcript.language == "de"
    assert "berlin" in transcript.text.lower()
    assert repeats(transcript.text) <= allowed(reference), transcript.text


def test_silence_gives_no_text(default_profile):
    transcript = default_profile.transcribe(
        str(REPO / "tests/fixtures/silence-5s.wav"),
        language=None,
        prompt=None,
        word_timestamps=True,
    )
    assert transcript.text == ""


def test_music_like_noise_alone_gives_no_text(default_profile):
    # The VAD-bounded windows are the first guard: tones over noise are not speech.
    transcript = default_profile.transcribe(
        music_like(40.0), language=None, prompt=None, word_timestamps=True
    )
    assert transcript.text == ""


@pytest.mark.parametrize("task", ["transcribe", "translate"])
def test_speech_over_music_like_noise_gives_no_loop(default_profile, task):
    # Speech makes VAD pass a window, so the music under it reaches the decoder.
    audio = music_like(40.0)
    speech = decode_audio(str(REPO / "tests/fixtures/speech-short.wav"))
    audio[10 * SAMPLE_RATE : 10 * SAMPLE_RATE + speech.shape[0]] += speech
    transcript = default_profile.transcribe(
        audio, language=None, prompt=None, word_timestamps=True, task=task
    )
    assert transcript.text, "the decoder never ran: the test would prove nothing"
    assert repeats(transcript.text) <= 2, transcript.text


def test_a_long_monotone_hum_around_speech_gives_no_loop(default_profile, word_error_rate):
    fixtures = REPO / "tests/fixtures"
    reference = (fixtures / "speech-short.txt").read_text()
    audio = monotone_around(decode_audio(str(fixtures / "speech-short.wav")), 120.0)
    transcript = default_profile.transcribe(audio, language="en", prompt=None, word_timestamps=True)
    assert repeats(transcript.text) <= allowed(reference), transcript.text
    assert word_error_rate(reference, transcript.text) <= 0.35, transcript.text
