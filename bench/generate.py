"""Benchmark data: M meters x D days of 15-minute readings as Parquet, and late corrections.

The readings come from `rollup_assets.sample_data.day_batch` (daily load curve, weekday/weekend,
season, per-meter scale, noise, a few missing readings, optional columns sometimes null), so the
benchmark and the demo share one deterministic generator: same seed, same bytes.
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollup_assets.demo.sample_data import SCHEMA, day_batch, meter_ids

# Every benchmark period ends here (exclusive, UTC), so the local (Vienna) year 2025 is closed
# when the benchmark starts and a correction reaches all five levels, yearly included.
PERIOD_END = datetime(2026, 1, 1, tzinfo=UTC)
# The pinned clock of the forward lane: one hour after the data ends, past every watermark lag.
NOW = PERIOD_END + timedelta(hours=1)
SLOT = timedelta(minutes=15)


@dataclass(frozen=True)
class Dataset:
    """The generated readings: one Parquet file per ingest chunk, all in `directory`."""

    directory: Path
    files: list[Path]
    meters: int
    days: int
    rows: int
    seed: int

    @property
    def first_day(self) -> date:
        return (PERIOD_END - timedelta(days=self.days)).date()

    @property
    def start(self) -> datetime:
        return PERIOD_END - timedelta(days=self.days)

    @property
    def glob(self) -> str:
        return str(self.directory / "*.parquet")


def write_dataset(
    directory: Path, meters: int, days: int, seed: int = 7, chunk_days: int = 7
) -> Dataset:
    """Write `days` days ending at PERIOD_END for `meters` meters, `chunk_days` days per file
    (a day per row group), and return what was written."""
    directory.mkdir(parents=True, exist_ok=True)
    first = (PERIOD_END - timedelta(days=days)).date()
    files, rows = [], 0
    for offset in range(0, days, chunk_days):
        chunk_first = first + timedelta(days=offset)
        path = directory / f"readings-{chunk_first:%Y%m%d}.parquet"
        with pq.ParquetWriter(str(path), SCHEMA, compression="snappy") as writer:
            for d in range(offset, min(offset + chunk_days, days)):
                batch = day_batch(first + timedelta(days=d), meters, seed)
                writer.write_table(batch)
                rows += batch.num_rows
        files.append(path)
    return Dataset(directory, files, meters, days, rows, seed)


def late_readings(dataset: Dataset, count: int, seed: int, margin: timedelta) -> pa.Table:
    """`count` late or corrected readings for random meters at random 15-minute slots spread
    over the period (ending `margin` before its end, so every one lands in closed buckets).

    A slot that already has a reading gets a corrected value (a meter re-read); a slot that was
    missing gets the late reading. Values follow the same scale as the generator's.
    """
    rng = np.random.default_rng([seed, count, dataset.days, dataset.meters])
    slots = int((timedelta(days=dataset.days) - margin) / SLOT)
    picks: set[tuple[int, int]] = set()
    while len(picks) < count:
        picks.add((int(rng.integers(dataset.meters)), int(rng.integers(slots))))
    ordered = sorted(picks)
    ids = meter_ids(dataset.meters)
    n = len(ordered)
    energy = np.round(rng.gamma(2.0, 0.4, size=n), 6)
    power = np.round(energy * 4.0, 6)
    voltage = np.round(230.0 + 3.0 * rng.standard_normal(n), 3)
    return pa.table(
        {
            "entity_id": pa.array([ids[m] for m, _ in ordered], pa.string()),
            "ts": pa.array([dataset.start + s * SLOT for _, s in ordered], SCHEMA.field("ts").type),
            "energy_kwh": pa.array(energy),
            "power_kw": pa.array(power, mask=rng.random(n) < 0.03),
            "voltage_v": pa.array(voltage, mask=rng.random(n) < 0.05),
        },
        schema=SCHEMA,
    )
