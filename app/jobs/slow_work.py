"""A bound on the slow work an API process does inside a request: the audio probe and the
name resolution of a submitted URL (a job's `url`, a `webhook_url`).

Invariant: at most `SLOTS` such steps run at once in one process, so uploads of long audio
(a probe decodes up to `max_audio_seconds`, seconds of CPU) or URLs whose resolver is slow
can never occupy every gunicorn thread; /healthz, job reads and the other endpoints keep
threads. A request takes a slot for one step at a time, never two at once. A request that finds no
slot within `WAIT_SECONDS` is refused 503 `server_busy` with Retry-After, before anything is
stored, and may simply be sent again (Retry-After: app/errors.py RETRY_AFTER).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from app.errors import Refused

SLOTS = 4
WAIT_SECONDS = 2.0

_slots = threading.BoundedSemaphore(SLOTS)


@contextmanager
def probe_slot() -> Iterator[None]:
    """Hold one of the process's probe slots, or refuse `server_busy` when none frees in time."""
    if not _slots.acquire(timeout=WAIT_SECONDS):
        raise Refused(
            "server_busy",
            "the server is checking as many uploads and URLs as it allows at once; retry shortly",
        )
    try:
        yield
    finally:
        _slots.release()
