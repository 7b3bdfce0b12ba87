"""Files and directories only their owner can read: the database, stored audio, local secrets.

Modes are given at creation (`os.open`/`os.mkdir` with 0600/0700), never fixed afterwards, so
there is no moment when another local user could open the file, whatever the process umask.
Paths that already exist and belong to this user are tightened to the same modes, so an
installation created before this rule stops being readable too.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def tighten(path: Path, mode: int = FILE_MODE) -> None:
    """Drop group/other bits of a path this user owns (someone else's is left as it is)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(stat.S_IMODE(info.st_mode) & mode)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create `path` (and missing parents) as 0700; an existing one of ours is tightened."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # created meanwhile by another process
            os.mkdir(directory, DIR_MODE)  # the umask can only remove bits from 0700
    tighten(path, DIR_MODE)
    return path


def private_file(path: str | os.PathLike[str]) -> Path:
    """Create an empty `path` as 0600 if it does not exist; an existing one of ours is tightened."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        tighten(path, FILE_MODE)
    else:
        os.close(fd)
    return path


def write_private_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace `path`'s content with `text`; the file is 0600 from the first byte written."""
    path = Path(path)
    private_file(path)
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w") as out:
        out.write(text)
