"""Hardware decisions with injected device facts, so every GPU rule is checked on a CPU host."""

from __future__ import annotations

import pytest

from gpu_worker.hardware import (
    DeviceFacts,
    check_hardware,
    probe_device_facts,
    torch_supports_capability,
)
from gpu_worker.protocol.runtime import capability_requirement, supported_compute_types
from gpu_worker.runtime import load_runtime_profile

GIB = 1024**3
CU128_ARCHS = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")
CU126_ARCHS = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")

NO_GPU = DeviceFacts(cuda_device_count=0)


def gpu(capability, name, *, torch_archs=CU126_ARCHS, free_gib=20, ct2_types=None):
    return DeviceFacts(
        cuda_device_count=1,
        cuda_capability=capability,
        gpu_name=name,
        gpu_memory_free_bytes=free_gib * GIB,
        gpu_memory_total_bytes=24 * GIB,
        ct2_cuda_compute_types=ct2_types,
        torch_version="2.8.0",
        torch_arch_list=torch_archs,
    )


P100 = gpu((6, 0), "Tesla P100-PCIE-16GB")
L4 = gpu((8, 9), "NVIDIA L4")


def profile(cpu_env, **settings):
    env = dict(cpu_env)
    env.update({f"MURMUR_{key.upper()}": value for key, value in settings.items()})
    return load_runtime_profile(env, model_names=("tiny.en",), require_identity=False)


def problems(cpu_env, facts, **settings):
    verdict = check_hardware(profile(cpu_env, **settings), facts, model_gpu_memory_mb=1024)
    return list(verdict.problems)


def test_cpu_profile_passes_on_a_cpu_host(cpu_env):
    assert problems(cpu_env, NO_GPU) == []
    assert problems(cpu_env, NO_GPU, compute_type="float32") == []


@pytest.mark.parametrize("compute_type", ["float16", "bfloat16", "int8_float16"])
def test_half_precision_on_cpu_is_refused(cpu_env, compute_type):
    assert problems(cpu_env, NO_GPU, compute_type=compute_type) == [
        f"MURMUR_COMPUTE_TYPE: '{compute_type}' is not supported on cpu; "
        "use one of float32, int8, int8_float32"
    ]


def test_cuda_device_without_a_gpu_is_refused(cpu_env):
    assert problems(cpu_env, NO_GPU, device="cuda", compute_type="float16") == [
        "MURMUR_DEVICE=cuda: needs a CUDA GPU, but none is visible (CTranslate2 counts 0 CUDA "
        "devices): check the NVIDIA driver and that the container was started with the GPU "
        "(docker run --gpus all)"
    ]


def test_every_cuda_setting_is_named_when_there_is_no_gpu(cpu_env):
    found = problems(
        cpu_env,
        NO_GPU,
        device="cuda",
        compute_type="float32",
        vad="pyannote",
        alignment_device="cuda",
    )

    assert len(found) == 1
    assert found[0].startswith(
        "MURMUR_DEVICE=cuda, MURMUR_VAD=pyannote (runs on the ASR device), "
        "MURMUR_ALIGNMENT_DEVICE=cuda: needs a CUDA GPU, but none is visible"
    )


def test_float16_on_capability_6_0_is_refused(cpu_env):
    assert problems(cpu_env, P100, device="cuda", compute_type="float16") == [
        "MURMUR_COMPUTE_TYPE: 'float16' is not supported on Tesla P100-PCIE-16GB "
        "(CUDA capability 6.0); use one of float32"
    ]


def test_float32_on_capability_6_0_passes(cpu_env):
    assert problems(cpu_env, P100, device="cuda", compute_type="float32") == []


def test_int8_needs_capability_6_1_or_7_0(cpu_env):
    p40 = gpu((6, 1), "Tesla P40")

    assert problems(cpu_env, p40, device="cuda", compute_type="int8") == []
    assert problems(cpu_env, P100, device="cuda", compute_type="int8") != []


def test_float16_and_bfloat16_on_capability_8_9_pass(cpu_env):
    assert problems(cpu_env, L4, device="cuda", compute_type="float16") == []
    assert problems(cpu_env, L4, device="cuda", compute_type="bfloat16") == []


def test_bfloat16_below_capability_8_0_is_refused(cpu_env):
    t4 = gpu((7, 5), "Tesla T4")

    assert problems(cpu_env, t4, device="cuda", compute_type="bfloat16") == [
        "MURMUR_COMPUTE_TYPE: 'bfloat16' is not supported on Tesla T4 (CUDA capability 7.5); "
        "use one of float16, float32, int8, int8_float16, int8_float32"
    ]


def test_ctranslate2s_own_answer_also_counts(cpu_env):
    # An L4 whose CTranslate2 build reports no float16 (e.g. a CPU-only wheel) is refused
    # even though the capability rule allows it.
    l4_without_fp16 = gpu((8, 9), "NVIDIA L4", ct2_types=frozenset({"float32", "int8"}))

    assert problems(cpu_env, l4_without_fp16, device="cuda", compute_type="float16") == [
        "MURMUR_COMPUTE_TYPE: 'float16' is not supported on NVIDIA L4 (CUDA capability 8.9); "
        "use one of float32, int8"
    ]


def test_unknown_capability_and_compute_types_fail_closed(cpu_env):
    blind = DeviceFacts(cuda_device_count=1, gpu_name="mystery")

    assert problems(cpu_env, blind, device="cuda", compute_type="float32") == [
        "MURMUR_COMPUTE_TYPE: cannot tell whether 'float32' runs on this GPU (neither its CUDA "
        "capability nor CTranslate2's supported types are known)"
    ]


def test_pyannote_on_cuda_with_a_torch_build_lacking_sm_60_is_refused(cpu_env):
    p100_cu128 = gpu((6, 0), "Tesla P100-PCIE-16GB", torch_archs=CU128_ARCHS)

    assert problems(cpu_env, p100_cu128, device="cuda", compute_type="float32", vad="pyannote") == [
        "MURMUR_VAD=pyannote runs PyTorch on cuda, but torch 2.8.0 has no kernels for "
        "Tesla P100-PCIE-16GB (CUDA capability 6.0); it was built for sm_70, sm_75, sm_80, "
        "sm_86, sm_90, sm_100, sm_120, compute_120: install a torch build that lists sm_60 (the "
        "cu126 wheels in requirements/worker-gpu.txt), or use MURMUR_VAD=silero and "
        "MURMUR_ALIGNMENT_DEVICE=cpu or none"
    ]


def test_the_same_p100_passes_with_silero_and_cpu_alignment(cpu_env):
    p100_cu128 = gpu((6, 0), "Tesla P100-PCIE-16GB", torch_archs=CU128_ARCHS)

    assert (
        problems(
            cpu_env,
            p100_cu128,
            device="cuda",
            compute_type="float32",
            vad="silero",
            alignment_device="cpu",
        )
        == []
    )


def test_cuda_alignment_with_cu126_torch_passes_on_p100_and_l4(cpu_env):
    settings = {"device": "cuda", "vad": "pyannote", "alignment_device": "cuda"}

    assert problems(cpu_env, P100, compute_type="float32", **settings) == []
    assert problems(cpu_env, L4, compute_type="float16", **settings) == []


def test_torch_work_on_cuda_without_torch_is_refused(cpu_env):
    no_torch = gpu((8, 9), "NVIDIA L4", torch_archs=None)

    assert problems(
        cpu_env, no_torch, device="cuda", compute_type="float16", alignment_device="cuda"
    ) == [
        "MURMUR_ALIGNMENT_DEVICE=cuda runs PyTorch on cuda, but torch with CUDA is not "
        "installed (requirements/worker-gpu.txt)"
    ]


def test_too_little_free_gpu_memory_is_refused(cpu_env):
    busy_l4 = gpu((8, 9), "NVIDIA L4", free_gib=1)

    # tiny.en 1024 MiB + pyannote 512 MiB + alignment 1024 MiB.
    assert problems(
        cpu_env,
        busy_l4,
        device="cuda",
        compute_type="float16",
        vad="pyannote",
        alignment_device="cuda",
    ) == [
        "not enough free GPU memory on NVIDIA L4 (CUDA capability 8.9): 1024 MiB free, this "
        "runtime needs about 2560 MiB"
    ]


def test_diagnostics_are_json_ready_and_carry_the_facts(cpu_env):
    verdict = check_hardware(
        profile(cpu_env, device="cuda", compute_type="float16"), L4, model_gpu_memory_mb=1024
    )

    assert verdict.ok
    assert verdict.diagnostics["gpu_name"] == "NVIDIA L4"
    assert verdict.diagnostics["cuda_capability"] == [8, 9]
    assert verdict.diagnostics["gpu_memory_free_mb"] == 20 * 1024
    assert verdict.diagnostics["gpu_memory_required_mb"] == 1024


@pytest.mark.parametrize(
    ("archs", "capability", "expected"),
    [
        (CU126_ARCHS, (6, 0), True),
        (CU128_ARCHS, (6, 0), False),
        (CU128_ARCHS, (8, 9), True),  # sm_86 SASS runs on 8.9
        (CU128_ARCHS, (12, 1), True),  # sm_120 SASS runs on 12.1
        (("sm_70",), (8, 0), False),  # SASS does not cross major versions
        (("compute_70",), (8, 0), True),  # PTX is JIT-compiled upwards
        (("sm_61",), (6, 0), False),
        ((), (8, 9), False),
    ],
)
def test_torch_arch_rule(archs, capability, expected):
    assert torch_supports_capability(archs, capability) is expected


def test_capability_rule_matches_ctranslate2():
    assert supported_compute_types((6, 0)) == {"float32"}
    assert supported_compute_types((6, 1)) == {"float32", "int8", "int8_float32"}
    assert "float16" in supported_compute_types((7, 0))
    assert "bfloat16" not in supported_compute_types((7, 5))
    assert supported_compute_types(None) == {"float32", "int8", "int8_float32"}


def test_the_capability_requirement_is_read_from_the_same_rule():
    assert capability_requirement("float16") == "CUDA capability >= 7.0"
    assert capability_requirement("int8") == "CUDA capability >= 7.0 or exactly 6.1"
    assert capability_requirement("bfloat16") == "CUDA capability >= 8.0"
    assert capability_requirement("float32") == "any CUDA capability"
    assert capability_requirement("float8") is None


def test_probing_this_host_asks_ctranslate2():
    import ctranslate2

    facts = probe_device_facts(probe_torch=False)

    assert facts.cuda_device_count == ctranslate2.get_cuda_device_count()
    assert facts.ct2_cpu_compute_types == frozenset(ctranslate2.get_supported_compute_types("cpu"))
    if facts.cuda_device_count == 0:
        assert facts.cuda_capability is None
        assert facts.ct2_cuda_compute_types is None
