"""Long audio: what counting decoded samples costs the probe, and the worker's peak memory on 1 h.

Part 1, probe cost: `app.audio.probe_audio` (decodes the whole file, counting its samples,
up to the limit) against the header-trusting probe it replaced (decode one frame, take the
header's duration), on 90 s of speech in each format; runs alternate, medians, ratio.

Part 2, the worker's decode path on long audio (speech-90s.wav repeated, as FLAC): in a fresh
process each, peak RSS (VmHWM) and wall time of
    baseline        Python with PyAV, numpy and gpu_worker imported, nothing decoded
    decode_audio    faster-whisper's decode_audio (the worker's path before issue 10)
    decode_bounded  gpu_worker.audio.decode_bounded, sized by the measured length (the claim's)
    transcribe      decode_bounded, then FasterWhisperTranscriber (tiny.en, int8) on it
The 4 h limit applies to every one; `transcribe` is what a worker holds for a 1 h job.

Part 3, the file of issue 10: 8 h of 8 kHz silence as FLAC whose header says 10 s. The probe
refuses it (and how long that takes), and decode_bounded, told to expect 10 s, stops at the
4 h limit: its peak RSS is the bound the worker holds at most.

    .venv/bin/python bench/long_audio.py [--minutes 60] [--runs 15] [--skip-transcribe]
                                         [--probe-only] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package; run from anywhere

importlib.import_module("gpu_worker")  # first: pins the hub offline before faster-whisper

import av  # noqa: E402
import numpy as np  # noqa: E402

from app.audio import probe_audio  # noqa: E402
from app.errors import Refused  # noqa: E402
from tests.audio_encode import FORMATS, encode, lying_flac  # noqa: E402

SPEECH = REPO / "tests/fixtures/speech-90s.wav"
LIMIT = 4 * 3600.0


def header_probe(path: Path) -> float:
    """The probe before issue 10: one frame decoded, the length taken from the header."""
    with av.open(
        str(path), metadata_errors="ignore", options={"probesize": "4096", "analyzeduration": "0"}
    ) as container:
        stream: Any = container.streams.audio[0]
        next(container.decode(stream))
        return float(container.duration or 0) / av.time_base


def probe_cost(runs: int, workdir: Path) -> None:
    print("probe cost, 90 s of speech (ms, median of", runs, "alternating runs)")
    print(f"  {'format':<8} {'header':>8} {'counted':>8} {'ratio':>6}")
    files = {"wav": SPEECH}
    for container, codec, ext, rate in FORMATS:
        path = workdir / f"speech-90s.{ext}"
        path.write_bytes(encode(SPEECH, container, codec, rate))
        files[ext] = path
    for name, path in files.items():
        header, counted = [], []
        for _ in range(runs):
            started = time.perf_counter()
            header_probe(path)
            header.append(time.perf_counter() - started)
            started = time.perf_counter()
            probe_audio(path, LIMIT)
            counted.append(time.perf_counter() - started)
        h, c = statistics.median(header) * 1e3, statistics.median(counted) * 1e3
        print(f"  {name:<8} {h:8.2f} {c:8.2f} {c / h:6.1f}")


def long_flac(minutes: int, path: Path) -> None:
    with av.open(str(SPEECH)) as src:
        speech = np.concatenate([f.to_ndarray().reshape(-1) for f in src.decode(audio=0)])
    repeats = -(-minutes * 60 * 16000 // speech.shape[0])
    with av.open(str(path), "w", format="flac") as out:
        stream: Any = out.add_stream("flac", rate=16000)
        stream.layout = "mono"
        for _ in range(repeats):
            frame = av.AudioFrame.from_ndarray(speech[None, :], format="s16", layout="mono")
            frame.sample_rate = 16000
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def child(mode: str, path: str) -> None:
    """One measurement in this fresh process; prints a JSON line."""
    started = time.perf_counter()
    result: dict[str, Any] = {"mode": mode}
    if mode == "decode_audio":
        from faster_whisper import decode_audio

        result["samples"] = int(decode_audio(path).shape[0])
    elif mode == "lying":
        from gpu_worker.audio import AudioTooLong, decode_bounded

        try:
            decode_bounded(path, LIMIT, expected_seconds=10)
        except AudioTooLong as exc:
            result["refused"] = str(exc)
    elif mode in ("decode_bounded", "transcribe"):
        from gpu_worker.audio import decode_bounded

        measured = probe_audio(Path(path), LIMIT).duration_seconds
        samples = decode_bounded(path, LIMIT, expected_seconds=measured)
        result["samples"] = int(samples.shape[0])
        if mode == "transcribe":
            from gpu_worker.manifest import load_manifest, verify_asset
            from gpu_worker.transcriber import FasterWhisperTranscriber

            model = verify_asset(load_manifest().asset("tiny.en")).root
            transcriber = FasterWhisperTranscriber(model, compute_type="int8", cpu_threads=2)
            transcript = transcriber.transcribe(
                samples, language="en", prompt=None, word_timestamps=False
            )
            result["segments"] = len(transcript.segments)
            result["words"] = len(transcript.text.split())
    result["seconds"] = round(time.perf_counter() - started, 1)
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child started by a large
    # parent would report the parent's size.
    status = Path("/proc/self/status").read_text()
    peak_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")
    )
    result["peak_rss_mib"] = round(peak_kib / 1024, 1)
    print(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--skip-transcribe", action="store_true")
    parser.add_argument("--probe-only", action="store_true", help="part 1 only")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: 1 min, 2 runs, no transcription, no part 3"
    )
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    if args.smoke:
        args.minutes, args.runs, args.skip_transcribe = 1, 2, True

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        probe_cost(args.runs, workdir)
        if args.probe_only:
            return 0
        path = workdir / "long.flac"
        long_flac(args.minutes, path)
        started = time.perf_counter()
        info = probe_audio(path, LIMIT)
        probe_seconds = time.perf_counter() - started
        print(
            f"\n{info.duration_seconds / 60:.1f} min of speech as FLAC, "
            f"{path.stat().st_size / 2**20:.0f} MiB; probe: {probe_seconds:.2f} s"
        )
        samples_mib = info.duration_seconds * 16000 * 4 / 2**20
        print(f"its samples as 16 kHz float32: {samples_mib:.0f} MiB")
        modes = ["baseline", "decode_audio", "decode_bounded"]
        if not args.skip_transcribe:
            modes.append("transcribe")
        base = 0.0
        for mode in modes:
            result = _run_child(mode, path)
            base = base or result["peak_rss_mib"]
            extra = {k: v for k, v in result.items() if k not in ("mode", "peak_rss_mib")}
            print(
                f"  {mode:<15} peak RSS {result['peak_rss_mib']:8.1f} MiB "
                f"(+{result['peak_rss_mib'] - base:7.1f} over baseline, "
                f"{(result['peak_rss_mib'] - base) / samples_mib:4.2f}x the samples)  {extra}"
            )
        if args.smoke:
            return 0  # part 3 decodes 4 h of samples: tens of seconds, not for CI
        lying = workdir / "lying.flac"
        lying.write_bytes(lying_flac(seconds=8 * 3600, stated_seconds=10))
        started = time.perf_counter()
        try:
            probe_audio(lying, LIMIT)
        except Refused as err:  # the domain's refusal (an ApiError is one too)
            print(
                f"\n8 h FLAC stating 10 s ({lying.stat().st_size / 1024:.0f} KiB): probe answers "
                f"{err.status} {err.code} in {time.perf_counter() - started:.2f} s"
            )
        result = _run_child("lying", lying)
        print(
            f"  decode_bounded  peak RSS {result['peak_rss_mib']:8.1f} MiB "
            f"(4 h of samples: {LIMIT * 16000 * 4 / 2**20:.0f} MiB)  {result}"
        )
    return 0


def _run_child(mode: str, path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


if __name__ == "__main__":
    sys.exit(main())
