"""One job end to end against a fake control plane: success, no-ops, failures, idempotency."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from gpu_worker.client import ControlPlaneClient, ControlPlaneUnavailable
from gpu_worker.jobs import DrainDeadlineExceeded, JobContext, Outcome, process_job
from gpu_worker.state import Phase, WorkerState
from gpu_worker.transcriber import FasterWhisperTranscriber
from tests.audio_encode import lying_flac

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def transcriber(tiny_en_dir):
    return FasterWhisperTranscriber(tiny_en_dir, compute_type="int8", cpu_threads=2)


class BrokenTranscriber:
    backend = "faster-whisper"

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.released = 0

    def transcribe(
        self, audio, *, language, prompt, word_timestamps, checkpoint=None, task="transcribe"
    ):
        raise self.error

    def release_memory(self) -> None:
        self.released += 1


def context_for(plane, transcriber, attempts=4):
    client = ControlPlaneClient(
        plane.url,
        "wrk_test1",
        "local-0001",
        SecretStr(plane.token),
        attempts=attempts,
        sleep=lambda _: None,
    )
    return JobContext(client=client, transcriber=transcriber, state=WorkerState())


def audio_gets(plane):
    return [path for method, path, _ in plane.requests if method == "GET"]


def test_a_job_is_transcribed_and_its_result_posted(
    control_plane, transcriber, fixtures_dir, word_error_rate
):
    control_plane.add_job(
        "job_1", (fixtures_dir / "speech-short.wav").read_bytes(), word_timestamps=True
    )
    context = context_for(control_plane, transcriber)

    outcome = process_job("job_1", context)

    assert outcome is Outcome.SUCCEEDED
    body = control_plane.results["job_1"]
    transcript = body["transcript"]
    reference = (fixtures_dir / "speech-short.txt").read_text()
    assert word_error_rate(reference, transcript["text"]) <= 0.25
    assert transcript["segments"][0]["words"]
    assert body["processing_seconds"] > 0
    snapshot = context.state.snapshot()
    assert (snapshot.jobs_succeeded, snapshot.jobs_failed) == (1, 0)
    assert snapshot.audio_seconds == pytest.approx(6.6, abs=0.1)
    assert snapshot.current_job_id is None


def test_running_the_same_job_twice_is_harmless(control_plane, transcriber, fixtures_dir):
    control_plane.add_job("job_1", (fixtures_dir / "silence-5s.wav").read_bytes())
    context = context_for(control_plane, transcriber)

    first = process_job("job_1", context)
    second = process_job("job_1", context)

    assert (first, second) == (Outcome.SUCCEEDED, Outcome.NOT_CLAIMABLE)
    assert control_plane.results["job_1"]["transcript"]["text"] == ""
    assert control_plane.results["job_1"]["transcript"]["segments"] == []
    assert len(audio_gets(control_plane)) == 1
    assert context.state.snapshot().jobs_succeeded == 1


def test_a_job_that_is_not_claimable_is_left_alone(control_plane, transcriber):
    control_plane.add_job("job_1", b"")
    control_plane.jobs["job_1"]["state"] = "cancelled"
    context = context_for(control_plane, transcriber)

    assert process_job("job_1", context) is Outcome.NOT_CLAIMABLE
    assert audio_gets(control_plane) == []
    assert control_plane.failures == {} and control_plane.results == {}
    assert context.state.phase is Phase.STARTING  # never marked busy


def test_undecodable_audio_is_reported_as_a_failure(control_plane, transcriber):
    control_plane.add_job("job_1", b"this is not audio" * 100)

    assert process_job("job_1", context_for(control_plane, transcriber)) is Outcome.FAILED
    failure = control_plane.failures["job_1"]
    assert failure["code"] == "audio_decode_failed"
    assert failure["message"].startswith("the audio could not be decoded: ")


def test_audio_past_the_jobs_limit_fails_before_transcription(control_plane):
    # The header says 10 s; the worker counts what it decodes and stops at the claim's limit.
    audio = lying_flac(seconds=3600, stated_seconds=10)
    control_plane.add_job("job_1", audio, duration_seconds=10.0, max_audio_seconds=60.0)
    never = BrokenTranscriber(AssertionError("audio past the limit reached the transcriber"))
    context = context_for(control_plane, never)

    assert process_job("job_1", context) is Outcome.FAILED
    assert control_plane.failures["job_1"] == {
        "code": "audio_too_long",
        "message": "the audio lasts more than 60 s; the limit is 60 s",
    }
    assert never.released == 1
    assert context.state.snapshot().jobs_failed == 1


def test_audio_that_cannot_be_fetched_is_reported(control_plane, transcriber):
    control_plane.add_job("job_1", b"", audio_url=f"{control_plane.url}/audio/gone?sig=s3cr3t")

    assert process_job("job_1", context_for(control_plane, transcriber)) is Outcome.FAILED
    assert control_plane.failures["job_1"] == {
        "code": "audio_download_failed",
        "message": f"GET {control_plane.url}/audio/gone answered 404",
    }


def test_an_unsupported_language_is_reported(control_plane, transcriber, fixtures_dir):
    control_plane.add_job("job_1", (fixtures_dir / "speech-short.wav").read_bytes(), language="de")

    assert process_job("job_1", context_for(control_plane, transcriber)) is Outcome.FAILED
    assert control_plane.failures["job_1"]["code"] == "unsupported_language"


def test_a_transcription_error_is_reported_and_memory_released(control_plane, fixtures_dir):
    control_plane.add_job("job_1", (fixtures_dir / "speech-short.wav").read_bytes())
    broken = BrokenTranscriber(RuntimeError("CUDA failed with error out of memory"))
    context = context_for(control_plane, broken)

    assert process_job("job_1", context) is Outcome.FAILED
    assert control_plane.failures["job_1"] == {
        "code": "transcription_failed",
        "message": "transcription failed: RuntimeError: CUDA failed with error out of memory",
    }
    assert broken.released == 1
    assert context.state.snapshot().jobs_failed == 1


def test_a_drain_deadline_hands_the_job_back_without_failing_it(control_plane, fixtures_dir):
    control_plane.add_job("job_1", (fixtures_dir / "speech-short.wav").read_bytes())
    context = context_for(control_plane, BrokenTranscriber(DrainDeadlineExceeded()))

    with pytest.raises(DrainDeadlineExceeded):
        process_job("job_1", context)

    assert control_plane.failures == {} and control_plane.results == {}
    snapshot = context.state.snapshot()
    assert (snapshot.jobs_failed, snapshot.jobs_requeued) == (0, 1)


def test_a_control_plane_outage_on_result_propagates_for_a_retry(
    control_plane, transcriber, fixtures_dir
):
    control_plane.add_job("job_1", (fixtures_dir / "silence-5s.wav").read_bytes())
    control_plane.scripted["/result"] = [503, 503]

    with pytest.raises(ControlPlaneUnavailable):
        process_job("job_1", context_for(control_plane, transcriber, attempts=2))


def test_a_diarize_job_on_a_worker_without_diarization_fails_with_a_reason(
    control_plane, transcriber, fixtures_dir
):
    # Routing keeps such jobs away; one that still lands here must not come back without
    # speakers as if it had been diarized.
    control_plane.add_job(
        "job_1", (fixtures_dir / "speech-short.wav").read_bytes(), diarize=True, max_speakers=2
    )

    outcome = process_job("job_1", context_for(control_plane, transcriber))

    assert outcome is Outcome.FAILED
    assert control_plane.results == {}
    assert control_plane.failures["job_1"] == {
        "code": "diarization_failed",
        "message": "this worker's profile does not diarize",
    }


def test_a_part_is_transcribed_over_its_span_with_the_files_times(
    control_plane, transcriber, fixtures_dir
):
    """A claimed part (gpu_worker/parts.py): only [offset, until) of the audio is heard, and
    every time in the result is the whole file's."""
    span = {"index": 1, "count": 3, "offset_seconds": 30.0, "until_seconds": 50.0}
    control_plane.add_job(
        "job_1.1", (fixtures_dir / "speech-90s.wav").read_bytes(), word_timestamps=True, part=span
    )
    context = context_for(control_plane, transcriber)

    assert process_job("job_1.1", context) is Outcome.SUCCEEDED

    transcript = control_plane.results["job_1.1"]["transcript"]
    assert transcript["duration"] == pytest.approx(20.0, abs=0.05)
    assert context.state.snapshot().audio_seconds == pytest.approx(20.0, abs=0.05)
    segments = transcript["segments"]
    assert segments and transcript["text"]
    words = [w for s in segments for w in s["words"]]
    assert all(30.0 <= t <= 50.0 for w in words for t in (w["start"], w["end"]))
    assert all(30.0 <= s["start"] <= s["end"] <= 50.0 for s in segments)
    assert segments[0]["start"] < 32.0 and segments[-1]["end"] > 45.0
