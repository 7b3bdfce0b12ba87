"""WhisperX backend on the CPU, in one run: overhead vs bare whisperx, vs faster-whisper, WER.

1. Murmur's WhisperX path (the task's `decode_bounded`, `WhisperXTranscriber.transcribe`,
   `to_json()`) against bare whisperx built with `whisperx.load_model` on the same model
   directory, VAD and batch size, on the same file decoded by faster-whisper's `decode_audio`
   (`whisperx.load_audio` needs an ffmpeg binary).
   Runs alternate; target ratio of medians <= 1.05. Bare whisperx's own Silero loads from
   torch.hub (offline: fails), so its Silero baseline gets the same packaged-Silero VAD
   instance the worker builds; pyannote is WhisperX's own.
2. The WhisperX backend against the faster-whisper backend (the CPU worker's, sequential and at
   the same batch size) on the same audio.
3. WER on tests/fixtures for each VAD and batch size (1 and the chosen one).

Silero runs on --audio (speech-90s.wav); pyannote on --pyannote-audio (speech-short.wav):
pyannote slides a 10 s window in 1 s steps, about 30 s of CPU per run on speech-90s, and on a
shared 2-core machine its run-to-run spread swamps any overhead figure.

Needs the real-library venv (`make test-whisperx` builds it):

    .venv-whisperx/bin/python bench/whisperx_overhead.py [--runs 3] [--batch-size 8] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package; run from anywhere

importlib.import_module("gpu_worker")  # first: pins the hub offline before any model library

import jiwer  # noqa: E402
from faster_whisper import decode_audio  # noqa: E402

from gpu_worker.audio import decode_bounded  # noqa: E402
from gpu_worker.manifest import load_manifest, verify_asset  # noqa: E402
from gpu_worker.protocol.claim import DEFAULT_MAX_AUDIO_SECONDS  # noqa: E402
from gpu_worker.transcriber import (  # noqa: E402
    CHUNK_SECONDS,
    VAD_ONSET,
    FasterWhisperTranscriber,
    WhisperXSettings,
    WhisperXTranscriber,
)

FIXTURES = REPO / "tests/fixtures"


def word_error_rate(reference: str, hypothesis: str) -> float:
    """As the tests score it: lower-cased, punctuation dropped."""

    def words(text: str) -> str:
        return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())

    return float(jiwer.wer(words(reference), words(hypothesis)))


def medians(runs: dict[str, Callable[[], Any]], count: int) -> dict[str, list[float]]:
    """One warm-up each, then `count` rounds alternating between the callables."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(count):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return times


def show(times: dict[str, list[float]], baseline: str) -> None:
    base = statistics.median(times[baseline])
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"  {name:<34} median {median:6.2f} s  ratio to {baseline}: {median / base:.3f}  "
            f"runs {[round(v, 2) for v in values]}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audio", type=Path, default=FIXTURES / "speech-90s.wav")
    parser.add_argument("--pyannote-audio", type=Path, default=FIXTURES / "speech-short.wav")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--smoke", action="store_true", help="CI: Silero on speech-short, one run, no WER table"
    )
    args = parser.parse_args()
    vads = ("silero",) if args.smoke else ("pyannote", "silero")
    if args.smoke:
        args.audio, args.runs = FIXTURES / "speech-short.wav", 1
        if importlib.util.find_spec("whisperx") is None:
            print(
                "whisperx is not installed in this interpreter (it needs the real-library venv, "
                "`make test-whisperx`): smoke checked the imports and arguments only"
            )
            return 0

    import whisperx

    model_dir = verify_asset(load_manifest().asset("tiny.en")).root
    audio_for = {"silero": str(args.audio), "pyannote": str(args.pyannote_audio)}
    print(
        f"tiny.en int8, CPU, {args.cpu_threads} threads, batch {args.batch_size}, {args.runs} runs;"
        f" silero on {args.audio.name}, pyannote on {args.pyannote_audio.name}"
    )

    def whisperx_backend(vad: str, batch_size: int) -> WhisperXTranscriber:
        settings = WhisperXSettings(
            device="cpu",
            compute_type="int8",
            vad=vad,
            alignment_device="none",
            batch_size=batch_size,
            cpu_threads=args.cpu_threads,
        )
        return WhisperXTranscriber(
            model_dir, settings=settings, alignment_dir=None, model_name="tiny.en"
        )

    def murmur(transcriber: Any, audio_path: str) -> Callable[[], str]:
        def run() -> str:
            samples = decode_bounded(audio_path, DEFAULT_MAX_AUDIO_SECONDS)
            transcript = transcriber.transcribe(
                samples, language="en", prompt=None, word_timestamps=False
            )
            transcript.to_json()
            return str(transcript.text)

        return run

    backends = {vad: whisperx_backend(vad, args.batch_size) for vad in vads}

    print("1. WhisperX backend vs bare whisperx (same model, VAD, batch size; target <= 1.05)")
    for vad, backend in backends.items():
        bare_pipeline = whisperx.load_model(
            str(model_dir),
            device="cpu",
            compute_type="int8",
            language="en",
            vad_method=vad,
            vad_model=backend._pipeline.vad_model if vad == "silero" else None,
            vad_options={"chunk_size": CHUNK_SECONDS, "vad_onset": VAD_ONSET},
            threads=args.cpu_threads,
            local_files_only=True,
        )

        def bare(pipeline: Any = bare_pipeline, audio_path: str = audio_for[vad]) -> str:
            result = pipeline.transcribe(
                decode_audio(audio_path),
                batch_size=args.batch_size,
                language="en",
                chunk_size=CHUNK_SECONDS,
            )
            return "".join(segment["text"] for segment in result["segments"])

        print(f" VAD {vad} on {Path(audio_for[vad]).name}:")
        runs = {"bare whisperx": bare, "murmur whisperx": murmur(backend, audio_for[vad])}
        show(medians(runs, args.runs), "bare whisperx")

    print("2. WhisperX backend vs faster-whisper backend (the CPU worker's), same audio")
    faster = {
        f"faster-whisper batch {size}": FasterWhisperTranscriber(
            model_dir, compute_type="int8", cpu_threads=args.cpu_threads, batch_size=size
        )
        for size in (1, args.batch_size)
    }
    for vad, backend in backends.items():
        print(f" on {Path(audio_for[vad]).name}:")
        runs = {name: murmur(t, audio_for[vad]) for name, t in faster.items()}
        runs[f"whisperx {vad} batch {args.batch_size}"] = murmur(backend, audio_for[vad])
        show(medians(runs, args.runs), "faster-whisper batch 1")

    print("3. WER on the fixtures (sequential faster-whisper first, for reference)")
    for fixture in ("speech-short",) if args.smoke else ("speech-short", "speech-90s"):
        reference = (FIXTURES / f"{fixture}.txt").read_text()
        audio = decode_audio(str(FIXTURES / f"{fixture}.wav"))
        options = {"language": "en", "prompt": None, "word_timestamps": False}
        sequential = faster["faster-whisper batch 1"].transcribe(audio, **options).text
        scores = [f"faster-whisper batch 1 {word_error_rate(reference, sequential):.4f}"]
        for vad in vads:
            for size in (1, args.batch_size):
                backend = backends[vad] if size == args.batch_size else whisperx_backend(vad, size)
                text = backend.transcribe(audio, **options).text
                scores.append(f"{vad} batch {size} {word_error_rate(reference, text):.4f}")
        print(f"  {fixture}: " + "; ".join(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
