"""Boot policy: how long a profile's workers take to boot, when a worker has booted, and when
a live worker is dead (boot timeout, a boot failure it reported, silence, an instance gone or
stopped), which decides its profile's fate. An instance that ran and stopped before its worker
was ever ready is a failed boot (`Death.BOOT_FAILED`), on every provider.

Boot time is learned, not guessed: a profile's estimate is the p95 of its recent successful
boots (request → ready, app/fleet/learned.py) × `rules.boot_margin`, at least
`rules.boot_floor` and at most the configured `rules.boot_timeout` — which is also the estimate
while fewer than `MIN_BOOT_SAMPLES` boots are measured. The estimate is the profile's boot
timeout (a boot slower than it is a failed boot) and the boot the scaling and idle policies
weigh.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.fleet.plan_records import (
    LIVE,
    REPORTING,
    STARTING,
    Death,
    Delete,
    FleetRules,
    FleetState,
    InstanceSnapshot,
    MarkBooted,
    MarkDead,
    MarkStarting,
    ProfileSnapshot,
    Round,
    WorkerSnapshot,
    age_of,
    fmt_seconds,
    short_reason,
    stock_detail,
)
from app.fleet.providers.base import InstanceState, is_stopped
from app.models import WorkerState

# Fewer measured boots than this: the configured boot timeout stands for the estimate.
MIN_BOOT_SAMPLES = 3


def percentile(values: tuple[float, ...] | list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of non-empty `values`."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return ordered[int(rank) - 1]


def boot_estimate(samples: tuple[float, ...], rules: FleetRules) -> float:
    """Seconds a new worker of a profile with these measured boots takes to be ready, at worst."""
    ceiling = rules.boot_timeout.total_seconds()
    if len(samples) < MIN_BOOT_SAMPLES:
        return ceiling
    floor = min(rules.boot_floor.total_seconds(), ceiling)
    return min(ceiling, max(floor, percentile(samples, 95) * rules.boot_margin))


def profile_boot(p: ProfileSnapshot | None, rules: FleetRules) -> float:
    return boot_estimate(p.boot_samples if p is not None else (), rules)


def lifecycle(r: Round) -> None:
    """1. Lifecycle facts and dead workers."""
    state = r.state
    instances = {(i.provider, i.instance_id): i for i in state.inventory}
    limit = silence_limit(state)
    for w in state.workers:
        inst = instances.get((w.provider, w.instance_id)) if w.instance_id else None
        death = death_of(w, inst, state, limit)
        if death is not None:
            r.dead[w.id] = MarkDead(w.id, *death)
            continue
        if (
            w.state in LIVE
            and w.booted_at is None
            and inst is not None
            and inst.state == InstanceState.RUNNING
        ):
            r.booted.append(MarkBooted(w.id))
        elif (
            w.state == WorkerState.BOOTING.value
            and not w.seen_starting
            and inst is not None
            and inst.state == InstanceState.STARTING
        ):
            r.booted.append(MarkStarting(w.id))
        elif w.state == WorkerState.DELETING.value or w.state == WorkerState.FAILED.value:
            # Teardown not confirmed yet (or a worker rejected at readiness): keep at it.
            r.teardown.append(Delete(w.id, w.delete_reason or short_reason(w.error) or "failed"))


def last_heard(w: WorkerSnapshot, state: FleetState) -> datetime:
    seen = w.last_seen_at or w.ready_at or w.created_at or w.requested_at
    if state.listening_since is not None and state.listening_since > seen:
        return state.listening_since
    return seen


def silence_limit(state: FleetState) -> timedelta | None:
    """How long a ready worker may be silent before it is dead, this round."""
    rules = state.rules
    if rules.heartbeat_timeout is None or rules.outage_timeout is None:
        return rules.heartbeat_timeout
    ready = [w for w in state.workers if w.state in REPORTING]
    if any(state.now - last_heard(w, state) <= rules.heartbeat_timeout for w in ready):
        return rules.heartbeat_timeout  # others are heard: the silent ones are the problem
    return max(rules.outage_timeout, rules.heartbeat_timeout)


def death_of(
    w: WorkerSnapshot,
    inst: InstanceSnapshot | None,
    state: FleetState,
    silence_limit: timedelta | None,
) -> tuple[Death, str] | None:
    """Why a live worker must be declared dead (and its jobs re-routed), or None."""
    now, rules = state.now, state.rules
    failed = Death.of(w.error) if w.state == WorkerState.FAILED.value else None
    if failed in (Death.RUNTIME_REJECTED, Death.BOOT_FAILED):
        # Refused at readiness, or a boot failure the instance reported, not counted yet
        # (counting moves it to DELETING).
        assert failed is not None
        return failed, w.error or failed.value
    if w.state in STARTING:
        age = age_of(now, w.requested_at)
        if age is not None and age > rules.create_timeout:
            return died(Death.PROVISIONING_INTERRUPTED, f"still {w.state} after {fmt_seconds(age)}")
        return None
    if w.state not in LIVE:
        return None
    if w.instance_id is not None and w.provider in state.inventory_known and inst is None:
        return died(Death.INSTANCE_GONE, "the provider no longer lists it")
    if inst is not None and is_stopped(inst.state) and w.booted_at is not None:
        said = f"{inst.state}, {inst.detail}" if inst.detail else inst.state
        if w.state == WorkerState.BOOTING.value and w.ready_at is None:
            # It ran and stopped before it was ever ready: a failed boot like one it reported
            # (counted, its profile held, the job charged), whether or not its report arrived.
            return died(Death.BOOT_FAILED, f"the instance stopped before it was ready ({said})")
        return died(Death.INSTANCE_STOPPED, f"the provider reports it {said}")
    if (
        inst is not None
        and is_stopped(inst.state)
        and w.state == WorkerState.BOOTING.value
        and w.ready_at is None
        and (w.seen_starting or stock_detail(inst.detail))
    ):
        # Powered on, never booted, stopped again: Scaleway's asynchronous out-of-stock. Only
        # when the provider says so, or after it was seen starting: right after an accepted
        # power-on a read may still show `stopped`, and that server is on its way up.
        said = f"{inst.state}, {inst.detail}" if inst.detail else inst.state
        return died(Death.OUT_OF_STOCK, f"the provider stopped it before it booted ({said})")
    if w.state == WorkerState.BOOTING.value:
        age = age_of(now, w.requested_at)
        limit = timedelta(seconds=profile_boot(_profile(state, w.profile), rules))
        if age is not None and age > limit:
            seen = f" (the provider reports it {inst.state})" if inst is not None else ""
            return died(
                Death.BOOT_TIMEOUT, f"not ready {fmt_seconds(age)} after it was requested{seen}"
            )
        return None
    if silence_limit is not None:
        silent = now - last_heard(w, state)
        if silent > silence_limit:
            return died(Death.NO_HEARTBEAT, f"silent for {fmt_seconds(silent)}")
    return None


def _profile(state: FleetState, name: str) -> ProfileSnapshot | None:
    return next((p for p in state.profiles if p.name == name), None)


def died(death: Death, detail: str) -> tuple[Death, str]:
    return death, death.because(detail)
