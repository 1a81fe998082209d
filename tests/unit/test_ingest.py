"""Raw ingest on delta-rs alone: upsert semantics, all-or-nothing validation, file formats.

Expected tables are built independently of the ingest code (plain Python / pandas on the input
rows) and compared with what delta-rs reads back from the Delta log.
"""

import math
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import RawArchiveSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources import raw_reads
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.settings import DEFAULT_SPECS

ENERGY = load_catalog(DEFAULT_SPECS).raw["energy_raw"]
MIXED = parse_catalog(
    {
        "raw_archives": {
            "mixed_raw": {
                "columns": {
                    "reading": {"type": "double", "required": True},
                    "pulses": "long",
                    "ok": "boolean",
                    "note": "string",
                }
            }
        }
    }
).raw["mixed_raw"]
VALUE_COLUMNS = ("energy_kwh", "power_kw", "voltage_v")  # what producers supply
COMPUTED = "current_a"  # computed on ingest: power_kw * 1000 / voltage_v
T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> RawStore:
    raw = RawStore(Warehouse(str(tmp_path / "warehouse")))
    raw.ensure_table(ENERGY)
    return raw


def write_csv(path: Path, text: str, *, bom: bool = False) -> Path:
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode("utf-8"))
    return path


def write_parquet(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


def ingest(
    store: RawStore, path: Path, spec: RawArchiveSpec = ENERGY, source: str = "Pipeline"
) -> IngestResult:
    return store.ingest(spec, path, ChangeSource(source))


def delta(store: RawStore, spec: RawArchiveSpec = ENERGY) -> DeltaTable:
    return DeltaTable(store.uri(spec))


def stored_rows(store: RawStore, spec: RawArchiveSpec = ENERGY) -> list[dict]:
    """The table as delta-rs reads it (not through RawStore), sorted by key."""
    rows = delta(store, spec).to_pyarrow_table().to_pylist()
    for r in rows:
        r["ts"] = r["ts"].astimezone(UTC)
    return sorted(rows, key=lambda r: (r["entity_id"], r["ts"]))


def current(kw: float | None, v: float | None) -> float | None:
    """The computed column, worked out in plain Python: null when an operand is null or v is 0."""
    return None if kw is None or v is None or v == 0 else kw * 1000 / v


def energy_row(entity: str, ts: datetime, kwh: float | None, kw=None, v=None) -> dict:
    ts = ts.astimezone(UTC)
    return {
        "entity_id": entity,
        "ts": ts,
        "energy_kwh": kwh,
        "power_kw": kw,
        "voltage_v": v,
        COMPUTED: current(kw, v),
        "day": ts.date(),
    }


def readings(n: int, start: datetime = T0) -> list[dict]:
    """`n` valid readings of two meters, 15 minutes apart, with some optional values missing."""
    out = []
    for i in range(n):
        ts = start + timedelta(minutes=15 * (i // 2))
        kw = None if i % 3 == 0 else 0.25 * i
        v = None if i % 4 == 1 else 230.0 + i / 8
        out.append(energy_row(f"m{i % 2 + 1}", ts, 1.5 + i, kw, v))
    return out


def as_arrow(rows: list[dict]) -> pa.Table:
    return pa.table(
        {
            "entity_id": pa.array([r["entity_id"] for r in rows], pa.string()),
            "ts": pa.array([r["ts"] for r in rows], pa.timestamp("us", tz="UTC")),
            **{c: pa.array([r[c] for r in rows], pa.float64()) for c in VALUE_COLUMNS},
        }
    )


def csv_cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, datetime):
        return v.isoformat()
    return repr(v) if isinstance(v, float) else str(v)


def as_csv(rows: list[dict], columns=("entity_id", "ts", *VALUE_COLUMNS), eol="\n") -> str:
    lines = [",".join(columns)]
    lines += [",".join(csv_cell(r.get(c)) for c in columns) for r in rows]
    return eol.join(lines) + eol


def assert_unchanged(store: RawStore, version: int, rows: list[dict]) -> None:
    table = delta(store)
    assert table.version() == version
    assert stored_rows(store) == rows


# ---------------------------------------------------------------------------------------------
# The table itself


def test_raw_table_has_change_data_feed_and_utc_day_partitions(store: RawStore) -> None:
    table = delta(store)
    assert table.version() == 0
    assert table.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    assert table.metadata().partition_columns == ["day"]
    names = [f.name for f in table.schema().fields]
    assert names == ["entity_id", "ts", *VALUE_COLUMNS, COMPUTED, "day"]
    assert store.ensure_table(ENERGY) == 0  # idempotent: no second commit
    assert delta(store).version() == 0


# ---------------------------------------------------------------------------------------------
# Round trips


def test_parquet_batch_reads_back_equal_to_input(store: RawStore, tmp_path: Path) -> None:
    rows = readings(12, start=datetime(2025, 3, 29, 23, tzinfo=UTC))  # spans two UTC days
    result = ingest(store, write_parquet(tmp_path / "b.parquet", as_arrow(rows)))

    expected = sorted(rows, key=lambda r: (r["entity_id"], r["ts"]))
    assert stored_rows(store) == expected
    assert {(p["day"]) for p in delta(store).partitions()} == {"2025-03-29", "2025-03-30"}
    assert (result.version, result.rows, result.entities) == (1, 12, 2)
    assert result.min_ts == min(r["ts"] for r in rows)
    assert result.max_ts == max(r["ts"] for r in rows)


def test_read_arrow_matches_an_independent_pandas_frame(store: RawStore, tmp_path: Path) -> None:
    rows = readings(10)
    frame = pd.DataFrame(rows).drop(columns="day")
    path = tmp_path / "b.parquet"
    frame.drop(columns=COMPUTED).to_parquet(path, index=False)
    ingest(store, path)

    got = store.read_arrow(ENERGY).to_pandas().drop(columns="day")
    got = got.sort_values(["entity_id", "ts"]).reset_index(drop=True)
    want = frame.sort_values(["entity_id", "ts"]).reset_index(drop=True)
    want["ts"] = want["ts"].astype("datetime64[us, UTC]")
    got["ts"] = got["ts"].astype("datetime64[us, UTC]")
    pd.testing.assert_frame_equal(got, want, check_dtype=True)


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("bom", [False, True])
def test_csv_batch_reads_back_equal_to_input(
    store: RawStore, tmp_path: Path, bom: bool, eol: str
) -> None:
    rows = readings(8)
    ingest(store, write_csv(tmp_path / "b.csv", as_csv(rows, eol=eol), bom=bom))
    assert stored_rows(store) == sorted(rows, key=lambda r: (r["entity_id"], r["ts"]))


def test_csv_empty_cells_are_null_and_optional_columns_may_be_absent(
    store: RawStore, tmp_path: Path
) -> None:
    text = (
        "entity_id,ts,energy_kwh,power_kw\n"
        "m1,2025-01-01T00:00:00Z,1.25,\n"
        'm2,2025-01-01T00:00:00Z,2,""\n'  # a quoted empty cell is missing too
    )
    ingest(store, write_csv(tmp_path / "b.csv", text))
    assert stored_rows(store) == [
        energy_row("m1", T0, 1.25),
        energy_row("m2", T0, 2.0),
    ]


def test_csv_text_that_only_looks_missing_is_kept(tmp_path: Path) -> None:
    """Only an empty cell is missing: "NA" is a meter id and a note, "nan" a NaN value."""
    raw = RawStore(Warehouse(str(tmp_path / "warehouse")))
    raw.ensure_table(MIXED)
    text = (
        "entity_id,ts,reading,pulses,ok,note\n"
        "NA,2025-01-01T00:00:00Z,1.5,3,true,NA\n"
        "null,2025-01-01T00:00:00Z,2.5,,no,null\n"
        "m3,2025-01-01T00:00:00Z,3.5,-7,1,\n"
    )
    ingest(raw, write_csv(tmp_path / "b.csv", text), spec=MIXED)
    got = {r["entity_id"]: r for r in stored_rows(raw, MIXED)}
    assert got.keys() == {"NA", "null", "m3"}
    assert (got["NA"]["pulses"], got["NA"]["ok"], got["NA"]["note"]) == (3, True, "NA")
    assert (got["null"]["pulses"], got["null"]["ok"], got["null"]["note"]) == (None, False, "null")
    assert (got["m3"]["pulses"], got["m3"]["ok"], got["m3"]["note"]) == (-7, True, None)


def test_dictionary_encoded_parquet_columns_are_decoded(store: RawStore, tmp_path: Path) -> None:
    frame = pd.DataFrame(readings(6)).drop(columns=["day", COMPUTED])
    frame["entity_id"] = frame["entity_id"].astype("category")
    path = tmp_path / "b.parquet"
    frame.to_parquet(path, index=False)
    assert pa.types.is_dictionary(pq.read_schema(path).field("entity_id").type)
    ingest(store, path)
    assert stored_rows(store) == sorted(readings(6), key=lambda r: (r["entity_id"], r["ts"]))


# ---------------------------------------------------------------------------------------------
# Time normalization


def test_naive_timestamps_are_utc_and_offsets_are_converted(
    store: RawStore, tmp_path: Path
) -> None:
    text = (
        "entity_id,ts,energy_kwh\n"
        "m1,2025-03-30T01:30:00,1\n"  # naive: UTC
        "m2,2025-03-30 01:30:00.250,2\n"  # naive with a space and fractions
        "m3,2025-03-30T03:30:00+02:00,3\n"  # Vienna summer time
        "m4,2025-03-30T07:00:00+0530,4\n"  # Kolkata, offset without colon
        "m5,2025-03-29T20:30:00-05:00,5\n"
        "m6,2025-03-30T01:30:00Z,6\n"
        "m7,2025-03-31T01:00:00+14:00,7\n"  # an instant on the previous UTC day
    )
    ingest(store, write_csv(tmp_path / "b.csv", text))
    got = {r["entity_id"]: (r["ts"], r["day"]) for r in stored_rows(store)}
    at = datetime(2025, 3, 30, 1, 30, tzinfo=UTC)
    assert got == {
        "m1": (at, date(2025, 3, 30)),
        "m2": (at.replace(microsecond=250_000), date(2025, 3, 30)),
        "m3": (at, date(2025, 3, 30)),
        "m4": (at, date(2025, 3, 30)),
        "m5": (at, date(2025, 3, 30)),
        "m6": (at, date(2025, 3, 30)),
        "m7": (datetime(2025, 3, 30, 11, tzinfo=UTC), date(2025, 3, 30)),
    }


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.timestamp("us"),
        pa.timestamp("ms"),
        pa.timestamp("ns"),
        pa.timestamp("us", tz="Europe/Vienna"),
        pa.timestamp("s", tz="America/New_York"),
    ],
    ids=str,
)
def test_parquet_timestamp_columns_are_normalized_to_utc(
    store: RawStore, tmp_path: Path, arrow_type: pa.DataType
) -> None:
    instants = [datetime(2025, 10, 26, 0, 30, tzinfo=UTC) + timedelta(hours=h) for h in range(3)]
    epoch_units = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[arrow_type.unit]
    values = [int(t.timestamp()) * epoch_units for t in instants]  # UTC epoch, as Arrow stores it
    table = pa.table(
        {
            "entity_id": ["m1"] * 3,
            "ts": pa.array(values, pa.int64()).cast(arrow_type),
            "energy_kwh": [1.0, 2.0, 3.0],
        }
    )
    ingest(store, write_parquet(tmp_path / "b.parquet", table))
    assert [r["ts"] for r in stored_rows(store)] == instants


def test_far_past_and_future_timestamps_land(store: RawStore, tmp_path: Path) -> None:
    text = (
        "entity_id,ts,energy_kwh\n"
        "m1,0001-01-01T00:30:00+00:30,1\n"  # the first representable instant, with an offset
        "m2,9999-12-31T23:59:59.999999Z,2\n"  # the last one
        "m3,2199-06-01T12:00:00-03:00,3\n"
    )
    result = ingest(store, write_csv(tmp_path / "b.csv", text))
    first, last = (
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    )
    assert stored_rows(store) == [
        energy_row("m1", first, 1.0),
        energy_row("m2", last, 2.0),
        energy_row("m3", datetime(2199, 6, 1, 15, tzinfo=UTC), 3.0),
    ]
    assert (result.min_ts, result.max_ts) == (first, last)
    # With a row stored on the last representable day, later upserts still find their rows.
    again = "entity_id,ts,energy_kwh,power_kw\nm3,2199-06-01T15:00:00Z,4,2.3\n"
    ingest(store, write_csv(tmp_path / "c.csv", again))
    assert stored_rows(store)[2] == energy_row("m3", datetime(2199, 6, 1, 15, tzinfo=UTC), 4.0, 2.3)


# ---------------------------------------------------------------------------------------------
# Upsert semantics


def test_producers_fill_different_optional_columns_of_one_reading(
    store: RawStore, tmp_path: Path
) -> None:
    t1 = T0 + timedelta(minutes=15)
    a = (
        "entity_id,ts,energy_kwh,power_kw\n"
        "m1,2025-01-01T00:00:00Z,1.0,4.0\n"
        "m1,2025-01-01T00:15:00Z,2.0,5.0\n"
    )
    b = (
        "entity_id,ts,energy_kwh,voltage_v\n"
        "m1,2025-01-01T01:00:00+01:00,1.5,231.0\n"  # the same instant as m1 at T0
        "m2,2025-01-01T00:00:00Z,9.0,229.0\n"
    )
    ingest(store, write_csv(tmp_path / "a.csv", a), source="Pipeline")
    ingest(store, write_csv(tmp_path / "b.csv", b), source="Import")
    assert stored_rows(store) == [
        # required energy_kwh overwritten; power_kw kept (b had none); voltage_v filled by b
        energy_row("m1", T0, 1.5, 4.0, 231.0),
        energy_row("m1", t1, 2.0, 5.0, None),
        energy_row("m2", T0, 9.0, None, 229.0),
    ]

    # An explicit optional value replaces the stored one; a NaN is "missing" and keeps it.
    c = pa.table(
        {
            "entity_id": ["m1", "m1"],
            "ts": pa.array([T0, t1], pa.timestamp("us", tz="UTC")),
            "energy_kwh": [1.5, 2.5],
            "power_kw": [7.0, math.nan],
            "voltage_v": pa.array([None, None], pa.float64()),
        }
    )
    ingest(store, write_parquet(tmp_path / "c.parquet", c), source="Manual")
    assert stored_rows(store) == [
        energy_row("m1", T0, 1.5, 7.0, 231.0),
        energy_row("m1", t1, 2.5, 5.0, None),
        energy_row("m2", T0, 9.0, None, 229.0),
    ]


def test_reingesting_the_same_batch_commits_nothing(store: RawStore, tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "b.parquet", as_arrow(readings(6)))
    first = ingest(store, path)
    assert (first.inserted, first.updated, first.unchanged) == (6, 0, 0)
    before = stored_rows(store)
    again = ingest(store, path)
    assert again.version == first.version == delta(store).version()
    assert (again.inserted, again.updated, again.unchanged) == (0, 0, 6)
    assert stored_rows(store) == before


def test_only_rows_that_differ_are_rewritten_and_in_the_change_feed(
    store: RawStore, tmp_path: Path
) -> None:
    rows = readings(8)
    rows[0]["power_kw"] = math.nan  # optional NaN is stored as null ("missing")
    ingest(store, write_parquet(tmp_path / "a.parquet", as_arrow(rows)))
    again = [dict(r) for r in rows]
    again[1]["energy_kwh"] += 1.0  # differs
    again[2]["voltage_v"] = None  # an optional null keeps the stored value: unchanged
    again[3]["power_kw"] = 99.0  # differs
    result = ingest(store, write_parquet(tmp_path / "b.parquet", as_arrow(again)))
    assert (result.inserted, result.updated, result.unchanged) == (0, 2, 6)
    cdf = pa.table(delta(store).load_cdf(starting_version=result.version)).to_pylist()
    changed = {(r["entity_id"], r["ts"]) for r in cdf if r["_commit_version"] == result.version}
    assert changed == {(again[i]["entity_id"], again[i]["ts"]) for i in (1, 3)}


# ---------------------------------------------------------------------------------------------
# All-or-nothing validation


def _set(k: int, **values):
    def corrupt(rows: list[dict]) -> None:
        rows[k].update(values)

    return corrupt


def _copy_key(k: int, of: int, text: str | None = None):
    def corrupt(rows: list[dict]) -> None:
        rows[k]["entity_id"] = rows[of]["entity_id"]
        rows[k]["ts"] = text or rows[of]["ts"]

    return corrupt


BAD_CSV_ROWS = [
    pytest.param(
        _set(3, energy_kwh=None), "required column energy_kwh is null", id="null-required"
    ),
    pytest.param(_set(3, energy_kwh="abc"), "'abc' is not a number", id="text-in-required"),
    pytest.param(_set(3, voltage_v="12,5"), None, id="decimal-comma-shifts-columns"),
    pytest.param(_set(3, power_kw="1.5kW"), "'1.5kW' is not a number", id="text-in-optional"),
    pytest.param(_set(3, energy_kwh="NaN"), "energy_kwh is NaN", id="nan-required"),
    pytest.param(_set(3, energy_kwh="inf"), "energy_kwh is infinite", id="inf-required"),
    pytest.param(_set(3, power_kw="-inf"), "power_kw is infinite", id="inf-optional"),
    pytest.param(_set(3, voltage_v="1e999"), "voltage_v is infinite", id="overflow-to-inf"),
    pytest.param(_set(3, ts="2025-13-01T00:00:00"), "not an ISO-8601 timestamp", id="bad-month"),
    pytest.param(_set(3, ts="yesterday"), "'yesterday' is not an ISO-8601", id="bad-ts"),
    pytest.param(_set(3, ts="2025-01-01T00:00:00+01"), "not an ISO-8601", id="short-offset"),
    pytest.param(_set(3, ts=None), "ts is null", id="null-ts"),
    pytest.param(_set(3, ts="0001-01-01T00:00:00+01:00"), "outside years 1 to 9999", id="year-0"),
    pytest.param(_set(3, ts="9999-12-31T23:00:00-01:00"), "outside years 1 to 9999", id="y10k"),
    pytest.param(_set(3, entity_id=None), "entity_id is null", id="null-entity"),
    pytest.param(_set(3, entity_id="   "), "entity_id is empty", id="blank-entity"),
    pytest.param(_copy_key(3, 1), "duplicate key", id="duplicate-key"),
    pytest.param(
        _copy_key(3, 1, "2025-01-01T01:00:00+01:00"), "duplicate key", id="duplicate-instant"
    ),
]


@pytest.mark.parametrize(("corrupt", "reason"), BAD_CSV_ROWS)
def test_a_bad_csv_row_rejects_the_whole_batch(
    store: RawStore, tmp_path: Path, corrupt, reason: str | None
) -> None:
    ingest(
        store,
        write_parquet(tmp_path / "seed.parquet", as_arrow(readings(4, T0 - timedelta(days=1)))),
    )
    before = stored_rows(store)
    rows = readings(6)
    corrupt(rows)
    with pytest.raises(IngestValidationError) as info:
        ingest(store, write_csv(tmp_path / "bad.csv", as_csv(rows)))
    err = info.value
    if reason is None:  # a broken line is a file-level error, named by its content
        assert err.row is None and "12,5" in str(err)
    else:
        assert err.row == 3
        assert "row 3" in str(err)
        assert reason in err.reason
    assert err.archive == "energy_raw" and "nothing was written" in str(err)
    assert_unchanged(store, 1, before)


def _parquet_with(column: str, values: list, arrow_type: pa.DataType | None = None):
    def build(rows: list[dict]) -> pa.Table:
        t = as_arrow(rows)
        i = t.schema.get_field_index(column)
        return t.set_column(i, column, pa.array(values, arrow_type))

    return build


_TS6 = [T0 + timedelta(minutes=15 * (i // 2)) for i in range(6)]
BAD_PARQUET_ROWS = [
    pytest.param(
        _parquet_with("energy_kwh", [1.0, 2.0, 3.0, None, 5.0, 6.0]), "is null", id="null"
    ),
    pytest.param(_parquet_with("energy_kwh", [1.0, 2.0, 3.0, math.nan, 5.0, 6.0]), "NaN", id="nan"),
    pytest.param(
        _parquet_with("voltage_v", [1.0, 2.0, 3.0, -math.inf, 5.0, 6.0]), "infinite", id="inf"
    ),
    pytest.param(
        _parquet_with("power_kw", ["1", "2", "3", "x", "5", "6"]), "'x' is not a number", id="text"
    ),
    pytest.param(
        _parquet_with("entity_id", ["a", "b", "c", None, "e", "f"]), "entity_id is null", id="ent"
    ),
    pytest.param(
        _parquet_with("entity_id", ["a", "b", "c", "", "e", "f"]), "entity_id is empty", id="ent0"
    ),
    pytest.param(
        _parquet_with(
            "ts",
            [int(t.timestamp()) * 10**9 + (i == 3) for i, t in enumerate(_TS6)],
            pa.timestamp("ns", tz="UTC"),
        ),
        "does not fit a UTC timestamp in microseconds",
        id="nanoseconds",
    ),
    pytest.param(
        _parquet_with(
            "ts",
            [int(t.timestamp()) * 1000 for t in _TS6[:3]] + [10**17] + [0, 1],
            pa.timestamp("ms"),
        ),
        "does not fit a UTC timestamp",
        id="year-3-million",
    ),
    pytest.param(
        _parquet_with("ts", [t.isoformat() for t in _TS6[:3]] + ["soon", "x", "y"]),
        "'soon' is not an ISO-8601",
        id="text-ts",
    ),
    pytest.param(
        _parquet_with("ts", [T0.isoformat()] * 6), "duplicate key", id="duplicate-with-row-1"
    ),
]


@pytest.mark.parametrize(("build", "reason"), BAD_PARQUET_ROWS)
def test_a_bad_parquet_row_rejects_the_whole_batch(
    store: RawStore, tmp_path: Path, build, reason: str
) -> None:
    rows = readings(6)
    ingest(store, write_parquet(tmp_path / "seed.parquet", as_arrow(rows[:2])))
    before = stored_rows(store)
    table = build(rows)
    if reason == "duplicate key":  # row 2 repeats row 0's key (entity m1, T0)
        table = table.set_column(0, "entity_id", pa.array(["m1", "m2"] * 3))
    with pytest.raises(IngestValidationError) as info:
        ingest(store, write_parquet(tmp_path / "bad.parquet", table))
    expected_row = 2 if reason == "duplicate key" else 3
    assert info.value.row == expected_row and f"row {expected_row}" in str(info.value)
    assert reason in info.value.reason
    assert_unchanged(store, 1, before)


def test_the_first_offending_row_is_reported_whatever_the_check_order(
    store: RawStore, tmp_path: Path
) -> None:
    """Checks run column by column; the reported row is still the first bad one in the file."""
    cases = [
        # (row -> override, expected row, reason)
        ({2: {"voltage_v": "x"}, 4: {"entity_id": None}}, 2, "'x' is not a number"),
        ({5: {"ts": "never"}, 4: {"voltage_v": "inf"}}, 4, "voltage_v is infinite"),
        ({4: {"energy_kwh": None}, 3: {"entity_id": "m2", "ts": T0}}, 3, "duplicate key"),
        ({2: {"energy_kwh": None}, 5: {"entity_id": "m2", "ts": T0}}, 2, "energy_kwh is null"),
        ({1: {"power_kw": "nope"}, 3: {"ts": "later"}, 5: {"entity_id": ""}}, 1, "'nope'"),
    ]
    for i, (overrides, row, reason) in enumerate(cases):
        rows = readings(6)
        for k, values in overrides.items():
            rows[k].update(values)
        with pytest.raises(IngestValidationError) as info:
            ingest(store, write_csv(tmp_path / f"bad{i}.csv", as_csv(rows)))
        assert (info.value.row, i) == (row, i)
        assert reason in info.value.reason
    assert delta(store).version() == 0


def test_bad_rows_in_a_later_chunk_report_the_file_row(
    store: RawStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rollup_assets.resources.batch_sources as ingest_module

    monkeypatch.setattr(ingest_module, "CHUNK_ROWS", 4)
    rows = readings(12)
    rows[9]["power_kw"] = math.inf
    rows[7]["entity_id"], rows[7]["ts"] = rows[1]["entity_id"], rows[1]["ts"]  # duplicate
    with pytest.raises(IngestValidationError) as info:
        ingest(store, write_parquet(tmp_path / "b.parquet", as_arrow(rows)))
    assert info.value.row == 7 and "duplicate key" in info.value.reason
    rows[7] = readings(12)[7]
    with pytest.raises(IngestValidationError) as info:
        ingest(store, write_parquet(tmp_path / "c.parquet", as_arrow(rows)))
    assert info.value.row == 9 and "power_kw is infinite" in info.value.reason
    assert delta(store).version() == 0


@pytest.mark.parametrize(
    ("column", "cell", "reason"),
    [
        ("pulses", "1.5", "'1.5' is not a whole number"),
        ("pulses", "9223372036854775808", "is not a whole number"),
        ("ok", "maybe", "ok is not a boolean"),
        ("reading", "", "required column reading is null"),
    ],
)
def test_typed_columns_reject_unconvertible_text(
    tmp_path: Path, column: str, cell: str, reason: str
) -> None:
    raw = RawStore(Warehouse(str(tmp_path / "warehouse")))
    raw.ensure_table(MIXED)
    cells = {"reading": "1.0", "pulses": "1", "ok": "true", "note": "fine"}
    header = "entity_id,ts,reading,pulses,ok,note"
    good = [f"m{i},2025-01-01T00:00:00Z," + ",".join(cells.values()) for i in range(3)]
    bad = "m9,2025-01-01T00:00:00Z," + ",".join({**cells, column: cell}.values())
    text = "\n".join([header, *good[:2], bad, good[2]]) + "\n"
    with pytest.raises(IngestValidationError) as info:
        ingest(raw, write_csv(tmp_path / "b.csv", text), spec=MIXED)
    assert info.value.row == 2 and reason in info.value.reason
    assert DeltaTable(raw.uri(MIXED)).version() == 0


def test_numeric_values_that_do_not_fit_are_rejected(store: RawStore, tmp_path: Path) -> None:
    table = as_arrow(readings(3)).set_column(
        2, "energy_kwh", pa.array([1, 2**53 + 1, 3], pa.int64())
    )
    with pytest.raises(IngestValidationError) as info:
        ingest(store, write_parquet(tmp_path / "b.parquet", table))
    assert info.value.row == 1 and "does not fit double exactly" in info.value.reason
    booleans = as_arrow(readings(3)).set_column(2, "energy_kwh", pa.array([True, False, True]))
    with pytest.raises(IngestValidationError, match="must be numeric, not boolean"):
        ingest(store, write_parquet(tmp_path / "c.parquet", booleans))
    assert delta(store).version() == 0


# ---------------------------------------------------------------------------------------------
# File-level rejections


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.csv", b"", "is empty"),
        ("header.csv", b"entity_id,ts,energy_kwh\n", "holds no rows"),
        ("header-bom.csv", b"\xef\xbb\xbfentity_id,ts,energy_kwh\r\n", "holds no rows"),
        ("semicolon.csv", b"entity_id;ts;energy_kwh\nm1;2025-01-01;1\n", "another delimiter"),
        ("tabs.csv", b"entity_id\tts\tenergy_kwh\nm1\t2025-01-01\t1\n", "another delimiter"),
        ("ragged.csv", b"entity_id,ts,energy_kwh\nm1,2025-01-01,1,2\n", "not a readable CSV"),
        ("latin1.csv", b"entity_id,ts,energy_kwh\nm\xfc,2025-01-01,1\n", "not a readable CSV"),
        ("unknown.csv", b"entity_id,ts,energy_kwh,temp_c\nm1,2025-01-01,1,20\n", "temp_c"),
        (
            "twice.csv",
            b"entity_id,ts,ts,energy_kwh\nm1,2025-01-01,2025-01-01,1\n",
            "more than once",
        ),
        ("empty.parquet", b"", "is empty"),
        ("garbage.parquet", b"PAR1 this is not parquet", "not a readable Parquet file"),
        ("b.json", b"[]", "unsupported file type"),
    ],
)
def test_unusable_files_are_rejected_without_a_commit(
    store: RawStore, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(IngestValidationError) as info:
        ingest(store, path)
    assert info.value.row is None
    assert message in str(info.value)
    assert delta(store).version() == 0


def test_the_delimiter_hint_is_clear(store: RawStore, tmp_path: Path) -> None:
    path = write_csv(tmp_path / "b.csv", "entity_id;ts;energy_kwh\nm1;2025-01-01T00:00:00;1\n")
    with pytest.raises(IngestValidationError) as info:
        ingest(store, path)
    assert "use commas" in str(info.value) and "'entity_id;ts;energy_kwh'" in str(info.value)


def test_truncated_and_zero_row_parquet_are_rejected(store: RawStore, tmp_path: Path) -> None:
    good = write_parquet(tmp_path / "good.parquet", as_arrow(readings(200)))
    data = good.read_bytes()
    for cut in (len(data) // 2, len(data) - 9, 12):
        path = tmp_path / f"cut{cut}.parquet"
        path.write_bytes(data[:cut])
        with pytest.raises(IngestValidationError, match="not a readable Parquet file"):
            ingest(store, path)
    empty = write_parquet(tmp_path / "none.parquet", as_arrow([]))
    with pytest.raises(IngestValidationError, match="holds no rows"):
        ingest(store, empty)
    with pytest.raises(IngestValidationError, match="does not exist"):
        ingest(store, tmp_path / "missing.parquet")
    assert delta(store).version() == 0


def test_unknown_and_missing_columns_are_rejected(store: RawStore, tmp_path: Path) -> None:
    extra = as_arrow(readings(3)).append_column("temperature", pa.array([1.0, 2.0, 3.0]))
    with pytest.raises(IngestValidationError) as info:
        ingest(store, write_parquet(tmp_path / "x.parquet", extra))
    assert info.value.row is None and "unknown column(s) ['temperature']" in str(info.value)
    missing = as_arrow(readings(3)).drop_columns(["energy_kwh"])
    with pytest.raises(IngestValidationError) as info:
        ingest(store, write_parquet(tmp_path / "y.parquet", missing))
    assert "required column 'energy_kwh' is missing" in str(info.value)
    no_ts = as_arrow(readings(3)).drop_columns(["ts"])
    with pytest.raises(IngestValidationError, match="required column 'ts' is missing"):
        ingest(store, write_parquet(tmp_path / "z.parquet", no_ts))
    assert delta(store).version() == 0


# ---------------------------------------------------------------------------------------------
# Commits and the change data feed


def test_every_ingest_is_one_commit_carrying_its_metadata(store: RawStore, tmp_path: Path) -> None:
    batches = [
        ("Pipeline", readings(6)),
        ("Import", readings(4, T0 + timedelta(days=40))),
        ("Manual", [{**r, "energy_kwh": 0.5} for r in readings(3)]),  # corrects three
    ]
    for i, (source, rows) in enumerate(batches, start=1):
        result = ingest(
            store, write_parquet(tmp_path / f"{i}.parquet", as_arrow(rows)), source=source
        )
        assert result.version == i == delta(store).version()

    history = {h["version"]: h for h in delta(store).history()}
    assert sorted(history) == [0, 1, 2, 3]
    for i, (source, rows) in enumerate(batches, start=1):
        info = history[i]
        assert info["operation"] == "MERGE"
        assert info["rollups.operation"] == "ingest"
        assert info["rollups.change_source"] == source
        assert info["rollups.rows"] == str(len(rows))
        assert datetime.fromisoformat(info["rollups.min_ts"]) == min(r["ts"] for r in rows)
        assert datetime.fromisoformat(info["rollups.max_ts"]) == max(r["ts"] for r in rows)


def test_change_data_feed_shows_inserts_and_updates(store: RawStore, tmp_path: Path) -> None:
    ingest(store, write_parquet(tmp_path / "a.parquet", as_arrow(readings(4))))
    changed = readings(2)
    for r in changed:
        r["energy_kwh"] = 99.0
    ingest(store, write_parquet(tmp_path / "b.parquet", as_arrow(changed)))

    cdf = pa.table(delta(store).load_cdf(starting_version=1)).to_pylist()
    by_version: dict[int, list[tuple[str, str, float]]] = {}
    for r in cdf:
        by_version.setdefault(r["_commit_version"], []).append(
            (r["_change_type"], r["entity_id"], r["energy_kwh"])
        )
    assert sorted(by_version[1]) == sorted(
        ("insert", r["entity_id"], r["energy_kwh"]) for r in readings(4)
    )
    assert sorted(by_version[2]) == sorted(
        [("update_preimage", r["entity_id"], r["energy_kwh"]) for r in readings(2)]
        + [("update_postimage", r["entity_id"], 99.0) for r in changed]
    )


# ---------------------------------------------------------------------------------------------
# Time-range archives


def test_time_range_rows_must_start_before_they_end(tmp_path: Path) -> None:
    spec = parse_catalog(
        {"time_range_archives": {"tariff": {"period": "1h", "columns": {"price": "double"}}}}
    ).time_range["tariff"]
    raw = RawStore(Warehouse(str(tmp_path / "warehouse")))
    raw.ensure_table(spec)
    text = (
        "entity_id,range_start,range_end,price\n"
        "z1,2025-01-01T00:00:00Z,2025-01-01T01:00:00Z,0.2\n"
        "z1,2025-01-01T02:00:00+01:00,2025-01-01T01:00:00Z,0.3\n"
    )
    with pytest.raises(IngestValidationError) as info:
        raw.ingest(spec, write_csv(tmp_path / "bad.csv", text), ChangeSource.IMPORT)
    assert info.value.row == 1 and "range_start must be before range_end" in info.value.reason
    good = text.replace("2025-01-01T02:00:00+01:00", "2025-01-01T01:00:00Z").replace(
        "2025-01-01T01:00:00Z,0.3", "2025-01-01T02:00:00Z,0.3"
    )
    raw.ingest(spec, write_csv(tmp_path / "good.csv", good), ChangeSource.IMPORT)
    got = sorted(
        (r["range_start"].astimezone(UTC), r["range_end"].astimezone(UTC), r["price"])
        for r in DeltaTable(raw.uri(spec)).to_pyarrow_table().to_pylist()
    )
    hour = timedelta(hours=1)
    assert got == [(T0, T0 + hour, 0.2), (T0 + hour, T0 + 2 * hour, 0.3)]


# ---------------------------------------------------------------------------------------------
# Pruned reads


def test_read_arrow_returns_only_rows_in_the_spans_and_entities(
    store: RawStore, tmp_path: Path
) -> None:
    rows = readings(40)  # m1 and m2, 00:00 to 04:45 UTC
    ingest(store, write_parquet(tmp_path / "b.parquet", as_arrow(rows)))
    hour = timedelta(hours=1)
    spans = [Window(T0 + 3 * hour, T0 + 4 * hour), Window(T0, T0 + hour)]  # a gap in between
    for entities in (None, frozenset({"m2"}), frozenset({"m1", "nobody"})):
        got = [
            {**r, "ts": r["ts"].astimezone(UTC)}
            for r in store.read_arrow(ENERGY, spans, entities).to_pylist()
        ]
        want = [
            r
            for r in rows
            if any(w.start <= r["ts"] < w.end for w in spans)
            and (entities is None or r["entity_id"] in entities)
        ]
        assert want and sorted(got, key=_by_key) == sorted(want, key=_by_key)


def _by_key(row: dict) -> tuple[str, datetime]:
    return row["entity_id"], row["ts"]


def test_changed_within_tells_which_commits_reach_a_window(store: RawStore, tmp_path: Path) -> None:
    """The forward sensor skips an open-bucket refresh when new commits lie elsewhere in time."""
    base = store.table(ENERGY).version()
    first = ingest(store, write_parquet(tmp_path / "a.parquet", as_arrow(readings(8)))).version
    late = [energy_row("m-late", T0 + timedelta(days=3, minutes=15 * i), 1.0) for i in range(4)]
    ingest(store, write_parquet(tmp_path / "b.parquet", as_arrow(late)))
    day0 = Window(T0, T0 + timedelta(days=1))
    day3_hour = Window(T0 + timedelta(days=3), T0 + timedelta(days=3, hours=1))
    day3_next_hour = Window(day3_hour.end, day3_hour.end + timedelta(hours=1))
    assert store.changed_within(ENERGY, base, day0)
    assert not store.changed_within(ENERGY, first, day0)  # only the day-3 batch came after
    assert store.changed_within(ENERGY, first, day3_hour)
    assert not store.changed_within(ENERGY, first, day3_next_hour)  # max ts is 00:45
    assert not store.changed_within(ENERGY, store.table(ENERGY).version(), day3_hour)
    # A commit by another writer, without the batch's time span, may touch anything.
    before = store.table(ENERGY).version()
    DeltaTable(store.uri(ENERGY)).delete("entity_id = 'm-late'")
    assert store.changed_within(ENERGY, before, day0)


def test_stored_operands_of_scattered_rows_read_only_their_row_groups(
    store: RawStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 days x 200 meters: each UTC day's file has several row groups (sorted by meter).
    monkeypatch.setattr("rollup_assets.resources.raw_ingest.ROW_GROUP_ROWS", 64)
    days = [T0 + timedelta(days=d) for d in range(40)]
    rows = [energy_row(f"m{m:03d}", day, 1.0, 2.0, 230.0) for day in days for m in range(200)]
    ingest(store, write_parquet(tmp_path / "base.parquet", as_arrow(rows)))
    read: list[int] = []
    original = raw_reads._read_file

    def counted(tables, spec, f, *args):  # type: ignore[no-untyped-def]
        table = original(tables, spec, f, *args)
        read.append(table.num_rows)
        return table

    whole = RawStore.read_arrow

    def counted_whole(self: RawStore, *args, **kwargs):  # type: ignore[no-untyped-def]
        table = whole(self, *args, **kwargs)
        read.append(table.num_rows)
        return table

    monkeypatch.setattr(raw_reads, "_read_file", counted)
    monkeypatch.setattr(RawStore, "read_arrow", counted_whole)
    # Two late corrections on the first and last day leave voltage_v out: the computed column
    # must use the stored voltage, found by reading those two meters' row groups only.
    late = pa.table(
        {
            "entity_id": ["m007", "m150"],
            "ts": pa.array([days[0], days[-1]], pa.timestamp("us", tz="UTC")),
            "energy_kwh": [3.0, 4.0],
            "power_kw": [4.6, 2.3],
        }
    )
    ingest(store, write_parquet(tmp_path / "late.parquet", late))
    assert 0 < sum(read) <= 2 * 64 * 2, sum(read)  # a row group or two per row, not 40 days
    stored = {(r["entity_id"], r["ts"]): r for r in stored_rows(store)}
    assert stored[("m007", days[0])] == energy_row("m007", days[0], 3.0, 4.6, 230.0)
    assert stored[("m150", days[-1])] == energy_row("m150", days[-1], 4.0, 2.3, 230.0)
