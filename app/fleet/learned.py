"""What the fleet learned from its own history: each profile's boot times and transcription
speed, and how often jobs arrive, for the planner, `/v1/fleet` and `/metrics`.

Read from the database at most once per `LEARN_EVERY` of the control plane's clock and kept in
Redis (`LEARNED_KEY`), so a reconcile every few seconds does not scan finished jobs each time.
Bounded: the newest `BOOT_SAMPLES` successful boots per profile (request → ready) and the
newest `MAX_FINISHED` transcribed jobs. A profile with no history has no samples and no speed:
the planner then falls back to its configured bounds (app/fleet/boot_policy.py) and to one
worker per waiting job (app/fleet/scaling_policy.py).

A job cut into parts (app/jobs/parts.py) ran on several workers at once: its time is the sum
of its transcription parts' times, each bounded by that part's own claim-to-result, never the
job's wall time (which would count W workers' work as one's and learn a speed W times too
fast); its speakers part is not transcription and does not count.

Boots are learned per worker image: a new `worker_image` is pulled cold on each new instance,
so the boots measured with the old one say nothing about it. The reconcile notes each profile's
image (`IMAGES_KEY`, in Redis); when it sees another one it notes the moment, and only the
boots requested since count: until `MIN_BOOT_SAMPLES` of them are measured the profile's boot
timeout is the configured ceiling again, so a slow first pull of a new image is not judged a
failed boot. A profile seen for the first time keeps its history (nothing says its image changed).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import Database, as_utc
from app.models import Job, JobPart, JobStatus, PartStatus, Worker
from gpu_worker.protocol.claim import TRANSCRIBE_PART

log = logging.getLogger("murmur.fleet")

LEARNED_KEY = "murmur:fleet:learned"
# Hash: profile -> {"image": its worker_image, "since": when the reconcile saw it replace another
# one (null: the first image seen, whose history is kept)}.
IMAGES_KEY = "murmur:fleet:images"
LEARN_EVERY = timedelta(seconds=60)
BOOT_SAMPLES = 20
MAX_FINISHED = 500
# Jobs submitted within this window make the arrival rate (app/fleet/idle_policy.py).
ARRIVAL_WINDOW = timedelta(minutes=30)


@dataclass(frozen=True)
class Learned:
    computed_at: datetime
    # Seconds from request to ready of the newest successful boots, newest first.
    boots: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # Audio seconds transcribed per wall second of processing, over the newest finished jobs.
    speed: dict[str, float] = field(default_factory=dict)
    arrivals: int = 0  # jobs submitted within ARRIVAL_WINDOW before computed_at
    # The worker image per profile the boots were learned for (a cache of other images is stale).
    images: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "computed_at": self.computed_at.isoformat(),
            "boots": {k: list(v) for k, v in self.boots.items()},
            "speed": self.speed,
            "arrivals": self.arrivals,
            "images": self.images,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Learned:
        return cls(
            computed_at=datetime.fromisoformat(data["computed_at"]),
            boots={k: tuple(float(x) for x in v) for k, v in data.get("boots", {}).items()},
            speed={k: float(v) for k, v in data.get("speed", {}).items()},
            arrivals=int(data.get("arrivals", 0)),
            images={k: str(v) for k, v in data.get("images", {}).items()},
        )


def image_epochs(
    client: redis.Redis, images: Mapping[str, str], now: datetime, *, note: bool = False
) -> dict[str, datetime]:
    """Per profile whose worker image changed while the control plane watched, since when it
    has run the current one (`now` for a change seen now). A profile first seen here (a new
    installation, an upgrade, a Redis that forgot) keeps its whole history: nothing says the
    image changed. Changes are noted only when `note` (the reconcile's reads): a
    `murmur fleet` run with another configuration must not move the control plane's note."""
    since: dict[str, datetime] = {}
    stored = {
        k.decode() if isinstance(k, bytes) else str(k): v
        for k, v in client.hgetall(IMAGES_KEY).items()
    }
    for name, image in images.items():
        raw = stored.get(name)
        entry: dict[str, Any] = {}
        try:
            entry = json.loads(raw) if raw else {}
            if entry.get("image") == image:
                if entry.get("since"):
                    since[name] = datetime.fromisoformat(entry["since"])
                continue
        except (ValueError, KeyError, TypeError, AttributeError):
            entry = {}  # unreadable: as if first seen
        changed = "image" in entry
        if changed:
            since[name] = now
        if note:
            value = {"image": image, "since": now.isoformat() if changed else None}
            client.hset(IMAGES_KEY, name, json.dumps(value))
            if changed:
                log.info(
                    "fleet: profile %s has a new worker image; its boots are learned anew", name
                )
    return since


def compute_learned(
    db: Database,
    now: datetime,
    images: Mapping[str, str] | None = None,
    since: Mapping[str, datetime] | None = None,
) -> Learned:
    """Read the history now (a few bounded queries). With `since`, a profile's boots count
    only when requested at or after its moment (the boots of its current worker image)."""
    since = since or {}
    with db.reader() as s:
        boots_rows = s.execute(
            select(Worker.profile, Worker.requested_at, Worker.ready_at)
            .where(Worker.ready_at.is_not(None))
            .order_by(Worker.ready_at.desc())
            .limit(BOOT_SAMPLES * 20)
        ).all()
        finished = s.execute(
            select(
                Job.id,
                Job.profile,
                Job.duration_seconds,
                Job.processing_seconds,
                Job.started_at,
                Job.finished_at,
            )
            .where(
                Job.status == JobStatus.SUCCEEDED.value,
                Job.processing_seconds > 0,
                Job.duration_seconds > 0,
            )
            .order_by(Job.finished_at.desc())
            .limit(MAX_FINISHED)
        ).all()
        parted = _parts_seconds(s, [row.id for row in finished])
        arrivals = s.scalars(
            select(Job.id).where(Job.created_at >= now - ARRIVAL_WINDOW).limit(10_000)
        ).all()
    boots: dict[str, list[float]] = {}
    for profile, requested, ready in boots_rows:
        a, b = as_utc(requested), as_utc(ready)
        if a is None or b is None or len(boots.get(profile, ())) >= BOOT_SAMPLES:
            continue
        if profile in since and a < since[profile]:
            continue  # booted another worker image
        boots.setdefault(profile, []).append(max(0.0, (b - a).total_seconds()))
    audio: dict[str, float] = {}
    wall: dict[str, float] = {}
    for job_id, name, duration, processing, started, ended in finished:
        if name is None or duration is None or processing is None:
            continue
        audio[name] = audio.get(name, 0.0) + float(duration)
        spent = parted.get(job_id)
        if spent is None:
            spent = _bounded(float(processing), started, ended)
        wall[name] = wall.get(name, 0.0) + spent
    return Learned(
        computed_at=now,
        boots={k: tuple(v) for k, v in boots.items()},
        speed={k: round(audio[k] / wall[k], 3) for k in audio if wall[k] > 0},
        arrivals=len(arrivals),
        images=dict(images or {}),
    )


def _parts_seconds(s: Session, job_ids: list[str]) -> dict[str, float]:
    """Of these jobs, those cut into parts: the seconds their transcription parts took, each
    bounded by its own claim-to-result (see the module's docstring)."""
    spent: dict[str, float] = {}
    for chunk in (job_ids[i : i + 500] for i in range(0, len(job_ids), 500)):
        rows = s.execute(
            select(
                JobPart.job_id, JobPart.processing_seconds, JobPart.started_at, JobPart.finished_at
            ).where(
                JobPart.job_id.in_(chunk),
                JobPart.kind == TRANSCRIBE_PART,
                JobPart.status == PartStatus.SUCCEEDED.value,
            )
        ).all()
        for job_id, processing, started, ended in rows:
            took = _bounded(float(processing or 0.0), started, ended)
            spent[job_id] = spent.get(job_id, 0.0) + took
    return spent


def _bounded(processing: float, started: datetime | None, ended: datetime | None) -> float:
    """The worker's `processing_seconds`, at most the time from its claim to its result: the
    figure is the worker's word, and a worker saying more would make the learned speed (and
    so every plan) slower than the fleet is."""
    a, b = as_utc(started), as_utc(ended)
    if a is None or b is None:
        return processing
    return min(processing, max(0.0, (b - a).total_seconds()))


def read_learned(
    db: Database,
    client: redis.Redis,
    now: datetime,
    images: Mapping[str, str] | None = None,
    *,
    note: bool = False,
) -> Learned:
    """The cached figures, recomputed when older than LEARN_EVERY (or from a later clock) or
    learned for other worker images than `images` (profile -> worker_image); `note`: see
    `image_epochs`."""
    images = dict(images or {})
    try:
        raw = client.get(LEARNED_KEY)
        if raw:
            cached = Learned.from_json(json.loads(raw))
            fresh = timedelta(0) <= now - cached.computed_at < LEARN_EVERY
            if fresh and cached.images == images:
                return cached
    except (redis.RedisError, ValueError, KeyError, TypeError):
        pass  # recompute below
    try:
        since = image_epochs(client, images, now, note=note)
    except redis.RedisError as exc:
        log.warning("fleet: cannot read the worker images' history: %s", exc)
        since = {}  # unknown: as if first seen
    learned = compute_learned(db, now, images, since)
    try:
        client.set(LEARNED_KEY, json.dumps(learned.to_json()), ex=3600)
    except redis.RedisError as exc:
        log.warning("fleet: cannot cache what the fleet learned: %s", exc)
    return learned
