"""Telling a decoding loop from speech: a word sequence that comes back again and again.

Whisper's classic failure is a phrase decoded over and over ("and I am here to meet you, and I
am here to meet you, ..."), the more so on the batched path, which has no temperature fallback
(gpu_worker/transcriber.py, `Decoding`). A segment counts as looped when some run of
`NGRAM` words occurs `REPEATS` times or more in its text, or when its gzip compression ratio
is above the fallback threshold (openai-whisper's own loop test). Pure: text in, answer out.
"""

from __future__ import annotations

import re
from collections import Counter

NGRAM = 4
REPEATS = 3
_WORD = re.compile(r"[\w']+")


def words_of(text: str) -> list[str]:
    """Lower-cased words, punctuation dropped: "I am here." and "i am here" are the same."""
    return _WORD.findall(text.lower())


def most_repeated(text: str, ngram: int = NGRAM) -> int:
    """How often the most frequent run of `ngram` words occurs in `text` (0 when shorter)."""
    words = words_of(text)
    runs = Counter(tuple(words[i : i + ngram]) for i in range(len(words) - ngram + 1))
    return max(runs.values(), default=0)


def looped(text: str, compression_ratio: float | None, compression_limit: float) -> bool:
    """Whether a decoded segment shows a repetition loop."""
    if compression_ratio is not None and compression_ratio > compression_limit:
        return True
    return most_repeated(text) >= REPEATS
