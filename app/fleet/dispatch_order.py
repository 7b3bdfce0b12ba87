"""Fair dispatch between API tokens: the order in which queued jobs are offered to free workers.

A pure function, for the planner (app/fleet/planner.py `_dispatch`). The rule, in one place:

- Within one owner (one API token), jobs are taken in the order they would finish if each
  had started when it was submitted: submission time plus its audio's length over the
  fleet's fastest measured speed (`due_order`), oldest first while no speed is measured. A
  short file submitted just after a long one goes first, by at most the long one's
  processing time: the longest wait any job can be made to suffer is bounded, and
  nothing starves, while a burst's short jobs no longer wait behind its long ones.
- Between owners, a job's turn is the number of its owner's jobs already dispatched or running
  plus its rank in its owner's queue (1 for the owner's oldest waiting job): the lowest turn
  goes first; on a tie, the owner served least recently (`last_served`: when the reconcile
  last dispatched one of its jobs, app/fleet/served.py), then the oldest job. So owners take
  turns one job at a time (round-robin), and an owner that already holds workers waits behind
  one that holds none: a token with 1,000 queued jobs delays another token's single job by at
  most one job per free worker, never by its backlog.

Owners are equal (no per-token weights or caps): every token is one tenant, and the bounds that
protect the fleet (max_workers, the budget, per-token submission quotas) apply to all alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime


def fair_order(
    ids: Iterable[str],
    owners: Mapping[str, str],
    in_service: Mapping[str, int],
    last_served: Mapping[str, float] | None = None,
) -> list[str]:
    """`ids` (oldest first) in their fair order; a job of no known owner is its own owner,
    never served."""
    served = last_served or {}
    never = float("-inf")
    rank: dict[str, int] = {}
    keyed: list[tuple[int, float, int, str]] = []
    for position, job_id in enumerate(ids):
        owner = owners.get(job_id)
        if owner is None:
            keyed.append((1, never, position, job_id))
            continue
        rank[owner] = rank.get(owner, 0) + 1
        turn = in_service.get(owner, 0) + rank[owner]
        keyed.append((turn, served.get(owner, never), position, job_id))
    keyed.sort()
    return [job_id for *_, job_id in keyed]


def due_order(
    heads: Iterable[tuple[str, datetime, float | None]], speed: float | None
) -> list[str]:
    """The ids of `heads` (id, submitted at, audio seconds; oldest first) by when each job would
    finish had it started at submission, at `speed` audio seconds per second: the order
    `fair_order` takes within an owner. Without a speed, or a job without a length, the
    submission time alone; ties keep the given order."""
    rate = speed if speed is not None and speed > 0 else None
    keyed = []
    for position, (job_id, submitted_at, audio_seconds) in enumerate(heads):
        work = (audio_seconds or 0.0) / rate if rate is not None else 0.0
        keyed.append((submitted_at.timestamp() + work, position, job_id))
    keyed.sort()
    return [job_id for *_, job_id in keyed]
