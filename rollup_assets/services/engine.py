"""The engine: a catalog and the stores of one warehouse, shared by every use case.

It holds the rules every use case applies: an archive must be activated, with the spec it was
activated with; the generation a recompute claims, and those it flipped; the ranges retention
removed, where no work aggregates again; the buckets a fold may rewrite. It computes a rollup's
partials from its source through its `Partials` (`services.partials`). It is free of Dagster: a
Dagster resource provides it to runs and sensors, and the CLI and the tests build it directly.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta

from rollup_assets.model.bucketing import storage_partition
from rollup_assets.model.cells import buckets_to_fold
from rollup_assets.model.errors import (
    ArchiveNotActivatedError,
    ArchiveSchemaImmutableError,
    RawRowsRetainedError,
)
from rollup_assets.model.jobs import JobState, RetryPolicy
from rollup_assets.model.keeping import Keeping
from rollup_assets.model.retention import BEGINNING, describe_removed, removed_within
from rollup_assets.model.specs import ArchiveSpec, Catalog, RollupSpec, schema_fingerprint
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.archive_states import ArchiveStateStore
from rollup_assets.resources.flips import buckets_flipped_when, cell_pointer_counts
from rollup_assets.resources.ledger import Ledger
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.rollup_store import RollupStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.partials import Partials
from rollup_assets.settings import (
    DEFAULT_DRIVER_SOURCE_ROWS,
    DEFAULT_GENERATION_RETENTION_HOURS,
    Settings,
)


class Engine:
    def __init__(
        self,
        catalog: Catalog,
        warehouse: Warehouse,
        *,
        generation_retention: timedelta = timedelta(hours=DEFAULT_GENERATION_RETENTION_HOURS),
        retry: RetryPolicy | None = None,
        driver_source_rows: int = DEFAULT_DRIVER_SOURCE_ROWS,
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
        self.states = ArchiveStateStore(warehouse)
        self.ledger = Ledger(warehouse)
        self.partials = Partials(catalog, self.raw, self.rollups, driver_source_rows)
        self.rollups.refill = self.partials.refill

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
            driver_source_rows=settings.driver_source_rows,
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

    # -- folding -----------------------------------------------------------------------------

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
        recent: set[datetime] = set()
        if now is not None:
            recent = buckets_flipped_when(pointers, lambda t: self.keeping.may_roll_back(t, now))
        counts = cell_pointer_counts(pointers, closed_before)
        foldable = {w: n for w, n in counts.items() if w.start not in recent}
        return buckets_to_fold(foldable, lambda t: storage_partition(spec, t))
