"""The state one benchmark run shares across its scenarios, and the benchmark sizes."""

from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from bench.metrics import Probe
from rollup_assets.model.specs import Catalog


@dataclass(frozen=True)
class Size:
    """Meters and days of the main archive, days of the short archive of the width and length
    scenario (the smallest of `scaling_days`), late-reading counts (the density figures)."""

    meters: int
    days: int
    scaling_days: tuple[int, ...]
    late_counts: tuple[int, ...]
    repeats: int = 3


SIZES = {
    # Small keeps a run to a few minutes.
    "small": Size(100, 30, (7,), (1, 100, 1_000, 10_000), repeats=2),
    "default": Size(1000, 365, (30,), (1, 100, 1_000, 10_000, 100_000)),
}


@dataclass
class Bench:
    work: Path
    size_name: str
    size: Size
    spark: SparkSession
    probe: Probe
    catalog: Catalog
    seed: int = 7
    options: dict = field(default_factory=dict)

    @property
    def meters(self) -> int:
        return self.size.meters

    @property
    def days(self) -> int:
        return self.size.days

    @property
    def scaling_days(self) -> tuple[int, ...]:
        return self.size.scaling_days

    @property
    def late_counts(self) -> tuple[int, ...]:
        return self.size.late_counts

    @property
    def repeats(self) -> int:
        return self.size.repeats
