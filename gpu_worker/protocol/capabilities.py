"""What a profile can do, derived from its assets: the one statement both sides route by.

A profile's capabilities follow from its model's manifest entry (gpu_worker/models.toml) and
its diarization setting, never from a separate declaration that could disagree with them:
- `multilingual`: the model serves every Whisper language; otherwise English only. The
  manifest says so per model (`multilingual = true|false`); a model it does not know is
  judged by its name (`*.en` is English-only, as Whisper names them).
- `translate`: translation to English: what the manifest says (`translate = false` for
  large-v3-turbo, which OpenAI did not train for translation), else every multilingual model
  and no English-only one.
- `diarize`: the profile names a diarization asset set (`diarization = "<asset>"`).

The control plane routes a job only to profiles whose capabilities `serve` it (app/jobs/
routing.py) and refuses at submission when no enabled profile can; the worker refuses the
same job if it reaches it anyway (gpu_worker/transcriber.py), so a stale route fails closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpu_worker.manifest import Manifest, ManifestError, load_manifest

Task = Literal["transcribe", "translate"]
TASKS: tuple[Task, ...] = ("transcribe", "translate")
# The speaker counts a job may ask for (min_speakers / max_speakers).
MIN_SPEAKERS = 1
MAX_SPEAKERS = 20


@dataclass(frozen=True)
class Need:
    """What a job asks of a profile."""

    language: str | None = None  # None: detect it
    task: Task = "transcribe"
    model: str | None = None  # None: any model
    diarize: bool = False


@dataclass(frozen=True)
class Capabilities:
    model: str
    multilingual: bool
    translate: bool
    diarize: bool

    def serves(self, need: Need) -> bool:
        return self.refusal(need) is None

    def refusal(self, need: Need) -> str | None:
        """Why this profile cannot serve `need` (a code of app/errors.py), or None."""
        if need.model is not None and need.model != self.model:
            return "model_not_found"
        if need.language is not None and need.language != "en" and not self.multilingual:
            return "unsupported_language"
        if need.language is None and not self.multilingual:
            # Detection on an English-only model answers "en" for anything: German audio
            # would "succeed" as English nonsense. Such a profile takes only English jobs.
            return "unsupported_language"
        if need.task == "translate" and not self.translate:
            return "unsupported_task"
        if need.diarize and not self.diarize:
            return "diarization_unavailable"
        return None

    def languages(self) -> str:
        return "all Whisper languages" if self.multilingual else "English only"


def capabilities_of(
    model: str, diarization: str | None = None, manifest: Manifest | None = None
) -> Capabilities:
    """A profile's capabilities from its model and diarization setting."""
    multilingual: bool | None = None
    translate: bool | None = None
    try:
        asset = (manifest or load_manifest()).assets.get(model)
    except ManifestError:
        asset = None
    if asset is not None:
        multilingual, translate = asset.multilingual, asset.translate
    if multilingual is None:
        multilingual = not model.endswith(".en")
    return Capabilities(
        model=model,
        multilingual=multilingual,
        translate=multilingual and (translate is None or translate),
        diarize=diarization is not None,
    )
