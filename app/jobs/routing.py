"""Which profiles may serve a job: its language, task, model and diarize against capabilities.

Invariants:
- A profile's capabilities come from gpu_worker/protocol/capabilities.py (its model's manifest
  entry and its diarization setting); nothing here declares them again.
- Submission refuses a job no enabled profile can serve (`refuse_unservable`), with the code
  of the first requirement no profile meets, in the order model, language, task, diarize.
- Dispatch, the planner's choice and its re-route only ever pick a profile `serving` returns.
- A job without a language needs language detection, so it goes to multilingual profiles;
  where no enabled profile (of the model it asks for) is multilingual, an English-only
  deployment or `model=tiny.en`, it goes to English ones, which transcribe it as English.
- Model names the OpenAI clients send: `whisper-1` is the default choice (no constraint: the
  first profile, in allowlist order, that can serve the job); `gpt-4o-transcribe-diarize`
  asks for a diarizing profile, whatever its model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from app.config import Profile, Settings
from app.errors import Refused
from app.jobs.requests import JobOptions
from app.models import Job
from gpu_worker.protocol.capabilities import Capabilities, Need, Task, capabilities_of

DEFAULT_ALIAS = "whisper-1"
DIARIZE_ALIAS = "gpt-4o-transcribe-diarize"


@lru_cache(maxsize=256)
def _capabilities(model: str, diarization: str | None) -> Capabilities:
    return capabilities_of(model, diarization)


def capabilities(profile: Profile) -> Capabilities:
    return _capabilities(profile.model, profile.diarization)


def need_of(job: Job) -> Need:
    """What a stored job asks of a profile (rows from before these columns ask nothing)."""
    task: Task = "translate" if job.task == "translate" else "transcribe"
    return Need(language=job.language, task=task, model=job.model, diarize=bool(job.diarize))


def serving(profiles: Iterable[Profile], need: Need) -> list[Profile]:
    """The profiles, in their order, that can serve `need`."""
    profiles = list(profiles)
    chosen = [p for p in profiles if capabilities(p).serves(need)]
    if (
        not chosen
        and need.language is None
        and not any(
            capabilities(p).multilingual
            for p in profiles
            if p.enabled and need.model in (None, p.model)
        )
    ):
        chosen = [p for p in profiles if capabilities(p).serves(replace(need, language="en"))]
    return chosen


def served_models(settings: Settings) -> list[str]:
    """The models enabled profiles serve, in allowlist order, each once."""
    return list(dict.fromkeys(p.model for p in settings.enabled_profiles))


def resolve_model(requested: str | None, settings: Settings) -> tuple[str | None, bool]:
    """A requested model name as (model constraint, diarize asked); refuses an unknown one."""
    if requested is None or requested == "" or requested == DEFAULT_ALIAS:
        return None, False
    if requested == DIARIZE_ALIAS:
        return None, True
    if requested in served_models(settings):
        return requested, False
    raise Refused(
        "model_not_found",
        f"the model {requested!r} does not exist here; models: {', '.join(model_ids(settings))}",
    )


def model_ids(settings: Settings) -> list[str]:
    """Every model id GET /v1/models lists: served models, the default alias, and the
    diarizing alias where a profile diarizes."""
    ids = [*served_models(settings), DEFAULT_ALIAS]
    if any(capabilities(p).diarize for p in settings.enabled_profiles):
        ids.append(DIARIZE_ALIAS)
    return ids


# When each model was published (Unix time), for OpenAI's `created`: Whisper tiny/base on
# 2022-09-21, large-v3-turbo on 2024-10-01; whisper-1 and the diarizing alias carry the values
# OpenAI's own API lists for them.
_CREATED = {
    "tiny.en": 1663718400,
    "base": 1663718400,
    "large-v3-turbo": 1727740800,
    DEFAULT_ALIAS: 1677532384,
    DIARIZE_ALIAS: 1760400000,
}


def model_card(model_id: str, settings: Settings) -> dict[str, Any]:
    """One entry of GET /v1/models in OpenAI's `Model` shape, plus what it can do."""
    enabled = settings.enabled_profiles
    if model_id == DEFAULT_ALIAS:
        # The default: what a job without a model gets first, in allowlist order.
        target = served_models(settings)[0] if enabled else model_id
    elif model_id == DIARIZE_ALIAS:
        target = next((p.model for p in enabled if capabilities(p).diarize), model_id)
    else:
        target = model_id
    profiles = [p for p in enabled if p.model == target]
    if model_id == DIARIZE_ALIAS:
        profiles = [p for p in profiles if capabilities(p).diarize]
    caps = [capabilities(p) for p in profiles]
    card: dict[str, Any] = {
        "id": model_id,
        "object": "model",
        "created": _CREATED.get(target if model_id not in _CREATED else model_id, 0),
        "owned_by": "murmur",
        "multilingual": any(c.multilingual for c in caps),
        "translate": any(c.translate for c in caps),
        "diarize": any(c.diarize for c in caps),
    }
    if target != model_id:
        card["alias_of"] = target
    return card


def refuse_unservable(settings: Settings, need: Need) -> None:
    """Refuse (400) a job that no enabled profile can serve, naming what exists."""
    enabled = list(settings.enabled_profiles)
    if serving(enabled, need):
        return
    described = "; ".join(
        f"{p.name}: {p.model} ({capabilities(p).languages()}"
        f"{', translates' if capabilities(p).translate else ''}"
        f"{', diarizes' if capabilities(p).diarize else ''})"
        for p in enabled
    )
    where = f"; profiles: {described}"
    checks: Sequence[tuple[Callable[[Capabilities], bool], Refused]] = (
        (
            lambda c: need.model is None or c.model == need.model,
            Refused(
                "model_not_found", f"no enabled profile serves the model {need.model!r}{where}"
            ),
        ),
        (
            lambda c: need.language in (None, "en") or c.multilingual,
            Refused(
                "unsupported_language",
                f"language {need.language!r} is not supported: the models that serve this "
                f"request are English-only{where}",
            ),
        ),
        (
            lambda c: need.task != "translate" or c.translate,
            Refused(
                "translation_unavailable",
                "no enabled profile that serves this request translates (English-only models "
                f"and large-v3-turbo cannot){where}",
            ),
        ),
        (
            lambda c: not need.diarize or c.diarize,
            Refused(
                "diarization_unavailable",
                "no enabled profile that serves this request diarizes (set `diarization` on a "
                f"profile){where}",
            ),
        ),
    )
    left = [capabilities(p) for p in enabled]
    for check, refusal in checks:
        left = [c for c in left if check(c)]
        if not left:
            raise refusal
    raise Refused(
        "unsupported_language",
        f"no enabled profile can detect the language of this request{where}",
    )


def route(options: JobOptions, settings: Settings) -> JobOptions:
    """A request's options with its model name resolved, once some enabled profile can serve
    them; else the refusal (400) naming what exists."""
    model, diarize_asked = resolve_model(options.model, settings)
    options = replace(options, model=model, diarize=options.diarize or diarize_asked)
    refuse_unservable(settings, options.need())
    return options
