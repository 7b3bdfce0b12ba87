"""faster-whisper's batched pipeline, detecting the language from the first batch it encodes.

`BatchedInferencePipeline.transcribe` without a language runs `WhisperModel.detect_language`
first: one more 30 s encoder pass before the batches, which then encode that speech again.
On a 2-core CPU that pass was 13 % of the default profile's time (docs/performance.md,
"Issue 33"). `LanguageInBatch` instead asks the model for the language of every chunk of the
first batch from that batch's own encoder output (CTranslate2's `detect_language` on an
encoder output: one decoder step per chunk) and decodes the batch, and every later one, in it.

Invariants:
- The language is chosen once per call, from the first batch, before any of its text is
  decoded; every segment of the call is decoded in it (as in faster-whisper's own path, where
  the first 30 s of speech decide). Chunks vote with their speech seconds, so a one-word chunk
  does not outvote half a minute of speech.
- The returned `TranscriptionInfo` carries the detected language once its segments have been
  read to the end (before, it says nothing of the language); with no speech at all the
  language comes from faster-whisper's own detection on its empty-audio feature, as before.
- A call with a language, or on an English-only model, is faster-whisper's unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from faster_whisper import BatchedInferencePipeline
from faster_whisper.transcribe import Segment, TranscriptionInfo

# What the tokenizer is built with until the first batch has spoken; never decoded in.
PLACEHOLDER = "en"


def chosen_language(
    per_chunk: list[list[tuple[str, float]]], seconds: list[float]
) -> tuple[str, float, list[tuple[str, float]]]:
    """The language of a batch: each chunk's probabilities ("<|de|>" tokens, as CTranslate2
    returns them) weighted by its seconds of speech; (code, probability, all, best first)."""
    total: defaultdict[str, float] = defaultdict(float)
    weights = [max(s, 1e-3) for s in seconds]
    for ranked, weight in zip(per_chunk, weights, strict=True):
        for token, probability in ranked:
            total[token[2:-2]] += weight * probability
    scale = sum(weights)
    ranking = sorted(((code, p / scale) for code, p in total.items()), key=lambda x: -x[1])
    return ranking[0][0], ranking[0][1], ranking


class LanguageInBatch(BatchedInferencePipeline):  # type: ignore[misc]
    """`BatchedInferencePipeline` whose language detection rides on the first batch's encoding."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self._detect_into: TranscriptionInfo | None = None
        self._seconds: list[float] = []

    def transcribe(
        self, audio: Any, language: str | None = None, **options: Any
    ) -> tuple[Iterable[Segment], TranscriptionInfo]:
        if language is not None or not self.model.model.is_multilingual:
            return super().transcribe(audio, language=language, **options)  # type: ignore[no-any-return]
        segments, info = super().transcribe(audio, language=PLACEHOLDER, **options)
        return self._settling(segments, info), info

    def _settling(self, segments: Iterable[Segment], info: TranscriptionInfo) -> Iterator[Segment]:
        """`segments`, with the first batch choosing the language into `info`."""
        self._detect_into = info
        try:
            yield from segments
        finally:
            undecided = self._detect_into is not None
            self._detect_into = None
        if undecided:
            # No speech reached a batch: faster-whisper's own answer for empty audio.
            silence = np.full((self.model.model.n_mels, 1), -1.5, dtype=np.float32)
            found = self.model.detect_language(features=silence)
            info.language, info.language_probability, info.all_language_probs = found

    def forward(self, features: Any, tokenizer: Any, chunks_metadata: Any, options: Any) -> Any:
        self._seconds = [float(chunk["duration"]) for chunk in chunks_metadata]
        return super().forward(features, tokenizer, chunks_metadata, options)

    def generate_segment_batched(self, features: Any, tokenizer: Any, options: Any) -> Any:
        info, self._detect_into = self._detect_into, None
        if info is None:
            return super().generate_segment_batched(features, tokenizer, options)
        encoded = self.model.encode(features)
        per_chunk = self.model.model.detect_language(encoded)
        language, probability, ranking = chosen_language(per_chunk, self._seconds)
        # The tokenizer's language token is what the prompt and word splitting read; the
        # same object serves this batch's split and word times and every later batch.
        tokenizer.language = tokenizer.tokenizer.token_to_id(f"<|{language}|>")
        tokenizer.language_code = language
        info.language, info.language_probability, info.all_language_probs = (
            language,
            probability,
            ranking,
        )
        # The batch is decoded from the encoding just made, not encoded a second time: the
        # instance attribute shadows WhisperModel.encode for this one call.
        self.model.encode = lambda _features: encoded
        try:
            return super().generate_segment_batched(features, tokenizer, options)
        finally:
            del self.model.encode
