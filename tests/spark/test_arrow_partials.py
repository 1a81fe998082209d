"""The driver's Arrow aggregation of named cells equals Spark's, at every level of the chain,
on DST days, ISO weeks, month and year ends, companions included (the kept extremes in the
same order); a NaN under a min or max is ordered as on Spark."""

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from rollup_assets.compute.aggregation import SOURCE_ROWS, rollup_partials
from rollup_assets.compute.arrow_partials import partials_arrow
from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.aggregates import BASE_KINDS
from rollup_assets.model.partials import RAW_ROWS
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window

CATALOG = load_catalog()
# Around the autumn DST switch (Vienna, 2025-10-26) and the turn of the year.
SPANS = [
    Window(datetime(2025, 10, 24, tzinfo=UTC), datetime(2025, 10, 29, tzinfo=UTC)),
    Window(datetime(2025, 12, 29, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC)),
]
ENTITIES = ["m1", "m2", "m3"]


def raw_rows(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ts = [
        s.start + timedelta(minutes=15 * i)
        for s in SPANS
        for i in range(int((s.end - s.start) / timedelta(minutes=15)))
    ]
    n = len(ts) * len(ENTITIES)
    power = pa.array(rng.normal(3.0, 1.0, n), mask=rng.random(n) < 0.2)
    voltage = pa.array(rng.normal(230.0, 3.0, n), mask=rng.random(n) < 0.3)
    return pa.table(
        {
            "entity_id": pa.array([e for _ in ts for e in ENTITIES], pa.string()),
            "ts": pa.array([t for t in ts for _ in ENTITIES], TS),
            "energy_kwh": pa.array(np.round(rng.gamma(2.0, 0.4, n), 6)),
            "power_kw": power,
            "voltage_v": voltage,
            "current_a": pc.divide(pc.multiply(power, 1000.0), voltage),  # as ingest computes it
        }
    )


def cells_table(windows: list[Window], rng: np.random.Generator) -> pa.Table:
    """Random named cells of `windows` (some buckets with one entity, some with several)."""
    pairs = [(w, e) for w in windows for e in ENTITIES if rng.random() < 0.5]
    return pa.table(
        {
            "bucket_start": pa.array([w.start for w, _ in pairs], TS),
            "bucket_end": pa.array([w.end for w, _ in pairs], TS),
            "entity_id": pa.array([e for _, e in pairs], pa.string()),
        }
    )


def by_cell(table: pa.Table) -> dict:
    rows = table.sort_by([("entity_id", "ascending"), ("bucket_start", "ascending")]).to_pylist()
    return {(r["entity_id"], r["bucket_start"]): r for r in rows}


def same(a: object, b: object) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        if np.isnan(a) or np.isnan(b):
            return bool(np.isnan(a) and np.isnan(b))
        if np.isinf(a) or np.isinf(b):
            return a == b
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return a == b


def compared(spec) -> list[str]:
    """The partials, the count of raw rows and the companions a stored row keeps."""
    kept = [c.name for c in spec.companions if c.kind in BASE_KINDS]
    return [sc.name for sc in spec.stored_columns] + [SOURCE_ROWS, RAW_ROWS, "bucket_end", *kept]


@pytest.mark.parametrize(
    "rollup", ["energy_hourly", "energy_daily", "energy_weekly", "energy_monthly", "energy_yearly"]
)
def test_arrow_partials_equal_spark(spark: SparkSession, rollup: str) -> None:
    spec = CATALOG.rollup(rollup)
    chain = [spec]
    while chain[-1].source in CATALOG.rollups:
        chain.append(CATALOG.rollup(chain[-1].source))
    # Build the source level with Spark from the raw rows (every bucket, every entity).
    rows = raw_rows(seed=len(chain))
    for level in reversed(chain[1:]):
        windows = buckets_in(level, SPANS)
        targets = spark.createDataFrame(
            pa.table(
                {
                    "bucket_start": pa.array([w.start for w in windows], TS),
                    "bucket_end": pa.array([w.end for w in windows], TS),
                }
            )
        )
        source = CATALOG.archive(level.source)
        rows = rollup_partials(spark.createDataFrame(rows), targets, level, source).toArrow()
        rows = rows.drop_columns([SOURCE_ROWS])
    source = CATALOG.archive(spec.source)
    # Every other bucket: the rows of the buckets between belong to no cell.
    windows = buckets_in(spec, SPANS)[::2]
    cells = cells_table(windows, np.random.default_rng(3))
    expected = rollup_partials(
        spark.createDataFrame(rows), None, spec, source, spark.createDataFrame(cells)
    ).toArrow()
    got = partials_arrow(rows, windows, cells, spec, source)
    want, have = by_cell(expected), by_cell(got)
    assert want.keys() == have.keys() and want, (len(want), len(have))
    names = compared(spec)
    bad = [
        (k, n, want[k][n], have[k][n])
        for k in want
        for n in names
        if not same(want[k][n], have[k][n])
    ]
    assert bad == [], bad[:5]


@pytest.mark.parametrize("named", [False, True], ids=["every-entity", "named-cells"])
def test_a_nan_is_ordered_as_on_spark(spark: SparkSession, named: bool) -> None:
    """A max over a NaN is NaN, a min skips it unless every value is NaN, as on Spark; without
    named cells every entity of every bucket is aggregated."""
    spec = CATALOG.rollup("energy_hourly")
    rows = raw_rows(seed=2)
    voltage = rows["voltage_v"].to_pylist()
    # Every voltage of m3's first hour (rows are ordered by time, then entity), one of m1's.
    for i in (2, 5, 8, 11, 3):
        voltage[i] = float("nan")
    current = rows["current_a"].to_pylist()
    current[9] = float("nan")
    rows = rows.set_column(4, "voltage_v", pa.array(voltage, pa.float64()))
    rows = rows.set_column(5, "current_a", pa.array(current, pa.float64()))
    # Every other bucket: named, each of its entities one by one; or for every entity.
    windows = buckets_in(spec, SPANS)[:: 2 if named else 1]
    keys = {
        "bucket_start": pa.array([w.start for w in windows for _ in ENTITIES], TS),
        "bucket_end": pa.array([w.end for w in windows for _ in ENTITIES], TS),
        "entity_id": pa.array([e for _ in windows for e in ENTITIES], pa.string()),
    }
    source = CATALOG.archive(spec.source)
    frame = spark.createDataFrame(rows)
    if named:
        cells = pa.table(keys)
        expected = rollup_partials(frame, None, spec, source, spark.createDataFrame(cells))
        got = partials_arrow(rows, windows, cells, spec, source)
    else:
        targets = pa.table(
            {
                "bucket_start": pa.array([w.start for w in windows], TS),
                "bucket_end": pa.array([w.end for w in windows], TS),
            }
        )
        expected = rollup_partials(frame, spark.createDataFrame(targets), spec, source)
        got = partials_arrow(rows, windows, None, spec, source)
    want, have = by_cell(expected.toArrow()), by_cell(got)
    assert want.keys() == have.keys() and len(want) == len(windows) * len(ENTITIES)
    names = compared(spec)
    bad = [
        (k, n, want[k][n], have[k][n])
        for k in want
        for n in names
        if not same(want[k][n], have[k][n])
    ]
    assert bad == [], bad[:5]
    first = have[("m3", windows[0].start)]  # every voltage NaN: min and max are NaN
    assert np.isnan(first["voltage_v_min"]) and np.isnan(first["voltage_v_max"])
    mixed = have[("m1", windows[0].start)]  # a NaN among numbers: max NaN, min a number
    assert np.isnan(mixed["voltage_v_max"]) and not np.isnan(mixed["voltage_v_min"])
