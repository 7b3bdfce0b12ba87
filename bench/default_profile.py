"""The default CPU profile (Whisper base, multilingual, batched) against bare sequential
faster-whisper on the same model and file.

Murmur's path is what the `local-cpu` profile's worker runs for a job without a language:
`decode_bounded`, `FasterWhisperTranscriber.transcribe` at the profile's batch size
(faster-whisper's BatchedInferencePipeline, language detected, word times computed as the
worker does for every job, looped segments decoded again) and `Transcript.to_json()`; the
same path without word times is timed too, for what word times cost.
The baseline is `WhisperModel.transcribe` on the file with the same beam and VAD, language
detected too, segments materialised. Both use the model files the worker verifies (Whisper
base assembled from its two wheels), runs alternate, and the medians are compared: the
target is >= 1.6x, with WER on both English speech fixtures within +0.02 of sequential.
German and Spanish clips are checked for the detected language on both paths.

    .venv/bin/python bench/default_profile.py [--runs 3] [--audio FILE] [--smoke]

--smoke: one run of each path on the short fixture and Murmur's on the German clip; exits
non-zero if a path fails, loses the text or detects the wrong language (no speed target: a
smoke run measures nothing).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
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
LANGUAGES = {REPO / "samples/guten-morgen.wav": "de", FIXTURES / "speech-es.wav": "es"}


def word_error_rate(reference: str, hypothesis: str) -> float:
    """As tests/worker/conftest.py scores it: lower-cased, punctuation dropped."""

    def words(text: str) -> str:
        return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())

    return float(jiwer.wer(words(reference), words(hypothesis)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audio", type=Path, default=FIXTURES / "speech-90s.wav")
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one short run, no targets")
    args = parser.parse_args()
    if args.smoke:
        args.audio, args.runs = FIXTURES / "speech-short.wav", 1

    profile = LOCAL_CPU_PROFILE
    model_dir = verify_asset(load_manifest().asset(profile.model)).root
    batched = FasterWhisperTranscriber(
        model_dir,
        compute_type=profile.compute_type,
        cpu_threads=args.cpu_threads,
        batch_size=profile.batch_size,
        model_name=profile.model,
    )
    # The baseline: the same model files, loaded once more, decoded sequentially.
    sequential = FasterWhisperTranscriber(
        model_dir,
        compute_type=profile.compute_type,
        cpu_threads=args.cpu_threads,
        model_name=profile.model,
    )

    def murmur(path: Path) -> tuple[str, str | None]:
        # As the worker runs every job since issue 33: with word times (gpu_worker/jobs.py).
        samples = decode_bounded(str(path), DEFAULT_MAX_AUDIO_SECONDS)
        transcript = batched.transcribe(samples, language=None, prompt=None, word_timestamps=True)
        transcript.to_json()
        return transcript.text, transcript.language

    def murmur_without_words(path: Path) -> tuple[str, str | None]:
        samples = decode_bounded(str(path), DEFAULT_MAX_AUDIO_SECONDS)
        transcript = batched.transcribe(samples, language=None, prompt=None, word_timestamps=False)
        transcript.to_json()
        return transcript.text, transcript.language

    def bare(path: Path) -> tuple[str, str | None]:
        segments, info = sequential.model.transcribe(
            str(path), beam_size=BEAM_SIZE, vad_filter=True, condition_on_previous_text=False
        )
        return "".join(segment.text for segment in segments).strip(), info.language

    def timed(run: Callable[[Path], tuple[str, str | None]]) -> float:
        started = time.perf_counter()
        text, _ = run(args.audio)
        elapsed = time.perf_counter() - started
        if not text:
            raise SystemExit(f"{run.__name__} returned no text for {args.audio.name}")
        return elapsed

    if not args.smoke:
        murmur(args.audio), bare(args.audio)  # warm-up: first-call allocations, VAD session
    murmur_times, bare_times, plain_times = [], [], []
    for _ in range(args.runs):
        bare_times.append(timed(bare))
        murmur_times.append(timed(murmur))
        plain_times.append(timed(murmur_without_words))
    murmur_median, bare_median = statistics.median(murmur_times), statistics.median(bare_times)
    plain_median = statistics.median(plain_times)
    print(
        f"audio: {args.audio.name}, {profile.model} {profile.compute_type}, "
        f"{args.cpu_threads} threads, language detected, load average {os.getloadavg()}"
    )
    print(f"bare sequential median {bare_median:.3f} s  runs {[round(t, 3) for t in bare_times]}")
    print(
        f"murmur batch {profile.batch_size} median {murmur_median:.3f} s  "
        f"runs {[round(t, 3) for t in murmur_times]}"
    )
    print(
        f"murmur without word times median {plain_median:.3f} s  "
        f"runs {[round(t, 3) for t in plain_times]}"
    )
    print(f"throughput: {bare_median / murmur_median:.2f}x (target >= 1.6)")
    print(f"throughput without word times: {bare_median / plain_median:.2f}x")
    print(f"word times cost: {murmur_median / plain_median:.2f}x the time without them")

    failed = False
    # A smoke run scores nothing: the timed runs above already checked the text.
    fixtures = () if args.smoke else ("speech-short", "speech-90s")
    for fixture in fixtures:
        reference = (FIXTURES / f"{fixture}.txt").read_text()
        bare_text, _ = bare(FIXTURES / f"{fixture}.wav")
        murmur_text, language = murmur(FIXTURES / f"{fixture}.wav")
        bare_wer = word_error_rate(reference, bare_text)
        murmur_wer = word_error_rate(reference, murmur_text)
        print(
            f"WER {fixture}: sequential {bare_wer:.4f}, batch {profile.batch_size} "
            f"{murmur_wer:.4f} ({murmur_wer - bare_wer:+.4f}, target <= +0.02), "
            f"language {language}"
        )
        failed |= language != "en" or murmur_wer > 0.5
    for path, expected in LANGUAGES.items():
        if args.smoke and expected != "de":
            continue
        text, language = murmur(path)
        _, bare_language = (None, expected) if args.smoke else bare(path)
        print(f"{path.name}: detected {language} (sequential {bare_language}): {text[:60]}")
        failed |= language != expected or bare_language != expected or not text
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
