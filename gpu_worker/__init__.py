"""Murmur's transcription worker: validates its runtime, loads one model and serves one queue.

Importing the package pins the process to offline model loading. huggingface_hub reads
HF_HUB_OFFLINE once, when it is first imported, and faster-whisper or WhisperX would
otherwise try the hub (with ~23 s of retries) whenever a file is missing; pyannote.audio 4
exports telemetry unless told not to. Every entry point (CLI, tests, benchmarks) imports
this package before those libraries, so setting the variables here covers all of them.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["PYANNOTE_METRICS_ENABLED"] = "false"
