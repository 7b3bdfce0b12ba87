"""Worker pipeline overhead: Murmur's transcription path vs bare faster-whisper, same model.

Murmur's path is what the `murmur.transcribe` task runs once the audio is downloaded:
`gpu_worker.audio.decode_bounded` (faster-whisper's samples, bounded by the job's length
limit), `FasterWhisperTranscriber.transcribe` (segments into typed records, text join) and
`Transcript.to_json()`. The baseline is `WhisperModel.transcribe`
on the file with the same options, segments materialised. Both use the one loaded model,
runs alternate, and the medians are compared; the target ratio is <= 1.05.

    .venv/bin/python bench/pipeline_overhead.py [--compute-type int8] [--runs 5]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package; run from anywhere

importlib.import_module("gpu_worker")  # first: pins the hub offline before faster-whisper

from gpu_worker.audio import DEFAULT_MAX_SECONDS, decode_bounded  # noqa: E402
from gpu_worker.manifest import load_manifest, verify_asset  # noqa: E402
from gpu_worker.transcriber import BEAM_SIZE, FasterWhisperTranscriber  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audio", type=Path, default=REPO / "tests/fixtures/speech-90s.wav")
    parser.add_argument("--compute-type", default="int8", choices=["int8", "float32"])
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    model_dir = verify_asset(load_manifest().asset("tiny.en")).root
    transcriber = FasterWhisperTranscriber(
        model_dir, compute_type=args.compute_type, cpu_threads=args.cpu_threads
    )
    audio_path = str(args.audio)

    def murmur() -> str:
        samples = decode_bounded(audio_path, DEFAULT_MAX_SECONDS)
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
    murmur_times, bare_times = [], []
    for _ in range(args.runs):
        murmur_times.append(timed(murmur)[0])
        bare_times.append(timed(bare)[0])

    murmur_median = statistics.median(murmur_times)
    bare_median = statistics.median(bare_times)
    ratio = murmur_median / bare_median
    print(f"audio: {args.audio.name}, tiny.en {args.compute_type}, {args.cpu_threads} threads")
    print(f"murmur  median {murmur_median:.3f} s  runs {[round(t, 3) for t in murmur_times]}")
    print(f"bare    median {bare_median:.3f} s  runs {[round(t, 3) for t in bare_times]}")
    print(f"ratio   {ratio:.3f} (target <= 1.05)")
    print(f"same text: {murmur_text == bare_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
