"""Where uploaded audio lives: one small interface, a local-directory implementation by default."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Protocol

from app.errors import Refused
from app.private_files import private_dir


class StorageFull(Refused):
    """The audio store has no room (or quota) left: `507 insufficient_storage`, retry later.
    Any store raises it from a write that ran out of space; the caller keeps nothing."""

    def __init__(self) -> None:
        super().__init__("insufficient_storage", "the audio store is full; retry later")


_FULL = {errno.ENOSPC, errno.EDQUOT}


@contextmanager
def full_is_refused() -> Iterator[None]:
    """Turn a write's ENOSPC (or EDQUOT) into `StorageFull`; other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _FULL:
            raise StorageFull() from exc
        raise


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


class AudioStore(Protocol):
    def staging_path(self) -> Path:
        """A fresh local file to stream an upload into before it is accepted."""

    def commit(self, staged: Path, key: str) -> None:
        """Make a staged file the audio stored under `key`."""

    def open(self, key: str) -> IO[bytes]: ...

    def size(self, key: str) -> int: ...

    def delete(self, key: str) -> None: ...

    def copy_in(self, src: IO[bytes], key: str) -> None:
        """Store a copy of `src` under `key` (through staging, so readers never see part)."""

    def remove_stale_staging(self, max_age_seconds: float) -> int:
        """Delete staged files older than this (left by a crash mid-upload); how many."""


class LocalAudioStore:
    """Audio files in one directory, named by key; writes are atomic renames."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        # Only the service's user may list or read the audio: directories 0700, and files
        # 0600 because each starts as a mkstemp file (0600) that is renamed into place.
        private_dir(self.root)
        private_dir(self.root / ".staging")

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError("invalid storage key")
        return self.root / key

    def staging_path(self) -> Path:
        with full_is_refused():
            fd, name = tempfile.mkstemp(dir=self.root / ".staging")
        os.close(fd)
        return Path(name)

    def commit(self, staged: Path, key: str) -> None:
        with full_is_refused():
            os.replace(staged, self._path(key))

    def open(self, key: str) -> IO[bytes]:
        return self._path(key).open("rb")

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def remove_stale_staging(self, max_age_seconds: float) -> int:
        cutoff = time.time() - max_age_seconds
        removed = 0
        for path in (self.root / ".staging").iterdir():
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:  # another sweep, or the upload finishing, got there first
                continue
        return removed

    def copy_in(self, src: IO[bytes], key: str) -> None:
        staged = self.staging_path()
        try:
            with full_is_refused(), staged.open("wb") as out:
                shutil.copyfileobj(src, out)
            self.commit(staged, key)
        except BaseException:
            staged.unlink(missing_ok=True)  # a full disk leaves no partial file behind
            raise
