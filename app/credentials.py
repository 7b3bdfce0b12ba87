"""Credentials derived from the control-plane signing key: instance credentials, signed URLs.

An instance credential is HMAC-SHA256(signing key, "worker:<worker id>:<instance id>"): it is
bound to one worker on one provider instance, needs no storage, and rotating the signing key
revokes every credential at once. Signed audio URLs use the same key under another label, so
neither can be replayed as the other. A worker's own broker (Redis ACL) password is the same
key's HMAC under the label "broker" of "<broker database>:<worker id>": the control plane can
re-create that user with the same password whenever the broker lost it, without storing it
anywhere, and rotating the key changes every such password too. A signed audio URL is bound
to the claim that issued it (job, worker and attempt number): a URL from an earlier claim of
the same job verifies, but no longer matches the job's row. Comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import urlencode


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


def broker_password(signing_key: str, db: int, worker_id: str) -> str:
    """The password of worker `worker_id`'s own Redis user on broker database `db` (hex)."""
    if not signing_key:  # an HMAC under an empty key would be anyone's to compute
        raise ValueError("no signing key: a worker's broker password is derived from it")
    return _mac(signing_key, "broker", f"{db}:{worker_id}")


def _audio_message(job_id: str, worker_id: str, attempt: int, expires: int) -> str:
    return f"{job_id}:{worker_id}:{attempt}:{expires}"


def sign_audio_url(
    signing_key: str,
    job_id: str,
    worker_id: str,
    attempt: int,
    ttl_seconds: int,
    now: float | None = None,
) -> str:
    """Query string that lets the worker holding claim `attempt` fetch one job's audio a while."""
    expires = int((now if now is not None else time.time()) + ttl_seconds)
    sig = _mac(signing_key, "audio", _audio_message(job_id, worker_id, attempt, expires))
    return urlencode({"worker": worker_id, "attempt": attempt, "expires": expires, "sig": sig})


@dataclass(frozen=True)
class AudioClaim:
    """Whom a verified audio URL was issued to: compare with the job's row before serving."""

    worker_id: str
    attempt: int


def verify_audio_signature(
    signing_key: str,
    job_id: str,
    worker_id: str,
    attempt: str,
    expires: str,
    sig: str,
    now: float | None = None,
) -> AudioClaim | None:
    """The claim a valid, unexpired URL was issued for; None for anything else."""
    try:
        expiry = int(expires)
        claim = int(attempt)
    except ValueError:
        return None
    if expiry < (now if now is not None else time.time()):
        return None
    expected = _mac(signing_key, "audio", _audio_message(job_id, worker_id, claim, expiry))
    if not hmac.compare_digest(expected.encode(), sig.encode()):
        return None
    return AudioClaim(worker_id, claim)


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
