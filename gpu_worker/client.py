"""The worker's HTTP client for the control plane: ready, claim, status, result, failure, audio.

Every path comes from gpu_worker/protocol/routes.py and every body from the protocol's models,
the ones the control plane parses with. Every call has a bounded timeout. The bearer token
goes only to the control plane's `/internal/workers/...` endpoints, never to the audio URL,
and neither the token nor a signed URL's query string appears in a log line or an exception
message: requests puts the full URL into its exception texts, so those are replaced, not
chained.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import requests
from pydantic import SecretStr, ValidationError

from gpu_worker.protocol import routes
from gpu_worker.protocol.claim import ClaimedJob
from gpu_worker.protocol.failure import Failure
from gpu_worker.protocol.readiness import ReadinessRuntime, ReadyBody
from gpu_worker.protocol.transcript import ResultBody, Transcript

log = logging.getLogger(__name__)
# urllib3 logs every request line, query string (audio signature) included, at DEBUG.
logging.getLogger("urllib3.connectionpool").setLevel(logging.INFO)

# (connect, read) seconds. Reads are generous because a result body for a 4-hour file is
# several MB; the connect timeout keeps a dead control plane from stalling a job.
DEFAULT_TIMEOUT = (5.0, 60.0)
# The job-status check runs between segments of a transcription: it must never stall one.
STATUS_TIMEOUT = (2.0, 3.0)
# Far above any upload the control plane accepts (25 MiB by default); a guard against a
# runaway body, not a policy.
DEFAULT_MAX_AUDIO_BYTES = 1024 * 1024 * 1024
# Audio up to this size stays in memory; larger files spill to a temporary file.
SPOOL_BYTES = 32 * 1024 * 1024
_CHUNK = 1024 * 1024


class ControlPlaneError(Exception):
    """The control plane answered with an error, or did not answer."""

    def __init__(self, message: str, *, status: int | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ControlPlaneUnavailable(ControlPlaneError):
    """A transient failure (no connection, timeout, 5xx, 429): trying again may work."""


class RuntimeMismatch(ControlPlaneError):
    """The control plane refused this worker's runtime (409 runtime_mismatch)."""


class AudioDownloadError(Exception):
    """The job's audio could not be fetched."""


class AudioTooLarge(AudioDownloadError):
    pass


def redact_url(url: str) -> str:
    """The URL without query, fragment or credentials: safe to log."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class ControlPlaneClient:
    def __init__(
        self,
        control_url: str,
        worker_id: str,
        instance_id: str,
        token: SecretStr,
        *,
        session: requests.Session | None = None,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        attempts: int = 4,
        backoff_seconds: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._base = control_url.rstrip("/")
        self._worker_path = routes.worker_prefix(worker_id, instance_id)
        self._token = token
        self._session = session or requests.Session()
        self._timeout = timeout
        self._attempts = attempts
        self._backoff = backoff_seconds
        self._sleep = sleep

    def ready(self, runtime: ReadinessRuntime) -> None:
        """Report readiness; raises RuntimeMismatch when the control plane refuses it."""
        try:
            self._post(routes.READY, ReadyBody.of(runtime).to_json(), retry=True)
        except ControlPlaneError as exc:
            if exc.status == 409:
                raise RuntimeMismatch(str(exc), status=409, code=exc.code) from None
            raise

    def claim(self, job_id: str) -> ClaimedJob | None:
        """Claim a job; None when it is not claimable (done, cancelled, someone else's)."""
        try:
            # No retry here: the task retries as a whole, so one claim is one request.
            body = self._post(routes.job_route(routes.CLAIM, job_id), {}, retry=False)
        except ControlPlaneError as exc:
            if exc.status == 409:
                return None
            raise
        try:
            return ClaimedJob.model_validate(body["job"])
        except (KeyError, TypeError, ValidationError) as exc:
            raise ControlPlaneError(f"claim for job {job_id}: unexpected answer ({exc})") from None

    def post_result(self, job_id: str, transcript: Transcript, processing_seconds: float) -> bool:
        """Store a transcript; returns False when it was already stored (a repeated run)."""
        result = ResultBody(transcript=transcript, processing_seconds=processing_seconds)
        body = self._post(routes.job_route(routes.RESULT, job_id), result.to_json(), retry=True)
        return bool(body.get("stored", False))

    def post_failure(self, job_id: str, code: str, message: str) -> bool:
        # Cut to what the control plane accepts: a longer message would lose the failure.
        failure = Failure.of(code, message)
        body = self._post(routes.job_route(routes.FAILURE, job_id), failure.to_json(), retry=True)
        return bool(body.get("stored", False))

    def post_progress(self, job_id: str, report: Mapping[str, Any]) -> bool:
        """Send hot progress (gpu_worker/protocol/progress.py `ProgressBody`); retried, since
        the control plane applies a report once by its `seq`. False once the job is not ours."""
        body = self._post(
            routes.job_route(routes.PROGRESS, job_id),
            dict(report),
            retry=True,
            timeout=STATUS_TIMEOUT,
        )
        return bool(body.get("accepted", False))

    def job_held(self, job_id: str) -> bool:
        """Whether the control plane still has this worker on the job (False once cancelled)."""
        body = self._post(
            routes.job_route(routes.STATUS, job_id), {}, retry=False, timeout=STATUS_TIMEOUT
        )
        return bool(body.get("held", True))

    def release(self, job_id: str) -> bool:
        """Hand a running job back (draining), so the next worker may claim it at once."""
        body = self._post(routes.job_route(routes.RELEASE, job_id), {}, retry=False)
        return bool(body.get("released", False))

    def heartbeat(self) -> None:
        """Say this worker process is alive (when usage reports, which also say so, are off)."""
        self._post(routes.HEARTBEAT, {}, retry=False)

    def post_report(self, report: Mapping[str, Any]) -> None:
        """Send a usage report (docs/observability.md); for the reporter thread."""
        self._post(routes.REPORT, dict(report), retry=False)

    def download_audio(
        self, audio_url: str, *, max_bytes: int = DEFAULT_MAX_AUDIO_BYTES
    ) -> IO[bytes]:
        """Stream the job's audio into a spooled temporary file, rewound; caller closes it."""
        url = self._absolute(audio_url)
        safe_url = redact_url(url)
        if urlsplit(url).scheme not in ("http", "https"):
            raise AudioDownloadError(f"audio URL {safe_url!r} is not http(s)")
        try:
            # The URL carries its own signature: no Authorization header here.
            response = self._session.get(url, stream=True, timeout=self._timeout)
        except requests.RequestException as exc:
            raise AudioDownloadError(f"GET {safe_url} failed: {type(exc).__name__}") from None
        with response:
            if response.status_code != 200:
                raise AudioDownloadError(f"GET {safe_url} answered {response.status_code}")
            declared = response.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise AudioTooLarge(f"audio is {declared} bytes, the limit is {max_bytes}")
            spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
            try:
                received = 0
                for chunk in response.iter_content(_CHUNK):
                    received += len(chunk)
                    if received > max_bytes:
                        raise AudioTooLarge(f"audio exceeds the limit of {max_bytes} bytes")
                    spool.write(chunk)
            except requests.RequestException as exc:
                spool.close()
                raise AudioDownloadError(
                    f"GET {safe_url} broke off after {received} bytes: {type(exc).__name__}"
                ) from None
            except BaseException:
                spool.close()
                raise
        spool.seek(0)
        log.info("downloaded %d bytes of audio from %s", received, safe_url)
        return spool

    def _absolute(self, url: str) -> str:
        if urlsplit(url).scheme:
            return url
        return f"{self._base}/{url.lstrip('/')}"

    def _post(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        retry: bool,
        timeout: tuple[float, float] | None = None,
    ) -> dict[str, Any]:
        url = f"{self._base}{self._worker_path}{path}"
        attempts = self._attempts if retry else 1
        for attempt in range(1, attempts + 1):
            try:
                return self._post_once(url, path, body, timeout or self._timeout)
            except ControlPlaneUnavailable as exc:
                if attempt == attempts:
                    raise
                delay = self._backoff * 2 ** (attempt - 1)
                log.warning("POST %s: %s; retrying in %.0f s", path, exc, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _post_once(
        self, url: str, path: str, body: Mapping[str, Any], timeout: tuple[float, float]
    ) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self._token.get_secret_value()}"}
        try:
            response = self._session.post(url, json=body, headers=headers, timeout=timeout)
        except requests.RequestException as exc:
            raise ControlPlaneUnavailable(
                f"POST {path}: no answer from the control plane ({type(exc).__name__})"
            ) from None
        if response.status_code == 200:
            try:
                answer = response.json()
            except ValueError:
                raise ControlPlaneError(f"POST {path}: answer is not JSON", status=200) from None
            return answer if isinstance(answer, dict) else {}
        code, message = _error_of(response)
        error_type = (
            ControlPlaneUnavailable
            if response.status_code >= 500 or response.status_code == 429
            else ControlPlaneError
        )
        raise error_type(
            f"POST {path}: {response.status_code} {code}: {message}".rstrip(": "),
            status=response.status_code,
            code=code,
        )


def _error_of(response: requests.Response) -> tuple[str, str]:
    """The API's `{"error": {"code", "message"}}`, or the status line when it is not that."""
    try:
        error = response.json()["error"]
        return str(error.get("code", "")), str(error.get("message", ""))[:500]
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"http_{response.status_code}", ""
