"""Hot progress from the worker: the per-segment checkpoint, with the segments it saw.

`ProgressWatch` wraps the job's `CancelWatch`: called between segments it checks cancellation
as before; `segment()` (called by the transcriber for each finished segment, times in the
file's seconds) buffers the segment, and at most once per `interval_seconds` (or when
MAX_SEGMENTS are buffered) the buffer goes to the control plane with the seconds done of the
total (gpu_worker/protocol/progress.py). A failed report is logged and its segments dropped
from the live view only: the final transcript is the result, not these reports.

Reports are sent by a thread of the watch's own, in order: the transcription never waits on the
control plane (a slow or retried report costs the decoding nothing), except when OUTBOX reports
are already waiting, which holds the transcription back rather than drop a report. The final
`flush` waits up to DRAIN_SECONDS for them to be sent, so the live view has every segment
before the result is posted, and ends the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from gpu_worker.client import ControlPlaneError
from gpu_worker.protocol.progress import MAX_SEGMENTS

log = logging.getLogger(__name__)

REPORT_INTERVAL_SECONDS = 1.0
# Word times keep a report well under MAX_PROGRESS_BYTES: at most this many per segment, and
# a report is sent once this many are buffered.
MAX_WORDS_PER_SEGMENT = 500
MAX_BUFFERED_WORDS = 1000
# Reports waiting to be sent, at most; how long the final flush waits for them.
OUTBOX = 8
DRAIN_SECONDS = 10.0


@runtime_checkable
class ProgressSink(Protocol):
    def post_progress(self, job_id: str, report: Mapping[str, Any]) -> bool: ...


class ProgressWatch:
    """A checkpoint (`__call__`) that also reports progress (`segment`)."""

    def __init__(
        self,
        watch: Callable[[], None],
        client: ProgressSink,
        job_id: str,
        total_seconds: float,
        *,
        interval_seconds: float = REPORT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        words: bool = False,
    ) -> None:
        self._watch = watch
        self._client = client
        self._job_id = job_id
        self._total = total_seconds
        self._interval = interval_seconds
        self._clock = clock
        self._last = clock()
        self._seq = 0
        self._done = 0.0
        self._buffer: list[dict[str, Any]] = []
        self._next_id = 0
        self._words = words
        self._buffered_words = 0
        self._outbox: queue.Queue[dict[str, Any] | None] = queue.Queue(OUTBOX)
        self._sender: threading.Thread | None = None
        self._closing = threading.Event()
        self.sent = 0  # reports the control plane took (the bench reads it)
        self.enabled = True

    def __call__(self) -> None:
        self._watch()

    def segment(
        self, start: float, end: float, text: str, words: list[dict[str, Any]] | None = None
    ) -> None:
        """One finished segment (seconds in the file; its words' too, sent when the job asked
        for word times); reports when due."""
        if not self.enabled:
            return
        entry: dict[str, Any] = {
            "id": self._next_id,
            "start": round(start, 3),
            "end": round(end, 3),
            "text": text,
        }
        if self._words and words:
            entry["words"] = [
                {**w, "start": round(w["start"], 3), "end": round(w["end"], 3)}
                for w in words[:MAX_WORDS_PER_SEGMENT]
            ]
            self._buffered_words += len(entry["words"])
        self._buffer.append(entry)
        self._next_id += 1
        self._done = max(self._done, min(end, self._total))
        due = self._clock() - self._last >= self._interval
        full = len(self._buffer) >= MAX_SEGMENTS or self._buffered_words >= MAX_BUFFERED_WORDS
        if due or full:
            self.flush()

    def flush(self, final: bool = False) -> None:
        """Queue what is buffered for sending (nothing when nothing is); `final`: then wait
        for the queued reports to be sent (DRAIN_SECONDS at most) and stop the sender."""
        if self._buffer and self.enabled:
            self._seq += 1
            report = {
                "seq": self._seq,
                "done_seconds": self._done,
                "total_seconds": self._total,
                "segments": [{**s, "text": s["text"][:4000]} for s in self._buffer],
            }
            self._buffer = []
            self._buffered_words = 0
            self._last = self._clock()
            if self._sender is None:
                self._sender = threading.Thread(target=self._send, name="progress", daemon=True)
                self._sender.start()
            self._outbox.put(report)
        if final and self._sender is not None:
            self._outbox.put(None)
            self._sender.join(DRAIN_SECONDS)

    def close(self) -> None:
        """The job ended another way (cancelled, failed): the sender stops without draining."""
        self._closing.set()

    def _send(self) -> None:
        while True:
            try:
                report = self._outbox.get(timeout=0.5)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            if report is None:
                return
            if not self.enabled or self._closing.is_set():
                continue
            try:
                if self._client.post_progress(self._job_id, report):
                    self.sent += 1
                else:
                    self.enabled = False  # not ours any more: the cancel check will say so
            except ControlPlaneError as exc:
                log.warning("job %s: progress report failed, carrying on: %s", self._job_id, exc)


def with_progress(
    watch: Callable[[], None],
    client: object,
    job_id: str,
    total_seconds: float,
    *,
    words: bool = False,
) -> Callable[[], None]:
    """`watch` wrapped in a ProgressWatch when `client` can post progress (a test's fake
    control plane may not), else `watch` itself."""
    if isinstance(client, ProgressSink):
        return ProgressWatch(watch, client, job_id, total_seconds, words=words)
    return watch


def close(checkpoint: Callable[[], None]) -> None:
    """Stop a ProgressWatch's sender without waiting (nothing for a plain checkpoint)."""
    if isinstance(checkpoint, ProgressWatch):
        checkpoint.close()


def flush(checkpoint: Callable[[], None]) -> None:
    """Send a ProgressWatch's last buffered segments and wait for its reports to be sent
    (nothing for a plain checkpoint)."""
    if isinstance(checkpoint, ProgressWatch):
        checkpoint.flush(final=True)
