"""Only audio containers are opened: no FFmpeg demuxer that follows references to other files.

Issue 10 review L3: the API probe accepted an ffconcat text upload naming a sibling file, with
that file's duration, i.e. it read a local file the upload only named. The probe (app/audio.py)
and the worker's decoder (gpu_worker/audio.py) open with the same demuxer whitelist and no
protocol but the file itself. The HTTP server here is the test's own, on 127.0.0.1.
"""

from __future__ import annotations

import io
import threading
import wave
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.audio import probe_audio
from app.errors import Refused
from gpu_worker import audio as worker_module
from gpu_worker.audio import decode_bounded
from tests.audio_encode import FORMATS, encode
from tests.conftest import FIXTURES


@pytest.fixture()
def neighbour(tmp_path: Path) -> Iterator[tuple[Path, str, list[str]]]:
    """A 3 s WAV next to the upload, the same file served on loopback, and the server's hits."""
    target = tmp_path / "secret.wav"
    with wave.open(str(target), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x01\x00" * 16000 * 3)
    hits: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args: Any) -> None:
            hits.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield target, f"http://127.0.0.1:{server.server_address[1]}/secret.wav", hits
    finally:
        server.shutdown()
        server.server_close()


def _references(target: Path, url: str) -> dict[str, str]:
    playlist = "#EXTM3U\n#EXT-X-TARGETDURATION:3\n#EXTINF:3,\n{}\n#EXT-X-ENDLIST\n"
    return {
        "ffconcat": f"ffconcat version 1.0\nfile {target.name}\n",
        "ffconcat_absolute": f"ffconcat version 1.0\nfile {target}\n",
        "hls_file": playlist.format(f"file://{target}"),
        "hls_path": playlist.format(target),
        "hls_http": playlist.format(url),
    }


@pytest.mark.parametrize(
    "case", ["ffconcat", "ffconcat_absolute", "hls_file", "hls_path", "hls_http"]
)
def test_an_upload_naming_other_files_is_refused(
    case: str, neighbour: tuple[Path, str, list[str]]
) -> None:
    target, url, hits = neighbour
    upload = target.parent / f"upload-{case}.bin"
    upload.write_text(_references(target, url)[case])
    with pytest.raises(Refused) as refused:
        probe_audio(upload, 3600)
    assert (refused.value.status, refused.value.code) == (400, "invalid_audio")
    # The worker refuses it too, from its download (a stream) or from a path.
    for source in (io.BytesIO(upload.read_bytes()), upload):
        with pytest.raises(Exception) as failed:
            decode_bounded(source, 3600)
        assert not isinstance(failed.value, worker_module.AudioTooLong)
    assert hits == []


@pytest.mark.parametrize("container,codec,ext,rate", FORMATS)
def test_the_promised_formats_still_open(
    container: str, codec: str, ext: str, rate: int, tmp_path: Path
) -> None:
    path = tmp_path / f"speech.{ext}"
    path.write_bytes(encode(FIXTURES / "speech-short.wav", container, codec, rate))
    assert probe_audio(path, 3600).duration_seconds > 1
    assert decode_bounded(path, 3600).shape[0] > 16000
