"""Runtime profile validation: every bad value stops the worker with the message a user sees."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_worker.runtime import RuntimeProfileError, load_runtime_profile

MODELS = ("tiny.en",)


def load(env: dict[str, str], *, require_identity: bool = True):
    return load_runtime_profile(env, model_names=MODELS, require_identity=require_identity)


def problems_for(env: dict[str, str], *, require_identity: bool = True) -> list[str]:
    with pytest.raises(RuntimeProfileError) as caught:
        load(env, require_identity=require_identity)
    return str(caught.value).splitlines()


def test_cpu_profile_is_read_from_the_environment(cpu_env):
    profile = load(cpu_env)

    assert profile.model == "tiny.en"
    assert profile.device == "cpu"
    assert profile.compute_type == "int8"
    assert profile.vad == "silero"
    assert profile.alignment_device == "none"
    assert profile.batch_size == 1
    assert profile.cpu_threads == 2
    assert profile.queue == "transcribe.local-cpu"
    assert profile.identity is not None
    assert profile.identity.worker_id == "wrk_test1"
    assert profile.identity.token.get_secret_value() == "ab" * 32
    assert profile.observability_enabled is False
    assert profile.report_interval_seconds == 30.0


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "MURMUR_COMPUTE_TYPE",
            "fp16",
            "MURMUR_COMPUTE_TYPE: 'fp16' is not one of float16, float32, int8, int8_float16, "
            "int8_float32, bfloat16",
        ),
        ("MURMUR_DEVICE", "gpu", "MURMUR_DEVICE: 'gpu' is not one of cpu, cuda"),
        ("MURMUR_VAD", "webrtc", "MURMUR_VAD: 'webrtc' is not one of silero, pyannote"),
        (
            "MURMUR_ALIGNMENT_DEVICE",
            "gpu",
            "MURMUR_ALIGNMENT_DEVICE: 'gpu' is not one of cuda, cpu, none",
        ),
        ("MURMUR_MODEL", "large-v3", "MURMUR_MODEL: 'large-v3' is not one of tiny.en"),
        ("MURMUR_BATCH_SIZE", "0", "MURMUR_BATCH_SIZE: '0' is not an integer >= 1"),
        ("MURMUR_BATCH_SIZE", "two", "MURMUR_BATCH_SIZE: 'two' is not an integer >= 1"),
        (
            "MURMUR_CPU_THREADS",
            "-1",
            "MURMUR_CPU_THREADS: '-1' is not an integer >= 0 (0 = library default)",
        ),
        (
            "MURMUR_OBSERVABILITY_ENABLED",
            "yes",
            "MURMUR_OBSERVABILITY_ENABLED: 'yes' is not one of 0, 1",
        ),
        (
            "MURMUR_REPORT_INTERVAL",
            "0",
            "MURMUR_REPORT_INTERVAL: '0' is not a number of seconds > 0",
        ),
        (
            "MURMUR_DRAIN_TIMEOUT",
            "soon",
            "MURMUR_DRAIN_TIMEOUT: 'soon' is not a number of seconds > 0",
        ),
        (
            "MURMUR_PROFILE",
            "Local_CPU",
            "MURMUR_PROFILE: 'Local_CPU' is not a profile name (lowercase letters, digits and "
            "'-', at most 40)",
        ),
        (
            "MURMUR_WORKER_ID",
            "wrk/../x",
            "MURMUR_WORKER_ID: 'wrk/../x' is not an id (letters, digits, '_', '.', '-', at "
            "most 128)",
        ),
        (
            "MURMUR_CONTROL_URL",
            "ftp://control",
            "MURMUR_CONTROL_URL: 'ftp://control' is not an http:// or https:// URL",
        ),
    ],
)
def test_each_bad_value_gives_one_message_naming_the_variable(cpu_env, variable, value, message):
    cpu_env[variable] = value

    assert problems_for(cpu_env) == [message]


@pytest.mark.parametrize(
    ("variable", "message"),
    [
        ("MURMUR_DEVICE", "MURMUR_DEVICE: not set; one of cpu, cuda"),
        (
            "MURMUR_COMPUTE_TYPE",
            "MURMUR_COMPUTE_TYPE: not set; one of float16, float32, int8, int8_float16, "
            "int8_float32, bfloat16",
        ),
        ("MURMUR_WORKER_TOKEN", "MURMUR_WORKER_TOKEN: not set"),
        ("MURMUR_PROFILE", "MURMUR_PROFILE: not set"),
    ],
)
def test_a_missing_required_variable_is_refused(cpu_env, variable, message):
    del cpu_env[variable]

    assert problems_for(cpu_env) == [message]


def test_an_empty_value_counts_as_unset(cpu_env):
    cpu_env["MURMUR_VAD"] = "  "

    assert problems_for(cpu_env) == ["MURMUR_VAD: not set; one of silero, pyannote"]


def test_gpu_alignment_on_a_cpu_runtime_is_inconsistent(cpu_env):
    cpu_env["MURMUR_ALIGNMENT_DEVICE"] = "cuda"

    assert problems_for(cpu_env) == [
        "MURMUR_ALIGNMENT_DEVICE: 'cuda' needs MURMUR_DEVICE=cuda (this runtime is cpu)"
    ]


def test_secrets_are_refused_without_being_echoed(cpu_env):
    cpu_env["MURMUR_WORKER_TOKEN"] = "not-hex-secret-value"
    cpu_env["MURMUR_BROKER_URL"] = "amqp://user:brokersecret@host"

    problems = problems_for(cpu_env)

    assert problems == [
        "MURMUR_WORKER_TOKEN: is not a 64-character hex HMAC (value not shown)",
        "MURMUR_BROKER_URL: is not a redis://, rediss:// or sentinel:// URL (value not shown)",
    ]
    assert "not-hex-secret-value" not in "\n".join(problems)
    assert "brokersecret" not in "\n".join(problems)


def test_every_bad_variable_is_reported_at_once(cpu_env):
    cpu_env["MURMUR_DEVICE"] = "tpu"
    cpu_env["MURMUR_BATCH_SIZE"] = "-3"

    assert problems_for(cpu_env) == [
        "MURMUR_DEVICE: 'tpu' is not one of cpu, cuda",
        "MURMUR_BATCH_SIZE: '-3' is not an integer >= 1",
    ]


def test_identity_is_not_required_to_check_a_machine(cpu_env):
    for name in (
        "MURMUR_WORKER_ID",
        "MURMUR_INSTANCE_ID",
        "MURMUR_WORKER_TOKEN",
        "MURMUR_CONTROL_URL",
        "MURMUR_BROKER_URL",
        "MURMUR_PROFILE",
    ):
        del cpu_env[name]

    profile = load(cpu_env, require_identity=False)

    assert profile.identity is None
    assert profile.profile is None
    with pytest.raises(RuntimeError, match="no MURMUR_PROFILE"):
        _ = profile.queue


def test_token_and_broker_password_never_appear_in_repr_or_str(cpu_env):
    profile = load(cpu_env)

    for text in (repr(profile), str(profile), repr(profile.identity), str(profile.model_dump())):
        assert "ab" * 32 not in text
        assert "brokerpass" not in text


def test_profile_is_frozen(cpu_env):
    profile = load(cpu_env)

    with pytest.raises(ValidationError):
        profile.compute_type = "float32"  # type: ignore[misc]


def test_control_url_loses_a_trailing_slash(cpu_env):
    cpu_env["MURMUR_CONTROL_URL"] = "https://murmur.example/"

    assert load(cpu_env).identity.control_url == "https://murmur.example"


def test_observability_settings_are_read(cpu_env):
    cpu_env["MURMUR_OBSERVABILITY_ENABLED"] = "1"
    cpu_env["MURMUR_REPORT_INTERVAL"] = "12.5"

    profile = load(cpu_env)

    assert profile.observability_enabled is True
    assert profile.report_interval_seconds == 12.5


@pytest.mark.parametrize(
    ("device", "vad", "alignment", "expected"),
    [
        ("cpu", "silero", "none", False),
        ("cpu", "pyannote", "cpu", False),
        ("cuda", "silero", "cpu", False),
        ("cuda", "pyannote", "none", True),
        ("cuda", "silero", "cuda", True),
    ],
)
def test_torch_on_cuda_follows_vad_and_alignment(cpu_env, device, vad, alignment, expected):
    cpu_env.update(
        MURMUR_DEVICE=device,
        MURMUR_VAD=vad,
        MURMUR_ALIGNMENT_DEVICE=alignment,
        MURMUR_COMPUTE_TYPE="float32",
    )

    assert load(cpu_env).torch_on_cuda is expected
