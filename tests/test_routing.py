"""Routing by capability (app/jobs/routing.py, gpu_worker/protocol/capabilities.py): what each
profile can serve follows from its model's manifest entry and its diarization setting; a job
goes only to profiles that can serve it, in allowlist order, and a job none can serve is
refused with the code of the first requirement nobody meets."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import LOCAL_CPU_PROFILE, Profile, Settings, load_settings
from app.errors import Refused
from app.jobs import routing
from app.jobs.requests import JobOptions
from gpu_worker.protocol.capabilities import Need, capabilities_of


def profile(name: str, model: str, **extra: Any) -> Profile:
    return LOCAL_CPU_PROFILE.model_copy(update={"name": name, "model": model, **extra})


def settings(*profiles: Profile) -> Settings:
    base = load_settings(env={"MURMUR_API_TOKEN": "t" * 32, "MURMUR_SIGNING_KEY": "k" * 32})
    return base.model_copy(update={"profiles": profiles})


ENGLISH = profile("english", "tiny.en")
MULTI = profile("multi", "base")
TURBO = profile("turbo", "large-v3-turbo")
SPEAKERS = profile("speakers", "base", diarization="some-diarization-assets")


def names(profiles: list[Profile]) -> list[str]:
    return [p.name for p in profiles]


def test_capabilities_come_from_the_manifest() -> None:
    assert capabilities_of("base") == capabilities_of("base", None)
    base, tiny, turbo = (capabilities_of(m) for m in ("base", "tiny.en", "large-v3-turbo"))
    assert (base.multilingual, base.translate, base.diarize) == (True, True, False)
    assert (tiny.multilingual, tiny.translate) == (False, False)
    # OpenAI did not train turbo for translation: the manifest says so, routing follows.
    assert (turbo.multilingual, turbo.translate) == (True, False)
    assert capabilities_of("base", "some-diarization-assets").diarize is True
    # A model the manifest does not know is judged by its name, as Whisper names them.
    assert capabilities_of("medium.en").multilingual is False
    assert capabilities_of("large-v3").translate is True


@pytest.mark.parametrize(
    ("need", "expected"),
    [
        (Need(language="de"), ["multi", "turbo", "speakers"]),
        (Need(language="en"), ["english", "multi", "turbo", "speakers"]),
        (Need(), ["multi", "turbo", "speakers"]),  # detection needs a multilingual model
        (Need(task="translate"), ["multi", "speakers"]),
        (Need(model="tiny.en"), ["english"]),  # no language, an English model asked for
        (Need(model="base", diarize=True), ["speakers"]),
        (Need(language="de", model="tiny.en"), []),
    ],
)
def test_a_job_goes_only_to_profiles_that_can_serve_it(need: Need, expected: list[str]) -> None:
    assert names(routing.serving([ENGLISH, MULTI, TURBO, SPEAKERS], need)) == expected


def test_an_english_only_deployment_takes_jobs_without_a_language_as_english() -> None:
    assert names(routing.serving([ENGLISH], Need())) == ["english"]
    routing.refuse_unservable(settings(ENGLISH), Need())


@pytest.mark.parametrize(
    ("profiles", "need", "code", "named"),
    [
        ((ENGLISH,), Need(language="de"), "unsupported_language", "English-only"),
        ((ENGLISH, MULTI), Need(language="de", model="tiny.en"), "unsupported_language", "base"),
        ((ENGLISH, TURBO), Need(task="translate"), "translation_unavailable", "turbo"),
        ((MULTI,), Need(diarize=True), "diarization_unavailable", "diarization"),
        ((MULTI,), Need(model="tiny.en"), "model_not_found", "tiny.en"),
    ],
)
def test_a_job_no_profile_can_serve_is_refused_naming_what_exists(
    profiles: tuple[Profile, ...], need: Need, code: str, named: str
) -> None:
    with pytest.raises(Refused) as refused:
        routing.refuse_unservable(settings(*profiles), need)
    assert refused.value.code == code
    assert named in refused.value.message
    assert refused.value.status == 400


def test_disabled_profiles_serve_nothing() -> None:
    with pytest.raises(Refused) as refused:
        routing.refuse_unservable(
            settings(ENGLISH, MULTI.model_copy(update={"enabled": False})), Need(language="de")
        )
    assert refused.value.code == "unsupported_language"


def test_model_names_openai_clients_send() -> None:
    deployment = settings(ENGLISH, MULTI)
    assert routing.resolve_model(None, deployment) == (None, False)
    assert routing.resolve_model("whisper-1", deployment) == (None, False)
    assert routing.resolve_model("base", deployment) == ("base", False)
    assert routing.resolve_model("gpt-4o-transcribe-diarize", deployment) == (None, True)
    with pytest.raises(Refused) as refused:
        routing.resolve_model("gpt-4o-transcribe", deployment)
    assert refused.value.code == "model_not_found"
    assert "tiny.en, base, whisper-1" in refused.value.message


def test_the_model_list_follows_the_enabled_profiles() -> None:
    assert routing.model_ids(settings(ENGLISH, MULTI)) == ["tiny.en", "base", "whisper-1"]
    with_speakers = settings(MULTI, SPEAKERS)
    assert routing.model_ids(with_speakers) == ["base", "whisper-1", "gpt-4o-transcribe-diarize"]
    card = routing.model_card("gpt-4o-transcribe-diarize", with_speakers)
    assert (card["object"], card["alias_of"], card["diarize"]) == ("model", "base", True)
    assert routing.model_card("base", with_speakers)["translate"] is True


def test_the_diarizing_alias_routes_to_a_diarizing_profile() -> None:
    options = JobOptions(None, None, False, None, model="gpt-4o-transcribe-diarize")
    routed = routing.route(options, settings(MULTI, SPEAKERS))
    assert (routed.model, routed.diarize) == (None, True)
    assert names(routing.serving([MULTI, SPEAKERS], routed.need())) == ["speakers"]
    with pytest.raises(Refused) as refused:
        routing.route(options, settings(MULTI))
    assert refused.value.code == "diarization_unavailable"
