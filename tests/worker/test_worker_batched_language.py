"""The batched pipeline detects the language from its first batch's own encoding
(gpu_worker/batched.py), with real faster-whisper and Whisper base: the same language and the
same text as faster-whisper's own batched pipeline, one encoder pass fewer."""

from __future__ import annotations

from pathlib import Path

import pytest
from faster_whisper import BatchedInferencePipeline, WhisperModel, decode_audio

from gpu_worker.batched import LanguageInBatch, chosen_language
from gpu_worker.manifest import load_manifest, verify_asset
from gpu_worker.transcriber import DECODING

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
CLIPS = {
    "de": REPO / "samples" / "guten-morgen.wav",
    "es": FIXTURES / "speech-es.wav",
    "en": FIXTURES / "speech-short.wav",
}


def test_chunks_vote_with_their_seconds_of_speech():
    short_english = [("<|en|>", 0.9), ("<|de|>", 0.1)]
    long_german = [("<|de|>", 0.8), ("<|en|>", 0.2)]
    language, probability, ranking = chosen_language([short_english, long_german], [1.0, 29.0])
    assert language == "de"
    assert probability == pytest.approx((0.1 * 1 + 0.8 * 29) / 30)
    assert [code for code, _ in ranking] == ["de", "en"]
    assert sum(p for _, p in ranking) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def base_model() -> WhisperModel:
    root = verify_asset(load_manifest().asset("base")).root
    return WhisperModel(str(root), compute_type="int8", cpu_threads=2, local_files_only=True)


def run(pipeline: BatchedInferencePipeline, path: Path, **options) -> tuple[str, object]:
    segments, info = pipeline.transcribe(
        decode_audio(str(path)), batch_size=8, **DECODING.first_pass(), **options
    )
    text = " ".join(segment.text for segment in segments)  # read to the end first
    return text, info


pytestmark = pytest.mark.slow


@pytest.mark.parametrize("expected", sorted(CLIPS))
def test_the_language_and_text_are_faster_whispers_own(base_model, expected):
    ours, our_info = run(LanguageInBatch(base_model), CLIPS[expected], word_timestamps=True)
    theirs, their_info = run(
        BatchedInferencePipeline(base_model), CLIPS[expected], word_timestamps=True
    )
    assert our_info.language == their_info.language == expected
    assert our_info.language_probability > 0.5
    assert our_info.all_language_probs[0] == (expected, our_info.language_probability)
    assert ours == theirs


def test_one_encoder_pass_per_batch_instead_of_two(base_model, monkeypatch):
    calls: list[int] = []
    encode = WhisperModel.encode

    def counted(self, features):
        calls.append(features.shape[0] if features.ndim == 3 else 1)
        return encode(self, features)

    monkeypatch.setattr(WhisperModel, "encode", counted)
    speech_90s = FIXTURES / "speech-90s.wav"
    run(BatchedInferencePipeline(base_model), speech_90s)
    theirs = list(calls)
    calls.clear()
    run(LanguageInBatch(base_model), speech_90s)
    # speech-90s is four VAD chunks in one batch; faster-whisper also encodes 30 s to detect.
    assert theirs == [1, 4]
    assert calls == [4]
    assert "encode" not in vars(base_model)  # the shadowing ends with the batch


def test_a_translation_detects_the_spoken_language(base_model):
    text, info = run(LanguageInBatch(base_model), CLIPS["de"], task="translate")
    assert info.language == "de"
    assert text.lower().lstrip().startswith("good morning")


def test_a_given_language_is_not_detected(base_model):
    _text, info = run(LanguageInBatch(base_model), CLIPS["es"], language="es")
    assert (info.language, info.language_probability) == ("es", 1)


def test_no_speech_gets_faster_whispers_answer_for_empty_audio(base_model):
    silence = FIXTURES / "silence-5s.wav"
    ours, our_info = run(LanguageInBatch(base_model), silence)
    theirs, their_info = run(BatchedInferencePipeline(base_model), silence)
    assert ours == theirs == ""
    assert our_info.language == their_info.language
    assert our_info.language_probability == pytest.approx(their_info.language_probability)
