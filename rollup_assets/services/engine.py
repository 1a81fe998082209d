"""The engine: a catalog and the stores of one warehouse, shared by every use case.

It holds the guards every use case applies (an archive must be activated, with the spec it was
activated with) and computes a rollup's partials from its source. It is free of Dagster: a
Dagster resource provides it to runs and sensors, and the CLI and the tests build it directly.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.aggregation import SOURCE_ROWS, rollup_partials
from rollup_assets.compute.arrow_partials import partials_arrow, rows_with_keys
from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.compare import (
    CHANGED,
    all_new,
    cell_changes,
    cell_changes_arrow,
)
from rollup_assets.model.bucketing import Bucketing, storage_partition
from rollup_assets.model.cells import (
    CellCounts,
    Cells,
    buckets_to_fold,
    changed_cells,
    rewrites_whole,
)
from rollup_assets.model.errors import (
    ArchiveNotActivatedError,
    ArchiveSchemaImmutableError,
    RawRowsRetainedError,
)
from rollup_assets.model.jobs import Job, JobState, RetryPolicy
from rollup_assets.model.keeping import Keeping
from rollup_assets.model.retention import BEGINNING, describe_removed, removed_within
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    ArchiveSpec,
    Catalog,
    RollupSpec,
    schema_fingerprint,
)
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.archive_states import ArchiveStateStore
from rollup_assets.resources.delta_tables import file_actions, prune_files
from rollup_assets.resources.fill import (
    MAX_FILL_SOURCE_ROWS,
    Fill,
    partials_schema,
    plan_parts,
    run_partials,
)
from rollup_assets.resources.ledger import Ledger
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.resources.rollup_store import RollupStore
from rollup_assets.resources.rollup_table import cell_keys, in_windows
from rollup_assets.resources.schemas import data_schema
from rollup_assets.resources.visible_rows import delta_pointers, live_files
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.settings import DEFAULT_GENERATION_RETENTION_HOURS, Settings

log = logging.getLogger(__name__)
CellKey = tuple[str, datetime]  # (entity, bucket start)
# A job naming at most this many cells runs on the driver: aggregated from the row groups holding
# its cells, compared and written there, with no Spark job. Scattered cells share few row groups:
# past a few thousand, their source row groups are most of each table, which Spark's tasks read
# side by side (`CHANGE_CELLS`). Recomputes with buckets for every entity run on Spark (the
# forward lane's small ones excepted: `DRIVER_SOURCE_ROWS`).
DRIVER_CELLS = 2_000
# The forward lane aggregates its buckets (every entity) on the driver when the source files they
# may draw from hold at most this many rows (by the files' statistics): the open buckets and the
# few that just closed, where a Spark job would cost more than its data. A lane that closes a
# long stretch at once (after a pause) runs on Spark.
DRIVER_SOURCE_ROWS = 2_000_000
# A downsampling query over a raw or time-range archive aggregates its rows on the driver with
# Arrow when the files its range may read hold at most this many rows (by their statistics), and
# on Spark above: the same trade as the forward lane's, for a read that writes nothing.
QUERY_DRIVER_ROWS = 2_000_000
# A recompute of more named cells than `DRIVER_CELLS`, up to this many, aggregates them in Spark
# tasks (one storage partition each) and compares them on the driver, where their fresh partials
# (this many rows at most) and stored ones are. Larger jobs stay on Spark.
CHANGE_CELLS = 50_000


@dataclass(frozen=True)
class RunOutcome:
    """What one rollup run did. `buckets` are the buckets it wrote (empty for a no-op)."""

    job: Job
    buckets: list[Window]
    rows: int = 0
    generation: int | None = None
    version: int | None = None
    source_versions: dict[str, int] = field(default_factory=dict)
    duration_ms: int = 0
    note: str = ""
    propagated: list[Job] = field(default_factory=list)  # pending jobs it queued one level up
    # The source rows a correction applied (`services.correction.SourceChange`), for the level
    # above in the same run.
    change: Any = None


class Engine:
    def __init__(
        self,
        catalog: Catalog,
        warehouse: Warehouse,
        *,
        generation_retention: timedelta = timedelta(hours=DEFAULT_GENERATION_RETENTION_HOURS),
        retry: RetryPolicy | None = None,
    ) -> None:
        self.catalog = catalog
        self.warehouse = warehouse
        self.raw = RawStore(warehouse)
        # Superseded generations stay this long before a sweep deletes their rows.
        self.generation_retention = generation_retention
        self.keeping = Keeping(generation_retention)
        # How often failed work is queued again, and after how long.
        self.retry = retry or RetryPolicy()
        self.rollups = RollupStore(warehouse, generation_retention)
        self.rollups.refill = self._refill
        self.states = ArchiveStateStore(warehouse)
        self.ledger = Ledger(warehouse)

    def _refill(self, spec: RollupSpec, keys: list[CellKey]) -> pa.Table:
        """Cells of `spec` aggregated again from their source (a read that cannot fold them
        exactly: `compute.folding.Unknowable`), in the shape of stored rows."""
        b = Bucketing.of(spec)
        cells = Cells.collect(((b.window_of(start), frozenset([e])) for e, start in keys), None)
        rows, _ = self.driver_partials(spec, cells)
        return rows.drop_columns([SOURCE_ROWS])

    def read_version(self, spec: RollupSpec, versions: dict[str, int]) -> int | None:
        """The version of `spec`'s source that partials computed from `versions` (what a read
        of the source recorded) hold: a raw table's version, or the level below's pointer
        table version (`services.correction`: the changes a correction may skip)."""
        source = self.catalog.archive(spec.source)
        name = source.genmap_name if isinstance(source, RollupSpec) else source.name
        return versions.get(name)

    def _corrected_below(self, spec: RollupSpec, cells: Cells, below: Snapshot | None) -> bool:
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

    @classmethod
    def from_settings(cls, catalog: Catalog, warehouse: Warehouse, settings: Settings) -> "Engine":
        """The engine a process configured by `settings` uses over `warehouse`."""
        return cls(
            catalog,
            warehouse,
            generation_retention=timedelta(hours=settings.generation_retention_hours),
            retry=RetryPolicy(
                attempts=settings.retry_attempts,
                backoff=timedelta(seconds=settings.retry_backoff_seconds),
            ),
        )

    # -- guards ------------------------------------------------------------------------------

    def require_activated(
        self, spec: ArchiveSpec, state: ArchiveState | None = None
    ) -> ArchiveState:
        state = state or self.states.get(spec.name)
        if state.status is not ArchiveStatus.ACTIVATED:
            raise ArchiveNotActivatedError(
                f"archive '{spec.name}' is not activated (status {state.status.value}); "
                f"activate it first: rollups activate {spec.name}"
            )
        self.require_same_schema(spec, state)
        return state

    def require_same_schema(self, spec: ArchiveSpec, state: ArchiveState) -> None:
        if state.fingerprint and state.fingerprint != schema_fingerprint(spec):
            raise ArchiveSchemaImmutableError(
                f"archive '{spec.name}' was activated with another schema-relevant spec; "
                "an activated "
                "archive's columns, source, alignment, zone, start and aggregations are frozen. "
                f"Declare a new archive (e.g. '{spec.name}_v2') or delete this one first."
            )

    # -- retention ---------------------------------------------------------------------------

    def next_generation(self, spec: RollupSpec) -> int:
        """The generation a new recompute of `spec` claims: past every generation its table
        holds or its pointers name, and every generation a job of it ever claimed (a
        rolled-back generation reclaimed, or one a no-op job never wrote, is never handed out
        again: generations only grow)."""
        claimed = [j.generation for j in self.ledger.snapshot().for_rollup(spec.name)]
        return max(
            self.rollups.next_generation(spec),
            1 + max((g for g in claimed if g is not None), default=0),
        )

    def flipped_generations(self, spec: RollupSpec) -> frozenset[int]:
        """Every generation a job of `spec` flipped, however long ago (undone by a rollback or
        not): a reclaim never deletes them; once superseded, their rows are the sweep's, under
        the retention rule (`model.keeping`). A job that died after its flip and before its
        record counts too (Swapping: the drain completes it)."""
        return frozenset(
            j.generation
            for j in self.ledger.snapshot().for_rollup(spec.name)
            if j.generation
            and (
                (j.state is JobState.COMPLETED and j.windows_processed)
                or j.state is JobState.SWAPPING
            )
        )

    def removed_spans(self, source: ArchiveSpec) -> list[Window]:
        """The time ranges of an archive whose rows retention removed: everything before the
        archive's `retained_from` (recorded in its state before anything is dropped, so it
        outlives the table's log) and, for a raw or time-range archive, the ranges of manual
        retention deletes (recorded in their commits). The one answer to "which range is
        gone"."""
        spans = [] if isinstance(source, RollupSpec) else self.raw.retained_spans(source)
        kept_from = self.states.get(source.name).retained_from
        if kept_from is not None:
            spans.append(Window(BEGINNING, kept_from))
        return merge_windows(spans)

    def require_kept(self, spec: RollupSpec, windows: Sequence[Window]) -> None:
        """Refuse work that would write or show again buckets of `spec` its own retention
        dropped (a recompute, a rewind or a rollback there)."""
        own = self.removed_spans(spec)
        dropped = removed_within(windows, own)
        if dropped:
            asked = merge_windows(list(windows))
            span = Window(asked[0].start, asked[-1].end)
            raise RawRowsRetainedError(
                f"cannot aggregate '{spec.name}' again over {span}: its buckets in "
                f"{', '.join(str(w) for w in dropped)} were dropped by its retention "
                f"({spec.name} keeps nothing {describe_removed(own)}); the levels above keep "
                "their values and nothing was written."
            )

    def require_source_rows(self, spec: RollupSpec, windows: Sequence[Window]) -> None:
        """Refuse work on `spec` that would aggregate rows retention removed: a bucket reaching
        into a removed range of its source (raw rows, or a rollup's dropped buckets) can no
        longer be aggregated again (its stored rows are the only record), and a bucket of
        `spec` that its own retention dropped is not brought back."""
        self.require_kept(spec, windows)
        source = self.catalog.archive(spec.source)
        removed = self.removed_spans(source)
        gone = removed_within(windows, removed)
        if gone:
            asked = merge_windows(list(windows))
            span = Window(asked[0].start, asked[-1].end)
            what = "rows" if isinstance(source, RollupSpec) else "raw rows"
            raise RawRowsRetainedError(
                f"cannot aggregate '{spec.name}' again over {span}: it needs {what} of "
                f"'{source.name}' in {', '.join(str(w) for w in gone)}, which retention removed "
                f"({source.name} keeps nothing {describe_removed(removed)}); the stored buckets "
                "keep their values and nothing was written. The levels above still recompute "
                "from the level below."
            )

    # -- compute -----------------------------------------------------------------------------

    def partials(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        cells: Cells,
        raw_table: DeltaTable | None = None,
        below: Snapshot | None = None,
    ) -> tuple[DataFrame, dict[str, int]]:
        """The partial aggregates of `cells` (with the count of source rows behind each, in
        `SOURCE_ROWS`), and the source versions read (a raw source at `raw_table`'s version
        when given, a rollup source at snapshot `below`). Only the source rows of the cells are
        aggregated; the read itself is pruned to their buckets and (when every bucket names
        them) their entities."""
        source = self.catalog.archive(spec.source)
        spans = merge_windows(list(cells.windows))
        entities = cells.entities
        if isinstance(source, RollupSpec):
            snap = below or self.rollups.snapshot(source)
            rows = self.rollups.read_spark(spark, source, spans, entities, snapshot=snap)
            versions = snap.lineage(source)
        else:
            rows, version = self.raw.read_spark(spark, source, spans, entities, table=raw_table)
            versions = {source.name: _v(version)}
        whole, named = _targets(spark, cells)
        return rollup_partials(rows, whole, spec, source, named), versions

    def driver_partials(
        self,
        spec: RollupSpec,
        cells: Cells,
        raw_table: DeltaTable | None = None,
        below: Snapshot | None = None,
    ) -> tuple[pa.Table, dict[str, int]]:
        """`partials`, computed on the driver: the row groups that may hold the cells' source
        rows read with delta-rs, aggregated with Arrow (`compute.arrow_partials`)."""
        source = self.catalog.archive(spec.source)
        spans = merge_windows(list(cells.windows))
        entities = cells.entities
        if isinstance(source, RollupSpec):
            snap = below or self.rollups.snapshot(source)
            rows = self.rollups.read_arrow(source, spans, entities, snapshot=snap, cells=cells)
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

    def _partials_in_tasks(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        cells: Cells,
        raw_table: DeltaTable | None,
        below: Snapshot | None,
    ) -> tuple[pa.Table, dict[str, int]]:
        """`driver_partials` of named cells, aggregated in Spark tasks, one storage partition
        each (`rollup_assets.resources.fill.run_partials`: the row groups that may hold the
        partition's cells, read and aggregated with Arrow, no shuffle), the partials brought to the
        driver."""
        plan = self._by_partition(spec, cells, raw_table, below)
        if plan is None:  # the source has no table: no cell has a row (as `driver_partials`)
            source = self.catalog.archive(spec.source)
            if isinstance(source, RollupSpec):
                versions = (below or self.rollups.snapshot(source)).lineage(source)
            else:
                versions = {source.name: _v(None)}
            return partials_schema(spec).empty_table(), versions
        rows, _ = run_partials(spark, plan, cells)
        return rows, plan.versions

    def source_versions(self, spec: RollupSpec) -> dict[str, int]:
        """The versions of `spec`'s source as they stand now, as a recompute's rows record them
        (`lineage`): what a correction's differences were made against."""
        source = self.catalog.archive(spec.source)
        if isinstance(source, RollupSpec):
            return self.rollups.snapshot(source).lineage(source)
        table = self.raw.table(source)
        return {source.name: _v(None if table is None else table.version())}

    def source_rows_at_most(self, spec: RollupSpec, cells: Cells) -> int | None:
        """How many rows the source files that may hold `cells`' source rows contain, by their
        statistics (an upper bound of what `driver_partials` decodes); None when a file does not
        say."""
        source = self.catalog.archive(spec.source)
        spans = merge_windows(list(cells.windows))
        if isinstance(source, RollupSpec):
            table = self.rollups.snapshot(source).table
            files = (
                self.rollups.overlapping(file_actions(table), spans, cells.entities)
                if table is not None
                else []
            )
        else:
            raw = self.raw.table(source)
            files = self.raw.files_for(raw, source, spans, cells.entities) if raw else []
        counts = [f.get("num_records") for f in files]
        if not all(isinstance(n, int) for n in counts):
            return None
        return sum(int(n) for n in counts if n is not None)

    def _folded(self, spec: RollupSpec, cells: Cells) -> frozenset[Window]:
        """The every-entity buckets of `cells` that folding rewrites whole, even unchanged
        (`model.cells.buckets_to_fold`): they then leave one bucket pointer each."""
        whole = {w for w, scope in cells if scope is None}
        if not whole:
            return frozenset()
        return self.buckets_to_fold(spec) & whole

    def _fill(self, spec: RollupSpec, cells: Cells, raw_table: DeltaTable | None) -> Fill | None:
        """A first fill of `cells` (`rollup_assets.resources.fill`), when it applies: buckets for
        every entity with nothing stored in them yet (checked by the caller), and no storage
        partition whose source files hold more than `MAX_FILL_SOURCE_ROWS` rows (one task aggregates
        each partition in memory). None otherwise: the whole job takes the general path."""
        if not cells or any(scope is not None for _, scope in cells):
            return None
        fill = self._by_partition(spec, cells, raw_table, None)
        if fill is None:
            return None
        for part in fill.parts:
            counted = [fill.sizes.get(p) for p in part.paths]
            if not all(isinstance(n, int) for n in counted):
                return None
            if sum(int(n) for n in counted if n is not None) > MAX_FILL_SOURCE_ROWS:
                return None
        return fill

    def _by_partition(
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
                self.rollups.overlapping(file_actions(snap.table), spans, cells.entities),
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

        def files_for(span: Window) -> list[dict]:
            return prune_files(
                live,
                time_column=time_column,
                spans=[span],
                entities=cells.entities,
                day_column=day_column,
            )

        parts = plan_parts(spec, cells.windows, files_for)
        return Fill(spec, source, uri, options, versions, parts, pointers, sizes)

    def buckets_to_fold(
        self,
        spec: RollupSpec,
        *,
        now: datetime | None = None,
        closed_before: datetime | None = None,
    ) -> frozenset[Window]:
        """Buckets (ending by `closed_before`, when given) whose cell pointers folding replaces
        (`model.cells.buckets_to_fold`). With `now`, leaving out every bucket a pointer of which
        was flipped recently enough to be rolled back then (`model.keeping`): a fold supersedes
        every pointer of its buckets, so it would take that rollback away."""
        pointers = self.rollups.snapshot(spec).pointers
        counts: dict[Window, int] = {}
        recent: set[datetime] = set()
        for r in pointers.select(
            ["bucket_start", "bucket_end", "entity_id", "flipped_at"]
        ).to_pylist():
            flipped = r["flipped_at"]
            if now is not None and flipped is not None and self.keeping.may_roll_back(flipped, now):
                recent.add(r["bucket_start"])
            if r["entity_id"] is None:
                continue
            if closed_before is not None and r["bucket_end"] > closed_before:
                continue
            w = Window(r["bucket_start"], r["bucket_end"])
            counts[w] = counts.get(w, 0) + 1
        foldable = {w: n for w, n in counts.items() if w.start not in recent}
        return buckets_to_fold(foldable, lambda t: storage_partition(spec, t))

    def recompute(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        cells: Cells,
        raw_table: DeltaTable | None = None,
        *,
        below: Snapshot | None = None,
    ) -> "Recomputed":
        """The fresh partials of `cells`, compared exactly with the stored ones: the rows of the
        cells to write (`model.cells.changed_cells`) and what the comparison found. A job of a
        few named cells (at most `DRIVER_CELLS`) runs on the driver: their source row groups
        read with delta-rs and aggregated with Arrow (`driver_partials`). A job of more named
        cells (at most `CHANGE_CELLS`) aggregates them on Spark and brings their fresh partials
        to the driver. Either is compared there with the stored rows of its cells. Other jobs
        (buckets for every entity, more cells) stay on Spark, where the rows are cached until
        `Recomputed.release`. A rollup source is read at snapshot `below` when given. Refuses
        (`RawRowsRetainedError`) cells whose raw rows retention removed."""
        self.require_source_rows(spec, list(cells.windows))
        spans = merge_windows(list(cells.windows))
        if cells.named is not None and cells.named <= CHANGE_CELLS:
            # Named cells: their fresh partials are at most `CHANGE_CELLS` rows, compared with
            # the stored ones on the driver.
            if cells.named <= DRIVER_CELLS or self._corrected_below(spec, cells, below):
                rows, versions = self.driver_partials(spec, cells, raw_table, below)
            else:
                rows, versions = self._partials_in_tasks(spark, spec, cells, raw_table, below)
            own = self.rollups.snapshot(spec)
            stored = self.rollups.read_arrow(
                spec, spans, cells.entities, own, cells=cells, exact=True
            )
            mine = rows_with_keys(stored, cell_keys(cells), KEYS)
            compared = cell_changes_arrow(rows, mine, spec).to_pylist()
            found = _found(cells, compared, partial=None)
            picked = rows_with_keys(rows, cell_keys(found.cells), KEYS)
            return Recomputed(picked.drop_columns([SOURCE_ROWS]), found, versions)
        held = self.rollups.may_hold(spec, spans, cells.entities)
        fill = None
        if not held and not self._corrected_below(spec, cells, below):
            fill = self._fill(spec, cells, raw_table)
        if fill is not None:
            return Recomputed(
                fill,
                None,
                fill.versions,
                reason=(
                    f"a first fill: {fill.buckets} bucket(s) aggregated and written one storage "
                    f"partition at a time ({len(fill.parts)} partition(s)), without a shuffle"
                ),
            )
        fresh, versions = self.partials(spark, spec, cells, raw_table, below)
        fresh = fresh.persist()
        if held:
            own = self.rollups.snapshot(spec)
            stored_df = self.rollups.read_spark(spark, spec, spans, cells.entities, own)
            compared_df = cell_changes(fresh, _within(spark, stored_df, cells), spec).persist()
        else:
            # Nothing stored in these buckets yet (a first backfill): no join, every cell is new.
            compared_df = all_new(fresh, spec)
        try:
            per_bucket = (
                compared_df.groupBy("bucket_start")
                .agg(
                    F.count(F.lit(1)).alias("cells"),
                    F.sum(F.col(CHANGED).cast("long")).alias("changed"),
                    F.sum(F.coalesce(F.col(SOURCE_ROWS), F.lit(0))).alias("rows"),
                )
                .toArrow()
                .to_pylist()
            )

            def changed_rows(starts: list[datetime]) -> list[dict]:
                # The buckets as a broadcast table, not thousands of literals in one predicate.
                wanted = spark.createDataFrame(pa.table({"bucket_start": pa.array(starts, TS)}))
                return (
                    compared_df.where(F.col(CHANGED))
                    .join(F.broadcast(wanted), "bucket_start")
                    .select(ENTITY_COLUMN, "bucket_start", F.lit(True).alias(CHANGED))
                    .toArrow()
                    .to_pylist()
                )

            found = _found(
                cells, per_bucket, partial=changed_rows, folded=self._folded(spec, cells)
            )
            rows = _within(spark, fresh, found.cells).drop(SOURCE_ROWS)
        finally:
            compared_df.unpersist()
        return Recomputed(rows, found, versions, release=fresh.unpersist)


@dataclass(frozen=True)
class CellOutcome:
    """What comparing a recompute's fresh partials with the stored ones found."""

    cells: Cells  # what to write and flip
    cells_changed: int  # cells whose partials changed (or appeared, or vanished)
    cells_skipped: int  # cells whose partials did not change
    source_rows: int  # source rows aggregated


@dataclass
class Recomputed:
    """A recompute's rows to write (a Spark frame, or a table on the driver), what the comparison
    found, and the source versions read."""

    rows: DataFrame | pa.Table | Fill  # a first fill is aggregated as it is written
    # None for a first fill (`filled` tells, once it is written) and a fold (every cell of
    # its buckets is rewritten)
    found: CellOutcome | None
    versions: dict[str, int]
    release: Callable[[], object] = lambda: None  # drop what the comparison cached
    reason: str = ""  # how it was computed (a first fill says so)


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


def _found(
    cells: Cells,
    compared: list[dict],
    partial: Callable[[list[datetime]], list[dict]] | None,
    folded: frozenset[Window] = frozenset(),
) -> CellOutcome:
    """The outcome from compared cells: rows of (bucket_start, entity_id, CHANGED, SOURCE_ROWS)
    when `partial` is None; otherwise per-bucket counts (bucket_start, cells, changed, rows),
    with `partial(starts)` naming the changed cells of the given buckets when needed."""
    by_start = {w.start: w for w in cells.windows}
    counts: dict[Window, CellCounts] = {}
    changed_entities: dict[Window, set[str]] = {}
    if partial is None:
        tally: dict[Window, list[int]] = {}
        rows = 0
        for r in compared:
            w = by_start[r["bucket_start"]]
            t = tally.setdefault(w, [0, 0])
            t[0] += 1
            rows += int(r.get(SOURCE_ROWS) or 0)
            if r[CHANGED]:
                t[1] += 1
                changed_entities.setdefault(w, set()).add(r[ENTITY_COLUMN])
        counts = {w: CellCounts(c, ch) for w, (c, ch) in tally.items()}
    else:
        counts = {
            by_start[r["bucket_start"]]: CellCounts(r["cells"], r["changed"] or 0) for r in compared
        }
        rows = sum(int(r["rows"] or 0) for r in compared)
        to_name = [
            w
            for w, scope in cells
            if w in counts and counts[w].changed and not rewrites_whole(scope, counts[w])
        ]
        if to_name:
            for r in partial([w.start for w in to_name]):
                changed_entities.setdefault(by_start[r["bucket_start"]], set()).add(
                    r[ENTITY_COLUMN]
                )
    written = changed_cells(
        cells, counts, {w: frozenset(ids) for w, ids in changed_entities.items()}, folded
    )
    total = sum(c.cells for c in counts.values())
    changed = sum(c.changed for c in counts.values())
    return CellOutcome(
        written, cells_changed=changed, cells_skipped=total - changed, source_rows=rows
    )


def filled(cells: Cells, counts: dict[datetime, tuple[int, int]]) -> CellOutcome:
    """The outcome of a first fill of `cells` from what it wrote per bucket start: (cells,
    source rows). Every cell written is new."""
    compared = [
        {"bucket_start": start, "cells": n, "changed": n, "rows": rows}
        for start, (n, rows) in counts.items()
    ]
    return _found(cells, compared, partial=lambda _starts: [])


KEYS = ["bucket_start", ENTITY_COLUMN]


def _within(spark: SparkSession, frame: DataFrame, cells: Cells) -> DataFrame:
    """The rows of `frame` in `cells`."""
    whole, named = _targets(spark, cells)
    parts = []
    if whole is not None:
        parts.append(frame.join(F.broadcast(whole.select("bucket_start")), "bucket_start"))
    if named is not None:
        parts.append(frame.join(F.broadcast(named.select(*KEYS)), KEYS))
    if not parts:
        return frame.limit(0)
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def _targets(spark: SparkSession, cells: Cells) -> tuple[DataFrame | None, DataFrame | None]:
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


def _v(version: int | None) -> int:
    return -1 if version is None else version
