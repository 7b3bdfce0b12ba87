"""Uploads are recognised by decoding them, whatever their container or name."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.audio import probe_audio
from app.errors import ApiError
from tests.audio_encode import FORMATS, encode
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
    with pytest.raises(ApiError) as err:
        probe_audio(FIXTURES / "speech-90s.wav", max_seconds=60)
    assert (err.value.status, err.value.code) == (413, "audio_too_long")
    assert err.value.message == "the audio lasts 90 s; the limit is 60 s"


def test_wav_bytes_in_a_text_file_are_still_audio(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes((FIXTURES / "speech-short.wav").read_bytes())
    assert probe_audio(path, 3600).codec == "pcm_s16le"


@pytest.mark.parametrize(("container", "codec", "ext", "rate"), FORMATS)
def test_length_is_counted_from_packets_when_headers_lack_it(
    tmp_path: Path, container: str, codec: str, ext: str, rate: int
) -> None:
    from app.audio import _demuxed_seconds

    path = tmp_path / f"a.{ext}"
    path.write_bytes(encode(FIXTURES / "speech-short.wav", container, codec, rate))
    assert _demuxed_seconds(path) == pytest.approx(6.6, abs=0.15)
