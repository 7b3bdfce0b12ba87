"""Every server state the Scaleway API reports has a way out that leaves nothing billed;
every error it answers keeps its status and detail.

`teardown_step` maps (state, allowed_actions) to the next call; each state is then driven
through the emulator with the real SDK, with a Block root volume and a flexible IP attached,
until the provider reads back that server, volume and IP are gone.
"""

from __future__ import annotations

import pytest

from app.config import Settings
from app.fleet.providers.base import (
    InvalidArgument,
    OutOfStock,
    PermissionDenied,
    ProviderError,
    ProviderUnavailable,
    QuotaExceeded,
)
from app.fleet.providers.scaleway import (
    DELETE,
    MAX_DETAIL,
    POWEROFF,
    STOP_IN_PLACE,
    TERMINATE,
    WAIT,
    ScalewayProvider,
    redact_detail,
    teardown_step,
)
from tests.fleet.conftest import L4, P100, SECRET_KEY, fleet_settings
from tests.fleet.emulator import ALLOWED_ACTIONS, InstanceEmulator

NOTHING = {"servers": 0, "ips": 0, "volumes": 0}

STEPS = [
    # state, allowed_actions, next step
    ("stopped", ALLOWED_ACTIONS["stopped"], DELETE),
    ("stopped", [], DELETE),
    ("stopped in place", ALLOWED_ACTIONS["stopped in place"], TERMINATE),
    ("stopped_in_place", [], TERMINATE),  # the Python SDK's spelling
    ("starting", ALLOWED_ACTIONS["starting"], STOP_IN_PLACE),
    ("starting", [], STOP_IN_PLACE),
    ("running", ALLOWED_ACTIONS["running"], TERMINATE),
    ("running", [], TERMINATE),
    ("stopping", [], WAIT),
    ("locked", [], WAIT),
    ("locked", ["terminate"], WAIT),  # locked by Scaleway: nothing is accepted meanwhile
    ("rescuing", ["poweroff", "backup"], POWEROFF),  # a state we do not know: what it allows
    ("rescuing", ["stop_in_place"], STOP_IN_PLACE),
    ("rescuing", ["backup"], WAIT),
]


@pytest.mark.parametrize(("state", "allowed", "step"), STEPS)
def test_teardown_step_for_every_state(state: str, allowed: list[str], step: str) -> None:
    assert teardown_step(state, allowed) == step


@pytest.fixture()
def settings(emulator: InstanceEmulator) -> Settings:
    groups = {
        "workers-par2": {"id": emulator.add_security_group("fr-par-2", "m"), "zone": "fr-par-2"},
        "workers-par1": {"id": emulator.add_security_group("fr-par-1", "m"), "zone": "fr-par-1"},
    }
    return fleet_settings(emulator.url, groups, [L4, P100], fleet={"provider_timeout_seconds": 1.0})


@pytest.fixture()
def provider(settings: Settings) -> ScalewayProvider:
    return ScalewayProvider(settings, poll_interval=0.01, teardown_wait=1.0)


def _server(emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider) -> str:
    """A powered-on server with its Block volume, a local (l_ssd) volume and a flexible IP."""
    emulator.inject("create", "local_volume", times=1)
    emulator.inject("poweron", "attach_flexible_ip", times=1)
    instance = provider.create(settings.profile("l4-par2"), "wrk_t", lambda i, r: {})
    assert emulator.inventory() == {"servers": 1, "ips": 1, "volumes": 2}
    assert len(emulator.local_volumes) == 1
    return instance.instance_id


# state forced on the server, and the state it moves to by itself (None: it stays)
WAYS_OUT = [
    ("stopped", None),
    ("stopped in place", None),
    ("starting", None),  # a stuck allocation: never leaves starting by itself
    ("running", None),
    ("stopping", "stopped"),
    ("stopping", "stopped in place"),
    ("rescuing", None),  # unknown to us; allows poweroff (below)
]


@pytest.mark.parametrize(("state", "then"), WAYS_OUT)
def test_every_state_is_torn_down_to_nothing(
    emulator: InstanceEmulator,
    settings: Settings,
    provider: ScalewayProvider,
    state: str,
    then: str | None,
) -> None:
    sid = _server(emulator, settings, provider)
    allowed = ["poweroff", "backup"] if state == "rescuing" else None
    emulator.set_state(sid, state, allowed=allowed, then=then)
    # Only the zone, as an orphan sweep knows it: the teardown learns volume and IP itself.
    result = provider.delete(sid, {"zone": "fr-par-2"})
    assert result.confirmed, result.detail
    assert provider.get(sid, {"zone": "fr-par-2"}) is None
    assert emulator.inventory() == NOTHING


def test_a_stuck_start_goes_through_stop_in_place_then_terminate(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    emulator.inject("poweron", "never_start", times=1)
    instance = provider.create(settings.profile("l4-par2"), "wrk_t", lambda i, r: {})
    assert emulator.server(instance.instance_id)["state"] == "starting"
    assert provider.delete(instance.instance_id, instance.resources).confirmed
    sent = [e[0] for e in emulator.events if e[2] == instance.instance_id]
    assert sent[-3:] == ["stop_in_place", "terminate", "gone"]
    assert emulator.inventory() == NOTHING


def test_a_locked_server_waits_says_why_and_goes_once_unlocked(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    sid = _server(emulator, settings, provider)
    emulator.set_state(sid, "locked", detail="locked by support")
    first = provider.delete(sid, {"zone": "fr-par-2"})
    assert not first.confirmed
    assert first.detail == f"server {sid} is locked (locked by support)"
    assert first.resources["volumes"] and first.resources["ips"]  # still owed, still recorded
    assert first.resources["local_volumes"]
    assert not [e for e in emulator.events if e[0] in ("terminate", "delete") and e[2] == sid]

    emulator.set_state(sid, "running")
    assert provider.delete(sid, first.resources).confirmed
    assert emulator.inventory() == NOTHING


# -- errors keep their detail (issue 11, finding 8) -------------------------------------------

DETAILS = [
    ("image_not_found", InvalidArgument, "HTTP 400 invalid_arguments", "image: image not found"),
    ("quota", QuotaExceeded, "HTTP 403 quotas_exceeded", "gpu_instances quota 1, current 1"),
    ("permission", PermissionDenied, "HTTP 403", "create on instance_server"),
    ("bad_gateway", ProviderUnavailable, "HTTP 502", "non-JSON body (text/html)"),
    ("empty_5xx", ProviderUnavailable, "HTTP 503", "empty body"),
    (
        "validation",
        InvalidArgument,
        "HTTP 400 invalid_request_error Validation Error",
        "commercial_type: unknown server type",
    ),
    (
        "validation_without_fields",
        InvalidArgument,
        "HTTP 400 invalid_request_error",
        "Validation Error",
    ),
]


@pytest.mark.parametrize(
    ("kind", "error", "status", "detail"), DETAILS, ids=[d[0] for d in DETAILS]
)
def test_errors_keep_status_and_detail(
    emulator: InstanceEmulator,
    settings: Settings,
    provider: ScalewayProvider,
    kind: str,
    error: type[ProviderError],
    status: str,
    detail: str,
) -> None:
    emulator.inject("create", kind)
    with pytest.raises(error) as caught:
        provider.create(settings.profile("l4-par2"), "wrk_t", lambda i, r: {})
    assert status in caught.value.reason and detail in caught.value.reason
    assert SECRET_KEY not in caught.value.reason


def test_error_detail_is_redacted_and_bounded() -> None:
    text = redact_detail(
        f"create: HTTP 400 key {SECRET_KEY} SCWXXXXXXXXXXXXXXXXX at https://x.example/a?b=c "
        + "y" * 1000
    )
    assert SECRET_KEY not in redact_detail(f"k {SECRET_KEY}", [SECRET_KEY])
    assert "SCWXXXXXXXXXXXXXXXXX" not in text and "https://" not in text
    assert len(text) <= MAX_DETAIL and "\n" not in text


def test_create_looks_again_after_poweron(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    emulator.boot_observations = 0  # the fall back to stopped shows on the first read
    emulator.inject("poweron", "stock_after_poweron", times=1)
    with pytest.raises(OutOfStock, match=r"fell back to stopped \(out of stock\)"):
        provider.create(settings.profile("l4-par2"), "wrk_t", lambda i, r: {})
    assert emulator.inventory() == NOTHING

    instance = provider.create(settings.profile("l4-par2"), "wrk_u", lambda i, r: {})
    assert instance.state == "running"  # what the API said, not an assumed "starting"


def test_a_power_on_that_shows_late_is_not_out_of_stock(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    """Review of issue 11, L4: right after the 202 the server may still read `stopped`, with
    nothing said; it is on its way up, so create returns it instead of deleting it."""
    emulator.inject("poweron", "lagging_poweron", times=1)
    instance = provider.create(settings.profile("l4-par2"), "wrk_t", lambda i, r: {})
    assert instance.state == "stopped" and instance.detail == ""
    assert emulator.inventory()["servers"] == 1
    seen = [provider.get(instance.instance_id, instance.resources) for _ in range(4)]
    assert [i.state for i in seen if i is not None][-1] == "running"


def test_a_block_volume_still_deleting_is_read_again_next_round_not_waited_for(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    """A Block volume shows `deleting` for a while after its DELETE: the pass ends with it
    still owed (no polling through the teardown wait, no second DELETE), and a later read that
    answers 404 confirms it."""
    emulator.volume_deleting_reads = 2  # the read right after the DELETE, and one more
    instance = provider.create(settings.profile("l4-par2"), "wrk_t", lambda i, r: {})
    (volume,) = instance.resources["volumes"]

    def volume_reads() -> int:
        return sum(1 for m, p in emulator.requests if m == "GET" and p.endswith(f"/{volume}"))

    first = provider.delete(instance.instance_id, instance.resources)
    assert not first.confirmed and first.server_gone
    assert first.resources["volumes"] == [volume]
    assert emulator.volumes[volume]["status"] == "deleting"

    before = volume_reads()
    second = provider.delete(instance.instance_id, first.resources)
    assert not second.confirmed and second.resources["volumes"] == [volume]
    assert volume_reads() - before == 1  # one look, then on to the rest of the teardown

    third = provider.delete(instance.instance_id, second.resources)
    assert third.confirmed, third.detail
    deletes = [e for e in emulator.events if e[0] == "delete_volume" and e[2] == volume]
    assert len(deletes) == 1
    assert emulator.inventory() == NOTHING
