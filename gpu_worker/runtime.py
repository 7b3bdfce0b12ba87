"""The worker's runtime profile, read from the `MURMUR_*` environment and validated fail-closed.

Cloud-init (or the `local` provider) writes the environment described in
docs/worker-protocol.md, under the names of gpu_worker/protocol/environment.py. Every value
is checked here, before any model loads; a bad value stops the worker with one message per
bad variable that names it and what it accepts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from gpu_worker.protocol.broker import PROFILE_NAME, queue_name
from gpu_worker.protocol.environment import (
    ALIGNMENT_DEVICE_VAR,
    BATCH_SIZE_VAR,
    BROKER_CA_CERTS_VAR,
    BROKER_MASTER_NAME_VAR,
    BROKER_URL_VAR,
    COMPUTE_TYPE_VAR,
    CONTROL_URL_VAR,
    CPU_THREADS_VAR,
    DEVICE_VAR,
    DIARIZATION_VAR,
    DRAIN_TIMEOUT_VAR,
    IMAGE_PULL_SECONDS_VAR,
    INSTANCE_ID_VAR,
    MODEL_VAR,
    OBSERVABILITY_ENABLED_VAR,
    PROFILE_VAR,
    REPORT_INTERVAL_VAR,
    VAD_VAR,
    WORKER_ID_VAR,
    WORKER_TOKEN_VAR,
)
from gpu_worker.protocol.runtime import (
    ALIGNMENT_DEVICES,
    COMPUTE_TYPES,
    DEFAULT_DRAIN_TIMEOUT_SECONDS,
    DEVICES,
    VAD_BACKENDS,
    AlignmentDevice,
    ComputeType,
    Device,
    VadBackend,
    alignment_fits,
)
from gpu_worker.protocol.usage import DEFAULT_REPORT_INTERVAL_SECONDS

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # ids go into URL paths
_TOKEN = re.compile(r"^[0-9a-f]{64}$")  # HMAC-SHA256, hex


class RuntimeProfileError(Exception):
    """The environment does not describe a runtime this worker may start with."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


class WorkerIdentity(BaseModel):
    """Who this worker is and where it reports; needed to serve jobs, not to check a machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    worker_id: str
    instance_id: str
    token: SecretStr
    control_url: str
    # A Redis URL may carry a password, so it is as secret as the token.
    broker_url: SecretStr
    # Set with a sentinel:// broker URL: the primary's name in Redis Sentinel.
    broker_master_name: str | None = None
    # The CA file a rediss:// broker's certificate is verified against (None: the system's).
    broker_ca_certs: str | None = None


class RuntimeProfile(BaseModel):
    """How this worker transcribes, plus its identity when it serves jobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str | None
    model: str
    device: Device
    compute_type: ComputeType
    vad: VadBackend
    alignment_device: AlignmentDevice
    batch_size: int = Field(ge=1)
    cpu_threads: int = Field(ge=0)
    # The diarization weight set this worker loads (gpu_worker/diarization.py); None: none.
    diarization: str | None = None
    observability_enabled: bool = False
    report_interval_seconds: float = Field(default=DEFAULT_REPORT_INTERVAL_SECONDS, gt=0)
    drain_timeout_seconds: float = Field(default=DEFAULT_DRAIN_TIMEOUT_SECONDS, gt=0)
    identity: WorkerIdentity | None = None

    @property
    def queue(self) -> str:
        if self.profile is None:
            raise RuntimeError(f"no {PROFILE_VAR}: this runtime does not consume a queue")
        return queue_name(self.profile)

    @property
    def torch_on_cuda(self) -> bool:
        """Whether PyTorch (pyannote VAD, wav2vec2 alignment, diarization) runs on the GPU."""
        # WhisperX runs pyannote VAD on the ASR device (docs/runtime.md, "Backend and VAD"),
        # and the diarization stage runs there too (gpu_worker/transcriber.py, load_diarizer).
        on_device = self.vad == "pyannote" or self.diarization is not None
        return (on_device and self.device == "cuda") or self.alignment_device == "cuda"


def load_runtime_profile(
    environ: Mapping[str, str],
    *,
    model_names: Iterable[str],
    require_identity: bool,
    diarization_names: Iterable[str] = (),
) -> RuntimeProfile:
    """Read and validate the runtime; raise RuntimeProfileError listing every bad variable."""
    reader = _EnvReader(environ)
    models = tuple(model_names)
    diarization_sets = tuple(diarization_names)
    model = reader.choice(MODEL_VAR, models)
    device = reader.choice(DEVICE_VAR, DEVICES)
    compute_type = reader.choice(COMPUTE_TYPE_VAR, COMPUTE_TYPES)
    vad = reader.choice(VAD_VAR, VAD_BACKENDS)
    alignment_device = reader.choice(ALIGNMENT_DEVICE_VAR, ALIGNMENT_DEVICES)
    batch_size = reader.integer(BATCH_SIZE_VAR, minimum=1, default=1)
    cpu_threads = reader.integer(CPU_THREADS_VAR, minimum=0, default=0, hint="0 = library default")
    diarization = reader.text(
        DIARIZATION_VAR,
        lambda value: value in diarization_sets,
        f"is not a diarization weight set (one of {', '.join(diarization_sets) or 'none'})",
        required=False,
    )
    observability = reader.choice(OBSERVABILITY_ENABLED_VAR, ("0", "1"), default="0")
    report_interval = reader.seconds(REPORT_INTERVAL_VAR, default=DEFAULT_REPORT_INTERVAL_SECONDS)
    drain_timeout = reader.seconds(DRAIN_TIMEOUT_VAR, default=DEFAULT_DRAIN_TIMEOUT_SECONDS)
    profile = reader.text(
        PROFILE_VAR,
        PROFILE_NAME.fullmatch,
        "is not a profile name (lowercase letters, digits and '-', at most 40)",
        required=require_identity,
    )

    identity = None
    if require_identity:
        identity = _read_identity(reader)

    # Consistency: a GPU alignment model beside a CPU-only ASR runtime means the profile and
    # the server it was written for disagree.
    if not alignment_fits(device, alignment_device):
        reader.problems.append(
            f"{ALIGNMENT_DEVICE_VAR}: 'cuda' needs {DEVICE_VAR}=cuda (this runtime is cpu)"
        )

    if reader.problems:
        raise RuntimeProfileError(reader.problems)
    return RuntimeProfile.model_validate(
        {
            "profile": profile,
            "model": model,
            "device": device,
            "compute_type": compute_type,
            "vad": vad,
            "alignment_device": alignment_device,
            "batch_size": batch_size,
            "cpu_threads": cpu_threads,
            "diarization": diarization,
            "observability_enabled": observability == "1",
            "report_interval_seconds": report_interval,
            "drain_timeout_seconds": drain_timeout,
            "identity": identity,
        }
    )


def _read_identity(reader: _EnvReader) -> WorkerIdentity | None:
    worker_id = reader.text(
        WORKER_ID_VAR,
        _ID.fullmatch,
        "is not an id (letters, digits, '_', '.', '-', at most 128)",
    )
    instance_id = reader.text(
        INSTANCE_ID_VAR,
        _ID.fullmatch,
        "is not an id (letters, digits, '_', '.', '-', at most 128)",
    )
    token = reader.secret(WORKER_TOKEN_VAR, _TOKEN.fullmatch, "is not a 64-character hex HMAC")
    control_url = reader.text(CONTROL_URL_VAR, _is_http_url, "is not an http:// or https:// URL")
    broker_url = reader.secret(
        BROKER_URL_VAR,
        lambda value: urlsplit(value).scheme in ("redis", "rediss", "sentinel"),
        "is not a redis://, rediss:// or sentinel:// URL",
    )
    master_name = reader.text(
        BROKER_MASTER_NAME_VAR, _ID.fullmatch, "is not a Sentinel master name", required=False
    )
    if broker_url is not None and urlsplit(broker_url).scheme == "sentinel" and not master_name:
        reader.problems.append(f"{BROKER_MASTER_NAME_VAR}: not set; a sentinel:// broker needs it")
        return None
    broker_ca_certs = reader.text(
        BROKER_CA_CERTS_VAR, _is_readable_file, "is not a readable CA file", required=False
    )
    if None in (worker_id, instance_id, token, control_url, broker_url):
        return None
    return WorkerIdentity.model_validate(
        {
            "worker_id": worker_id,
            "instance_id": instance_id,
            "token": token,
            # The protocol says no trailing slash; tolerate one rather than build "//internal".
            "control_url": str(control_url).rstrip("/"),
            "broker_url": broker_url,
            "broker_master_name": master_name,
            "broker_ca_certs": broker_ca_certs,
        }
    )


def _is_readable_file(value: str) -> bool:
    return os.access(value, os.R_OK) and os.path.isfile(value)


def _is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


class _EnvReader:
    """Reads MURMUR_* variables and collects one problem line per bad variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        self.problems: list[str] = []

    def _raw(self, name: str) -> str | None:
        # cloud-init templates write `NAME=` for an unset value: treat empty as unset.
        value = self._environ.get(name, "").strip()
        return value or None

    def choice(self, name: str, allowed: tuple[str, ...], default: str | None = None) -> str:
        value = self._raw(name)
        if value is None:
            if default is not None:
                return default
            self.problems.append(f"{name}: not set; one of {', '.join(allowed)}")
            return ""
        if value not in allowed:
            self.problems.append(f"{name}: {value!r} is not one of {', '.join(allowed)}")
        return value

    def integer(self, name: str, *, minimum: int, default: int, hint: str = "") -> int:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            extra = f" ({hint})" if hint else ""
            self.problems.append(f"{name}: {value!r} is not an integer >= {minimum}{extra}")
            return default
        return number

    def seconds(self, name: str, *, default: float) -> float:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not number > 0 or number == float("inf"):
            self.problems.append(f"{name}: {value!r} is not a number of seconds > 0")
            return default
        return number

    def text(
        self,
        name: str,
        valid: Callable[[str], object],
        complaint: str,
        *,
        required: bool = True,
    ) -> str | None:
        value = self._raw(name)
        if value is None:
            if required:
                self.problems.append(f"{name}: not set")
            return None
        if not valid(value):
            self.problems.append(f"{name}: {value!r} {complaint}")
            return None
        return value

    def secret(self, name: str, valid: Callable[[str], object], complaint: str) -> str | None:
        value = self._raw(name)
        if value is None:
            self.problems.append(f"{name}: not set")
            return None
        if not valid(value):
            # Never echo a secret, not even a malformed one.
            self.problems.append(f"{name}: {complaint} (value not shown)")
            return None
        return value


def image_pull_seconds(env: Mapping[str, str]) -> float | None:
    """How long the image pull before this start took, or None when unknown or unreadable.

    Written by the instance's systemd unit after it pulled the worker image (see
    app/fleet/cloudinit.py); absent when the worker was not started from an image pull.
    Informational only (a lifecycle timing): a bad value never stops the worker.
    """
    try:
        seconds = float(env.get(IMAGE_PULL_SECONDS_VAR, ""))
    except ValueError:
        return None
    return round(seconds, 3) if 0 <= seconds < float("inf") else None
