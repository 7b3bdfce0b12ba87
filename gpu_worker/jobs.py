"""One transcription job, start to finish: claim, download, decode, transcribe, report.

A claimed part of a long job (gpu_worker/parts.py) goes the same way over its span of the
audio only, its times shifted to the whole file's; a diarized job's speakers part is diarized,
not transcribed, and its result is the speakers' turns (gpu_worker/protocol/claim.py).

A job the control plane lets go of while it runs (cancelled, re-routed) is stopped between
segments (gpu_worker/holding.py) and reported as `cancelled`, which frees the worker and is
never stored as the job's outcome.

Safe to run twice for the same id (acks_late redelivery, a retried task): the claim is the
state check, a job that is no longer claimable is acknowledged and left alone, and the
control plane stores a result only once.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from gpu_worker import parts, progress
from gpu_worker.audio import AudioTooLong, decode_bounded
from gpu_worker.client import AudioDownloadError, AudioTooLarge, ControlPlaneError
from gpu_worker.holding import CHECK_INTERVAL_SECONDS, CancelWatch, JobCancelled
from gpu_worker.protocol.claim import DEFAULT_MAX_AUDIO_SECONDS, SPEAKERS_PART, ClaimedJob
from gpu_worker.protocol.failure import CANCELLED, FailureCode
from gpu_worker.protocol.transcript import Transcript
from gpu_worker.speakers import SpeakerTurn, assign_speakers
from gpu_worker.state import JobEnd, WorkerState
from gpu_worker.transcriber import SAMPLE_RATE, Checkpoint, Transcriber, UnsupportedLanguage

if TYPE_CHECKING:
    from gpu_worker.diarization import Diarizer

log = logging.getLogger(__name__)


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a failure was reported to the control plane
    NOT_CLAIMABLE = "not_claimable"  # 409 on claim: someone else's, or already finished
    CANCELLED = "cancelled"  # the control plane let go of the job mid-run: stopped early


class DrainDeadlineExceeded(BaseException):
    """Raised into a running job when a SIGTERM drain runs out of time.

    A BaseException so the job's own `except Exception` handlers cannot turn it into a
    reported failure: the job is not at fault and goes back to the queue instead.
    """


class JobFailure(Exception):
    """A job-level error with the code the control plane records."""

    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ControlPlane(Protocol):
    """The calls a job makes; ControlPlaneClient in production, a fake in tests."""

    def claim(self, job_id: str) -> ClaimedJob | None: ...

    def download_audio(self, audio_url: str) -> IO[bytes]: ...

    def post_result(
        self, job_id: str, transcript: Transcript, processing_seconds: float
    ) -> bool: ...

    def post_failure(self, job_id: str, code: str, message: str) -> bool: ...

    def release(self, job_id: str) -> bool: ...

    def job_held(self, job_id: str) -> bool: ...


@dataclass(frozen=True)
class JobContext:
    """What every job in this process shares: built once at start-up."""

    client: ControlPlane
    transcriber: Transcriber
    state: WorkerState
    # How often a running job asks whether it is still wanted (gpu_worker/holding.py).
    cancel_check_seconds: float = CHECK_INTERVAL_SECONDS
    # The diarization stage, when this worker's runtime names weights for it.
    diarizer: Diarizer | None = None


def process_job(job_id: str, context: JobContext) -> Outcome:
    """Run job `job_id`; control-plane errors propagate (the task decides to retry)."""
    claim = context.client.claim(job_id)
    if claim is None:
        log.info("job %s is not claimable: acknowledged, nothing to do", job_id)
        return Outcome.NOT_CLAIMABLE

    state = context.state
    state.job_started(job_id)
    started = time.monotonic()
    audio_seconds = 0.0
    end: JobEnd = "failed"
    watch = CancelWatch(context.client, job_id, interval_seconds=context.cancel_check_seconds)
    reporter: Callable[[], None] = watch
    try:
        try:
            samples = _fetch_audio(context.client, claim)
            if claim.part is not None:  # a part of a long job: its span only
                samples = parts.span_samples(samples, claim.part)
            audio_seconds = samples.shape[0] / SAMPLE_RATE
            watch()  # a long download or decode may have outlived the job
            if claim.part is not None and claim.part.kind == SPEAKERS_PART:
                transcript = _speakers(context.diarizer, samples, claim, watch)
                audio_seconds = 0.0  # the file's audio is counted once, by its other parts
            else:
                reporter = progress.with_progress(
                    watch, context.client, job_id, audio_seconds, words=bool(claim.word_timestamps)
                )
                transcript = _transcribe(context.transcriber, samples, claim, reporter)
                if claim.part is not None:  # times of the whole file
                    transcript = parts.shifted(transcript, claim.part.offset_seconds)
                progress.flush(reporter)
                if claim.diarize:
                    transcript = _diarize(context.diarizer, samples, transcript, claim, watch)
        except JobCancelled as stop:
            log.info("job %s: %s; stopped without a result", job_id, stop)
            # The control plane stores nothing for a job it let go of; the call tells it this
            # worker is free (docs/worker-protocol.md).
            context.client.post_failure(job_id, CANCELLED, "stopped: the job was cancelled")
            return Outcome.CANCELLED  # usage reports count it with the failed: not a success
        except JobFailure as failure:
            log.warning("job %s failed: %s: %s", job_id, failure.code, failure.message)
            context.client.post_failure(job_id, failure.code, failure.message)
            return Outcome.FAILED
        except ControlPlaneError:
            raise
        except Exception as exc:
            # A bug of ours, not the job's: still tell the control plane, so the job does not
            # sit in "running" until a reaper notices.
            log.exception("job %s: unexpected error", job_id)
            context.client.post_failure(job_id, "worker_error", f"{type(exc).__name__}: {exc}")
            return Outcome.FAILED
        processing = time.monotonic() - started
        stored = context.client.post_result(job_id, transcript, processing)
        log.info(
            "job %s: %.1f s of audio in %.2f s%s",
            job_id,
            audio_seconds,
            processing,
            "" if stored else " (result was already stored)",
        )
        end = "succeeded"
        return Outcome.SUCCEEDED
    except DrainDeadlineExceeded:
        end = "requeued"
        try:
            context.client.release(job_id)
        except ControlPlaneError as exc:  # the claim rules still let a later worker take it
            log.warning("job %s: could not hand back: %s", job_id, exc)
        raise
    finally:
        progress.close(reporter)
        state.job_finished(
            end,
            processing_seconds=time.monotonic() - started,
            audio_seconds=audio_seconds,
        )
        context.transcriber.release_memory()
        if context.diarizer is not None:
            context.diarizer.release_memory()


def _fetch_audio(client: ControlPlane, claim: ClaimedJob) -> npt.NDArray[np.float32]:
    try:
        audio_file = client.download_audio(claim.audio_url)
    except AudioTooLarge as exc:
        raise JobFailure("audio_too_large", str(exc)) from None
    except AudioDownloadError as exc:
        raise JobFailure("audio_download_failed", str(exc)) from None
    limit = claim.max_audio_seconds or DEFAULT_MAX_AUDIO_SECONDS
    with audio_file:
        try:
            # A part needs the file up to its span's end only (gpu_worker/parts.py).
            stop = claim.part.until_seconds + 1.0 if claim.part is not None else None
            return decode_bounded(
                audio_file, limit, expected_seconds=claim.duration_seconds, stop_after_seconds=stop
            )
        except AudioTooLong as exc:
            raise JobFailure("audio_too_long", str(exc)) from None
        except Exception as exc:
            # PyAV raises its own error types (InvalidDataError, ...) for bad input.
            raise JobFailure(
                "audio_decode_failed", f"the audio could not be decoded: {exc}"
            ) from None


def _decoding(claim: ClaimedJob) -> dict[str, Any]:
    """The decoding options the job sets (a job that sets none calls the transcriber as
    before, so a transcriber without them still serves it)."""
    options: dict[str, Any] = {}
    if claim.temperature is not None:
        options["temperature"] = claim.temperature
    if not claim.vad_filter:
        options["vad_filter"] = False
    return options


def _transcribe(
    transcriber: Transcriber,
    samples: npt.NDArray[np.float32],
    claim: ClaimedJob,
    checkpoint: Checkpoint,
) -> Transcript:
    try:
        return transcriber.transcribe(
            samples,
            language=claim.language,
            prompt=claim.prompt,
            # Always: subtitle cues are built from word times whether or not the client asked
            # for words (the API returns them only to a client that did), and the sequential
            # path's hallucination_silence_threshold reads them.
            word_timestamps=True,
            checkpoint=checkpoint,
            task=claim.task,
            **_decoding(claim),
        )
    except JobCancelled:
        raise
    except UnsupportedLanguage as exc:
        raise JobFailure("unsupported_language", str(exc)) from None
    except Exception as exc:
        log.exception("transcription of job %s failed", claim.id)
        raise JobFailure(
            "transcription_failed", f"transcription failed: {type(exc).__name__}: {exc}"
        ) from None


def _diarize(
    diarizer: Diarizer | None,
    samples: npt.NDArray[np.float32],
    transcript: Transcript,
    claim: ClaimedJob,
    checkpoint: Checkpoint,
) -> Transcript:
    """The diarization stage after transcription: speakers on words, segments split at changes."""
    return assign_speakers(transcript, _turns(diarizer, samples, claim, checkpoint), words=True)


def _speakers(
    diarizer: Diarizer | None,
    samples: npt.NDArray[np.float32],
    claim: ClaimedJob,
    checkpoint: Checkpoint,
) -> Transcript:
    """A diarized job's speakers part: who speaks when over its span (the whole file), no
    text; the control plane assigns the joined words to these turns (app/jobs/stitch.py)."""
    offset = claim.part.offset_seconds if claim.part is not None else 0.0
    return Transcript(
        text="",
        duration=samples.shape[0] / SAMPLE_RATE,
        segments=[],
        turns=parts.labelled_turns(_turns(diarizer, samples, claim, checkpoint), offset),
    )


def _turns(
    diarizer: Diarizer | None,
    samples: npt.NDArray[np.float32],
    claim: ClaimedJob,
    checkpoint: Checkpoint,
) -> list[SpeakerTurn]:
    """The diarization stage: the speakers' turns in the samples, in time order."""
    if diarizer is None:
        # Routing sends diarize jobs only to profiles that diarize; a job that still lands
        # here fails with a reason instead of coming back without speakers.
        raise JobFailure("diarization_failed", "this worker's profile does not diarize")
    checkpoint()
    try:
        turns = diarizer.diarize(
            samples,
            min_speakers=claim.min_speakers,
            max_speakers=claim.max_speakers,
            checkpoint=checkpoint,
        )
    except JobCancelled:
        raise
    except Exception as exc:
        log.exception("diarization of job %s failed", claim.id)
        raise JobFailure(
            "diarization_failed", f"diarization failed: {type(exc).__name__}: {exc}"
        ) from None
    return turns
