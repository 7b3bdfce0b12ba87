"""The cut planner (app/jobs/cuts.py) on random loudness: its spans cover the file in order,
their lengths stay within their bounds, and each cut is the quietest spot near its nominal
boundary; and the loudness of a real recording puts the cuts in its pauses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.config import ConfigError, load_settings
from app.jobs.cuts import (
    CUT_FACTOR,
    FRAME_SECONDS,
    Loudness,
    _smoothed,
    part_count,
    plan_spans,
    search_radius,
)
from app.jobs.loudness import measure_loudness
from tests.conftest import FIXTURES

EPS = 1e-6


@st.composite
def jobs(draw: st.DrawFn) -> tuple[float, Loudness, float]:
    part_seconds = draw(st.sampled_from([30.0, 60.0, 120.0, 300.0]))
    duration = draw(st.floats(min_value=1.0, max_value=8 * part_seconds))
    frames = int(duration / FRAME_SECONDS) + draw(st.integers(-3, 3))
    # Levels from a few distinct values, so ties (equally quiet spots) happen often.
    values = draw(st.lists(st.sampled_from([-90.0, -60.0, -30.0, -12.0]), min_size=1, max_size=8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    levels = rng.choice(np.asarray(values, dtype=np.float32), size=max(frames, 0))
    return duration, Loudness(FRAME_SECONDS, levels.astype(np.float32)), part_seconds


@given(jobs())
def test_the_spans_cover_the_file_in_order_within_their_bounds(
    job: tuple[float, Loudness, float],
) -> None:
    duration, loudness, part_seconds = job
    spans = plan_spans(duration, loudness, part_seconds)
    count = part_count(duration, part_seconds)
    assert len(spans) == count
    assert spans[0].start == 0.0 and spans[-1].end == duration
    assert [s.index for s in spans] == list(range(count))
    for left, right in zip(spans, spans[1:], strict=False):
        assert left.end == right.start
    if duration < CUT_FACTOR * part_seconds:
        assert count == 1
        return
    assert count >= 2
    nominal = duration / count
    radius = search_radius(duration, count)
    for span in spans:
        assert span.seconds > 0
        assert nominal - 2 * radius - EPS <= span.seconds <= nominal + 2 * radius + EPS
        assert span.seconds >= nominal / 2 - EPS


@given(jobs())
def test_each_cut_is_the_quietest_spot_near_its_nominal_boundary(
    job: tuple[float, Loudness, float],
) -> None:
    duration, loudness, part_seconds = job
    spans = plan_spans(duration, loudness, part_seconds)
    if len(spans) == 1:
        return
    smooth = _smoothed(loudness)
    nominal = duration / len(spans)
    radius = search_radius(duration, len(spans))
    for k, span in enumerate(spans[1:], start=1):
        cut = span.start
        low, high = k * nominal - radius, k * nominal + radius
        assert low - EPS <= cut <= high + EPS
        frames = [i for i in range(smooth.size) if low <= (i + 0.5) * FRAME_SECONDS <= high]
        if not frames:
            continue
        at = round(cut / FRAME_SECONDS - 0.5)
        quietest = min(smooth[i] for i in frames)
        assert smooth[at] == quietest
        # Among equally quiet spots, the one nearest the nominal boundary.
        ties = [(i + 0.5) * FRAME_SECONDS for i in frames if smooth[i] == quietest]
        assert abs(cut - k * nominal) <= min(abs(t - k * nominal) for t in ties) + EPS


def test_a_real_recording_is_cut_in_its_pauses() -> None:
    """speech-90s four times over (6 min), cut in parts of 120 s: three parts, each cut in a
    pause of the speech (a level far below the speech's own)."""
    one = measure_loudness(FIXTURES / "speech-90s.wav", 1e9)
    loudness = Loudness(FRAME_SECONDS, np.concatenate([one.levels] * 4))
    duration = loudness.levels.size * FRAME_SECONDS
    spans = plan_spans(duration, loudness, 120.0)
    assert len(spans) == 3
    smooth = _smoothed(loudness)
    speech = float(np.median(loudness.levels))
    for span in spans[1:]:
        level = smooth[round(span.start / FRAME_SECONDS - 0.5)]
        assert level < speech - 20, (span, level, speech)


def test_part_seconds_is_off_or_at_least_thirty_seconds(tmp_path: object) -> None:
    assert load_settings(env={}).jobs.part_seconds == 300  # the default (docs/fleet.md)
    assert load_settings(env={"MURMUR_PART_SECONDS": "0"}).jobs.part_seconds == 0
    assert load_settings(env={"MURMUR_PART_SECONDS": "300"}).jobs.part_seconds == 300
    assert load_settings(env={"MURMUR_PART_SECONDS": "120"}).jobs.part_seconds == 120
    with pytest.raises(ConfigError) as refused:
        load_settings(env={"MURMUR_PART_SECONDS": "10"})
    assert "jobs.part_seconds" in str(refused.value)
    assert "at least 30" in str(refused.value)
