"""The loop test and the decoding rule, without a model: pure functions on text and options."""

from __future__ import annotations

import pytest

from gpu_worker.repetition import looped, most_repeated
from gpu_worker.transcriber import DECODING

DEMO_LOOP = (
    "Good morning. Today is the day in Berlin, and I am here. I am here to meet you, and I am "
    "here to meet you, and I am here to meet you."
)


def test_the_demos_shipped_translation_counts_as_looped():
    assert most_repeated(DEMO_LOOP) == 3
    assert looped(DEMO_LOOP, 1.65, DECODING.compression_ratio_threshold)


@pytest.mark.parametrize(
    "text",
    [
        "The quick brown fox jumps over the lazy dog. Please send the report before noon.",
        # A phrase said twice is speech, not a loop.
        "I am here to meet you, and I am here to meet you.",
        "",
    ],
)
def test_ordinary_text_is_not_looped(text):
    assert not looped(text, 1.2, DECODING.compression_ratio_threshold)


def test_case_and_punctuation_do_not_hide_a_loop():
    assert most_repeated("Thank you very much. THANK YOU, very much! thank you very much") == 3


def test_a_compression_ratio_over_the_threshold_is_a_loop_whatever_the_words():
    assert looped("la la la", DECODING.compression_ratio_threshold + 0.1, 2.4)


def test_the_batched_first_pass_and_whisperx_share_one_rule():
    first = DECODING.first_pass()
    whisperx = DECODING.asr_options()
    assert whisperx["temperatures"] == first["temperature"] == list(DECODING.temperatures)
    for key in ("beam_size", "compression_ratio_threshold", "log_prob_threshold"):
        assert whisperx[key] == first[key]
    assert (
        first["condition_on_previous_text"] is False
        and whisperx["condition_on_previous_text"] is False
    )
    again = DECODING.redecode()
    assert again["no_repeat_ngram_size"] == DECODING.redecode_no_repeat_ngram_size > 0
    assert again["log_prob_threshold"] is None


@pytest.mark.parametrize(
    ("temperature", "expected"),
    [
        (None, (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)),
        (0.0, (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)),
        (0.3, (0.3, 0.4, 0.6, 0.8, 1.0)),
        (1.0, (1.0,)),
    ],
)
def test_a_clients_temperature_becomes_the_first_of_the_fallback_list(temperature, expected):
    assert DECODING.with_first_temperature(temperature).temperatures == pytest.approx(expected)


def test_whisperx_gets_the_rule_under_faster_whispers_own_option_names():
    import inspect

    from faster_whisper.transcribe import TranscriptionOptions

    from gpu_worker.transcriber import WhisperXSettings

    settings = WhisperXSettings(
        device="cuda",
        compute_type="float16",
        vad="silero",
        alignment_device="none",
        batch_size=8,
        cpu_threads=0,
    )
    options = settings.load_model_kwargs(english_only=False)["asr_options"]
    assert options == DECODING.asr_options()
    # WhisperX builds faster-whisper's TranscriptionOptions from these: a wrong name fails there.
    assert set(options) <= set(inspect.signature(TranscriptionOptions).parameters)


def test_the_sequential_first_pass_options_are_faster_whispers_transcribe_arguments():
    import inspect

    from faster_whisper import BatchedInferencePipeline, WhisperModel

    for method in (WhisperModel.transcribe, BatchedInferencePipeline.transcribe):
        accepted = set(inspect.signature(method).parameters)
        assert set(DECODING.first_pass()) <= accepted
        assert set(DECODING.redecode()) <= set(
            inspect.signature(WhisperModel.transcribe).parameters
        )
