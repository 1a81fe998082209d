"""Table upkeep: raw retention, checkpoints, compaction of small files, full sweeps, pointer
folding, and vacuum.

First what interrupted operator actions left is finished (`services.recovery`), then each raw
archive's retention drops its UTC days older than its horizon (`services.retention`); the
rollups keep what they aggregated from them. Then each rollup's retention drops its buckets
older than its horizon (`services.rollup_retention`); the levels above keep their values.

Every commit adds a log entry and usually a small file; forward refreshes and control writes add
many. Upkeep keeps reads fast: a checkpoint bounds log replay, compaction merges small files
(a data-neutral rewrite, which change detection ignores), a full sweep deletes every superseded
or orphaned generation up to the newest one the pointers know (a newer one belongs to a recompute
that has not flipped yet) once the generation retention has passed since its cell's newest flip,
and vacuum deletes unreferenced files older than the retention (which must exceed the longest
read or run, or pinned snapshots would lose their files, and is never less than the generation
retention, so as-of reads within it find their files).

Corrections flip difference pointers, one per corrected cell, and every read folds a cell's
difference rows into its base. Maintenance folds them for good: when the closed buckets of one
storage partition (a UTC day of hourly buckets, a month of days, a year above) carry at least
`FOLD_MIN_POINTERS` cell pointers in all, those buckets are queued in a pending job (trigger
Maintenance), which the recompute lane runs like any other (its pool slot, a new generation,
one flip): it rewrites each bucket whole from its visible rows under one bucket pointer, so a
fold changes the layout, never a value (cells a rollback gave back an earlier state keep it). A
bucket a pointer of which could still be rolled back is left until the generation retention
has passed since its flip (`model.keeping`), checked again when the fold runs: a fold
supersedes every pointer of its buckets and would take that rollback away. Buckets a retention
delete reached are not folded at the level above it: the source rows (raw rows, or a rollup's
dropped buckets) are gone, so the stored rows are the only record (`Engine.removed_spans`).

Every rollup's surface is published (`services.surface`: built when missing, brought up to date
when its publish lags) and then kept like the other tables, except that its small neighbouring
files are merged by entity range (`services.surface_files.compact`), not by Delta's compaction.

Each step of each table runs on its own (`MaintenanceReport.step`): a compaction that loses a
commit race to an ingest is run again on the newest version, and a step that still fails is
reported while every other table is still compacted, vacuumed and checkpointed.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from rollup_assets import metrics
from rollup_assets.model.jobs import Job, Trigger
from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_tables import open_table, with_retries
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.resources.memory import returning_memory
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.recovery import recover
from rollup_assets.services.retention import RetentionOutcome, apply_retention
from rollup_assets.services.rollup_retention import RollupRetentionOutcome, apply_rollup_retention
from rollup_assets.services.surface import publish
from rollup_assets.services.surface_files import compact as compact_surface

log = logging.getLogger(__name__)
DEFAULT_RETENTION_HOURS = 168
# Attempts of one upkeep step of one table that keeps losing commit races to other writers.
STEP_ATTEMPTS = 5


@dataclass
class MaintenanceReport:
    raw_days_dropped: int = 0  # UTC days retention dropped from raw and time-range archives
    raw_rows_dropped: int = 0
    rollup_rows_dropped: int = 0  # rows rollup retention dropped (base and difference rows)
    retention_failures: int = 0  # archives whose retention failed (the others went on)
    tables: int = 0
    files_compacted: int = 0
    files_vacuumed: int = 0
    rows_swept: int = 0
    surfaces_published: int = 0  # rollup surfaces that were missing or behind their pointers
    buckets_to_fold: int = 0  # buckets queued to be rewritten whole (their pointers folded)
    details: list[str] = field(default_factory=list)
    retention: list[RetentionOutcome] = field(default_factory=list)
    rollup_retention: list[RollupRetentionOutcome] = field(default_factory=list)
    # Steps that failed after their retries ("<table>: <step>: <error>"); the others went on.
    failures: list[str] = field(default_factory=list)

    def step(self, what: str, action: Callable[[], None]) -> None:
        """Run one step of upkeep on its own: a lost commit race is run again on the table's
        newest version (`STEP_ATTEMPTS` in all); a step that still fails is recorded, and
        maintenance goes on with the next."""
        try:
            with_retries(
                action,
                retryable=lambda exc: isinstance(exc, CommitFailedError),
                attempts=STEP_ATTEMPTS,
                what=what,
                delay=0.05,
            )
        except Exception as exc:
            log.warning("maintenance: %s failed: %s", what, exc)
            metrics.failed("maintenance", exc)
            self.failures.append(f"{what}: {type(exc).__name__}: {exc}")


def fold_jobs(engine: Engine, busy: set[str], now: datetime) -> list[Job]:
    """Pending jobs folding the cell pointers of closed buckets (one job per rollup), none of
    whose pointers could still be rolled back at `now`."""
    jobs = []
    snapshot = engine.ledger.snapshot()
    statuses = engine.states.all()
    for spec in engine.catalog.rollups.values():
        state = statuses.get(spec.name)
        queued = any(j.trigger is Trigger.MAINTENANCE for j in snapshot.pending(spec.name))
        if spec.name in busy or queued or state is None or state.watermark is None:
            continue
        buckets = sorted(engine.buckets_to_fold(spec, now=now, closed_before=state.watermark))
        if buckets:
            kept = engine.removed_spans(engine.catalog.archive(spec.source))
            buckets = [w for w in buckets if not any(w.overlaps(k) for k in kept)]
        if buckets:
            jobs.append(Job(spec.name, Trigger.MAINTENANCE, tuple(sorted(buckets)), entities=None))
    return jobs


def table_uris(warehouse: Warehouse, catalog: Catalog) -> list[str]:
    uris = [warehouse.raw_path(n) for n in [*catalog.raw, *catalog.time_range]]
    for spec in catalog.rollups.values():
        uris += [
            warehouse.rollup_path(spec.name),
            warehouse.genmap_path(spec.name),
            warehouse.surface_path(spec.name),
        ]
    return uris + [warehouse.control_path(t) for t in ("archives", "ledger")]


@returning_memory
def maintain(
    engine: Engine,
    *,
    now: datetime | None = None,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    enforce_retention: bool = True,
) -> MaintenanceReport:
    """Finish what interrupted actions left, apply raw and rollup retention as of `now`
    (default: the real clock), then sweep, fold, compact, vacuum (files unreferenced for
    `retention_hours`, never less than the generation retention) and checkpoint every table.
    Each step of each table runs on its own: a commit race lost is retried, and a step that
    still fails is reported (`failures`) while the others go on."""
    report = MaintenanceReport()
    for note in recover(engine, actor="maintenance"):
        report.details.append(note)
    retention_hours = engine.keeping.vacuum_hours(retention_hours)
    for outcome in apply_retention(engine, now or datetime.now(UTC)):
        report.retention.append(outcome)
        report.raw_days_dropped += len(outcome.days)
        report.raw_rows_dropped += outcome.rows
        report.retention_failures += bool(outcome.error)
        report.details.append(outcome.describe())
    for kept in apply_rollup_retention(engine, now or datetime.now(UTC)):
        report.rollup_retention.append(kept)
        report.rollup_rows_dropped += kept.rows
        report.retention_failures += bool(kept.error)
        report.details.append(kept.describe())
    warehouse, catalog = engine.warehouse, engine.catalog
    active = {j.rollup: j for j in engine.ledger.snapshot().jobs.values() if j.state.active}
    statuses = engine.states.all()
    for spec in catalog.rollups.values():
        if spec.name in active or spec.name not in statuses:
            continue  # a live recompute may still flip its generation: leave this rollup alone
        report.step(f"{spec.name}: sweep", partial(_sweep, engine, spec, report))
    for spec in catalog.rollups.values():
        if spec.name not in statuses:
            continue
        report.step(f"{spec.name}: publish", partial(_publish, engine, spec, report))
    folds = fold_jobs(engine, set(active), now or datetime.now(UTC))
    if folds:
        engine.ledger.record(folds)
        for job in folds:
            report.buckets_to_fold += len(job.windows)
            report.details.append(
                f"{job.rollup}: {len(job.windows)} bucket(s) queued to fold their cell pointers"
            )
    surfaces = {warehouse.surface_path(s.name): s for s in catalog.rollups.values()}
    for uri in table_uris(warehouse, catalog):
        if open_table(uri, warehouse.storage_options) is None:
            continue
        report.tables += 1
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        if uri in surfaces:
            # Delta's compaction would pack files of unrelated entity ranges together, and the
            # next publish of a changed cell would rewrite the whole partition again.
            step = partial(_compact_surface, engine, surfaces[uri], report)
            report.step(f"{name}: compaction", step)
        elif not uri.endswith("__genmap"):
            report.step(f"{name}: compaction", partial(_compact, warehouse, uri, report))
        report.step(
            f"{name}: vacuum",
            partial(_vacuum, warehouse, uri, retention_hours, enforce_retention, report),
        )
        report.step(f"{name}: checkpoint", partial(_checkpoint, warehouse, uri))
    return report


def _sweep(engine: Engine, spec: RollupSpec, report: MaintenanceReport) -> None:
    store = engine.rollups
    pointers, _ = read_pointers(store.genmap_uri(spec), engine.warehouse.storage_options)
    # Maintenance holds no writer's slot: a recompute may start after the check for running
    # ones and commit rows of a new generation, newer than every pointer read here, before
    # flipping them. Rows of a newer generation are left alone (a dead run's are reclaimed by
    # the next recompute of the rollup, which holds its slot).
    newest = max([0, *pointers["generation"].to_pylist()])
    buckets = sorted({Window(r["bucket_start"], r["bucket_end"]) for r in pointers.to_pylist()})
    swept = store.sweep(spec, buckets, None, up_to=newest) if buckets else 0
    reclaimed = store.reclaim(spec, flipped=engine.flipped_generations(spec), up_to=newest)
    report.rows_swept += swept + reclaimed
    if swept or reclaimed:
        report.details.append(
            f"{spec.name}: swept {swept} superseded and {reclaimed} orphaned row(s)"
        )


def _publish(engine: Engine, spec: RollupSpec, report: MaintenanceReport) -> None:
    published = publish(engine, spec)
    if published.changed:
        report.surfaces_published += 1
        how = "rebuilt" if published.rebuilt else f"updated on {published.spans} span(s)"
        report.details.append(f"{spec.name}: surface {how}")


def _compact_surface(engine: Engine, spec: RollupSpec, report: MaintenanceReport) -> None:
    report.files_compacted += compact_surface(engine, spec)


def _compact(warehouse: Warehouse, uri: str, report: MaintenanceReport) -> None:
    table = _fresh(warehouse, uri)
    metrics = table.optimize.compact()
    report.files_compacted += int(metrics.get("numFilesRemoved", 0))


def _vacuum(
    warehouse: Warehouse, uri: str, hours: int, enforce: bool, report: MaintenanceReport
) -> None:
    table = _fresh(warehouse, uri)
    removed = table.vacuum(
        retention_hours=hours, enforce_retention_duration=enforce, dry_run=False, full=True
    )
    report.files_vacuumed += len(removed)


def _checkpoint(warehouse: Warehouse, uri: str) -> None:
    _fresh(warehouse, uri).create_checkpoint()


def _fresh(warehouse: Warehouse, uri: str) -> DeltaTable:
    """The table at its newest version (each attempt of a step starts from it)."""
    table = open_table(uri, warehouse.storage_options)
    assert table is not None, uri
    return table
