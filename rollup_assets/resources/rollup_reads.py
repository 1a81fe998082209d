"""Reading a rollup's active rows from a snapshot, in Spark or in Arrow.

A read returns one row per cell, in the shape of a base row: each cell's visible rows
(`visible_rows`) are kept, and its visible difference rows are folded into its base
(`compute.folding`). A cell the fold cannot know exactly (its kept extremes all left) is
aggregated again from its source by the `refill` the engine gives the store, given a row that
tells nothing, or refused (`Unknown`).
"""

from collections.abc import Callable, Sequence
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.filters import rows_within
from rollup_assets.compute.fold_tables import fold
from rollup_assets.compute.fold_tasks import (
    UNKNOWABLE,
    as_stored_rows,
    fold_task,
    newest_generations,
    with_flag,
)
from rollup_assets.compute.folding import CellKey
from rollup_assets.compute.key_index import KeyIndex
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import Cells
from rollup_assets.model.partials import RAW_ROWS
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.delta_files import TargetIndex, targets_of
from rollup_assets.resources.readers import READERS
from rollup_assets.resources.rollup_snapshots import RollupSnapshots, Snapshot
from rollup_assets.resources.rollup_table import cell_keys, in_windows
from rollup_assets.resources.schemas import DELTA_COLUMN, data_schema, spark_schema
from rollup_assets.resources.visible_rows import (
    live_files,
    resolve_visible_spark,
    visible_mask,
)
from rollup_assets.resources.warehouse import data_file_uri, spark_uri

# Corrected cells a read folds on the driver at most; more are folded by executor tasks of as
# many cells each (`_folded_spark`).
FOLD_TASK_CELLS = 20_000


class Unknown(StrEnum):
    """What a read does with a cell whose rows a fold cannot know exactly
    (`compute.folding.Unknowable`: its kept extremes ran out)."""

    # Aggregate it again from its source as the source stands now: what a person reads.
    REFILL = "refill"
    # The same, its row holding no count of source rows: a state no difference is folded onto
    # (a publish's, whose later differences a read folds onto the surface's row otherwise).
    REFILL_STATELESS = "refill-stateless"
    # A row of its keys holding no value: a comparison with the stored rows counts the cell
    # changed, whether or not the source still has rows for it.
    BLANK = "blank"
    # Raise `CellsUnknowable`. A job records the version of its source it read; a cell aggregated
    # from the level below that would run ahead of that version, and a change the level below
    # holds by then but whose correction is still queued would be counted twice.
    REFUSE = "refuse"


class CellsUnknowable(Exception):
    """A read (`Unknown.REFUSE`) met cells of `rollup` whose rows a fold cannot know: a job
    refreshes them (aggregates them again from their source) before it reads them."""

    def __init__(self, rollup: str, keys: list[CellKey]) -> None:
        self.rollup = rollup
        self.keys = keys
        entity, start = keys[0]
        super().__init__(
            f"'{rollup}': {len(keys)} cell(s) cannot be folded from their rows (their kept "
            f"extremes ran out), e.g. entity {entity!r} at {start.isoformat()}"
        )


class RollupReads(RollupSnapshots):
    """The active rows of a rollup, folded one per cell."""

    def read_spark(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        snapshot: Snapshot | None = None,
        *,
        unknown: Unknown = Unknown.REFILL,
    ) -> DataFrame:
        """Active rows (stored partials + bookkeeping) of buckets starting in `spans`; a cell a
        fold cannot know is read as `unknown` says."""
        snap = snapshot or self.snapshot(spec)
        read_schema = spark_schema(data_schema(spec))
        if snap.table is None:
            return spark.createDataFrame([], read_schema)
        files = live_files(self.overlapping(snap.files(), spans, entities), snap.pointers)
        if not files:
            return spark.createDataFrame([], read_schema)
        root = self.uri(spec)
        uris = [spark_uri(data_file_uri(root, f["path"])) for f in files]
        df = spark.read.schema(read_schema).parquet(*uris)
        df = rows_within(df, "bucket_start", spans, entities)
        visible = resolve_visible_spark(spark, df, snap.pointers)
        return self._folded_spark(spark, spec, visible, snap, unknown)

    def _folded_spark(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        visible: DataFrame,
        snap: Snapshot,
        unknown: Unknown,
    ) -> DataFrame:
        """`visible` rows with each corrected cell's difference rows folded into its base. Up
        to `FOLD_TASK_CELLS` corrected cells are folded on the driver; more (a wave of
        corrections before maintenance folds them) on the executors, a task per batch of
        cells, so the driver never holds more than a batch's rows."""
        changed = visible.where(F.col(DELTA_COLUMN)).select(ENTITY_COLUMN, "bucket_start")
        keys = changed.distinct().toArrow()
        if keys.num_rows == 0:
            return visible
        marked = F.broadcast(
            spark.createDataFrame(
                keys.append_column("__folded", pa.array([True] * keys.num_rows, pa.bool_()))
            )
        )
        on = [ENTITY_COLUMN, "bucket_start"]
        plain = (visible.join(marked, on=on, how="left").where(F.col("__folded").isNull())).drop(
            "__folded"
        )
        rows = visible.join(marked, on=on, how="inner").drop("__folded")
        schema = data_schema(spec)
        if keys.num_rows > FOLD_TASK_CELLS:
            return self._folded_on_executors(spark, spec, plain, rows, keys.num_rows, unknown)
        folded = self._folded_arrow(spec, rows.toArrow(), snap, unknown)
        if folded.num_rows == 0:
            # Every changed cell lost its last source row (Spark cannot build a frame from an
            # Arrow table without chunks).
            return plain
        return plain.unionByName(
            spark.createDataFrame(folded.select(schema.names), spark_schema(schema))
        )

    def _folded_on_executors(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        plain: DataFrame,
        rows: DataFrame,
        cells: int,
        unknown: Unknown,
    ) -> DataFrame:
        """`plain` and the rows of `cells` corrected cells folded by executor tasks
        (`compute.fold_tasks`); the driver reads back only the cells a fold cannot know."""
        schema = data_schema(spec)
        on = [ENTITY_COLUMN, "bucket_start"]
        folded = (
            rows.repartition(-(-cells // max(FOLD_TASK_CELLS, 1)), *on)
            .mapInArrow(fold_task(spec, schema), spark_schema(with_flag(schema)))
            # Folded once: the cells it cannot know are read from it, then the rest returned.
            .localCheckpoint()
        )
        known = plain.unionByName(folded.where(~F.col(UNKNOWABLE)).drop(UNKNOWABLE))
        lost = folded.where(F.col(UNKNOWABLE)).select(*on, "bucket_end", "generation").toArrow()
        if lost.num_rows == 0:
            return known
        keys = list(
            zip(lost[ENTITY_COLUMN].to_pylist(), lost["bucket_start"].to_pylist(), strict=True)
        )
        newest = dict(zip(keys, lost["generation"].to_pylist(), strict=True))
        again = self._unknown_rows(spec, keys, newest, unknown, schema)
        if again.num_rows == 0:
            return known
        return known.unionByName(spark.createDataFrame(again, spark_schema(schema)))

    def may_hold(
        self,
        spec: RollupSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
    ) -> bool:
        """Could the table hold rows of buckets starting in `spans` (and `entities`)? False only
        when no live file's statistics overlap them (a first backfill of the range)."""
        snap = self.snapshot(spec)
        if snap.table is None:
            return False
        return bool(self.overlapping(snap.files(), spans, entities))

    # Aggregates cells of a rollup again from its source (set by the engine): a read folding a
    # cell it cannot know exactly (`compute.folding.Unknowable`) asks it for that cell's row.
    refill: "Callable[[RollupSpec, list[CellKey]], pa.Table] | None" = None

    def read_arrow(
        self,
        spec: RollupSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        snapshot: Snapshot | None = None,
        columns: Sequence[str] | None = None,
        cells: Cells | None = None,
        exact: bool = False,
        *,
        unknown: Unknown = Unknown.REFILL,
    ) -> pa.Table:
        """Active rows in `spans` (and `entities`): every stored column, or `columns` (to which
        `generation` is added: the active generation is resolved from it). With `cells`, only
        the row groups that may hold those cells are read (a few cells cost a row group each,
        not the cross product of their buckets and entities); rows of other cells may remain,
        unless `exact` (`cells` are named cells of this rollup): then each file keeps only the
        rows of those cells, so the driver never holds more than their rows.

        A cell whose rows a fold cannot know exactly (`compute.folding.Unknowable`) is read as
        `unknown` says: aggregated again from the level below, a row holding no value, or
        refused."""
        snap = snapshot or self.snapshot(spec)
        schema = data_schema(spec)
        if columns is not None:
            # The generation and the row kind resolve what is visible, a cell's bucket end names
            # it for folding (dropped again after, but the generation).
            extra = ("generation", DELTA_COLUMN, "bucket_end")
            wanted = [*columns, *(c for c in extra if c not in columns)]
            schema = pa.schema([schema.field(c) for c in wanted])
        if snap.table is None:
            return schema.empty_table()

        def read(f: dict) -> pa.Table:
            data = self._read_file(spec, f, schema.names, targets).cast(schema)
            if keys is not None:
                # The named cells' rows, those starting in `spans` (a cell whose bucket overlaps
                # them may start before).
                data = _cells_only(data, keys)
            mask = in_windows(data["bucket_start"], spans) if spans else None
            if entities is not None:
                em = pc.is_in(data["entity_id"], value_set=pa.array(sorted(entities)))
                mask = em if mask is None else pc.and_(mask, em)
            return data if mask is None else data.filter(mask)

        listed = list(cells) if cells is not None else targets_of(spans, entities)
        targets = None if listed is None else TargetIndex(listed)
        keys = KeyIndex(cell_keys(cells)) if exact and cells is not None else None
        files = live_files(self.overlapping(snap.files(), spans, entities), snap.pointers)
        if not files:
            return schema.empty_table()
        # Reading and decoding Parquet releases the GIL: files are read side by side. What the
        # files held is let go once the visible rows are copied out of it.
        rows = pa.concat_tables(list(READERS.map(read, files)))
        rows = rows.filter(visible_mask(rows, snap.pointers))
        if (
            DELTA_COLUMN not in rows.column_names
            or not pc.any(pc.fill_null(rows[DELTA_COLUMN], False)).as_py()
        ):
            return _requested(rows, columns)
        # Corrected cells: every column of their rows, folded into one row each.
        if columns is None and (cells is None or exact):
            # Every row of these cells is among those read: the fold takes them all, and the
            # rows of other cells pass through it.
            return self._folded_arrow(spec, rows, snap, unknown).select(schema.names)
        # Without every column, or without `exact` (a row group read for other cells may hold
        # some rows of a cell, not all), their rows are read again. Their keys stay in Arrow (a
        # wave of corrections leaves tens of thousands of them).
        changed = _changed_cells(rows)
        keys = changed.select(["bucket_start", ENTITY_COLUMN])
        mine = _not_in(rows, keys)
        whole = self._cells_rows(spec, snap, _by_bucket(changed), keys, files)
        del rows  # `mine` and `whole` are copies: the fold holds them alone
        folded = self._folded_arrow(spec, whole, snap, unknown).select(schema.names).cast(schema)
        out = pa.concat_tables([mine.select(schema.names), folded])
        return _requested(out, columns)

    def _cells_rows(
        self, spec: RollupSpec, snap: Snapshot, cells: Cells, keys: pa.Table, live: list[dict]
    ) -> pa.Table:
        """Every column of the visible rows of named `cells` at `snap` (`keys`: the same cells
        as (bucket_start, entity_id) rows), from the `live` files of a read holding them."""
        schema = data_schema(spec)
        spans = merge_windows(list(cells.windows))
        targets = TargetIndex(list(cells))
        files = self.overlapping(live, spans, cells.entities)
        index = KeyIndex(keys)

        def read(f: dict) -> pa.Table:
            data = self._read_file(spec, f, schema.names, targets).cast(schema)
            return _cells_only(data, index)

        parts = list(READERS.map(read, files)) or [schema.empty_table()]
        rows = pa.concat_tables(parts)
        return rows.filter(visible_mask(rows, snap.pointers))

    def _folded_arrow(
        self, spec: RollupSpec, rows: pa.Table, snap: Snapshot, unknown: Unknown
    ) -> pa.Table:
        """The visible rows of some cells folded into one base-shaped row each; the cells the
        fold cannot know are read as `unknown` says."""
        folded, keys = fold(rows.cast(data_schema(spec)), spec)
        if not keys:
            return folded
        again = self._unknown_rows(
            spec, keys, newest_generations(rows, keys), unknown, folded.schema
        )
        return pa.concat_tables([folded, again])

    def _unknown_rows(
        self,
        spec: RollupSpec,
        keys: list[CellKey],
        generation: dict[CellKey, int],
        unknown: Unknown,
        schema: pa.Schema,
    ) -> pa.Table:
        """Rows of `schema` for cells a fold cannot know, as `unknown` says (refused: raises),
        each at its newest visible `generation`."""
        if unknown is Unknown.REFUSE:
            raise CellsUnknowable(spec.name, keys)
        if unknown is Unknown.BLANK:
            bucketing = Bucketing.of(spec)
            ts = schema.field("bucket_start").type
            again = pa.table(
                {
                    ENTITY_COLUMN: pa.array([e for e, _ in keys], pa.string()),
                    "bucket_start": pa.array([s for _, s in keys], ts),
                    "bucket_end": pa.array([bucketing.window_of(s).end for _, s in keys], ts),
                }
            )
        elif self.refill is None:
            raise RuntimeError(f"'{spec.name}': {len(keys)} cell(s) need a refill, none given")
        else:
            again = self.refill(spec, keys)
        rows = as_stored_rows(again, schema, generation=generation)
        if unknown is Unknown.REFILL_STATELESS:
            at = rows.schema.get_field_index(RAW_ROWS)
            rows = rows.set_column(at, RAW_ROWS, pa.nulls(rows.num_rows, pa.int64()))
        return rows


def _cells_only(rows: pa.Table, keys: KeyIndex) -> pa.Table:
    """The rows of the cells `keys` (bucket_start, entity_id), in a copy of their own."""
    if rows.num_rows == 0:
        return rows
    return keys.rows_of(rows)


def _changed_cells(rows: pa.Table) -> pa.Table:
    """The cells (bucket_start, entity_id, bucket_end) of the difference rows among `rows`."""
    changed = rows.filter(pc.fill_null(rows[DELTA_COLUMN], False))
    return changed.group_by(["bucket_start", ENTITY_COLUMN, "bucket_end"]).aggregate([])


def _by_bucket(keys: pa.Table) -> Cells:
    """`keys` (bucket_start, entity_id, bucket_end) as named cells, grouped per bucket in
    Arrow: a Python object per bucket, not per cell."""
    grouped = keys.group_by(["bucket_start", "bucket_end"]).aggregate([(ENTITY_COLUMN, "list")])
    return Cells(
        tuple(
            sorted(
                (Window(b, e), frozenset(names))
                for b, e, names in zip(
                    grouped["bucket_start"].to_pylist(),
                    grouped["bucket_end"].to_pylist(),
                    grouped[f"{ENTITY_COLUMN}_list"].to_pylist(),
                    strict=True,
                )
            )
        )
    )


def _not_in(rows: pa.Table, keys: pa.Table) -> pa.Table:
    """`rows` of cells other than `keys` (bucket_start, entity_id)."""
    return rows.filter(pa.array(~KeyIndex(keys).mask(rows)))


def _requested(rows: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    """`rows` in the `columns` asked for and their generation (every column: None)."""
    if columns is None:
        return rows
    return rows.select([*columns, *(["generation"] if "generation" not in columns else [])])
