"""What the public jobs API accepts: each request's fields as one pydantic model.

Invariants:
- These models are the single statement of the public requests' inputs. The views read form
  fields, JSON bodies and query parameters only through `parse`, and app/openapi.py documents
  request bodies and query parameters from the models' JSON Schemas, so the document cannot
  promise a field, type, enum, limit or default that the validation does not hold.
- Every refusal is a `Refused` with a stable code (its HTTP status is in app/errors.py); a
  pydantic message never reaches a client. A field's pydantic error becomes the refusal its
  `OnError` names, or `invalid_parameter` naming the field.
- One refusal per request, the first in this order: unknown fields (a model that forbids
  them), then each field in declaration order (a missing required field where it stands).
  A check that reads the deployment (languages, webhooks, resolving a URL) or refuses on its
  own runs only once every earlier field passed, so a bad request never resolves a host that
  the same request with a good earlier field would not.
- Nothing here reads an HTTP request: the views hand over plain mappings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Literal,
    TypeVar,
    get_args,
    get_origin,
)

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import ErrorDetails

from app.config import Settings
from app.errors import Refused
from app.inputs import text_problem
from app.jobs.formats import FORMATS, TranscriptFormat
from app.jobs.slow_work import probe_slot
from app.languages import WHISPER_LANGUAGES, is_english_only
from app.models import JobStatus
from app.urls import check_url
from gpu_worker.protocol.capabilities import MAX_SPEAKERS, MIN_SPEAKERS, TASKS, Need, Task

# The multipart part that carries the audio: a file, not a form field, so no model holds it.
UPLOAD_PART = "file"
PROMPT_CHARS = 2000
OpenAIFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
OPENAI_FORMATS: tuple[str, ...] = get_args(OpenAIFormat)
# Transcriptions also answer OpenAI's diarized shape (with a diarizing profile).
OpenAITranscriptionFormat = Literal["json", "text", "srt", "vtt", "verbose_json", "diarized_json"]
OPENAI_TRANSCRIPTION_FORMATS: tuple[str, ...] = get_args(OpenAITranscriptionFormat)
MODEL_CHARS = 64
Granularity = Literal["word", "segment"]
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True)
class OnError:
    """Field metadata: the refusal a pydantic error on this field (given its details) becomes."""

    refusal: Callable[[ErrorDetails], Refused]


@dataclass(frozen=True)
class Deployment:
    """What a request is checked against beyond its own shape."""

    default_language: str | None
    english_only: bool  # every enabled profile's model is English-only
    webhooks: bool  # a webhook secret is set
    resolve: Callable[[Any, str], str]  # (value, field name) -> the checked URL, or Refused


def deployment(settings: Settings) -> Deployment:
    models = {profile.model for profile in settings.enabled_profiles}
    allow_private = settings.api.allow_private_urls

    def resolve(value: Any, field: str) -> str:
        with probe_slot():  # resolving the host may wait on a slow resolver
            return check_url(value, field=field, allow_private=allow_private).url

    return Deployment(
        default_language=settings.default_language,
        english_only=bool(models) and all(is_english_only(m) for m in models),
        webhooks=bool(settings.reveal("webhook_secret")),
        resolve=resolve,
    )


@dataclass(frozen=True)
class _Context:
    deployment: Deployment | None
    order: tuple[str, ...]  # the model's field names, in the order they are checked


def _in_turn(info: ValidationInfo) -> bool:
    """Whether every field before this one passed: only then may this one refuse."""
    context = info.context
    assert isinstance(context, _Context), "validate through parse()"
    assert info.field_name is not None
    earlier = context.order[: context.order.index(info.field_name)]
    return all(name in info.data for name in earlier)


def _deployment(info: ValidationInfo) -> Deployment:
    context = info.context
    assert isinstance(context, _Context) and context.deployment is not None, "needs a deployment"
    return context.deployment


# -- field checks (pydantic calls them field by field, in declaration order) ---------------


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


def _flag(value: Any) -> Any:
    """A form or query flag's text as a bool; anything else is left for the strict bool to
    refuse (pydantic's own lax parsing would accept 't' and 'n')."""
    if value is None:
        return False
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    return value


def _int_text(value: Any) -> Any:
    """Query text parsed as Python's int() does; anything else is left for the strict int."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return value
    return value


def _language(value: Any, info: ValidationInfo) -> Any:
    if not _in_turn(info):
        return value
    known = _deployment(info)
    if value is None or value == "":
        return known.default_language
    # ASCII-only before lower-casing: `str.lower()` maps U+212A KELVIN SIGN to "k", so
    # "\u212aa" would pass as "ka".
    if not isinstance(value, str) or not value.isascii() or value.lower() not in WHISPER_LANGUAGES:
        raise Refused(
            "invalid_language",
            f"language {value!r} is not an ISO 639-1 code Whisper knows (e.g. 'en', 'fr')",
        )
    code = value.lower()
    if code != "en" and known.english_only:
        raise Refused(
            "unsupported_language",
            f"language {code!r} is not supported: the configured models are English-only",
        )
    return code


def _free_text(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, str) and _in_turn(info):
        problem = text_problem(value, free_text=True)
        if problem is not None:
            raise Refused("invalid_text", f"{info.field_name} {problem}", param=info.field_name)
    return value


def _source_url(value: Any, info: ValidationInfo) -> Any:
    return _deployment(info).resolve(value, "url") if _in_turn(info) else value


def _webhook_url(value: Any, info: ValidationInfo) -> Any:
    if value is None or value == "" or not _in_turn(info):
        return _empty_is_none(value)
    known = _deployment(info)
    if not known.webhooks:
        raise Refused(
            "webhooks_disabled", "webhooks are disabled: MURMUR_WEBHOOK_SECRET is not set"
        )
    return known.resolve(value, "webhook_url")


# -- field types ------------------------------------------------------------------------------

# Documented as the lower-case codes; the check also takes them in any case ("EN").
Language = Annotated[
    str | None,
    Field(
        validate_default=True,
        examples=["en"],
        json_schema_extra={"enum": sorted(WHISPER_LANGUAGES)},
    ),
    BeforeValidator(_language),
]
Prompt = Annotated[
    Annotated[str, StringConstraints(max_length=PROMPT_CHARS)] | None,
    BeforeValidator(_empty_is_none),
    AfterValidator(_free_text),  # after the length: a long prompt is refused for its length
    OnError(
        lambda error: Refused(
            "invalid_parameter", f"prompt must be a string of at most {PROMPT_CHARS} characters"
        )
    ),
]
Flag = Annotated[
    bool,
    Field(strict=True),
    BeforeValidator(_flag),
    OnError(lambda error: Refused("invalid_parameter", f"{error['loc'][0]} must be true or false")),
]
WebhookUrl = Annotated[
    str | None, Field(json_schema_extra={"format": "uri"}), BeforeValidator(_webhook_url)
]
SourceUrl = Annotated[
    str,
    Field(json_schema_extra={"format": "uri"}),
    BeforeValidator(_source_url),
    OnError(
        lambda error: Refused("missing_url", 'send JSON {"url": "https://..."} or upload a file')
    ),
]


TaskField = Annotated[
    Task,
    BeforeValidator(lambda value: value or "transcribe"),
    OnError(lambda error: Refused("invalid_task", f"task must be one of {', '.join(TASKS)}")),
]
ModelName = Annotated[
    Annotated[str, StringConstraints(max_length=MODEL_CHARS)] | None,
    BeforeValidator(_empty_is_none),
    OnError(
        lambda error: Refused(
            "invalid_parameter", f"model must be a string of at most {MODEL_CHARS} characters"
        )
    ),
]
Speakers = Annotated[
    int | None,
    Field(strict=True, ge=MIN_SPEAKERS, le=MAX_SPEAKERS),
    BeforeValidator(lambda value: _int_text(_empty_is_none(value))),
    OnError(
        lambda error: Refused(
            "invalid_parameter",
            f"{error['loc'][0]} must be an integer from {MIN_SPEAKERS} to {MAX_SPEAKERS}",
        )
    ),
]


@dataclass(frozen=True)
class JobOptions:
    """A new job's checked options, whichever request carried them. `model` is the name the
    request gave; app/jobs/routing.py resolves it (`whisper-1` and the diarizing alias)."""

    language: str | None
    prompt: str | None
    word_timestamps: bool
    webhook_url: str | None
    task: Task = "transcribe"
    model: str | None = None
    diarize: bool = False
    min_speakers: int | None = None
    max_speakers: int | None = None

    def need(self) -> Need:
        return Need(language=self.language, task=self.task, model=self.model, diarize=self.diarize)


def _speaker_bounds(diarize: bool, low: int | None, high: int | None) -> None:
    """min_speakers <= max_speakers (both bound diarization only: without diarize=true they
    are kept and change nothing)."""
    if low is not None and high is not None and low > high:
        raise Refused(
            "invalid_parameter", f"min_speakers ({low}) is more than max_speakers ({high})"
        )


# -- the requests -----------------------------------------------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # How a refusal of unknown names calls them ("field(s)" of a JSON body, "form field(s)").
    unknown_names: ClassVar[str] = "field(s)"

    @model_validator(mode="before")
    @classmethod
    def _known_names_only(cls, data: Any) -> Any:
        """Unknown names are refused before any field is checked, all of them named (pydantic
        would report them after the fields, one by one)."""
        refuse_unknown(cls, data)
        return data


class _JobFields(_Request):
    """What POST /v1/jobs takes beside its audio, as a form or as JSON (the subclasses declare
    the fields, each in its own order: pydantic would put fields declared here first)."""

    if TYPE_CHECKING:
        language: str | None
        prompt: str | None
        word_timestamps: bool
        webhook_url: str | None
        task: Task
        model: str | None
        diarize: bool
        min_speakers: int | None
        max_speakers: int | None

    @model_validator(mode="after")
    def _speakers(self) -> _JobFields:
        _speaker_bounds(self.diarize, self.min_speakers, self.max_speakers)
        return self

    def options(self) -> JobOptions:
        return JobOptions(
            language=self.language,
            prompt=self.prompt,
            word_timestamps=self.word_timestamps,
            webhook_url=self.webhook_url,
            task=self.task,
            model=self.model,
            diarize=self.diarize,
            min_speakers=self.min_speakers,
            max_speakers=self.max_speakers,
        )


class UploadForm(_JobFields):
    """POST /v1/jobs as multipart/form-data: the form fields beside the audio part."""

    unknown_names: ClassVar[str] = "form field(s)"
    language: Language = None
    prompt: Prompt = None
    word_timestamps: Flag = False
    webhook_url: WebhookUrl = None
    task: TaskField = "transcribe"
    model: ModelName = None
    diarize: Flag = False
    min_speakers: Speakers = None
    max_speakers: Speakers = None


class UrlJob(_JobFields):
    """POST /v1/jobs as application/json: a job for the audio at `url`."""

    url: SourceUrl
    language: Language = None
    prompt: Prompt = None
    word_timestamps: Flag = False
    webhook_url: WebhookUrl = None
    task: TaskField = "transcribe"
    model: ModelName = None
    diarize: Flag = False
    min_speakers: Speakers = None
    max_speakers: Speakers = None


class OpenAITranscriptionForm(_Request):
    """POST /v1/audio/transcriptions: OpenAI's form fields beside the audio part."""

    unknown_names: ClassVar[str] = "form field(s)"
    task: ClassVar[Task] = "transcribe"
    response_format: Annotated[
        OpenAITranscriptionFormat,
        BeforeValidator(lambda value: value or "json"),
        OnError(
            lambda error: Refused(
                "invalid_response_format",
                f"response_format must be one of {', '.join(OPENAI_TRANSCRIPTION_FORMATS)}",
            )
        ),
    ] = "json"
    timestamp_granularities: Annotated[
        list[Granularity],
        Field(alias="timestamp_granularities[]"),
        OnError(
            lambda error: Refused(
                "invalid_parameter", "timestamp_granularities[] accepts 'word' and 'segment'"
            )
        ),
    ] = []
    language: Language = None
    prompt: Prompt = None
    # A model GET /v1/models lists: it picks the profiles that serve it (app/jobs/routing.py).
    model: ModelName = None
    # Accepted for OpenAI clients that send them, and ignored: Murmur chooses the decoding
    # temperatures and chunks the audio itself (the SDK sends chunking_strategy="auto" with
    # the diarizing model).
    temperature: str | None = None
    stream: str | None = None
    chunking_strategy: str | None = None

    def options(self) -> JobOptions:
        words = "word" in self.timestamp_granularities
        return JobOptions(
            language=self.language,
            prompt=self.prompt,
            word_timestamps=words,
            webhook_url=None,
            task=self.task,
            model=self.model,
            # OpenAI's diarized shape needs speakers; the diarizing model alias asks for them
            # too (app/jobs/routing.py resolves it).
            diarize=self.response_format == "diarized_json",
        )


class OpenAITranslationForm(_Request):
    """POST /v1/audio/translations: OpenAI's form fields beside the audio part (to English;
    OpenAI's translation takes no language)."""

    unknown_names: ClassVar[str] = "form field(s)"
    task: ClassVar[Task] = "translate"
    response_format: Annotated[
        OpenAIFormat,
        BeforeValidator(lambda value: value or "json"),
        OnError(
            lambda error: Refused(
                "invalid_response_format",
                f"response_format must be one of {', '.join(OPENAI_FORMATS)}",
            )
        ),
    ] = "json"
    prompt: Prompt = None
    model: ModelName = None
    temperature: str | None = None

    # The sync answer reads these as it does a transcription's.
    timestamp_granularities: ClassVar[list[str]] = []

    def options(self) -> JobOptions:
        return JobOptions(
            language=None,
            prompt=self.prompt,
            word_timestamps=False,
            webhook_url=None,
            task=self.task,
            model=self.model,
        )


class JobListQuery(BaseModel):
    """GET /v1/jobs: a page of the owner's jobs, newest first."""

    model_config = ConfigDict(frozen=True)
    status: Annotated[
        JobStatus | None,
        BeforeValidator(_empty_is_none),
        OnError(
            lambda error: Refused("invalid_status", f"status must be one of {', '.join(JobStatus)}")
        ),
    ] = None
    limit: Annotated[
        int,
        Field(strict=True, ge=1, le=100),
        BeforeValidator(_int_text),
        OnError(lambda error: Refused("invalid_limit", "limit must be an integer from 1 to 100")),
    ] = 20
    cursor: str | None = None


class TranscriptQuery(BaseModel):
    """GET /v1/jobs/{job_id}/transcript."""

    model_config = ConfigDict(frozen=True)
    format: Annotated[
        TranscriptFormat,
        OnError(
            lambda error: Refused("invalid_format", f"format must be one of {', '.join(FORMATS)}")
        ),
    ] = "json"


class CancelQuery(BaseModel):
    """DELETE /v1/jobs/{job_id}."""

    model_config = ConfigDict(frozen=True)
    purge: Annotated[Flag, Field(description="Remove an ended job for good (afterwards: 404)")] = (
        False
    )


# -- parsing ----------------------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def _public_name(name: str, model: type[BaseModel]) -> str:
    return model.model_fields[name].alias or name


def refuse_unknown(model: type[BaseModel], names: Iterable[Any]) -> None:
    """Refuse (`unknown_field`) names the model has no field for, all of them named."""
    known = {_public_name(name, model) for name in model.model_fields}
    unknown = set(names) - known
    if unknown:
        # A form part whose name could not be read is keyed None: name it, do not sort on it.
        listed = ", ".join(sorted(str(name) for name in unknown))
        label = getattr(model, "unknown_names", "field(s)")
        named = sorted(str(name) for name in unknown if isinstance(name, str))
        raise Refused(
            "unknown_field", f"unknown {label}: {listed}", param=named[0] if named else None
        )


def list_fields(model: type[BaseModel]) -> set[str]:
    """The public names of `model`'s list fields: the only names a form may repeat."""
    return {
        _public_name(name, model)
        for name, field in model.model_fields.items()
        if get_origin(field.annotation) is list
    }


def form_values(model: type[BaseModel], form: Mapping[Any, list[str]]) -> dict[Any, Any]:
    """A multipart form's values for `model`: every value of a list field, else the one."""
    lists = list_fields(model)
    return {name: values if name in lists else values[0] for name, values in form.items()}


def parse(model: type[M], data: Mapping[Any, Any], known: Deployment | None = None) -> M:
    """`data` validated as `model`, or the `Refused` of its first bad field."""
    context = _Context(known, tuple(model.model_fields))
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise _refusal(model, exc.errors()[0]) from None


def _refusal(model: type[BaseModel], error: ErrorDetails) -> Refused:
    where = error["loc"][0] if error["loc"] else ""
    param = where if isinstance(where, str) and where else None
    for name, field in model.model_fields.items():
        if _public_name(name, model) == where:
            for meta in field.metadata:
                if isinstance(meta, OnError):
                    refusal = meta.refusal(error)
                    refusal.param = refusal.param or param
                    return refusal
    return Refused("invalid_parameter", f"{where or 'the request'}: {error['msg']}", param=param)
