"""The worker's progress reporter (gpu_worker/progress.py): reports go out in order on a thread
of their own, so a slow control plane never holds the transcription back; the final flush
drains them; a job that ends another way stops the sender without waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from gpu_worker.progress import ProgressWatch


class SlowControlPlane:
    """Takes a report after `delay` seconds; answers `accepted` (what the endpoint says)."""

    def __init__(self, delay: float, accepted: bool = True) -> None:
        self.delay = delay
        self.accepted = accepted
        self.reports: list[dict[str, Any]] = []

    def post_progress(self, job_id: str, report: Mapping[str, Any]) -> bool:
        time.sleep(self.delay)
        self.reports.append(dict(report))
        return self.accepted


def _watch(sink: SlowControlPlane, **kw: Any) -> ProgressWatch:
    return ProgressWatch(lambda: None, sink, "job-1", 100.0, interval_seconds=0.0, **kw)


def test_a_slow_control_plane_does_not_hold_the_transcription_back() -> None:
    sink = SlowControlPlane(delay=0.3)
    watch = _watch(sink)
    started = time.monotonic()
    for i in range(5):  # interval 0: each segment is a report
        watch.segment(float(i), i + 1.0, f" s{i}")
    assert time.monotonic() - started < 0.3  # none of the 5 × 0.3 s was waited for
    watch.flush(final=True)
    assert [r["seq"] for r in sink.reports] == [1, 2, 3, 4, 5]
    assert [r["segments"][0]["text"] for r in sink.reports] == [f" s{i}" for i in range(5)]
    assert sink.reports[-1]["done_seconds"] == 5.0 and watch.sent == 5


def test_word_times_are_sent_only_when_the_job_asked() -> None:
    words = [{"word": " a", "start": 0.1234, "end": 0.5}]
    for asked in (False, True):
        sink = SlowControlPlane(delay=0.0)
        watch = _watch(sink, words=asked)
        watch.segment(0.0, 1.0, " a", words)
        watch.flush(final=True)
        sent = sink.reports[0]["segments"][0]
        assert ("words" in sent) is asked
        if asked:
            assert sent["words"] == [{"word": " a", "start": 0.123, "end": 0.5}]


def test_a_refused_report_stops_reporting() -> None:
    sink = SlowControlPlane(delay=0.0, accepted=False)  # the job is no longer this worker's
    watch = _watch(sink)
    watch.segment(0.0, 1.0, " a")
    watch.flush(final=True)
    assert not watch.enabled
    watch.segment(1.0, 2.0, " b")
    watch.flush(final=True)
    assert len(sink.reports) == 1


def test_closing_stops_the_sender_without_draining() -> None:
    sink = SlowControlPlane(delay=0.5)
    watch = _watch(sink)
    before = threading.active_count()
    for i in range(3):
        watch.segment(float(i), i + 1.0, f" s{i}")
    watch.close()  # cancelled: what is queued is not sent
    deadline = time.monotonic() + 5
    while threading.active_count() >= before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before and len(sink.reports) <= 1
