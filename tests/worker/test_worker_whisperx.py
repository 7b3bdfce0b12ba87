"""WhisperXTranscriber's CUDA branches and wav2vec2 alignment, with stand-ins for the libraries.

Only what the real-library tier (tests/whisperx, real whisperx, pyannote and Silero on the
CPU) cannot reach stays here: the CUDA device and memory branches (no GPU in CI) and
alignment (no wav2vec2 model in CI). The stand-ins' assumptions about WhisperX's API (call
signatures, the pipeline's options, the Silero subclass) are checked there against the real
packages; bench/gpu_check.py runs the CUDA path on a GPU.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from gpu_worker.transcriber import WhisperXSettings, WhisperXTranscriber


@dataclass(frozen=True)
class Options:
    initial_prompt: str | None = None
    beam_size: int = 5
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4)


@dataclass
class Calls:
    load_model: dict = field(default_factory=dict)
    asr_model: dict = field(default_factory=dict)
    prompts_seen: list = field(default_factory=list)
    temperatures_seen: list = field(default_factory=list)
    align_model: dict = field(default_factory=dict)
    aligned: int = 0
    sequential: list = field(default_factory=list)
    threads: list = field(default_factory=list)
    empty_cache: int = 0


@pytest.fixture
def fake_stack(monkeypatch):
    calls = Calls()

    torch = types.ModuleType("torch")
    torch._threads = 8
    torch.get_num_threads = lambda: torch._threads
    torch.set_num_threads = lambda n: (calls.threads.append(n), setattr(torch, "_threads", n))
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: True,
        empty_cache=lambda: setattr(calls, "empty_cache", calls.empty_cache + 1),
    )

    silero_vad = types.ModuleType("silero_vad")

    def load_silero_vad(onnx=False):
        assert onnx is False
        torch._threads = 1  # what `import silero_vad` does to the process
        return "packaged-jit"

    silero_vad.load_silero_vad = load_silero_vad
    silero_vad.get_speech_timestamps = lambda *a, **k: []

    vads = types.ModuleType("whisperx.vads")

    class Vad:
        def __init__(self, vad_onset):
            self.vad_onset = vad_onset

    class Silero(Vad):
        def __init__(self, **kwargs):
            raise AssertionError("WhisperX's own Silero loads from torch.hub")

    vads.Vad, vads.Silero = Vad, Silero

    class AsrModel:
        def __init__(self, path, **kwargs):
            calls.asr_model = {"path": path, **kwargs}
            self.model = types.SimpleNamespace(is_multilingual=False)

        def transcribe(self, audio, **kwargs):
            calls.sequential.append(kwargs)
            word = types.SimpleNamespace(word=" hi", start=0.1, end=0.4, probability=0.9)
            segment = types.SimpleNamespace(
                start=0.0,
                end=0.5,
                text=" hi",
                tokens=[1, 2],
                avg_logprob=-0.1,
                no_speech_prob=0.01,
                compression_ratio=1.0,
                temperature=0.0,
                words=[word],
            )
            info = types.SimpleNamespace(language="en", duration=audio.shape[0] / 16000)
            return iter([segment]), info

    asr = types.ModuleType("whisperx.asr")
    asr.WhisperModel = AsrModel

    class Pipeline:
        def __init__(self, model):
            self.model = model
            self.options = Options()

        def transcribe(
            self, audio, batch_size, language, chunk_size, task=None, progress_callback=None
        ):
            calls.prompts_seen.append(self.options.initial_prompt)
            calls.temperatures_seen.append(tuple(self.options.temperatures))
            for percent in (50.0, 100.0):  # WhisperX calls it after every batch
                if progress_callback is not None:
                    progress_callback(percent)
            return {
                "language": language,
                "segments": [
                    {"text": " Hello there", "start": 0.0, "end": 1.0, "avg_logprob": -0.2},
                    {"text": " 42 cats.", "start": 1.2, "end": 2.0, "avg_logprob": -0.3},
                ],
            }

    whisperx = types.ModuleType("whisperx")

    def load_model(whisper_arch, **kwargs):
        calls.load_model = {"whisper_arch": whisper_arch, **kwargs}
        return Pipeline(kwargs["model"])

    def load_align_model(**kwargs):
        calls.align_model = kwargs
        return "align-model", {"language": "en"}

    def align(segments, model, metadata, audio, device, return_char_alignments):
        calls.aligned += 1
        words = [
            [{"word": "Hello", "start": 0.0, "end": 0.4, "score": 0.9}, {"word": "there"}],
            [{"word": "42"}, {"word": "cats.", "start": 1.5, "end": 1.9, "score": 0.8}],
        ]
        return {"segments": [{**s, "words": w} for s, w in zip(segments, words, strict=True)]}

    whisperx.load_model = load_model
    whisperx.load_align_model = load_align_model
    whisperx.align = align
    whisperx.asr, whisperx.vads = asr, vads

    nltk = types.ModuleType("nltk")
    nltk.data = types.SimpleNamespace(find=lambda path: path)

    for name, module in {
        "torch": torch,
        "silero_vad": silero_vad,
        "whisperx": whisperx,
        "whisperx.asr": asr,
        "whisperx.vads": vads,
        "nltk": nltk,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return calls


def settings(**overrides):
    values = {
        "device": "cuda",
        "compute_type": "float32",
        "vad": "silero",
        "alignment_device": "none",
        "batch_size": 8,
        "cpu_threads": 0,
    }
    values.update(overrides)
    return WhisperXSettings(**values)


AUDIO = np.zeros(32000, dtype=np.float32)


def build(fake_stack, **overrides):
    return WhisperXTranscriber(
        Path("/models/tiny.en"),
        settings=settings(**overrides),
        alignment_dir=Path("/opt/murmur/assets/wav2vec2"),
        model_name="tiny.en",
    )


def test_on_cuda_the_model_and_pipeline_get_the_device_and_explicit_compute_type(fake_stack):
    build(fake_stack)

    assert fake_stack.asr_model == {
        "path": "/models/tiny.en",
        "device": "cuda",
        "compute_type": "float32",
        "cpu_threads": 0,
        "local_files_only": True,
    }
    loaded = fake_stack.load_model
    assert (loaded["device"], loaded["compute_type"]) == ("cuda", "float32")


def test_words_come_from_alignment_and_unaligned_words_are_filled(fake_stack):
    transcriber = build(fake_stack, alignment_device="cuda")

    transcript = transcriber.transcribe(AUDIO, language="en", prompt=None, word_timestamps=True)

    assert fake_stack.align_model == {
        "language_code": "en",
        "device": "cuda",
        "model_dir": "/opt/murmur/assets/wav2vec2",
        "model_cache_only": True,
    }
    assert fake_stack.aligned == 1
    words = [(w.word, w.start, w.end) for s in transcript.segments for w in s.words]
    assert words == [
        ("Hello", 0.0, 0.4),
        ("there", 0.4, 0.4),  # no time from wav2vec2: the previous word's end
        ("42", 1.2, 1.2),  # numerals cannot be aligned: the segment start
        ("cats.", 1.5, 1.9),
    ]


def test_memory_is_released_between_jobs_on_cuda(fake_stack):
    transcriber = build(fake_stack)

    transcriber.release_memory()

    assert fake_stack.empty_cache == 1


def test_the_checkpoint_runs_between_batches_and_can_stop_the_job(fake_stack):
    from gpu_worker.holding import JobCancelled

    transcriber = build(fake_stack)
    calls = []
    transcriber.transcribe(
        AUDIO, language="en", prompt=None, word_timestamps=False, checkpoint=lambda: calls.append(1)
    )
    assert len(calls) == 2

    def cancelled():
        raise JobCancelled("job_1 is no longer held by this worker")

    with pytest.raises(JobCancelled):
        transcriber.transcribe(
            AUDIO, language="en", prompt=None, word_timestamps=False, checkpoint=cancelled
        )


def test_a_job_without_vad_decodes_sequentially_and_a_temperature_starts_its_fallback(fake_stack):
    """vad_filter=false: the batched pass cuts at VAD chunks, so the resident model decodes the
    whole audio without VAD; a temperature starts the fallback ladder (DECODING's steps above
    it) for that job only."""
    transcriber = build(fake_stack)

    transcriber.transcribe(
        AUDIO, language="en", prompt=None, word_timestamps=False, vad_filter=False, temperature=0.6
    )
    sequential = [(c["vad_filter"], c["temperature"]) for c in fake_stack.sequential]
    assert sequential == [(False, [0.6, 0.8, 1.0])]
    assert fake_stack.temperatures_seen == []

    transcriber.transcribe(
        AUDIO, language="en", prompt=None, word_timestamps=False, temperature=0.6
    )
    transcriber.transcribe(AUDIO, language="en", prompt=None, word_timestamps=False)
    assert fake_stack.temperatures_seen == [(0.6, 0.8, 1.0), (0.0, 0.2, 0.4)]
    assert len(fake_stack.sequential) == 1
