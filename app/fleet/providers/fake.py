"""`FakeProvider`: a provider held in memory, for unit tests and benches; no user configures it.

It keeps the contract of `Provider` (app/fleet/providers/base.py) as the real providers do:
`bind` is called with the instance id and resources before the instance "starts"; instances
carry their worker and profile; `list_by_tag` lists every instance it holds in the scopes
asked for (zones; all of them when no scope is given); a teardown is confirmed once the
instance is gone, and a second teardown of a gone instance is confirmed at once.

A test scripts what a cloud does to the fleet:
- `out_of_stock`: profiles whose creates raise `OutOfStock` until removed;
- `fail_next(operation, error)`: the next call of an operation raises that `ProviderError`;
- `stuck`: instances whose teardown stays pending (a server that is not gone yet);
- `stop(instance_id)`: an instance that stopped on its own;
- `hints`: the stock hint `availability` gives per profile (`shortage`: the fleet never calls
  `create` for it);
- `on_call`: called with the operation's name before each call (to step a `FakeClock`, say).

Every call is recorded in `calls` as (operation, profile name or instance id). Calls may come
from the threads `bounded` runs them in, so the state is guarded by one lock.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from app.config import Profile
from app.fleet.providers.base import (
    Bind,
    Instance,
    InstanceState,
    OutOfStock,
    ProviderError,
    Teardown,
)


class FakeProvider:
    def __init__(self, name: str, *, on_call: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.on_call = on_call
        self.instances: dict[str, Instance] = {}
        self.out_of_stock: set[str] = set()
        self.stuck: set[str] = set()
        self.hints: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self._faults: dict[str, list[ProviderError]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- scripting -------------------------------------------------------------------------

    def fail_next(self, operation: str, error: ProviderError) -> None:
        """The next call of `operation` (create, get, list, delete) raises `error`."""
        with self._lock:
            self._faults.setdefault(operation, []).append(error)

    def stop(self, instance_id: str, detail: str = "") -> None:
        """The instance stopped on its own (a crash, a host failure)."""
        with self._lock:
            self.instances[instance_id] = replace(
                self.instances[instance_id], state=InstanceState.STOPPED, detail=detail
            )

    def targets(self, operation: str) -> list[str]:
        """The profile names (or instance ids) the calls of `operation` were made for."""
        with self._lock:
            return [what for op, what in self.calls if op == operation]

    def _call(self, operation: str, what: str) -> None:
        if self.on_call is not None:
            self.on_call(operation)
        with self._lock:
            self.calls.append((operation, what))
            faults = self._faults.get(operation)
            error = faults.pop(0) if faults else None
        if error is not None:
            raise error

    # -- the interface ---------------------------------------------------------------------

    def create(self, profile: Profile, worker_id: str, bind: Bind) -> Instance:
        self._call("create", profile.name)
        if profile.name in self.out_of_stock:
            raise OutOfStock(
                f"{self.name}: {profile.server_type} is out of stock in {profile.zone}"
            )
        instance_id = f"{self.name}-{next(self._ids):04d}"
        resources: Mapping[str, Any] = {"zone": profile.zone}
        bind(instance_id, resources)
        instance = Instance(instance_id, InstanceState.RUNNING, worker_id, profile.name, resources)
        with self._lock:
            self.instances[instance_id] = instance
        return instance

    def get(self, instance_id: str, resources: Mapping[str, Any]) -> Instance | None:
        self._call("get", instance_id)
        with self._lock:
            return self.instances.get(instance_id)

    def list_by_tag(self, scopes: frozenset[str]) -> list[Instance]:
        self._call("list", ",".join(sorted(scopes)))
        with self._lock:
            return [
                i
                for i in self.instances.values()
                if not scopes or i.resources.get("zone") in scopes
            ]

    def delete(self, instance_id: str, resources: Mapping[str, Any]) -> Teardown:
        self._call("delete", instance_id)
        with self._lock:
            if instance_id in self.stuck:
                return Teardown(False, resources, "server stopping")
            self.instances.pop(instance_id, None)
        return Teardown(True, server_gone=True)

    def availability(self, profile: Profile) -> str | None:
        return self.hints.get(profile.name)
