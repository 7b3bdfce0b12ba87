"""Worker pipeline overhead: Murmur's transcription path vs bare faster-whisper, same model.

Murmur's path is what the `murmur.transcribe` task runs once the audio is downloaded:
`gpu_worker.audio.decode_bounded` (faster-whisper's samples, bounded by the job's length
limit), `FasterWhisperTranscriber.transcribe` (segments into typed records, text join) and
`Transcript.to_json()`. The baseline is `WhisperModel.transcribe`
on the file with the same options, segments materialised. Both use the one loaded model,
runs alternate, and the medians are compared; the target ratio is <= 1.05.

The same run also times Murmur's path at the `local-cpu` profile's batch size (faster-whisper's
BatchedInferencePipeline on the same model) against that bare sequential baseline: the
throughput target is >= 1.6x, with WER on both speech fixtures within +0.02 of sequential.

    .venv/bin/python bench/pipeline_overhead.py [--compute-type int8] [--runs 5] [--batch-size N]
                                                [--smoke]
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package; run from anywhere

importlib.import_module("gpu_worker")  # first: pins the hub offline before faster-whisper

import jiwer  # noqa: E402

from app.config import LOCAL_CPU_PROFILE  # noqa: E402
from gpu_worker.audio import decode_bounded  # noqa: E402
from gpu_worker.manifest import load_manifest, verify_asset  # noqa: E402
from gpu_worker.protocol.claim import DEFAULT_MAX_AUDIO_SECONDS  # noqa: E402
from gpu_worker.transcriber import BEAM_SIZE, FasterWhisperTranscriber  # noqa: E402

FIXTURES = REPO / "tests/fixtures"


def word_error_rate(reference: str, hypothesis: str) -> float:
    """As tests/worker/conftest.py scores it: lower-cased, punctuation dropped."""

    def words(text: str) -> str:
        return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())

    return float(jiwer.wer(words(reference), words(hypothesis)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audio", type=Path, default=REPO / "tests/fixtures/speech-90s.wav")
    parser.add_argument("--compute-type", default="int8", choices=["int8", "float32"])
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=LOCAL_CPU_PROFILE.batch_size)
    parser.add_argument("--smoke", action="store_true", help="CI: speech-short, one run each")
    args = parser.parse_args()
    if args.smoke:
        args.audio, args.runs = REPO / "tests/fixtures/speech-short.wav", 1

    model_dir = verify_asset(load_manifest().asset("tiny.en")).root
    transcriber = FasterWhisperTranscriber(
        model_dir, compute_type=args.compute_type, cpu_threads=args.cpu_threads
    )
    # The profile's batched path: the same model files, loaded as the worker loads them.
    batched = FasterWhisperTranscriber(
        model_dir,
        compute_type=args.compute_type,
        cpu_threads=args.cpu_threads,
        batch_size=args.batch_size,
    )
    audio_path = str(args.audio)

    def murmur_batched() -> str:
        samples = decode_bounded(audio_path, DEFAULT_MAX_AUDIO_SECONDS)
        transcript = batched.transcribe(samples, language="en", prompt=None, word_timestamps=False)
        transcript.to_json()
        return transcript.text

    def murmur() -> str:
        samples = decode_bounded(audio_path, DEFAULT_MAX_AUDIO_SECONDS)
        transcript = transcriber.transcribe(
            samples, language="en", prompt=None, word_timestamps=False
        )
        transcript.to_json()
        return transcript.text

    def bare() -> str:
        segments, _ = transcriber.model.transcribe(
            audio_path,
            language="en",
            beam_size=BEAM_SIZE,
            vad_filter=True,
            condition_on_previous_text=False,
        )
        return "".join(segment.text for segment in segments).strip()

    def timed(run) -> tuple[float, str]:
        started = time.perf_counter()
        text = run()
        return time.perf_counter() - started, text

    # One warm-up each (first-call allocations, ONNX VAD session), then alternate.
    murmur_text, bare_text = murmur(), bare()
    murmur_batched()
    murmur_times, bare_times, batched_times = [], [], []
    for _ in range(args.runs):
        murmur_times.append(timed(murmur)[0])
        bare_times.append(timed(bare)[0])
        batched_times.append(timed(murmur_batched)[0])

    murmur_median = statistics.median(murmur_times)
    bare_median = statistics.median(bare_times)
    ratio = murmur_median / bare_median
    print(f"audio: {args.audio.name}, tiny.en {args.compute_type}, {args.cpu_threads} threads")
    print(f"murmur  median {murmur_median:.3f} s  runs {[round(t, 3) for t in murmur_times]}")
    print(f"bare    median {bare_median:.3f} s  runs {[round(t, 3) for t in bare_times]}")
    print(f"ratio   {ratio:.3f} (target <= 1.05)")
    print(f"same text: {murmur_text == bare_text}")
    batched_median = statistics.median(batched_times)
    speed_up = bare_median / batched_median
    print(f"batched median {batched_median:.3f} s  runs {[round(t, 3) for t in batched_times]}")
    print(f"throughput batch {args.batch_size} / bare sequential: {speed_up:.2f}x (target >= 1.6)")
    # WER of the profile's batched path against the sequential path, on both speech fixtures.
    for fixture in ("speech-short",) if args.smoke else ("speech-short", "speech-90s"):
        reference = (FIXTURES / f"{fixture}.txt").read_text()
        samples = decode_bounded(str(FIXTURES / f"{fixture}.wav"), DEFAULT_MAX_AUDIO_SECONDS)
        options = {"language": "en", "prompt": None, "word_timestamps": False}
        sequential_wer = word_error_rate(reference, transcriber.transcribe(samples, **options).text)
        batched_wer = word_error_rate(reference, batched.transcribe(samples, **options).text)
        print(
            f"WER {fixture}: sequential {sequential_wer:.4f}, batch {args.batch_size} "
            f"{batched_wer:.4f} ({batched_wer - sequential_wer:+.4f}, target <= +0.02)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
