"""A rollup chain over a time-range archive equals the pandas oracle at every level.

The archive holds `[range_start, range_end)` rows with a declared period of 15 minutes: three
meters report quarter hours, a fourth reports whole hours. The chain (hourly -> daily -> ISO
weekly and monthly -> yearly, in Europe/Vienna) covers both 2025 DST switches (a 23-hour and a
25-hour local day), the 2024/2025 year end and ISO week 2025-W01, and month ends. Each row
belongs to the bucket holding its `range_start`; ingest has already refused any row a bucket
would split. After the backfill, and after late, corrected and deleted range rows (applied as
differences from the change feed, keyed by entity, range_start and range_end), every level
equals a fresh aggregation of the rows, and a batch with a row an hour would split is refused
whole.
"""

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from click.testing import CliRunner
from deltalake import write_deltalake

from rollup_assets.cli import app as cli
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource, Job, JobState
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.specs import TimeRangeArchiveSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.schemas import archive_schema
from rollup_assets.services.ingest import delete_rows
from tests.conftest import World, day_spans, days, world_of
from tests.oracle import compare_all

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
ARCHIVE = "meter_ranges"
HOURLY = "ranges_hourly"
SPANS = [(date(2024, 12, 28), 10), (date(2025, 3, 29), 3), (date(2025, 10, 25), 3)]
QUARTER = timedelta(minutes=15)
HOUR = timedelta(hours=1)
AGGREGATIONS = [
    {"column": "energy_kwh", "function": "Sum"},
    {"column": "energy_kwh", "function": "Count"},
    {"column": "power_kw", "function": "Avg"},
    {"column": "voltage_v", "function": "Min"},
    {"column": "voltage_v", "function": "Max"},
]
VIENNA = {"reference_time_zone": "Europe/Vienna", "aggregations": AGGREGATIONS}
SPECS = {
    "time_range_archives": {
        ARCHIVE: {
            "description": "Quarter-hour (and some hourly) energy per meter",
            "period": "15m",
            "columns": {
                "energy_kwh": {"type": "double", "required": True},
                "power_kw": "double",
                "voltage_v": "double",
            },
        }
    },
    "rollups": {
        HOURLY: {
            **VIENNA,
            "source": ARCHIVE,
            "alignment": "FixedSize",
            "size": "1h",
            "start": "2024-01-01",
        },
        "ranges_daily": {**VIENNA, "source": HOURLY, "alignment": "CalendarDay"},
        "ranges_weekly": {**VIENNA, "source": "ranges_daily", "alignment": "Iso8601Week"},
        "ranges_monthly": {**VIENNA, "source": "ranges_daily", "alignment": "CalendarMonth"},
        "ranges_yearly": {**VIENNA, "source": "ranges_monthly", "alignment": "CalendarYear"},
    },
}
RANGE_SCHEMA = pa.schema(
    [
        ("entity_id", pa.string()),
        ("range_start", pa.timestamp("us", tz="UTC")),
        ("range_end", pa.timestamp("us", tz="UTC")),
        ("energy_kwh", pa.float64()),
        ("power_kw", pa.float64()),
        ("voltage_v", pa.float64()),
    ]
)


@pytest.fixture
def ranges_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark) -> Iterator[World]:
    yield from world_of(tmp_path, monkeypatch, parse_catalog(SPECS, origin="time-range test"))


def quarter_hours(day: date) -> pa.Table:
    """A UTC day of quarter-hour ranges for three meters (a few missing, some nulls)."""
    readings = day_batch(day, 3, seed=23, missing=0.02, null_power=0.1, null_voltage=0.1)
    start = readings["ts"]
    end = pc.add(start, pa.scalar(QUARTER, pa.duration("us")))
    return pa.table(
        {
            "entity_id": readings["entity_id"],
            "range_start": start,
            "range_end": end,
            "energy_kwh": readings["energy_kwh"],
            "power_kw": readings["power_kw"],
            "voltage_v": readings["voltage_v"],
        },
        schema=RANGE_SCHEMA,
    )


def whole_hours(day: date) -> pa.Table:
    """A UTC day of hourly ranges for a fourth meter: longer than the period, still nesting."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    rows = [
        {
            "entity_id": "meter-hourly",
            "range_start": start + h * HOUR,
            "range_end": start + (h + 1) * HOUR,
            "energy_kwh": round(1.0 + 0.1 * h + 0.01 * day.day, 3),
            "power_kw": None if h % 5 == 0 else round(4.0 + 0.2 * h, 3),
            "voltage_v": round(228.0 + (h * 7 + day.day) % 5, 2),
        }
        for h in range(24)
    ]
    return pa.Table.from_pylist(rows, schema=RANGE_SCHEMA)


def sample() -> pa.Table:
    return pa.concat_tables(
        [
            t
            for first, n in SPANS
            for d in days(first, n)
            for t in (quarter_hours(d), whole_hours(d))
        ]
    )


def rows_of(table: pa.Table, entity: str, start: datetime, end: datetime) -> pa.Table:
    col = table["range_start"]
    return table.filter(
        pc.and_(
            pc.equal(table["entity_id"], entity),
            pc.and_(
                pc.greater_equal(col, pa.scalar(start, col.type)),
                pc.less(col, pa.scalar(end, col.type)),
            ),
        )
    )


def hourly_jobs_since(world: World, since: datetime) -> list[Job]:
    return [
        j
        for j in world.engine.ledger.history(HOURLY, limit=500)
        if j.created_at >= since and j.state is JobState.COMPLETED and j.technique
    ]


def test_time_range_chain_equals_the_oracle_after_backfill_and_corrections(
    ranges_world: World,
) -> None:
    world = ranges_world
    data = sample()
    # Two quarter hours of the 25-hour local day arrive late (they are missing at first).
    dst_end = datetime(2025, 10, 26, 1, 0, tzinfo=UTC)  # 02:00 CET, the repeated local hour
    late = rows_of(data, "meter-0001", dst_end, dst_end + 2 * QUARTER)
    assert late.num_rows == 2
    late_keys = set(late["range_start"].to_pylist())
    first = data.filter(
        pa.array(
            [
                not (e == "meter-0001" and t in late_keys)
                for e, t in zip(
                    data["entity_id"].to_pylist(), data["range_start"].to_pylist(), strict=True
                )
            ]
        )
    )
    assert first.num_rows == data.num_rows - 2
    world.ops.activate(ARCHIVE, now=NOW)
    world.ingest(first, archive=ARCHIVE, source="Import")
    world.activate_all(NOW)
    world.backfill(day_spans(SPANS), rollup=HOURLY)
    world.tick(NOW)
    assert compare_all(world.query, world.raw(ARCHIVE), world.catalog) == []
    # The 23-hour and 25-hour local days, and ISO week 2025-W01 across the year end.
    daily = {r["bucket_start"]: r["bucket_end"] for r in world.query("ranges_daily").to_pylist()}
    assert daily[datetime(2025, 3, 29, 23, tzinfo=UTC)] == datetime(2025, 3, 30, 22, tzinfo=UTC)
    assert daily[datetime(2025, 10, 25, 22, tzinfo=UTC)] == datetime(2025, 10, 26, 23, tzinfo=UTC)
    weekly = world.query("ranges_weekly", entities=["meter-0000"]).to_pylist()
    w01 = [r for r in weekly if r["bucket_start"] == datetime(2024, 12, 29, 23, tzinfo=UTC)]
    assert w01 and w01[0]["bucket_end"] == datetime(2025, 1, 5, 23, tzinfo=UTC)

    # Late rows, a corrected quarter hour, a corrected whole-hour row, the quarter hour holding
    # an hour's lowest voltage raised (a retraction of the stored minimum), a row with a known
    # start and a new end, and a deleted row.
    since = datetime.now(UTC)
    world.ingest(late, archive=ARCHIVE, source="Manual")
    year_end = datetime(2024, 12, 31, 22, 45, tzinfo=UTC)  # the last local quarter of 2024
    fixed = rows_of(data, "meter-0002", year_end, year_end + QUARTER)
    fixed = fixed.set_column(3, "energy_kwh", pc.multiply(fixed["energy_kwh"], 4.0))
    world.ingest(fixed, archive=ARCHIVE, source="Manual")
    spring = datetime(2025, 3, 30, 1, 0, tzinfo=UTC)  # 03:00 CEST, just after the switch
    hourly_row = rows_of(data, "meter-hourly", spring, spring + HOUR)
    hourly_row = hourly_row.set_column(3, "energy_kwh", pc.add(hourly_row["energy_kwh"], 10.0))
    world.ingest(hourly_row, archive=ARCHIVE, source="Manual")
    hour = datetime(2025, 1, 3, 9, 0, tzinfo=UTC)
    in_hour = rows_of(data, "meter-0000", hour, hour + HOUR)
    in_hour = in_hour.filter(pc.is_valid(in_hour["voltage_v"]))
    lowest = in_hour.sort_by([("voltage_v", "ascending")]).slice(0, 1)
    lowest = lowest.set_column(5, "voltage_v", pc.add(lowest["voltage_v"], 30.0))
    world.ingest(lowest, archive=ARCHIVE, source="Manual")
    # The same start with another end is another row (the key is entity, start and end).
    half = hourly_row.set_column(2, "range_end", pc.subtract(hourly_row["range_end"], 2 * QUARTER))
    world.ingest(half, archive=ARCHIVE, source="Manual")
    # A quarter hour withdrawn by its producer.
    gone = datetime(2025, 1, 1, 11, 15, tzinfo=UTC)
    deleted = delete_rows(
        world.engine,
        ARCHIVE,
        Window(gone, gone + QUARTER),
        frozenset({"meter-0001"}),
        ChangeSource.MANUAL,
        retention=False,
    )
    assert deleted[1] == 1
    world.tick(NOW)
    assert compare_all(world.query, world.raw(ARCHIVE), world.catalog) == []

    jobs = hourly_jobs_since(world, since)
    assert jobs and all(j.technique == "difference" for j in jobs), [
        (j.technique, j.plan) for j in jobs
    ]
    assert all("no stored cell read" in (j.plan or "") for j in jobs)
    assert sum(j.source_rows or 0 for j in jobs) == 0
    # Inserts (two late, one new key) and the pre- and post-images of three updates.
    assert sum(j.change_rows or 0 for j in jobs) >= 3 + 2 * 3
    half_hour = world.query(HOURLY, start=spring, end=spring + HOUR, entities=["meter-hourly"])
    assert half_hour["energy_kwh_count"].to_pylist() == [2]
    again = world.tick(NOW)
    assert sum(len(r.runs) for r in again) == 0

    # A corrected row that would now straddle an hour is refused whole, the good row with it.
    stretched = rows_of(data, "meter-0000", hour, hour + HOUR).slice(3, 1)
    stretched = stretched.set_column(2, "range_end", pc.add(stretched["range_end"], QUARTER))
    good = rows_of(data, "meter-0000", hour, hour + HOUR).slice(0, 1)
    good = good.set_column(3, "energy_kwh", pc.add(good["energy_kwh"], 1.0))
    spec = world.catalog.archive(ARCHIVE)
    assert isinstance(spec, TimeRangeArchiveSpec)
    before = world.engine.raw.table(spec)
    with pytest.raises(IngestValidationError, match=r"row 1: .*rollup 'ranges_hourly'"):
        world.ingest(pa.concat_tables([good, stretched]), archive=ARCHIVE, source="Manual")
    after = world.engine.raw.table(spec)
    assert before is not None and after is not None and after.version() == before.version()

    # `rollups verify` checks the chain over the time-range archive too, and reports a row that
    # another Delta writer (no ingest checks) put in across an hour.
    specs = world.root / "specs.yaml"
    specs.write_text(yaml.safe_dump(SPECS), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLUPS_SPECS", str(specs))
        mp.setenv("ROLLUPS_WAREHOUSE", str(world.engine.warehouse.root))
        for cached in (cli.settings, cli.catalog, cli.engine):
            cached.cache_clear()
        try:
            agree = CliRunner().invoke(cli.main, ["verify"])
            assert agree.exit_code == 0, agree.output
            assert "every level equals" in agree.output
            direct = stretched.append_column(
                "day", pc.cast(stretched["range_start"], pa.date32())
            ).cast(archive_schema(spec))
            write_deltalake(world.engine.raw.uri(spec), direct, mode="append")
            split = CliRunner().invoke(cli.main, ["verify"])
            assert split.exit_code == 1
            assert "ranges_hourly: 1 source row(s) span more than one bucket" in split.output
        finally:
            for cached in (cli.settings, cli.catalog, cli.engine):
                cached.cache_clear()
