"""Provider faults through a whole reconcile (issue 11): each ends with nothing left billed.

Real Redis, SQLite and PostgreSQL, the emulator and the real Scaleway SDK, as in
test_reconcile.py; the faults are the ones the emulator models after recorded traffic.
"""

from __future__ import annotations

from app.models import WorkerState
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
