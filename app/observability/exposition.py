"""The Prometheus text format (0.0.4) of a registry, byte-for-byte what generate_latest writes.

prometheus_client 0.26 re-validates and re-escapes every label name of every sample, which
costs ~20 µs a sample: a scrape of 1,000 workers (~16,000 samples) spent most of its time
there. Our metric and label names are fixed identifiers, so they are checked once per family
here, and label values take a fast path when they hold nothing to escape. A test compares
the output with `generate_latest` on a full scrape.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from prometheus_client import utils
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

# The library's own float formatting (Go-style exponents), so numbers match exactly.
_format_value: Callable[[float], str] = utils.floatToGoString

_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _check_name(name: str, pattern: re.Pattern[str]) -> str:
    if not pattern.match(name):
        # Our names are constants; anything else is a bug to fix, not to escape.
        raise ValueError(f"not a legal Prometheus name: {name!r}")
    return name


class SeriesFamily(Metric):
    """A gauge or counter family whose series all carry the same label names, kept as rows.

    Made for the per-worker families (~16 series per reporting worker): a row is a tuple of
    label values and a number, a fraction of the cost of a prometheus_client Sample with a
    label dict of its own. `encode_text` renders the rows directly; `samples` gives the same
    series as Samples to anything else (generate_latest, the parser in tests).
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        kind: Literal["gauge", "counter"],
        labels: Sequence[str],
    ) -> None:
        if not labels:
            raise ValueError(f"{name}: a SeriesFamily has labels; use a plain family without")
        super().__init__(name, documentation, kind)
        self.label_names = tuple(labels)
        self.sample_name = name + "_total" if kind == "counter" else name
        self.rows: list[tuple[tuple[str, ...], float]] = []

    def add(self, values: tuple[str, ...], value: float) -> None:
        self.rows.append((values, value))

    @property
    def samples(self) -> list[Sample]:
        names = self.label_names
        return [Sample(self.sample_name, dict(zip(names, v, strict=True)), n) for v, n in self.rows]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:  # Metric.__init__ sets an empty list; series go through add()
            raise ValueError(f"{self.name}: add series with add(), not through samples")


def encode_text(registry: Collector) -> bytes:
    output: list[str] = []
    append = output.append
    rendered: dict[tuple[tuple[str, str], ...], str] = {}
    rendered_rows: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
    legal_labels: set[str] = set()
    # Most values repeat within a scrape (0, 1, a state's 1.0, equal counters): each distinct
    # value is formatted once.
    formatted: dict[float | str, str] = {}

    def text_of(number: float) -> str:
        # -0.0 == 0.0 but prints differently: zeros are keyed by their own text.
        key = number if number else repr(number)
        text = formatted.get(key)
        if text is None:
            text = formatted[key] = _format_value(number)
        return text

    def check_labels(labels: Iterable[str]) -> None:
        for label in labels:
            if label not in legal_labels:
                legal_labels.add(_check_name(label, _LEGACY_LABEL))

    for metric in registry.collect():
        name, kind = metric.name, metric.type
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name += "_info"
        _check_name(name, _LEGACY_NAME)
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        append(f"# HELP {name} {doc}\n# TYPE {name} {_TYPES.get(kind, kind)}\n")
        if isinstance(metric, SeriesFamily):
            sample_name = _check_name(metric.sample_name, _LEGACY_NAME)
            label_names = metric.label_names
            check_labels(label_names)
            order = sorted(range(len(label_names)), key=label_names.__getitem__)
            for values, number in metric.rows:
                pairs = rendered_rows.get((label_names, values))
                if pairs is None:
                    pairs = rendered_rows[(label_names, values)] = ",".join(
                        [f'{label_names[i]}="{_escape_value(values[i])}"' for i in order]
                    )
                append(f"{sample_name}{{{pairs}}} {text_of(number)}\n")
            continue
        names: set[str] = set()
        unsupported = {metric.name + suffix for suffix in _OPENMETRICS_ONLY}
        for sample in metric.samples:
            if sample.name in unsupported:
                raise ValueError(f"{sample.name}: OpenMetrics-only samples are not supported")
            if sample.timestamp is not None:
                raise ValueError(f"{sample.name}: sample timestamps are not supported")
            if sample.name not in names:
                names.add(_check_name(sample.name, _LEGACY_NAME))
            labels = sample.labels
            if not labels:
                append(f"{sample.name} {text_of(sample.value)}\n")
                continue
            # Most label sets repeat across families (a worker's profile and id label ~16
            # series), so each is rendered once per scrape.
            key = tuple(labels.items())
            pairs = rendered.get(key)
            if pairs is None:
                check_labels(labels)
                pairs = rendered[key] = ",".join(
                    [f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items())]
                )
            append(f"{sample.name}{{{pairs}}} {text_of(sample.value)}\n")
    return "".join(output).encode("utf-8")
