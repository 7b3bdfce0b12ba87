"""What a new worker is told at boot: its runtime profile, the control plane URL, its credential.

`worker_environment` is the single source for both providers: the `local` provider passes it to
a subprocess, the `scaleway` provider wraps it in cloud-init user data. Every variable's name
is the protocol's (gpu_worker/protocol/environment.py), the one the worker reads. Nothing
else secret goes in (no API tokens, no signing key, no provider keys); the user data is never
logged.

The user data (`render_user_data`) runs the worker on a stock GPU OS image with Docker and the
NVIDIA container toolkit (docs/deploy-workers.md): a root-only env file, a script that pulls
the worker image by digest and records how long that took, and a systemd unit that runs the
container with the GPUs and gives it longer to stop than the worker takes to drain.
When the worker's broker is rediss:// and `redis_ca_certs` is set, that CA certificate (not a
secret) is written to the instance too and mounted read-only into the container, and the
worker verifies the broker against it (MURMUR_BROKER_CA_CERTS).
"""

from __future__ import annotations

from pathlib import Path

from app.config import Profile, Settings, worker_image_problem
from app.credentials import InstanceCredential
from app.fleet.catalog import server_device
from app.redis_primary import broker_url
from gpu_worker.broker_tls import is_tls
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
from gpu_worker.protocol.runtime import DEFAULT_DRAIN_TIMEOUT_SECONDS, EXIT_RUNTIME_MISMATCH

# Scaleway documents no user-data size limit; we keep ours far below the common 16 KiB cap.
USER_DATA_LIMIT_BYTES = 16 * 1024

STOP_MARGIN_SECONDS = 30
PULL_TIMEOUT_SECONDS = 1800
UNIT_NAME = "murmur-worker.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT_NAME}"
ENV_FILE = "/etc/murmur/worker.env"
PULL_SCRIPT = "/usr/local/lib/murmur/pull-worker-image"
REPORT_SCRIPT = "/usr/local/lib/murmur/report-boot-failure"
# Bound on the report's HTTP call: a lost report only leaves the decision to the boot timeout.
REPORT_TIMEOUT_SECONDS = 10
PULL_ENV_FILE = "/run/murmur/pull.env"
CONTAINER_NAME = "murmur-worker"
# The same path on the instance and inside the container (mounted read-only).
BROKER_CA_FILE = "/etc/murmur/broker-ca.pem"


def worker_environment(
    settings: Settings,
    profile: Profile,
    worker_id: str,
    instance_id: str,
    broker_url: str | None = None,
) -> dict[str, str]:
    """The worker's variables; `broker_url` carries its own broker user when it has one."""
    credential = InstanceCredential.derive(settings.reveal("signing_key"), worker_id, instance_id)
    broker = broker_url or settings.worker_broker_url or settings.redis_url
    # The control plane's path: right for a local subprocess; render_user_data ships the file.
    tls_ca = (
        {BROKER_CA_CERTS_VAR: settings.redis_ca_certs}
        if is_tls(broker) and settings.redis_ca_certs
        else {}
    )
    return {
        WORKER_ID_VAR: worker_id,
        INSTANCE_ID_VAR: instance_id,
        WORKER_TOKEN_VAR: credential.token,
        CONTROL_URL_VAR: settings.api.public_url.rstrip("/"),
        BROKER_URL_VAR: broker,
        **tls_ca,
        PROFILE_VAR: profile.name,
        MODEL_VAR: profile.model,
        DEVICE_VAR: server_device(profile.server_type),
        COMPUTE_TYPE_VAR: profile.compute_type,
        VAD_VAR: profile.vad,
        ALIGNMENT_DEVICE_VAR: profile.alignment_device,
        BATCH_SIZE_VAR: str(profile.batch_size),
        # The diarization weight set the profile names (absent: the worker does not diarize).
        **({DIARIZATION_VAR: profile.diarization} if profile.diarization else {}),
        # The profile's thread count, when it sets one (a local worker otherwise inherits it).
        **({CPU_THREADS_VAR: str(profile.cpu_threads)} if profile.cpu_threads is not None else {}),
        OBSERVABILITY_ENABLED_VAR: "1" if settings.observability.enabled else "0",
        REPORT_INTERVAL_VAR: str(settings.observability.report_interval_seconds),
        **_sentinel_broker(settings, broker_url),
    }


def _sentinel_broker(settings: Settings, own_url: str | None) -> dict[str, str]:
    """Without a worker broker URL of their own, workers follow the primary through Sentinel,
    with their own broker user's credentials when they have one (never the control plane's)."""
    if settings.worker_broker_url or not settings.redis.sentinels:
        return {}
    return {
        BROKER_URL_VAR: broker_url(settings, credentials_from=own_url),
        BROKER_MASTER_NAME_VAR: settings.redis.master_name,
    }


def render_user_data(env: dict[str, str], profile: Profile) -> str:
    """#cloud-config that writes the worker's files and starts its unit (see the docstring).

    The profile names the container (`worker_image`, by digest). `env` is written as a Docker
    env file, one `KEY=value` per line taken literally, so no value may span lines.
    """
    image = profile.worker_image
    problem = worker_image_problem(image)
    if problem is not None:
        raise ValueError(f"profile {profile.name}: worker_image: {problem}")
    gpus = server_device(profile.server_type) == "cuda"
    # Written into the env file so the unit's stop timeout and the worker's drain agree.
    env = {DRAIN_TIMEOUT_VAR: f"{DEFAULT_DRAIN_TIMEOUT_SECONDS:g}", **env}
    ca_file = ""
    if env.get(BROKER_CA_CERTS_VAR):
        ca_file = _file(BROKER_CA_FILE, "0644", _read_ca(env[BROKER_CA_CERTS_VAR]))
        env[BROKER_CA_CERTS_VAR] = BROKER_CA_FILE
    for key, value in env.items():
        if not key.isidentifier() or any(c in value for c in "\r\n\0"):
            raise ValueError(f"worker environment: {key} cannot go in an env file")
    body = "".join(f"{k}={v}\n" for k, v in sorted(env.items()))
    user_data = (
        "#cloud-config\n"
        "write_files:\n"
        + _file(ENV_FILE, "0600", body)
        + ca_file
        + _file(REPORT_SCRIPT, "0755", report_script())
        + _file(PULL_SCRIPT, "0755", _pull_script())
        + _file(
            UNIT_FILE,
            "0644",
            worker_unit(image, float(env[DRAIN_TIMEOUT_VAR]), gpus, broker_ca=bool(ca_file)),
        )
        + "runcmd:\n"
        "  - [systemctl, daemon-reload]\n"
        f"  - [systemctl, enable, --now, {UNIT_NAME}]\n"
    )
    if len(user_data.encode()) > USER_DATA_LIMIT_BYTES:
        raise ValueError(f"cloud-init user data exceeds {USER_DATA_LIMIT_BYTES} bytes")
    return user_data


def _read_ca(path: str) -> str:
    """The broker's CA certificate(s) in PEM; a ValueError when unreadable or not PEM."""
    try:
        pem = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"redis_ca_certs: cannot read {path} ({type(exc).__name__})") from None
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(f"redis_ca_certs: {path} holds no PEM certificate")
    return pem


def _file(path: str, mode: str, content: str) -> str:
    indented = "".join(f"      {line}\n" for line in content.splitlines())
    return (
        f"  - path: {path}\n"
        "    owner: root:root\n"
        f"    permissions: '{mode}'\n"
        "    content: |\n"
        f"{indented}"
    )


def _pull_script() -> str:
    return (
        "#!/bin/sh\n"
        "# Pull the worker image and write how long it took for the container's environment.\n"
        "set -eu\n"
        'out="$1"\n'
        'image="$2"\n'
        "start=$(date +%s.%N)\n"
        'docker pull --quiet "$image" >/dev/null || {\n'
        "  status=$?\n"
        f'  {REPORT_SCRIPT} image_pull "docker pull exited $status"\n'
        '  exit "$status"\n'
        "}\n"
        "end=$(date +%s.%N)\n"
        'seconds=$(awk -v a="$start" -v b="$end" \'BEGIN { printf "%.3f", b - a }\')\n'
        f'printf \'{IMAGE_PULL_SECONDS_VAR}=%s\\n\' "$seconds" > "$out"\n'
    )


def report_script() -> str:
    """`report-boot-failure STAGE DETAIL`, or `report-boot-failure exited` from the unit's
    ExecStopPost: POST .../boot-failure (gpu_worker/protocol/boot.py) with the instance
    credential from the env file, once, bounded, never retried, its failure ignored.

    The details are this script's own words and numbers (never a command's output), so the
    body needs no escaping and carries nothing secret; the credential goes to curl on its
    standard input, never on a command line. `exited` reports nothing when the unit stopped
    cleanly; the control plane ignores a report from a worker that was ready.
    """
    return (
        "#!/bin/sh\n"
        "# Tell the control plane that this instance's worker cannot come up.\n"
        "set -u\n"
        'get() { sed -n "s/^$1=//p" ' + ENV_FILE + " | head -n 1; }\n"
        'clean() { printf %s "$1" | tr -cd "a-zA-Z0-9_ .-" | cut -c1-200; }\n'
        'stage=$(clean "$1")\n'
        'detail="${2:-}"\n'
        'if [ "$stage" = exited ]; then\n'
        '  [ "${SERVICE_RESULT:-success}" = success ] && exit 0\n'
        '  code=$(clean "${EXIT_CODE:-}"); status=$(clean "${EXIT_STATUS:-}")\n'
        f'  if [ "$status" = {EXIT_RUNTIME_MISMATCH} ]; then stage=runtime_rejected; '
        "else stage=container_exited; fi\n"
        '  detail="the worker container stopped before it was ready ($code $status)"\n'
        "fi\n"
        'detail=$(clean "$detail")\n'
        f'url="$(get {CONTROL_URL_VAR})/internal/workers/$(get {WORKER_ID_VAR})/'
        f'$(get {INSTANCE_ID_VAR})/boot-failure"\n'
        f"printf 'Authorization: Bearer %s\\n' \"$(get {WORKER_TOKEN_VAR})\" | "
        f"curl --silent --show-error --max-time {REPORT_TIMEOUT_SECONDS} --header @- "
        "--header 'Content-Type: application/json' "
        '--data "{\\"stage\\": \\"$stage\\", \\"detail\\": \\"$detail\\"}" '
        '"$url" >/dev/null || true\n'
    )


def worker_unit(image: str, drain_seconds: float, gpus: bool, *, broker_ca: bool = False) -> str:
    """The systemd unit that runs the worker container (`image` already checked by digest)."""
    stop = int(drain_seconds) + STOP_MARGIN_SECONDS  # Docker's SIGKILL comes after the drain
    gpu_flag = " --gpus all" if gpus else ""
    ca_mount = f" --volume {BROKER_CA_FILE}:{BROKER_CA_FILE}:ro" if broker_ca else ""
    return (
        "[Unit]\n"
        "Description=Murmur transcription worker\n"
        "Wants=network-online.target\n"
        "After=network-online.target docker.service\n"
        "Requires=docker.service\n"
        # A failed pull (registry down) is reported to the control plane (one such report
        # holds the profile) and retried until the worker is deleted.
        "StartLimitIntervalSec=0\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        "RuntimeDirectory=murmur\n"
        f"ExecStartPre=-/usr/bin/docker rm --force {CONTAINER_NAME}\n"
        f"ExecStartPre={PULL_SCRIPT} {PULL_ENV_FILE} {image}\n"
        f"ExecStart=/usr/bin/docker run --rm --name {CONTAINER_NAME}{gpu_flag}{ca_mount} "
        f"--env-file {ENV_FILE} --env-file {PULL_ENV_FILE} --stop-timeout {stop} "
        f"--log-driver journald {image}\n"
        f"ExecStop=/usr/bin/docker stop --time {stop} {CONTAINER_NAME}\n"
        # The container exited before the worker was ready: say so (ignored once ready).
        f"ExecStopPost=-{REPORT_SCRIPT} exited\n"
        # Multi-gigabyte images on a fresh instance take minutes to pull.
        f"TimeoutStartSec={PULL_TIMEOUT_SECONDS}\n"
        f"TimeoutStopSec={stop + STOP_MARGIN_SECONDS}\n"
        "Restart=on-failure\n"
        "RestartSec=15\n"
        # The control plane refused this runtime: starting again cannot help.
        f"RestartPreventExitStatus={EXIT_RUNTIME_MISMATCH}\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
