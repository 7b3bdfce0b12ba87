"""Where uploaded audio lives: one small interface, a local directory or an S3-compatible bucket.

Invariants, whichever store: an upload is staged in a local file first (the probe reads that
copy), and becomes visible under its key only whole (a rename; a single PUT or a completed
multipart upload), so no reader ever sees part of one. A store that cannot be reached raises
`Refused("storage_unavailable")` (503 with Retry-After); a key with nothing behind it raises
`Refused("audio_not_found")`. No error or log line carries a credential. `open_store` picks the
implementation from `storage.backend`; nothing else asks which one it is.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

from app.errors import Refused
from app.private_files import private_dir

if TYPE_CHECKING:
    from app.config import Settings

log = logging.getLogger(__name__)


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
        """Make a staged file the audio stored under `key` (the staged file is consumed)."""

    def open(self, key: str) -> IO[bytes]: ...

    def size(self, key: str) -> int: ...

    def delete(self, key: str) -> None:
        """Delete the audio under `key`; nothing there is not an error."""

    def copy_in(self, src: IO[bytes], key: str) -> None:
        """Store a copy of `src` under `key` (through staging, so readers never see part)."""

    def remove_stale_staging(self, max_age_seconds: float) -> int:
        """Delete staged files (and unfinished uploads) older than this, left by a crash
        mid-upload; how many."""

    def direct_url(self, key: str, expires_in: int) -> str | None:
        """A URL that reads `key` for `expires_in` seconds without the API, or None when
        this store has no such thing (the worker then goes through the signed API route)."""

    def health(self) -> str | None:
        """None when the store is usable, else why not: a cached answer, never one request to
        the store per call (/readyz asks it on every probe)."""
        ...

    def problems(self) -> list[str]:
        """Why this store cannot take audio now (unreachable, not writable); empty if it can."""


def open_store(settings: Settings) -> AudioStore:
    """The audio store `settings.storage.backend` names."""
    if settings.storage.backend == "s3":
        return S3AudioStore(settings)
    return LocalAudioStore(settings.storage_path)


def _check_key(key: str) -> str:
    if not key or "/" in key or key.startswith("."):
        raise ValueError("invalid storage key")
    return key


def _not_found(key: str) -> Refused:
    return Refused("audio_not_found", "the job's audio is not in the audio store")


class LocalAudioStore:
    """Audio files in one directory, named by key; writes are atomic renames."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        # Only the service's user may list or read the audio: directories 0700, and files
        # 0600 because each starts as a mkstemp file (0600) that is renamed into place.
        private_dir(self.root)
        private_dir(self.root / ".staging")

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def staging_path(self) -> Path:
        with full_is_refused():
            fd, name = tempfile.mkstemp(dir=self.root / ".staging")
        os.close(fd)
        return Path(name)

    def commit(self, staged: Path, key: str) -> None:
        with full_is_refused():
            os.replace(staged, self._path(key))

    def open(self, key: str) -> IO[bytes]:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError:  # another host's upload, or swept meanwhile
            raise _not_found(key) from None

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise _not_found(key) from None

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def remove_stale_staging(self, max_age_seconds: float) -> int:
        return _remove_stale_files(self.root / ".staging", max_age_seconds)

    def copy_in(self, src: IO[bytes], key: str) -> None:
        staged = self.staging_path()
        try:
            with full_is_refused(), staged.open("wb") as out:
                shutil.copyfileobj(src, out)
            self.commit(staged, key)
        except BaseException:
            staged.unlink(missing_ok=True)  # a full disk leaves no partial file behind
            raise

    def health(self) -> str | None:
        return None  # the local disk's free space is /readyz's own check

    def direct_url(self, key: str, expires_in: int) -> str | None:
        return None

    def problems(self) -> list[str]:
        if not os.access(self.root, os.W_OK | os.X_OK):
            return [f"storage_path: {self.root} is not writable by this process"]
        return []


def _remove_stale_files(folder: Path, max_age_seconds: float) -> int:
    cutoff = time.time() - max_age_seconds
    removed = 0
    for path in folder.iterdir():
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # another sweep, or the upload finishing, got there first
            continue
    return removed


def _s3_errors() -> tuple[type[Exception], ...]:
    """The exceptions of an S3 exchange that failed; anything else is a bug of ours."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError, Boto3Error)


# S3 error codes that mean "nothing under this key" rather than "the store is unwell".
_MISSING = {"NoSuchKey", "404", "NotFound"}


# How long a bucket's health (a one-object listing) is cached, and the longest the probe may
# take: /readyz never makes more than one request to the bucket per this many seconds.
HEALTH_TTL_SECONDS = 10.0
# A hung operation's threads: they end with botocore's own timeouts, after the caller's answer.
_S3_THREADS = 16


class S3AudioStore:
    """Audio as objects in one bucket of an S3-compatible service (AWS, Scaleway, MinIO, Ceph).

    Uploads are staged in `storage_path/.staging` on the local disk (the probe reads that copy),
    then sent with boto3's transfer manager: one PUT, or a multipart upload in parts of
    `storage.multipart_chunk_bytes` when larger, which boto3 aborts if a part fails; one a
    crash left unfinished is aborted by `remove_stale_staging` (and, as a second guard, by the
    bucket's lifecycle rule, docs/operations.md). boto3 is imported only when this store is
    built: the local store and the worker never need it.
    """

    def __init__(self, settings: Settings) -> None:
        self._storage = settings.storage
        self._access_key = settings.reveal("s3_access_key_id")
        self._secret_key = settings.reveal("s3_secret_access_key")
        self.bucket = settings.storage.bucket
        self.prefix = settings.storage.key_prefix
        self.staging = Path(settings.storage_path) / ".staging"
        private_dir(Path(settings.storage_path))
        private_dir(self.staging)
        self._client: Any = None
        self._lock = threading.Lock()
        self._errors = _s3_errors()
        # Every S3 operation answers within one overall deadline (`timeout_seconds`, retries
        # and all): it runs on this pool and the caller waits no longer (issue 32 §3).
        self._pool = ThreadPoolExecutor(_S3_THREADS, thread_name_prefix="s3")
        self._health_lock = threading.Lock()
        self._health: tuple[float, str | None] | None = None  # (monotonic time, problem)
        # Until this monotonic time the bucket is known to hang: fail at once, not after
        # another deadline (the cleanup after a failed upload, say).
        self._hung_until = 0.0

    def __repr__(self) -> str:  # never the credentials
        return f"S3AudioStore(bucket={self.bucket!r}, endpoint={self._where()!r})"

    def _where(self) -> str:
        return self._storage.endpoint_url or f"AWS S3 ({self._storage.region})"

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                timeout = self._storage.timeout_seconds
                self._client = boto3.session.Session(
                    aws_access_key_id=self._access_key,
                    aws_secret_access_key=self._secret_key,
                    region_name=self._storage.region,
                ).client(
                    "s3",
                    endpoint_url=self._storage.endpoint_url,
                    config=Config(
                        signature_version="s3v4",
                        # Path-style URLs for a service of its own (MinIO, Ceph and most
                        # others need them); AWS picks its own.
                        s3={"addressing_style": "path" if self._storage.endpoint_url else "auto"},
                        connect_timeout=timeout,
                        read_timeout=timeout,
                        retries={"max_attempts": 3, "mode": "standard"},
                        # Checksums only where the API requires them: several S3-compatible
                        # services refuse the CRC headers newer clients add by default.
                        request_checksum_calculation="when_required",
                        response_checksum_validation="when_required",
                    ),
                )
            return self._client

    def _key(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def _unavailable(self, exc: Exception, doing: str) -> Refused:
        # The error's class and code only: botocore messages may quote the request.
        log.warning(
            "audio store %s: %s failed: %s %s",
            self._where(),
            doing,
            type(exc).__name__,
            _error_code(exc) or "",
        )
        return Refused("storage_unavailable", "the audio store is unavailable; retry shortly")

    def _bounded(self, doing: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` within the store's deadline, else `storage_unavailable`; an
        S3 error (`self._errors`) is raised as it is, for the caller to sort."""
        if time.monotonic() < self._hung_until:
            log.warning("audio store %s: %s skipped: the bucket hangs", self._where(), doing)
            raise Refused("storage_unavailable", "the audio store is unavailable; retry shortly")
        future = self._pool.submit(fn, *args, **kwargs)
        try:
            return future.result(timeout=self._storage.timeout_seconds)
        except FutureTimeout:
            future.cancel()
            self._hung_until = time.monotonic() + HEALTH_TTL_SECONDS
            # One assignment (atomic): health() may be the caller, holding its lock.
            self._health = (time.monotonic(), f"{doing} got no answer in time")
            log.warning(
                "audio store %s: %s got no answer within %s s",
                self._where(),
                doing,
                self._storage.timeout_seconds,
            )
            raise Refused(
                "storage_unavailable", "the audio store is unavailable; retry shortly"
            ) from None

    def health(self) -> str | None:
        """The bucket's health, probed (a one-object listing) at most once per
        HEALTH_TTL_SECONDS; while one probe runs, other callers get the last answer."""
        now = time.monotonic()
        cached = self._health
        if cached is not None and now - cached[0] < HEALTH_TTL_SECONDS:
            return cached[1]
        if not self._health_lock.acquire(blocking=False):
            return cached[1] if cached is not None else None
        try:
            try:
                self._bounded(
                    "health probe",
                    lambda: self.client.list_objects_v2(
                        Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1
                    ),
                )
                problem = None
            except Refused:
                problem = f"bucket {self.bucket!r} got no answer in time"
            except self._errors as exc:
                problem = f"bucket {self.bucket!r}: {_error_code(exc) or type(exc).__name__}"
            if problem is None:
                self._hung_until = 0.0
            self._health = (time.monotonic(), problem)
            return problem
        finally:
            self._health_lock.release()

    def staging_path(self) -> Path:
        with full_is_refused():
            fd, name = tempfile.mkstemp(dir=self.staging)
        os.close(fd)
        return Path(name)

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        chunk = self._storage.multipart_chunk_bytes
        # At most `max_concurrency` parts are in flight at once: memory stays bounded by the
        # part size, not the file's.
        return TransferConfig(
            multipart_threshold=chunk,
            multipart_chunksize=chunk,
            max_concurrency=4,
        )

    def commit(self, staged: Path, key: str) -> None:
        try:
            self._bounded(
                "upload",
                self.client.upload_file,
                str(staged),
                self.bucket,
                self._key(key),
                Config=self._transfer_config(),
            )
        except self._errors as exc:
            raise self._unavailable(exc, "upload") from None
        finally:
            staged.unlink(missing_ok=True)

    def copy_in(self, src: IO[bytes], key: str) -> None:
        try:
            self._bounded(
                "upload",
                self.client.upload_fileobj,
                src,
                self.bucket,
                self._key(key),
                Config=self._transfer_config(),
            )
        except self._errors as exc:
            raise self._unavailable(exc, "upload") from None

    def open(self, key: str) -> IO[bytes]:
        try:
            body = self._bounded(
                "read", self.client.get_object, Bucket=self.bucket, Key=self._key(key)
            )["Body"]
        except self._errors as exc:
            if _error_code(exc) in _MISSING:
                raise _not_found(key) from None
            raise self._unavailable(exc, "read") from None
        return cast(IO[bytes], body)

    def size(self, key: str) -> int:
        try:
            head = self._bounded(
                "head", self.client.head_object, Bucket=self.bucket, Key=self._key(key)
            )
        except self._errors as exc:
            if _error_code(exc) in _MISSING:
                raise _not_found(key) from None
            raise self._unavailable(exc, "head") from None
        return int(head["ContentLength"])

    def delete(self, key: str) -> None:
        try:
            self._bounded(
                "delete", self.client.delete_object, Bucket=self.bucket, Key=self._key(key)
            )
        except self._errors as exc:
            if _error_code(exc) in _MISSING:
                return
            raise self._unavailable(exc, "delete") from None

    def remove_stale_staging(self, max_age_seconds: float) -> int:
        removed = _remove_stale_files(self.staging, max_age_seconds)
        cutoff = datetime.now(UTC) - timedelta(seconds=max_age_seconds)
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for page in pages:
                for upload in page.get("Uploads", []):
                    if upload["Initiated"] < cutoff:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                        removed += 1
        except self._errors as exc:
            # A sweep meets the outage again next time; it must not fail the retention task.
            self._unavailable(exc, "abort unfinished uploads")
        return removed

    def direct_url(self, key: str, expires_in: int) -> str | None:
        # Signed locally: no request to the bucket. The URL carries the access key's id (not
        # its secret) and is good for any GET of this one object until it expires.
        return cast(
            str,
            self.client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self._key(key)},
                ExpiresIn=expires_in,
            ),
        )

    def problems(self) -> list[str]:
        """Whether the bucket answers (reachable), then whether a small object can be written
        and deleted (writable); each says which of the two failed and why, never a secret."""
        where = f"storage: bucket {self.bucket!r} at {self._where()}"
        try:
            # A listing, not HEAD: its error has a body that says which credential is wrong.
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        except self._errors as exc:
            return [f"{where} is not reachable: {_reason(exc)}"]
        probe = f"{self.prefix}.murmur-write-check-{uuid.uuid4().hex}"
        try:
            self.client.put_object(Bucket=self.bucket, Key=probe, Body=b"murmur")
            self.client.delete_object(Bucket=self.bucket, Key=probe)
        except self._errors as exc:
            return [f"{where} is reachable but not writable: {_reason(exc)}"]
        return []


def _error_code(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


_REASONS = {
    "404": "no such bucket",
    "NoSuchBucket": "no such bucket",
    "403": "access denied (wrong credentials, or no right on this bucket)",
    "AccessDenied": "access denied (no right on this bucket for these credentials)",
    "InvalidAccessKeyId": "the access key id is unknown to the service",
    "SignatureDoesNotMatch": "the secret access key does not match the access key id",
    "AuthorizationHeaderMalformed": "the bucket is in another region: set storage.region",
    "PermanentRedirect": "the bucket is in another region or endpoint: set storage.region",
    "301": "the bucket is in another region or endpoint: set storage.region",
}


def _reason(exc: Exception) -> str:
    code = _error_code(exc)
    if code is not None:
        return _REASONS.get(code, f"the service answered {code}")
    return f"no answer ({type(exc).__name__})"
