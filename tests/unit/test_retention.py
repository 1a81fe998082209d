"""Raw retention without Spark: the horizon by UTC day, the spec key, what maintenance drops from
a real Delta table, and the gates around it (ingest, manual recompute, rewind)."""

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollup_assets.model.errors import (
    ArchiveNotActivatedError,
    IngestValidationError,
    RawRowsRetainedError,
    SpecError,
)
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.retention import removed_within, retention_cut, retention_horizon
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import schema_fingerprint
from rollup_assets.model.windows import Window
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.ingest import ingest_file
from rollup_assets.services.operations import Operations
from rollup_assets.services.retention import apply_retention

D = timedelta(days=1)
CATALOG = load_catalog()
RAW = CATALOG.raw["energy_raw"]
RETENTION = RAW.retention
assert RETENTION is not None, "the shipped energy_raw declares a retention"
FIRST = date(2025, 5, 1)
DAYS = [FIRST + i * D for i in range(6)]


def midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


# -- the horizon, by UTC day ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "first_kept"),
    [
        # now - retention exactly at a midnight: the day ending there goes, the next stays.
        (datetime(2025, 7, 10, tzinfo=UTC), date(2025, 6, 30)),
        (datetime(2025, 7, 10, 0, 0, 0, 1, tzinfo=UTC), date(2025, 6, 30)),
        # a microsecond earlier, the day ending at that midnight still has a younger instant.
        (datetime(2025, 7, 9, 23, 59, 59, 999999, tzinfo=UTC), date(2025, 6, 29)),
        # by UTC day, whatever zone `now` is given in: 01:30 in Vienna is 23:30 UTC the day before.
        (datetime(2025, 7, 10, 1, 30, tzinfo=ZoneInfo("Europe/Vienna")), date(2025, 6, 29)),
    ],
)
def test_the_horizon_drops_whole_utc_days_strictly_older_than_now_minus_retention(
    now: datetime, first_kept: date
) -> None:
    horizon = retention_horizon(now, timedelta(days=10))
    assert horizon == midnight(first_kept)
    # Every instant of the last dropped day is older than now - retention; the first kept
    # day holds an instant that is not.
    assert horizon <= now - timedelta(days=10) < horizon + D


def test_the_cut_waits_for_the_day_of_every_hold() -> None:
    now, keep = datetime(2025, 7, 10, 12, tzinfo=UTC), timedelta(days=10)
    assert retention_cut(now, keep, []) == midnight(date(2025, 6, 30))
    hold = datetime(2025, 6, 25, 7, 15, tzinfo=UTC)  # a watermark inside 06-25: that day stays
    assert retention_cut(now, keep, [hold]) == midnight(date(2025, 6, 25))
    assert retention_cut(now, keep, [datetime(2025, 8, 1, tzinfo=UTC)]) == midnight(
        date(2025, 6, 30)
    )


def test_removed_within_is_the_overlap_of_the_asked_windows_with_the_removed_ranges() -> None:
    removed = [Window(midnight(date(1, 1, 1)), midnight(DAYS[2]))]
    asked = [
        Window(midnight(DAYS[1]), midnight(DAYS[3])),
        Window(midnight(DAYS[4]), midnight(DAYS[5])),
    ]
    assert removed_within(asked, removed) == [Window(midnight(DAYS[1]), midnight(DAYS[2]))]
    assert removed_within(asked[1:], removed) == []


# -- the spec key -----------------------------------------------------------------------------


def spec_doc(retention: object, rollup_extra: dict | None = None) -> dict:
    raw: dict = {"columns": {"kwh": {"type": "double", "required": True}}}
    if retention is not None:
        raw["retention"] = retention
    return {
        "raw_archives": {"meter": raw},
        "rollups": {
            "meter_hourly": {
                "source": "meter",
                "alignment": "FixedSize",
                "size": "1h",
                "start": "2024-01-01",
                "aggregations": [{"column": "kwh", "function": "Sum"}],
                **(rollup_extra or {}),
            }
        },
    }


@pytest.mark.parametrize(("text", "expected"), [("400d", 400 * D), ("P30D", 30 * D), (None, None)])
def test_retention_is_a_duration_and_absent_means_forever(text: object, expected: object) -> None:
    assert parse_catalog(spec_doc(text)).raw["meter"].retention == expected


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        ("soon", None, "is not a duration"),
        ("0s", None, "must be positive"),
        # A monthly first level: a 30-day retention would drop rows of a month still open.
        ("30d", {"alignment": "CalendarMonth", "size": None}, "rollup 'meter_hourly'"),
        ("1h", {"watermark_lag": "5m"}, "longest bucket plus watermark lag"),
    ],
)
def test_a_bad_retention_fails_at_load_naming_the_archive(
    text: str, extra: dict | None, message: str
) -> None:
    doc = spec_doc(text, extra)
    if extra and extra.get("size", "") is None:
        del doc["rollups"]["meter_hourly"]["size"]
        del extra["size"]
    with pytest.raises(SpecError, match=message) as err:
        parse_catalog(doc)
    assert err.value.archive == "meter" and err.value.rule == "retention"


def test_retention_is_not_part_of_the_schema_an_activated_archive_freezes() -> None:
    a, b = parse_catalog(spec_doc("30d")), parse_catalog(spec_doc("400d"))
    assert schema_fingerprint(a.raw["meter"]) == schema_fingerprint(b.raw["meter"])


# -- maintenance drops exactly the old days, on a real Delta table ------------------------------


class Warehouse1:
    """An engine over a fresh warehouse (delta-rs only) and a landing directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.engine = Engine(CATALOG, Warehouse(str(root / "wh")))
        self.ops = Operations(self.engine, actor="test")
        self.files = 0

    def readings(self, days: list[date]) -> pa.Table:
        """Two meters, every 15 minutes, over whole UTC days (00:00 and 23:45 included)."""
        rows = [
            {"entity_id": m, "ts": midnight(d) + i * timedelta(minutes=15), "energy_kwh": 1.0 + i}
            for d in days
            for m in ("m1", "m2")
            for i in range(96)
        ]
        return pa.Table.from_pylist(rows)

    def landing(self, table: pa.Table) -> Path:
        self.files += 1
        path = self.root / f"batch-{self.files}.parquet"
        pq.write_table(table, path)
        return path

    def version(self) -> int | None:
        table = self.engine.raw.table(RAW)
        return None if table is None else table.version()


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse1:
    return Warehouse1(tmp_path)


def stored_days(wh: Warehouse1) -> dict[date, int]:
    ts = wh.engine.raw.read_arrow(RAW)["ts"].to_pylist()
    out: dict[date, int] = {}
    for t in ts:
        out[t.astimezone(UTC).date()] = out.get(t.astimezone(UTC).date(), 0) + 1
    return out


def test_maintenance_drops_exactly_the_utc_days_older_than_the_horizon(wh: Warehouse1) -> None:
    wh.ops.activate("energy_raw", now=midnight(FIRST))
    ingest_file(wh.engine, "energy_raw", wh.landing(wh.readings(DAYS)), ChangeSource.IMPORT)
    # The hourly level has aggregated everything (activated long after the data).
    wh.ops.activate("energy_hourly", now=midnight(DAYS[-1]) + 30 * D)
    before = wh.version()
    # now - retention = 05-04 00:00 exactly: 05-01..05-03 go, 05-04 (starting there) stays.
    now = midnight(DAYS[3]) + RETENTION
    [outcome] = apply_retention(wh.engine, now)
    assert outcome.days == tuple(DAYS[:3]) and outcome.rows == 3 * 2 * 96, outcome
    assert stored_days(wh) == {d: 2 * 96 for d in DAYS[3:]}
    assert wh.engine.states.get("energy_raw").retained_from == midnight(DAYS[3])
    assert wh.version() == before + 1  # one commit
    # Again a microsecond before the next midnight: nothing more goes.
    [again] = apply_retention(wh.engine, midnight(DAYS[4]) + RETENTION - timedelta(microseconds=1))
    assert (
        again.days == ()
        and again.version is None
        and stored_days(wh) == {d: 2 * 96 for d in DAYS[3:]}
    )
    # What is gone is one answer for every use case: everything before the kept day.
    assert wh.engine.removed_spans(RAW)[-1].end == midnight(DAYS[3])


def test_a_first_level_watermark_holds_retention_back(wh: Warehouse1) -> None:
    wh.ops.activate("energy_raw", now=midnight(FIRST))
    ingest_file(wh.engine, "energy_raw", wh.landing(wh.readings(DAYS)), ChangeSource.IMPORT)
    # The hourly level has aggregated up to 05-02 10:00 only: 05-02 is still needed.
    wh.ops.activate("energy_hourly", now=midnight(DAYS[1]) + timedelta(hours=11))
    mark = wh.engine.states.get("energy_hourly").watermark
    assert mark is not None and mark.date() == DAYS[1]
    [outcome] = apply_retention(wh.engine, midnight(DAYS[5]) + RETENTION)
    assert outcome.days == (DAYS[0],) and "energy_hourly" in outcome.held_by
    assert set(stored_days(wh)) == set(DAYS[1:])


def test_an_archive_not_activated_keeps_its_days(wh: Warehouse1) -> None:
    wh.ops.activate("energy_raw", now=midnight(FIRST))
    ingest_file(wh.engine, "energy_raw", wh.landing(wh.readings(DAYS)), ChangeSource.IMPORT)
    wh.ops.disable("energy_raw")
    assert apply_retention(wh.engine, midnight(DAYS[5]) + RETENTION) == []
    assert set(stored_days(wh)) == set(DAYS)


# -- the gates --------------------------------------------------------------------------------


def test_the_python_ingest_api_refuses_an_archive_that_is_not_activated(wh: Warehouse1) -> None:
    path = wh.landing(wh.readings(DAYS[:1]))
    with pytest.raises(
        ArchiveNotActivatedError, match=r"'energy_raw' is not activated \(status Created\)"
    ):
        ingest_file(wh.engine, "energy_raw", path, ChangeSource.PIPELINE)
    assert wh.version() is None  # no table, nothing written
    wh.ops.activate("energy_raw", now=midnight(FIRST))
    wh.ops.disable("energy_raw")
    before = wh.version()
    with pytest.raises(ArchiveNotActivatedError, match=r"status Disabled"):
        ingest_file(wh.engine, "energy_raw", path, ChangeSource.PIPELINE)
    assert wh.version() == before and stored_days(wh) == {}


def test_retention_refuses_readings_it_dropped_and_first_level_work_over_them(
    wh: Warehouse1,
) -> None:
    wh.ops.activate("energy_raw", now=midnight(FIRST))
    ingest_file(wh.engine, "energy_raw", wh.landing(wh.readings(DAYS)), ChangeSource.IMPORT)
    for name in ("energy_hourly", "energy_daily"):
        wh.ops.activate(name, now=midnight(DAYS[-1]) + 30 * D)
    apply_retention(wh.engine, midnight(DAYS[3]) + RETENTION)
    version = wh.version()

    # A late reading for a dropped day: refused whole.
    late = wh.readings([DAYS[1]]).slice(0, 1)
    with pytest.raises(IngestValidationError, match="retention has dropped those days"):
        ingest_file(wh.engine, "energy_raw", wh.landing(late), ChangeSource.MANUAL)
    assert wh.version() == version

    # A manual first-level recompute reaching into them: refused, naming rollup and range.
    jobs = len(wh.engine.ledger.snapshot().jobs)
    start, end = midnight(DAYS[2]) + timedelta(hours=20), midnight(DAYS[3]) + timedelta(hours=2)
    with pytest.raises(RawRowsRetainedError) as err:
        wh.ops.request_recompute("energy_hourly", start, end)
    text = str(err.value)
    assert "'energy_hourly'" in text and "[2025-05-03T20:00:00Z, 2025-05-04T02:00:00Z)" in text
    assert "[2025-05-03T20:00:00Z, 2025-05-04T00:00:00Z)" in text  # the part that is gone
    assert len(wh.engine.ledger.snapshot().jobs) == jobs  # nothing recorded
    # The same range after the kept day's start is fine, and so is the level above.
    wh.ops.request_recompute(
        "energy_hourly", midnight(DAYS[3]), midnight(DAYS[3]) + 2 * timedelta(hours=1)
    )
    wh.ops.request_recompute("energy_daily", midnight(DAYS[1]), midnight(DAYS[2]))
    # Rewinding the first level into them would make the forward lane aggregate them again.
    with pytest.raises(RawRowsRetainedError, match="energy_hourly"):
        wh.ops.rewind("energy_hourly", midnight(DAYS[2]))


def test_reads_of_the_latest_raw_files_follow_every_commit(wh: Warehouse1) -> None:
    """A driver read without a table version lists the table's files from memory between
    commits; an ingest and a retention drop are seen at once, with the version read."""
    wh.ops.activate("energy_raw", now=midnight(FIRST))
    ingest_file(wh.engine, "energy_raw", wh.landing(wh.readings(DAYS[:2])), ChangeSource.IMPORT)
    every = [Window(midnight(DAYS[0]), midnight(DAYS[-1]) + D)]
    rows, version = wh.engine.raw.read_rows(RAW, every, None)
    assert rows.num_rows == 2 * 2 * 96 and version == wh.version()
    ingest_file(wh.engine, "energy_raw", wh.landing(wh.readings(DAYS[2:4])), ChangeSource.IMPORT)
    rows, version = wh.engine.raw.read_rows(RAW, every, None)
    assert rows.num_rows == 4 * 2 * 96 and version == wh.version()
    wh.ops.activate("energy_hourly", now=midnight(DAYS[-1]) + 30 * D)
    apply_retention(wh.engine, midnight(DAYS[1]) + RETENTION)  # drops the first day
    rows, version = wh.engine.raw.read_rows(RAW, every, None)
    assert rows.num_rows == 3 * 2 * 96 and version == wh.version()
    assert rows.equals(wh.engine.raw.read_rows(RAW, every, None, table=wh.engine.raw.table(RAW))[0])
