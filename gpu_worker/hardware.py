"""The hardware check: can this machine run the runtime profile, decided before any model loads.

The facts about the machine (`DeviceFacts`) are probed separately from the decision
(`check_hardware`), so every rule can be tested on a CPU-only host with injected facts.
Rules come from docs/runtime.md ("Known traps"): CUDA present when a setting
asks for it, the compute type supported by CTranslate2 on that device, a PyTorch build with
kernels for the GPU when PyTorch runs on it, and enough free GPU memory.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass, field
from typing import Any

from gpu_worker.protocol.environment import (
    ALIGNMENT_DEVICE_VAR,
    COMPUTE_TYPE_VAR,
    DEVICE_VAR,
    VAD_VAR,
)
from gpu_worker.protocol.runtime import COMPUTE_TYPES, CPU_COMPUTE_TYPES, supported_compute_types
from gpu_worker.runtime import RuntimeProfile

log = logging.getLogger(__name__)

# Estimates (not yet measured on a GPU) of what PyTorch work adds on the device.
PYANNOTE_VAD_GPU_MB = 512
ALIGNMENT_GPU_MB = 1024


def torch_supports_capability(arch_list: tuple[str, ...], capability: tuple[int, int]) -> bool:
    """Whether a torch build (`torch.cuda.get_arch_list()`) has kernels for this GPU.

    SASS `sm_XY` runs on devices of the same major version and minor >= Y; PTX `compute_XY`
    is JIT-compiled for any device of capability >= X.Y.
    """
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        digits = "".join(ch for ch in digits if ch.isdigit())
        if not digits:
            continue
        number = int(digits)
        arch_major, arch_minor = number // 10, number % 10
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= capability:
            return True
    return False


@dataclass(frozen=True)
class DeviceFacts:
    """What the worker knows about the machine; probed once, or injected by tests."""

    cuda_device_count: int
    cuda_capability: tuple[int, int] | None = None
    gpu_name: str | None = None
    gpu_memory_free_bytes: int | None = None
    gpu_memory_total_bytes: int | None = None
    # What CTranslate2 itself reports; None where it could not be asked.
    ct2_cpu_compute_types: frozenset[str] | None = CPU_COMPUTE_TYPES
    ct2_cuda_compute_types: frozenset[str] | None = None
    torch_version: str | None = None
    # None: torch is not installed (or was not probed because no setting needs it).
    torch_arch_list: tuple[str, ...] | None = None
    notes: tuple[str, ...] = ()

    def diagnostics(self) -> dict[str, Any]:
        def mib(value: int | None) -> int | None:
            return None if value is None else value // (1024 * 1024)

        return {
            "cuda_device_count": self.cuda_device_count,
            "gpu_name": self.gpu_name,
            "cuda_capability": list(self.cuda_capability) if self.cuda_capability else None,
            "gpu_memory_free_mb": mib(self.gpu_memory_free_bytes),
            "gpu_memory_total_mb": mib(self.gpu_memory_total_bytes),
            "ct2_cpu_compute_types": _ordered(self.ct2_cpu_compute_types),
            "ct2_cuda_compute_types": _ordered(self.ct2_cuda_compute_types),
            "torch_version": self.torch_version,
            "torch_arch_list": list(self.torch_arch_list) if self.torch_arch_list else None,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class HardwareVerdict:
    problems: tuple[str, ...]
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_hardware(
    profile: RuntimeProfile, facts: DeviceFacts, *, model_gpu_memory_mb: int | None
) -> HardwareVerdict:
    """Decide whether `profile` can run on a machine with `facts`; never raises."""
    problems: list[str] = []
    diagnostics = facts.diagnostics()

    cuda_settings = _cuda_settings(profile)
    if cuda_settings and facts.cuda_device_count == 0:
        problems.append(
            f"{', '.join(cuda_settings)}: needs a CUDA GPU, but none is visible (CTranslate2 "
            "counts 0 CUDA devices): check the NVIDIA driver and that the container was "
            "started with the GPU (docker run --gpus all)"
        )
        return HardwareVerdict(tuple(problems), diagnostics)

    problems.extend(_compute_type_problems(profile, facts))
    if profile.torch_on_cuda:
        problems.extend(_torch_problems(profile, facts))
    if profile.device == "cuda":
        required = _required_gpu_mb(profile, model_gpu_memory_mb)
        diagnostics["gpu_memory_required_mb"] = required
        free = facts.gpu_memory_free_bytes
        if free is not None and required is not None and free // (1024 * 1024) < required:
            problems.append(
                f"not enough free GPU memory on {_gpu(facts)}: {free // (1024 * 1024)} MiB "
                f"free, this runtime needs about {required} MiB"
            )
    return HardwareVerdict(tuple(problems), diagnostics)


def _cuda_settings(profile: RuntimeProfile) -> list[str]:
    settings = []
    if profile.device == "cuda":
        settings.append(f"{DEVICE_VAR}=cuda")
        if profile.vad == "pyannote":
            settings.append(f"{VAD_VAR}=pyannote (runs on the ASR device)")
    if profile.alignment_device == "cuda":
        settings.append(f"{ALIGNMENT_DEVICE_VAR}=cuda")
    return settings


def _compute_type_problems(profile: RuntimeProfile, facts: DeviceFacts) -> list[str]:
    wanted = profile.compute_type
    if profile.device == "cpu":
        supported = CPU_COMPUTE_TYPES
        if facts.ct2_cpu_compute_types is not None:
            supported = supported & facts.ct2_cpu_compute_types
        where = "cpu"
    else:
        if facts.cuda_capability is None and facts.ct2_cuda_compute_types is None:
            return [
                f"{COMPUTE_TYPE_VAR}: cannot tell whether {wanted!r} runs on this GPU "
                "(neither its CUDA capability nor CTranslate2's supported types are known)"
            ]
        # Both must agree: the capability rule is the protocol's (supported_compute_types:
        # float16 refused on an old GPU even if CT2_CUDA_ALLOW_FP16 forces CTranslate2 to
        # accept it), CTranslate2's own answer is what will actually load.
        supported = frozenset(COMPUTE_TYPES)
        if facts.cuda_capability is not None:
            supported &= supported_compute_types(facts.cuda_capability)
        if facts.ct2_cuda_compute_types is not None:
            supported &= facts.ct2_cuda_compute_types
        where = _gpu(facts)
    if wanted in supported:
        return []
    allowed = _ordered(supported) or ["none"]
    return [
        f"{COMPUTE_TYPE_VAR}: {wanted!r} is not supported on {where}; "
        f"use one of {', '.join(allowed)}"
    ]


def _torch_problems(profile: RuntimeProfile, facts: DeviceFacts) -> list[str]:
    users = []
    if profile.vad == "pyannote" and profile.device == "cuda":
        users.append(f"{VAD_VAR}=pyannote")
    if profile.alignment_device == "cuda":
        users.append(f"{ALIGNMENT_DEVICE_VAR}=cuda")
    who = " and ".join(users)
    if facts.torch_arch_list is None:
        return [
            f"{who} runs PyTorch on cuda, but torch with CUDA is not installed "
            "(requirements/worker-gpu.txt)"
        ]
    if facts.cuda_capability is None:
        return [f"{who} runs PyTorch on cuda, but the GPU's CUDA capability is unknown"]
    if torch_supports_capability(facts.torch_arch_list, facts.cuda_capability):
        return []
    major, minor = facts.cuda_capability
    return [
        f"{who} runs PyTorch on cuda, but torch {facts.torch_version or '(unknown version)'} "
        f"has no kernels for {_gpu(facts)}; it was built for "
        f"{', '.join(facts.torch_arch_list)}: install a torch build that lists "
        f"sm_{major}{minor} (the cu126 wheels in "
        f"requirements/worker-gpu.txt), or use {VAD_VAR}=silero and "
        f"{ALIGNMENT_DEVICE_VAR}=cpu or none"
    ]


def _required_gpu_mb(profile: RuntimeProfile, model_gpu_memory_mb: int | None) -> int | None:
    if model_gpu_memory_mb is None:
        return None
    required = model_gpu_memory_mb
    if profile.vad == "pyannote":
        required += PYANNOTE_VAD_GPU_MB
    if profile.alignment_device == "cuda":
        required += ALIGNMENT_GPU_MB
    return required


def _gpu(facts: DeviceFacts) -> str:
    name = facts.gpu_name or "the GPU"
    if facts.cuda_capability is None:
        return name
    major, minor = facts.cuda_capability
    return f"{name} (CUDA capability {major}.{minor})"


def _ordered(types: frozenset[str] | None) -> list[str] | None:
    if types is None:
        return None
    known = [t for t in COMPUTE_TYPES if t in types]
    return known + sorted(t for t in types if t not in COMPUTE_TYPES)


def probe_device_facts(*, probe_torch: bool, device_index: int = 0) -> DeviceFacts:
    """Ask CTranslate2, NVML and (only when asked) torch about this machine."""
    import ctranslate2

    notes: list[str] = []
    cpu_types = frozenset(ctranslate2.get_supported_compute_types("cpu"))
    # get_supported_compute_types("cuda") raises on a host without a driver: count first.
    count = int(ctranslate2.get_cuda_device_count())
    if count == 0:
        return DeviceFacts(cuda_device_count=0, ct2_cpu_compute_types=cpu_types)

    cuda_types: frozenset[str] | None = None
    try:
        cuda_types = frozenset(ctranslate2.get_supported_compute_types("cuda", device_index))
    except RuntimeError as exc:
        notes.append(f"CTranslate2 could not list CUDA compute types: {exc}")

    name, capability, free, total = _nvml_facts(device_index, notes)
    torch_version: str | None = None
    arch_list: tuple[str, ...] | None = None
    if (probe_torch or capability is None) and importlib.util.find_spec("torch") is not None:
        torch = importlib.import_module("torch")
        torch_version = str(torch.__version__)
        if torch.cuda.is_available():
            arch_list = tuple(torch.cuda.get_arch_list())
            if capability is None:
                capability = tuple(torch.cuda.get_device_capability(device_index))
                name = name or str(torch.cuda.get_device_name(device_index))
            if free is None:
                free, total = (int(v) for v in torch.cuda.mem_get_info(device_index))
        else:
            notes.append("torch is installed but torch.cuda.is_available() is False")
    return DeviceFacts(
        cuda_device_count=count,
        cuda_capability=capability,
        gpu_name=name,
        gpu_memory_free_bytes=free,
        gpu_memory_total_bytes=total,
        ct2_cpu_compute_types=cpu_types,
        ct2_cuda_compute_types=cuda_types,
        torch_version=torch_version,
        torch_arch_list=arch_list,
        notes=tuple(notes),
    )


def _nvml_facts(
    index: int, notes: list[str]
) -> tuple[str | None, tuple[int, int] | None, int | None, int | None]:
    if importlib.util.find_spec("pynvml") is None:
        notes.append("nvidia-ml-py is not installed: GPU name and memory come from torch if any")
        return None, None, None, None
    pynvml = importlib.import_module("pynvml")
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        notes.append(f"NVML failed: {exc}")
        return None, None, None, None
    name = name.decode() if isinstance(name, bytes) else str(name)
    return name, (int(major), int(minor)), int(memory.free), int(memory.total)
