"""A job cancelled while it runs stops between segments and reports itself stopped, not done."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from gpu_worker.client import ControlPlaneClient, ControlPlaneUnavailable
from gpu_worker.holding import CancelWatch, JobCancelled
from gpu_worker.jobs import JobContext, Outcome, process_job
from gpu_worker.state import WorkerState
from gpu_worker.transcriber import FasterWhisperTranscriber


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Plane:
    def __init__(self, answers: list[bool | Exception]) -> None:
        self.answers = answers
        self.asked = 0

    def job_held(self, job_id: str) -> bool:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_the_watch_asks_at_most_once_per_interval_and_stops_when_let_go() -> None:
    clock = Clock()
    plane = Plane([True, ControlPlaneUnavailable("down"), False])
    watch = CancelWatch(plane, "job_1", interval_seconds=2.0, clock=clock)
    for _ in range(50):  # segments faster than the interval cost no request
        watch()
    assert plane.asked == 0
    clock.now += 2.0
    watch()  # still held
    clock.now += 2.0
    watch()  # the check failed: carry on rather than lose the work
    assert plane.asked == 2
    clock.now += 1.0
    watch()
    assert plane.asked == 2
    clock.now += 1.0
    with pytest.raises(JobCancelled):
        watch()
    assert plane.asked == 3


@pytest.mark.slow
def test_a_cancelled_job_stops_early_and_stores_nothing(
    control_plane, tiny_en_dir, fixtures_dir
) -> None:
    transcriber = FasterWhisperTranscriber(tiny_en_dir, compute_type="int8", cpu_threads=2)
    control_plane.add_job("job_1", (fixtures_dir / "speech-90s.wav").read_bytes())
    control_plane.jobs["job_1"]["cancelled"] = True  # cancelled just after the claim
    client = ControlPlaneClient(
        control_plane.url, "wrk_test1", "local-0001", SecretStr(control_plane.token)
    )
    context = JobContext(
        client=client, transcriber=transcriber, state=WorkerState(), cancel_check_seconds=0.0
    )

    assert process_job("job_1", context) is Outcome.CANCELLED

    assert control_plane.results == {}
    assert control_plane.failures["job_1"]["code"] == "cancelled"
    status_calls = [p for m, p, _ in control_plane.requests if p.endswith("/jobs/job_1/status")]
    assert len(status_calls) == 1  # stopped at the first check, before any transcription
    assert context.state.snapshot().current_job_id is None


@pytest.mark.slow
def test_faster_whisper_calls_the_checkpoint_after_each_segment(tiny_en_dir, fixtures_dir) -> None:
    transcriber = FasterWhisperTranscriber(tiny_en_dir, compute_type="int8", cpu_threads=2)
    audio = fixtures_dir / "speech-90s.wav"
    calls: list[int] = []
    transcript = transcriber.transcribe(
        audio, language="en", prompt=None, word_timestamps=False, checkpoint=lambda: calls.append(1)
    )
    assert len(transcript.segments) > 1
    assert len(calls) == len(transcript.segments)

    def cancelled() -> None:
        calls.append(1)
        raise JobCancelled("job_1 is no longer held by this worker")

    calls.clear()
    with pytest.raises(JobCancelled):
        transcriber.transcribe(
            audio, language="en", prompt=None, word_timestamps=False, checkpoint=cancelled
        )
    assert calls == [1]  # stopped after the first segment, not at the end
