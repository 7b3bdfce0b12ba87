"""A long file in parts against the same file whole: latency on W workers, extra work, accuracy.

The real path of issue 34, in one process on one CPU thread: the control plane's loudness pass
and cut planner (app/jobs/loudness.py, app/jobs/cuts.py) on the file, each part decoded and
transcribed as a worker does it (gpu_worker/parts.py: the whole file decoded, the span plus
the overlap transcribed, times shifted), the parts stitched (app/jobs/stitch.py); and the
same file decoded and transcribed whole by the same transcriber, alternating, medians.

Measured per run: `whole_s` (one worker, the whole file), each part's seconds, and the
loudness pass. Latency on W workers is then the makespan of the parts' measured times laid
on W workers in order as free workers take the queue's next message (what the fleet does),
plus the loudness pass; `work_ratio` is the parts' summed seconds over `whole_s` (what cutting
costs in worker time), `wer_parts` and `wer_whole` the accuracy against the fixture's text.

    .venv/bin/python bench/long_file_parts.py [--minutes 12] [--part-seconds 60,120,300]
                                              [--workers 2,4] [--runs 3] [--model tiny.en]
                                              [--smoke]
Figures: docs/performance.md, "Long files in parts".
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package; run from anywhere

importlib.import_module("gpu_worker")  # first: pins the hub offline before faster-whisper

from app.jobs.cuts import OVERLAP_SECONDS, plan_spans  # noqa: E402
from app.jobs.loudness import measure_loudness  # noqa: E402
from app.jobs.stitch import PartTranscript, stitch  # noqa: E402
from gpu_worker.audio import decode_bounded  # noqa: E402
from gpu_worker.manifest import load_manifest, verify_asset  # noqa: E402
from gpu_worker.parts import shifted, span_samples  # noqa: E402
from gpu_worker.protocol.claim import ClaimedPart  # noqa: E402
from gpu_worker.transcriber import FasterWhisperTranscriber  # noqa: E402
from tests.test_pipeline import wer  # noqa: E402

SPEECH = REPO / "tests/fixtures/speech-90s.wav"
TRUTH = (REPO / "tests/fixtures/speech-90s.txt").read_text().strip()


def long_file(minutes: float, workdir: Path) -> tuple[Path, str]:
    with wave.open(str(SPEECH)) as src:
        params, frames = src.getparams(), src.readframes(src.getnframes())
        one = src.getnframes() / src.getframerate()
    repeats = max(1, round(minutes * 60 / one))
    path = workdir / f"long-{repeats}.wav"
    with wave.open(str(path), "wb") as out:
        out.setparams(params)
        for _ in range(repeats):
            out.writeframes(frames)
    return path, " ".join([TRUTH] * repeats)


def makespan(seconds: list[float], workers: int) -> float:
    """When the last part ends, parts taken in order by whichever worker is free first."""
    free = [0.0] * workers
    for s in seconds:
        start = min(free)
        free[free.index(start)] = start + s
    return max(free)


def run_parts(
    transcriber: FasterWhisperTranscriber, path: Path, part_seconds: float
) -> tuple[float, list[float], str]:
    started = time.perf_counter()
    whole_audio = decode_bounded(path, 4 * 3600)
    duration = whole_audio.shape[0] / 16000
    loudness = measure_loudness(path, duration + 1)
    spans = plan_spans(duration, loudness, part_seconds)
    cut_s = time.perf_counter() - started
    times, done = [], []
    for span in spans:
        started = time.perf_counter()
        samples = decode_bounded(path, 4 * 3600)  # each worker decodes the file it downloads
        last = span.index == len(spans) - 1
        until = span.end if last else min(duration, span.end + OVERLAP_SECONDS)
        part = ClaimedPart(
            index=span.index, count=len(spans), offset_seconds=span.start, until_seconds=until
        )
        heard = transcriber.transcribe(
            span_samples(samples, part), language=None, prompt=None, word_timestamps=True
        )
        transcript = shifted(heard, span.start).model_dump(exclude_none=True)
        times.append(time.perf_counter() - started)
        done.append(PartTranscript(span, transcript))
    return cut_s, times, str(stitch(done, duration, None)["text"])


def run_whole(transcriber: FasterWhisperTranscriber, path: Path) -> tuple[float, str]:
    started = time.perf_counter()
    samples = decode_bounded(path, 4 * 3600)
    text = transcriber.transcribe(samples, language=None, prompt=None, word_timestamps=True).text
    return time.perf_counter() - started, text


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--part-seconds", default="60,120,300")
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="CI: 2 min in 60 s parts, 1 run")
    args = parser.parse_args()
    if args.smoke:
        args.minutes, args.part_seconds, args.runs, args.workers = 2.0, "60", 1, "2"
    model = verify_asset(load_manifest().asset(args.model)).root
    transcriber = FasterWhisperTranscriber(
        model, compute_type="int8", cpu_threads=1, model_name=args.model, batch_size=args.batch_size
    )
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path, truth = long_file(args.minutes, Path(tmp))
        print(f"file: {args.minutes:.0f} min of speech, {args.model}, 1 thread, batch "
              f"{args.batch_size}; medians of {args.runs} alternating runs")  # fmt: skip
        for part_seconds in [float(p) for p in args.part_seconds.split(",")]:
            whole, cut, parts_sum, spans_made = [], [], [], 0
            lat: dict[int, list[float]] = {w: [] for w in workers}
            texts = ("", "")
            for _ in range(args.runs):
                whole_s, whole_text = run_whole(transcriber, path)
                cut_s, times, parts_text = run_parts(transcriber, path, part_seconds)
                whole.append(whole_s)
                cut.append(cut_s)
                parts_sum.append(sum(times))
                spans_made = len(times)
                for w in workers:
                    lat[w].append(cut_s + makespan(times, w))
                texts = (whole_text, parts_text)
            w_s = statistics.median(whole)
            latencies = " ".join(
                f"latency_{w}w_s={statistics.median(lat[w]):.1f} "
                f"({statistics.median(lat[w]) / w_s:.2f}x)"
                for w in workers
            )
            print(
                f"part_seconds={part_seconds:.0f} parts={spans_made} whole_s={w_s:.1f} "
                f"cut_s={statistics.median(cut):.2f} "
                f"work_ratio={statistics.median(parts_sum) / w_s:.3f} {latencies} "
                f"wer_whole={wer(truth, texts[0]):.4f} wer_parts={wer(truth, texts[1]):.4f} "
                f"words_whole={len(texts[0].split())} words_parts={len(texts[1].split())}"
            )
            if abs(len(texts[0].split()) - len(texts[1].split())) > 0.05 * len(texts[0].split()):
                print("parts lost or doubled words", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
