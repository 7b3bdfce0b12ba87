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
from app.jobs.cues import (
    LINE_COUNT_RANGE,
    LINE_WIDTH_RANGE,
    MAX_LINE_COUNT,
    MAX_LINE_WIDTH,
    WORDS_PER_LINE_RANGE,
    CueOptions,
)
from app.jobs.formats import FORMATS, TranscriptFormat
from app.jobs.slow_work import probe_slot
from app.languages import WHISPER_LANGUAGES, is_english_only
from app.models import JobStatus
from app.urls import check_url
from gpu_worker.protocol.capabilities import MAX_SPEAKERS, MIN_SPEAKERS, TASKS, Need, Task
from gpu_worker.protocol.claim import MAX_TEMPERATURE, MIN_TEMPERATURE

# The multipart part that carries the audio: a file, not a form field, so no model holds it.
UPLOAD_PART = "file"
# whisper-asr-webservice's name for it (POST /asr, POST /detect-language).
WASR_UPLOAD_PART = "audio_file"
PROMPT_CHARS = 2000
OpenAIFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
OPENAI_FORMATS: tuple[str, ...] = get_args(OpenAIFormat)
# Transcriptions also answer OpenAI's diarized shape (with a diarizing profile).
OpenAITranscriptionFormat = Literal["json", "text", "srt", "vtt", "verbose_json", "diarized_json"]
OPENAI_TRANSCRIPTION_FORMATS: tuple[str, ...] = get_args(OpenAITranscriptionFormat)
MODEL_CHARS = 64
Granularity = Literal["word", "segment"]
# whisper-asr-webservice's `output` choices (POST /asr), each rendered by app/jobs/formats.py
# under the same name; tsv once that module writes it.
WASR_OUTPUTS: tuple[str, ...] = tuple(
    f for f in ("txt", "vtt", "srt", "tsv", "json") if f in FORMATS
)
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


def _number_text(value: Any) -> Any:
    """Query or form text parsed as Python's float() does; anything else is left for the
    strict number to refuse ("nan" and "inf" parse, and are refused as out of range)."""
    if isinstance(value, str):
        try:
            return float(value)
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
            "invalid_parameter",
            f"{error['loc'][0]} must be a string of at most {PROMPT_CHARS} characters",
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


Temperature = Annotated[
    float | None,
    Field(
        strict=True,
        ge=MIN_TEMPERATURE,
        le=MAX_TEMPERATURE,
        allow_inf_nan=False,
        description="The first sampling temperature of decoding (0: greedy); a window that "
        "fails its thresholds falls back to the worker's higher steps; absent: from 0 upward",
    ),
    BeforeValidator(lambda value: _number_text(_empty_is_none(value))),
    OnError(
        lambda error: Refused(
            "invalid_parameter",
            f"temperature must be a number from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}",
        )
    ),
]
VadFilter = Annotated[
    Flag,
    Field(
        description="Skip silence with the profile's voice activity detection before decoding "
        "(false: decode all of the audio)"
    ),
]
InitialPrompt = Annotated[Prompt, Field(description="whisper's name for `prompt`: send one")]


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
    temperature: float | None = None
    vad_filter: bool = True

    def need(self) -> Need:
        return Need(language=self.language, task=self.task, model=self.model, diarize=self.diarize)


def _speaker_bounds(diarize: bool, low: int | None, high: int | None) -> None:
    """min_speakers <= max_speakers (both bound diarization only: without diarize=true they
    are kept and change nothing)."""
    if low is not None and high is not None and low > high:
        raise Refused(
            "invalid_parameter", f"min_speakers ({low}) is more than max_speakers ({high})"
        )


def _one_prompt(prompt: str | None, initial_prompt: str | None) -> str | None:
    """`prompt` and its alias `initial_prompt` (whisper's name): one of them, not both."""
    if prompt is not None and initial_prompt is not None:
        raise Refused(
            "invalid_parameter",
            "send prompt or initial_prompt (the same option), not both",
            param="initial_prompt",
        )
    return prompt if prompt is not None else initial_prompt


# -- the requests -----------------------------------------------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # How a refusal of unknown names calls them ("field(s)" of a JSON body, "form field(s)").
    unknown_names: ClassVar[str] = "field(s)"
    # The multipart part that carries the audio, where the request is a form.
    upload_part: ClassVar[str] = UPLOAD_PART

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
        initial_prompt: str | None
        temperature: float | None
        vad_filter: bool

    @model_validator(mode="after")
    def _speakers(self) -> _JobFields:
        _speaker_bounds(self.diarize, self.min_speakers, self.max_speakers)
        _one_prompt(self.prompt, self.initial_prompt)
        return self

    def options(self) -> JobOptions:
        return JobOptions(
            language=self.language,
            prompt=_one_prompt(self.prompt, self.initial_prompt),
            word_timestamps=self.word_timestamps,
            webhook_url=self.webhook_url,
            task=self.task,
            model=self.model,
            diarize=self.diarize,
            min_speakers=self.min_speakers,
            max_speakers=self.max_speakers,
            temperature=self.temperature,
            vad_filter=self.vad_filter,
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
    initial_prompt: InitialPrompt = None
    temperature: Temperature = None
    vad_filter: VadFilter = True


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
    initial_prompt: InitialPrompt = None
    temperature: Temperature = None
    vad_filter: VadFilter = True


def _no_stream(value: bool) -> bool:
    if value:
        raise Refused(
            "invalid_parameter",
            "stream=true is not supported on /v1/audio/translations: send stream=false (or "
            "nothing) for the whole answer",
            param="stream",
        )
    return value


def _auto_chunking(value: Any) -> Any:
    if value is not None and value != "" and value != "auto":
        raise Refused(
            "invalid_parameter",
            "chunking_strategy takes only 'auto': Murmur cuts the audio at silences itself",
            param="chunking_strategy",
        )
    return _empty_is_none(value)


ChunkingStrategy = Annotated[
    Literal["auto"] | None,
    Field(description="Only 'auto' (what Murmur does anyway: it cuts long audio at silences)"),
    BeforeValidator(_auto_chunking),
]
# Fields of OpenAI's audio API that Murmur does not do, refused with the reason (400
# invalid_parameter) instead of as unknown names.
OPENAI_UNSUPPORTED: Mapping[str, str] = {
    "include[]": "include[] (logprobs) is not supported: Murmur's verbose_json segments carry "
    "avg_logprob",
    "known_speaker_names[]": "known_speaker_names[] is not supported: speakers are labelled "
    "SPEAKER_00, SPEAKER_01, ... in order of appearance",
    "known_speaker_references[]": "known_speaker_references[] is not supported: speakers are "
    "labelled SPEAKER_00, SPEAKER_01, ... in order of appearance",
}


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
    temperature: Temperature = None
    stream: Annotated[
        Flag,
        Field(
            description="true: the answer is text/event-stream, OpenAI's transcript.text.delta "
            "events as segments are transcribed, then transcript.text.done (docs/api.md)"
        ),
    ] = False
    chunking_strategy: ChunkingStrategy = None
    # OpenAI fields Murmur does not do: named with the reason rather than as unknown.
    unsupported: ClassVar[Mapping[str, str]] = OPENAI_UNSUPPORTED

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
            temperature=self.temperature,
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
    temperature: Temperature = None
    stream: Annotated[
        Flag,
        AfterValidator(_no_stream),
        Field(
            description="Only false: a translation answers once, whole",
            json_schema_extra={"enum": [False]},
        ),
    ] = False
    unsupported: ClassVar[Mapping[str, str]] = {
        **OPENAI_UNSUPPORTED,
        "language": "language is not taken by translations: the source language is detected "
        "and the answer is English (use /v1/audio/transcriptions for another language)",
        "timestamp_granularities[]": "timestamp_granularities[] is not taken by translations",
    }

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
            temperature=self.temperature,
        )


def _wasr_output(value: Any) -> Any:
    if value is None or value == "":
        return "txt"
    if value not in WASR_OUTPUTS:
        raise Refused("invalid_format", f"output must be one of {', '.join(WASR_OUTPUTS)}")
    return value


class WasrForm(_Request):
    """The multipart form of whisper-asr-webservice's endpoints: the audio part alone."""

    unknown_names: ClassVar[str] = "form field(s)"
    upload_part: ClassVar[str] = WASR_UPLOAD_PART


class WasrQuery(_Request):
    """What whisper-asr-webservice's endpoints take in their query strings (their audio is
    the multipart part `audio_file`)."""

    unknown_names: ClassVar[str] = "query parameter(s)"
    encode: Annotated[
        Flag,
        Field(
            description="true: the audio is a file in any container (decoded as uploaded); "
            "false: raw 16-bit little-endian mono PCM at 16 kHz"
        ),
    ] = True


class WasrAsrQuery(WasrQuery):
    """POST /asr: whisper-asr-webservice's transcription, its parameter names and defaults."""

    task: TaskField = "transcribe"
    language: Language = None
    initial_prompt: InitialPrompt = None
    # Absent: the profile's VAD, as whisper-asr-webservice's WhisperX engine always runs it.
    vad_filter: VadFilter = True
    word_timestamps: Flag = False
    output: Annotated[
        str,
        Field(json_schema_extra={"enum": list(WASR_OUTPUTS)}),
        BeforeValidator(_wasr_output),
    ] = "txt"
    diarize: Flag = False
    min_speakers: Speakers = None
    max_speakers: Speakers = None

    @model_validator(mode="after")
    def _speakers(self) -> WasrAsrQuery:
        _speaker_bounds(self.diarize, self.min_speakers, self.max_speakers)
        return self

    def options(self) -> JobOptions:
        return JobOptions(
            language=self.language,
            prompt=self.initial_prompt,
            word_timestamps=self.word_timestamps,
            webhook_url=None,
            task=self.task,
            diarize=self.diarize,
            min_speakers=self.min_speakers,
            max_speakers=self.max_speakers,
            vad_filter=self.vad_filter,
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


def _cue_refusal(low: int, high: int) -> OnError:
    return OnError(
        lambda error: Refused(
            "invalid_parameter", f"{error['loc'][0]} must be an integer from {low} to {high}"
        )
    )


# How `srt` and `vtt` lay out their cues (app/jobs/cues.py): integers within these bounds.
LineWidth = Annotated[
    int,
    Field(strict=True, ge=LINE_WIDTH_RANGE[0], le=LINE_WIDTH_RANGE[1]),
    BeforeValidator(_int_text),
    _cue_refusal(*LINE_WIDTH_RANGE),
]
LineCount = Annotated[
    int,
    Field(strict=True, ge=LINE_COUNT_RANGE[0], le=LINE_COUNT_RANGE[1]),
    BeforeValidator(_int_text),
    _cue_refusal(*LINE_COUNT_RANGE),
]
WordsPerLine = Annotated[
    int | None,
    Field(strict=True, ge=WORDS_PER_LINE_RANGE[0], le=WORDS_PER_LINE_RANGE[1]),
    BeforeValidator(_int_text),
    _cue_refusal(*WORDS_PER_LINE_RANGE),
]


class TranscriptQuery(BaseModel):
    """GET /v1/jobs/{job_id}/transcript."""

    model_config = ConfigDict(frozen=True)
    format: Annotated[
        TranscriptFormat,
        OnError(
            lambda error: Refused("invalid_format", f"format must be one of {', '.join(FORMATS)}")
        ),
    ] = "json"
    # How `srt` and `vtt` lay out their cues (app/jobs/cues.py); other formats ignore them.
    max_line_width: Annotated[
        LineWidth, Field(description="srt, vtt: characters per cue line at most")
    ] = MAX_LINE_WIDTH
    max_line_count: Annotated[LineCount, Field(description="srt, vtt: lines per cue at most")] = (
        MAX_LINE_COUNT
    )
    max_words_per_line: Annotated[
        WordsPerLine, Field(description="srt, vtt: words per cue line at most (default: any)")
    ] = None

    def cue_options(self) -> CueOptions:
        """The cue layout these options ask for."""
        return CueOptions(self.max_line_width, self.max_line_count, self.max_words_per_line)


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
    """Refuse names the model has no field for: one the model names as `unsupported` with its
    reason (`invalid_parameter`), else every unknown name at once (`unknown_field`)."""
    known = {_public_name(name, model) for name in model.model_fields}
    unsupported: Mapping[str, str] = getattr(model, "unsupported", {})
    for name in sorted(str(n) for n in set(names) - known if n in unsupported):
        raise Refused("invalid_parameter", unsupported[name], param=name)
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
