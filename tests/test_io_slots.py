"""The I/O bounds (app/jobs/io_slots.py) on a real Redis: in all and per token, shared by
every holder, freed on exit, and freed by their lease when a holder dies without exiting."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import replace

import pytest
import redis

from app.config import IoSettings
from app.jobs.io_slots import IoSlots, SlotsBusy, busy_countdown


def test_a_token_gets_its_bound_and_others_keep_theirs(clean_redis: redis.Redis) -> None:
    slots = IoSlots(clean_redis, IoSettings(fetches=3, fetches_per_token=2))
    with ExitStack() as held:
        held.enter_context(slots.held(slots.fetches, "alice"))
        held.enter_context(slots.held(slots.fetches, "alice"))
        with pytest.raises(SlotsBusy), slots.held(slots.fetches, "alice"):
            pass
        held.enter_context(slots.held(slots.fetches, "bob"))  # another token still gets one
        with pytest.raises(SlotsBusy), slots.held(slots.fetches, "carol"):
            pass  # ... until the total is reached
        assert slots.in_use(slots.fetches) == 3
        assert slots.in_use(slots.fetches, "alice") == 2
        # Fetches and webhooks are bounded apart: a token's tarpits do not stop its webhooks.
        with slots.held(slots.webhooks, "alice"):
            assert slots.in_use(slots.webhooks) == 1
    assert slots.in_use(slots.fetches) == 0  # every exit frees its slot
    with slots.held(slots.fetches, "carol"):
        pass


_DYING_HOLDER = """
import sys, time, redis
from dataclasses import replace
from app.config import IoSettings
from app.jobs.io_slots import IoSlots
slots = IoSlots(redis.Redis.from_url(sys.argv[1]), IoSettings(webhooks=1, webhooks_per_token=1))
with slots.held(replace(slots.webhooks, lease_seconds=1.0), "alice"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_slot_whose_holder_died_is_free_when_its_lease_ends(
    clean_redis: redis.Redis, redis_url: str
) -> None:
    slots = IoSlots(clean_redis, IoSettings(webhooks=1, webhooks_per_token=1))
    short = replace(slots.webhooks, lease_seconds=1.0)
    # A task killed mid-attempt (SIGKILL): its `finally` never runs, its keeper dies with it.
    holder = subprocess.Popen(
        [sys.executable, "-c", _DYING_HOLDER, redis_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(SlotsBusy), slots.held(short, "bob"):
            pass
    finally:
        holder.kill()
        holder.wait(timeout=10)
    deadline = time.monotonic() + 30
    while True:
        try:
            with slots.held(short, "bob"):
                break
        except SlotsBusy:
            assert time.monotonic() < deadline, "the dead holder's slot was never freed"
            time.sleep(0.2)
    assert slots.in_use(short, "alice") == 0


def test_leases_outlast_the_work_they_cover(clean_redis: redis.Redis) -> None:
    from app.jobs.delivery import WEBHOOK_DEADLINE_SECONDS
    from app.jobs.fetch import FETCH_DEADLINE_SECONDS

    slots = IoSlots(clean_redis, IoSettings())
    assert slots.fetches.lease_seconds > FETCH_DEADLINE_SECONDS
    assert slots.webhooks.lease_seconds > WEBHOOK_DEADLINE_SECONDS


def test_an_unreachable_redis_is_busy_never_unbounded() -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    slots = IoSlots(dead, IoSettings())
    with pytest.raises(SlotsBusy), slots.held(slots.fetches, "alice"):
        raise AssertionError("ran without a slot")


def test_waiting_tasks_back_off_with_jitter() -> None:
    waits = [busy_countdown(n) for n in range(12)]
    assert all(0 < w <= 30 for w in waits)
    assert busy_countdown(0) <= 1.0 and busy_countdown(10) >= 15.0


def test_slots_lost_to_a_flush_are_rebuilt_by_their_holders(clean_redis: redis.Redis) -> None:
    """Issue 32 §6: after a Redis FLUSHALL, running fetches lost their slot records and one
    token ran twice its bound. Holders re-assert their slots, so the bound comes back."""
    slots = IoSlots(clean_redis, IoSettings(fetches=4, fetches_per_token=2))
    with ExitStack() as held:
        held.enter_context(slots.held(slots.fetches, "alice"))
        held.enter_context(slots.held(slots.fetches, "alice"))
        clean_redis.flushdb()  # the test database only; FLUSHALL's effect on it
        assert slots.in_use(slots.fetches, "alice") == 0
        deadline = time.monotonic() + 10
        while slots.in_use(slots.fetches, "alice") < 2:
            assert time.monotonic() < deadline, "the flushed slots were never rebuilt"
            time.sleep(0.05)
        with pytest.raises(SlotsBusy), slots.held(slots.fetches, "alice"):
            pass
    assert slots.in_use(slots.fetches, "alice") == 0  # and freed on exit, as before
