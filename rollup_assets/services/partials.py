"""A rollup's partials aggregated from its source, and the source versions they record.

Three ways to the same partials: on Spark (a frame, for work of any size), on the driver (the
source row groups that may hold the cells read with delta-rs and aggregated with Arrow), and in
Spark tasks one storage partition each (`rollup_assets.resources.fill`: no shuffle), which is
also how a first fill is planned. A raw source is read at a given table version or the current
one, a rollup source at a given snapshot or its current one. A job refuses a rollup source's
cell that a fold cannot know (`Unknown.REFUSE`): it would be aggregated from the level below as
it stands now, ahead of the version the job records. The engine owns one `Partials` and gives
its `refill` to the rollup store (what a person reads).
"""

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from rollup_assets.compute.aggregation import SOURCE_ROWS, rollup_partials
from rollup_assets.compute.arrow_partials import partials_arrow
from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.folding import CellKey
from rollup_assets.model.bucketing import Bucketing, storage_partition
from rollup_assets.model.cells import Cells
from rollup_assets.model.specs import DAY_COLUMN, ENTITY_COLUMN, Catalog, RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.delta_tables import file_actions, span_pruner
from rollup_assets.resources.fill import (
    MAX_FILL_SOURCE_ROWS,
    Fill,
    partials_schema,
    plan_parts,
    run_partials,
)
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.rollup_reads import Unknown
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.resources.rollup_store import RollupStore
from rollup_assets.resources.rollup_table import cell_keys, in_windows
from rollup_assets.resources.schemas import data_schema
from rollup_assets.resources.visible_rows import delta_pointers, live_files


class Partials:
    """Partials of a rollup's cells, aggregated from its source in `catalog`: raw and
    time-range archives in `raw`, rollups in `rollups`. Buckets for every entity whose source
    files hold at most `driver_rows` rows are aggregated on the driver (`fits_driver`)."""

    def __init__(
        self,
        catalog: Catalog,
        raw: RawStore,
        rollups: RollupStore,
        driver_rows: int,
    ) -> None:
        self.catalog = catalog
        self.raw = raw
        self.rollups = rollups
        if driver_rows < 0:
            raise ValueError(
                f"driver source rows must be 0 (every aggregation on Spark) or more, not "
                f"{driver_rows}"
            )
        self.driver_rows = driver_rows

    def fits_driver(self, bound: int | None) -> bool:
        """Are buckets whose source files hold `bound` rows (None: a file does not say)
        aggregated on the driver (`settings.DEFAULT_DRIVER_SOURCE_ROWS`)?"""
        return self.driver_rows > 0 and bound is not None and bound <= self.driver_rows

    def on_spark(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        cells: Cells,
        raw_table: DeltaTable | None = None,
        below: Snapshot | None = None,
        unknown: Unknown = Unknown.REFUSE,
    ) -> tuple[DataFrame, dict[str, int]]:
        """The partial aggregates of `cells` (with the count of source rows behind each, in
        `SOURCE_ROWS`), and the source versions read (a raw source at `raw_table`'s version
        when given, a rollup source at snapshot `below`). Only the source rows of the cells are
        aggregated; the read itself is pruned to their buckets and (when every bucket names
        them) their entities. A rollup source's cell a fold cannot know is read as `unknown`
        says (a job refuses it: `CellsUnknowable`)."""
        source = self.catalog.archive(spec.source)
        spans = merge_windows(list(cells.windows))
        entities = cells.entities
        if isinstance(source, RollupSpec):
            snap = below or self.rollups.snapshot(source)
            rows = self.rollups.read_spark(
                spark, source, spans, entities, snapshot=snap, unknown=unknown
            )
            versions = snap.lineage(source)
        else:
            rows, version = self.raw.read_spark(spark, source, spans, entities, table=raw_table)
            versions = {source.name: _v(version)}
        whole, named = cell_targets(spark, cells)
        return rollup_partials(rows, whole, spec, source, named), versions

    def on_driver(
        self,
        spec: RollupSpec,
        cells: Cells,
        raw_table: DeltaTable | None = None,
        below: Snapshot | None = None,
        unknown: Unknown = Unknown.REFUSE,
    ) -> tuple[pa.Table, dict[str, int]]:
        """`on_spark`, computed on the driver: the row groups that may hold the cells' source
        rows read with delta-rs, aggregated with Arrow (`compute.arrow_partials`)."""
        source = self.catalog.archive(spec.source)
        spans = merge_windows(list(cells.windows))
        entities = cells.entities
        if isinstance(source, RollupSpec):
            snap = below or self.rollups.snapshot(source)
            rows = self.rollups.read_arrow(
                source, spans, entities, snapshot=snap, cells=cells, unknown=unknown
            )
            versions = snap.lineage(source)
        else:
            rows, version = self.raw.read_rows(source, spans, entities, raw_table, cells)
            versions = {source.name: _v(version)}
        whole = [w for w, scope in cells if scope is None]
        named = [w for w, scope in cells if scope is not None]
        parts = [partials_arrow(rows, whole, None, spec, source)] if whole or not named else []
        if named:
            parts.append(partials_arrow(rows, named, cell_keys(cells), spec, source))
        return _typed(pa.concat_tables(parts), spec), versions

    def in_tasks(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        cells: Cells,
        raw_table: DeltaTable | None,
        below: Snapshot | None,
    ) -> tuple[pa.Table, dict[str, int]]:
        """`on_driver` of named cells, aggregated in Spark tasks, one storage partition each
        (`rollup_assets.resources.fill.run_partials`: the row groups that may hold the
        partition's cells, read and aggregated with Arrow, no shuffle), the partials brought to
        the driver."""
        plan = self.by_partition(spec, cells, raw_table, below)
        if plan is None:  # the source has no table: no cell has a row (as `on_driver`)
            source = self.catalog.archive(spec.source)
            if isinstance(source, RollupSpec):
                versions = (below or self.rollups.snapshot(source)).lineage(source)
            else:
                versions = {source.name: _v(None)}
            return partials_schema(spec).empty_table(), versions
        rows, _ = run_partials(spark, plan, cells)
        return rows, plan.versions

    def refill(self, spec: RollupSpec, keys: list[CellKey]) -> pa.Table:
        """Cells of `spec` aggregated again from their source (a read that cannot fold them
        exactly: `compute.folding.Unknowable`), in the shape of stored rows."""
        b = Bucketing.of(spec)
        cells = Cells.collect(((b.window_of(start), frozenset([e])) for e, start in keys), None)
        rows, _ = self.on_driver(spec, cells, unknown=Unknown.REFILL)
        return rows.drop_columns([SOURCE_ROWS])

    def source_versions(self, spec: RollupSpec) -> dict[str, int]:
        """The versions of `spec`'s source as they stand now, as a recompute's rows record them
        (`lineage`): what a correction's differences were made against."""
        source = self.catalog.archive(spec.source)
        if isinstance(source, RollupSpec):
            return self.rollups.snapshot(source).lineage(source)
        table = self.raw.table(source)
        return {source.name: _v(None if table is None else table.version())}

    def read_version(self, spec: RollupSpec, versions: dict[str, int]) -> int | None:
        """The version of `spec`'s source that partials computed from `versions` (what a read
        of the source recorded) hold: a raw table's version, or the level below's pointer
        table version (`services.correction`: the changes a correction may skip)."""
        source = self.catalog.archive(spec.source)
        name = source.genmap_name if isinstance(source, RollupSpec) else source.name
        return versions.get(name)

    def source_rows_at_most(self, spec: RollupSpec, cells: Cells) -> int | None:
        """How many rows the source files that may hold `cells`' source rows contain, by their
        statistics (an upper bound of what `on_driver` decodes); None when a file does not
        say."""
        source = self.catalog.archive(spec.source)
        if isinstance(source, RollupSpec):
            return self.rows_at_most(source, cells)
        spans = merge_windows(list(cells.windows))
        raw = self.raw.table(source)
        return _records(self.raw.files_for(raw, source, spans, cells.entities) if raw else [])

    def rows_at_most(
        self, spec: RollupSpec, cells: Cells, snap: Snapshot | None = None
    ) -> int | None:
        """How many rows the files of rollup `spec` (in `snap`, else its latest snapshot) that
        may hold `cells` contain, by their statistics; None when a file does not say."""
        table = (snap or self.rollups.snapshot(spec)).table
        if table is None:
            return 0
        spans = merge_windows(list(cells.windows))
        return _records(self.rollups.overlapping(file_actions(table), spans, cells.entities))

    def in_groups(
        self, spec: RollupSpec, snap: Snapshot, buckets: list[Window], most: int
    ) -> list[list[Window]]:
        """`buckets` in time order, in groups of whole storage partitions
        (`bucketing.storage_partition`) whose files in `snap` hold at most `most` rows by their
        statistics; a partition holding more is a group of its own."""
        files = snap.files()
        by_part: dict[Window, list[Window]] = {}
        for w in sorted(buckets):
            by_part.setdefault(storage_partition(spec, w.start), []).append(w)
        groups: list[list[Window]] = []
        held = 0
        for _, members in sorted(by_part.items()):
            rows = _records(self.rollups.overlapping(files, merge_windows(members), None))
            if rows is None:  # a file does not say: the partition is a group of its own
                rows = most + 1
            if groups and held + rows <= most:
                groups[-1] += members
                held += rows
            else:
                groups.append(list(members))
                held = rows
        return groups

    def corrected_below(self, spec: RollupSpec, cells: Cells, below: Snapshot | None) -> bool:
        """Has the level below `spec` difference rows in `cells`' buckets? Spark tasks cannot
        aggregate a cell below again when its fold cannot tell it (`rollup_assets.resources.fill`):
        such work takes a path that can."""
        source = self.catalog.archive(spec.source)
        if not isinstance(source, RollupSpec):
            return False
        pointers = (below or self.rollups.snapshot(source)).pointers
        corrected = delta_pointers(pointers)
        if corrected.num_rows == 0:
            return False
        spans = merge_windows(list(cells.windows))
        return bool(pc.any(in_windows(corrected["bucket_start"], spans)).as_py())

    def first_fill(
        self, spec: RollupSpec, cells: Cells, raw_table: DeltaTable | None
    ) -> Fill | None:
        """A first fill of `cells` (`rollup_assets.resources.fill`), when it applies: buckets for
        every entity with nothing stored in them yet (checked by the caller), and no storage
        partition whose source files hold more than `MAX_FILL_SOURCE_ROWS` rows (one task aggregates
        each partition in memory). None otherwise: the whole job takes the general path."""
        if not cells or any(scope is not None for _, scope in cells):
            return None
        fill = self.by_partition(spec, cells, raw_table, None)
        if fill is None:
            return None
        for part in fill.parts:
            counted = [fill.sizes.get(p) for p in part.paths]
            if not all(isinstance(n, int) for n in counted):
                return None
            if sum(int(n) for n in counted if n is not None) > MAX_FILL_SOURCE_ROWS:
                return None
        return fill

    def by_partition(
        self,
        spec: RollupSpec,
        cells: Cells,
        raw_table: DeltaTable | None,
        below: Snapshot | None,
    ) -> Fill | None:
        """The buckets of `cells` by storage partition of `spec`, each with the source files
        that may hold their rows (a raw source at `raw_table`, a rollup source at `below` or its
        current snapshot), for Spark tasks to aggregate one partition each
        (`rollup_assets.resources.fill`); None when the source has no table."""
        source = self.catalog.archive(spec.source)
        spans = merge_windows(list(cells.windows))
        pointers = None
        if isinstance(source, RollupSpec):
            snap = below or self.rollups.snapshot(source)
            if snap.table is None:
                return None
            live = live_files(
                self.rollups.overlapping(snap.files(), spans, cells.entities),
                snap.pointers,
            )
            versions = snap.lineage(source)
            uri, options = self.rollups.uri(source), self.rollups.options
            pointers = snap.pointers.filter(in_windows(snap.pointers["bucket_start"], spans))
            time_column, day_column = "bucket_start", None
        else:
            table = raw_table or self.raw.table(source)
            if table is None:
                return None
            live = self.raw.files_for(table, source, spans, cells.entities)
            versions = {source.name: table.version()}
            uri, options = self.raw.uri(source), self.raw.options
            time_column, day_column = source.time_column, DAY_COLUMN
        sizes = {f["path"]: f.get("num_records") for f in live}

        files_for = span_pruner(
            live, time_column=time_column, entities=cells.entities, day_column=day_column
        )
        parts = plan_parts(spec, cells.windows, files_for)
        return Fill(spec, source, uri, options, versions, parts, pointers, sizes)


def cell_targets(spark: SparkSession, cells: Cells) -> tuple[DataFrame | None, DataFrame | None]:
    """(every-entity buckets: bucket_start, bucket_end; named cells: those and entity_id)."""
    whole = [w for w, scope in cells if scope is None]
    named = [(w, e) for w, scope in cells if scope is not None for e in sorted(scope)]
    whole_df = named_df = None
    if whole:
        whole_df = spark.createDataFrame(
            pa.table(
                {
                    "bucket_start": pa.array([w.start for w in whole], TS),
                    "bucket_end": pa.array([w.end for w in whole], TS),
                }
            )
        )
    if named:
        named_df = spark.createDataFrame(
            pa.table(
                {
                    "bucket_start": pa.array([w.start for w, _ in named], TS),
                    "bucket_end": pa.array([w.end for w, _ in named], TS),
                    ENTITY_COLUMN: pa.array([e for _, e in named], pa.string()),
                }
            )
        )
    return whole_df, named_df


def _records(files: list[dict]) -> int | None:
    """The rows `files` hold by their statistics (None: a file does not say)."""
    counts = [f.get("num_records") for f in files]
    if not all(isinstance(n, int) for n in counts):
        return None
    return sum(int(n) for n in counts if n is not None)


def _typed(partials: pa.Table, spec: RollupSpec) -> pa.Table:
    """Fresh partials cast to the types the rollup stores (other columns as they are)."""
    stored = data_schema(spec)
    return partials.cast(
        pa.schema(
            [
                stored.field(n) if n in stored.names else partials.schema.field(n)
                for n in partials.column_names
            ]
        )
    )


def _v(version: int | None) -> int:
    return -1 if version is None else version
