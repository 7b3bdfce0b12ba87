"""Whatever bytes arrive, the probe answers with facts or a 400/413 code, reading a bounded amount.

Hypothesis feeds it random bytes and real files damaged the ways files get damaged: bits
flipped, cut short, header fields overwritten, a stretch repeated. Examples and their time are
bounded (max_examples, deadline); the database is off so nothing but the probe reads files.
The process's read counter (/proc/self/io) and the thread's CPU clock measure the work.
"""

from __future__ import annotations

import io
import re
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

import app.audio
from app.audio import AudioInfo, probe_audio
from app.config import Settings
from app.errors import Refused
from gpu_worker.audio import SAMPLE_RATE, AudioTooLong, decode_bounded
from tests.audio_encode import FORMATS, encode, lying_flac, silence, xingless_vbr_mp3
from tests.conftest import FIXTURES, auth

LIMIT = 30.0
CPU_ALLOWANCE = app.audio._CPU_BASE_SECONDS + LIMIT / app.audio._CPU_REAL_TIME_FACTOR
REFUSALS = {
    (400, "empty_file"),
    (400, "invalid_audio"),
    (413, "audio_too_long"),
    (413, "audio_too_complex"),
}
BOUNDED = examples(
    max_examples=150,
    deadline=5000,  # ms per example: generous for a shared machine; the files are small
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@cache
def seeds() -> dict[str, bytes]:
    """Small real files of every kind the service takes, some longer than LIMIT."""
    short = FIXTURES / "speech-short.wav"
    files = {
        "speech-short.wav": short.read_bytes(),
        "silence-5s.wav": (FIXTURES / "silence-5s.wav").read_bytes(),
        "lying.flac": lying_flac(seconds=60, stated_seconds=5),
        "vbr.mp3": xingless_vbr_mp3(seconds=40),
        "silence.ogg": silence("ogg", "libopus", 48000, 40),
    }
    for container, codec, ext, rate in FORMATS:
        files[f"speech.{ext}"] = encode(short, container, codec, rate)
    return files


def _bytes_read() -> int:
    match = re.search(r"^rchar: (\d+)$", Path("/proc/self/io").read_text(), re.M)
    assert match is not None
    return int(match[1])


def check(data: bytes) -> AudioInfo | None:
    """Probe `data`; assert the answer is facts within the limit or a refusal with a code."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "upload.bin"
        path.write_bytes(data)
        before, cpu = _bytes_read(), time.thread_time()
        try:
            info = probe_audio(path, LIMIT)
        except Refused as err:
            assert (err.status, err.code) in REFUSALS, (err.status, err.code, err.message)
            assert err.message
            info = None
        # The work is bounded by the probe's CPU allowance (checked every 64 packets: slack).
        assert time.thread_time() - cpu <= CPU_ALLOWANCE + 1.0
        # And reading does not run away. Not "the file once": FFmpeg's Ogg demuxer seeks back
        # about 16 KB per page while it reads headers (a damaged 89 KB file read 1.7 MB).
        assert _bytes_read() - before <= 64 * len(data) + 2 * 1024 * 1024
        if info is not None:
            assert 0 < info.duration_seconds <= LIMIT
            # The worker never decodes past the limit either, whatever the probe made of it.
            try:
                samples = decode_bounded(path, LIMIT, expected_seconds=info.duration_seconds)
            except AudioTooLong:
                pytest.fail("the worker found audio past the limit that the probe accepted")
            except Exception:  # noqa: BLE001 - a file the worker cannot decode fails its job
                return info
            assert samples.shape[0] <= (LIMIT + 0.1) * SAMPLE_RATE
        return info


def _flip_bits(data: bytes, positions: list[int]) -> bytes:
    out = bytearray(data)
    for position in positions:
        index = position % (len(out) * 8)
        out[index // 8] ^= 1 << (index % 8)
    return bytes(out)


def _truncate(data: bytes, fraction: float) -> bytes:
    return data[: int(len(data) * fraction)]


def _overwrite_header(data: bytes, offset: int, field: bytes) -> bytes:
    at = offset % min(len(data), 128)  # container and stream headers live up front
    return data[:at] + field + data[at + len(field) :]


def _repeat_stretch(data: bytes, start: float, length: int, times: int) -> bytes:
    at = int(len(data) * start)
    stretch = data[at : at + length]
    return data[:at] + stretch * times + data[at:]


SEED_NAMES = sorted(
    ["speech-short.wav", "silence-5s.wav", "lying.flac", "vbr.mp3", "silence.ogg"]
    + [f"speech.{ext}" for _, _, ext, _ in FORMATS]
)
seed_names = st.sampled_from(SEED_NAMES)
mutated = st.one_of(
    st.builds(
        _flip_bits,
        seed_names.map(lambda n: seeds()[n]),
        st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=20),
    ),
    st.builds(
        _truncate,
        seed_names.map(lambda n: seeds()[n]),
        st.floats(min_value=0.0, max_value=1.0),
    ),
    st.builds(
        _overwrite_header,
        seed_names.map(lambda n: seeds()[n]),
        st.integers(min_value=0, max_value=1023),
        st.binary(min_size=1, max_size=8),
    ),
    st.builds(
        _repeat_stretch,
        seed_names.map(lambda n: seeds()[n]),
        st.floats(min_value=0.0, max_value=1.0),
        st.integers(min_value=1, max_value=4096),
        st.integers(min_value=2, max_value=50),
    ),
)


@BOUNDED
@given(st.binary(max_size=8192))
def test_random_bytes_are_refused_with_a_code_or_measured(data: bytes) -> None:
    check(data)


@BOUNDED
@given(st.binary(min_size=1, max_size=64), seed_names)
def test_random_bytes_after_a_real_header_are_refused_or_measured(tail: bytes, name: str) -> None:
    check(seeds()[name][:256] + tail)


@examples(BOUNDED, max_examples=400)
@given(mutated)
def test_damaged_real_files_are_refused_with_a_code_or_measured(data: bytes) -> None:
    check(data)


@pytest.mark.parametrize("name", SEED_NAMES)
def test_every_seed_is_measured_or_refused_as_too_long(name: str) -> None:
    # The seeds themselves: the long ones are 413 however their headers describe them.
    assert sorted(seeds()) == SEED_NAMES
    info = check(seeds()[name])
    if name in ("lying.flac", "vbr.mp3", "silence.ogg"):
        assert info is None
    else:
        assert info is not None


@examples(BOUNDED, max_examples=60)
@given(st.one_of(mutated, st.binary(max_size=2048)))
def test_uploads_answer_202_or_a_json_refusal_and_keep_nothing_refused(
    client: Any, settings: Settings, data: bytes
) -> None:
    stored = Path(settings.storage_path)
    before = {p for p in stored.rglob("*") if p.is_file()}
    response = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(data), "upload.bin")},
        headers=auth(),
        content_type="multipart/form-data",
    )
    after = {p for p in stored.rglob("*") if p.is_file()}
    if response.status_code == 202:
        assert len(after - before) == 1
        return
    error = response.get_json()["error"]
    assert (response.status_code, error["code"]) in REFUSALS
    assert set(error) == {"code", "message"} and error["message"]
    assert after == before
