"""The OpenAPI 3 description of Murmur's public API (served at /openapi.json)."""

from __future__ import annotations

from typing import Any

from app.jobs.formats import FORMATS
from app.models import JobStatus

_ERROR = {"$ref": "#/components/responses/Error"}


def _op(summary: str, responses: dict[str, Any], **extra: Any) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    op.update(extra)
    return op


def _job_id() -> dict[str, Any]:
    return {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}


def openapi_document() -> dict[str, Any]:
    job_ref = {"$ref": "#/components/schemas/Job"}
    json_job = {"application/json": {"schema": job_ref}}
    idempotency_key = {
        "name": "Idempotency-Key",
        "in": "header",
        "description": "Replays the job it created; a different request with it is a 422",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    }
    upload_props = {
        "file": {"type": "string", "format": "binary"},
        "language": {"type": "string", "example": "en"},
        "prompt": {"type": "string"},
        "word_timestamps": {"type": "boolean"},
        "webhook_url": {"type": "string", "format": "uri"},
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
                    requestBody={
                        "required": True,
                        "content": {
                            "multipart/form-data": {
                                "schema": {
                                    "type": "object",
                                    "required": ["file"],
                                    "properties": upload_props,
                                }
                            },
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["url"],
                                    "additionalProperties": False,
                                    "properties": {
                                        **{k: v for k, v in upload_props.items() if k != "file"},
                                        "url": {"type": "string", "format": "uri"},
                                    },
                                }
                            },
                        },
                    },
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
                    parameters=[
                        {
                            "name": "status",
                            "in": "query",
                            "schema": {"type": "string", "enum": [s.value for s in JobStatus]},
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": 100,
                                "default": 20,
                            },
                        },
                        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    ],
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
                    parameters=[
                        {
                            "name": "purge",
                            "in": "query",
                            "schema": {"type": "boolean", "default": False},
                            "description": "Remove an ended job for good (afterwards: 404)",
                        }
                    ],
                ),
            },
            "/v1/jobs/{job_id}/transcript": {
                "parameters": [
                    _job_id(),
                    {
                        "name": "format",
                        "in": "query",
                        "schema": {"type": "string", "enum": list(FORMATS), "default": "json"},
                    },
                ],
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
                "post": _op(
                    "OpenAI-compatible synchronous transcription",
                    {
                        "200": {
                            "description": "The transcript in response_format",
                            "content": {
                                "application/json": {},
                                "text/plain": {},
                                "application/x-subrip": {},
                                "text/vtt": {},
                            },
                        },
                        "400": _ERROR,
                        "401": _ERROR,
                        "408": _ERROR,
                        "409": _ERROR,
                        "413": _ERROR,
                        "415": _ERROR,
                        "422": _ERROR,
                        "502": _ERROR,
                        "503": _ERROR,
                        "504": _ERROR,
                    },
                    parameters=[idempotency_key],
                    requestBody={
                        "required": True,
                        "content": {
                            "multipart/form-data": {
                                "schema": {
                                    "type": "object",
                                    "required": ["file"],
                                    "properties": {
                                        "file": {"type": "string", "format": "binary"},
                                        "model": {"type": "string"},
                                        "language": {"type": "string"},
                                        "prompt": {"type": "string"},
                                        "response_format": {
                                            "type": "string",
                                            "enum": ["json", "text", "srt", "vtt", "verbose_json"],
                                        },
                                        "timestamp_granularities[]": {
                                            "type": "array",
                                            "items": {
                                                "type": "string",
                                                "enum": ["word", "segment"],
                                            },
                                        },
                                    },
                                }
                            }
                        },
                    },
                ),
            },
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
                    "Readiness: database, broker and a recently completed fleet reconcile",
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
                            },
                        }
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
                        "language": {"type": "string", "nullable": True},
                        "word_timestamps": {"type": "boolean"},
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
                        "error": {
                            "type": "object",
                            "nullable": True,
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
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
                            "description": "The transcript's text, once the job succeeded",
                        },
                    },
                },
            },
        },
    }
