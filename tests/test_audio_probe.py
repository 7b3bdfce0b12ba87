"""Uploads are recognised by decoding them, whatever their container or name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.audio import probe_audio
from app.errors import Refused
from tests.audio_encode import (
    FORMATS,
    aac_then_garbage,
    encode,
    lying_flac,
    stated_seconds,
    xingless_vbr_mp3,
)
from tests.conftest import FIXTURES


@pytest.mark.parametrize(("container", "codec", "ext", "rate"), FORMATS)
def test_common_formats_are_accepted(
    tmp_path: Path, container: str, codec: str, ext: str, rate: int
) -> None:
    path = tmp_path / "upload.bin"  # the name says nothing: the content decides
    path.write_bytes(encode(FIXTURES / "speech-short.wav", container, codec, rate))
    info = probe_audio(path, max_seconds=3600)
    assert info.duration_seconds == pytest.approx(6.6, abs=0.15)
    assert info.channels == 1


def test_too_long_audio_is_413(tmp_path: Path) -> None:
    with pytest.raises(Refused) as err:
        probe_audio(FIXTURES / "speech-90s.wav", max_seconds=60)
    assert (err.value.status, err.value.code) == (413, "audio_too_long")
    assert (
        err.value.message
        == "the audio lasts more than 60 s; the limit is 60 s (the setting api.max_audio_seconds)"
    )


def test_wav_bytes_in_a_text_file_are_still_audio(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes((FIXTURES / "speech-short.wav").read_bytes())
    assert probe_audio(path, 3600).codec == "pcm_s16le"


def _bytes_read() -> int:
    """Bytes this process has read through read() so far (Linux /proc/self/io)."""
    text = Path("/proc/self/io").read_text()
    match = re.search(r"^rchar: (\d+)$", text, re.M)
    assert match is not None
    return int(match[1])


def test_a_flac_whose_header_understates_its_length_is_measured(tmp_path: Path) -> None:
    data = lying_flac(seconds=3600, stated_seconds=10)
    assert stated_seconds(data) == pytest.approx(10)  # the lie the old probe believed
    path = tmp_path / "s.flac"
    path.write_bytes(data)

    assert probe_audio(path, max_seconds=7200).duration_seconds == pytest.approx(3600)
    before = _bytes_read()
    with pytest.raises(Refused) as err:
        probe_audio(path, max_seconds=600)
    assert (err.value.status, err.value.code) == (413, "audio_too_long")
    # It stopped near the limit: a sixth of the audio is about a sixth of the file.
    assert _bytes_read() - before < len(data) / 3


def test_a_vbr_mp3_without_a_xing_header_is_measured(tmp_path: Path) -> None:
    data = xingless_vbr_mp3(seconds=600)
    assert stated_seconds(data) < 200  # estimated from the first frames' 160 kbit/s
    path = tmp_path / "upload.mp3"
    path.write_bytes(data)

    assert probe_audio(path, max_seconds=3600).duration_seconds == pytest.approx(603, abs=0.5)
    with pytest.raises(Refused) as err:
        probe_audio(path, max_seconds=300)
    assert (err.value.status, err.value.code) == (413, "audio_too_long")


def test_the_limit_itself_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "s.flac"
    path.write_bytes(lying_flac(seconds=120, stated_seconds=120))
    assert probe_audio(path, max_seconds=120).duration_seconds == 120


def test_a_run_of_packets_that_decode_to_nothing_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.mkv"
    path.write_bytes(aac_then_garbage(100))  # a damaged stretch is skipped
    assert probe_audio(path, 60).duration_seconds == pytest.approx(1.0, abs=0.05)
    path.write_bytes(aac_then_garbage(600))
    with pytest.raises(Refused) as err:
        probe_audio(path, 60)
    assert (err.value.status, err.value.code) == (400, "invalid_audio")


def test_a_file_that_costs_more_cpu_than_allowed_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.audio

    # Every file is too costly once the allowance is none at all.
    monkeypatch.setattr(app.audio, "_CPU_BASE_SECONDS", -1.0)
    monkeypatch.setattr(app.audio, "_CPU_REAL_TIME_FACTOR", float("inf"))
    with pytest.raises(Refused) as err:
        probe_audio(FIXTURES / "speech-90s.wav", max_seconds=3600)
    assert (err.value.status, err.value.code) == (413, "audio_too_complex")


def _with_sample_rate(wav: bytes, rate: int) -> bytes:
    """The WAV with its fmt chunk's sample rate overwritten."""
    at = wav.index(b"fmt ") + 12  # chunk id, size, format tag, channels
    return wav[:at] + rate.to_bytes(4, "little") + wav[at + 4 :]


def test_a_sample_rate_no_audio_uses_is_refused(tmp_path: Path) -> None:
    # Found by the property tests: 5 s of samples stated at 352 MHz "last" 0.2 ms, and
    # resampling them took the worker two seconds of CPU.
    path = tmp_path / "fast.wav"
    path.write_bytes(_with_sample_rate((FIXTURES / "silence-5s.wav").read_bytes(), 352_337_536))
    with pytest.raises(Refused) as err:
        probe_audio(path, 3600)
    assert (err.value.status, err.value.code) == (400, "invalid_audio")
    assert err.value.message == (
        "the audio's sample rate (352337536 Hz) is above what audio uses (384000 Hz)"
    )
    path.write_bytes(_with_sample_rate((FIXTURES / "silence-5s.wav").read_bytes(), 384_000))
    assert probe_audio(path, 3600).sample_rate == 384_000
