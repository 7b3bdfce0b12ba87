"""Stored text as one line of plain text that no subtitle or terminal reads as markup."""

from __future__ import annotations

import re
from typing import Any

# Line and paragraph breaks of every kind, and every other C0/C1 control (tab, ESC, DEL):
# each becomes a space. Python's `str.splitlines` (and subtitle parsers built on it) also
# break lines at \x1c-\x1e and \x85, all inside these ranges.
_BREAKS_AND_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# Bidirectional embeddings, overrides, isolates and marks: dropped, so a cue cannot display
# its words in another order than the one stored (the "Trojan Source" trick).
_BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATES = re.compile("[\ud800-\udfff]")
_SPACES = re.compile(" {2,}")
# A timing arrow: two hyphens or more, then ">". One hyphen stays, so "-->" never re-forms.
_ARROWS = re.compile("-{2,}>")


def spaced(text: Any) -> str:
    """`text` with breaks and controls as single spaces, bidi controls dropped and no `-->`;
    its ends are kept (a word's leading space says it starts a new word)."""
    line = str(text) if text is not None else ""
    line = _BIDI_CONTROLS.sub("", line)
    line = _SURROGATES.sub("\ufffd", line)  # unencodable as UTF-8: a replacement character
    line = _BREAKS_AND_CONTROLS.sub(" ", line)
    return _SPACES.sub(" ", no_arrows(line))


def no_arrows(text: str) -> str:
    """`text` with every run of two or more hyphens before `>` as `->`."""
    return _ARROWS.sub("->", text)


def one_line(text: Any) -> str:
    """`text` as one line of plain text: no line breaks, controls, bidi controls or `-->`.

    Breaks and controls become single spaces, runs of spaces one space, and the ends are
    trimmed; the result may be empty.
    """
    return spaced(text).strip()
