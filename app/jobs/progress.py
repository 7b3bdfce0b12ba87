"""Hot progress of running jobs, kept in Redis (never one database write per segment).

Each job has a bounded Redis stream of events (`progress`, `segment`, `attempt`) and a small
hash with where it stands (attempt, last sequence number, seconds done of the total, progress).
A worker's report carries its attempt and a sequence number per attempt; one Lua script applies
it atomically, so a report retried after a lost answer is applied once (same attempt, a
sequence number not above the last one: acknowledged, nothing appended), a report of an earlier
attempt is refused (a redelivered job's first worker cannot write into the new attempt), and a
report of a later attempt starts that attempt: an `attempt` event says so, and readers drop the
segments of earlier attempts (they are superseded, never mixed into the final transcript).

Progress never decreases within an attempt. Both keys expire: `ACTIVE_TTL_S` after the last
report while the job runs, `ENDED_TTL_S` once the job's outcome is marked (`mark_status`, from
`service.announce_finished`; the database holds the outcome, these keys are only the live view).

A `status` entry (no payload of its own) marks a change of the job's state in the database (a
claim, an outcome): it wakes the job's event streams (app/jobs/event_hub.py), which then read the
job's status from the database once; the database stays the truth.

A job cut into parts (app/jobs/parts.py) has no single attempt: each part reports as its own
worker runs it (its attempt, its sequence numbers, seconds done of its span), into a hash of
the parts (`report_part`, one Lua script too), and the job's standing and `progress` events
are the sum over its parts, as the job's one attempt: seconds done of every part (a finished
part counts whole) over the file's length, never decreasing. A running part's segments are
not streamed (parts run at once, out of order, and overlap at the seams); the stitched
segments are, as they become final (`publish_segments`: each time a part's result completes
a longer run of parts from the first, the segments past those already streamed), so a
stream's segments are always the start of the job's transcript; the rest follow at `done`.

This module is the store only: the worker endpoint, the events stream and the job view read and
write through it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from app.fleet.learned import LEARNED_KEY

# Bounds: a stream keeps at most MAX_EVENTS entries (approximate trim); one report at most
# MAX_SEGMENTS_PER_REPORT segments of at most MAX_TEXT_CHARS characters each.
MAX_EVENTS = 20_000
MAX_SEGMENTS_PER_REPORT = 64
MAX_TEXT_CHARS = 4_000
ACTIVE_TTL_S = 6 * 3600
ENDED_TTL_S = 3600

_PREFIX = "murmur:progress:"

# KEYS: meta hash, stream. ARGV: attempt, seq, done_s, total_s, maxlen, ttl, then the JSON
# payloads of the segment events. Returns {verdict, progress}: verdict 0 applied, 1 duplicate,
# 2 stale attempt.
_REPORT = """
local attempt = tonumber(ARGV[1])
local seq = tonumber(ARGV[2])
local done_s = tonumber(ARGV[3])
local total_s = tonumber(ARGV[4])
local maxlen = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local cur_attempt = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')
local last_seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
local progress = tonumber(redis.call('HGET', KEYS[1], 'progress') or '0')
if attempt < cur_attempt then return {2, tostring(progress)} end
if attempt == cur_attempt and seq <= last_seq then return {1, tostring(progress)} end
if attempt > cur_attempt then
  progress = 0
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'type', 'attempt',
    'attempt', attempt, 'data', '{"attempt":' .. attempt .. '}')
end
local fraction = 0
if total_s > 0 then fraction = math.min(1, math.max(0, done_s / total_s)) end
if fraction > progress then progress = fraction end
for i = 7, #ARGV do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'type', 'segment',
    'attempt', attempt, 'data', ARGV[i])
end
local data = cjson.encode({attempt = attempt, seq = seq, progress = progress,
  done_seconds = done_s, total_seconds = total_s})
redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'type', 'progress',
  'attempt', attempt, 'data', data)
redis.call('HSET', KEYS[1], 'attempt', attempt, 'seq', seq, 'progress', tostring(progress),
  'done_seconds', tostring(done_s), 'total_seconds', tostring(total_s))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return {0, tostring(progress)}
"""

# KEYS: meta hash, stream, parts hash. ARGV: part id, attempt, seq, done_s, span_s, total_s,
# maxlen, ttl. A part's field holds "attempt seq done"; a finished part's attempt is FINISHED,
# so no later report of it counts. Same verdicts as _REPORT.
_PART_REPORT = """
local attempt = tonumber(ARGV[2])
local seq = tonumber(ARGV[3])
local done_s = math.min(math.max(tonumber(ARGV[4]), 0), tonumber(ARGV[5]))
local total_s = tonumber(ARGV[6])
local maxlen = tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local progress = tonumber(redis.call('HGET', KEYS[1], 'progress') or '0')
local cur = redis.call('HGET', KEYS[3], ARGV[1])
if cur then
  local a, q = string.match(cur, '^(%S+) (%S+)')
  a = tonumber(a); q = tonumber(q)
  if attempt < a then return {2, tostring(progress)} end
  if attempt == a and seq <= q then return {1, tostring(progress)} end
end
if not redis.call('HGET', KEYS[1], 'attempt') then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'type', 'attempt',
    'attempt', 1, 'data', '{"attempt":1}')
end
redis.call('HSET', KEYS[3], ARGV[1], attempt .. ' ' .. seq .. ' ' .. done_s)
local sum = 0
local fields = redis.call('HVALS', KEYS[3])
for i = 1, #fields do
  local d = string.match(fields[i], '^%S+ %S+ (%S+)$')
  sum = sum + tonumber(d)
end
if total_s > 0 then progress = math.max(progress, math.min(1, sum / total_s)) end
local job_seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local data = cjson.encode({attempt = 1, seq = job_seq, progress = progress,
  done_seconds = sum, total_seconds = total_s})
redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'type', 'progress',
  'attempt', 1, 'data', data)
redis.call('HSET', KEYS[1], 'attempt', 1, 'progress', tostring(progress),
  'done_seconds', tostring(sum), 'total_seconds', tostring(total_s))
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end
return {0, tostring(progress)}
"""
FINISHED = 1_000_000  # a finished part's attempt in the parts hash: later reports are stale

# KEYS: meta hash, stream. ARGV: maxlen, ttl, then the JSON payloads of the job's final
# segments so far, from its first. Appends those past the count already streamed (the meta
# hash's `segments`), as attempt 1's; a publisher with fewer than that appends nothing, so two
# at once stream each segment once. Only after a part's report made the job's standing.
# Returns the count streamed.
_PUBLISH = """
if not redis.call('HGET', KEYS[1], 'attempt') then return 0 end
local sent = tonumber(redis.call('HGET', KEYS[1], 'segments') or '0')
local maxlen = tonumber(ARGV[1])
local n = #ARGV - 2
if n <= sent then return sent end
for i = sent + 1, n do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'type', 'segment',
    'attempt', 1, 'data', ARGV[i + 2])
end
redis.call('HSET', KEYS[1], 'segments', n)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
return n
"""

APPLIED, DUPLICATE, STALE = 0, 1, 2


class ReportError(ValueError):
    """A report outside the bounds (sizes, numbers); the endpoint answers it with a 400."""


@dataclass(frozen=True)
class Standing:
    """Where a running job stands: its attempt, progress (0..1) and seconds done of the total."""

    attempt: int
    progress: float
    done_seconds: float
    total_seconds: float


@dataclass(frozen=True)
class Event:
    """One stored event: its stream id (the SSE `id:`), type, attempt and JSON payload."""

    id: str
    type: str
    attempt: int
    data: dict[str, Any]


def _keys(job_id: str) -> tuple[str, str]:
    return f"{_PREFIX}{job_id}:meta", f"{_PREFIX}{job_id}:events"


def _parts_key(job_id: str) -> str:
    return f"{_PREFIX}{job_id}:parts"


def _check_numbers(attempt: int, seq: int, done_seconds: float, total_seconds: float) -> None:
    if attempt < 1 or seq < 1:
        raise ReportError("attempt and seq start at 1")
    if not (0 <= done_seconds <= 1e7 and 0 <= total_seconds <= 1e7):
        raise ReportError("done_seconds and total_seconds are seconds of audio")


def _checked_segments(segments: list[dict[str, Any]]) -> list[str]:
    if len(segments) > MAX_SEGMENTS_PER_REPORT:
        raise ReportError(f"at most {MAX_SEGMENTS_PER_REPORT} segments per report")
    payloads = []
    for segment in segments:
        if len(str(segment.get("text", ""))) > MAX_TEXT_CHARS:
            raise ReportError(f"a segment's text is at most {MAX_TEXT_CHARS} characters")
        payloads.append(json.dumps(segment, separators=(",", ":")))
    return payloads


def report(
    client: redis.Redis,
    job_id: str,
    *,
    attempt: int,
    seq: int,
    done_seconds: float,
    total_seconds: float,
    segments: list[dict[str, Any]],
) -> tuple[int, float]:
    """Apply one worker report; (APPLIED | DUPLICATE | STALE, the job's progress after it)."""
    _check_numbers(attempt, seq, done_seconds, total_seconds)
    payloads = _checked_segments(segments)
    meta, stream = _keys(job_id)
    args: list[str | int | float] = [attempt, seq, done_seconds, total_seconds, MAX_EVENTS]
    args += [ACTIVE_TTL_S, *payloads]
    answer: Any = client.eval(_REPORT, 2, meta, stream, *args)
    verdict, progress = answer
    return int(verdict), float(progress)


def report_part(
    client: redis.Redis,
    job_id: str,
    part_id: str,
    *,
    attempt: int,
    seq: int,
    done_seconds: float,
    span_seconds: float,
    total_seconds: float,
) -> tuple[int, float]:
    """Apply one part's report (or its end: `attempt=FINISHED`, `done_seconds=span_seconds`)
    to its job's standing; (APPLIED | DUPLICATE | STALE, the job's progress after it)."""
    _check_numbers(attempt, seq, done_seconds, total_seconds)
    meta, stream = _keys(job_id)
    args: list[str | int | float] = [part_id, attempt, seq, done_seconds, max(span_seconds, 0.0)]
    args += [total_seconds, MAX_EVENTS, ACTIVE_TTL_S]
    answer: Any = client.eval(_PART_REPORT, 3, meta, stream, _parts_key(job_id), *args)
    verdict, progress = answer
    return int(verdict), float(progress)


def publish_segments(client: redis.Redis, job_id: str, segments: list[dict[str, Any]]) -> int:
    """Stream a job in parts' final segments so far (app/jobs/parts.py, `ready_segments`):
    those past the ones already streamed; the count streamed after it."""
    keep = ("id", "start", "end", "text", "words")
    payloads = [
        json.dumps({k: s[k] for k in keep if k in s}, separators=(",", ":")) for s in segments
    ]
    meta, stream = _keys(job_id)
    answer: Any = client.eval(_PUBLISH, 2, meta, stream, MAX_EVENTS, ACTIVE_TTL_S, *payloads)
    return int(answer)


def mark_status(client: redis.Redis, job_id: str, *, ended: bool) -> None:
    """The job's state changed in the database: a `status` entry wakes its event streams. An
    ended job's live view then expires within ENDED_TTL_S, a running one's within ACTIVE_TTL_S."""
    meta, stream = _keys(job_id)
    pipe = client.pipeline()
    pipe.xadd(stream, {"type": "status", "attempt": 0, "data": "{}"}, maxlen=MAX_EVENTS)
    pipe.expire(stream, ENDED_TTL_S if ended else ACTIVE_TTL_S)
    if ended:
        pipe.expire(meta, ENDED_TTL_S)
        pipe.expire(_parts_key(job_id), ENDED_TTL_S)
    pipe.execute()


def stream_key(job_id: str) -> str:
    """The Redis stream of the job's events (what a waiter's XREAD names)."""
    return _keys(job_id)[1]


def standing(client: redis.Redis, job_id: str) -> Standing | None:
    """The job's hot standing, or None when no report arrived (or the keys expired)."""
    raw: Any = client.hgetall(_keys(job_id)[0])
    if not raw:
        return None
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    return Standing(
        attempt=int(fields["attempt"]),
        progress=float(fields["progress"]),
        done_seconds=float(fields["done_seconds"]),
        total_seconds=float(fields["total_seconds"]),
    )


def events_after(
    client: redis.Redis, job_id: str, after: str = "0-0", count: int = 500
) -> list[Event]:
    """The stored events after stream id `after` (exclusive), oldest first, at most `count`."""
    start = "(" + after if after != "0-0" else "-"
    rows: Any = client.xrange(_keys(job_id)[1], min=start, count=count)
    return [_event(entry_id, fields) for entry_id, fields in rows]


def _event(entry_id: bytes, fields: dict[bytes, bytes]) -> Event:
    return Event(
        id=entry_id.decode(),
        type=fields[b"type"].decode(),
        attempt=int(fields[b"attempt"]),
        data=json.loads(fields[b"data"]),
    )


def current_segments(events: list[Event]) -> list[dict[str, Any]]:
    """The segment payloads of the latest attempt among `events` (earlier attempts superseded)."""
    latest = max((e.attempt for e in events), default=0)
    return [e.data for e in events if e.type == "segment" and e.attempt == latest]


def _profile_speed(client: redis.Redis, profile: str) -> float | None:
    """The profile's measured speed (audio seconds per wall second) from the fleet's cached
    figures (app/fleet/learned.py), read as is: a job view never recomputes them."""
    try:
        raw: Any = client.get(LEARNED_KEY)
        speed = json.loads(raw).get("speed", {}).get(profile) if raw else None
    except (redis.RedisError, ValueError, AttributeError):
        return None
    return float(speed) if isinstance(speed, int | float) and speed > 0 else None


def progress_fields(
    client: redis.Redis, job: dict[str, Any], running_seconds: float | None
) -> dict[str, Any]:
    """`progress` (0..1; 1.0 exactly when succeeded) and `eta_seconds` (None when it cannot be
    estimated) for a job's JSON; one Redis read, and one more for a running job's ETA."""
    status = job.get("status")
    if status == "succeeded":
        return {"progress": 1.0, "eta_seconds": 0.0}
    if status != "running":
        return {
            "progress": 0.0 if status in ("queued", "dispatched") else None,
            "eta_seconds": None,
        }
    try:
        now = standing(client, str(job["id"]))
    except redis.RedisError:
        now = None
    if now is None or now.total_seconds <= 0:
        return {"progress": 0.0, "eta_seconds": None}
    value = min(now.progress, 0.999)  # 1.0 only once succeeded
    eta = eta_seconds(client, job, now.done_seconds, now.total_seconds, running_seconds)
    return {"progress": round(value, 4), "eta_seconds": eta}


def eta_seconds(
    client: redis.Redis,
    job: dict[str, Any],
    done_seconds: float,
    total_seconds: float,
    running_seconds: float | None,
) -> float | None:
    """Seconds until a running job is done: the audio left at its profile's measured speed,
    else at the job's own pace so far; None when neither is known."""
    left = max(0.0, total_seconds - done_seconds)
    speed = _profile_speed(client, str(job.get("profile")))
    if speed is None and running_seconds and running_seconds > 0 and done_seconds > 0:
        speed = done_seconds / running_seconds  # this job's own pace so far
    return round(left / speed, 1) if speed else None
