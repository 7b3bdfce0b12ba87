"""Rendering a stored transcript as json, verbose_json, txt, srt, vtt or tsv (and diarized_json).

Transcript text is data, never markup: `srt` and `vtt` write the cues of app/jobs/cues.py,
whose every line is words made one line by app/jobs/plain_text.py, and `txt` and `tsv` write
such lines, so no text can end a cue, start another, add a WebVTT `NOTE`/`STYLE`/`REGION`
block, carry terminal escapes or reverse its display direction. `json` and `verbose_json`
carry the stored text unchanged (JSON escapes it).

Cues come from the words' times where the transcript has them, else from each segment's
text with times shared out by character count (app/jobs/cues.py). `tsv` is one row per
segment, as openai-whisper writes it.

A diarized transcript (segments and words carrying `speaker`, gpu_worker/speakers.py) names
its speakers in every format: `json` and `verbose_json` carry the labels, `vtt` wraps each
cue in a WebVTT voice span (`<v SPEAKER_00>text`), `srt` and `txt` prefix `SPEAKER_00: `, and
no cue holds two speakers' words. The label is added around the cue's text, never inside it,
and only a label of the `SPEAKER_NN` pattern is ever written.
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

from app.jobs.cues import CueOptions, build_cues, seconds, speaker_of
from app.jobs.plain_text import one_line
from gpu_worker.protocol.bounds import finite_or_none

TranscriptFormat = Literal["json", "verbose_json", "txt", "text", "srt", "vtt", "tsv"]
FORMATS: tuple[str, ...] = get_args(TranscriptFormat)

MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "txt": "text/plain; charset=utf-8",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
    "tsv": "text/tab-separated-values; charset=utf-8",
    # OpenAI's endpoint only (response_format=diarized_json): not a transcript download format.
    "diarized_json": "application/json",
}


def vtt_escape(text: str) -> str:
    """Text as WebVTT cue text: `&`, `<` and `>` as character references, so no tag, no
    timestamp tag and no `-->` can be made of it."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clock(value: Any, separator: str) -> str:
    millis = round(seconds(value) * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _segments(transcript: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in transcript.get("segments", []) if isinstance(s, dict)]


_speaker = speaker_of


def _prefixed(seg: dict[str, Any], text: str) -> str:
    """`SPEAKER_00: text` for a diarized segment (srt, txt); the text alone otherwise."""
    speaker = _speaker(seg)
    return f"{speaker}: {text}" if speaker else text


def to_srt(transcript: dict[str, Any], options: CueOptions | None = None) -> str:
    """The transcript's cues (app/jobs/cues.py) as SRT, numbered from 1; a diarized cue's
    first line starts with its speaker's label."""
    blocks = []
    for index, cue in enumerate(build_cues(transcript, options or CueOptions()), start=1):
        start, end = _clock(cue.start, ","), _clock(cue.end, ",")
        text = _prefixed({"speaker": cue.speaker}, "\n".join(cue.lines))
        blocks.append(f"{index}\n{start} --> {end}\n{text}\n")
    return "\n".join(blocks)


def to_vtt(transcript: dict[str, Any], options: CueOptions | None = None) -> str:
    """The transcript's cues (app/jobs/cues.py) as WebVTT, without identifiers; a diarized
    cue in a voice span (`<v SPEAKER_00>`)."""
    blocks = ["WEBVTT\n"]
    for cue in build_cues(transcript, options or CueOptions()):
        start, end = _clock(cue.start, "."), _clock(cue.end, ".")
        text = "\n".join(vtt_escape(line) for line in cue.lines)
        voiced = f"<v {cue.speaker}>{text}" if cue.speaker else text
        blocks.append(f"{start} --> {end}\n{voiced}\n")
    return "\n".join(blocks)


def to_tsv(transcript: dict[str, Any]) -> str:
    """`start`, `end` (integer milliseconds) and `text` per segment, tab-separated under a
    header line, as openai-whisper writes it; the text is one line without tabs."""
    rows = ["start\tend\ttext\n"]
    for seg in _segments(transcript):
        start = round(seconds(seg.get("start")) * 1000)
        end = round(seconds(seg.get("end")) * 1000)
        rows.append(f"{start}\t{end}\t{one_line(seg.get('text'))}\n")
    return "".join(rows)


def to_txt(transcript: dict[str, Any]) -> str:
    """The text; a diarized transcript as one `SPEAKER_00: ...` line per change of speaker."""
    if not transcript.get("speakers"):
        return one_line(transcript.get("text", "")) + "\n"
    lines: list[tuple[str | None, list[str]]] = []
    for seg in _segments(transcript):
        speaker = _speaker(seg)
        if not lines or lines[-1][0] != speaker:
            lines.append((speaker, []))
        text = one_line(seg.get("text"))
        if text:
            lines[-1][1].append(text)
    return "".join(
        _prefixed({"speaker": speaker}, " ".join(texts)) + "\n" for speaker, texts in lines
    )


def to_json(transcript: dict[str, Any]) -> dict[str, Any]:
    """`{"text", "language"}`; a diarized transcript adds its speakers and their segments."""
    # The text, and the language: asked for, or detected (then with its probability).
    body: dict[str, Any] = {"text": transcript.get("text", "")}
    if transcript.get("language"):
        body["language"] = transcript["language"]
    if transcript.get("language_probability") is not None:
        body["language_probability"] = transcript["language_probability"]
    if transcript.get("speakers"):
        body["speakers"] = list(transcript["speakers"])
        body["segments"] = [
            {
                "start": seg["start"],
                "end": seg["end"],
                "text": seg["text"],
                "speaker": _speaker(seg),
            }
            for seg in transcript.get("segments", [])
        ]
    return body


def to_diarized_json(transcript: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `CreateTranscriptionResponseDiarizedJson` (response_format=diarized_json).

    Segment ids are strings there (`seg_000`, ...) and every segment names a speaker; a
    segment the diarizer could not place (none should be) reads `unknown` rather than a guess.
    """
    segments = [
        {
            "type": "transcript.text.segment",
            "id": f"seg_{index:03d}",
            "start": seg["start"],
            "end": seg["end"],
            "text": seg["text"],
            "speaker": _speaker(seg) or "unknown",
        }
        for index, seg in enumerate(transcript.get("segments", []))
    ]
    duration = transcript.get("duration", 0.0)
    return {
        # OpenAI's schema allows only "transcribe" here: diarization does not translate.
        "task": "transcribe",
        "duration": duration,
        "text": transcript.get("text", ""),
        "segments": segments,
        "usage": {"type": "duration", "seconds": round(seconds(duration))},
    }


def to_verbose_json(transcript: dict[str, Any], *, words: bool = True) -> dict[str, Any]:
    """OpenAI's verbose_json shape (segments, words, usage in seconds)."""
    segments: list[dict[str, Any]] = []
    all_words: list[dict[str, Any]] = []
    for seg in transcript.get("segments", []):
        segments.append(
            {
                "id": seg.get("id", len(segments)),
                "seek": seg.get("seek", 0),
                "start": seg["start"],
                "end": seg["end"],
                "text": seg["text"],
                "tokens": seg.get("tokens", []),
                "temperature": seg.get("temperature", 0.0),
                "avg_logprob": seg.get("avg_logprob", 0.0),
                "compression_ratio": seg.get("compression_ratio", 0.0),
                "no_speech_prob": seg.get("no_speech_prob", 0.0),
            }
        )
        if _speaker(seg):
            segments[-1]["speaker"] = _speaker(seg)
        for w in seg.get("words") or []:
            all_words.append({"word": w["word"], "start": w["start"], "end": w["end"]})
            if _speaker(w):
                all_words[-1]["speaker"] = _speaker(w)
    body: dict[str, Any] = {
        "task": transcript.get("task") or "transcribe",
        "language": transcript.get("language", ""),
        "duration": transcript.get("duration", 0.0),
        "text": transcript.get("text", ""),
        "segments": segments,
        "usage": {"type": "duration", "seconds": round(seconds(transcript.get("duration")))},
    }
    if transcript.get("language_probability") is not None:
        body["language_probability"] = transcript["language_probability"]
    if words and all_words:
        body["words"] = all_words
    if transcript.get("speakers"):
        body["speakers"] = list(transcript["speakers"])
    return body


def render(
    transcript: dict[str, Any], fmt: str, options: CueOptions | None = None
) -> tuple[str, str]:
    """(body, media type) of the transcript in `fmt`: one of FORMATS, or `diarized_json` (the
    OpenAI endpoint's); `srt` and `vtt` lay their cues out by `options` (defaults if None)."""
    if fmt == "json":
        body = json.dumps(finite_or_none(to_json(transcript)), allow_nan=False)
    elif fmt == "verbose_json":
        # allow_nan=False: a stored non-finite number is written as null, never as NaN.
        body = json.dumps(finite_or_none(to_verbose_json(transcript)), allow_nan=False)
    elif fmt in ("txt", "text"):
        body = to_txt(transcript)
    elif fmt == "srt":
        body = to_srt(transcript, options)
    elif fmt == "vtt":
        body = to_vtt(transcript, options)
    elif fmt == "tsv":
        body = to_tsv(transcript)
    elif fmt == "diarized_json":
        body = json.dumps(finite_or_none(to_diarized_json(transcript)), allow_nan=False)
    else:
        raise ValueError(fmt)
    return body, MEDIA_TYPES[fmt]
