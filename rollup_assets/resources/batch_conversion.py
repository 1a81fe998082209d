"""Converting the columns of an ingest batch to an archive's types, row errors first.

Each check names the first offending row (0-based, in file order) and its reason; see
`batches` for the rules.
"""

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import ARROW_TYPES, TS
from rollup_assets.compute.formulas import computed_values
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.durations import format_duration
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.names import CONTROL_CHARACTERS
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    RANGE_END_COLUMN,
    RANGE_START_COLUMN,
    ColumnSpec,
    RawArchiveSpec,
    RollupSpec,
    TimeRangeArchiveSpec,
    key_columns,
)
from rollup_assets.model.windows import EPOCH, iso_utc, micros

_OFFSET = r"(Z|z|[+-]\d\d:?\d\d)$"
_TRUE = {"true", "t", "1", "yes"}
_FALSE = {"false", "f", "0", "no"}
# The instants Python, Spark and Delta readers can all represent.
_MIN_TS = pa.scalar(dt.datetime(1, 1, 1, tzinfo=dt.UTC), TS)
_MAX_TS = pa.scalar(dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC), TS)
_NEVER = np.iinfo(np.int64).max


class BatchConverter:
    """Checks and casts one chunk of a batch to the archive's schema."""

    def __init__(self, spec: RawArchiveSpec | TimeRangeArchiveSpec, schema: pa.Schema) -> None:
        self.spec = spec
        self.schema = schema

    # -- conversion --------------------------------------------------------------------------

    def check_columns(self, names: list[str]) -> None:
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise IngestValidationError(
                self.spec.name, None, f"column(s) {twice} appear more than once in the header"
            )
        computed = [n for n in names if (c := self.spec.column(n)) is not None and c.is_computed]
        if computed:
            raise IngestValidationError(
                self.spec.name,
                None,
                f"column(s) {computed} are computed by their formulas and cannot be supplied; "
                "drop them from the batch",
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

    def convert(self, chunk: pa.Table, offset: int) -> pa.Table:
        """`chunk` (rows `offset`...) in the archive's schema; the first bad row raises."""
        self.check_columns(chunk.column_names)
        for i, f in enumerate(chunk.schema):
            if pa.types.is_dictionary(f.type):  # e.g. a pandas categorical: decode it
                chunk = chunk.set_column(i, f.name, pc.cast(chunk[i], f.type.value_type))
        n = chunk.num_rows
        out: dict[str, pa.Array | pa.ChunkedArray] = {}
        out[ENTITY_COLUMN] = self._entity(chunk[ENTITY_COLUMN], offset)
        for col in key_columns(self.spec)[1:]:
            out[col] = self._timestamp(col, chunk[col], offset)
        for c in self.spec.columns:
            if c.is_computed:
                continue
            if c.name in chunk.column_names:
                out[c.name] = self._value(c, chunk[c.name], offset)
            else:
                out[c.name] = pa.nulls(n, ARROW_TYPES[c.type])
        if isinstance(self.spec, TimeRangeArchiveSpec):
            bad = pc.greater_equal(out[RANGE_START_COLUMN], out[RANGE_END_COLUMN])
            self._fail_first(bad, offset, "range_start must be before range_end")
            self._check_nesting(self.spec, out[RANGE_START_COLUMN], out[RANGE_END_COLUMN], offset)
        fill_computed(self.spec, out, n)
        time_col = key_columns(self.spec)[1]
        out[DAY_COLUMN] = pc.cast(out[time_col], pa.date32())
        return pa.table(out, schema=self.schema)

    def _check_nesting(
        self,
        spec: TimeRangeArchiveSpec,
        starts: pa.ChunkedArray,
        ends: pa.ChunkedArray,
        offset: int,
    ) -> None:
        """Refuse the first row whose range a bucket of a rollup built from the archive would
        split: the row belongs to the bucket holding its range_start, so its range_end must not
        pass that bucket's end (the first boundary after range_start), in the rollup's zone."""
        if not spec.first_levels or len(starts) == 0:
            return
        start_us = pc.cast(starts, pa.int64()).to_numpy()
        end_us = pc.cast(ends, pa.int64()).to_numpy()
        days = pc.unique(pc.cast(starts, pa.date32())).to_pylist()
        first: tuple[int, RollupSpec, int] | None = None  # (row, rollup, boundary in µs)
        for rollup in spec.first_levels:
            bounds = np.array(
                [micros(t) for t in Bucketing.of(rollup).boundaries_near(days)], dtype=np.int64
            )
            if len(bounds) == 0:
                continue
            idx = np.searchsorted(bounds, start_us, side="right")
            # No boundary after a start: its bucket runs to the end of representable time.
            nxt = np.where(idx < len(bounds), bounds[np.minimum(idx, len(bounds) - 1)], _NEVER)
            bad = end_us > nxt
            if bad.any():
                i = int(np.argmax(bad))
                if first is None or i < first[0]:
                    first = (i, rollup, int(nxt[i]))
        if first is None:
            return
        i, rollup, boundary = first
        grain = rollup.alignment.value
        if rollup.size is not None:
            grain += f" {format_duration(rollup.size)}"
        raise IngestValidationError(
            spec.name,
            offset + i,
            f"range [{iso_utc(starts[i].as_py())}, {iso_utc(ends[i].as_py())}) crosses "
            f"{iso_utc(EPOCH + dt.timedelta(microseconds=boundary))}, a bucket boundary of "
            f"rollup '{rollup.name}' ({grain} in {rollup.reference_time_zone}); a time-range "
            "row must lie within one bucket of every rollup built from the archive",
        )

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
        # A newline or NUL in an entity id would be stored, and then split a CLI line or a log.
        controls = pc.fill_null(pc.match_substring_regex(col, CONTROL_CHARACTERS), False)
        if pc.any(controls).as_py():
            i = pc.index(controls, True).as_py()
            raise IngestValidationError(
                self.spec.name,
                offset + i,
                f"entity_id {col[i].as_py()!r} holds a control character",
            )
        return col

    def _timestamp(
        self, name: str, col: pa.ChunkedArray, offset: int, nullable: bool = False
    ) -> pa.ChunkedArray:
        if not nullable:
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
        if c.type is ColumnType.TIMESTAMP:
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                col = pc.utf8_trim_whitespace(pc.cast(col, pa.string()))
                col = pc.if_else(pc.equal(col, ""), None, col)
            converted = self._timestamp(c.name, col, offset, nullable=not c.required)
            if c.required:
                self._fail_first(pc.is_null(converted), offset, f"required column {c.name} is null")
            return converted
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
        numeric_target = c.type.is_numeric
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
                kind = {
                    ColumnType.LONG: "a whole number",
                    ColumnType.INT: "a whole number",
                    ColumnType.DOUBLE: "a number",
                }.get(c.type, c.type.value)
                reason = f"{c.name} value {value!r} is not {kind}"
                if not pa.types.is_string(src):
                    reason = f"{c.name} value {value!r} does not fit {c.type.value} exactly"
                raise IngestValidationError(self.spec.name, offset + i, reason) from None
        raise IngestValidationError(
            self.spec.name, offset, f"{c.name} cannot be converted to {c.type.value}"
        )


def fill_computed(spec: RawArchiveSpec | TimeRangeArchiveSpec, columns: dict, rows: int) -> None:
    """Set every computed column of `spec` in `columns` from the other columns of each row."""
    for c in spec.computed_columns:  # each after the computed columns it reads
        assert c.formula is not None
        columns[c.name] = computed_values(c.formula, c.type, columns, rows, ARROW_TYPES[c.type])


def with_stored_operands(
    spec: RawArchiveSpec | TimeRangeArchiveSpec,
    batch: pa.RecordBatch,
    stored: pa.Table,
    operands: frozenset[str],
) -> pa.RecordBatch:
    """`batch` with its computed columns evaluated over the row an upsert will leave.

    An optional column the batch leaves null keeps its stored value in the upsert, so a formula
    reading it must see that stored value: `operands` (those optional columns) are filled from
    `stored` rows with the same key before the computed columns are evaluated again.
    """
    if not operands or stored.num_rows == 0 or batch.num_rows == 0:
        return batch
    keys = key_columns(spec)
    right = stored.select([*keys, *sorted(operands)])
    right = right.rename_columns([*keys, *(f"{o}__stored" for o in sorted(operands))])
    left = pa.Table.from_batches([batch]).append_column(
        "__row", pa.array(range(batch.num_rows), pa.int64())
    )
    joined = left.join(right, keys=keys, join_type="left outer").sort_by("__row")
    columns = {name: joined[name] for name in batch.schema.names}
    for o in operands:
        columns[o] = pc.coalesce(joined[o], joined[f"{o}__stored"])
    fill_computed(spec, columns, batch.num_rows)
    merged = pa.table({name: columns[name] for name in batch.schema.names}, schema=batch.schema)
    return merged.combine_chunks().to_batches()[0]


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
