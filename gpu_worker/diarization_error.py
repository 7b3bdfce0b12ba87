"""Diarization error rate (DER): how far found speaker turns are from the true ones (pure).

DER = (missed speech + false alarm + speaker confusion) / reference speech, the NIST measure
pyannote.metrics reports, computed here on 10 ms frames. Hypothesis speakers are matched to
reference speakers one to one by the mapping that maximises their shared time, so the labels'
names never matter ("A" may be SPEAKER_01). A `collar` around every reference boundary is not
scored, as NIST scoring allows for imprecise hand-marked boundaries.

Used by the diarization tests and bench/diarization.py; the worker never scores itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_worker.speakers import SpeakerTurn

FRAME_SECONDS = 0.01
# Exhaustive matching up to this many speakers (8! mappings); greedy beyond it.
_EXHAUSTIVE_UP_TO = 8


@dataclass(frozen=True)
class DiarizationError:
    """The components of DER, in seconds, and the rate itself."""

    reference_seconds: float
    missed_seconds: float
    false_alarm_seconds: float
    confusion_seconds: float

    @property
    def rate(self) -> float:
        if self.reference_seconds == 0:
            return 0.0 if self.false_alarm_seconds == 0 else float("inf")
        wrong = self.missed_seconds + self.false_alarm_seconds + self.confusion_seconds
        return wrong / self.reference_seconds


def _frames(turns: Iterable[SpeakerTurn], count: int) -> list[set[str]]:
    active: list[set[str]] = [set() for _ in range(count)]
    for turn in turns:
        first = max(0, round(turn.start / FRAME_SECONDS))
        last = min(count, round(turn.end / FRAME_SECONDS))
        for index in range(first, last):
            active[index].add(turn.speaker)
    return active


def _best_mapping(
    shared: dict[tuple[str, str], int], hyp: list[str], ref: list[str]
) -> dict[str, str]:
    """Hypothesis label -> reference label, one to one, maximising the frames they share."""
    if max(len(hyp), len(ref)) <= _EXHAUSTIVE_UP_TO:
        best: tuple[int, dict[str, str]] = (-1, {})
        short, long_ = (hyp, ref) if len(hyp) <= len(ref) else (ref, hyp)
        for chosen in itertools.permutations(long_, len(short)):
            pairs = dict(zip(short, chosen, strict=True))
            candidate = pairs if short is hyp else {h: r for r, h in pairs.items()}
            score = sum(shared.get((h, r), 0) for h, r in candidate.items())
            if score > best[0]:
                best = (score, candidate)
        return best[1]
    mapping: dict[str, str] = {}
    for (h, r), _ in sorted(shared.items(), key=lambda item: -item[1]):
        if h not in mapping and r not in mapping.values():
            mapping[h] = r
    return mapping


def diarization_error(
    reference: Sequence[SpeakerTurn],
    hypothesis: Sequence[SpeakerTurn],
    *,
    collar: float = 0.0,
) -> DiarizationError:
    """DER of `hypothesis` against `reference`, with `collar` seconds around boundaries unscored."""
    end = max((turn.end for turn in [*reference, *hypothesis]), default=0.0)
    count = round(end / FRAME_SECONDS) + 1
    ref_frames = _frames(reference, count)
    hyp_frames = _frames(hypothesis, count)
    scored = [True] * count
    if collar > 0:
        half = round(collar / FRAME_SECONDS)
        for turn in reference:
            for boundary in (turn.start, turn.end):
                centre = round(boundary / FRAME_SECONDS)
                for index in range(max(0, centre - half), min(count, centre + half)):
                    scored[index] = False

    shared: dict[tuple[str, str], int] = {}
    for index in range(count):
        if scored[index]:
            for h in hyp_frames[index]:
                for r in ref_frames[index]:
                    shared[h, r] = shared.get((h, r), 0) + 1
    hyp_labels = sorted({turn.speaker for turn in hypothesis})
    ref_labels = sorted({turn.speaker for turn in reference})
    mapping = _best_mapping(shared, hyp_labels, ref_labels)

    total = missed = false_alarm = confusion = 0
    for index in range(count):
        if not scored[index]:
            continue
        ref, hyp = ref_frames[index], hyp_frames[index]
        total += len(ref)
        missed += max(0, len(ref) - len(hyp))
        false_alarm += max(0, len(hyp) - len(ref))
        matched = sum(1 for h in hyp if mapping.get(h) in ref)
        confusion += min(len(ref), len(hyp)) - matched
    return DiarizationError(
        reference_seconds=total * FRAME_SECONDS,
        missed_seconds=missed * FRAME_SECONDS,
        false_alarm_seconds=false_alarm * FRAME_SECONDS,
        confusion_seconds=confusion * FRAME_SECONDS,
    )
