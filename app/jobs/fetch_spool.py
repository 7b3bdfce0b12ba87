"""A URL job's fetched audio, kept on the I/O worker's disk until the audio store takes it.

A fetch that downloaded and probed a URL's content but found the audio store unavailable keeps
the file here, under its job's id, so that its retry only tries the store again: an outage of
the store costs one download per job, not one per retry (issue 32 §3).

Invariants:
- An entry is one file, `<job id>~<duration>`, renamed into `storage_path/.fetched` whole: a
  reader finds all of it or nothing. Its size is the file's; its duration is what the probe
  found, so a retry neither downloads nor decodes again.
- The store gets a link to the entry (a copy where links are not possible), never the entry
  itself: a store that consumes its staged file on failure (S3) leaves the entry in place.
- Disk is bounded three ways: the entries together hold at most `io.fetches ×
  api.max_upload_bytes` (what the fetches in flight may stage at once anyway; a fetch that
  finds no room stores straight from staging, as before, and downloads again after an outage);
  an entry goes when its audio is stored, when its fetch finds the job ended (cancelled,
  failed, stored by another fetch) or gives up waiting; and every entry older than
  `MAX_AGE_SECONDS` (past any fetch's wait deadline) is deleted by the fetch sweep.
- The spool is per host: a retry that lands on another I/O host downloads the URL once there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from app.config import Settings
from app.jobs.io_slots import FETCH_DEADLINE_SECONDS, SLOT_WAIT_SECONDS
from app.private_files import private_dir
from app.storage import full_is_refused

log = logging.getLogger(__name__)

FOLDER = ".fetched"
# Past the wait deadline of any fetch (then its job fails and the fetch deletes the entry), with
# the margin of one last download: an entry this old belongs to a fetch that is gone.
MAX_AGE_SECONDS = SLOT_WAIT_SECONDS + FETCH_DEADLINE_SECONDS + 600
_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Kept:
    path: Path
    size: int
    duration_seconds: float


class FetchSpool:
    """The kept downloads of one host: `storage_path/.fetched`, at most `max_bytes`."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    @classmethod
    def of(cls, settings: Settings) -> FetchSpool:
        return cls(
            Path(settings.storage_path) / FOLDER,
            settings.io.fetches * settings.api.max_upload_bytes,
        )

    def find(self, job_id: str) -> Kept | None:
        """The job's kept download, if this host has one."""
        for path in self._entries(job_id):
            _, _, duration = path.name.partition("~")
            try:
                return Kept(path, path.stat().st_size, float(duration))
            except (OSError, ValueError):
                continue
        return None

    def keep(self, job_id: str, staged: Path, duration_seconds: float) -> Kept | None:
        """Move `staged` (a probed download) into the spool for the job; None, with `staged`
        left where it is, when the spool has no room for it."""
        if not _JOB_ID.fullmatch(job_id):
            return None
        size = staged.stat().st_size
        if self.used_bytes() + size > self.max_bytes:
            log.warning("fetch spool full: the download of %s is not kept", job_id)
            return None
        private_dir(self.root)
        path = self.root / f"{job_id}~{duration_seconds!r}"
        os.replace(staged, path)
        return Kept(path, size, duration_seconds)

    def staged_copy(self, kept: Kept, staged: Path) -> bool:
        """Make `staged` (a fresh staging file of the store) the kept content: a hard link, or
        a copy across filesystems. False, with `staged` removed, if the entry went meanwhile."""
        staged.unlink(missing_ok=True)
        try:
            os.link(kept.path, staged)
        except FileNotFoundError:
            return False
        except OSError:  # another filesystem, or one without links
            try:
                with full_is_refused():
                    shutil.copyfile(kept.path, staged)
            except FileNotFoundError:
                staged.unlink(missing_ok=True)
                return False
        return True

    def discard(self, job_id: str) -> None:
        """Delete the job's kept download, if any."""
        for path in self._entries(job_id):
            path.unlink(missing_ok=True)

    def used_bytes(self) -> int:
        total = 0
        for path in self._all():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def prune(self, max_age_seconds: float = MAX_AGE_SECONDS) -> int:
        """Delete entries older than `max_age_seconds`; how many."""
        cutoff = time.time() - max_age_seconds
        removed = 0
        for path in self._all():
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def _entries(self, job_id: str) -> list[Path]:
        if not _JOB_ID.fullmatch(job_id):
            return []
        return [p for p in self._all() if p.name.startswith(job_id + "~")]

    def _all(self) -> list[Path]:
        try:
            return [p for p in self.root.iterdir() if p.is_file()]
        except FileNotFoundError:
            return []
