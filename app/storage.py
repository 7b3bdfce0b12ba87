"""Where uploaded audio lives: one small interface, a local-directory implementation by default."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Protocol


class AudioStore(Protocol):
    def staging_path(self) -> Path:
        """A fresh local file to stream an upload into before it is accepted."""

    def commit(self, staged: Path, key: str) -> None:
        """Make a staged file the audio stored under `key`."""

    def open(self, key: str) -> IO[bytes]: ...

    def size(self, key: str) -> int: ...

    def delete(self, key: str) -> None: ...


class LocalAudioStore:
    """Audio files in one directory, named by key; writes are atomic renames."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / ".staging").mkdir(exist_ok=True)

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError("invalid storage key")
        return self.root / key

    def staging_path(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self.root / ".staging")
        os.close(fd)
        return Path(name)

    def commit(self, staged: Path, key: str) -> None:
        os.replace(staged, self._path(key))

    def open(self, key: str) -> IO[bytes]:
        return self._path(key).open("rb")

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def copy_in(self, src: IO[bytes], key: str) -> None:
        staged = self.staging_path()
        with staged.open("wb") as out:
            shutil.copyfileobj(src, out)
        self.commit(staged, key)
