"""Property tests with hostile input: random ingest batches and random spec catalogs.

Batches mix valid rows with wrong types, NaN/inf, nulls in required columns, text in numeric
columns, duplicate keys, unparseable or out-of-range times, unknown columns and broken files.
A small model written here (plain Python, no Arrow) predicts the outcome of each batch: either
the exact upsert result, or the first offending row and its reason. Catalogs are random valid
chains, optionally broken by one mutation whose rule and archive the test knows in advance.
"""

import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from rollup_assets.model.errors import BackupInvalidError, IngestValidationError, SpecError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.manifests import BackupManifest
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.settings import DEFAULT_SPECS
from tests.unit.test_cli import Invoke, assert_one_line_failure, rollups  # noqa: F401

PROPERTY = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---------------------------------------------------------------------------------------------
# Ingest: the archive, the model and the batch generator

SPEC = parse_catalog(
    {
        "raw_archives": {
            "meter_raw": {
                "columns": {
                    "reading": {"type": "double", "required": True},
                    "power": "double",
                    "pulses": "long",
                    "ok": "boolean",
                    "note": "string",
                }
            }
        }
    }
).raw["meter_raw"]
VALUES = ("reading", "power", "pulses", "ok", "note")
COLUMNS = ("entity_id", "ts", *VALUES)
ENTITIES = ("m1", "m2", "NA", "zähler-7")
POOL = (  # instants shared between rows, so keys collide and upserts hit stored rows
    datetime(2025, 1, 1, tzinfo=UTC),
    datetime(2025, 3, 30, 1, 0, tzinfo=UTC),
    datetime(2025, 10, 26, 0, 30, tzinfo=UTC),
    datetime(2025, 10, 26, 1, 30, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(1, 1, 1, 2, tzinfo=UTC),
    datetime(9999, 12, 31, 20, 0, 0, 999_999, tzinfo=UTC),
    datetime(2100, 2, 28, 23, 59, 59, 500_000, tzinfo=UTC),
)
OFFSETS = (None, "Z", "+00:00", "+01:00", "+02:00", "-05:00", "+05:30", "+0530", "-12:00", "+14:00")
SEED = [  # stored before every batch
    {"entity_id": "m1", "ts": POOL[0], "reading": 1.0, "power": 2.0, "pulses": None, "ok": None,
     "note": "seed"},
    {"entity_id": "m2", "ts": POOL[1], "reading": 3.0, "power": None, "pulses": 4, "ok": False,
     "note": None},
    {"entity_id": "NA", "ts": POOL[6], "reading": 5.0, "power": 6.0, "pulses": 7, "ok": True,
     "note": "x"},
]  # fmt: skip


@dataclass(frozen=True)
class Text:
    """Raw text for a cell; in Parquet it turns the whole column into a string column."""

    text: str


@dataclass(frozen=True)
class Stamp:
    """An instant written as local wall time plus an offset (None: naive, meaning UTC)."""

    instant: datetime
    offset: str | None
    sep: str = "T"

    def text(self) -> str:
        if self.offset is None:
            local = self.instant.replace(tzinfo=None)
        else:
            local = self.instant.astimezone(_tz(self.offset)).replace(tzinfo=None)
        return local.isoformat(sep=self.sep) + (self.offset or "")


@dataclass(frozen=True)
class Spelled:
    """A boolean and how a CSV producer wrote it."""

    value: bool
    text: str


@dataclass
class Row:
    cells: dict[str, Any]
    reasons: set[str] = field(default_factory=set)  # why this row is bad, empty when valid


@dataclass
class Batch:
    rows: list[Row]
    fmt: str  # "csv" | "parquet"
    ts_mode: str  # Parquet only: "text" | "aware" | "naive"
    column_defect: str | None  # None | "unknown" | "missing"
    file_defect: str | None  # None | "bom" | "semicolon" | "truncate"
    cut: float = 0.5


def _key(row: Row) -> tuple[str, datetime] | None:
    entity, ts = row.cells["entity_id"], row.cells["ts"]
    if not entity or not isinstance(ts, Stamp):
        return None
    return entity, ts.instant


def _tz(offset: str) -> tzinfo:
    if offset == "Z":
        return UTC
    sign = -1 if offset[0] == "-" else 1
    digits = offset[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


def _representable(instant: datetime, offset: str | None) -> bool:
    if offset is None or offset == "Z":
        return True
    try:
        instant.astimezone(_tz(offset))
        return True
    except OverflowError:
        return False


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
anywhen = st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30)).map(
    lambda d: d.replace(tzinfo=UTC)
)
instants = st.one_of(st.sampled_from(POOL), anywhen, anywhen, anywhen)
spelled = st.sampled_from(
    [(True, "true"), (False, "false"), (True, "1"), (False, "0"), (True, "YES"), (False, "f")]
).map(lambda p: Spelled(*p))
notes = st.one_of(
    st.sampled_from(["NA", "null", "NaN", "N/A", "#N/A", "-"]),
    st.text("abcxyzÄé09_", min_size=1, max_size=6),
)


@st.composite
def stamps(draw: st.DrawFn) -> Stamp:
    instant = draw(instants)
    offset = draw(st.sampled_from(OFFSETS))
    if not _representable(instant, offset):
        offset = "Z"
    return Stamp(instant, offset, draw(st.sampled_from(["T", " "])))


@st.composite
def valid_rows(draw: st.DrawFn) -> Row:
    return Row(
        {
            "entity_id": draw(st.sampled_from(ENTITIES)),
            "ts": draw(stamps()),
            "reading": draw(finite),
            "power": draw(st.one_of(st.none(), finite, st.just(math.nan))),
            "pulses": draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
            "ok": draw(st.one_of(st.none(), spelled)),
            "note": draw(st.one_of(st.none(), notes)),
        }
    )


# Each defect breaks one row in one way: (cells to set, reason fragments it may report).
DEFECTS: dict[str, tuple[dict[str, Any], set[str]]] = {
    "null-required": ({"reading": None}, {"reading is null"}),
    "nan-required": ({"reading": math.nan}, {"reading is NaN"}),
    "inf-required": ({"reading": -math.inf}, {"reading is infinite"}),
    "inf-optional": ({"power": math.inf}, {"power is infinite"}),
    "text-in-double": ({"reading": Text("12.5.1")}, {"'12.5.1' is not a number"}),
    "text-in-optional": ({"power": Text("n/a")}, {"'n/a' is not a number"}),
    "fraction-in-long": ({"pulses": Text("1.5")}, {"'1.5' is not a whole number"}),
    "word-in-boolean": ({"ok": Text("maybe")}, {"ok is not a boolean"}),
    "null-entity": ({"entity_id": None}, {"entity_id is null"}),
    "blank-entity": ({"entity_id": ""}, {"entity_id is null", "entity_id is empty"}),
    "null-ts": ({"ts": None}, {"ts is null"}),
    "word-ts": ({"ts": Text("tomorrow")}, {"'tomorrow' is not an ISO-8601 timestamp"}),
    "feb-30": ({"ts": Text("2025-02-30T00:00:00")}, {"is not an ISO-8601 timestamp"}),
    "short-offset": ({"ts": Text("2025-01-01T00:00:00+01")}, {"is not an ISO-8601 timestamp"}),
    "year-0": ({"ts": Text("0001-01-01T00:30:00+01:00")}, {"outside years 1 to 9999"}),
    "year-10000": ({"ts": Text("9999-12-31T23:30:00-01:00")}, {"outside years 1 to 9999"}),
}


FILE_DEFECTS = {"bom": "csv", "semicolon": "csv", "truncate": "parquet"}
COLUMN_DEFECTS = ("unknown", "missing")
PLANTED = [*sorted(DEFECTS), "duplicate", *COLUMN_DEFECTS, *FILE_DEFECTS]


def _duplicate(draw: st.DrawFn, rows: list[Row], row: Row, i: int) -> None:
    """Give `row` the key of an earlier row, the instant possibly written another way."""
    j = draw(st.integers(0, i - 1))
    ts = rows[j].cells["ts"]
    row.cells["entity_id"] = rows[j].cells["entity_id"]
    if isinstance(ts, Stamp):
        offset = draw(st.sampled_from(OFFSETS))
        row.cells["ts"] = Stamp(ts.instant, offset if _representable(ts.instant, offset) else "Z")
    else:
        row.cells["ts"] = ts


@st.composite
def batches(draw: st.DrawFn, planted: str | None = None) -> Batch:
    """A random batch; `planted` names one defect it is sure to contain (at a random row)."""
    n = draw(st.integers(2 if planted == "duplicate" else 1, 10))
    at = draw(st.integers(1 if planted == "duplicate" else 0, n - 1))
    hostile = draw(st.booleans())  # half of the batches are otherwise clean
    kinds = ["valid"] * 3 + ["duplicate", "defect"] if hostile else ["valid"]
    rows: list[Row] = []
    keys: set[tuple[str, datetime]] = set()
    for i in range(n):
        row = draw(valid_rows())
        while (key := _key(row)) in keys:  # duplicates only where the batch asks for one
            stamp = row.cells["ts"]
            later = stamp.instant + timedelta(minutes=1)
            offset = stamp.offset if _representable(later, stamp.offset) else "Z"
            row.cells["ts"] = Stamp(later, offset, stamp.sep)
        if key is not None:
            keys.add(key)
        kind = draw(st.sampled_from(kinds))
        defect = draw(st.sampled_from(sorted(DEFECTS))) if kind == "defect" else None
        if i == at and planted in DEFECTS:
            defect = planted
        if defect is not None:
            cells, reasons = DEFECTS[defect]
            row.cells.update(cells)
            row.reasons |= reasons
        elif (kind == "duplicate" and i > 0) or (i == at and planted == "duplicate"):
            _duplicate(draw, rows, row, i)
        rows.append(row)
    fmt = FILE_DEFECTS.get(planted or "") or draw(st.sampled_from(["csv", "parquet"]))
    if planted in COLUMN_DEFECTS or planted in FILE_DEFECTS:
        column_defect = planted if planted in COLUMN_DEFECTS else None
        file_defect = planted if planted in FILE_DEFECTS else None
    else:
        column_defect = draw(st.sampled_from([None] * 14 + list(COLUMN_DEFECTS)))
        file_defect = draw(
            st.sampled_from([None] * 10 + [d for d, f in FILE_DEFECTS.items() if f == fmt])
        )
    return Batch(
        rows=rows,
        fmt=fmt,
        ts_mode=draw(st.sampled_from(["text", "aware", "naive"])),
        column_defect=column_defect,
        file_defect=file_defect,
        cut=draw(st.floats(0.05, 0.99)),
    )


# -- the model -----------------------------------------------------------------------------


def expected_outcome(batch: Batch) -> tuple[int | None, set[str]] | list[dict]:
    """Either (row, reasons) of the rejection, or the table rows after the upsert."""
    if batch.file_defect == "semicolon":
        return None, {"another delimiter"}
    if batch.file_defect == "truncate":
        return None, {"not a readable Parquet file"}
    if batch.column_defect == "unknown":
        return None, {"unknown column(s) ['temperature']"}
    if batch.column_defect == "missing":
        return 0, {"required column 'reading' is missing"}
    seen: set[tuple[str, datetime]] = set()
    for i, row in enumerate(batch.rows):
        reasons = set(row.reasons)
        key = _key(row)
        if key is not None and key in seen:
            reasons.add("duplicate key")
        if reasons:
            return i, reasons
        if key is not None:
            seen.add(key)

    table = {(r["entity_id"], r["ts"]): dict(r) for r in SEED}
    for row in batch.rows:
        key = _key(row)
        assert key is not None
        incoming = {c: _logical(row.cells[c]) for c in VALUES}
        old = table.get(key)
        new = {"entity_id": key[0], "ts": key[1], **incoming}
        if old is not None:  # required: incoming; optional: COALESCE(incoming, existing)
            for c in VALUES[1:]:
                new[c] = incoming[c] if incoming[c] is not None else old[c]
        table[key] = new
    return sorted(table.values(), key=lambda r: (r["entity_id"], r["ts"]))


def _logical(v: Any) -> Any:
    if isinstance(v, Spelled):
        return v.value
    if isinstance(v, float) and math.isnan(v):
        return None  # NaN in an optional double means "missing"
    return v


# -- writing the batch ---------------------------------------------------------------------


def _csv_cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, Text):
        return v.text
    if isinstance(v, Stamp):
        return v.text()
    if isinstance(v, Spelled):
        return v.text
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _columns(batch: Batch) -> list[str]:
    cols = list(COLUMNS)
    if batch.column_defect == "missing":
        cols.remove("reading")
    if batch.column_defect == "unknown":
        cols.append("temperature")
    return cols


def _cell(row: Row, column: str) -> Any:
    return 21.5 if column == "temperature" else row.cells[column]


def write_batch(batch: Batch, directory: Path) -> Path:
    cols = _columns(batch)
    if batch.fmt == "csv":
        sep = ";" if batch.file_defect == "semicolon" else ","
        lines = [sep.join(cols)] + [
            sep.join(_csv_cell(_cell(r, c)) for c in cols) for r in batch.rows
        ]
        path = directory / "batch.csv"
        bom = b"\xef\xbb\xbf" if batch.file_defect == "bom" else b""
        path.write_bytes(bom + ("\n".join(lines) + "\n").encode("utf-8"))
        return path
    arrays = {c: _arrow_column(batch, [_cell(r, c) for r in batch.rows], c) for c in cols}
    path = directory / "batch.parquet"
    pq.write_table(pa.table(arrays), path)
    if batch.file_defect == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * batch.cut)])
    return path


def _arrow_column(batch: Batch, values: list[Any], column: str) -> pa.Array:
    as_text = any(isinstance(v, Text) for v in values)
    if column == "ts":
        if as_text or batch.ts_mode == "text":
            return pa.array([None if v is None else _csv_cell(v) for v in values], pa.string())
        naive = batch.ts_mode == "naive"
        instants = [
            None if v is None else (v.instant.replace(tzinfo=None) if naive else v.instant)
            for v in values
        ]
        return pa.array(instants, pa.timestamp("us") if naive else pa.timestamp("us", tz="UTC"))
    if as_text:
        return pa.array([None if v is None else _csv_cell(v) for v in values], pa.string())
    if column == "ok":
        return pa.array([None if v is None else v.value for v in values], pa.bool_())
    types = {"reading": pa.float64(), "power": pa.float64(), "temperature": pa.float64()}
    types |= {"pulses": pa.int64()}
    return pa.array(values, types.get(column, pa.string()))


# -- the property --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse whose raw table holds SEED (version 1), copied for every example."""
    root = tmp_path_factory.mktemp("seeded") / "warehouse"
    store = RawStore(Warehouse(str(root)))
    store.ensure_table(SPEC)
    seed = pa.table(
        {
            "entity_id": [r["entity_id"] for r in SEED],
            "ts": pa.array([r["ts"] for r in SEED], pa.timestamp("us", tz="UTC")),
            "reading": [r["reading"] for r in SEED],
            "power": pa.array([r["power"] for r in SEED], pa.float64()),
            "pulses": pa.array([r["pulses"] for r in SEED], pa.int64()),
            "ok": pa.array([r["ok"] for r in SEED], pa.bool_()),
            "note": pa.array([r["note"] for r in SEED], pa.string()),
        }
    )
    pq.write_table(seed, root.parent / "seed.parquet")
    assert store.ingest(SPEC, root.parent / "seed.parquet", ChangeSource.IMPORT).version == 1
    return root


def _stored(uri: str) -> list[dict]:
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    for r in rows:
        r["ts"] = r["ts"].astimezone(UTC)
        assert r.pop("day") == r["ts"].date()
    return sorted(rows, key=lambda r: (r["entity_id"], r["ts"]))


def check_batch(warehouse: Path, batch: Batch) -> None:
    """Ingest `batch` into a copy of `warehouse` and compare with the model's outcome."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "warehouse"
        shutil.copytree(warehouse, root)
        store = RawStore(Warehouse(str(root)))
        uri = store.uri(SPEC)
        before = _stored(uri)
        path = write_batch(batch, Path(tmp))
        expected = expected_outcome(batch)

        if isinstance(expected, tuple):
            row, reasons = expected
            event(f"rejected at {'batch' if row is None else 'a row'}")
            with pytest.raises(IngestValidationError) as info:
                store.ingest(SPEC, path, ChangeSource.PIPELINE)
            err = info.value
            assert err.row == row, str(err)
            assert any(r in str(err) for r in reasons), (str(err), reasons)
            assert ("batch" if row is None else f"row {row}") in str(err)
            assert DeltaTable(uri).version() == 1
            assert _stored(uri) == before
        else:
            event(f"landed ({batch.fmt})")
            result = store.ingest(SPEC, path, ChangeSource.PIPELINE)
            assert result.version == 2 == DeltaTable(uri).version()
            assert result.rows == len(batch.rows)
            assert _stored(uri) == expected
            instants_in = [r.cells["ts"].instant for r in batch.rows]
            assert (result.min_ts, result.max_ts) == (min(instants_in), max(instants_in))


@settings(PROPERTY, max_examples=40)
@given(batch=batches())
def test_random_batches_land_exactly_or_are_rejected_whole(
    seeded_warehouse: Path, batch: Batch
) -> None:
    check_batch(seeded_warehouse, batch)


@pytest.mark.parametrize("planted", PLANTED)
@settings(PROPERTY, max_examples=3)
@given(data=st.data())
def test_every_kind_of_defect_is_found_at_the_first_bad_row(
    seeded_warehouse: Path, planted: str, data: st.DataObject
) -> None:
    batch = data.draw(batches(planted))
    if planted != "bom":  # a byte-order mark is harmless; everything else must be rejected
        assert isinstance(expected_outcome(batch), tuple)
    check_batch(seeded_warehouse, batch)


def test_the_batch_model_rejects_what_it_should() -> None:
    """The generator produces every outcome the property relies on (guards a vacuous model)."""
    row = Row(
        {
            "entity_id": "m1",
            "ts": Stamp(POOL[0], "+01:00"),
            "reading": 1.0,
            "power": None,
            "pulses": None,
            "ok": None,
            "note": None,
        }
    )
    dup = Row({**row.cells, "ts": Stamp(POOL[0], None)})
    bad = Row({**row.cells, "reading": None}, {"reading is null"})
    assert expected_outcome(Batch([row, dup], "csv", "text", None, None)) == (1, {"duplicate key"})
    assert expected_outcome(Batch([row, bad, dup], "csv", "text", None, None))[0] == 1
    landed = expected_outcome(Batch([row], "csv", "text", None, None))
    assert isinstance(landed, list)
    m1 = next(r for r in landed if r["entity_id"] == "m1")
    assert (m1["reading"], m1["power"], m1["note"]) == (1.0, 2.0, "seed")  # COALESCE
    assert len(landed) == len(SEED)


# ---------------------------------------------------------------------------------------------
# Specs: random valid catalogs, and the same catalogs broken by one known mutation

WHOLE_HOUR_ZONES = ("UTC", "Europe/Vienna", "America/New_York", "Asia/Tokyo", "Australia/Sydney")
# Every one divides an hour: one partition per bucket in the zones above.
MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)
CALENDAR_ABOVE = {  # calendar alignments that nest in a source of this alignment
    "FixedSize": ("CalendarDay", "Iso8601Week", "CalendarMonth", "CalendarYear"),
    "CalendarDay": ("CalendarDay", "Iso8601Week", "CalendarMonth", "CalendarYear"),
    "Iso8601Week": ("Iso8601Week",),
    "CalendarMonth": ("CalendarMonth", "CalendarYear"),
    "CalendarYear": ("CalendarYear",),
}
CALENDAR_NOT_ABOVE = {
    "CalendarDay": (),
    "Iso8601Week": ("CalendarDay", "CalendarMonth", "CalendarYear"),
    "CalendarMonth": ("CalendarDay", "Iso8601Week"),
    "CalendarYear": ("CalendarDay", "Iso8601Week", "CalendarMonth"),
}
OPTIONAL_COLUMNS = {"kw": "double", "pulses": "long", "label": "string", "flag": "boolean"}
PARTIALS = {
    "Sum": {"sum"},
    "Count": {"count"},
    "Min": {"min"},
    "Max": {"max"},
    "Avg": {"sum", "count"},
}
NUMERIC = {"double", "long"}


@dataclass
class Chain:
    """A generated catalog plus what the generator knows about it."""

    doc: dict[str, Any]
    base: str
    columns: dict[str, str]  # base column -> type
    root: str
    starts: dict[str, date] = field(default_factory=dict)  # effective start of each rollup
    minutes: dict[str, int] = field(default_factory=dict)  # FixedSize rollups only
    zone: str = "UTC"

    @property
    def rollups(self) -> dict[str, dict[str, Any]]:
        return self.doc["rollups"]

    def base_body(self) -> dict[str, Any]:
        section = "raw_archives" if "raw_archives" in self.doc else "time_range_archives"
        return self.doc[section][self.base]


def _outputs(aggs: list[dict[str, str]]) -> list[str]:
    return [a.get("target") or f"{a['column']}_{a['function']}".lower() for a in aggs]


def _available(chain: Chain, source: str) -> list[tuple[str, str]]:
    """(column, function) pairs a rollup over `source` may aggregate."""
    if source == chain.base:
        return [
            (c, f)
            for c, t in chain.columns.items()
            for f in ("Sum", "Count", "Min", "Max", "Avg")
            if f == "Count" or t in NUMERIC
        ]
    partials: dict[str, set[str]] = {}
    for a in chain.rollups[source]["aggregations"]:
        partials.setdefault(a["column"], set()).update(PARTIALS[a["function"]])
    return [(c, f) for c, ps in partials.items() for f in PARTIALS if PARTIALS[f] <= ps]


@st.composite
def aggregations(draw: st.DrawFn, pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    chosen = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=4, unique=True))
    out = []
    for i, (column, function) in enumerate(chosen):
        agg = {"column": column, "function": function}
        if draw(st.booleans()) and draw(st.booleans()):
            agg["target"] = f"out_{i}"
        out.append(agg)
    return out


@st.composite
def chains(draw: st.DrawFn) -> Chain:
    extra = draw(st.lists(st.sampled_from(sorted(OPTIONAL_COLUMNS)), unique=True, max_size=4))
    columns = {"kwh": "double", **{c: OPTIONAL_COLUMNS[c] for c in extra}}
    declared: dict[str, Any] = {c: t for c, t in columns.items()}
    declared["kwh"] = {"type": "double", "required": True}
    period = draw(st.sampled_from([None, None, 1, 5, 15]))  # minutes, for a time-range base
    if period is None:
        doc: dict[str, Any] = {"raw_archives": {"meters": {"columns": declared}}, "rollups": {}}
        base = "meters"
    else:
        body = {"columns": declared, "period": f"{period}m"}
        doc = {"time_range_archives": {"tariffs": body}, "rollups": {}}
        base = "tariffs"
    zone = draw(st.sampled_from(WHOLE_HOUR_ZONES))
    start = draw(st.dates(date(2000, 1, 1), date(2030, 12, 31)))
    chain = Chain(doc, base, columns, root="level_0", zone=zone)
    size = draw(st.sampled_from([m for m in MINUTES if m % (period or 1) == 0]))
    chain.rollups["level_0"] = {
        "source": base,
        "alignment": "FixedSize",
        "size": f"{size}m",
        "reference_time_zone": zone,
        "start": start.isoformat(),
        "watermark_lag": draw(st.sampled_from(["0s", "5m", "PT1H", 90])),
        "aggregations": draw(aggregations(_available(chain, base))),
    }
    chain.starts["level_0"], chain.minutes["level_0"] = start, size
    for i in range(1, draw(st.integers(0, 5)) + 1):
        name = f"level_{i}"
        source = draw(st.sampled_from(sorted(chain.rollups)))
        body: dict[str, Any] = {"source": source, "reference_time_zone": zone}
        if source in chain.minutes:
            finer = chain.minutes[source]
            coarser = [m for m in MINUTES if m % finer == 0]
            choice = draw(st.sampled_from([*coarser, *CALENDAR_ABOVE["FixedSize"]]))
        else:
            choice = draw(st.sampled_from(CALENDAR_ABOVE[chain.rollups[source]["alignment"]]))
        if isinstance(choice, int):
            body |= {"alignment": "FixedSize", "size": f"{choice}m"}
            chain.minutes[name] = choice
        else:
            body["alignment"] = choice
        chain.starts[name] = chain.starts[source]
        if draw(st.booleans()):
            later = chain.starts[source] + timedelta(days=draw(st.integers(0, 400)))
            body["start"] = later.isoformat()
            chain.starts[name] = later
        body["aggregations"] = draw(aggregations(_available(chain, source)))
        chain.rollups[name] = body
    return chain


@settings(PROPERTY, max_examples=60)
@given(chain=chains())
def test_random_valid_catalogs_load(chain: Chain) -> None:
    cat = parse_catalog(chain.doc)
    event(f"{len(chain.rollups)} rollups")
    for body in chain.rollups.values():
        event(body["alignment"])
    assert list(cat.raw) + list(cat.time_range) == [chain.base]
    assert set(cat.rollups) == set(chain.rollups)
    for name, body in chain.rollups.items():
        spec = cat.rollups[name]
        assert spec.source == body["source"]
        assert spec.output_names == tuple(_outputs(body["aggregations"]))
        assert spec.start == datetime.combine(chain.starts[name], datetime.min.time())
        assert spec.reference_time_zone == chain.zone
        for a in body["aggregations"]:
            assert spec.column_types[a["column"]].value == chain.columns[a["column"]]
        if spec.source in cat.rollups:  # sources come first
            assert list(cat.rollups).index(spec.source) < list(cat.rollups).index(name)
    # The same catalog written as YAML loads to the same specs.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rollups.yaml"
        path.write_text(yaml.safe_dump(chain.doc), encoding="utf-8")
        assert load_catalog(path).rollups == cat.rollups


# -- mutations: each breaks one rule of one archive, and says which ----------------------------

Mutation = Callable[[st.DrawFn, Chain], tuple[str, str] | None]


def _any_rollup(draw: st.DrawFn, chain: Chain) -> str:
    return draw(st.sampled_from(sorted(chain.rollups)))


def _upper(draw: st.DrawFn, chain: Chain) -> str | None:
    names = sorted(n for n in chain.rollups if n != chain.root)
    return draw(st.sampled_from(names)) if names else None


def _descendants(chain: Chain, name: str) -> list[str]:
    out = [n for n, b in chain.rollups.items() if b["source"] == name]
    return out + [d for n in out for d in _descendants(chain, n)]


def unknown_source(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    chain.rollups[name]["source"] = "nowhere"
    return name, "known source"


def self_source(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    chain.rollups[name]["source"] = name
    return name, "no cycles"


def cycle(draw: st.DrawFn, chain: Chain) -> tuple[str, str] | None:
    below = _descendants(chain, chain.root)
    if not below:
        return None
    chain.rollups[chain.root]["source"] = draw(st.sampled_from(sorted(below)))
    # Dependency resolution walks sources from the first rollup; it reports where it loops.
    walked, name = [], next(iter(chain.rollups))
    while name not in walked:
        walked.append(name)
        name = chain.rollups[name]["source"]
    return name, "no cycles"


def unknown_column(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    chain.rollups[name]["aggregations"].append({"column": "ghost", "function": "Count"})
    return name, "known column"


def missing_partial(draw: st.DrawFn, chain: Chain) -> tuple[str, str] | None:
    name = _upper(draw, chain)
    if name is None:
        return None
    source = chain.rollups[name]["source"]
    have = set(_available(chain, source))
    missing = [(c, f) for c in chain.columns for f in PARTIALS if (c, f) not in have]
    missing = [(c, f) for c, f in missing if f == "Count" or chain.columns[c] in NUMERIC]
    if not missing:
        return None
    column, function = draw(st.sampled_from(missing))
    chain.rollups[name]["aggregations"].append({"column": column, "function": function})
    return name, "known column"


def non_numeric(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    column = draw(st.sampled_from(["label", "flag"]))
    chain.columns[column] = OPTIONAL_COLUMNS[column]
    chain.base_body()["columns"][column] = OPTIONAL_COLUMNS[column]
    function = draw(st.sampled_from(["Sum", "Min", "Max", "Avg"]))
    chain.rollups[chain.root]["aggregations"].append({"column": column, "function": function})
    return chain.root, "numeric aggregation"


def duplicate_output(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    aggs = chain.rollups[name]["aggregations"]
    aggs.append(dict(draw(st.sampled_from(aggs))))
    return name, "unique target names"


def bad_target(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    aggs = chain.rollups[name]["aggregations"]
    target = draw(st.sampled_from(["bucket_start", "entity_id", "Total", "a__b", "9th", "a-b"]))
    aggs.append({**aggs[0], "target": target})
    return name, "target name"


def zone_mismatch(draw: st.DrawFn, chain: Chain) -> tuple[str, str] | None:
    name = _upper(draw, chain)
    if name is None:
        return None
    other = draw(st.sampled_from([z for z in WHOLE_HOUR_ZONES if z != chain.zone]))
    chain.rollups[name]["reference_time_zone"] = other
    return name, "one zone per chain"


def invalid_zone(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    zone = draw(st.sampled_from(["Mars/Olympus", "Europe/Vienna ", "GMT+25", ""]))
    chain.rollups[name]["reference_time_zone"] = zone
    return name, "reference_time_zone"


def misaligned_partitions(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    """Nearly a week, but not of whole hours: the coarsest cron grid through every boundary is
    half-hourly, more than 168 partitions per bucket (whatever the zone and origin)."""
    chain.rollups[chain.root]["size"] = draw(st.sampled_from(["P6DT30M", "9990m", "P6DT23H30M"]))
    if draw(st.booleans()):
        chain.rollups[chain.root]["origin"] = "2024-01-01T00:30:00Z"
    return chain.root, "partitions align with buckets"


def bad_size(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    size = draw(st.sampled_from(["30s", "0s", "90s", "PT1M30S", "8d", "2w", "1000h"]))
    chain.rollups[chain.root]["size"] = size
    return chain.root, "bucket size"


def not_nesting(draw: st.DrawFn, chain: Chain) -> tuple[str, str] | None:
    options: list[tuple[str, str | int]] = []
    for name, body in chain.rollups.items():
        if name in chain.minutes:
            m = chain.minutes[name]
            options += [(name, k) for k in MINUTES if k < m or k % m]
        else:
            options += [(name, a) for a in CALENDAR_NOT_ABOVE[body["alignment"]]]
            options += [(name, k) for k in (15, 60)]  # FixedSize over calendar buckets
    if not options:
        return None
    source, choice = draw(st.sampled_from(options))
    body = {"source": source, "reference_time_zone": chain.zone}
    if isinstance(choice, int):
        body |= {"alignment": "FixedSize", "size": f"{choice}m"}
    else:
        body["alignment"] = choice
    body["aggregations"] = [dict(chain.rollups[source]["aggregations"][0])]
    chain.rollups["misfit"] = body
    return "misfit", "bucket nests in source"


def missing_start(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    del chain.rollups[chain.root]["start"]
    return chain.root, "start"


def start_before_source(draw: st.DrawFn, chain: Chain) -> tuple[str, str] | None:
    name = _upper(draw, chain)
    if name is None:
        return None
    source = chain.rollups[name]["source"]
    early = chain.starts[source] - timedelta(days=draw(st.integers(1, 1000)))
    chain.rollups[name]["start"] = early.isoformat()
    return name, "start"


def unknown_key(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    key = draw(st.sampled_from(["timezone", "Source", "sizes", "target"]))
    chain.rollups[name][key] = "UTC"
    return name, "known keys"


def bad_archive_name(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    old = _any_rollup(draw, chain)
    new = draw(st.sampled_from(["Level-X", "level__x", "9level", "l" * 64, "level_x\n"]))
    chain.doc["rollups"] = {new if n == old else n: b for n, b in chain.rollups.items()}
    for body in chain.rollups.values():
        if body["source"] == old:
            body["source"] = new
    return new, "archive name"


def name_clash(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    chain.doc.setdefault("raw_archives", {})[name] = {"columns": {"x": "double"}}
    return name, "unique names"


def reserved_column(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    column = draw(
        st.sampled_from(
            ["ts", "entity_id", "day", "range_start", "generation", "null", "true", "if", "abs"]
        )
    )
    chain.base_body()["columns"][column] = "double"
    return chain.base, "column name"


def bad_column_type(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    chain.base_body()["columns"]["extra"] = draw(
        st.sampled_from(["decimal", "int64", "text", "float", ""])
    )
    return chain.base, "column type"


def size_on_calendar(draw: st.DrawFn, chain: Chain) -> tuple[str, str] | None:
    calendar = sorted(n for n in chain.rollups if n not in chain.minutes)
    if not calendar:
        return None
    name = draw(st.sampled_from(calendar))
    chain.rollups[name]["size"] = "1d"
    return name, "size"


def fixed_without_size(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = draw(st.sampled_from(sorted(chain.minutes)))
    del chain.rollups[name]["size"]
    return name, "FixedSize needs size"


def bad_field(draw: st.DrawFn, chain: Chain) -> tuple[str, str]:
    name = _any_rollup(draw, chain)
    key, value, rule = draw(
        st.sampled_from(
            [
                ("alignment", "Hourly", "alignment"),
                ("alignment", "fixedsize", "alignment"),
                ("watermark_lag", "-5m", "watermark_lag"),
                ("watermark_lag", "a while", "watermark_lag"),
                ("refresh_open_bucket", "sometimes", "refresh_open_bucket"),
                ("aggregations", [], "has aggregations"),
                ("aggregations", [{"column": "kwh", "function": "Median"}], "aggregation function"),
                ("aggregations", [{"function": "Sum"}], "aggregation"),
                ("start", "someday", "start"),
            ]
        )
    )
    chain.rollups[name][key] = value
    return name, rule


MUTATIONS: list[Mutation] = [
    unknown_source,
    self_source,
    cycle,
    unknown_column,
    missing_partial,
    non_numeric,
    duplicate_output,
    bad_target,
    zone_mismatch,
    invalid_zone,
    misaligned_partitions,
    bad_size,
    not_nesting,
    missing_start,
    start_before_source,
    unknown_key,
    bad_archive_name,
    name_clash,
    reserved_column,
    bad_column_type,
    size_on_calendar,
    fixed_without_size,
    bad_field,
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
@settings(PROPERTY, max_examples=6)
@given(chain=chains(), data=st.data())
def test_random_invalid_catalogs_are_rejected_naming_archive_and_rule(
    mutation: Mutation, chain: Chain, data: st.DataObject
) -> None:
    verdict = mutation(data.draw, chain)
    assume(verdict is not None)
    archive, rule = verdict
    with pytest.raises(SpecError) as info:
        parse_catalog(chain.doc)
    err = info.value
    assert (err.archive, err.rule) == (archive, rule), str(err)
    shown = archive if archive.isprintable() else repr(archive)[1:-1]  # one line, escaped
    assert f"spec '{shown}'" in str(err) and f"[{rule}]" in str(err)


# ---------------------------------------------------------------------------------------------
# Hostile names: a trailing newline or a control character in any name is refused at load,
# shown escaped in a one-line message.

NAME_DEFECTS = ["meter\n", "me\tter", "meter\r\n", "m\x00", "met\x7fer", "meter\x85"]


def _with_name(where: str, name: str) -> tuple[dict[str, Any], str, str]:
    """A valid spec with `name` put `where`, and the subject and rule it must be refused with."""
    columns: dict[str, Any] = {"kwh": "double"}
    agg: dict[str, str] = {"column": "kwh", "function": "Sum"}
    raw, rollup, tenants = "meter_raw", "meter_hourly", {"acme": {}}
    if where == "archive":
        raw = name
    elif where == "column":
        columns = {name: "double", "kwh": "double"}
    elif where == "target":
        agg["target"] = name
    elif where == "tenant":
        tenants = {name: {}}
    doc = {
        "raw_archives": {raw: {"columns": columns}},
        "rollups": {
            rollup: {
                "source": raw,
                "alignment": "FixedSize",
                "size": "1h",
                "start": "2025-01-01",
                "aggregations": [agg],
            }
        },
        "tenants": tenants,
    }
    subject, rule = {
        "archive": (name, "archive name"),
        "column": (raw, "column name"),
        "target": (rollup, "target name"),
        "tenant": (f"tenants.{name}", "tenant name"),
    }[where]
    return doc, subject, rule


@pytest.mark.parametrize("name", NAME_DEFECTS, ids=repr)
@pytest.mark.parametrize("where", ["archive", "column", "target", "tenant"])
def test_a_name_with_a_newline_or_a_control_character_is_refused(where: str, name: str) -> None:
    doc, subject, rule = _with_name(where, name)
    with pytest.raises(SpecError) as info:
        parse_catalog(doc)
    err = info.value
    assert (err.archive, err.rule) == (subject, rule), str(err)
    assert repr(name) in str(err)
    assert len(str(err).splitlines()) == 1, str(err)


def test_the_same_names_without_the_defect_load() -> None:
    """Guards the test above: each spec it breaks loads with a plain name."""
    for where in ("archive", "column", "target", "tenant"):
        doc, _, _ = _with_name(where, "meter")
        parse_catalog(doc)


def test_a_spec_file_with_a_newline_in_a_column_name_is_refused_by_validate(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = tmp_path / "specs.yaml"
    spec.write_text('raw_archives:\n  meter_raw:\n    columns:\n      "meter\\n": double\n')
    monkeypatch.setenv("ROLLUPS_SPECS", str(spec))
    assert_one_line_failure(rollups("validate"), "[column name]", "'meter\\n'")


def test_a_backup_manifest_naming_a_table_path_with_a_trailing_newline_is_refused() -> None:
    doc = {
        "format": "rollups-backup",
        "format_version": 2,
        "created_at": "2025-01-01T00:00:00Z",
        "source_root": "/w",
        "specs_origin": "specs.yaml",
        "archives": {},
        "tables": [
            {
                "path": "raw/meter_raw\n",
                "version": 0,
                "files": 1,
                "bytes": 1,
                "sha256": {"_delta_log/00000000000000000000.json": "0" * 64},
            }
        ],
    }
    with pytest.raises(BackupInvalidError, match="not a warehouse table path"):
        BackupManifest.from_json(json.dumps(doc), "manifest.json")


@pytest.mark.parametrize("entity", ["m1\n", "m\x001", "m\t1", "m1\x9b"], ids=repr)
def test_an_entity_id_with_a_control_character_is_refused_at_its_row(
    seeded_warehouse: Path, tmp_path: Path, entity: str
) -> None:
    root = tmp_path / "warehouse"
    shutil.copytree(seeded_warehouse, root)
    store = RawStore(Warehouse(str(root)))
    batch = pa.table(
        {
            "entity_id": ["m1", entity],
            "ts": pa.array([POOL[0], POOL[1]], pa.timestamp("us", tz="UTC")),
            "reading": [1.0, 2.0],
        }
    )
    pq.write_table(batch, tmp_path / "batch.parquet")
    with pytest.raises(IngestValidationError) as info:
        store.ingest(SPEC, tmp_path / "batch.parquet", ChangeSource.PIPELINE)
    assert info.value.row == 1 and repr(entity) in str(info.value), str(info.value)
    assert len(str(info.value).splitlines()) == 1
    assert DeltaTable(store.uri(SPEC)).version() == 1


# ---------------------------------------------------------------------------------------------
# Reserved words and keys YAML does not read as text: refused at load, naming what was written.

RESERVED = ["null", "true", "false", "and", "or", "not", "if", "abs", "sqrt", "min", "round"]


@pytest.mark.parametrize("word", RESERVED)
def test_a_reserved_word_is_refused_as_a_column_name(word: str) -> None:
    doc, _, _ = _with_name("column", word)
    with pytest.raises(SpecError) as info:
        parse_catalog(doc, origin="specs.yaml")
    err = info.value
    assert (err.archive, err.rule) == ("meter_raw", "column name"), str(err)
    assert repr(word) in str(err) and "reserved word" in str(err) and "specs.yaml" in str(err)


@pytest.mark.parametrize("word", RESERVED)
def test_a_reserved_word_is_refused_as_a_target_name(word: str) -> None:
    doc, _, _ = _with_name("target", word)
    with pytest.raises(SpecError) as info:
        parse_catalog(doc)
    assert (info.value.archive, info.value.rule) == ("meter_hourly", "target name")
    assert repr(word) in str(info.value) and "reserved word" in str(info.value)


SPEC_WITH_KEY = """\
raw_archives:
  meter_raw:
    columns:
      kwh: double
      {key}: double
rollups:
  meter_hourly:
    source: meter_raw
    alignment: FixedSize
    size: 1h
    start: 2025-01-01
    aggregations: [{{column: kwh, function: Sum}}]
"""


@pytest.mark.parametrize(
    ("key", "read_as"),
    [
        ("on", "the boolean True"),
        ("Off", "the boolean False"),
        ("yes", "the boolean True"),
        ("NO", "the boolean False"),
        ("12", "the number 12"),
        ("1.5", "the number 1.5"),
        ("0x1f", "the number 31"),
        ("null", "null"),
        ("~", "null"),
        ("2025-01-01", "the date 2025-01-01"),
    ],
)
def test_a_column_key_yaml_does_not_read_as_text_is_refused_naming_what_was_written(
    tmp_path: Path, key: str, read_as: str
) -> None:
    spec = tmp_path / "specs.yaml"
    spec.write_text(SPEC_WITH_KEY.format(key=key))
    with pytest.raises(SpecError) as info:
        load_catalog(spec)
    err = info.value
    assert (err.archive, err.rule) == ("meter_raw", "keys are text"), str(err)
    assert f"column name `{key}` (line 5 of {spec})" in str(err), str(err)
    assert f"read by YAML as {read_as};" in str(err) and "quote it" in str(err)


@pytest.mark.parametrize("key", ["'on'", '"no"', "'null'"])
def test_the_same_column_key_quoted_is_a_name(tmp_path: Path, key: str) -> None:
    spec = tmp_path / "specs.yaml"
    spec.write_text(SPEC_WITH_KEY.format(key=key).replace("'null'", "'null_count'"))
    columns = [c.name for c in load_catalog(spec).raw["meter_raw"].columns]
    assert columns[0] == "kwh" and len(columns) == 2


def test_archive_and_tenant_keys_yaml_does_not_read_as_text_are_refused(tmp_path: Path) -> None:
    spec = tmp_path / "specs.yaml"
    spec.write_text("raw_archives:\n  yes: {columns: {kwh: double}}\n")
    with pytest.raises(SpecError, match=r"archive name `yes` \(line 2 of .*boolean True"):
        load_catalog(spec)
    spec.write_text(SPEC_WITH_KEY.format(key="x") + "tenants:\n  on: {}\n")
    with pytest.raises(SpecError, match=r"tenant name `on` \(line 14 of .*boolean True"):
        load_catalog(spec)


def test_a_spec_given_as_data_with_a_key_that_is_not_text_is_refused() -> None:
    doc, _, _ = _with_name("column", "kwh2")
    doc["raw_archives"]["meter_raw"]["columns"] = {True: "double", "kwh": "double"}
    with pytest.raises(SpecError) as info:
        parse_catalog(doc)
    assert (info.value.archive, info.value.rule) == ("meter_raw", "keys are text")
    assert "column name True is a bool, not text" in str(info.value)


@pytest.mark.timeout(10)
def test_the_key_check_of_a_spec_given_as_data_reads_a_repeated_list_once() -> None:
    """A list repeated by reference (as a YAML alias gives it) 9 levels deep is checked in
    about as many steps as it has distinct lists, not in 9**10."""
    repeated: list[Any] = ["lol"] * 9
    for _ in range(9):
        repeated = [repeated] * 9
    doc, _, _ = _with_name("column", "kwh2")
    doc["raw_archives"]["meter_raw"]["x-notes"] = repeated
    start = time.perf_counter()
    with pytest.raises(SpecError, match="unknown keys"):
        parse_catalog(doc)
    assert time.perf_counter() - start < 0.5


def test_validate_refuses_an_on_column_in_one_line_naming_it(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = tmp_path / "specs.yaml"
    spec.write_text(SPEC_WITH_KEY.format(key="on"))
    monkeypatch.setenv("ROLLUPS_SPECS", str(spec))
    assert_one_line_failure(
        rollups("validate"), "spec 'meter_raw'", "[keys are text]", "`on` (line 5", "quote it"
    )


# ---------------------------------------------------------------------------------------------
# Numbers: ASCII digits only, never infinity.


def _with_formula(formula: str) -> dict[str, Any]:
    doc, _, _ = _with_name("column", "kwh2")
    doc["raw_archives"]["meter_raw"]["columns"] = {
        "kwh": "double",
        "scaled": {"type": "double", "formula": formula},
    }
    return doc


@pytest.mark.parametrize("formula", ["1e999", "kwh * 1E400", "-1e999 + kwh", "kwh / 9e9999"])
def test_a_formula_literal_that_would_be_infinity_is_refused_at_load(formula: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_catalog(_with_formula(formula))
    err = info.value
    assert (err.archive, err.rule) == ("meter_raw", "formula"), str(err)
    literal = next(w for w in formula.replace("-", " ").split() if "e" in w.lower())
    assert "column 'scaled'" in str(err) and f"number {literal} is too large" in str(err)


@pytest.mark.parametrize("formula", ["١٢", "kwh * １２", "round(kwh, ٣)", "kwh + 1٢"])
def test_digits_of_other_scripts_are_not_numbers_in_a_formula(formula: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_catalog(_with_formula(formula))
    err = info.value
    assert (err.archive, err.rule) == ("meter_raw", "formula"), str(err)
    assert "column 'scaled'" in str(err) and "digits 0-9" in str(err)


def test_finite_ascii_literals_still_load() -> None:
    """Guards the two tests above: the same formulas with plain literals load."""
    for formula in ["1e300", "kwh * 1E30", "-12.5 + kwh", "round(kwh, 3)", "kwh + .5"]:
        parse_catalog(_with_formula(formula))


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("watermark_lag", "١٢m", "'١٢m' is not a duration"),
        ("watermark_lag", "P٣D", "'P٣D' is not a duration"),
        ("size", "１h", "'１h' is not a duration"),
        ("watermark_lag", float("inf"), "not a finite number"),
        ("watermark_lag", float("nan"), "not a finite number"),
        ("watermark_lag", "99999999999999999999d", "is too long"),
        ("watermark_lag", 1e300, "is too long"),
        ("retention", "٣d", "'٣d' is not a duration"),
    ],
)
def test_durations_are_ascii_digits_and_finite(key: str, value: Any, needle: str) -> None:
    doc, _, _ = _with_name("column", "kwh2")
    subject = "meter_raw" if key == "retention" else "meter_hourly"
    body = doc["raw_archives"]["meter_raw"] if key == "retention" else doc["rollups"][subject]
    body[key] = value
    with pytest.raises(SpecError) as info:
        parse_catalog(doc)
    assert (info.value.archive, info.value.rule) == (subject, key), str(info.value)
    assert needle in str(info.value)


def test_validate_refuses_an_infinite_literal_in_one_line(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = tmp_path / "specs.yaml"
    spec.write_text(yaml.safe_dump(_with_formula("kwh * 1e999")))
    monkeypatch.setenv("ROLLUPS_SPECS", str(spec))
    assert_one_line_failure(
        rollups("validate"), "spec 'meter_raw'", "[formula]", "'scaled'", "1e999"
    )


# ---------------------------------------------------------------------------------------------
# YAML aliases: a spec may share declarations through anchors, not multiply them.


def _laughs(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs": each anchor a list of `width` aliases of the one before, the last
    aliased as an archive's description (9 levels of 9: 9**9 strings, 2 GB as text)."""
    lines = ["x-l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"x-l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    lines += [
        "raw_archives:",
        "  meter_raw:",
        f"    description: *l{levels - 1}",
        "    columns: {kwh: double}",
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(10)  # unbounded, loading took 40 s and 2 GB
def test_an_alias_bomb_is_refused_in_well_under_a_second_naming_the_alias(tmp_path: Path) -> None:
    spec = tmp_path / "laughs.yaml"
    spec.write_text(_laughs())
    assert spec.stat().st_size < 700
    start = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_catalog(spec)
    assert time.perf_counter() - start < 0.5
    err = info.value
    assert (err.archive, err.rule) == (str(spec), "alias expansion"), str(err)
    # Lines 2-4 repeat about 30,000 through aliases; each *l3 on line 5 repeats 27,064 more.
    assert f"alias *l3 (line 5 of {spec})" in str(err) and len(str(err).splitlines()) == 1


def test_an_alias_inside_the_node_it_names_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "cycle.yaml"
    spec.write_text("x-loop: &loop {again: *loop}\nraw_archives: {}\n")
    with pytest.raises(SpecError, match=r"alias \*loop \(line 1 of .*\) is inside the node"):
        load_catalog(spec)


def test_specs_that_share_declarations_through_aliases_still_load(tmp_path: Path) -> None:
    """The shipped spec shares its zone and aggregations through anchors, and a small tree of
    aliases (three levels of three) stays within the budget."""
    assert len(load_catalog(DEFAULT_SPECS).rollups) == 5
    spec = tmp_path / "small.yaml"
    spec.write_text(_laughs(levels=3, width=3))
    assert load_catalog(spec).raw["meter_raw"].description.count("lol") == 27


@pytest.mark.timeout(10)
def test_validate_refuses_an_alias_bomb_in_one_line(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = tmp_path / "laughs.yaml"
    spec.write_text(_laughs())
    monkeypatch.setenv("ROLLUPS_SPECS", str(spec))
    start = time.perf_counter()
    assert_one_line_failure(rollups("validate"), "[alias expansion]", "alias *l3 (line 5")
    assert time.perf_counter() - start < 1.0


def test_validate_names_a_yaml_error_in_one_line_with_its_line(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PyYAML's messages span several lines; the CLI shows one, which must hold the problem."""
    spec = tmp_path / "specs.yaml"
    spec.write_text("raw_archives:\n  m: {columns: {x: double}}\n  m: {columns: {y: double}}\n")
    monkeypatch.setenv("ROLLUPS_SPECS", str(spec))
    assert_one_line_failure(
        rollups("validate"), "[valid YAML]", "found duplicate key 'm' at line 3, column 3"
    )
