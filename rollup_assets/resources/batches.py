"""Validating an ingest batch (a Parquet or CSV file, or data in memory: `batch_sources`)
against a raw or time-range spec.

The batch is validated whole before anything is written: every chunk is converted to the
archive's Arrow schema, and the first offending row (0-based, in the batch's order) is reported
with its reason. Conversion is streamed in chunks, so a large batch is never held several times
over.

Rules: an entity id is text, not empty, without control characters (a newline, a NUL);
required columns present and non-null; values convertible to the declared type; no NaN
in required columns (NaN in an optional double column means "missing" and becomes null); no
infinities; timestamps parseable (ISO-8601 strings or timestamp columns; naive means UTC, offsets
are converted) and within years 1 to 9999 in UTC; no duplicate keys inside one batch; no columns
the spec does not declare, none twice. In a CSV file only an empty cell is missing ("NA" is text).
A time-range row's range_start is before its range_end, and its range lies within one bucket of
every rollup built from the archive (in the rollup's reference zone), so no rollup splits it.
"""

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.progress import Progress
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    RawArchiveSpec,
    TimeRangeArchiveSpec,
    key_columns,
)
from rollup_assets.resources.batch_conversion import BatchConverter
from rollup_assets.resources.batch_sources import BatchSource, FileSource
from rollup_assets.resources.schemas import archive_schema

# A batch's (UTC day, entity) cells are listed one by one up to this many; beyond, each day
# keeps only the range of its entities.
LISTED_CELLS = 20_000


@dataclass(frozen=True)
class DayEntities:
    """The entities of a batch's rows on one UTC day (`DAY_COLUMN`): each of them (`listed`),
    or, when the batch holds too many cells to list, only their range [lowest, highest]."""

    day: dt.date
    lowest: str
    highest: str
    listed: tuple[str, ...] | None


@dataclass(frozen=True)
class BatchSummary:
    rows: int
    min_ts: dt.datetime
    max_ts: dt.datetime
    days: list[dt.date]
    entities: int
    cells: tuple[DayEntities, ...] = ()


class BatchReader:
    """Validated, converted chunks of one batch (a file, or data in memory: `batch_sources`);
    `validate()` must pass before `chunks()`."""

    def __init__(
        self,
        spec: RawArchiveSpec | TimeRangeArchiveSpec,
        source: BatchSource | str | Path,
        progress: Progress | None = None,
    ) -> None:
        self.spec = spec
        self.source = source if isinstance(source, BatchSource) else FileSource(spec.name, source)
        self.schema = archive_schema(spec)
        self.converter = BatchConverter(spec, self.schema)
        self.progress = progress

    # -- passes ------------------------------------------------------------------------------

    def validate(self, not_before: dt.datetime | None = None) -> BatchSummary:
        """First pass: convert every chunk, check keys are unique and no reading is before
        `not_before` (what retention keeps); nothing is kept but keys."""
        keys: list[pa.Table] = []
        offset = 0
        lo = hi = None
        days: set[dt.date] = set()
        for chunk in self.source.chunks():
            try:
                t = self.converter.convert(chunk, offset)
            except IngestValidationError as err:
                raise self._first_offence(err, chunk, offset, keys) from None
            time_col = key_columns(self.spec)[1]
            if not_before is not None:
                self._require_retained(t, offset, keys, not_before)
            keys.append(self._keys(t, offset))
            if t.num_rows:
                a, b = pc.min_max(t[time_col]).values()
                lo = a.as_py() if lo is None else min(lo, a.as_py())
                hi = b.as_py() if hi is None else max(hi, b.as_py())
                days.update(pc.unique(t[DAY_COLUMN]).to_pylist())
            offset += t.num_rows
            if self.progress is not None:
                self.progress("validated", offset)
        if offset == 0 or lo is None or hi is None:
            raise IngestValidationError(self.spec.name, None, f"{self.source.label} holds no rows")
        allkeys = pa.concat_tables(keys)
        first = _first_duplicate(allkeys, key_columns(self.spec))
        if first is not None:
            raise self._duplicate(first)
        entities = len(pc.unique(allkeys[ENTITY_COLUMN]))
        cells = day_entities(allkeys, LISTED_CELLS)
        return BatchSummary(offset, lo, hi, sorted(days), entities, cells)

    def _require_retained(
        self, t: pa.Table, offset: int, keys: list[pa.Table], not_before: dt.datetime
    ) -> None:
        """Refuse the first reading of converted chunk `t` before `not_before` (retention has
        dropped its day: its rollups keep their values and would not be corrected), unless a
        key repeated before it is the first offence."""
        time_col = key_columns(self.spec)[1]
        early = pc.less(t[time_col], pa.scalar(not_before, t.schema.field(time_col).type))
        if not pc.any(early).as_py():
            return
        i = pc.index(early, True).as_py()
        before = pa.concat_tables([*keys, self._keys(t.slice(0, i), offset)])
        dup = _first_duplicate(before, key_columns(self.spec))
        if dup is not None:
            raise self._duplicate(dup)
        raise IngestValidationError.before_retention(
            self.spec.name,
            offset + i,
            f"{time_col} {t[time_col][i].as_py().isoformat()}",
            not_before,
        )

    def _keys(self, t: pa.Table, offset: int) -> pa.Table:
        rows = pa.array(range(offset, offset + t.num_rows), pa.int64())
        return t.select([*key_columns(self.spec), DAY_COLUMN]).append_column("__row", rows)

    def _duplicate(self, row: int) -> IngestValidationError:
        key = ", ".join(key_columns(self.spec))
        return IngestValidationError(self.spec.name, row, f"duplicate key ({key}) within the batch")

    def _first_offence(
        self, err: IngestValidationError, chunk: pa.Table, offset: int, keys: list[pa.Table]
    ) -> IngestValidationError:
        """The error of the first offending row of the batch, given `err` from `chunk`.

        Checks run column by column, so a later check can flag an earlier row: re-check the rows
        before `err` until they pass, then look for a duplicate key among them.
        """
        while err.row is not None and err.row > offset:
            try:
                prefix = self.converter.convert(chunk.slice(0, err.row - offset), offset)
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
        for chunk in self.source.chunks():
            t = self.converter.convert(chunk, offset)
            offset += t.num_rows
            yield from t.sort_by(order).to_batches()
            if self.progress is not None:
                self.progress("upserted", offset)  # the upsert has taken the chunk


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


def day_entities(rows: pa.Table, listed_at_most: int) -> tuple[DayEntities, ...]:
    """Per UTC day of `rows` (with `DAY_COLUMN` and `ENTITY_COLUMN`), its entities: listed
    while the rows hold at most `listed_at_most` (day, entity) cells, else their range."""
    cells = rows.group_by([DAY_COLUMN, ENTITY_COLUMN]).aggregate([])
    if cells.num_rows <= listed_at_most:
        days = cells.group_by(DAY_COLUMN).aggregate([(ENTITY_COLUMN, "list")])
        return tuple(
            DayEntities(d, min(names), max(names), tuple(sorted(names)))
            for d, names in sorted(
                zip(
                    days[DAY_COLUMN].to_pylist(),
                    days[f"{ENTITY_COLUMN}_list"].to_pylist(),
                    strict=True,
                )
            )
        )
    days = cells.group_by(DAY_COLUMN).aggregate([(ENTITY_COLUMN, "min"), (ENTITY_COLUMN, "max")])
    return tuple(
        DayEntities(d, lo, hi, None)
        for d, lo, hi in sorted(
            zip(
                days[DAY_COLUMN].to_pylist(),
                days[f"{ENTITY_COLUMN}_min"].to_pylist(),
                days[f"{ENTITY_COLUMN}_max"].to_pylist(),
                strict=True,
            )
        )
    )
