"""Murmur's configuration: one TOML file, `MURMUR_*` environment overrides, secrets from env.

`load_settings()` returns a validated `Settings`; `check_settings()` lists every problem an
operator must fix (what `murmur validate-config` prints). Inside the code only the typed
objects travel, never raw dicts.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from app.fleet.catalog import SERVER_TYPES
from gpu_worker.broker_tls import is_tls, verification_problem
from gpu_worker.protocol.broker import PROFILE_NAME_PATTERN, queue_name
from gpu_worker.protocol.claim import DEFAULT_MAX_AUDIO_SECONDS
from gpu_worker.protocol.runtime import (
    AlignmentDevice,
    ComputeType,
    VadBackend,
    alignment_fits,
    supported_compute_types,
)
from gpu_worker.protocol.usage import DEFAULT_REPORT_INTERVAL_SECONDS

ProviderName = Literal["scaleway", "local"]

# The minimum length of the scrape token (DESIGN §5) and of the other shared secrets.
MIN_SECRET_LENGTH = 32

# A container image pinned by digest, with no tag: `[registry[:port]/]path@sha256:<64 hex>`.
# Cloud-init puts it in a systemd unit and a shell command, so nothing else may pass.
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
WORKER_IMAGE_BY_DIGEST = re.compile(
    rf"^(?:[a-z0-9.-]+(?::[0-9]+)?/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"@sha256:[0-9a-f]{64}$"
)


def worker_image_problem(image: str) -> str | None:
    """Why `image` cannot name a worker container (tag, no digest, bad syntax), or None."""
    if WORKER_IMAGE_BY_DIGEST.match(image):
        return None
    name, at, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        return f"{image!r} names a tag; pin the image by digest (name@sha256:<64 hex>), no tag"
    if not at:
        return f"{image!r} has no digest; pin it as name@sha256:<64 hex>"
    return f"{image!r} is not an image reference by digest (name@sha256:<64 hex>)"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Profile(_Strict):
    """One entry of the ordered allowlist: where a worker runs and how it transcribes."""

    name: str = Field(pattern=PROFILE_NAME_PATTERN)
    provider: ProviderName
    zone: str
    server_type: str
    image: str = ""
    # The worker container the instance runs (cloud-init pulls it); by digest, never a tag.
    worker_image: str = ""
    security_group: str = ""
    model: str = "tiny.en"
    compute_type: ComputeType = "int8"
    vad: VadBackend = "silero"
    alignment_device: AlignmentDevice = "none"
    batch_size: int = Field(default=1, ge=1, le=64)
    max_workers: int = Field(default=1, ge=0, le=1000)
    hourly_cost_eur: float = Field(default=0.0, ge=0)
    enabled: bool = True
    # The diarization asset set of gpu_worker/models.toml this profile runs, or None: it does
    # not diarize (gpu_worker/protocol/capabilities.py).
    diarization: str | None = None
    # The `local` provider only: the Python interpreter that runs this profile's worker
    # (`<worker_python> -m gpu_worker run`), e.g. a venv with torch and pyannote to diarize; a
    # relative path is taken from the working directory, like storage_path. None: the control
    # worker's own interpreter.
    worker_python: str | None = Field(default=None, min_length=1)
    # MURMUR_CPU_THREADS for this profile's workers (0 = the libraries' default); None: unset,
    # so a local worker inherits the control plane's MURMUR_CPU_THREADS, if any.
    cpu_threads: int | None = Field(default=None, ge=0, le=1024)

    @property
    def queue(self) -> str:
        return queue_name(self.name)


class SecurityGroup(_Strict):
    """A provider security group; zonal, so a profile may only use one from its own zone."""

    id: str
    zone: str


class ApiSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    # The URL workers use to reach the control plane (signed audio URLs, results, reports).
    public_url: str = "http://127.0.0.1:8000"
    max_upload_bytes: int = Field(default=25 * 1024 * 1024, ge=1024)
    max_audio_seconds: float = Field(default=DEFAULT_MAX_AUDIO_SECONDS, gt=0)
    sync_timeout_seconds: float = Field(default=300.0, gt=0, le=590)
    # Synchronous transcriptions in progress per API process; each has its own server thread
    # on top of the general ones (app/server.py), and one more is answered 503 (docs/api.md).
    sync_max_waiting: int = Field(default=32, ge=1, le=1024)
    # Open event streams (GET /v1/jobs/<id>/events, OpenAI stream=true) per API process, each
    # on a server thread of its own besides the others (app/jobs/stream_limits.py); per API
    # token across processes; and the comment heartbeat that keeps proxies from closing them.
    stream_max_open: int = Field(default=256, ge=1, le=4096)
    streams_per_token: int = Field(default=16, ge=1, le=4096)
    stream_heartbeat_seconds: float = Field(default=15.0, ge=0.5, le=120)
    signed_url_ttl_seconds: int = Field(default=600, ge=10, le=86400)
    # URLs given as job input: only these schemes, and only public addresses.
    allow_private_urls: bool = False


class FleetSettings(_Strict):
    reconcile_interval_seconds: float = Field(default=5.0, gt=0)
    idle_timeout_seconds: float = Field(default=60.0, ge=0)
    boot_timeout_seconds: float = Field(default=900.0, gt=0)
    backoff_seconds: float = Field(default=60.0, gt=0)
    backoff_max_seconds: float = Field(default=900.0, gt=0)
    provider_timeout_seconds: float = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    # The reconcile lock is a lease this long, renewed while the run is alive: a control worker
    # that dies is replaced within it (app.fleet.lease).
    reconcile_lease_seconds: float = Field(default=6.0, ge=1.0)
    # /readyz fails when no reconcile made progress for this long (app.fleet.liveness).
    reconcile_stale_seconds: float = Field(default=180.0, gt=0)
    # Each worker gets its own Redis ACL user limited to its queue (app/fleet/broker_users.py);
    # unset: on for cloud profiles, off for the local provider. Needs ACL rights (see docs).
    worker_broker_users: bool | None = None
    # Workers of one profile in a row that never become ready before its retries are held
    # back (doubling from backoff_seconds): a broken image is not re-created every boot timeout.
    max_failed_boots: int = Field(default=3, ge=1)
    # Work-aware scaling (app/fleet/scaling_policy.py): a worker is added when it drains the
    # backlog sooner by more than its boot, and always while a job would otherwise wait longer
    # than this (from its submission). The latency/cost dial.
    target_wait_seconds: float = Field(default=300.0, gt=0)
    # A profile's boot estimate (its boot timeout, and the boot the planner weighs): p95 of its
    # recent successful boots × this margin, at least boot_estimate_floor_seconds, at most
    # boot_timeout_seconds (also the estimate until 3 boots are measured).
    boot_estimate_margin: float = Field(default=1.5, ge=1.0)
    boot_estimate_floor_seconds: float = Field(default=60.0, gt=0)
    # Idle by break-even (app/fleet/idle_policy.py): a worker whose next job is not expected
    # within a boot is deleted after this much idle time; idle_timeout_seconds is the ceiling.
    idle_floor_seconds: float = Field(default=10.0, ge=0)


class BudgetSettings(_Strict):
    max_hourly_eur: float = Field(default=10.0, ge=0)


class ObservabilitySettings(_Strict):
    enabled: bool = False
    report_interval_seconds: float = Field(default=DEFAULT_REPORT_INTERVAL_SECONDS, gt=0)


class RetentionSettings(_Strict):
    """How long a job's data is kept once the job has ended (docs: README, Data retention)."""

    # Audio is deleted this long after its job succeeded, failed or was cancelled; the job row
    # and transcript stay until the owner purges them (DELETE /v1/jobs/<id>?purge=true).
    audio_seconds: float = Field(default=24 * 3600, ge=0, le=366 * 86400)
    # How often the control worker sweeps, and how many jobs one sweep handles at most.
    sweep_interval_seconds: float = Field(default=60.0, ge=1, le=86400)
    batch_size: int = Field(default=200, ge=1, le=10000)


class IoSettings(_Strict):
    """How much outbound work the I/O workers do at once (app/jobs/io_slots.py): URL fetches
    and webhook attempts, across every I/O worker process and per API token. A task over a
    bound waits for a slot (it is retried shortly), it never fails for it. An I/O worker with
    more threads than `fetches + webhooks` always has threads for the other kind and for
    retention, whatever the peers do."""

    fetches: int = Field(default=8, ge=1, le=10000)
    fetches_per_token: int = Field(default=2, ge=1, le=10000)
    webhooks: int = Field(default=8, ge=1, le=10000)
    webhooks_per_token: int = Field(default=4, ge=1, le=10000)


# The shortest part a long job may be cut into (app/jobs/cuts.py): below it a part's fixed
# costs (download, decode, model warm-up on its slice) outweigh the parallelism.
MIN_PART_SECONDS = 30.0


# From the measurements of issue 34 (docs/fleet.md, "Choosing `part_seconds`"): cutting costs
# no transcription work (bench/long_file_parts.py); on the scripted mixed day
# (bench/fleet_economics.py) parts of 300 s give the lowest latency p95 of 0, 180, 300 and 600
# (438 s against 471 s whole) and bring the day's 2-hour file back in 215 s instead of 365 s,
# for 6 % more GPU time (0.132 GPU-s per audio-s against 0.124), with no job late beside a free
# slot. 0 transcribes every job whole (while older workers, which cannot take a part, serve).
DEFAULT_PART_SECONDS = 300.0


class JobsSettings(_Strict):
    """How jobs are carried out. `part_seconds`: a job whose audio lasts at least 1.5 times
    this is cut at pauses into parts of about this length, each transcribed by any free worker
    of its profile and stitched into one transcript (app/jobs/parts.py, docs/fleet.md "Long
    files in parts"); 0 transcribes every job whole on one worker."""

    part_seconds: float = Field(default=DEFAULT_PART_SECONDS, ge=0, le=4 * 3600)

    @field_validator("part_seconds")
    @classmethod
    def _long_enough(cls, value: float) -> float:
        if 0 < value < MIN_PART_SECONDS:
            raise ValueError(f"must be 0 (off) or at least {MIN_PART_SECONDS:.0f} seconds")
        return value


class DatabaseSettings(_Strict):
    """How long the database may take before a request is answered `503 database_unavailable`
    (docs/reliability.md, "Database and storage faults"): a database that refuses, or accepts
    connections and never answers, holds no request or `/readyz` past these bounds."""

    # Opening a connection (TCP, TLS and the startup exchange), PostgreSQL.
    connect_timeout_seconds: float = Field(default=5.0, ge=1, le=300)
    # One statement on PostgreSQL (`statement_timeout`, enforced by the server); the client
    # gives up on a server that does not answer at all one second after it.
    statement_timeout_seconds: float = Field(default=5.0, ge=0.1, le=3600)
    # How long a SQLite write waits for another process's write lock.
    busy_timeout_seconds: float = Field(default=10.0, ge=0.1, le=300)


class RedisSettings(_Strict):
    """Redis high availability: with `sentinels` set, every client (Celery's broker, the app's
    own keys, cloud-init's broker URL) asks those Sentinels for the current primary of
    `master_name`, and `redis_url` gives only the database number and credentials."""

    sentinels: tuple[str, ...] = ()
    master_name: str = Field(default="murmur", min_length=1)

    @field_validator("sentinels")
    @classmethod
    def _host_ports(cls, sentinels: tuple[str, ...]) -> tuple[str, ...]:
        for entry in sentinels:
            host, _, port = entry.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{entry!r} is not host:port")
        return sentinels


class StorageSettings(_Strict):
    """Where uploaded audio lives (app/storage.py): `local` (the directory `storage_path`, one
    host) or `s3` (an S3-compatible bucket every API host and worker reaches: docs/operations.md,
    "Past one host"). The S3 credentials come from the environment or *_FILE paths only."""

    backend: Literal["local", "s3"] = "local"
    bucket: str = ""
    # Unset: AWS S3 itself; Scaleway is https://s3.<region>.scw.cloud, MinIO its own URL.
    endpoint_url: str | None = None
    region: str = "us-east-1"
    # Every object's key starts with this (one bucket shared by several deployments).
    key_prefix: str = ""
    # How long a worker's presigned GET lives; issued at each claim for that attempt only.
    presigned_url_ttl_seconds: int = Field(default=300, ge=10, le=3600)
    # Uploads larger than this go up in parts of this size: memory stays bounded by it.
    multipart_chunk_bytes: int = Field(default=8 * 1024 * 1024, ge=5 * 1024 * 1024)
    # Seconds to wait for the bucket to answer (connect, then each read).
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)


class ScalewaySettings(_Strict):
    api_url: str = "https://api.scaleway.com"
    project_id: str = ""


class Settings(_Strict):
    api: ApiSettings = ApiSettings()
    database_url: str = "sqlite:///var/murmur.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis: RedisSettings = RedisSettings()
    # The broker URL handed to workers (cloud-init), when it differs from the control plane's:
    # a name they can reach; each worker's own Redis user goes into it (fleet.worker_broker_users).
    worker_broker_url: str | None = None
    # PEM file of the CA that signed the broker's certificate: every rediss:// client of the
    # control plane verifies against it, and each worker gets a copy (docs/deploy-workers.md,
    # "Broker TLS and users"). Unset: the system's CA bundle.
    redis_ca_certs: str | None = None
    storage_path: str = "var/audio"
    storage: StorageSettings = StorageSettings()
    # `/readyz` answers 503 while the audio store's filesystem has less free space than this
    # (a full disk would refuse uploads with `507 insufficient_storage`).
    storage_min_free_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    database: DatabaseSettings = DatabaseSettings()
    default_language: str | None = None
    fleet: FleetSettings = FleetSettings()
    budget: BudgetSettings = BudgetSettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    retention: RetentionSettings = RetentionSettings()
    io: IoSettings = IoSettings()
    jobs: JobsSettings = JobsSettings()
    scaleway: ScalewaySettings = ScalewaySettings()
    security_groups: dict[str, SecurityGroup] = {}
    profiles: tuple[Profile, ...] = ()

    # Secrets: from the environment (or a *_FILE path) only; never from the TOML file.
    api_tokens: tuple[SecretStr, ...] = ()
    admin_token: SecretStr | None = None
    scrape_token: SecretStr | None = None
    signing_key: SecretStr | None = None
    webhook_secret: SecretStr | None = None
    scaleway_access_key: SecretStr | None = None
    scaleway_secret_key: SecretStr | None = None
    s3_access_key_id: SecretStr | None = None
    s3_secret_access_key: SecretStr | None = None

    @field_validator("profiles")
    @classmethod
    def _unique_names(cls, profiles: tuple[Profile, ...]) -> tuple[Profile, ...]:
        seen: set[str] = set()
        for p in profiles:
            if p.name in seen:
                raise ValueError(f"duplicate profile name {p.name!r}")
            seen.add(p.name)
        return profiles

    def profile(self, name: str) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def enabled_profiles(self) -> tuple[Profile, ...]:
        return tuple(p for p in self.profiles if p.enabled)

    def reveal(self, name: str) -> str:
        """The plain value of a secret field, or "" when unset."""
        value = getattr(self, name)
        return value.get_secret_value() if value is not None else ""


# The embedded default: one CPU profile on the local provider (config/local.toml mirrors it).
LOCAL_CPU_PROFILE = Profile(
    name="local-cpu",
    provider="local",
    zone="local",
    server_type="local-cpu",
    # Multilingual Whisper base: a first German file just works; tiny.en stays a profile
    # choice (English only, faster).
    model="base",
    compute_type="int8",
    vad="silero",
    alignment_device="none",
    # faster-whisper's BatchedInferencePipeline: the fastest CPU configuration measured, with
    # WER on the fixtures within +0.02 of the sequential path (docs/performance.md).
    batch_size=8,
    max_workers=1,
    hourly_cost_eur=0.0,
)

_SECRET_ENV = {
    "api_tokens": "MURMUR_API_TOKEN",
    "admin_token": "MURMUR_ADMIN_TOKEN",
    "scrape_token": "MURMUR_SCRAPE_TOKEN",
    "signing_key": "MURMUR_SIGNING_KEY",
    "webhook_secret": "MURMUR_WEBHOOK_SECRET",
    "scaleway_access_key": "SCW_ACCESS_KEY",
    "scaleway_secret_key": "SCW_SECRET_KEY",
    "s3_access_key_id": "MURMUR_S3_ACCESS_KEY_ID",
    "s3_secret_access_key": "MURMUR_S3_SECRET_ACCESS_KEY",
}


class ConfigError(Exception):
    """The configuration cannot be used; `problems` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _secret_from_env(env: Mapping[str, str], var: str) -> str | None:
    if env.get(var):
        return env[var]
    path = env.get(f"{var}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError([f"{var}_FILE: cannot read {path}: {exc.strerror}"]) from exc
    return None


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """Non-secret `MURMUR_*` overrides layered over the TOML file."""
    out: dict[str, Any] = {}
    api: dict[str, Any] = {}
    if "MURMUR_DATABASE_URL" in env:
        out["database_url"] = env["MURMUR_DATABASE_URL"]
    elif env.get("MURMUR_DATABASE_URL_FILE"):  # a URL with a password is a secret: from a file
        out["database_url"] = _secret_from_env(env, "MURMUR_DATABASE_URL")
    if "MURMUR_REDIS_URL" in env:
        out["redis_url"] = env["MURMUR_REDIS_URL"]
    elif env.get("MURMUR_REDIS_URL_FILE"):  # rediss://murmur-control:<password>@…: a secret too
        out["redis_url"] = _secret_from_env(env, "MURMUR_REDIS_URL")
    redis: dict[str, Any] = {}
    if "MURMUR_REDIS_SENTINELS" in env:
        redis["sentinels"] = [
            h.strip() for h in env["MURMUR_REDIS_SENTINELS"].split(",") if h.strip()
        ]
    if "MURMUR_REDIS_MASTER_NAME" in env:
        redis["master_name"] = env["MURMUR_REDIS_MASTER_NAME"]
    if redis:
        out["redis"] = redis
    if "MURMUR_WORKER_BROKER_URL" in env:
        out["worker_broker_url"] = env["MURMUR_WORKER_BROKER_URL"]
    if "MURMUR_REDIS_CA_CERTS" in env:
        out["redis_ca_certs"] = env["MURMUR_REDIS_CA_CERTS"] or None
    if "MURMUR_STORAGE_PATH" in env:
        out["storage_path"] = env["MURMUR_STORAGE_PATH"]
    storage: dict[str, Any] = {}
    for var, field in (
        ("MURMUR_STORAGE_BACKEND", "backend"),
        ("MURMUR_S3_BUCKET", "bucket"),
        ("MURMUR_S3_ENDPOINT_URL", "endpoint_url"),
        ("MURMUR_S3_REGION", "region"),
        ("MURMUR_S3_KEY_PREFIX", "key_prefix"),
    ):
        if var in env:
            storage[field] = env[var]
    if storage:
        out["storage"] = storage
    if "MURMUR_STORAGE_MIN_FREE_BYTES" in env:
        out["storage_min_free_bytes"] = env["MURMUR_STORAGE_MIN_FREE_BYTES"]
    database = {
        name: env[var]
        for name, var in (
            ("connect_timeout_seconds", "MURMUR_DATABASE_CONNECT_TIMEOUT_SECONDS"),
            ("statement_timeout_seconds", "MURMUR_DATABASE_STATEMENT_TIMEOUT_SECONDS"),
            ("busy_timeout_seconds", "MURMUR_DATABASE_BUSY_TIMEOUT_SECONDS"),
        )
        if var in env
    }
    if database:
        out["database"] = database
    if "MURMUR_HOST" in env:
        api["host"] = env["MURMUR_HOST"]
    if "MURMUR_PORT" in env:
        api["port"] = env["MURMUR_PORT"]
    if "MURMUR_PUBLIC_URL" in env:
        api["public_url"] = env["MURMUR_PUBLIC_URL"]
    elif "MURMUR_PORT" in env:
        api["public_url"] = f"http://127.0.0.1:{env['MURMUR_PORT']}"
    if "MURMUR_MAX_UPLOAD_BYTES" in env:
        api["max_upload_bytes"] = env["MURMUR_MAX_UPLOAD_BYTES"]
    if "MURMUR_SYNC_TIMEOUT_SECONDS" in env:
        api["sync_timeout_seconds"] = env["MURMUR_SYNC_TIMEOUT_SECONDS"]
    if "MURMUR_SYNC_MAX_WAITING" in env:
        api["sync_max_waiting"] = env["MURMUR_SYNC_MAX_WAITING"]
    for name in ("stream_max_open", "streams_per_token", "stream_heartbeat_seconds"):
        if f"MURMUR_{name.upper()}" in env:
            api[name] = env[f"MURMUR_{name.upper()}"]
    if "MURMUR_ALLOW_PRIVATE_URLS" in env:
        api["allow_private_urls"] = _truthy(env["MURMUR_ALLOW_PRIVATE_URLS"])
    if api:
        out["api"] = api
    if "MURMUR_AUDIO_RETENTION_SECONDS" in env:
        out["retention"] = {"audio_seconds": env["MURMUR_AUDIO_RETENTION_SECONDS"]}
    if "MURMUR_PART_SECONDS" in env:
        out["jobs"] = {"part_seconds": env["MURMUR_PART_SECONDS"]}
    if "MURMUR_OBSERVABILITY_ENABLED" in env:
        out["observability"] = {"enabled": _truthy(env["MURMUR_OBSERVABILITY_ENABLED"])}
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _format_validation_error(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "config"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        problems.append(f"{where}: {msg}")
    return problems


def load_settings(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Read the TOML file (if any), apply env overrides and secrets, validate everything."""
    env = os.environ if env is None else env
    path = path if path is not None else env.get("MURMUR_CONFIG") or None
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([f"{path}: not valid TOML: {exc}"]) from exc
    problems = [
        f"{key}: secrets come from the environment ({var} or {var}_FILE), not the config file"
        for key, var in _SECRET_ENV.items()
        if key in raw
    ]
    data = _merge(raw, _env_overrides(env))
    if not data.get("profiles"):
        data["profiles"] = [LOCAL_CPU_PROFILE.model_dump()]
    tokens = _secret_from_env(env, "MURMUR_API_TOKEN")
    data["api_tokens"] = tuple(t.strip() for t in (tokens or "").split(",") if t.strip())
    for key, var in _SECRET_ENV.items():
        if key != "api_tokens":
            data[key] = _secret_from_env(env, var)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        found = _format_validation_error(exc)
        # The name check runs only once every profile parses; report duplicates regardless.
        names = [p.get("name") for p in data.get("profiles", []) if isinstance(p, dict)]
        for name in sorted({n for n in names if isinstance(n, str) and names.count(n) > 1}):
            if not any(f"duplicate profile name {name!r}" in f for f in found):
                found.append(f"profiles: duplicate profile name {name!r}")
        raise ConfigError(problems + found) from None
    if settings.redis.sentinels and is_tls(settings.redis_url):
        # Sentinel hands out the primary as a plain address, and every client built from it
        # (app/redis_primary.py, kombu's sentinel:// transport, the workers' sentinel:// URL)
        # talks plain TCP: refused rather than rediss:// dropped without a word.
        problems.append(
            "redis_url: TLS (rediss://) is not supported together with redis.sentinels; keep "
            "Sentinel and the broker on a private network (cloud workers can still be given "
            "a TLS broker of their own with worker_broker_url)"
        )
    if problems:
        raise ConfigError(problems)
    return settings


def _is_loopback_url(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "") or host.startswith("127.") or host == "::1"


def _remote_worker_problems(settings: Settings) -> list[str]:
    """Cloud workers must reach the control plane over HTTPS and the broker by a real name."""
    problems = []
    public = settings.api.public_url
    if urlsplit(public).scheme != "https" or _is_loopback_url(public):
        problems.append(
            f"api.public_url: cloud workers need an https URL they can reach, not {public}"
        )
    broker = settings.worker_broker_url or settings.redis_url
    if _is_loopback_url(broker):
        problems.append(
            "worker_broker_url: cloud workers cannot reach a broker on localhost; set "
            "MURMUR_WORKER_BROKER_URL (ideally a Redis user limited to transcribe.* keys)"
        )
    return problems + broker_tls_problems(settings)


def broker_tls_problems(settings: Settings) -> list[str]:
    """What stops the broker connections of cloud workers and the control plane from being
    TLS with certificate verification (the clients verify anyway; the config must say so)."""
    problems = []
    worker_broker = settings.worker_broker_url or settings.redis_url
    if not _is_loopback_url(worker_broker) and not is_tls(worker_broker):
        problems.append(
            "worker_broker_url: workers reach the broker over the internet: use rediss:// (TLS)"
        )
    urls = {"redis_url": settings.redis_url, "worker_broker_url": settings.worker_broker_url}
    for name, url in urls.items():
        problem = verification_problem(url) if url else None
        if problem is not None:
            problems.append(f"{name}: {problem}")
    ca = settings.redis_ca_certs
    if ca:
        try:
            pem = Path(ca).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"redis_ca_certs: cannot read {ca}: {getattr(exc, 'strerror', exc)}")
        else:
            if "-----BEGIN CERTIFICATE-----" not in pem:
                problems.append(f"redis_ca_certs: {ca} holds no PEM certificate")
    return problems


def credential_problems(settings: Settings) -> list[str]:
    """What is wrong with the control plane's own secrets: missing, too short, or shared.

    `murmur api` refuses to start on any of these; `check_settings` includes them.
    """
    problems: list[str] = []
    if not settings.api_tokens:
        problems.append("MURMUR_API_TOKEN: not set (comma-separated bearer tokens)")
    if not settings.signing_key:
        problems.append("MURMUR_SIGNING_KEY: not set (signs worker credentials and URLs)")
    for name in ("signing_key", "scrape_token", "admin_token", "webhook_secret"):
        value = settings.reveal(name)
        if value and len(value) < MIN_SECRET_LENGTH:
            problems.append(f"{_SECRET_ENV[name]}: must be at least {MIN_SECRET_LENGTH} characters")
    secrets = _credentials(settings)
    names = list(secrets)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if secrets[a] & secrets[b]:
                problems.append(f"{a} and {b} must be different credentials")
    if settings.observability.enabled and not settings.scrape_token:
        problems.append("MURMUR_SCRAPE_TOKEN: required when observability is enabled")
    return problems


def storage_problems(settings: Settings) -> list[str]:
    """What the audio store's configuration lacks (reaching the bucket is app/storage.py's)."""
    storage = settings.storage
    if storage.backend != "s3":
        return []
    problems = []
    if not storage.bucket:
        problems.append("storage.bucket: required for the s3 store (MURMUR_S3_BUCKET)")
    for name in ("s3_access_key_id", "s3_secret_access_key"):
        if not settings.reveal(name):
            var = _SECRET_ENV[name]
            problems.append(f"{var}: required for the s3 store ({var} or {var}_FILE)")
    url = storage.endpoint_url
    if url is not None and urlsplit(url).scheme not in ("http", "https"):
        problems.append(f"storage.endpoint_url: {url!r} is not an http(s) URL")
    elif url is not None and urlsplit(url).scheme == "http" and not _is_loopback_url(url):
        problems.append(
            "storage.endpoint_url: use https: the credentials' signatures and the audio "
            "would cross the network in clear"
        )
    return problems


def scrape_token_problem(settings: Settings) -> str | None:
    """Why the configured scrape token cannot guard /metrics, or None (unset counts as fine).

    The API also checks this at each scrape, so an app started without `murmur api`'s checks
    (gunicorn 'app:create_app()') still never accepts a short or shared scrape token.
    """
    token = settings.reveal("scrape_token")
    if not token:
        return None
    if len(token) < MIN_SECRET_LENGTH:
        return f"MURMUR_SCRAPE_TOKEN: must be at least {MIN_SECRET_LENGTH} characters"
    for name, values in _credentials(settings).items():
        if name != "MURMUR_SCRAPE_TOKEN" and token in values:
            return f"MURMUR_SCRAPE_TOKEN and {name} must be different credentials"
    return None


def _credentials(settings: Settings) -> dict[str, set[str]]:
    """The secrets that must all differ, by the variable that sets them."""
    return {
        "MURMUR_API_TOKEN": {t.get_secret_value() for t in settings.api_tokens},
        "MURMUR_SIGNING_KEY": {settings.reveal("signing_key")} - {""},
        "MURMUR_SCRAPE_TOKEN": {settings.reveal("scrape_token")} - {""},
        "MURMUR_ADMIN_TOKEN": {settings.reveal("admin_token")} - {""},
    }


# What each process checks at start, as `murmur validate-config --role` does: `control` is
# the control worker (it alone holds the provider keys and creates servers); `api` and
# `beat` use everything else of the control plane's configuration; `worker` is a GPU
# worker's view (profiles only).
ROLES = ("control", "api", "beat", "worker")
_CONTROL_PLANE_ROLES = ("control", "api", "beat")


class StartupRefused(ConfigError):
    """A process refusing to start on the problems `murmur validate-config` reports for it."""

    def __init__(self, process: str, problems: list[str], role: str = "control") -> None:
        super().__init__(problems)
        self.process = process
        self.role = role

    def __str__(self) -> str:
        return (
            f"cannot start the {self.process}: {len(self.problems)} configuration problem(s) "
            f"(`murmur validate-config --role {self.role}` lists the same):\n  - "
            + "\n  - ".join(self.problems)
        )


def refuse_bad_settings(settings: Settings, *, process: str, role: str) -> None:
    """Raise `StartupRefused` if `check_settings(settings, role=role)` finds any problem."""
    problems = check_settings(settings, role=role)
    if problems:
        raise StartupRefused(process, problems, role)


def _asset_problems(profile: Profile) -> list[str]:
    """A profile's model and diarization setting against the model manifest."""
    from gpu_worker.manifest import ManifestError, load_manifest

    try:
        manifest = load_manifest()
    except ManifestError as exc:
        return [f"model: {exc}"]
    problems = []
    models = manifest.model_names()
    if profile.model not in models:
        problems.append(
            f"model: unknown model {profile.model!r} (the manifest has: {', '.join(models)})"
        )
    if profile.diarization is not None and profile.diarization not in manifest.diarization_names():
        problems.append(f"diarization: no asset {profile.diarization!r} in gpu_worker/models.toml")
    return problems


def _worker_python_problem(profile: Profile) -> str | None:
    """Why a profile's `worker_python` cannot start its worker, or None (unset or fine)."""
    path = profile.worker_python
    if path is None:
        return None
    if profile.provider != "local":
        return (
            f"worker_python: only the local provider starts a worker with it "
            f"({profile.provider} workers run the worker image)"
        )
    if not profile.enabled:
        return None  # never started: a venv removed since does not stop the rest
    resolved = os.path.abspath(path)
    if not os.path.isfile(resolved):
        return f"worker_python: {path} does not exist (or is not a file)"
    if not os.access(resolved, os.X_OK):
        return f"worker_python: {path} is not executable"
    return None


def _server_type_problems(p: Profile) -> list[str]:
    """A profile's server type: known, single-GPU, able to run its compute type and
    alignment, offered in its zone, and of its provider."""
    stype = SERVER_TYPES.get(p.server_type)
    if stype is None:
        return [
            f"server_type: unknown server type {p.server_type!r} "
            f"(known: {', '.join(sorted(SERVER_TYPES))})"
        ]
    problems = []
    if stype.gpu_count > 1:
        problems.append(
            f"server_type: {p.server_type} has {stype.gpu_count} GPUs; "
            "multi-GPU types are not allowed until one worker can use each GPU"
        )
    if p.compute_type not in supported_compute_types(stype.cuda_capability):
        device = (
            f"{stype.gpu} (CUDA capability {stype.cuda_capability[0]}.{stype.cuda_capability[1]})"
            if stype.cuda_capability
            else "the CPU"
        )
        problems.append(
            f"compute_type: {p.compute_type} cannot run on {device}; "
            f"allowed: {', '.join(sorted(supported_compute_types(stype.cuda_capability)))}"
        )
    if stype.zones and p.zone not in stype.zones:
        problems.append(
            f"zone: {p.server_type} is not offered in {p.zone} "
            f"(offered in {', '.join(sorted(stype.zones))})"
        )
    if not alignment_fits(stype.device, p.alignment_device):
        problems.append("alignment_device: cuda on a CPU-only server type")
    if (p.provider == "local") != (stype.gpu is None):
        problems.append(f"server_type: {p.server_type} does not belong to provider {p.provider}")
    return problems


def _scaleway_profile_problems(p: Profile, settings: Settings) -> list[str]:
    """What a scaleway profile needs besides a server type: images, cost, security group."""
    if p.provider != "scaleway":
        return []
    problems = []
    if not p.image:
        problems.append("image: required for the scaleway provider")
    if not p.worker_image:
        problems.append(
            "worker_image: required for the scaleway provider "
            "(the worker container, name@sha256:<64 hex>)"
        )
    elif (image_problem := worker_image_problem(p.worker_image)) is not None:
        problems.append(f"worker_image: {image_problem}")
    if p.hourly_cost_eur <= 0:
        # The budget bounds cost with this figure: a free-looking GPU would escape it.
        problems.append(
            "hourly_cost_eur: required for the scaleway provider (the budget counts it)"
        )
    sg = settings.security_groups.get(p.security_group)
    if not p.security_group:
        problems.append("security_group: required for the scaleway provider")
    elif sg is None:
        problems.append(
            f"security_group: {p.security_group!r} is not declared in [security_groups]"
        )
    elif sg.zone != p.zone:
        problems.append(
            f"security_group: {p.security_group!r} lives in zone {sg.zone}, "
            f"not in the profile's zone {p.zone}"
        )
    return problems


def check_settings(settings: Settings, *, role: str = "control") -> list[str]:
    """Every problem that stops this configuration from running safely (empty = fine)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    problems: list[str] = []
    if not settings.enabled_profiles:
        problems.append("profiles: no enabled profile: jobs would have nowhere to run")
    for p in settings.profiles:
        own = _asset_problems(p)
        if (python_problem := _worker_python_problem(p)) is not None:
            own.append(python_problem)
        own += _server_type_problems(p) + _scaleway_profile_problems(p, settings)
        problems.extend(f"profiles.{p.name}.{problem}" for problem in own)
    if role in _CONTROL_PLANE_ROLES:
        problems += credential_problems(settings)
        problems += storage_problems(settings)
        if any(p.provider == "scaleway" and p.enabled for p in settings.profiles):
            problems += _remote_worker_problems(settings)
            if role == "control":  # only the control worker holds the provider's keys
                for name in ("scaleway_access_key", "scaleway_secret_key"):
                    if not settings.reveal(name):
                        problems.append(f"{_SECRET_ENV[name]}: required by the scaleway profiles")
            if not settings.scaleway.project_id:
                problems.append("scaleway.project_id: required by the scaleway profiles")
    return problems
