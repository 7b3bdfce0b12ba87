"""Subtitle cues a person can read, cut from a transcript's words at sentences, clauses, pauses."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.jobs.plain_text import no_arrows, spaced
from gpu_worker.protocol.bounds import MAX_SECONDS

# The query options' defaults and bounds (GET /v1/jobs/{id}/transcript, docs/api.md).
MAX_LINE_WIDTH, LINE_WIDTH_RANGE = 42, (10, 200)
MAX_LINE_COUNT, LINE_COUNT_RANGE = 2, (1, 10)
WORDS_PER_LINE_RANGE = (1, 100)
# Netflix's timed-text style guide: a cue shows from 5/6 s (20 frames) to 7 s, and adult
# viewers read up to 20 characters a second.
MAX_CUE_SECONDS = 7.0
MIN_CUE_SECONDS = 5 / 6
READING_CHARS_PER_SECOND = 20.0
# A silence this long ends a cue even where the next words would fit in it.
CLOSING_PAUSE = 1.5
# A silence this long is a place to break a cue or a line (after sentences and clauses).
PAUSE = 0.4

# Closing quotes and brackets may follow the punctuation that ends a sentence or a clause.
_CLOSERS = "[\"')\\]}\u00bb\u201d\u2019]*$"
_SENTENCE_END = re.compile("[.?!\u2026\u3002\uff1f\uff01\u061f\u0964]" + _CLOSERS)
_CLAUSE_END = re.compile("[,;:\u2014\u2013\u3001\uff0c\uff1b\uff1a\u060c]" + _CLOSERS)
# Lines break before these (English conjunctions and prepositions) ...
_BREAK_BEFORE_TEXT = (
    "and but or nor so yet because although though while if when where whereas which who whom "
    "whose that than as until unless since after before of in on at to for with from by about "
    "into onto over under through between without within during against among across"
)
_BREAK_BEFORE = frozenset(_BREAK_BEFORE_TEXT.split())
# ... and never after these (articles and possessives), where the text allows.
_NO_BREAK_AFTER_TEXT = "a an the my your his her its our their this these those"
_NO_BREAK_AFTER = frozenset(_NO_BREAK_AFTER_TEXT.split())
_EDGE_PUNCTUATION = re.compile(r"^\W+|\W+$")
_WORD = re.compile(r"\S+")
# What a stored speaker label may be (gpu_worker/protocol/transcript.py, `SpeakerLabel`).
SPEAKER = re.compile(r"SPEAKER_[0-9]{2,3}")


@dataclass(frozen=True)
class CueOptions:
    """How cues are laid out: lines per cue, characters and words per line."""

    max_line_width: int = MAX_LINE_WIDTH
    max_line_count: int = MAX_LINE_COUNT
    max_words_per_line: int | None = None


@dataclass(frozen=True)
class Cue:
    """One subtitle cue: its times in seconds, its lines of text, its speaker (if diarized)."""

    start: float
    end: float
    lines: tuple[str, ...]
    speaker: str | None = None


@dataclass(frozen=True)
class Token:
    """A word as cues place it: its text (no spaces), whether a space precedes it, its times."""

    text: str
    spaced: bool
    start: float
    end: float
    speaker: str | None


def seconds(value: Any) -> float:
    """A stored time as a finite number of seconds in range (a bad stored value reads as 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return min(max(float(value), 0.0), MAX_SECONDS)


def speaker_of(item: dict[str, Any]) -> str | None:
    """A segment's or word's speaker label, or None (not diarized, or a bad stored value)."""
    speaker = item.get("speaker")
    return speaker if isinstance(speaker, str) and SPEAKER.fullmatch(speaker) else None


def _pieces(
    text: str, start: float, end: float, lead: bool
) -> Iterator[tuple[str, bool, float, float]]:
    """`text`'s words (runs of non-space), each with whether a space precedes it (`lead`: one
    precedes the text) and the share of start..end its characters take."""
    words = list(_WORD.finditer(text))
    total = sum(len(w.group()) for w in words) or 1
    done = 0
    for word in words:
        begin = start + (end - start) * done / total
        done += len(word.group())
        yield word.group(), word.start() > 0 or lead, begin, start + (end - start) * done / total


def _spaced_in(text: str, words: list[str]) -> list[bool]:
    """Whether a space precedes each word in its segment's `text`: WhisperX's words carry
    no leading space, faster-whisper's do, and neither does between CJK characters."""
    leads, position = [], 0
    for word in words:
        core = word.strip()
        # The next word follows within a few characters (spaces, or a stored mismatch).
        found = text.find(core, position, position + len(core) + 16) if core else -1
        leads.append(found > 0 and text[found - 1].isspace())
        position = found + len(core) if found >= 0 else position
    return leads


def tokens(transcript: dict[str, Any]) -> list[Token]:
    """The transcript's words in order: from each segment's `words` where it has them, else
    from its text with times shared out by character count."""
    out: list[Token] = []
    for seg in transcript.get("segments", []):
        if not isinstance(seg, dict):
            continue
        seg_speaker = speaker_of(seg)
        words = [w for w in seg.get("words") or [] if isinstance(w, dict)]
        timed = (
            [(spaced(w.get("word")), w.get("start"), w.get("end"), w) for w in words]
            if words
            else [(spaced(seg.get("text")), seg.get("start"), seg.get("end"), seg)]
        )
        leads = _spaced_in(spaced(seg.get("text")), [text for text, *_ in timed])
        first = True
        for (text, start, end, item), lead in zip(timed, leads, strict=True):
            begin = seconds(start)
            finish = max(seconds(end), begin)
            speaker = speaker_of(item) or seg_speaker
            for word, space, w_start, w_end in _pieces(text, begin, finish, lead):
                # A segment's first word starts a new word (segments are joined with a space).
                space = (space or first) and bool(out)
                out.append(Token(word, space, w_start, w_end, speaker))
                first = False
    return _monotonic(out)


def _monotonic(items: list[Token]) -> list[Token]:
    """Each word starting no earlier than the one before it, and ending no earlier than it
    starts (stored times may be out of order)."""
    fixed: list[Token] = []
    floor = 0.0
    for t in items:
        start = max(t.start, floor)
        fixed.append(Token(t.text, t.spaced, start, max(t.end, start), t.speaker))
        floor = start
    return fixed


def _split_long(items: list[Token], width: int) -> list[Token]:
    """Words longer than a line cut into line-wide pieces (joined again without a space)."""
    out: list[Token] = []
    for t in items:
        if len(t.text) <= width:
            out.append(t)
            continue
        parts = [t.text[i : i + width] for i in range(0, len(t.text), width)]
        span = t.end - t.start
        for index, part in enumerate(parts):
            begin = t.start + span * index / len(parts)
            end = t.start + span * (index + 1) / len(parts)
            out.append(Token(part, t.spaced if index == 0 else False, begin, end, t.speaker))
    return out


def join(items: list[Token] | tuple[Token, ...]) -> str:
    """The words as one line: each after a space where the transcript had one."""
    text = "".join((" " if t.spaced and i else "") + t.text for i, t in enumerate(items))
    return no_arrows(text)


def _bare(text: str) -> str:
    return _EDGE_PUNCTUATION.sub("", text).lower()


def break_score(items: list[Token] | tuple[Token, ...], index: int) -> float:
    """How good a place the point after `items[index]` is to end a cue or a line: sentence
    ends first, then clause punctuation, then pauses, then before a conjunction or
    preposition; after an article or a possessive, worst."""
    word = items[index].text
    following = items[index + 1] if index + 1 < len(items) else None
    gap = following.start - items[index].end if following else 0.0
    if _SENTENCE_END.search(word):
        score = 100.0
    elif _CLAUSE_END.search(word):
        score = 60.0
    elif gap >= PAUSE:
        score = 40.0 + 5 * min(gap, 2.0)
    elif following is not None and not following.spaced:
        return -100.0  # inside a word cut to fit a line, or between unspaced characters
    elif following is not None and _bare(following.text) in _BREAK_BEFORE:
        score = 20.0
    else:
        score = 0.0
    if _bare(word) in _NO_BREAK_AFTER:
        score -= 50.0
    return score


def chars(items: list[Token] | tuple[Token, ...]) -> int:
    """The length of `join(items)` at most (without building it)."""
    return sum(len(t.text) + (t.spaced and i > 0) for i, t in enumerate(items))


class _Layout:
    """Fitting words into the lines of one cue."""

    def __init__(self, options: CueOptions) -> None:
        self.width = options.max_line_width
        self.count = options.max_line_count
        self.words = options.max_words_per_line or 10**6

    def _widths(self, items: tuple[Token, ...], begin: int) -> Iterator[int]:
        """The width of each line from items[begin] that fits: ending at begin+1, begin+2..."""
        width = 0
        for end in range(begin, min(len(items), begin + self.words)):
            width += len(items[end].text) + (end > begin and items[end].spaced)
            if width > self.width and end > begin:
                return
            yield width

    def line_count(self, items: tuple[Token, ...], most: int = 10**6) -> int:
        """The fewest lines the words take (filling each line in turn is optimal), counted up
        to one more than `most`."""
        lines, begin = 0, 0
        while begin < len(items) and lines <= most:
            begin += max(1, sum(1 for _ in self._widths(items, begin)))
            lines += 1
        return lines

    def add(self, filled: tuple[int, int, int], token: Token) -> tuple[int, int, int]:
        """(lines, last line's width, its words) once `token` follows words filled so."""
        lines, width, words = filled
        if lines and words < self.words and width + token.spaced + len(token.text) <= self.width:
            return lines, width + token.spaced + len(token.text), words + 1
        return lines + 1, len(token.text), 1

    def filled(self, items: list[Token]) -> tuple[int, int, int]:
        state = (0, 0, 0)
        for token in items:
            state = self.add(state, token)
        return state

    def fits(self, items: list[Token], token: Token, filled: tuple[int, int, int]) -> bool:
        """Whether `token` fits in the cue of `items` (filled so), lines and duration."""
        if items and token.end - items[0].start > MAX_CUE_SECONDS:
            return False
        return self.add(filled, token)[0] <= self.count

    def lines(self, items: tuple[Token, ...]) -> tuple[str, ...]:
        """The words in the fewest lines, broken where the lines are most even and the breaks
        best placed (dynamic programming over the break points)."""
        count = self.line_count(items)
        n = len(items)
        scores = [3 * break_score(items, i - 1) if 0 < i < n else 0.0 for i in range(n + 1)]
        # best[k][i]: the least cost of the first i words in k lines, and where line k began.
        best = [[(math.inf, 0)] * (n + 1) for _ in range(count + 1)]
        best[0][0] = (0.0, 0)
        for k in range(1, count + 1):
            for begin in range(n):
                before = best[k - 1][begin][0]
                if before == math.inf:
                    continue
                for length, width in enumerate(self._widths(items, begin), start=1):
                    slack = self.width - width
                    cost = before + slack * slack - scores[begin + length]
                    if cost < best[k][begin + length][0]:
                        best[k][begin + length] = (cost, begin)
        lines: list[str] = []
        end = n
        for k in range(count, 0, -1):
            begin = best[k][end][1]
            lines.append(join(items[begin:end]))
            end = begin
        return tuple(reversed(lines))


def _cue_break(items: list[Token], layout: _Layout, sentence_rest: int) -> int:
    """Where a cue that cannot take its last word ends: the number of words it keeps, at the
    best-placed break, later breaks preferred (cues as full as they may be), but not leaving
    a sentence's last few words to a cue of their own (`sentence_rest`: the characters of
    that sentence after `items`)."""
    total = chars(items)
    capacity = layout.width * layout.count
    best, where = -math.inf, len(items) - 1
    kept = 0
    for index in range(len(items) - 1):
        kept += len(items[index].text) + (index > 0 and items[index].spaced)
        score = break_score(items, index) + 40 * kept / max(total, 1)
        if kept < capacity / 3:
            score -= 50  # a short flash of a few words, and a crowded next cue
        tail = total - kept + sentence_rest
        if tail < capacity / 4 and not _SENTENCE_END.search(items[index].text):
            score -= 60  # a sentence's tail alone
        if score > best:
            best, where = score, index + 1
    return where


def _ends_cue(run: list[Token], index: int, current: list[Token], layout: _Layout) -> bool:
    """Whether the cue ends after run[index] (its last word so far, `current` its words): at a
    long pause, or at a sentence end, unless no pause follows and the whole next sentence
    fits in the cue's lines left (a sentence in a cue starts a line)."""
    if index + 1 >= len(run):
        return False
    following = run[index + 1]
    gap = following.start - run[index].end
    if gap >= CLOSING_PAUSE:
        return True
    if not _SENTENCE_END.search(run[index].text):
        return False
    if gap >= PAUSE:
        return True
    room = layout.width * layout.count - chars(current)
    end = index + 1
    while not _SENTENCE_END.search(run[end].text) and end + 1 < len(run):
        room -= len(run[end].text) + 1
        if room < 0:
            return True
        end += 1
    following_sentence = tuple(run[index + 1 : end + 1])
    if following_sentence[-1].end - current[0].start > MAX_CUE_SECONDS:
        return True
    lines = layout.line_count(tuple(current)) + layout.line_count(following_sentence)
    return lines > layout.count


def _sentence_rest(run: list[Token], index: int, layout: _Layout) -> int:
    """The characters of run[index]'s sentence after it (counted up to a cue's capacity)."""
    rest, end = 0, index
    capacity = layout.width * layout.count
    while not _SENTENCE_END.search(run[end].text) and end + 1 < len(run) and rest <= capacity:
        end += 1
        rest += len(run[end].text) + 1
    return rest


def _group(run: list[Token], layout: _Layout) -> list[tuple[Token, ...]]:
    """One speaker's words cut into cues."""
    groups: list[tuple[Token, ...]] = []
    current: list[Token] = []
    filled = layout.filled(current)
    for index, token in enumerate(run):
        if current and not layout.fits(current, token, filled):
            keep = _cue_break([*current, token], layout, _sentence_rest(run, index, layout))
            groups.append(tuple(current[:keep]))
            current = current[keep:]
            filled = layout.filled(current)
            if current and not layout.fits(current, token, filled):
                groups.append(tuple(current))
                current, filled = [], layout.filled([])
        current.append(token)
        filled = layout.add(filled, token)
        if _ends_cue(run, index, current, layout):
            groups.append(tuple(current))
            current, filled = [], layout.filled([])
    if current:
        groups.append(tuple(current))
    return groups


def _runs(items: list[Token]) -> Iterator[list[Token]]:
    """The words in runs of one speaker each."""
    run: list[Token] = []
    for token in items:
        if run and token.speaker != run[-1].speaker:
            yield run
            run = []
        run.append(token)
    if run:
        yield run


def _timed(groups: list[tuple[Token, ...]], layout: _Layout, duration: float) -> list[Cue]:
    """Cues at their words' times, none overlapping the next, each at most MAX_CUE_SECONDS
    and held, where the next cue (or the audio's end, for the last) leaves room, long enough
    to see and to read."""
    cues: list[Cue] = []
    previous_end = 0.0
    for index, group in enumerate(groups):
        last = index + 1 == len(groups)
        start = max(group[0].start, previous_end)
        room = max(duration if last else groups[index + 1][0].start, start)
        end = max(min(max(t.end for t in group), start + MAX_CUE_SECONDS), start)
        if not last:
            end = min(end, room)
        lines = layout.lines(group)
        wanted = max(MIN_CUE_SECONDS, sum(len(line) for line in lines) / READING_CHARS_PER_SECOND)
        if end - start < wanted:
            end = max(end, min(start + wanted, room, start + MAX_CUE_SECONDS))
        cues.append(Cue(start, end, lines, group[0].speaker))
        previous_end = end
    return cues


def build_cues(transcript: dict[str, Any], options: CueOptions) -> list[Cue]:
    """The transcript's words as subtitle cues: together exactly its words, in order; each
    of one speaker, at most `max_line_count` lines of at most `max_line_width` characters
    (and `max_words_per_line` words), at most MAX_CUE_SECONDS long, none overlapping."""
    layout = _Layout(options)
    items = _split_long(tokens(transcript), options.max_line_width)
    groups: list[tuple[Token, ...]] = []
    for run in _runs(items):
        groups.extend(g for g in _group(run, layout) if g)
    return _timed(groups, layout, seconds(transcript.get("duration")))
