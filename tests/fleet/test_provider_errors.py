"""Each kind of provider error, met at a create, against the fake provider
(app/fleet/providers/fake.py): only a stock-out falls back to the next profile; every other
error holds the profile with its reason and creates nothing elsewhere; an error that left an
instance behind gets that instance torn down. Real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.fleet.providers.base import (
    InvalidArgument,
    OutOfStock,
    PermissionDenied,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    QuotaExceeded,
)
from app.fleet.providers.fake import FakeProvider
from app.fleet.snapshot import as_utc
from app.models import ProfileState, WorkerState
from app.observability.store import PROVISION_ATTEMPTS_KEY
from tests.fleet.conftest import L4, P100, Fleet, MakeFleet


def _fleet(make_fleet: MakeFleet) -> tuple[Fleet, FakeProvider]:
    fake = FakeProvider("scaleway")
    return make_fleet([L4, P100], providers={"scaleway": fake}), fake


def _state(fleet: Fleet, name: str) -> ProfileState | None:
    with fleet.db.reader() as s:
        return s.scalars(select(ProfileState).where(ProfileState.name == name)).first()


def test_a_stock_out_falls_back_to_the_next_profile_in_the_same_run(
    make_fleet: MakeFleet,
) -> None:
    fleet, fake = _fleet(make_fleet)
    fake.fail_next("create", OutOfStock("L4-1-24G is out of stock in fr-par-2"))
    fleet.add_jobs(1)

    report = fleet.reconcile()

    assert fake.targets("create") == ["l4-par2", "p100-par1"]
    assert [o.stocked_out for o in report.outcomes][0] == ["l4-par2"]
    booting = fleet.workers(WorkerState.BOOTING.value)
    assert [w.profile for w in booting] == ["p100-par1"]
    state = _state(fleet, "l4-par2")
    assert state is not None and state.backoff_until is not None
    assert state.availability == "shortage"


def test_a_shortage_hint_is_an_out_of_stock_before_anything_is_created(
    make_fleet: MakeFleet,
) -> None:
    fleet, fake = _fleet(make_fleet)
    fake.hints["l4-par2"] = "shortage"
    fleet.add_jobs(1)

    report = fleet.reconcile()

    assert fake.targets("create") == ["p100-par1"]  # nothing asked of the L4, at once the P100
    assert report.outcomes[0].stocked_out == ["l4-par2"]
    assert [w.profile for w in fleet.workers(WorkerState.BOOTING.value)] == ["p100-par1"]
    state = _state(fleet, "l4-par2")
    assert state is not None and state.consecutive_stockouts == 1
    assert state.backoff_until is not None and state.retry_at is None
    assert state.availability == "shortage"
    assert "reports a shortage of L4-1-24G in fr-par-2" in (state.last_error or "")
    counted = fleet.svc.redis.hgetall(PROVISION_ATTEMPTS_KEY)
    assert counted == {b"l4-par2|out_of_stock": b"1", b"p100-par1|succeeded": b"1"}
    (refused,) = [w for w in fleet.workers() if w.profile == "l4-par2"]
    assert refused.state == WorkerState.FAILED.value and refused.instance_id is None
    assert refused.delete_reason == "out of stock"

    # Backing off: the next round does not ask again, nor create.
    fleet.reconcile(advance=5)
    assert fake.targets("create") == ["p100-par1"]


@pytest.mark.parametrize("hint", ["scarce", "available", None], ids=str)
def test_any_other_hint_goes_on_to_create(make_fleet: MakeFleet, hint: str | None) -> None:
    fleet, fake = _fleet(make_fleet)
    if hint is not None:
        fake.hints["l4-par2"] = hint
    fleet.add_jobs(1)

    fleet.reconcile()

    assert fake.targets("create") == ["l4-par2"]
    state = _state(fleet, "l4-par2")
    assert state is not None and state.availability == hint and state.backoff_until is None


@pytest.mark.parametrize(
    "error",
    [
        QuotaExceeded("quota of GPU servers reached"),
        PermissionDenied("the key may not create servers"),
        InvalidArgument("image not found in fr-par-2"),
        ProviderUnavailable("HTTP 503"),
        ProviderTimeout("create: no answer within 2s"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_any_other_error_holds_the_profile_without_falling_back(
    make_fleet: MakeFleet, error: ProviderError
) -> None:
    fleet, fake = _fleet(make_fleet)
    fake.fail_next("create", error)
    fleet.add_jobs(1)

    report = fleet.reconcile()

    assert fake.targets("create") == ["l4-par2"]  # nothing asked of the next profile
    assert report.outcomes[0].errors == [f"l4-par2: {error.reason}"]
    assert not fleet.workers(WorkerState.BOOTING.value)
    state = _state(fleet, "l4-par2")
    assert state is not None and state.last_error == error.reason
    retry_at = as_utc(state.retry_at)
    assert retry_at is not None and retry_at > fleet.clock()
    # Held: the next round, before the retry time, asks nothing of the provider either.
    fleet.reconcile(advance=5)
    assert fake.targets("create") == ["l4-par2"]


def test_an_error_that_left_an_instance_gets_it_torn_down(make_fleet: MakeFleet) -> None:
    fleet, fake = _fleet(make_fleet)
    left = fake.create  # a create that "half worked": the instance exists, then it fails

    def half_create(profile, worker_id, bind):  # type: ignore[no-untyped-def]
        instance = left(profile, worker_id, bind)
        raise ProviderUnavailable("poweron: HTTP 503").leftover(
            instance.instance_id, instance.resources
        )

    fake.create = half_create  # type: ignore[method-assign]
    fleet.add_jobs(1)

    fleet.reconcile()
    (row,) = fleet.workers()
    assert row.state == WorkerState.DELETING.value and row.instance_id in fake.instances

    fleet.reconcile(advance=5)
    assert fake.targets("delete") == [row.instance_id]
    assert row.instance_id not in fake.instances
    assert [w.state for w in fleet.workers()] == [WorkerState.DELETED.value]
