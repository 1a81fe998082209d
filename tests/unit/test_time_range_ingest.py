"""Ingest into a time-range archive refuses a row that a rollup built from it would split.

A time-range row `[range_start, range_end)` is aggregated into the bucket holding its
`range_start`, so its whole range must lie within that bucket of every first-level rollup over
the archive, in the rollup's reference zone. A batch holding such a row is rejected whole, at
the first offending row, naming the archive, the row and the rollup; nothing is written. The
expected verdicts come from calendar facts written out by hand and from the pandas oracle's
independent bucket arithmetic (`split_rows`), not from the ingest code.
"""

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.specs import Catalog, TimeRangeArchiveSpec
from rollup_assets.resources.batch_conversion import BatchConverter
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.schemas import archive_schema
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.verify import split_rows

ARCHIVE = "ranges"
Q = timedelta(minutes=15)
H = timedelta(hours=1)
SCHEMA = pa.schema(
    [
        ("entity_id", pa.string()),
        ("range_start", pa.timestamp("us", tz="UTC")),
        ("range_end", pa.timestamp("us", tz="UTC")),
        ("kwh", pa.float64()),
    ]
)
ALIGNMENTS = {
    "hourly": {"alignment": "FixedSize", "size": "1h"},
    "daily": {"alignment": "CalendarDay"},
    "weekly": {"alignment": "Iso8601Week"},
    "monthly": {"alignment": "CalendarMonth"},
    "yearly": {"alignment": "CalendarYear"},
}


def catalog_of(*levels: tuple[str, str, str]) -> Catalog:
    """A 15-minute time-range archive with first-level rollups (name, alignment key, zone)."""
    rollups = {
        name: {
            "source": ARCHIVE,
            "reference_time_zone": zone,
            "start": "2020-01-01",
            "aggregations": [{"column": "kwh", "function": "Sum"}],
            **ALIGNMENTS[kind],
        }
        for name, kind, zone in levels
    }
    return parse_catalog(
        {
            "time_range_archives": {ARCHIVE: {"period": "15m", "columns": {"kwh": "double"}}},
            "rollups": rollups,
        }
    )


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def batch(*ranges: tuple[datetime, datetime], entity: str = "m1") -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"entity_id": entity, "range_start": a, "range_end": b, "kwh": 1.0 + i}
            for i, (a, b) in enumerate(ranges)
        ],
        schema=SCHEMA,
    )


def ingest(store: RawStore, spec: TimeRangeArchiveSpec, table: pa.Table, path: Path) -> int:
    """Ingest `table` (creating the archive's table first); the commit's version."""
    store.ensure_table(spec)
    pq.write_table(table, path)
    return store.ingest(spec, path, ChangeSource.MANUAL).version


@pytest.fixture
def store(tmp_path: Path) -> RawStore:
    return RawStore(Warehouse(str(tmp_path / "warehouse")))


# Each case: a first-level rollup, a range, and whether it lies within one of its buckets.
CASES = [
    # Hourly buckets: a one-hour range from 00:30 to 01:30 straddles 01:00.
    ("hourly", "Europe/Vienna", utc(2025, 1, 14, 0, 30), utc(2025, 1, 14, 1, 30), False),
    ("hourly", "Europe/Vienna", utc(2025, 1, 14, 0, 50), utc(2025, 1, 14, 1, 5), False),
    ("hourly", "Europe/Vienna", utc(2025, 1, 14, 0, 45), utc(2025, 1, 14, 1, 0), True),
    ("hourly", "Europe/Vienna", utc(2025, 1, 14, 0, 0), utc(2025, 1, 14, 1, 0), True),
    # Vienna days: local midnight is 23:00Z in winter, 22:00Z in summer.
    ("daily", "Europe/Vienna", utc(2025, 1, 14, 22, 30), utc(2025, 1, 14, 23, 30), False),
    ("daily", "Europe/Vienna", utc(2025, 1, 14, 22, 0), utc(2025, 1, 14, 23, 0), True),
    ("daily", "Europe/Vienna", utc(2025, 7, 14, 21, 30), utc(2025, 7, 14, 22, 30), False),
    ("daily", "Europe/Vienna", utc(2025, 7, 14, 22, 0), utc(2025, 7, 14, 23, 0), True),
    ("daily", "UTC", utc(2025, 1, 14, 22, 30), utc(2025, 1, 14, 23, 30), True),
    ("daily", "UTC", utc(2025, 1, 14, 23, 30), utc(2025, 1, 15, 0, 30), False),
    # The 23-hour day of 2025-03-30 (23:00Z .. 22:00Z) and the 25-hour day of 2025-10-26.
    ("daily", "Europe/Vienna", utc(2025, 3, 29, 23, 0), utc(2025, 3, 30, 22, 0), True),
    ("daily", "Europe/Vienna", utc(2025, 3, 29, 23, 0), utc(2025, 3, 30, 23, 0), False),
    ("daily", "Europe/Vienna", utc(2025, 3, 30, 21, 30), utc(2025, 3, 30, 22, 30), False),
    ("daily", "Europe/Vienna", utc(2025, 10, 25, 22, 0), utc(2025, 10, 26, 23, 0), True),
    ("daily", "Europe/Vienna", utc(2025, 10, 26, 22, 30), utc(2025, 10, 26, 23, 30), False),
    # ISO weeks (Monday 2025-01-06 starts at 2025-01-05 23:00Z), months, years.
    ("weekly", "Europe/Vienna", utc(2025, 1, 5, 22, 30), utc(2025, 1, 5, 23, 30), False),
    ("weekly", "Europe/Vienna", utc(2025, 1, 5, 22, 45), utc(2025, 1, 5, 23, 0), True),
    ("monthly", "Europe/Vienna", utc(2025, 1, 31, 22, 30), utc(2025, 1, 31, 23, 30), False),
    ("monthly", "Europe/Vienna", utc(2025, 1, 31, 22, 0), utc(2025, 1, 31, 23, 0), True),
    ("yearly", "Europe/Vienna", utc(2024, 12, 31, 22, 45), utc(2024, 12, 31, 23, 15), False),
    ("yearly", "Europe/Vienna", utc(2024, 12, 31, 23, 0), utc(2025, 12, 31, 23, 0), True),
]


@pytest.mark.parametrize(
    ("kind", "zone", "start", "end", "fits"),
    [pytest.param(*c, id=f"{c[0]}-{c[1]}-{c[2]:%m%dT%H%M}-{c[3]:%m%dT%H%M}") for c in CASES],
)
def test_a_range_a_bucket_would_split_is_refused_with_its_row(
    store: RawStore,
    tmp_path: Path,
    kind: str,
    zone: str,
    start: datetime,
    end: datetime,
    fits: bool,
) -> None:
    spec = catalog_of((f"r_{kind}", kind, zone)).time_range[ARCHIVE]
    base = ingest(
        store, spec, batch((utc(2020, 6, 1, 0, 0), utc(2020, 6, 1, 0, 15))), tmp_path / "a.parquet"
    )
    # Row 0 is fine everywhere; row 1 is the case.
    rows = batch((utc(2020, 6, 2, 0, 0), utc(2020, 6, 2, 0, 15)), (start, end))
    if fits:
        assert ingest(store, spec, rows, tmp_path / "b.parquet") == base + 1
        assert DeltaTable(store.uri(spec)).to_pyarrow_table().num_rows == 3
        return
    with pytest.raises(IngestValidationError) as info:
        ingest(store, spec, rows, tmp_path / "b.parquet")
    err = info.value
    assert (err.archive, err.row) == (ARCHIVE, 1)
    assert f"rollup 'r_{kind}'" in err.reason and zone in err.reason
    assert f"ingest into '{ARCHIVE}' rejected at row 1" in str(err)
    assert "nothing was written" in str(err)
    table = DeltaTable(store.uri(spec))
    assert table.version() == base and table.to_pyarrow_table().num_rows == 1


def test_the_message_names_the_range_and_the_boundary(store: RawStore, tmp_path: Path) -> None:
    spec = catalog_of(("energy_hourly", "hourly", "Europe/Vienna")).time_range[ARCHIVE]
    rows = batch(
        (utc(2025, 1, 1, 0, 0), utc(2025, 1, 1, 0, 15)),
        (utc(2025, 1, 1, 0, 30), utc(2025, 1, 1, 1, 30)),
    )
    with pytest.raises(IngestValidationError) as info:
        ingest(store, spec, rows, tmp_path / "b.parquet")
    assert info.value.reason == (
        "range [2025-01-01T00:30:00Z, 2025-01-01T01:30:00Z) crosses 2025-01-01T01:00:00Z, a "
        "bucket boundary of rollup 'energy_hourly' (FixedSize 1h in Europe/Vienna); a time-range "
        "row must lie within one bucket of every rollup built from the archive"
    )
    assert DeltaTable(store.uri(spec)).version() == 0  # the empty table, as created


def test_every_first_level_rollup_is_checked_in_its_own_zone(
    store: RawStore, tmp_path: Path
) -> None:
    spec = catalog_of(("utc_daily", "daily", "UTC"), ("vienna_daily", "daily", "Europe/Vienna"))
    archive = spec.time_range[ARCHIVE]
    over_utc_midnight = (utc(2025, 1, 14, 23, 30), utc(2025, 1, 15, 0, 30))
    over_vienna_midnight = (utc(2025, 1, 14, 22, 30), utc(2025, 1, 14, 23, 30))
    for ranges, rollup in (
        ((over_utc_midnight,), "utc_daily"),
        ((over_vienna_midnight,), "vienna_daily"),
        # The first offending row wins, whichever rollup it breaks.
        ((over_vienna_midnight, over_utc_midnight), "vienna_daily"),
        ((over_utc_midnight, over_vienna_midnight), "utc_daily"),
    ):
        with pytest.raises(IngestValidationError) as info:
            ingest(store, archive, batch(*ranges), tmp_path / "b.parquet")
        assert info.value.row == 0 and f"rollup '{rollup}'" in info.value.reason
    # A rollup over a rollup adds no rule of its own: its buckets nest.
    assert [r.name for r in archive.first_levels] == ["utc_daily", "vienna_daily"]


@pytest.mark.parametrize(
    ("rows", "row", "reason"),
    [
        pytest.param(
            [(0, 15), (30, 90), (45, 45)], 1, "bucket boundary", id="split-before-inverted"
        ),
        pytest.param(
            [(0, 15), (45, 45), (30, 90)], 1, "range_start must be before", id="inverted-first"
        ),
        pytest.param([(0, 15), (0, 15), (30, 90)], 1, "duplicate key", id="duplicate-first"),
    ],
)
def test_the_first_offending_row_is_reported_whatever_its_fault(
    store: RawStore, tmp_path: Path, rows: list[tuple[int, int]], row: int, reason: str
) -> None:
    spec = catalog_of(("r_hourly", "hourly", "Europe/Vienna")).time_range[ARCHIVE]
    t0 = utc(2025, 1, 14, 0, 0)
    minutes = [(t0 + timedelta(minutes=a), t0 + timedelta(minutes=b)) for a, b in rows]
    with pytest.raises(IngestValidationError) as info:
        ingest(store, spec, batch(*minutes), tmp_path / "b.parquet")
    assert info.value.row == row and reason in info.value.reason, str(info.value)
    if reason == "duplicate key":
        assert "(entity_id, range_start, range_end)" in info.value.reason


def test_an_archive_no_rollup_is_built_from_takes_any_range(
    store: RawStore, tmp_path: Path
) -> None:
    spec = catalog_of().time_range[ARCHIVE]
    rows = batch((utc(2025, 1, 14, 0, 30), utc(2025, 1, 16, 1, 30)))
    assert ingest(store, spec, rows, tmp_path / "b.parquet") == 1


def test_ranges_at_the_end_of_representable_time(store: RawStore, tmp_path: Path) -> None:
    spec = catalog_of(
        ("r_hourly", "hourly", "UTC"), ("r_yearly", "yearly", "Europe/Vienna")
    ).time_range[ARCHIVE]
    last = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    fine = batch((utc(9999, 12, 31, 23, 0), last))
    assert ingest(store, spec, fine, tmp_path / "a.parquet") == 1
    split = batch((utc(9999, 12, 31, 22, 30), utc(9999, 12, 31, 23, 30)))
    with pytest.raises(IngestValidationError, match="rollup 'r_hourly'"):
        ingest(store, spec, split, tmp_path / "b.parquet")


def random_ranges(seed: int, n: int) -> pa.Table:
    """Ranges of 15 minutes to 3 hours on the quarter-hour grid around DST switches, an ISO
    week start, and month and year ends in Vienna."""
    rng = np.random.default_rng(seed)
    anchors = [date(2025, 3, 29), date(2025, 10, 25), date(2024, 12, 30), date(2025, 1, 4)]
    rows = []
    for _ in range(n):
        d = anchors[int(rng.integers(len(anchors)))]
        start = utc(d.year, d.month, d.day) + Q * int(rng.integers(0, 3 * 96))
        rows.append((start, start + Q * int(rng.integers(1, 13))))
    return pa.Table.from_pylist(
        [
            {"entity_id": f"m{i}", "range_start": a, "range_end": b, "kwh": 1.0}
            for i, (a, b) in enumerate(rows)
        ],
        schema=SCHEMA,
    )


def test_verdicts_agree_with_the_oracles_bucket_arithmetic() -> None:
    cat = catalog_of(
        ("r_hourly", "hourly", "Europe/Vienna"),
        ("r_daily", "daily", "Europe/Vienna"),
        ("r_weekly", "weekly", "Europe/Vienna"),
        ("r_monthly", "monthly", "Europe/Vienna"),
        ("r_yearly", "yearly", "Europe/Vienna"),
    )
    spec = cat.time_range[ARCHIVE]
    converter = BatchConverter(spec, archive_schema(spec))
    table = random_ranges(seed=5, n=400)
    frame = table.to_pandas()
    for c in ("range_start", "range_end"):
        frame[c] = pd.to_datetime(frame[c], utc=True)
    splits: dict[str, set[int]] = {
        r.name: set(split_rows(frame, r).index.tolist()) for r in spec.first_levels
    }
    verdicts: dict[str, int] = {"accepted": 0, "refused": 0}
    for i in range(table.num_rows):
        expected = next((name for name, rows in splits.items() if i in rows), None)
        try:
            converter.convert(table.slice(i, 1), i)
            got: Any = None
        except IngestValidationError as err:
            assert err.row == i
            got = err.reason.split("rollup '")[1].split("'")[0]
        assert got == expected, (table.slice(i, 1).to_pylist(), got, expected)
        verdicts["refused" if expected else "accepted"] += 1
    assert min(verdicts.values()) > 50, verdicts  # both verdicts are exercised
