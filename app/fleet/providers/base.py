"""The one interface every instance provider implements, and the errors it may raise.

A provider creates a tagged instance for a worker, reads it back, lists what it owns by tag,
tears an instance down completely (server, IPs, volumes) and gives a stock hint (a `shortage`
stops a create before anything exists). Errors are typed so the fleet can tell capacity (fall
back to the next profile) from everything else (stop and report). A listing holds only what
the fleet made for a worker, whatever the provider's own filter returned. Every call the fleet
makes is bounded in time. Instance states are compared as `InstanceState` members, never as
bare strings; a word no provider is known to use passes through unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeVar

from app.config import Profile

T = TypeVar("T")

# Tags every provider puts on a worker instance; `list_by_tag` finds instances by the first and
# keeps only those whose own tags carry both the first and a worker id (`is_fleet_worker`).
FLEET_TAG = "murmur"
WORKER_TAG = "murmur-worker="
PROFILE_TAG = "murmur-profile="

# Called once the instance id is known and before the instance starts: the fleet records the
# instance (so it can never leak unnoticed) and returns the worker's environment.
Bind = Callable[[str, Mapping[str, Any]], Mapping[str, str]]


def worker_tags(worker_id: str, profile: str) -> list[str]:
    return [FLEET_TAG, f"{WORKER_TAG}{worker_id}", f"{PROFILE_TAG}{profile}"]


def tag_value(tags: list[str] | tuple[str, ...], prefix: str) -> str | None:
    for tag in tags:
        if tag.startswith(prefix):
            return tag[len(prefix) :]
    return None


def is_fleet_worker(tags: list[str] | tuple[str, ...]) -> bool:
    """Whether an instance's own tags say the fleet made it for a worker: the fleet tag itself
    and a non-empty worker id. A provider's tag filter is not taken on trust (what the real
    one matches is not confirmed), so nothing else is ever listed, adopted or deleted."""
    return FLEET_TAG in tags and bool(tag_value(tags, WORKER_TAG))


class StockHint(StrEnum):
    """What `Provider.availability` says of a profile's server type (Scaleway's words)."""

    AVAILABLE = "available"
    SCARCE = "scarce"  # still sold: a create is tried
    SHORTAGE = "shortage"  # out of stock: nothing is created, as for an out-of-stock answer


class InstanceState(StrEnum):
    """The states providers report for an instance (Scaleway's `state`; local and fake use
    `running` and `stopped`)."""

    RUNNING = "running"
    STARTING = "starting"
    STOPPING = "stopping"
    STOPPED = "stopped"
    # The API's (and Go SDK's) spelling; the Python SDK's enum says "stopped_in_place", and
    # both are accepted (see `_missing_`).
    STOPPED_IN_PLACE = "stopped in place"
    LOCKED = "locked"
    # Not a provider word: the create's own look after power-on failed, so nothing is known.
    UNKNOWN = "unknown"

    @classmethod
    def _missing_(cls, value: object) -> InstanceState | None:
        return cls.STOPPED_IN_PLACE if value == "stopped_in_place" else None

    @classmethod
    def of(cls, word: object) -> InstanceState | str:
        """The member a provider's word names (either spelling of `stopped in place`), or the
        word itself when no provider is known to use it."""
        text = str(word)
        try:
            return cls(text)
        except ValueError:
            return text


# Powered off: DELETE-able (`stopped`) or stopped with its node kept (`stopped in place`).
STOPPED_STATES = frozenset({InstanceState.STOPPED, InstanceState.STOPPED_IN_PLACE})


def is_stopped(state: str) -> bool:
    """Whether a provider state means powered off, in either spelling of `stopped in place`."""
    return InstanceState.of(state) in STOPPED_STATES


@dataclass(frozen=True)
class Instance:
    """An instance as the provider reports it; `resources` is what teardown must remove."""

    instance_id: str
    # An `InstanceState` member, or the provider's own word when it is none of them.
    state: str
    worker_id: str | None = None
    profile: str | None = None
    resources: Mapping[str, Any] = field(default_factory=dict)
    detail: str = ""  # the provider's word on the state (Scaleway's state_detail)


@dataclass(frozen=True)
class Teardown:
    """Progress of a deletion; `resources` still to remove when not yet confirmed."""

    confirmed: bool
    resources: Mapping[str, Any] = field(default_factory=dict)
    detail: str = ""
    # The instance itself is confirmed gone (true when `confirmed`): what may be left is storage
    # (volumes, IPs), so the GPU is no longer billed.
    server_gone: bool = False


class ProviderError(Exception):
    """A provider call failed; `reason` is safe to show to operators.

    Each kind says how the fleet counts it (`outcome`, one of
    app.observability.PROVISION_OUTCOMES), whether it moves demand on to the next profile
    (`allows_fallback`: only out-of-stock does; any other error holds the profile instead,
    docs/fleet.md "Fallback happens on capacity only") and whether it is one more of the
    profile's errors in a row (`counts_in_a_row`, which lengthen the hold). `retry_after` is the
    provider's own word on when to try again (seconds), when it gave one.
    """

    outcome: ClassVar[str] = "error"
    allows_fallback: ClassVar[bool] = False
    counts_in_a_row: ClassVar[bool] = True

    def __init__(
        self,
        reason: str,
        *,
        instance_id: str | None = None,
        resources: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        # Set when the failure left an instance behind that still has to be torn down.
        self.instance_id = instance_id
        self.resources: Mapping[str, Any] = resources or {}

    def leftover(self, instance_id: str, resources: Mapping[str, Any]) -> ProviderError:
        self.instance_id = instance_id
        self.resources = resources
        return self


class OutOfStock(ProviderError):
    outcome = "out_of_stock"
    allows_fallback = True


class QuotaExceeded(ProviderError):
    outcome = "quota_exceeded"


class PermissionDenied(ProviderError):
    outcome = "permission_denied"


class InvalidArgument(ProviderError):
    outcome = "invalid_argument"


class ProviderUnavailable(ProviderError):
    """5xx, unreadable answers, connection failures."""

    outcome = "provider_unavailable"


class RateLimited(ProviderUnavailable):
    """HTTP 429: the API asks to slow down, whatever the profile. Held like an outage (no
    fallback), for `retry_after` when the API said it, and not counted as one of the profile's
    errors in a row."""

    counts_in_a_row = False


class ProviderTimeout(ProviderError):
    outcome = "timeout"


class Provider(Protocol):
    name: str

    def create(self, profile: Profile, worker_id: str, bind: Bind) -> Instance:
        """Create and start a tagged instance; user data/env is in place before it starts."""
        ...

    def get(self, instance_id: str, resources: Mapping[str, Any]) -> Instance | None:
        """The instance, or None when the provider no longer has it."""
        ...

    def list_by_tag(self, scopes: frozenset[str]) -> list[Instance]:
        """Every instance the fleet made for a worker, in these zones where zones exist: for a
        tagged provider, those whose own tags pass `is_fleet_worker`, whatever else its listing
        returns."""
        ...

    def delete(self, instance_id: str, resources: Mapping[str, Any]) -> Teardown:
        """Advance a full teardown; `confirmed` once the provider shows nothing is left."""
        ...

    def availability(self, profile: Profile) -> str | None:
        """A stock hint (`StockHint`, or another word of the provider's), or None when unknown
        (including when asking failed). The fleet creates nothing on `shortage` and treats it
        as an out-of-stock; any other answer lets the create go on."""
        ...


def bounded(call: Callable[[], T], timeout: float, what: str) -> T:
    """Run `call` in a daemon thread and give up after `timeout` seconds.

    The SDK passes no timeout to requests, so a stalled API would block reconcile forever.
    The abandoned thread ends when its socket does; anything it creates late carries the fleet
    tags and is caught by the orphan sweep.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"provider:{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ProviderTimeout(f"{what}: no answer within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value
