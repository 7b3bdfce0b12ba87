"""What a new worker is told at boot: its runtime profile, the control plane URL, its credential.

`worker_environment` is the single source for both providers: the `local` provider passes it to
a subprocess, the `scaleway` provider wraps it in cloud-init user data. Nothing else secret goes
in (no API tokens, no signing key, no provider keys); the user data is never logged.
"""

from __future__ import annotations

import shlex

from app.config import Profile, Settings
from app.credentials import InstanceCredential
from app.fleet.catalog import SERVER_TYPES
from app.redis_primary import broker_url

# Scaleway documents no user-data size limit; we keep ours far below the common 16 KiB cap.
USER_DATA_LIMIT_BYTES = 16 * 1024


def worker_environment(
    settings: Settings, profile: Profile, worker_id: str, instance_id: str
) -> dict[str, str]:
    credential = InstanceCredential.derive(settings.reveal("signing_key"), worker_id, instance_id)
    stype = SERVER_TYPES.get(profile.server_type)
    device = "cuda" if stype is not None and stype.gpu is not None else "cpu"
    return {
        "MURMUR_WORKER_ID": worker_id,
        "MURMUR_INSTANCE_ID": instance_id,
        "MURMUR_WORKER_TOKEN": credential.token,
        "MURMUR_CONTROL_URL": settings.api.public_url.rstrip("/"),
        "MURMUR_BROKER_URL": settings.worker_broker_url or settings.redis_url,
        "MURMUR_PROFILE": profile.name,
        "MURMUR_MODEL": profile.model,
        "MURMUR_DEVICE": device,
        "MURMUR_COMPUTE_TYPE": profile.compute_type,
        "MURMUR_VAD": profile.vad,
        "MURMUR_ALIGNMENT_DEVICE": profile.alignment_device,
        "MURMUR_BATCH_SIZE": str(profile.batch_size),
        "MURMUR_OBSERVABILITY_ENABLED": "1" if settings.observability.enabled else "0",
        "MURMUR_REPORT_INTERVAL": str(settings.observability.report_interval_seconds),
        **_sentinel_broker(settings),
    }


def _sentinel_broker(settings: Settings) -> dict[str, str]:
    """Without a worker broker URL of their own, workers follow the primary through Sentinel."""
    if settings.worker_broker_url or not settings.redis.sentinels:
        return {}
    return {
        "MURMUR_BROKER_URL": broker_url(settings),
        "MURMUR_BROKER_MASTER_NAME": settings.redis.master_name,
    }


def render_user_data(env: dict[str, str]) -> str:
    """#cloud-config that writes the worker's environment file (root-only) and starts it."""
    body = "\n".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    indented = "\n".join("      " + line for line in body.splitlines())
    user_data = (
        "#cloud-config\n"
        "write_files:\n"
        "  - path: /etc/murmur/worker.env\n"
        "    owner: root:root\n"
        "    permissions: '0600'\n"
        "    content: |\n"
        f"{indented}\n"
        "runcmd:\n"
        "  - [systemctl, enable, --now, murmur-worker.service]\n"
    )
    if len(user_data.encode()) > USER_DATA_LIMIT_BYTES:
        raise ValueError(f"cloud-init user data exceeds {USER_DATA_LIMIT_BYTES} bytes")
    return user_data
