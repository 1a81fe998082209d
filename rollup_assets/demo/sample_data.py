"""Deterministic energy-meter data: M meters x D days of 15-minute readings.

Shapes are realistic enough to make charts and aggregates meaningful: a daily load curve (morning
and evening peaks), lower weekend consumption, a seasonal swing, per-meter scale, noise, a few
missing readings, and optional columns that are sometimes null. Same seed, same data.
"""

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import numpy as np
import pyarrow as pa

from rollup_assets.compute.arrow_types import TS

SCHEMA = pa.schema(
    [
        ("entity_id", pa.string()),
        ("ts", TS),
        ("energy_kwh", pa.float64()),
        ("power_kw", pa.float64()),
        ("voltage_v", pa.float64()),
    ]
)
SIZES = {"small": (100, 30), "default": (1000, 365)}


def meter_ids(meters: int) -> list[str]:
    return [f"meter-{i:04d}" for i in range(meters)]


def day_batch(
    day: date,
    meters: int,
    seed: int = 7,
    missing: float = 0.002,
    null_power: float = 0.03,
    null_voltage: float = 0.05,
) -> pa.Table:
    """One UTC day of readings for every meter (96 per meter, minus a few missing)."""
    rng = np.random.default_rng([seed, day.toordinal()])
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    slots = np.arange(96)
    hours = (slots / 4.0 + 1.0) % 24  # roughly local (CET) hour of day
    curve = (
        0.35
        + 0.45 * np.exp(-((hours - 7.5) ** 2) / 3.0)
        + 0.65 * np.exp(-((hours - 19.0) ** 2) / 5.0)
    )
    weekend = 0.8 if day.weekday() >= 5 else 1.0
    season = 1.0 + 0.25 * np.cos(2 * np.pi * (day.timetuple().tm_yday - 15) / 365.25)
    scale = 0.5 + np.random.default_rng([seed, 1]).gamma(2.0, 0.5, size=meters)
    base = np.outer(scale, curve) * weekend * season  # kWh per 15 min, meters x 96
    energy = np.maximum(0.0, base * (1.0 + 0.15 * rng.standard_normal(base.shape)))
    power = energy * 4.0 * (1.0 + 0.02 * rng.standard_normal(base.shape))
    voltage = 230.0 + 3.0 * rng.standard_normal(base.shape) - 2.0 * (base / base.max())
    keep = rng.random(base.shape) >= missing
    power_null = rng.random(base.shape) < null_power
    voltage_null = rng.random(base.shape) < null_voltage
    ids = np.repeat(np.array(meter_ids(meters), dtype=object), 96)
    ts = np.tile(
        np.array([start + timedelta(minutes=15 * int(s)) for s in slots], dtype=object), meters
    )
    mask = keep.ravel()
    return pa.table(
        {
            "entity_id": pa.array(ids[mask], pa.string()),
            "ts": pa.array(ts[mask], TS),
            "energy_kwh": pa.array(np.round(energy.ravel()[mask], 6)),
            "power_kw": pa.array(np.round(power.ravel()[mask], 6), mask=power_null.ravel()[mask]),
            "voltage_v": pa.array(
                np.round(voltage.ravel()[mask], 3), mask=voltage_null.ravel()[mask]
            ),
        },
        schema=SCHEMA,
    )


def batches(first_day: date, days: int, meters: int, seed: int = 7) -> Iterator[pa.Table]:
    for d in range(days):
        yield day_batch(first_day + timedelta(days=d), meters, seed)
