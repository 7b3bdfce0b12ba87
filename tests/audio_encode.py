"""Re-encode a WAV fixture into other containers/codecs with PyAV (no ffmpeg binary needed)."""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Any

import av
import numpy as np

# (container format, codec, file extension, encoder sample rate)
FORMATS = [
    ("flac", "flac", "flac", 16000),
    ("mp3", "libmp3lame", "mp3", 16000),
    ("ogg", "libopus", "ogg", 48000),
    ("ipod", "aac", "m4a", 16000),
    ("webm", "libopus", "webm", 48000),
]


def encode(wav: Path, container: str, codec: str, rate: int) -> bytes:
    with av.open(str(wav)) as src:
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in src.decode(audio=0)])
    if samples.dtype != np.int16:
        samples = (samples.astype(np.float64) / np.abs(samples).max() * 32000).astype(np.int16)
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
    frame.sample_rate = 16000
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"  # type: ignore[union-attr]
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=rate)  # type: ignore[union-attr]
        for resampled in resampler.resample(frame):
            for packet in stream.encode(resampled):  # type: ignore[union-attr]
                out.mux(packet)
        for packet in stream.encode(None):  # type: ignore[union-attr]
            out.mux(packet)
    return buf.getvalue()


_DTYPES = {"s16": np.int16, "s32": np.int32, "flt": np.float32, "dbl": np.float64}


def silence(
    container: str,
    codec: str,
    rate: int,
    seconds: float,
    *,
    bit_rate: int | None = None,
    container_options: dict[str, str] | None = None,
) -> bytes:
    """`seconds` of mono silence encoded with PyAV, ten seconds a frame."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container, options=container_options or {}) as out:
        stream: Any = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        fmt = stream.format.name
        left = round(rate * seconds)
        while left > 0:
            count = min(left, rate * 10)
            frame = av.AudioFrame.from_ndarray(
                np.zeros((1, count), dtype=_DTYPES[fmt.rstrip("p")]), format=fmt, layout="mono"
            )
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
            left -= count
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


@functools.lru_cache(maxsize=4)
def _flac_silence(seconds: float, rate: int) -> bytes:
    """FLAC silence, encoded once per process (an hour takes seconds to encode)."""
    return silence("flac", "flac", rate, seconds)


def lying_flac(seconds: float, stated_seconds: float, rate: int = 8000) -> bytes:
    """A FLAC of `seconds` of silence whose STREAMINFO total_samples says `stated_seconds`."""
    data = bytearray(_flac_silence(seconds, rate))
    # STREAMINFO starts at byte 8; its bytes 18-25 (from the file's start) hold the sample
    # rate (20 bits), channels - 1 (3), bits per sample - 1 (5) and total_samples (36).
    packed = int.from_bytes(data[18:26], "big")
    packed = (packed & ~((1 << 36) - 1)) | round(stated_seconds * rate)
    data[18:26] = packed.to_bytes(8, "big")
    return bytes(data)


def xingless_vbr_mp3(seconds: float) -> bytes:
    """3 s at 160 kbit/s, then `seconds` at 8 kbit/s, 8 kHz, with no Xing/Info header.

    Without a Xing header FFmpeg estimates the length from the first frames' bit rate, so
    the header-stated length is a small fraction of the real one.
    """
    options = {"write_xing": "0", "id3v2_version": "0"}
    loud = silence("mp3", "libmp3lame", 8000, 3, bit_rate=160_000, container_options=options)
    quiet = silence("mp3", "libmp3lame", 8000, seconds, bit_rate=8_000, container_options=options)
    return loud + quiet


def stated_seconds(data: bytes) -> float:
    """The length the container's headers state (what the probe once trusted)."""
    with av.open(io.BytesIO(data)) as container:
        return float(container.duration or 0) / av.time_base


def aac_then_garbage(garbage_packets: int) -> bytes:
    """1 s of AAC in Matroska, then packets of zeros that the AAC decoder refuses."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream: Any = out.add_stream("aac", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 16000), np.int16), format="s16", layout="mono"
        )
        frame.sample_rate = 16000
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=16000)
        pts = 0
        for piece in [*resampler.resample(frame), None]:
            for packet in stream.encode(piece):
                out.mux(packet)
                pts = packet.pts if packet.pts is not None else pts
        for _ in range(garbage_packets):
            pts += 1024
            packet = av.Packet(b"\x00" * 64)
            packet.stream = stream
            packet.pts = packet.dts = pts
            packet.time_base = stream.time_base
            out.mux(packet)
    return buf.getvalue()
