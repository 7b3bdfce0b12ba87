"""Profiles in configuration: the shipped files, and every problem validate-config must report."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main as murmur
from app.config import LOCAL_CPU_PROFILE, ConfigError, check_settings, load_settings

CONFIG = Path(__file__).resolve().parents[2] / "config"

SECRETS = {
    "MURMUR_API_TOKEN": "api-token-" + "a" * 32,
    "MURMUR_SIGNING_KEY": "signing-key-" + "b" * 32,
    "MURMUR_ADMIN_TOKEN": "admin-token-" + "c" * 32,
    "MURMUR_SCRAPE_TOKEN": "scrape-token-" + "d" * 32,
    "MURMUR_WEBHOOK_SECRET": "webhook-secret-" + "e" * 32,
    "SCW_ACCESS_KEY": "SCWXXXXXXXXXXXXXXXXX",
    "SCW_SECRET_KEY": "8f6e2d3c-1b2a-4c5d-9e8f-7a6b5c4d3e2f",
}

GROUPS = """
worker_broker_url = "rediss://workers:pw@broker.example.com:6380/0"

[api]
public_url = "https://murmur.example.com"

[security_groups.par1]
id = "11111111-1111-4111-8111-111111111111"
zone = "fr-par-1"

[security_groups.par2]
id = "22222222-2222-4222-8222-222222222222"
zone = "fr-par-2"

[scaleway]
project_id = "33333333-3333-4333-8333-333333333333"
"""


def profile(name: str = "gpu", **fields: object) -> str:
    values: dict[str, object] = {
        "name": name,
        "provider": "scaleway",
        "zone": "fr-par-2",
        "server_type": "L4-1-24G",
        "image": "murmur-worker-gpu",
        "worker_image": "rg.fr-par.scw.cloud/murmur/worker@sha256:" + "ab" * 32,
        "security_group": "par2",
        "compute_type": "float16",
        "hourly_cost_eur": 0.75,
    }
    values.update(fields)
    body = "\n".join(
        f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {str(v).lower()}"
        for k, v in values.items()
    )
    return f"\n[[profiles]]\n{body}\n"


def problems_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> list[str]:
    path = tmp_path / "murmur.toml"
    path.write_text(text)
    try:
        settings = load_settings(path, env=SECRETS if env is None else env)
    except ConfigError as exc:
        return exc.problems
    return check_settings(settings)


def test_example_config_is_valid_and_ordered() -> None:
    settings = load_settings(CONFIG / "murmur.example.toml", env=SECRETS)
    assert check_settings(settings) == []
    rows = [
        (p.name, p.zone, p.server_type, p.compute_type, p.vad, p.alignment_device)
        for p in settings.profiles
    ]
    assert rows == [
        ("l4-par2", "fr-par-2", "L4-1-24G", "float16", "pyannote", "cuda"),
        ("p100-par1", "fr-par-1", "RENDER-S", "float32", "silero", "cpu"),
    ]
    for p in settings.profiles:
        assert settings.security_groups[p.security_group].zone == p.zone


def test_local_toml_is_the_embedded_default() -> None:
    shipped = load_settings(CONFIG / "local.toml", env={})
    assert shipped.profiles == (LOCAL_CPU_PROFILE,)
    assert load_settings(None, env={}).profiles == shipped.profiles
    assert check_settings(shipped, role="worker") == []


CASES = [
    (
        "duplicate names",
        GROUPS + profile("gpu") + profile("gpu"),
        ["profiles: Value error, duplicate profile name 'gpu'"],
    ),
    (
        "unknown field",
        GROUPS + profile("gpu", colour="blue"),
        ["profiles.0.colour: unknown field"],
    ),
    (
        "security group of another zone",
        GROUPS + profile("gpu", security_group="par1"),
        [
            "profiles.gpu.security_group: 'par1' lives in zone fr-par-1, not in the profile's "
            "zone fr-par-2"
        ],
    ),
    (
        "security group not declared",
        GROUPS + profile("gpu", security_group="nope"),
        ["profiles.gpu.security_group: 'nope' is not declared in [security_groups]"],
    ),
    (
        "multi-GPU type",
        GROUPS + profile("gpu", server_type="L4-2-24G"),
        [
            "profiles.gpu.server_type: L4-2-24G has 2 GPUs; multi-GPU types are not allowed until "
            "one worker can use each GPU"
        ],
    ),
    (
        "compute type the GPU cannot run",
        GROUPS + profile("p100", zone="fr-par-1", server_type="RENDER-S", security_group="par1"),
        [
            "profiles.p100.compute_type: float16 cannot run on P100 (CUDA capability 6.0); "
            "allowed: float32"
        ],
    ),
    (
        "unknown server type",
        GROUPS + profile("gpu", server_type="L5-1-24G"),
        [
            "profiles.gpu.server_type: unknown server type 'L5-1-24G' (known: H100-1-80G, "
            "H100-2-80G, H100-SXM-2-80G, H100-SXM-4-80G, H100-SXM-8-80G, L4-1-24G, L4-2-24G, "
            "L4-4-24G, L4-8-24G, L40S-1-48G, L40S-2-48G, L40S-4-48G, L40S-8-48G, RENDER-S, "
            "local-cpu)"
        ],
    ),
    (
        "GPU alignment on a CPU-only server type",
        GROUPS
        + profile(
            "cpu",
            provider="local",
            server_type="local-cpu",
            compute_type="int8",
            alignment_device="cuda",
        ),
        ["profiles.cpu.alignment_device: cuda on a CPU-only server type"],
    ),
    (
        "a GPU with no price escapes the budget",
        GROUPS + profile("gpu", hourly_cost_eur=0.0),
        ["profiles.gpu.hourly_cost_eur: required for the scaleway provider (the budget counts it)"],
    ),
    (
        "worker_python on a cloud profile",
        GROUPS + profile("gpu", worker_python="/usr/bin/python3"),
        [
            "profiles.gpu.worker_python: only the local provider starts a worker with it "
            "(scaleway workers run the worker image)"
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_profiles_are_reported_exactly(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    assert problems_of(tmp_path, text) == expected


def test_missing_secrets_are_each_reported(tmp_path: Path) -> None:
    assert problems_of(tmp_path, GROUPS + profile("gpu"), env={}) == [
        "MURMUR_API_TOKEN: not set (comma-separated bearer tokens)",
        "MURMUR_SIGNING_KEY: not set (signs worker credentials and URLs)",
        "SCW_ACCESS_KEY: required by the scaleway profiles",
        "SCW_SECRET_KEY: required by the scaleway profiles",
    ]


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    text = (
        GROUPS
        + profile("a", server_type="L4-2-24G", security_group="par1")
        + profile("b", zone="fr-par-1", server_type="RENDER-S", security_group="par1")
    )
    env = {k: v for k, v in SECRETS.items() if not k.startswith("SCW_")}
    assert problems_of(tmp_path, text, env=env) == [
        "profiles.a.server_type: L4-2-24G has 2 GPUs; multi-GPU types are not allowed until one "
        "worker can use each GPU",
        "profiles.a.security_group: 'par1' lives in zone fr-par-1, not in the profile's zone "
        "fr-par-2",
        "profiles.b.compute_type: float16 cannot run on P100 (CUDA capability 6.0); allowed: "
        "float32",
        "SCW_ACCESS_KEY: required by the scaleway profiles",
        "SCW_SECRET_KEY: required by the scaleway profiles",
    ]


def test_validate_config_command_exits_non_zero_with_the_list(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GROUPS + profile("gpu", server_type="L4-2-24G", security_group="par1"))
    result = CliRunner().invoke(
        murmur, ["validate-config", "--config", str(path)], env=SECRETS, catch_exceptions=False
    )
    assert result.exit_code == 1
    assert "configuration has 2 problem(s):" in result.output
    assert "  - profiles.gpu.server_type: L4-2-24G has 2 GPUs" in result.output
    assert "  - profiles.gpu.security_group: 'par1' lives in zone fr-par-1" in result.output

    ok = CliRunner().invoke(
        murmur, ["validate-config", "--config", str(CONFIG / "murmur.example.toml")], env=SECRETS
    )
    assert ok.exit_code == 0, ok.output
    assert "configuration OK: 2 profile(s): l4-par2, p100-par1" in ok.output


def test_cloud_workers_need_reachable_control_plane_and_broker(tmp_path: Path) -> None:
    text = GROUPS.replace(
        'public_url = "https://murmur.example.com"', 'public_url = "http://127.0.0.1:8000"'
    )
    text = text.replace('worker_broker_url = "rediss://workers:pw@broker.example.com:6380/0"', "")
    assert problems_of(tmp_path, text + profile()) == [
        "api.public_url: cloud workers need an https URL they can reach, not http://127.0.0.1:8000",
        "worker_broker_url: cloud workers cannot reach a broker on localhost; set "
        "MURMUR_WORKER_BROKER_URL (ideally a Redis user limited to transcribe.* keys)",
    ]


def test_a_server_type_outside_its_zones_is_refused(tmp_path: Path) -> None:
    text = GROUPS + profile("p100", server_type="RENDER-S", compute_type="float32")
    assert problems_of(tmp_path, text) == [
        "profiles.p100.zone: RENDER-S is not offered in fr-par-2 (offered in fr-par-1)"
    ]


def local_profile(name: str, **fields: object) -> str:
    return profile(
        name,
        provider="local",
        zone="local",
        server_type="local-cpu",
        compute_type="int8",
        hourly_cost_eur=0.0,
        **fields,
    ).replace('image = "murmur-worker-gpu"\n', "")


def test_a_local_worker_python_must_be_an_executable_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (venv / "plain").write_text("")  # not executable
    monkeypatch.chdir(tmp_path)  # a relative path is taken from the working directory
    local = "".join(
        local_profile(name, worker_image="", security_group="", worker_python=path)
        for name, path in (
            ("ok", "venv/bin/python"),
            ("absolute", str(venv / "python")),
            ("missing", "venv/bin/nope"),
            ("plain", "venv/bin/plain"),
            ("directory", "venv/bin"),
        )
    )
    off = local_profile(
        "off", worker_image="", security_group="", worker_python="gone/python", enabled=False
    )
    assert problems_of(tmp_path, local + off) == [
        "profiles.missing.worker_python: venv/bin/nope does not exist (or is not a file)",
        "profiles.plain.worker_python: venv/bin/plain is not executable",
        "profiles.directory.worker_python: venv/bin does not exist (or is not a file)",
    ]
    result = CliRunner().invoke(
        murmur, ["validate-config", "--config", str(tmp_path / "murmur.toml")], env=SECRETS
    )
    assert result.exit_code == 1
    assert "  - profiles.plain.worker_python: venv/bin/plain is not executable" in result.output
    settings = load_settings(tmp_path / "murmur.toml", env=SECRETS)
    assert settings.profile("ok").worker_python == "venv/bin/python"
    assert settings.profile("ok").cpu_threads is None


def test_cpu_threads_is_a_count(tmp_path: Path) -> None:
    text = local_profile("cpu", worker_image="", security_group="", cpu_threads=-1)
    assert problems_of(tmp_path, text) == [
        "profiles.0.cpu_threads: Input should be greater than or equal to 0"
    ]
    text = local_profile("cpu", worker_image="", security_group="", cpu_threads=1)
    assert problems_of(tmp_path, text) == []
