"""Re-encode a WAV fixture into other containers/codecs with PyAV (no ffmpeg binary needed)."""

from __future__ import annotations

import io
from pathlib import Path

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
