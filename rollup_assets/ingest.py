"""Reading and validating an ingest batch (Parquet or CSV) against a raw or time-range spec.

The batch is validated whole before anything is written: every chunk is converted to the
archive's Arrow schema, and the first offending row (0-based, in file order) is reported with its
reason. Conversion is streamed in chunks, so a large file is never held several times over.

Rules: required columns present and non-null; values convertible to the declared type; no NaN
in required columns (NaN in an optional double column means "missing" and becomes null); no
infinities; timestamps parseable (ISO-8601 strings or timestamp columns; naive means UTC, offsets
are converted) and within years 1 to 9999 in UTC; no duplicate keys inside one batch; no columns
the spec does not declare, none twice. In a CSV file only an empty cell is missing ("NA" is text).
"""

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from rollup_assets.errors import IngestValidationError
from rollup_assets.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    RANGE_END_COLUMN,
    RANGE_START_COLUMN,
    TIME_COLUMN,
    ColumnSpec,
    ColumnType,
    RawArchiveSpec,
    TimeRangeArchiveSpec,
)

TS = pa.timestamp("us", tz="UTC")
ARROW_TYPES = {
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.LONG: pa.int64(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.STRING: pa.string(),
}
_OFFSET = r"(Z|z|[+-]\d\d:?\d\d)$"
_TRUE = {"true", "t", "1", "yes"}
_FALSE = {"false", "f", "0", "no"}
CHUNK_ROWS = 262_144
# The instants Python, Spark and Delta readers can all represent.
_MIN_TS = pa.scalar(dt.datetime(1, 1, 1, tzinfo=dt.UTC), TS)
_MAX_TS = pa.scalar(dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC), TS)


def key_columns(spec: RawArchiveSpec | TimeRangeArchiveSpec) -> list[str]:
    if isinstance(spec, TimeRangeArchiveSpec):
        return [ENTITY_COLUMN, RANGE_START_COLUMN, RANGE_END_COLUMN]
    return [ENTITY_COLUMN, TIME_COLUMN]


def archive_schema(spec: RawArchiveSpec | TimeRangeArchiveSpec) -> pa.Schema:
    """The Delta schema of a raw or time-range table (`day` is the UTC partition date)."""
    keys = [pa.field(ENTITY_COLUMN, pa.string())]
    keys += [pa.field(c, TS) for c in key_columns(spec)[1:]]
    values = [pa.field(c.name, ARROW_TYPES[c.type]) for c in spec.columns]
    return pa.schema([*keys, *values, pa.field(DAY_COLUMN, pa.date32())])


@dataclass(frozen=True)
class BatchSummary:
    rows: int
    min_ts: dt.datetime
    max_ts: dt.datetime
    days: list[dt.date]
    entities: int


class BatchReader:
    """Validated, converted chunks of one input file; `validate()` must pass before `chunks()`."""

    def __init__(self, spec: RawArchiveSpec | TimeRangeArchiveSpec, path: str | Path) -> None:
        self.spec = spec
        self.path = Path(path)
        self.schema = archive_schema(spec)

    # -- raw chunks from the file ----------------------------------------------------------

    def _raw_chunks(self) -> Iterator[pa.Table]:
        suffix = self.path.suffix.lower()
        if not self.path.exists():
            raise IngestValidationError(self.spec.name, None, f"file {self.path} does not exist")
        if self.path.stat().st_size == 0:
            raise IngestValidationError(self.spec.name, None, f"file {self.path} is empty")
        if suffix in (".parquet", ".pq"):
            try:
                pf = pq.ParquetFile(self.path)
                for batch in pf.iter_batches(batch_size=CHUNK_ROWS):
                    yield pa.Table.from_batches([batch])
            except (pa.ArrowException, OSError) as exc:
                raise IngestValidationError(
                    self.spec.name, None, f"{self.path.name} is not a readable Parquet file ({exc})"
                ) from None
        elif suffix in (".csv", ".txt"):
            try:
                reader = pcsv.open_csv(
                    self.path,
                    read_options=pcsv.ReadOptions(block_size=1 << 24),
                    convert_options=pcsv.ConvertOptions(
                        column_types=dict.fromkeys(self._csv_header(), pa.string()),
                        # Only an empty cell is missing: Arrow's default list would turn text
                        # such as "NA" or "null" into nulls, and "NaN" must reach the NaN check.
                        null_values=[""],
                        strings_can_be_null=True,
                    ),
                )
                for batch in reader:
                    yield pa.Table.from_batches([batch])
            except (pa.ArrowException, OSError) as exc:
                raise IngestValidationError(
                    self.spec.name, None, f"{self.path.name} is not a readable CSV file ({exc})"
                ) from None
        else:
            raise IngestValidationError(
                self.spec.name, None, f"unsupported file type '{suffix}' (use .parquet or .csv)"
            )

    def _csv_header(self) -> list[str]:
        with open(self.path, encoding="utf-8-sig", errors="replace") as f:
            first = f.readline().strip()
        return [c.strip().strip('"') for c in first.split(",")]

    # -- conversion --------------------------------------------------------------------------

    def _check_columns(self, names: list[str]) -> None:
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise IngestValidationError(
                self.spec.name, None, f"column(s) {twice} appear more than once in the header"
            )
        declared = {c.name for c in self.spec.columns} | set(key_columns(self.spec))
        unknown = [n for n in names if n not in declared]
        if unknown:
            hint = ""
            if len(names) == 1 and any(d in names[0] for d in (";", "\t", "|")):
                hint = " (the header looks like it uses another delimiter; use commas)"
            raise IngestValidationError(
                self.spec.name,
                None,
                f"unknown column(s) {unknown}; declared: {sorted(declared)}{hint}",
            )
        required = [*key_columns(self.spec), *[c.name for c in self.spec.columns if c.required]]
        for col in required:
            if col not in names:
                raise IngestValidationError(
                    self.spec.name, 0, f"required column '{col}' is missing"
                )

    def _convert(self, chunk: pa.Table, offset: int) -> pa.Table:
        self._check_columns(chunk.column_names)
        for i, f in enumerate(chunk.schema):
            if pa.types.is_dictionary(f.type):  # e.g. a pandas categorical: decode it
                chunk = chunk.set_column(i, f.name, pc.cast(chunk[i], f.type.value_type))
        n = chunk.num_rows
        out: dict[str, pa.Array | pa.ChunkedArray] = {}
        out[ENTITY_COLUMN] = self._entity(chunk[ENTITY_COLUMN], offset)
        for col in key_columns(self.spec)[1:]:
            out[col] = self._timestamp(col, chunk[col], offset)
        for c in self.spec.columns:
            if c.name in chunk.column_names:
                out[c.name] = self._value(c, chunk[c.name], offset)
            else:
                out[c.name] = pa.nulls(n, ARROW_TYPES[c.type])
        if isinstance(self.spec, TimeRangeArchiveSpec):
            bad = pc.greater_equal(out[RANGE_START_COLUMN], out[RANGE_END_COLUMN])
            self._fail_first(bad, offset, "range_start must be before range_end")
        time_col = key_columns(self.spec)[1]
        out[DAY_COLUMN] = pc.cast(out[time_col], pa.date32())
        return pa.table(out, schema=self.schema)

    def _fail_first(self, bad: pa.ChunkedArray | pa.Array, offset: int, reason: str) -> None:
        bad = pc.fill_null(bad, False)
        if pc.any(bad).as_py():
            idx = pc.index(bad, True).as_py()
            raise IngestValidationError(self.spec.name, offset + idx, reason)

    def _entity(self, col: pa.ChunkedArray, offset: int) -> pa.ChunkedArray:
        if not (
            pa.types.is_string(col.type)
            or pa.types.is_large_string(col.type)
            or pa.types.is_integer(col.type)
        ):
            raise IngestValidationError(
                self.spec.name, 0, f"entity_id must be text, not {col.type}"
            )
        col = pc.cast(col, pa.string())
        self._fail_first(pc.is_null(col), offset, "entity_id is null")
        self._fail_first(
            pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0), offset, "entity_id is empty"
        )
        return col

    def _timestamp(self, name: str, col: pa.ChunkedArray, offset: int) -> pa.ChunkedArray:
        self._fail_first(pc.is_null(col), offset, f"{name} is null")
        if pa.types.is_date(col.type):
            col = pc.cast(pc.cast(col, pa.date32()), pa.timestamp("s"))
        if pa.types.is_timestamp(col.type):
            if col.type.tz is None:
                out = pc.assume_timezone(
                    self._instant(name, col, pa.timestamp("us"), offset), "UTC"
                )
            else:
                out = self._instant(name, col, TS, offset)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            text = pc.utf8_trim_whitespace(pc.cast(col, pa.string()))
            has_offset = pc.match_substring_regex(text, _OFFSET)
            aware = self._instant(name, pc.if_else(has_offset, text, None), TS, offset)
            naive = self._instant(
                name, pc.if_else(has_offset, None, text), pa.timestamp("us"), offset
            )
            out = pc.if_else(has_offset, aware, pc.assume_timezone(naive, "UTC"))
        else:
            raise IngestValidationError(
                self.spec.name,
                0,
                f"{name} must be a timestamp or an ISO-8601 string, not {col.type}",
            )
        outside = pc.or_(pc.less(out, _MIN_TS), pc.greater(out, _MAX_TS))
        self._fail_first(outside, offset, f"{name} is outside years 1 to 9999 (UTC)")
        return out

    def _instant(
        self, name: str, col: pa.ChunkedArray, target: pa.DataType, offset: int
    ) -> pa.ChunkedArray:
        """`col` cast to a microsecond timestamp; the first value that does not fit is an error."""
        try:
            return pc.cast(col, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        i = _first_uncastable(col, target)
        shown = pc.cast(col.slice(i, 1), pa.string())[0].as_py()
        if pa.types.is_string(col.type):
            reason = f"{name} {shown!r} is not an ISO-8601 timestamp (e.g. 2025-01-01T00:15:00Z)"
        else:
            reason = f"{name} {shown} does not fit a UTC timestamp in microseconds"
        raise IngestValidationError(self.spec.name, offset + i, reason)

    def _value(self, c: ColumnSpec, col: pa.ChunkedArray, offset: int) -> pa.ChunkedArray:
        target = ARROW_TYPES[c.type]
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = pc.utf8_trim_whitespace(pc.cast(col, pa.string()))
            col = pc.if_else(pc.equal(col, ""), None, col)  # an empty CSV cell is missing
            if c.type is ColumnType.BOOLEAN:
                col = self._bool_from_text(c, col, offset)
        converted = self._cast(c, col, target, offset)
        if c.type is ColumnType.DOUBLE:
            self._fail_first(pc.is_inf(converted), offset, f"{c.name} is infinite")
            nan = pc.is_nan(converted)
            if c.required:
                self._fail_first(nan, offset, f"{c.name} is NaN but the column is required")
            converted = pc.if_else(pc.fill_null(nan, False), None, converted)
        if c.required:
            self._fail_first(pc.is_null(converted), offset, f"required column {c.name} is null")
        return converted

    def _bool_from_text(self, c: ColumnSpec, col: pa.ChunkedArray, offset: int) -> pa.ChunkedArray:
        low = pc.utf8_lower(col)
        known = pc.is_in(low, value_set=pa.array(sorted(_TRUE | _FALSE)))
        self._fail_first(
            pc.and_(pc.invert(pc.is_null(low)), pc.invert(known)),
            offset,
            f"{c.name} is not a boolean",
        )
        truthy = pc.is_in(low, value_set=pa.array(sorted(_TRUE)))
        return pc.if_else(pc.is_null(low), pa.scalar(None, pa.bool_()), truthy)

    def _cast(
        self, c: ColumnSpec, col: pa.ChunkedArray, target: pa.DataType, offset: int
    ) -> pa.ChunkedArray:
        src = col.type
        numeric_target = c.type in (ColumnType.DOUBLE, ColumnType.LONG)
        if numeric_target and pa.types.is_boolean(src):
            raise IngestValidationError(self.spec.name, 0, f"{c.name} must be numeric, not boolean")
        if c.type is ColumnType.BOOLEAN and not (
            pa.types.is_boolean(src) or pa.types.is_integer(src)
        ):
            raise IngestValidationError(self.spec.name, 0, f"{c.name} must be boolean, not {src}")
        try:
            return pc.cast(col, target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        for i, value in enumerate(col.to_pylist()):
            try:
                pc.cast(pa.array([value], type=src), target, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                kind = {ColumnType.LONG: "a whole number", ColumnType.DOUBLE: "a number"}.get(
                    c.type, c.type.value
                )
                reason = f"{c.name} value {value!r} is not {kind}"
                if not pa.types.is_string(src):
                    reason = f"{c.name} value {value!r} does not fit {c.type.value} exactly"
                raise IngestValidationError(self.spec.name, offset + i, reason) from None
        raise IngestValidationError(
            self.spec.name, offset, f"{c.name} cannot be converted to {c.type.value}"
        )

    # -- passes ------------------------------------------------------------------------------

    def validate(self) -> BatchSummary:
        """First pass: convert every chunk, check keys are unique; nothing is kept but keys."""
        keys: list[pa.Table] = []
        offset = 0
        lo = hi = None
        days: set[dt.date] = set()
        for chunk in self._raw_chunks():
            try:
                t = self._convert(chunk, offset)
            except IngestValidationError as err:
                raise self._first_offence(err, chunk, offset, keys) from None
            time_col = key_columns(self.spec)[1]
            keys.append(self._keys(t, offset))
            if t.num_rows:
                a, b = pc.min_max(t[time_col]).values()
                lo = a.as_py() if lo is None else min(lo, a.as_py())
                hi = b.as_py() if hi is None else max(hi, b.as_py())
                days.update(pc.unique(t[DAY_COLUMN]).to_pylist())
            offset += t.num_rows
        if offset == 0 or lo is None or hi is None:
            raise IngestValidationError(self.spec.name, None, f"{self.path.name} holds no rows")
        allkeys = pa.concat_tables(keys)
        first = _first_duplicate(allkeys, key_columns(self.spec))
        if first is not None:
            raise self._duplicate(first)
        entities = len(pc.unique(allkeys[ENTITY_COLUMN]))
        return BatchSummary(offset, lo, hi, sorted(days), entities)

    def _keys(self, t: pa.Table, offset: int) -> pa.Table:
        rows = pa.array(range(offset, offset + t.num_rows), pa.int64())
        return t.select(key_columns(self.spec)).append_column("__row", rows)

    def _duplicate(self, row: int) -> IngestValidationError:
        return IngestValidationError(
            self.spec.name, row, "duplicate key (entity_id, time) within the batch"
        )

    def _first_offence(
        self, err: IngestValidationError, chunk: pa.Table, offset: int, keys: list[pa.Table]
    ) -> IngestValidationError:
        """The error of the first offending row of the batch, given `err` from `chunk`.

        Checks run column by column, so a later check can flag an earlier row: re-check the rows
        before `err` until they pass, then look for a duplicate key among them.
        """
        while err.row is not None and err.row > offset:
            try:
                prefix = self._convert(chunk.slice(0, err.row - offset), offset)
            except IngestValidationError as earlier:
                err = earlier
                continue
            keys = [*keys, self._keys(prefix, offset)]
            break
        if err.row is None or not keys:
            return err
        dup = _first_duplicate(pa.concat_tables(keys), key_columns(self.spec))
        return self._duplicate(dup) if dup is not None and dup < err.row else err

    def chunks(self) -> Iterator[pa.RecordBatch]:
        """Second pass: the converted rows, chunk by chunk (call `validate()` first), each chunk
        sorted by its key (entity, then time): the files a MERGE writes then hold each entity's
        rows together, and a read for a few entities skips the other row groups."""
        offset = 0
        order = [(k, "ascending") for k in key_columns(self.spec)]
        for chunk in self._raw_chunks():
            t = self._convert(chunk, offset)
            offset += t.num_rows
            yield from t.sort_by(order).to_batches()


def _first_uncastable(col: pa.ChunkedArray, target: pa.DataType) -> int:
    """Index of the first value of `col` that does not cast to `target` (one must exist)."""
    lo, hi = 0, len(col)  # col[:lo] casts, col[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(col.slice(0, mid), target)
            lo = mid
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
    return lo


def _first_duplicate(keys: pa.Table, names: list[str]) -> int | None:
    """The smallest `__row` whose key an earlier row of `keys` already has, if any."""
    if keys.num_rows < 2:
        return None
    ordered = keys.sort_by([(c, "ascending") for c in [*names, "__row"]])
    same = None
    for c in names:
        col = ordered[c]
        eq = pc.equal(col.slice(1), col.slice(0, len(col) - 1))
        same = eq if same is None else pc.and_(same, eq)
    if same is None or not pc.any(same).as_py():
        return None
    return pc.min(pc.filter(ordered["__row"].slice(1), same)).as_py()
