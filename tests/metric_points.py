"""Reading what an `InMemoryMetricReader` collected: each instrument's points by attributes."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)

from rollup_assets import metrics
from rollup_assets.settings import MetricsConfig

Attrs = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Instrument:
    unit: str
    counts: dict[Attrs, float]  # a counter's value per attribute set
    histograms: dict[Attrs, HistogramDataPoint]  # a histogram's point per attribute set

    def total(self, **attrs: str) -> float:
        """The counter's value summed over every attribute set that has `attrs`."""
        return sum(v for a, v in self.counts.items() if set(attrs.items()) <= a)

    def recorded(self, **attrs: str) -> list[HistogramDataPoint]:
        """The histogram's points whose attributes include `attrs`."""
        return [p for a, p in self.histograms.items() if set(attrs.items()) <= a]


def read(reader: InMemoryMetricReader) -> dict[str, Instrument]:
    """Every instrument the reader saw, by name (cumulative since it was installed)."""
    data = reader.get_metrics_data()
    out: dict[str, Instrument] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                counts: dict[Attrs, float] = {}
                histograms: dict[Attrs, HistogramDataPoint] = {}
                for p in m.data.data_points:
                    key = frozenset((k, str(v)) for k, v in (p.attributes or {}).items())
                    if isinstance(p, NumberDataPoint):
                        counts[key] = p.value
                    else:
                        histograms[key] = p
                out[m.name] = Instrument(m.unit or "", counts, histograms)
    return out


@contextmanager
def reading() -> Iterator[InMemoryMetricReader]:
    """This process's metrics collected by an in-memory reader while the context is open."""
    reader = InMemoryMetricReader()
    metrics.configure(MetricsConfig(), reader=reader)
    try:
        yield reader
    finally:
        metrics.configure(MetricsConfig())
