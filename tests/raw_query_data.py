"""Sample archives for the downsampling queries over raw and time-range archives (unit tests on
Arrow, integration tests on Spark), written with delta-rs.

Three meters' 15-minute readings over the 2024/2025 year end (ISO week 2025-W01 spans it) and the
two Vienna DST days of 2025 (30 March, 23 hours; 26 October, 25 hours), with nulls, and NaNs
another Delta writer put in (ingest reads NaN as missing); and a time-range archive of
quarter-hour and whole-hour ranges over the same days, with a long and a string column.
"""

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from deltalake import DeltaTable

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.specs import Catalog
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.operations import Operations
from rollup_assets.settings import DEFAULT_SPECS

NOW = datetime(2026, 1, 10, 12, tzinfo=UTC)
VIENNA = "Europe/Vienna"
# Three UTC days around each of: the year end, the 23-hour day, the 25-hour day.
DAYS = [
    first + timedelta(days=i)
    for first in (date(2024, 12, 30), date(2025, 3, 29), date(2025, 10, 25))
    for i in range(3)
]
METERS = 3
RAW_AGGS = [
    ("energy_kwh", "sum"),
    ("energy_kwh", "count"),
    ("power_kw", "avg"),
    ("voltage_v", "min"),
    ("voltage_v", "max"),
    ("current_a", "max"),  # computed on ingest
]
RANGE_AGGS = [
    ("energy_kwh", "sum"),
    ("energy_kwh", "avg"),
    ("pulses", "sum"),
    ("pulses", "max"),
    ("status", "count"),
]
# A reading hour where another writer made every voltage NaN (and one energy and one power).
NAN_HOUR = datetime(2025, 10, 26, 10, tzinfo=UTC)
NAN_METER = "meter-0001"
# An hour where every voltage is null.
NULL_HOUR = datetime(2025, 3, 30, 5, tzinfo=UTC)
NULL_METER = "meter-0002"


def catalog() -> Catalog:
    return parse_catalog(catalog_doc())


def catalog_doc() -> dict:
    """The default spec file with the time-range archive `meter_ranges` added."""
    doc = yaml.safe_load(Path(DEFAULT_SPECS).read_text())
    doc["time_range_archives"] = {
        "meter_ranges": {
            "period": "15m",
            "columns": {
                "energy_kwh": {"type": "double", "required": True},
                "pulses": "long",
                "status": "string",
            },
        }
    }
    return doc


def range_rows() -> pa.Table:
    """Quarter-hour ranges of two meters and whole-hour ranges of a third over every day,
    some values null."""
    rng = np.random.default_rng(11)
    rows: dict[str, list] = {k: [] for k in ("entity_id", "range_start", "range_end")}
    for d in DAYS:
        first = datetime(d.year, d.month, d.day, tzinfo=UTC)
        for meter, length in (("rm-1", 15), ("rm-2", 15), ("rm-h", 60)):
            for k in range(24 * 60 // length):
                rows["entity_id"].append(meter)
                rows["range_start"].append(first + timedelta(minutes=length * k))
                rows["range_end"].append(first + timedelta(minutes=length * (k + 1)))
    n = len(rows["entity_id"])
    pulses = rng.integers(0, 1000, n)
    status = rng.choice(["ok", "estimated"], n)
    return pa.table(
        {
            **{
                k: pa.array(v, pa.timestamp("us", tz="UTC"))
                for k, v in rows.items()
                if k != "entity_id"
            },
            "entity_id": rows["entity_id"],
            "energy_kwh": rng.gamma(2.0, 0.3, n),
            "pulses": pa.array(pulses, pa.int64(), mask=rng.random(n) < 0.1),
            "status": pa.array(status, pa.string(), mask=rng.random(n) < 0.2),
        }
    )


def build_engine(root: Path) -> Engine:
    """An engine over a new warehouse under `root` holding the activated sample archives."""
    eng = Engine(catalog(), Warehouse(str(root / "warehouse")))
    ops = Operations(eng, actor="test")
    for name in ("energy_raw", "meter_ranges"):
        ops.activate(name, now=NOW)
    readings = pa.concat_tables(
        [day_batch(d, METERS, seed=3, null_power=0.1, null_voltage=0.1) for d in DAYS]
    )
    for name, table in (("energy_raw", readings), ("meter_ranges", range_rows())):
        path = root / f"{name}.parquet"
        pq.write_table(table, path)
        eng.raw.ingest(eng.catalog.archive(name), path, ChangeSource("Import"))
    raw = DeltaTable(eng.raw.uri(eng.catalog.raw["energy_raw"]))
    hour = within_hour(NAN_HOUR)
    raw.update(
        updates={"voltage_v": "CAST('NaN' AS DOUBLE)"},
        predicate=f"entity_id = '{NAN_METER}' AND {hour}",
    )
    quarter = NAN_HOUR + timedelta(minutes=15)
    raw.update(
        updates={"energy_kwh": "CAST('NaN' AS DOUBLE)", "power_kw": "CAST('NaN' AS DOUBLE)"},
        predicate=f"entity_id = '{NAN_METER}' AND ts = '{quarter:%Y-%m-%dT%H:%M:%SZ}'",
    )
    null_hour = within_hour(NULL_HOUR)
    raw.update(
        updates={"voltage_v": "CAST(NULL AS DOUBLE)"},
        predicate=f"entity_id = '{NULL_METER}' AND {null_hour}",
    )
    return eng


def within_hour(t: datetime) -> str:
    """A Delta predicate: readings of the hour starting at `t`."""
    return f"ts >= '{t:%Y-%m-%dT%H:%M:%SZ}' AND ts < '{t + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}'"


def rows_of(engine: Engine, archive: str) -> pa.Table:
    """Every row of an archive, read straight from its Delta table (not through the query)."""
    return DeltaTable(engine.raw.uri(engine.catalog.archive(archive))).to_pyarrow_table()


def specs(aggs: list[tuple[str, str]]) -> list[str]:
    return [f"{c}:{f}" for c, f in aggs]
