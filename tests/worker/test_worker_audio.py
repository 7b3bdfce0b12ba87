"""The worker's decoder: faster-whisper's samples, stopped at the job's limit, one buffer."""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from faster_whisper import decode_audio

from app.audio import probe_audio
from gpu_worker.audio import SAMPLE_RATE, AudioTooLong, decode_bounded
from gpu_worker.decoding import DecodedLength, UndecodableAudio
from tests.audio_encode import FORMATS, aac_then_garbage, encode, lying_flac, xingless_vbr_mp3

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FLOAT32 = 4


class CountingReader(io.BytesIO):
    """A file whose reads are counted: how far into the file did the decoder go?"""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.bytes_read += len(chunk)
        return chunk

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        count = super().readinto(buffer)
        self.bytes_read += count
        return count


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()  # numpy reports its buffers to tracemalloc
    yield
    tracemalloc.stop()


def _encoded(name: str) -> bytes:
    if name.endswith(".wav"):
        return (FIXTURES / name).read_bytes()
    container, codec, _, rate = next(f for f in FORMATS if f[2] == name)
    return encode(FIXTURES / "speech-short.wav", container, codec, rate)


ALL = ["speech-short.wav", "silence-5s.wav", *(f[2] for f in FORMATS)]


@pytest.mark.parametrize("name", ALL)
def test_samples_are_faster_whispers(name: str) -> None:
    data = _encoded(name)
    expected = decode_audio(io.BytesIO(data), sampling_rate=SAMPLE_RATE)
    samples = decode_bounded(io.BytesIO(data), 3600)
    assert samples.dtype == np.float32
    assert np.array_equal(samples, expected)


@pytest.mark.parametrize("name", ALL)
def test_the_probe_and_the_worker_agree_on_the_length(name: str, tmp_path: Path) -> None:
    path = tmp_path / "upload.bin"
    path.write_bytes(_encoded(name))
    measured = probe_audio(path, 3600).duration_seconds
    assert decode_bounded(path, measured).shape[0] / SAMPLE_RATE == pytest.approx(
        measured, abs=0.01
    )
    with pytest.raises(AudioTooLong):
        decode_bounded(path, measured - 0.05)


# An hour of audio whose headers lie about its length; encoded when a test asks (not at
# collection, where each test process would pay seconds of encoding), before `traced` starts.
LYING_HOURS = {
    "flac-stating-10s": lambda: lying_flac(seconds=3600, stated_seconds=10),
    "vbr-mp3-without-xing": lambda: xingless_vbr_mp3(seconds=3600),
}


@pytest.fixture(params=sorted(LYING_HOURS))
def lying_hour(request: pytest.FixtureRequest) -> bytes:
    return LYING_HOURS[request.param]()


def test_decoding_stops_at_the_limit_whatever_the_header_says(
    lying_hour: bytes, traced: None
) -> None:
    data = lying_hour
    reader = CountingReader(data)
    with pytest.raises(AudioTooLong) as err:
        decode_bounded(reader, 300)
    assert str(err.value) == "the audio lasts more than 300 s; the limit is 300 s"
    assert reader.bytes_read < len(data) / 4  # 300 s of 3,600: it stopped near the limit
    _, peak = tracemalloc.get_traced_memory()
    assert peak < 1.2 * 300 * SAMPLE_RATE * FLOAT32  # never more than the limit's samples


def test_a_long_file_within_the_limit_is_held_once(tmp_path: Path, traced: None) -> None:
    path = tmp_path / "hour.flac"
    path.write_bytes(lying_flac(seconds=3600, stated_seconds=3600))
    # The claim carries the length the probe measured; it sizes the one buffer.
    samples = decode_bounded(path, 4 * 3600, expected_seconds=3600)
    assert samples.shape == (3600 * SAMPLE_RATE,)
    _, peak = tracemalloc.get_traced_memory()
    # No list of pieces joined at the end (that would be 2x).
    assert peak < 1.1 * samples.nbytes
    del samples
    tracemalloc.reset_peak()
    # Without it the buffer grows in place by half each time: capacity (not resident pages:
    # untouched pages of a large block are never faulted in) stays under 1.5x.
    samples = decode_bounded(path, 4 * 3600)
    assert samples.shape == (3600 * SAMPLE_RATE,)
    _, peak = tracemalloc.get_traced_memory()
    assert peak < 1.55 * samples.nbytes


def test_the_measured_length_sizes_the_buffer(traced: None) -> None:
    data = _encoded("speech-short.wav")
    samples = decode_bounded(io.BytesIO(data), 3600, expected_seconds=6.6)
    _, peak = tracemalloc.get_traced_memory()
    assert peak < 1.5 * samples.nbytes + 1024 * 1024


def test_packets_that_decode_to_nothing_are_bounded() -> None:
    assert decode_bounded(io.BytesIO(aac_then_garbage(100)), 60).shape[0] == pytest.approx(
        SAMPLE_RATE, abs=SAMPLE_RATE * 0.05
    )
    with pytest.raises(UndecodableAudio):
        decode_bounded(io.BytesIO(aac_then_garbage(600)), 60)


def test_a_file_without_audio_is_undecodable() -> None:
    with pytest.raises(Exception) as err:  # PyAV's own error, or ours
        decode_bounded(io.BytesIO(b"this is not audio" * 100), 60)
    assert not isinstance(err.value, AudioTooLong)


def test_a_sample_rate_no_audio_uses_is_undecodable() -> None:
    wav = (FIXTURES / "silence-5s.wav").read_bytes()
    at = wav.index(b"fmt ") + 12  # chunk id, size, format tag, channels: then the rate
    fast = wav[:at] + (352_337_536).to_bytes(4, "little") + wav[at + 4 :]
    with pytest.raises(UndecodableAudio, match="352337536 Hz"):
        decode_bounded(io.BytesIO(fast), 60)


def test_a_length_is_whole_samples_divided_once_per_rate() -> None:
    # A float sum of 100 frames of 0.01 s drifts off 1.0; whole samples per rate do not.
    length = DecodedLength()
    for _ in range(100):
        length.add(44100, 441)
    assert length.add(48000, 24000) == 1.5  # a second run, at another rate
    assert length.frames == 101
    assert sum([441 / 44100] * 100) != 1.0


def test_a_part_decodes_the_file_only_up_to_its_span(fixtures_dir: Path) -> None:
    """`stop_after_seconds` (a part of a long job) ends decoding there, without an error, and
    the samples it gives are the whole decode's first ones."""
    path = fixtures_dir / "speech-90s.wav"
    whole = decode_bounded(path, 4 * 3600)
    head = decode_bounded(path, 4 * 3600, stop_after_seconds=10.0)
    assert 10.0 <= head.shape[0] / SAMPLE_RATE < 11.0
    np.testing.assert_array_equal(head, whole[: head.shape[0]])
