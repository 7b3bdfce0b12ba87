"""Counting decoded audio: the packet loop and the length rule the probe and the worker share.

The control plane's probe (app/audio.py) and the worker's decoder (gpu_worker/audio.py) both
decode with `decoded_frames` and measure with `DecodedLength`, so audio the probe accepted
decodes on the worker within the same limit. Only PyAV is imported here (no numpy): the
control image ships this module with the rest of `gpu_worker/`.

Invariants:
- A length is the count of samples the decoder produced, never a header's duration, a
  container's index or packet timestamps: a file can state any of those falsely (issue 10:
  an 8 h FLAC whose STREAMINFO says 10 s, a VBR MP3 without a Xing header).
- Samples are summed as whole numbers per sample rate and divided once per run of one rate:
  a float sum of frame lengths drifts.
- A run of more than `MAX_EMPTY_PACKETS` packets that decode to nothing ends the file as
  undecodable (a file of garbage frames); a damaged packet is skipped, a damaged tail ends it.
- Only audio containers open, and no protocol but the file itself (`OPEN_LIMITS`): FFmpeg's
  concat, hls and similar demuxers open whatever files or URLs the input names (issue 10
  review L3). The match is on FFmpeg's demuxer names: "mov" is mp4/m4a/mov, "matroska" is
  mkv/webm, "aac" is ADTS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import av

AUDIO_DEMUXERS = (
    "wav,w64,mp3,mov,ogg,flac,matroska,aac,aiff,caf,amr,wv,ape,asf,au,tta,ac3,eac3,dts,mpc,mpc8,dsf"
)
OPEN_LIMITS = {"format_whitelist": AUDIO_DEMUXERS, "protocol_whitelist": "file"}
# Packets in a row that give no audio before the file counts as garbage. Real files have a
# few at the start (encoder priming, a damaged frame); 500 is 10 s of 20 ms Opus packets.
MAX_EMPTY_PACKETS = 500
# The highest rate audio is recorded at (DXD 352.8 kHz, 384 kHz). A header can state any
# number, and resampling from hundreds of MHz takes seconds for a fraction of a second of
# audio (found by tests/test_audio_probe_properties.py). Both sides refuse a frame above it.
MAX_SAMPLE_RATE = 384_000


class UndecodableAudio(Exception):
    """The file has no audio stream, or gives no audio where audio was expected."""


def decoded_frames(
    container: Any, stream: Any, on_packet: Callable[[int], None] | None = None
) -> Iterator[Any]:
    """The stream's decoded frames; damaged packets are skipped, a damaged tail ends it.

    `on_packet(n)` is called with the count of packets read so far, before the n-th is
    decoded (the probe bounds its CPU time there). Raises UndecodableAudio after
    MAX_EMPTY_PACKETS packets in a row that gave no audio.
    """
    packets = container.demux(stream)
    empty_run = 0
    read = 0
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            return
        except av.InvalidDataError:
            return  # what decoded so far is the audio, as faster-whisper's decode_audio has it
        read += 1
        if on_packet is not None:
            on_packet(read)
        try:
            frames = packet.decode()
        except av.FFmpegError:  # a damaged packet (InvalidDataError, or worse: AAC gives -50531338)
            frames = []
        if frames:
            empty_run = 0
        elif packet.size:  # the empty packet at the end only flushes the decoder
            empty_run += 1
            if empty_run > MAX_EMPTY_PACKETS:
                raise UndecodableAudio(f"{MAX_EMPTY_PACKETS} packets in a row decoded to no audio")
        yield from frames


class DecodedLength:
    """Seconds of audio decoded so far, from whole sample counts per sample rate."""

    def __init__(self) -> None:
        self._earlier = 0.0  # seconds of the runs at earlier rates
        self._samples = 0  # samples of the current run
        self._rate = 0  # the current run's sample rate; 0 before the first frame
        self.frames = 0  # frames counted, empty ones included

    def add(self, sample_rate: int, samples: int) -> float:
        """Count a frame of `samples` at `sample_rate` (> 0); the length so far, in seconds."""
        if sample_rate != self._rate:
            if self._rate:
                self._earlier += self._samples / self._rate
            self._samples, self._rate = 0, sample_rate
        self._samples += samples
        self.frames += 1
        return self.seconds

    @property
    def seconds(self) -> float:
        return self._earlier + self._samples / self._rate if self._rate else 0.0
