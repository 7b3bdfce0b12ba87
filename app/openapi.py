"""The OpenAPI 3.0.3 description of Murmur's public API (served at /openapi.json).

Invariant: every request body and query parameter of the jobs API is generated from the
pydantic model that validates it (app/jobs/requests.py, named in `QUERY_MODELS` and
`BODY_MODELS`), so the document cannot describe inputs the API does not take, nor miss one
it does; tests/test_openapi_models.py holds the two together. The responses are written here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from app.jobs.requests import (
    UPLOAD_PART,
    CancelQuery,
    JobListQuery,
    OpenAITranscriptionForm,
    OpenAITranslationForm,
    TranscriptQuery,
    UploadForm,
    UrlJob,
    WasrAsrQuery,
    WasrForm,
    WasrQuery,
)
from app.models import JobStatus

_ERROR = {"$ref": "#/components/responses/Error"}
_MULTIPART = "multipart/form-data"
# The models of each operation's query parameters, and of its request body by media type.
QUERY_MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("/v1/jobs", "get"): JobListQuery,
    ("/v1/jobs/{job_id}", "delete"): CancelQuery,
    ("/v1/jobs/{job_id}/transcript", "get"): TranscriptQuery,
    ("/asr", "post"): WasrAsrQuery,
    ("/detect-language", "post"): WasrQuery,
}
BODY_MODELS: dict[tuple[str, str, str], type[BaseModel]] = {
    ("/v1/jobs", "post", _MULTIPART): UploadForm,
    ("/v1/jobs", "post", "application/json"): UrlJob,
    ("/v1/audio/transcriptions", "post", _MULTIPART): OpenAITranscriptionForm,
    ("/v1/audio/translations", "post", _MULTIPART): OpenAITranslationForm,
    ("/asr", "post", _MULTIPART): WasrForm,
    ("/detect-language", "post", _MULTIPART): WasrForm,
}


def openapi_schema(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """A pydantic (JSON Schema 2020-12) schema as an OpenAPI 3.0.3 schema object.

    References are inlined from `defs`, an optional value is documented as its non-null
    type (a null is never a meaningful form or query value), `examples` becomes `example`,
    `const` an `enum`, and pydantic's generated titles and null defaults are dropped.
    """
    out = dict(schema)
    ref = out.pop("$ref", None)
    if ref is not None:
        return openapi_schema({**defs[ref.rsplit("/", 1)[-1]], **out}, defs)
    variants = out.pop("anyOf", None)
    if variants is not None:
        kept = [variant for variant in variants if variant != {"type": "null"}]
        if len(kept) != 1:
            raise ValueError(f"no OpenAPI 3.0 form for the union {variants}")
        return openapi_schema({**kept[0], **out}, defs)
    out.pop("title", None)
    if "default" in out and out["default"] is None:
        del out["default"]
    if "examples" in out:
        out["example"] = out.pop("examples")[0]
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "items" in out:
        out["items"] = openapi_schema(out["items"], defs)
    return out


def _fields(model: type[BaseModel]) -> tuple[dict[str, Any], list[str], bool]:
    """(OpenAPI schema of each field by its public name, required names, extras forbidden)."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    properties = {name: openapi_schema(field, defs) for name, field in schema["properties"].items()}
    closed = schema.get("additionalProperties") is False
    return properties, list(schema.get("required", [])), closed


def body_schema(model: type[BaseModel], media_type: str) -> dict[str, Any]:
    """The request body schema of `model`; a multipart form also carries the audio part."""
    properties, required, closed = _fields(model)
    if media_type == _MULTIPART:
        part = getattr(model, "upload_part", UPLOAD_PART)
        properties = {part: {"type": "string", "format": "binary"}, **properties}
        required = [part, *required]
    schema: dict[str, Any] = {"type": "object"}
    if required:
        schema["required"] = required
    if closed:
        schema["additionalProperties"] = False
    schema["properties"] = properties
    return schema


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """One OpenAPI query parameter per field of `model`, its description beside its schema."""
    properties, required, _ = _fields(model)
    parameters = []
    for name, schema in properties.items():
        parameter: dict[str, Any] = {"name": name, "in": "query"}
        if name in required:
            parameter["required"] = True
        description = schema.pop("description", None)
        if description is not None:
            parameter["description"] = description
        parameter["schema"] = schema
        parameters.append(parameter)
    return parameters


def _query(path: str, method: str) -> list[dict[str, Any]]:
    return query_parameters(QUERY_MODELS[(path, method)])


def _body(path: str, method: str) -> dict[str, Any]:
    content = {
        media_type: {"schema": body_schema(model, media_type)}
        for (at, verb, media_type), model in BODY_MODELS.items()
        if (at, verb) == (path, method)
    }
    return {"required": True, "content": content}


def _op(summary: str, responses: dict[str, Any], **extra: Any) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    op.update(extra)
    return op


def _job_id() -> dict[str, Any]:
    return {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _sync_audio_op(
    summary: str, answer: str, path: str, idempotency_key: dict[str, Any]
) -> dict[str, Any]:
    """An OpenAI-compatible synchronous audio operation (transcriptions, translations): the
    answer in `response_format`, and every refusal the synchronous path can give."""
    refusals = ("400", "401", "408", "409", "413", "415", "422", "429", "502", "503", "504")
    content: dict[str, Any] = {
        "application/json": {},
        "text/plain": {},
        "application/x-subrip": {},
        "text/vtt": {},
    }
    if path == "/v1/audio/transcriptions":
        answer += (
            "; with stream=true, text/event-stream: OpenAI's transcript.text.delta events as "
            "segments are transcribed (transcript.text.segment events too for diarized_json), "
            'then transcript.text.done; an error after the start is a data line {"error": ...}'
        )
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return _op(
        summary,
        {
            "200": {"description": answer, "content": content},
            **dict.fromkeys(refusals, _ERROR),
        },
        parameters=[idempotency_key],
        requestBody=_body(path, "post"),
    )


def _wasr_paths(idempotency_key: dict[str, Any]) -> dict[str, Any]:
    """whisper-asr-webservice's endpoints (app/wasr/views.py): synchronous jobs like the OpenAI
    ones, answering in that service's shapes."""
    # 414: their options travel in the query string, and a request line has a limit.
    refusals = ("400", "401", "408", "409", "413", "414", "415", "422", "502", "503", "504")
    asr_answer = (
        "The transcript as a file in `output` (Content-Disposition: attachment, the upload's "
        "name with the output's extension); `json` holds `text`, `segments` and `language`"
    )
    detected = {
        "type": "object",
        "required": ["detected_language", "language_code", "confidence"],
        "properties": {
            "detected_language": {"type": "string", "example": "german"},
            "language_code": {"type": "string", "example": "de"},
            "confidence": {
                "type": "number",
                "nullable": True,
                "description": "The detection's probability; null where the model did not "
                "detect (an English-only model answers en)",
            },
        },
    }
    return {
        "/asr": {
            "post": _op(
                "whisper-asr-webservice: transcribe or translate the upload, answer a file",
                {
                    "200": {
                        "description": asr_answer,
                        "content": {
                            "text/plain": {},
                            "application/json": {},
                            "application/x-subrip": {},
                            "text/vtt": {},
                            "text/tab-separated-values": {},
                        },
                    },
                    **dict.fromkeys(refusals, _ERROR),
                },
                parameters=[*_query("/asr", "post"), idempotency_key],
                requestBody=_body("/asr", "post"),
            )
        },
        "/detect-language": {
            "post": _op(
                "whisper-asr-webservice: the language spoken in the upload's first 30 s",
                {
                    "200": {
                        "description": "The detected language",
                        "content": {"application/json": {"schema": detected}},
                    },
                    **dict.fromkeys(refusals, _ERROR),
                },
                parameters=[*_query("/detect-language", "post"), idempotency_key],
                requestBody=_body("/detect-language", "post"),
            )
        },
    }


def _docs_path() -> dict[str, Any]:
    return {
        "/docs": {
            "get": _op(
                "This document as an interactive page (Swagger UI, served from this API)",
                {"200": {"description": "The page", "content": {"text/html": {}}}},
                security=[],
            )
        }
    }


def openapi_document() -> dict[str, Any]:
    job_ref = {"$ref": "#/components/schemas/Job"}
    model_ref = {"$ref": "#/components/schemas/Model"}
    json_job = {"application/json": {"schema": job_ref}}
    idempotency_key = {
        "name": "Idempotency-Key",
        "in": "header",
        "description": "Replays the job it created; a different request with it is a 422",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    }
    readiness = {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["status", "checks"],
                "properties": {
                    "status": {"type": "string", "enum": ["ok", "unavailable"]},
                    "checks": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            }
        }
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Murmur",
            "version": "0.1.0",
            "description": "Self-hosted speech-to-text with an ephemeral GPU worker fleet.",
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {
                "post": _op(
                    "Submit audio (multipart upload or JSON URL) for transcription",
                    {
                        "202": {
                            "description": "Accepted (or replayed for a reused Idempotency-Key)",
                            "content": json_job,
                            "headers": {
                                "Location": {"required": True, "schema": {"type": "string"}},
                                "Idempotent-Replayed": {
                                    "schema": {"type": "string", "enum": ["true"]}
                                },
                            },
                        },
                        "400": _ERROR,
                        "401": _ERROR,
                        "408": _ERROR,
                        "413": _ERROR,
                        "415": _ERROR,
                        "422": {
                            **_ERROR,
                            "description": "idempotency_key_reused: the key was used with a "
                            "different request",
                        },
                        "503": _ERROR,
                    },
                    parameters=[idempotency_key],
                    requestBody=_body("/v1/jobs", "post"),
                ),
                "get": _op(
                    "List your jobs, newest first",
                    {
                        "200": {
                            "description": "A page of jobs",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["object", "data", "next_cursor"],
                                        "properties": {
                                            "object": {"type": "string", "enum": ["list"]},
                                            "data": {"type": "array", "items": job_ref},
                                            "next_cursor": {"type": "string", "nullable": True},
                                        },
                                    }
                                }
                            },
                        },
                        "400": _ERROR,
                        "401": _ERROR,
                    },
                    parameters=_query("/v1/jobs", "get"),
                ),
            },
            "/v1/jobs/{job_id}": {
                "parameters": [_job_id()],
                "get": _op(
                    "Get a job",
                    {
                        "200": {"description": "The job", "content": json_job},
                        "400": _ERROR,
                        "401": _ERROR,
                        "404": _ERROR,
                    },
                ),
                "delete": _op(
                    "Cancel a job that has not finished; with purge=true, remove an ended job",
                    {
                        "200": {"description": "Cancelled", "content": json_job},
                        "204": {"description": "Purged: audio, transcript and job removed"},
                        "400": _ERROR,
                        "401": _ERROR,
                        "404": _ERROR,
                        "409": _ERROR,
                    },
                    parameters=_query("/v1/jobs/{job_id}", "delete"),
                ),
            },
            "/v1/jobs/{job_id}/events": {
                "parameters": [
                    _job_id(),
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "description": "Resume after this event (the id of an event this "
                        "stream sent): what came after it, never an event twice",
                        "schema": {"type": "string"},
                    },
                ],
                "get": _op(
                    "Watch a job: Server-Sent Events (status, attempt, progress, segment, done)",
                    {
                        "200": {
                            "description": "text/event-stream: `event: status` {status}; "
                            "`event: attempt` {attempt, superseded} when a redelivered job "
                            "starts again (drop the segments of earlier attempts); `event: "
                            "progress` {progress, done_seconds, total_seconds, eta_seconds}; "
                            "`event: segment` {id, start, end, text, speaker?, words? (when "
                            "the job asked for word timestamps)}; `event: done` (the job's "
                            "JSON), then the stream ends. Every event has an `id:`; comment "
                            "heartbeats keep it open; an error after the start is `event: "
                            "error`",
                            "content": {"text/event-stream": {"schema": {"type": "string"}}},
                        },
                        "204": {"description": "Last-Event-ID was the `done` event's"},
                        "400": _ERROR,
                        "401": _ERROR,
                        "404": _ERROR,
                        "429": {
                            **_ERROR,
                            "description": "too_many_streams: this token has "
                            "api.streams_per_token streams open",
                        },
                        "503": _ERROR,
                    },
                ),
            },
            "/v1/jobs/{job_id}/transcript": {
                "parameters": [_job_id(), *_query("/v1/jobs/{job_id}/transcript", "get")],
                "get": _op(
                    "Download the transcript",
                    {
                        "200": {
                            "description": "The transcript",
                            "content": {
                                "application/json": {},
                                "text/plain": {},
                                "application/x-subrip": {},
                                "text/vtt": {},
                                "text/tab-separated-values": {},
                            },
                        },
                        "400": _ERROR,
                        "401": _ERROR,
                        "404": _ERROR,
                        "409": _ERROR,
                    },
                ),
            },
            "/v1/audio/transcriptions": {
                "post": _sync_audio_op(
                    "OpenAI-compatible synchronous transcription",
                    "The transcript in response_format",
                    "/v1/audio/transcriptions",
                    idempotency_key,
                ),
            },
            "/v1/audio/translations": {
                "post": _sync_audio_op(
                    "OpenAI-compatible synchronous translation to English",
                    "The English text in response_format",
                    "/v1/audio/translations",
                    idempotency_key,
                ),
            },
            "/v1/models": {
                "get": _op(
                    "OpenAI-compatible list of the models enabled profiles serve, and aliases",
                    {
                        "200": {
                            "description": "The models",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["object", "data"],
                                        "properties": {
                                            "object": {"type": "string", "enum": ["list"]},
                                            "data": {"type": "array", "items": model_ref},
                                        },
                                    }
                                }
                            },
                        },
                        "401": _ERROR,
                    },
                )
            },
            "/v1/models/{model_id}": {
                "get": _op(
                    "One model in OpenAI's shape",
                    {
                        "200": {
                            "description": "The model",
                            "content": {"application/json": {"schema": model_ref}},
                        },
                        "400": _ERROR,
                        "401": _ERROR,
                        "404": _ERROR,
                    },
                    parameters=[
                        {
                            "name": "model_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                )
            },
            **_wasr_paths(idempotency_key),
            **_docs_path(),
            "/healthz": {
                "get": _op(
                    "Liveness",
                    {
                        "200": {
                            "description": "Alive",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                    security=[],
                )
            },
            "/readyz": {
                "get": _op(
                    "Readiness: database, broker, free space in the audio store and a recently "
                    "completed fleet reconcile",
                    {
                        "200": {"description": "Ready", "content": readiness},
                        "503": {
                            "description": "A dependency failed or the control plane stalled",
                            "content": readiness,
                        },
                    },
                    security=[],
                )
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {
                "Error": {
                    "description": "Error",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                }
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                # On /v1/audio/* and /v1/models*: OpenAI's ErrorResponse.
                                "type": {
                                    "type": "string",
                                    "description": "OpenAI-compatible paths only, e.g. "
                                    "invalid_request_error, authentication_error, server_error",
                                },
                                "param": {
                                    "type": "string",
                                    "nullable": True,
                                    "description": "OpenAI-compatible paths only: the request "
                                    "field the error is about, or null",
                                },
                            },
                        }
                    },
                },
                "Model": {
                    "type": "object",
                    "required": ["id", "object", "created", "owned_by"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"type": "string", "enum": ["model"]},
                        "created": {"type": "integer"},
                        "owned_by": {"type": "string"},
                        "multilingual": {"type": "boolean"},
                        "translate": {"type": "boolean"},
                        "diarize": {"type": "boolean"},
                        "alias_of": {"type": "string"},
                    },
                },
                "Job": {
                    "type": "object",
                    "required": [
                        "id",
                        "object",
                        "status",
                        "profile",
                        "source",
                        "filename",
                        "size_bytes",
                        "duration_seconds",
                        "language",
                        "word_timestamps",
                        "webhook_url",
                        "webhook_status",
                        "attempts",
                        "created_at",
                        "dispatched_at",
                        "started_at",
                        "finished_at",
                        "processing_seconds",
                        "error",
                        "links",
                    ],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"type": "string", "enum": ["transcription.job"]},
                        "status": {"type": "string", "enum": [s.value for s in JobStatus]},
                        "profile": {"type": "string", "nullable": True},
                        "source": {"type": "string", "enum": ["upload", "url"]},
                        "filename": {
                            "type": "string",
                            "nullable": True,
                            "maxLength": 255,
                            "description": "The client's file name as display text only",
                        },
                        "size_bytes": {"type": "integer", "nullable": True},
                        "duration_seconds": {"type": "number", "nullable": True},
                        "language": {
                            "type": "string",
                            "nullable": True,
                            "description": "ISO 639-1: asked for, else detected once done",
                        },
                        "language_probability": {
                            "type": "number",
                            "nullable": True,
                            "description": "The detection's probability, when detected",
                        },
                        "task": {"type": "string", "enum": ["transcribe", "translate"]},
                        "model": {"type": "string", "nullable": True},
                        "diarize": {"type": "boolean"},
                        "min_speakers": {"type": "integer", "nullable": True},
                        "max_speakers": {"type": "integer", "nullable": True},
                        "word_timestamps": {"type": "boolean"},
                        "temperature": {
                            "type": "number",
                            "nullable": True,
                            "description": "The one decoding temperature asked for; null: the "
                            "worker's fallback from 0 upward",
                        },
                        "vad_filter": {
                            "type": "boolean",
                            "description": "Whether voice activity detection skipped silence",
                        },
                        "webhook_url": {"type": "string", "nullable": True},
                        "webhook_status": {"type": "string", "nullable": True},
                        "attempts": {"type": "integer", "minimum": 0},
                        "created_at": {"type": "string", "format": "date-time"},
                        "dispatched_at": {
                            "type": "string",
                            "format": "date-time",
                            "nullable": True,
                        },
                        "started_at": {"type": "string", "format": "date-time", "nullable": True},
                        "finished_at": {"type": "string", "format": "date-time", "nullable": True},
                        "processing_seconds": {"type": "number", "nullable": True},
                        "progress": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 1,
                            "nullable": True,
                            "description": (
                                "Only on GET /v1/jobs/{job_id}: the fraction of the audio "
                                "transcribed, never decreasing within an attempt, 1.0 exactly "
                                "when succeeded, 0 while queued, null once failed or cancelled."
                            ),
                        },
                        "eta_seconds": {
                            "type": "number",
                            "minimum": 0,
                            "nullable": True,
                            "description": (
                                "Only on GET /v1/jobs/{job_id}: seconds left while running, "
                                "from the profile's measured speed (else the job's own pace); "
                                "null when it cannot be estimated."
                            ),
                        },
                        "parts": {
                            "type": "object",
                            "required": ["count", "done", "running"],
                            "properties": {
                                "count": {"type": "integer", "minimum": 2},
                                "done": {"type": "integer", "minimum": 0},
                                "running": {"type": "integer", "minimum": 0},
                            },
                            "description": (
                                "Only on GET /v1/jobs/{job_id}, for a long upload cut at pauses "
                                "into parts (the setting jobs.part_seconds) that run on several "
                                "workers at once: how many parts, finished and running now."
                            ),
                        },
                        "error": {
                            "type": "object",
                            "nullable": True,
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                # On /v1/audio/* and /v1/models*: OpenAI's ErrorResponse.
                                "type": {
                                    "type": "string",
                                    "description": "OpenAI-compatible paths only, e.g. "
                                    "invalid_request_error, authentication_error, server_error",
                                },
                                "param": {
                                    "type": "string",
                                    "nullable": True,
                                    "description": "OpenAI-compatible paths only: the request "
                                    "field the error is about, or null",
                                },
                            },
                        },
                        "links": {
                            "type": "object",
                            "required": ["self", "transcript"],
                            "properties": {
                                "self": {"type": "string"},
                                "transcript": {"type": "string"},
                            },
                        },
                        "text": {
                            "type": "string",
                            "description": "The transcript's text, once the job succeeded "
                            "(absent from listings: GET /v1/jobs)",
                        },
                    },
                },
            },
        },
    }
