"""The `scaleway` provider through the real SDK against the emulator: errors, paging, teardown."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from app.config import Profile, Settings
from app.fleet.cloudinit import USER_DATA_LIMIT_BYTES, render_user_data, worker_environment
from app.fleet.providers.base import (
    InstanceState,
    InvalidArgument,
    OutOfStock,
    PermissionDenied,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    QuotaExceeded,
    RateLimited,
    bounded,
)
from app.fleet.providers.scaleway import ScalewayProvider
from app.observability import PROVISION_OUTCOMES
from tests.fleet.conftest import FOREIGN_TAGS, L4, P100, fleet_settings, foreign_server
from tests.fleet.emulator import InstanceEmulator


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


def l4(settings: Settings) -> Profile:
    return settings.profile("l4-par2")


def bind(settings: Settings, profile: Profile) -> Any:
    def _bind(instance_id: str, resources: Mapping[str, Any]) -> Mapping[str, str]:
        return worker_environment(settings, profile, "wrk_test", instance_id)

    return _bind


ERRORS = [
    ("out_of_stock", OutOfStock),
    ("quota", QuotaExceeded),
    ("permission", PermissionDenied),
    ("server_error", ProviderUnavailable),
    ("bad_gateway", ProviderUnavailable),
    # A 429 is a rate limit wherever it comes from (JSON from the API or a proxy's HTML page):
    # retry later on the same profile, never an invalid argument.
    ("rate_limited", RateLimited),
    ("rate_limited_html", RateLimited),
    ("invalid", InvalidArgument),
    ("validation", InvalidArgument),
    # "Validation Error" without `fields` makes the SDK raise KeyError instead of its own error:
    # still the API refusing the arguments, never an outage.
    ("validation_without_fields", InvalidArgument),
]


@pytest.mark.parametrize(("kind", "error"), ERRORS, ids=[e[0] for e in ERRORS])
def test_create_errors_are_typed(
    emulator: InstanceEmulator,
    settings: Settings,
    provider: ScalewayProvider,
    kind: str,
    error: type[ProviderError],
) -> None:
    emulator.inject("create", kind)
    with pytest.raises(error) as caught:
        provider.create(l4(settings), "wrk_test", bind(settings, l4(settings)))
    assert type(caught.value) is error
    assert caught.value.reason.startswith("create_server: ")
    assert caught.value.instance_id is None
    assert emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}


@pytest.mark.parametrize(
    ("kind", "header", "seconds"),
    [
        ("rate_limited", "30", 30.0),
        ("rate_limited", "2.5", 2.5),
        ("rate_limited_html", "7", 7.0),  # a proxy's 429 page may say it too
        ("rate_limited", None, None),
        ("rate_limited", "Wed, 21 Oct 2015 07:28:00 GMT", None),  # a date: not read
        ("rate_limited", "-5", None),
    ],
)
def test_a_rate_limit_carries_its_retry_after(
    emulator: InstanceEmulator,
    settings: Settings,
    provider: ScalewayProvider,
    kind: str,
    header: str | None,
    seconds: float | None,
) -> None:
    emulator.inject("create", kind, retry_after=header)
    with pytest.raises(RateLimited) as caught:
        provider.create(l4(settings), "wrk_test", bind(settings, l4(settings)))
    assert caught.value.retry_after == seconds
    assert not caught.value.counts_in_a_row and not caught.value.allows_fallback
    assert "HTTP 429" in caught.value.reason


def test_only_out_of_stock_allows_fallback() -> None:
    assert OutOfStock("x").allows_fallback
    assert not any(e("x").allows_fallback for _, e in ERRORS if e is not OutOfStock)


def test_every_provider_error_is_counted_under_its_own_outcome() -> None:
    """The metric's label set is the errors' own outcomes: none shared, none missing."""
    everything = ProviderError.__subclasses__()
    assert {e.outcome for e in everything} <= set(PROVISION_OUTCOMES)
    # The public taxonomy (internal helpers such as a 404 while reading back count as "error").
    kinds = [e for e in everything if e.__module__ == ProviderError.__module__]
    # A rate limit is the API unavailable to us for a while: counted so, held its own way.
    assert RateLimited.outcome == ProviderUnavailable.outcome
    assert {e for _, e in ERRORS} - {RateLimited} <= set(kinds)
    outcomes = [e.outcome for e in kinds]
    assert len(set(outcomes)) == len(kinds)
    assert set(outcomes) | {"succeeded", ProviderError.outcome} == set(PROVISION_OUTCOMES)


def test_wrong_secret_is_permission_denied(emulator: InstanceEmulator, settings: Settings) -> None:
    wrong = settings.model_copy(
        update={
            "scaleway_secret_key": settings.scaleway_secret_key.__class__(
                "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f"
            )
        }
    )
    with pytest.raises(PermissionDenied, match="denied_authentication"):
        ScalewayProvider(wrong).list_by_tag(frozenset({"fr-par-2"}))


def test_invalid_credentials_are_refused_before_any_call(settings: Settings) -> None:
    bad = settings.model_copy(
        update={"scaleway_access_key": settings.scaleway_access_key.__class__("nope")}
    )
    with pytest.raises(InvalidArgument, match="scaleway client"):
        ScalewayProvider(bad)


def test_a_slow_api_times_out(emulator: InstanceEmulator, provider: ScalewayProvider) -> None:
    emulator.inject("list_servers", "slow", delay=3.0, times=1)
    with pytest.raises(ProviderTimeout, match="no answer within 1s"):
        provider.list_by_tag(frozenset({"fr-par-2"}))


@pytest.mark.parametrize("op", ["poweron", "user_data"])
def test_a_server_that_cannot_start_is_deleted(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider, op: str
) -> None:
    kind = "out_of_stock" if op == "poweron" else "server_error"
    emulator.inject(op, kind, zone="fr-par-2")
    with pytest.raises(OutOfStock if op == "poweron" else ProviderUnavailable) as caught:
        provider.create(l4(settings), "wrk_test", bind(settings, l4(settings)))
    assert caught.value.instance_id is None  # cleaned up: nothing left to hand on
    started = ["create", "user_data"] if op == "poweron" else ["create"]
    assert [e[0] for e in emulator.events] == [*started, "delete", "gone", "delete_volume"]
    assert emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}


def test_a_start_failure_whose_cleanup_fails_hands_the_instance_on(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    emulator.inject("poweron", "out_of_stock")
    emulator.inject("delete_server", "server_error", times=1)
    with pytest.raises(OutOfStock) as caught:
        provider.create(l4(settings), "wrk_test", bind(settings, l4(settings)))
    leftover = caught.value.instance_id
    assert leftover is not None and leftover in emulator.servers
    assert caught.value.resources["zone"] == "fr-par-2"
    assert provider.delete(leftover, caught.value.resources).confirmed
    assert emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}


def test_listing_pages_through_every_server(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    profile = l4(settings)
    created = {
        provider.create(profile, f"wrk_{i}", lambda iid, res: {}).instance_id for i in range(105)
    }
    listed = provider.list_by_tag(frozenset({"fr-par-2", "fr-par-1"}))
    assert {i.instance_id for i in listed} == created
    pages = [p for m, p in emulator.requests if m == "GET" and p.endswith("/servers")]
    assert len(pages) == 3 + 1  # fr-par-1 (one empty page) + fr-par-2 (100, 5, empty)
    assert {i.profile for i in listed} == {"l4-par2"}
    assert all(i.worker_id and i.worker_id.startswith("wrk_") for i in listed)


def test_states_are_read_as_instance_states(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    """Both spellings of `stopped in place` are one state; a word no provider is known to use
    passes through as it was said."""
    instance = provider.create(l4(settings), "wrk_test", lambda i, r: {})
    assert instance.state is InstanceState.STARTING
    for said, read in [
        ("stopped_in_place", InstanceState.STOPPED_IN_PLACE),  # the Python SDK's enum
        ("stopped in place", InstanceState.STOPPED_IN_PLACE),  # the API's own word
        ("locked", InstanceState.LOCKED),
    ]:
        emulator.set_state(instance.instance_id, said)
        got = provider.get(instance.instance_id, instance.resources)
        assert got is not None and got.state is read
    emulator.set_state(instance.instance_id, "rescuing")
    got = provider.get(instance.instance_id, instance.resources)
    assert got is not None and got.state == "rescuing"
    assert not isinstance(got.state, InstanceState)


@pytest.mark.parametrize("tag_filter", [True, False], ids=["filtered", "filter-ignored"])
def test_listing_keeps_only_fleet_workers_whatever_the_filter_returns(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider, tag_filter: bool
) -> None:
    emulator.list_tag_filter = tag_filter
    for tags in FOREIGN_TAGS:
        foreign_server(emulator, "fr-par-2", tags)
    ours = provider.create(l4(settings), "wrk_ours", lambda i, r: {})
    listed = provider.list_by_tag(frozenset({"fr-par-2"}))
    assert [(i.instance_id, i.worker_id) for i in listed] == [(ours.instance_id, "wrk_ours")]


def test_availability_reads_the_zones_stock_hint(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    assert provider.availability(l4(settings)) == "available"
    emulator.set_availability("fr-par-2", "L4-1-24G", "shortage")
    assert provider.availability(l4(settings)) == "shortage"
    emulator.inject("availability", "server_error")
    assert provider.availability(l4(settings)) is None


def test_teardown_of_a_server_stuck_starting(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    emulator.inject("poweron", "never_start")
    instance = provider.create(l4(settings), "wrk_test", bind(settings, l4(settings)))
    assert emulator.server(instance.instance_id)["state"] == "starting"
    assert provider.delete(instance.instance_id, instance.resources).confirmed
    assert provider.get(instance.instance_id, instance.resources) is None
    assert emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}


def test_teardown_of_an_orphan_learns_its_resources(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    emulator.inject("poweron", "attach_flexible_ip")
    instance = provider.create(l4(settings), "wrk_test", lambda i, r: {})
    # What a sweep knows about an instance it finds: only the zone and the tags.
    result = provider.delete(instance.instance_id, {"zone": "fr-par-2"})
    assert result.confirmed
    assert emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}


def test_user_data_stays_small(settings: Settings) -> None:
    for profile in settings.profiles:
        env = worker_environment(settings, profile, "wrk_" + "f" * 32, "f" * 36)
        assert len(render_user_data(env, profile).encode()) < USER_DATA_LIMIT_BYTES


def test_oversized_user_data_is_refused_and_the_server_deleted(
    emulator: InstanceEmulator, settings: Settings, provider: ScalewayProvider
) -> None:
    def huge(instance_id: str, resources: Mapping[str, Any]) -> Mapping[str, str]:
        return {"MURMUR_PADDING": "x" * USER_DATA_LIMIT_BYTES}

    with pytest.raises(InvalidArgument, match="exceeds"):
        provider.create(l4(settings), "wrk_test", huge)
    assert emulator.inventory() == {"servers": 0, "ips": 0, "volumes": 0}


def test_bounded_returns_raises_and_gives_up() -> None:
    assert bounded(lambda: 42, 1.0, "answer") == 42
    with pytest.raises(KeyError):
        bounded(lambda: {}["missing"], 1.0, "lookup")
    release = threading.Event()
    try:
        with pytest.raises(ProviderTimeout, match="stuck: no answer within 0.05s"):
            bounded(release.wait, 0.05, "stuck")
    finally:
        release.set()
