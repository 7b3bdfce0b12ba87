"""The worker image's Dockerfile refers only to files, requirement sets and assets that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gpu_worker.manifest import load_manifest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "worker.Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def copied_sources() -> list[str]:
    sources = []
    for keyword, rest in instructions():
        if keyword == "COPY" and "--from" not in rest:
            sources.extend(shlex.split(rest)[:-1])
    return sources


def requirement_includes(path: Path) -> list[Path]:
    includes = []
    for line in path.read_text().splitlines():
        if line.startswith(("-r ", "--requirement ")):
            includes.append(path.parent / line.split(maxsplit=1)[1].strip())
    return includes


def test_every_copied_path_exists():
    sources = copied_sources()

    assert sources
    for source in sources:
        assert (REPO / source).exists(), source


def test_every_requirement_set_exists_and_its_includes_are_copied_too():
    copied = {REPO / source for source in copied_sources()}
    named = set(re.findall(r"requirements/[\w.-]+\.txt", DOCKERFILE.read_text()))

    assert "requirements/worker-gpu.txt" in named
    for name in named:
        path = REPO / name
        assert path.is_file(), name
        for include in requirement_includes(path):
            assert include.is_file(), include
            assert include in copied, f"{include.name} is included by {name} but not copied"


def test_gpu_requirements_are_pinned():
    for line in (REPO / "requirements" / "worker-gpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.+]+", line), line


def test_every_manifest_asset_is_verified_at_build_time():
    runs = "\n".join(rest for keyword, rest in instructions() if keyword == "RUN")
    match = re.search(r"-m gpu_worker verify-assets ([\w.\- ]+)$", runs, re.MULTILINE)

    assert match, "the image build must run `python -m gpu_worker verify-assets`"
    verified = set(match.group(1).split())
    assert verified == set(load_manifest().assets)


def test_baked_assets_are_downloaded_where_the_manifest_looks():
    text = DOCKERFILE.read_text()
    for asset in load_manifest().assets.values():
        if asset.dir is not None:
            assert asset.dir in text, f"{asset.name}: {asset.dir} is never filled by the build"


@pytest.mark.parametrize(
    "setting", ["HF_HUB_OFFLINE=1", "PYANNOTE_METRICS_ENABLED=false", "NLTK_DATA="]
)
def test_offline_settings_are_in_the_environment(setting):
    env = " ".join(rest for keyword, rest in instructions() if keyword == "ENV")

    assert setting in env


def test_the_worker_does_not_run_as_root():
    users = [rest for keyword, rest in instructions() if keyword == "USER"]

    assert users and users[-1] not in ("root", "0")


def test_the_image_starts_the_worker():
    keywords = dict(instructions())

    assert keywords["ENTRYPOINT"] == '["python", "-m", "gpu_worker"]'
    assert keywords["CMD"] == '["run"]'
    assert keywords["FROM"].startswith("nvidia/cuda:12.6")


def test_the_image_ships_the_wire_contract() -> None:
    # The contract both sides import lives in gpu_worker/protocol/ (docs/worker-protocol.md).
    assert "gpu_worker" in copied_sources()
    assert (REPO / "gpu_worker" / "protocol" / "__init__.py").is_file()
