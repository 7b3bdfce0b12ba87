"""Who said what: speaker turns onto segments and words, and the DER that scores the turns.

Pure functions (gpu_worker/speakers.py, gpu_worker/diarization_error.py), run in the default
tier; the pyannote pipeline that finds the turns runs in
tests/whisperx/test_whisperx_diarization.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpu_worker.diarization_error import diarization_error
from gpu_worker.protocol.transcript import ResultBody, Segment, Transcript, Word
from gpu_worker.speakers import SpeakerTurn, assign_speakers, speaker_by_overlap

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _segment(start: float, end: float, text: str, words: list[Word] | None = None) -> Segment:
    return Segment(id=0, start=start, end=end, text=text, words=words)


def _transcript(*segments: Segment) -> Transcript:
    return Transcript(text="".join(s.text for s in segments).strip(), segments=list(segments))


def test_each_segment_goes_to_the_speaker_who_covers_most_of_it():
    turns = [SpeakerTurn(0.0, 4.0, "spk7"), SpeakerTurn(4.0, 9.0, "spk2")]
    transcript = _transcript(
        _segment(0.5, 3.5, " one"),
        _segment(3.0, 6.0, " two"),  # 1 s of spk7, 2 s of spk2
        _segment(6.5, 8.5, " three"),
    )

    diarized = assign_speakers(transcript, turns)

    assert [s.speaker for s in diarized.segments] == ["SPEAKER_00", "SPEAKER_01", "SPEAKER_01"]
    assert diarized.speakers == ["SPEAKER_00", "SPEAKER_01"]
    assert diarized.text == transcript.text  # nothing else changes


def test_labels_follow_first_appearance_not_the_diarizers_numbering():
    # The clustering called the second voice 0: the transcript still starts with SPEAKER_00.
    turns = [SpeakerTurn(5.0, 9.0, "SPEAKER_00"), SpeakerTurn(0.0, 4.0, "SPEAKER_01")]
    diarized = assign_speakers(_transcript(_segment(0, 4, " a"), _segment(5, 9, " b")), turns)
    assert [s.speaker for s in diarized.segments] == ["SPEAKER_00", "SPEAKER_01"]


def test_a_speaker_no_segment_names_is_not_listed_and_no_number_is_skipped():
    turns = [
        SpeakerTurn(0.0, 2.0, "x"),
        SpeakerTurn(2.5, 3.0, "cough"),  # a turn without any recognised speech
        SpeakerTurn(4.0, 6.0, "y"),
    ]
    diarized = assign_speakers(_transcript(_segment(0, 2, " a"), _segment(4, 6, " b")), turns)
    assert diarized.speakers == ["SPEAKER_00", "SPEAKER_01"]
    assert [s.speaker for s in diarized.segments] == ["SPEAKER_00", "SPEAKER_01"]


def test_a_segment_outside_every_turn_takes_the_nearest_speaker():
    turns = [SpeakerTurn(0.0, 2.0, "x"), SpeakerTurn(10.0, 12.0, "y")]
    diarized = assign_speakers(
        _transcript(_segment(2.5, 3.0, " near x"), _segment(8.0, 9.5, " near y")), turns
    )
    assert [s.speaker for s in diarized.segments] == ["SPEAKER_00", "SPEAKER_01"]


def test_a_segment_is_split_where_its_words_change_speaker():
    words = [
        Word(word=" I", start=0.2, end=0.4),
        Word(word=" heard", start=0.4, end=0.9),
        Word(word=" This", start=1.2, end=1.5),  # inside y's turn
        Word(word=" is", start=1.5, end=1.7),
        Word(word=" Diane.", start=2.1, end=2.6),  # back to x
    ]
    turns = [SpeakerTurn(0.0, 1.0, "x"), SpeakerTurn(1.0, 1.8, "y"), SpeakerTurn(2.0, 2.9, "x")]
    segment = Segment(
        id=0, start=0.0, end=3.0, text=" I heard This is Diane.", tokens=[1, 2], words=words
    )
    diarized = assign_speakers(_transcript(segment), turns)

    pieces = diarized.segments
    assert [p.text for p in pieces] == [" I heard", " This is", " Diane."]
    assert [p.speaker for p in pieces] == ["SPEAKER_00", "SPEAKER_01", "SPEAKER_00"]
    assert [(p.start, p.end) for p in pieces] == [(0.0, 0.9), (1.2, 1.7), (2.1, 3.0)]
    assert [p.id for p in pieces] == [0, 1, 2]
    for piece in pieces:  # no piece mixes two voices
        assert piece.words and {w.speaker for w in piece.words} == {piece.speaker}
    assert "".join(p.text for p in pieces) == segment.text
    assert diarized.text == _transcript(segment).text
    assert diarized.speakers == ["SPEAKER_00", "SPEAKER_01"]


def test_bare_aligned_words_are_joined_with_spaces_when_split():
    # WhisperX's aligned words carry no leading space.
    words = [Word(word="Hello?", start=0.1, end=0.5), Word(word="Hello?", start=1.1, end=1.5)]
    turns = [SpeakerTurn(0.0, 0.8, "a"), SpeakerTurn(1.0, 1.8, "b")]
    diarized = assign_speakers(_transcript(_segment(0.0, 1.8, " Hello? Hello?", words)), turns)
    assert [(s.text, s.speaker) for s in diarized.segments] == [
        (" Hello?", "SPEAKER_00"),
        (" Hello?", "SPEAKER_01"),
    ]


def test_a_word_outside_every_turn_takes_the_nearest_speaker():
    words = [Word(word=" yes", start=0.2, end=0.6), Word(word=" um", start=3.0, end=3.2)]
    turns = [SpeakerTurn(0.0, 1.0, "x"), SpeakerTurn(2.5, 2.9, "y")]
    diarized = assign_speakers(_transcript(_segment(0.0, 3.2, " yes um", words)), turns)
    assert [(s.text, s.speaker) for s in diarized.segments] == [
        (" yes", "SPEAKER_00"),
        (" um", "SPEAKER_01"),
    ]


def test_word_lists_are_dropped_when_word_timestamps_were_not_asked_but_still_split():
    words = [Word(word=" yes", start=0.2, end=0.6), Word(word=" no", start=1.2, end=1.6)]
    turns = [SpeakerTurn(0, 1, "x"), SpeakerTurn(1, 2, "y")]
    diarized = assign_speakers(_transcript(_segment(0, 2, " yes no", words)), turns, words=False)
    assert [(s.text, s.speaker, s.words) for s in diarized.segments] == [
        (" yes", "SPEAKER_00", None),
        (" no", "SPEAKER_01", None),
    ]


def test_equal_overlap_goes_to_the_speaker_heard_first():
    turns = [SpeakerTurn(0.0, 1.0, "late"), SpeakerTurn(1.0, 2.0, "early")]
    assert speaker_by_overlap(0.5, 1.5, turns) == "late"


def test_no_turns_leave_segments_unlabelled():
    diarized = assign_speakers(_transcript(_segment(0, 1, " a")), [])
    assert diarized.segments[0].speaker is None
    assert diarized.speakers == []


def test_speaker_fields_travel_in_the_result_body_and_are_absent_without_diarization():
    plain = _transcript(_segment(0, 1, " a", [Word(word=" a", start=0, end=1)]))
    assert "speakers" not in plain.to_json()
    assert "speaker" not in plain.to_json()["segments"][0]

    diarized = assign_speakers(plain, [SpeakerTurn(0, 1, "x")])
    body = ResultBody(transcript=diarized, processing_seconds=1.0).to_json()
    parsed = ResultBody.model_validate(body).transcript  # as the control plane reads it
    assert parsed.speakers == ["SPEAKER_00"]
    assert parsed.segments[0].speaker == "SPEAKER_00"
    assert parsed.segments[0].words is not None
    assert parsed.segments[0].words[0].speaker == "SPEAKER_00"


@pytest.mark.parametrize("label", ["alice", "SPEAKER_0", "SPEAKER_0000", "SPEAKER_01\n"])
def test_a_speaker_label_outside_the_protocols_form_is_refused(label):
    with pytest.raises(ValidationError):
        Segment(start=0, end=1, text="a", speaker=label)


# DER


def _turns(*items: tuple[float, float, str]) -> list[SpeakerTurn]:
    return [SpeakerTurn(start, end, speaker) for start, end, speaker in items]


def test_der_is_zero_for_a_perfect_answer_under_other_names():
    reference = _turns((0, 4, "A"), (5, 9, "B"), (10, 12, "A"))
    hypothesis = _turns((0, 4, "SPEAKER_01"), (5, 9, "SPEAKER_00"), (10, 12, "SPEAKER_01"))
    assert diarization_error(reference, hypothesis).rate == pytest.approx(0.0)


def test_der_counts_missed_speech_false_alarms_and_confusion():
    reference = _turns((0, 4, "A"), (5, 9, "B"))  # 8 s of speech
    hypothesis = _turns(
        (0, 3, "x"),  # 1 s of A missed
        (5, 8, "y"),
        (8, 9, "x"),  # 1 s of B given to A's speaker
        (9, 10, "y"),  # 1 s of speech where there is none
    )
    error = diarization_error(reference, hypothesis)
    assert error.reference_seconds == pytest.approx(8.0)
    assert error.missed_seconds == pytest.approx(1.0)
    assert error.false_alarm_seconds == pytest.approx(1.0)
    assert error.confusion_seconds == pytest.approx(1.0)
    assert error.rate == pytest.approx(3 / 8)


def test_der_of_one_speaker_for_everyone_is_the_other_speakers_share():
    reference = _turns((0, 6, "A"), (6, 8, "B"))
    error = diarization_error(reference, _turns((0, 8, "only")))
    assert error.rate == pytest.approx(2 / 8)


def test_the_collar_leaves_boundaries_unscored():
    reference = _turns((0, 4, "A"), (4, 8, "B"))
    hypothesis = _turns((0, 4.2, "x"), (4.2, 8, "y"))
    assert diarization_error(reference, hypothesis).rate > 0
    assert diarization_error(reference, hypothesis, collar=0.5).rate == pytest.approx(0.0)


def test_the_two_voice_fixture_has_six_alternating_turns():
    truth = json.loads((FIXTURES / "two-voices.json").read_text())
    speakers = [turn["speaker"] for turn in truth["turns"]]
    assert speakers == ["A", "B", "A", "B", "A", "B"]
    ends = [0.0] + [turn["end"] for turn in truth["turns"]]
    for previous_end, turn in zip(ends, truth["turns"], strict=False):
        assert turn["start"] >= previous_end and turn["end"] > turn["start"]
    assert truth["turns"][-1]["end"] <= truth["duration"]
