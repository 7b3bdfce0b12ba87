"""Fetching a URL job's audio: SSRF-checked, size- and time-capped, probed, cut, then dispatched.

A URL job is queued without audio; this is its only path forward, so every way it can go wrong
ends the job with a reason (`url_fetch_failed`, `url_too_large`, `url_not_audio`, ...), and a
redelivery after success or a cancellation meanwhile does nothing. Should its message be lost
(a Redis failover, a broker restart without persistence), `resend_stranded` sends it again:
every run of a fetch marks the job alive in Redis, and a URL job still without audio, long
past its submission, with no such mark, gets one new message at most every few minutes. Two
fetches of one job at once store the audio once (compare-and-set) and fail it only while it
still waits for its audio. The exchange with the URL's
server holds a fetch slot (app/jobs/io_slots.py): with none free it raises `SlotsBusy` before
anything is fetched, and its task tries again later. A download the audio store cannot take
(an outage) is kept on the I/O host's disk (app/jobs/fetch_spool.py, bounded there) and the
fetch raises `SlotsBusy`: its retries try the store again, they do not download again.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from functools import partial
from pathlib import Path

import redis
import requests
from sqlalchemy import select, update

from app.audio import probe_audio
from app.celery_config import FETCH_AUDIO
from app.db import rows_changed
from app.deadline import exchange_deadline
from app.errors import Refused
from app.fleet.served import note_served
from app.jobs import parts, service
from app.jobs.fetch_spool import FetchSpool
from app.jobs.io_slots import FETCH_DEADLINE_SECONDS, IoSlots, SlotsBusy
from app.jobs.loudness import spans_of
from app.models import Job, JobStatus
from app.services import Services
from app.urls import check_url, pinned_session

log = logging.getLogger(__name__)

FETCH_TIMEOUT = (5.0, 30.0)  # connect, read (each socket read)
# The whole exchange: connect, headers and body (app/deadline.py enforces it; a read timeout
# alone lets a server dripping bytes hold a worker for ever).
# FETCH_DEADLINE_SECONDS: app/jobs/io_slots.py.

# A fetch marks its job alive for as long as it may take (plus a retry's wait for a slot).
ALIVE_KEY = "murmur:fetch:alive:"
ALIVE_SECONDS = FETCH_DEADLINE_SECONDS + 120
# A URL job without audio this long after submission, and not alive, lost its message.
STRANDED_AFTER = timedelta(minutes=10)
# At most one new message per job in this many seconds, whatever the sweeps see.
RESENT_KEY = "murmur:fetch:resent:"
RESEND_EVERY_SECONDS = 600
SWEEP_LIMIT = 200


def fetch_audio(svc: Services, slots: IoSlots, job_id: str) -> None:
    """Download a URL job's audio (SSRF-checked, size-capped), store it, then dispatch it.

    Raises `SlotsBusy` (having done nothing) when the job's token, or all tokens together,
    already have as many fetches running as `io` allows, and (keeping the download in the
    spool, app/jobs/fetch_spool.py) when the audio store is unavailable."""
    settings, db, store = svc.settings, svc.db, svc.storage
    spool = FetchSpool.of(settings)
    job = service.get_job(db, job_id)
    if job.status != JobStatus.QUEUED.value or job.audio_key is not None or not job.source_url:
        spool.discard(job_id)  # redelivered after success, or cancelled meanwhile
        return
    _mark_alive(svc.redis, job_id)
    kept = spool.find(job_id)
    if kept is None:
        fetched = _fetch_and_probe(svc, slots, job)
        if fetched is None:
            return  # the job failed, saying why
        staged, size, duration = fetched
        kept = spool.keep(job_id, staged, duration)
    if kept is not None:
        size, duration = kept.size, kept.duration_seconds
        staged = store.staging_path()
    key = staged.name + ".audio"
    try:
        if kept is not None and not spool.staged_copy(kept, staged):
            # The kept copy went meanwhile (another fetch of the job stored it): the retry sees.
            raise SlotsBusy("audio store")
        # Cut like an upload (a long one into parts), while the file is still on local disk.
        spans = spans_of(staged, duration, settings.jobs.part_seconds)
        store.commit(staged, key)
    except Refused as err:
        staged.unlink(missing_ok=True)
        if err.code == "storage_unavailable":
            # An outage of the audio store passes: the job waits, its fetch retries the store
            # with the kept download.
            raise SlotsBusy("audio store") from None
        spool.discard(job_id)
        _fail(svc, job_id, err.code, err.message)  # the store refused the audio (full): why
        return
    spool.discard(job_id)
    with db.session() as s:
        moved = rows_changed(
            s,
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.QUEUED.value, Job.audio_key.is_(None))
            .values(audio_key=key, size_bytes=size, duration_seconds=duration),
        )
        if moved and len(spans) > 1:
            s.add_all(
                parts.new_parts(job_id, spans, JobStatus.QUEUED, svc.clock(), diarize=job.diarize)
            )
    if not moved:
        store.delete(key)
        return
    now = svc.clock()
    if service.try_dispatch_now(db, settings, svc.celery, job_id, now=now):
        note_served(svc.redis, [job.owner], now)  # fair dispatch's memory (app/fleet/served.py)


def _fetch_and_probe(svc: Services, slots: IoSlots, job: Job) -> tuple[Path, int, float] | None:
    """Download the job's URL into a staging file and probe it: (file, size, duration), or
    None when the job failed (saying why). `SlotsBusy` when it should wait and retry."""
    settings = svc.settings
    fail = partial(_fail, svc, job.id)
    staged = svc.storage.staging_path()
    limit = settings.api.max_upload_bytes
    try:
        with slots.held(slots.fetches, job.owner):
            size = _fetch(str(job.source_url), staged, limit, settings.api.allow_private_urls)
        info = probe_audio(staged, settings.api.max_audio_seconds)
    except SlotsBusy:
        staged.unlink(missing_ok=True)
        raise
    except Refused as err:
        staged.unlink(missing_ok=True)
        if err.code == "name_resolution_timeout":
            # The resolver is slow, not the URL wrong: the job waits and its fetch retries.
            raise SlotsBusy("name resolution") from None
        code = "url_not_audio" if err.code in ("invalid_audio", "empty_file") else err.code
        message = err.message if code != "url_not_audio" else f"the URL's content: {err.message}"
        fail(code, message)
        return None
    except requests.RequestException as exc:
        staged.unlink(missing_ok=True)
        fail("url_fetch_failed", f"fetching the URL failed: {type(exc).__name__}")
        return None
    except Exception as exc:
        # Anything else (disk full, a decoder error) must still end the job: a URL job left
        # queued without audio has no other path forward.
        staged.unlink(missing_ok=True)
        log.exception("fetching audio for %s failed", job.id)
        fail("url_fetch_failed", f"storing the URL's content failed: {type(exc).__name__}")
        return None
    return staged, size, info.duration_seconds


def _fetch(url: str, staged: Path, limit: int, allow_private: bool) -> int:
    """Check the URL, then download it into `staged` within the deadline; its size."""
    checked = check_url(url, allow_private=allow_private)
    with (
        pinned_session(checked) as http,
        exchange_deadline(http, FETCH_DEADLINE_SECONDS) as deadline,
    ):
        try:
            size = _download(http, checked.url, staged, limit)
        except Exception:
            if deadline.fired:
                raise _too_slow() from None
            raise
        if deadline.fired:  # a response without a length just looks as if it ended
            raise _too_slow()
    return size


def _too_slow() -> Refused:
    return Refused("url_fetch_failed", f"the URL did not deliver within {FETCH_DEADLINE_SECONDS} s")


def _too_large(limit: int) -> str:
    """The refusal of a URL's content past `limit`, naming the setting that raises it."""
    return (
        f"the URL's content is larger than the limit of {limit} bytes (the setting "
        "api.max_upload_bytes, MURMUR_MAX_UPLOAD_BYTES)"
    )


def _download(http: requests.Session, url: str, staged: Path, limit: int) -> int:
    """Stream the URL's content into `staged`, refusing more than `limit` bytes; its size."""
    response = http.get(url, stream=True, timeout=FETCH_TIMEOUT, allow_redirects=False)
    if response.status_code != 200:
        raise Refused("url_fetch_failed", f"the URL answered HTTP {response.status_code}")
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused("url_too_large", _too_large(limit))
    size = 0
    with staged.open("wb") as out:
        for chunk in response.iter_content(chunk_size=256 * 1024):
            size += len(chunk)
            if size > limit:
                raise Refused("url_too_large", _too_large(limit))
            out.write(chunk)
    return size


def _mark_alive(r: redis.Redis, job_id: str) -> None:
    # The mark only spares a re-send; a fetch runs without it.
    with contextlib.suppress(redis.RedisError):
        r.set(ALIVE_KEY + job_id, 1, ex=ALIVE_SECONDS)


def resend_stranded(svc: Services) -> int:
    """Send the fetch of every URL job whose message was lost again; how many were sent.

    Read from the database (jobs queued without audio since `STRANDED_AFTER`), so whatever
    Redis lost is found; a job whose fetch ran within `ALIVE_SECONDS` is left alone, and each
    job gets at most one new message per `RESEND_EVERY_SECONDS`.
    """
    cutoff = svc.clock() - STRANDED_AFTER
    with svc.db.reader() as s:
        ids = (
            s.execute(
                select(Job.id)
                .where(
                    Job.status == JobStatus.QUEUED.value,
                    Job.created_at < cutoff,
                    Job.audio_key.is_(None),
                    Job.source_url.is_not(None),
                )
                .order_by(Job.created_at, Job.id)
                .limit(SWEEP_LIMIT)
            )
            .scalars()
            .all()
        )
    sent = 0
    for job_id in ids:
        try:
            if svc.redis.exists(ALIVE_KEY + job_id):
                continue
            if not svc.redis.set(RESENT_KEY + job_id, 1, nx=True, ex=RESEND_EVERY_SECONDS):
                continue
            FETCH_AUDIO.send(svc.celery, job_id)
        except Exception as exc:  # Redis or the broker down: the next sweep tries again
            log.warning("could not re-send the fetch of %s: %s", job_id, type(exc).__name__)
            return sent
        log.warning("fetch of %s re-sent: its message was lost", job_id)
        sent += 1
    return sent


def _fail(svc: Services, job_id: str, code: str, message: str) -> None:
    if service.fail_fetch(svc.db, job_id, code, message, now=svc.clock()):
        service.announce_finished(svc.redis, svc.celery, service.get_job(svc.db, job_id))


def give_up_waiting(svc: Services, job_id: str, waited: str, seconds: float) -> None:
    """End a URL job whose fetch waited `seconds` (past io_slots.SLOT_WAIT_SECONDS) for what
    `waited` names (a fetch slot, the audio store, name resolution), saying so."""
    FetchSpool.of(svc.settings).discard(job_id)
    _fail(
        svc,
        job_id,
        "url_fetch_failed",
        f"the fetch waited {seconds:.0f} s for a free {waited} and gave up; submit the job again",
    )
