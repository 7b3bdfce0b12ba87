"""whisper-asr-webservice's API on Murmur's jobs: `POST /asr` and `POST /detect-language`.

Clients written for whisper-asr-webservice (Bazarr, subtitle tools, home automation) send the
audio as the multipart part `audio_file` and their options in the query string
(app/jobs/requests.py, `WasrAsrQuery`, `WasrQuery`), and read the file the answer carries.

Invariants:
- Each request is an ordinary job (listed, billed, cancellable, idempotent with an
  Idempotency-Key), submitted and waited on by the OpenAI endpoints' synchronous path
  (app/jobs/views.py, `submit_and_wait`, `succeeded_transcript`): the same slots, timeout and
  refusals, each naming the job.
- Authenticated like every API route (a bearer API token). A client that cannot send one is
  served through a front that adds it (docs/api.md, "whisper-asr-webservice clients").
- `encode=false` audio (raw 16-bit mono PCM at 16 kHz, what whisper-asr-webservice decodes
  to) is given a WAV header and then checked like any upload; nothing else is converted.
- `/detect-language` looks at the first `DETECT_SECONDS` of the audio, as whisper-asr-
  webservice does: only they are stored and transcribed.
"""

from __future__ import annotations

import json
import tempfile
import wave
from collections.abc import Iterator
from itertools import chain
from typing import IO, Any
from urllib.parse import quote

import av
from flask import Blueprint, Response, jsonify, request
from werkzeug.datastructures import FileStorage

from app.auth import require_api_token
from app.context import services
from app.errors import ApiError
from app.inputs import refuse_repeated
from app.jobs import requests
from app.jobs.formats import render, to_verbose_json
from app.jobs.requests import JobOptions
from app.jobs.slow_work import probe_slot
from app.jobs.views import submit_and_wait, succeeded_transcript, sync_slots
from app.languages import language_name
from gpu_worker.decoding import MAX_SAMPLE_RATE, OPEN_LIMITS, UndecodableAudio, decoded_frames
from gpu_worker.protocol.bounds import finite_or_none

wasr_bp = Blueprint("wasr", __name__)

# What whisper-asr-webservice's encode=false audio is, and what detection keeps.
PCM_RATE = 16000
DETECT_SECONDS = 30
# An upload held in memory up to this size, on disk beyond it.
_SPOOL_BYTES = 8 * 1024 * 1024
_CHUNK = 1024 * 1024


def _audio_file() -> FileStorage:
    """The `audio_file` part: a repeated or unknown part is refused first, then a missing one."""
    if request.mimetype != "multipart/form-data":
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data")
    text_parts = [name for name, _ in request.form.items(multi=True)]
    file_parts = [name for name, _ in request.files.items(multi=True)]
    refuse_repeated([*text_parts, *file_parts], "form field")
    form = requests.WasrForm
    requests.refuse_unknown(form, [n for n in [*text_parts, *file_parts] if n != form.upload_part])
    upload = request.files.get(form.upload_part)
    if upload is None:
        raise ApiError(
            400,
            "missing_file",
            f"send the audio as a multipart form field named '{form.upload_part}'",
        )
    return upload


def _query(model: type[requests.M]) -> requests.M:
    names = [name for name, _ in request.args.items(multi=True)]
    refuse_repeated(names, "query parameter")
    return requests.parse(model, request.args.to_dict(), requests.deployment(services().settings))


def _wav_writer(body: IO[bytes]) -> wave.Wave_write:
    out = wave.open(body, "wb")  # noqa: SIM115 - closed by the caller, the body stays open
    out.setnchannels(1)
    out.setsampwidth(2)
    out.setframerate(PCM_RATE)
    return out


def _as_upload(body: IO[bytes], filename: str | None) -> FileStorage:
    body.seek(0)
    return FileStorage(stream=body, filename=filename, content_type="audio/wav")


def _pcm_as_wav(upload: FileStorage) -> FileStorage:
    """Raw 16-bit mono PCM at 16 kHz (whisper-asr-webservice's encode=false) as a WAV file."""
    body = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 - returned
    out = _wav_writer(body)
    odd = b""
    while chunk := upload.stream.read(_CHUNK):
        chunk = odd + chunk
        whole = len(chunk) - len(chunk) % 2
        out.writeframesraw(chunk[:whole])
        odd = chunk[whole:]
    out.close()  # writes the header's lengths
    return _as_upload(body, upload.filename)


def _first_seconds(upload: FileStorage, seconds: int) -> FileStorage:
    """The upload's first `seconds` of audio as 16 kHz mono WAV (refused like any upload that
    is not audio; the rest is never decoded)."""
    body = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 - returned
    out = _wav_writer(body)
    wanted = seconds * PCM_RATE
    resampler = av.AudioResampler(format="s16", layout="mono", rate=PCM_RATE)
    try:
        with probe_slot(), av.open(upload.stream, options=OPEN_LIMITS) as container:
            streams = [s for s in container.streams if s.type == "audio"]
            if not streams:
                raise UndecodableAudio("the file has no audio stream")
            frames: Iterator[Any] = decoded_frames(container, streams[0])
            for frame in chain(frames, [None]):  # None: the resampler's buffered tail
                if frame is not None and not 0 < frame.sample_rate <= MAX_SAMPLE_RATE:
                    raise UndecodableAudio("a decoded frame has no usable sample rate")
                for pcm in resampler.resample(frame):
                    data = bytes(pcm.planes[0])[: 2 * pcm.samples]
                    out.writeframesraw(data[: 2 * wanted])
                    wanted -= min(wanted, pcm.samples)
                if wanted == 0:
                    break
    except (UndecodableAudio, av.FFmpegError, ValueError, OSError):
        # Left to the upload's own check, which names what is wrong with the file.
        upload.stream.seek(0)
        return upload
    out.close()
    return _as_upload(body, upload.filename)


def _wasr_json(transcript: dict[str, Any], words: bool) -> dict[str, Any]:
    """whisper-asr-webservice's json output: `text`, `segments` (faster-whisper's fields, and
    each segment's `words` when asked, else null) and `language` (a code)."""
    verbose = to_verbose_json(transcript, words=False)
    segments = []
    for stored, seg in zip(transcript.get("segments", []), verbose["segments"], strict=False):
        spoken = stored.get("words") if words else None
        seg["words"] = (
            None
            if spoken is None
            else [{k: w.get(k) for k in ("start", "end", "word", "probability")} for w in spoken]
        )
        segments.append(seg)
    body = {"text": verbose["text"], "segments": segments, "language": transcript.get("language")}
    return dict(finite_or_none(body))


def _asr_answer(
    job_id: str, transcript: dict[str, Any], query: requests.WasrAsrQuery, filename: str | None
) -> Response:
    if query.output == "json":
        body = json.dumps(_wasr_json(transcript, query.word_timestamps), allow_nan=False)
        media_type = "application/json"
    else:
        body, media_type = render(transcript, query.output)
    response = Response(body, content_type=media_type)
    # whisper-asr-webservice's name: the upload's, with the output's extension added.
    name = quote(filename or "audio", safe="")
    response.headers["Content-Disposition"] = f'attachment; filename="{name}.{query.output}"'
    response.headers["X-Murmur-Job-Id"] = job_id
    return response


@wasr_bp.post("/asr")
@require_api_token
def asr() -> Response:
    """Transcribe (or translate) the upload and answer the transcript as a file in `output`."""
    with sync_slots().hold():
        query = _query(requests.WasrAsrQuery)
        upload = _audio_file()
        audio = upload if query.encode else _pcm_as_wav(upload)
        waited, timeout = submit_and_wait(services(), audio, query.options())
        transcript = succeeded_transcript(waited, timeout)
        return _asr_answer(waited.job.id, transcript, query, upload.filename)


@wasr_bp.post("/detect-language")
@require_api_token
def detect_language() -> Response:
    """The language spoken in the upload's first 30 s, as whisper-asr-webservice names it."""
    with sync_slots().hold():
        query = _query(requests.WasrQuery)
        upload = _audio_file()
        audio = upload if query.encode else _pcm_as_wav(upload)
        options = JobOptions(language=None, prompt=None, word_timestamps=False, webhook_url=None)
        waited, timeout = submit_and_wait(
            services(), _first_seconds(audio, DETECT_SECONDS), options
        )
        transcript = succeeded_transcript(waited, timeout)
        code = transcript.get("language") or ""
        response = jsonify(
            {
                "detected_language": language_name(code),
                "language_code": code,
                # The detection's probability; null where the model did not detect (an
                # English-only model answers "en" without detecting).
                "confidence": finite_or_none(transcript.get("language_probability")),
            }
        )
        response.headers["X-Murmur-Job-Id"] = waited.job.id
        return response
