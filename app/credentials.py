"""Credentials derived from the control-plane signing key: instance credentials, signed URLs.

An instance credential is HMAC-SHA256(signing key, "worker:<worker id>:<instance id>"): it is
bound to one worker on one provider instance, needs no storage, and rotating the signing key
revokes every credential at once. Signed audio URLs use the same key under another label, so
neither can be replayed as the other. Comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass


def _mac(key: str, label: str, message: str) -> str:
    return hmac.new(key.encode(), f"{label}:{message}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class InstanceCredential:
    worker_id: str
    instance_id: str
    token: str

    @classmethod
    def derive(cls, signing_key: str, worker_id: str, instance_id: str) -> InstanceCredential:
        token = _mac(signing_key, "worker", f"{worker_id}:{instance_id}")
        return cls(worker_id, instance_id, token)

    def __repr__(self) -> str:  # never print the token
        return f"InstanceCredential(worker_id={self.worker_id!r}, instance_id={self.instance_id!r})"


def verify_instance_credential(
    signing_key: str, worker_id: str, instance_id: str, presented: str
) -> bool:
    expected = InstanceCredential.derive(signing_key, worker_id, instance_id).token
    return hmac.compare_digest(expected.encode(), presented.encode())


def sign_audio_url(
    signing_key: str, job_id: str, ttl_seconds: int, now: float | None = None
) -> str:
    """Query string `expires=..&sig=..` that lets a worker fetch one job's audio for a while."""
    expires = int((now if now is not None else time.time()) + ttl_seconds)
    sig = _mac(signing_key, "audio", f"{job_id}:{expires}")
    return f"expires={expires}&sig={sig}"


def verify_audio_signature(
    signing_key: str, job_id: str, expires: str, sig: str, now: float | None = None
) -> bool:
    try:
        expiry = int(expires)
    except ValueError:
        return False
    if expiry < (now if now is not None else time.time()):
        return False
    expected = _mac(signing_key, "audio", f"{job_id}:{expiry}")
    return hmac.compare_digest(expected.encode(), sig.encode())


def token_fingerprint(token: str) -> str:
    """A stable, non-reversible id of an API token (job ownership, idempotency scope)."""
    return hashlib.sha256(token.encode()).hexdigest()


def constant_time_in(presented: str, allowed: list[str] | tuple[str, ...]) -> str | None:
    """The allowed value equal to `presented`, compared in constant time against each."""
    match = None
    for candidate in allowed:
        if hmac.compare_digest(candidate.encode(), presented.encode()):
            match = candidate
    return match
