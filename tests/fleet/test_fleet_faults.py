"""Provider faults through a whole reconcile (issue 11): each ends with nothing left billed.

Real Redis, SQLite and PostgreSQL, the emulator and the real Scaleway SDK, as in
test_reconcile.py; the faults are the ones the emulator models after recorded traffic.
"""

from __future__ import annotations

from app.models import WorkerState
from tasks.fleet.snapshot import as_utc
from tests.fleet.conftest import Fleet, MakeFleet

NOTHING = {"servers": 0, "ips": 0, "volumes": 0}


def settle(fleet: Fleet, rounds: int = 5) -> None:
    for _ in range(rounds):
        if not fleet.workers(WorkerState.DELETING.value, WorkerState.FAILED.value):
            return
        fleet.reconcile()


def test_a_server_stuck_starting_is_deleted_after_the_boot_timeout(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(fleet={"boot_timeout_seconds": 20.0})
    assert fleet.emulator is not None
    fleet.emulator.inject("poweron", "never_start", times=1)
    fleet.add_jobs(1)
    fleet.reconcile()
    (w,) = fleet.workers()
    assert fleet.emulator.server(w.instance_id or "")["state"] == "starting"
    assert fleet.emulator.inventory() == {"servers": 1, "ips": 0, "volumes": 1}

    fleet.reconcile(advance=21)
    settle(fleet)
    dead = next(x for x in fleet.workers() if x.id == w.id)
    assert dead.state == WorkerState.DELETED.value and dead.delete_reason == "boot timeout"
    # Its replacement is the only server left; without it, nothing at all.
    left = [s for s in fleet.emulator.servers if s != w.instance_id]
    assert w.instance_id not in fleet.emulator.servers
    assert fleet.emulator.inventory() == {"servers": len(left), "ips": 0, "volumes": len(left)}


def test_a_held_error_keeps_its_detail_and_backs_off_exponentially(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet(fleet={"backoff_seconds": 60.0, "backoff_max_seconds": 200.0})
    assert fleet.emulator is not None
    fleet.emulator.inject("create", "image_not_found", zone="fr-par-2")
    fleet.add_jobs(1)
    waits = []
    for _ in range(4):
        fleet.reconcile()
        state = fleet.profile_state("l4-par2")
        assert state is not None and state.retry_at is not None
        assert "image: image not found" in (state.last_error or "")
        assert "HTTP 400 invalid_arguments" in (state.last_error or "")
        retry_at = as_utc(state.retry_at)
        assert retry_at is not None
        waits.append((retry_at - fleet.clock()).total_seconds())
        fleet.clock.now = retry_at  # the next round is the first allowed to try again
    assert waits == [60.0, 120.0, 200.0, 200.0]
    assert fleet.emulator.inventory() == NOTHING

    fleet.emulator.clear_faults()
    fleet.reconcile()
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_errors == 0 and state.retry_at is None
