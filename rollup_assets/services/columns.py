"""Computed columns of an activated archive: what the spec declares against what the table
applies, and applying one column's change (add, new formula, remove) without stopping ingest.

The spec file is where a column is declared; the table records the formulas its rows were
computed with (`resources/raw_columns.py`). A difference is a pending change, shown by
`column_states` and applied by `change_column`: every row is rewritten with the new formulas
into files readers do not see, then one commit switches the table (a failure leaves the
previous columns and values). Rows an ingest inserted while the rewrite ran are upserted again
afterwards (their computed columns only, and only where nothing changed them since), so
they hold the new values too. A new formula is a change of every first-level
rollup aggregating the column: a Manual recompute of its closed buckets (those whose raw rows
retention has not removed) is queued for each, and the chain carries it up.
"""

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from deltalake.exceptions import CommitFailedError

from resources.delta_tables import with_retries
from resources.raw_columns import refresh_inserted, rewrite_columns
from rollup_assets.model.bucketing import first_bucket_start
from rollup_assets.model.column_rules import check_computed_columns
from rollup_assets.model.errors import InvalidArchiveOperationError, SpecError
from rollup_assets.model.jobs import Job
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.specs import RawArchiveSpec, TimeRangeArchiveSpec
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.services.engine import Engine
from rollup_assets.services.operations import Operations

log = logging.getLogger(__name__)
SourceSpec = RawArchiveSpec | TimeRangeArchiveSpec
REWRITE_ATTEMPTS = 8


class ColumnAction(StrEnum):
    ADD = "add"
    SET_FORMULA = "set-formula"
    REMOVE = "remove"


class ColumnChangeError(InvalidArchiveOperationError):
    """A computed-column change that does not apply (nothing pending, or a column others read)."""


@dataclass(frozen=True)
class ColumnState:
    """A value column as declared in the spec and as applied by the table."""

    column: str
    type: str
    declared: str | None  # the spec's formula (None: an ingested column, or not declared)
    applied: str | None  # the formula the table's rows were computed with
    status: str  # ingested | active | pending add | pending formula | pending removal


@dataclass
class ColumnChange:
    archive: str
    column: str
    action: ColumnAction
    version: int  # the commit that switched the table
    rows: int  # rows rewritten
    reingested: int = 0  # rows an ingest inserted during the rewrite, upserted again after it
    recomputes: list[Job] = field(default_factory=list)


def source_spec(engine: Engine, archive: str) -> SourceSpec:
    spec = engine.catalog.archive(archive)
    if not isinstance(spec, RawArchiveSpec | TimeRangeArchiveSpec):
        raise InvalidArchiveOperationError(
            f"'{archive}' is a rollup; computed columns belong to raw and time-range archives"
        )
    return spec


def column_states(engine: Engine, archive: str) -> list[ColumnState]:
    """Every value column of `archive`: declared, applied, and what is pending."""
    spec = source_spec(engine, archive)
    applied = engine.raw.applied(spec)
    names = [c.name for c in spec.columns]
    names += [c.name for c in applied.columns if c.name not in names]
    out = []
    for name in names:
        declared, current = spec.column(name), applied.column(name)
        d = declared.formula.text if declared is not None and declared.formula else None
        a = current.formula.text if current is not None and current.formula else None
        if declared is not None and not declared.is_computed:
            status = "ingested"
        elif d is not None and a is None:
            status = "pending add"
        elif d is None:
            status = "pending removal"
        else:
            status = "active" if d == a else "pending formula"
        ctype = (declared or current).type.value  # type: ignore[union-attr]
        out.append(ColumnState(name, ctype, d, a, status))
    return out


def change_column(
    engine: Engine,
    archive: str,
    column: str,
    action: ColumnAction,
    actor: str = "cli",
    now: datetime | None = None,
) -> ColumnChange:
    """Apply the spec's declaration of one computed column to the activated `archive`."""
    spec = source_spec(engine, archive)
    engine.require_activated(spec)
    table = engine.raw.table(spec)
    if table is None:
        raise ColumnChangeError(f"'{archive}' has no table yet; activate it first")
    _target(spec, engine.raw.applied(spec, table), column, action)  # refuse before any work
    change = {"rollups.column": column, "rollups.column_action": action.value}

    def attempt() -> tuple[int, int, int]:
        # From the snapshot this attempt rewrites: a change another one committed meanwhile
        # (say, another column added) is kept, not overwritten with what was read before.
        fresh = engine.raw.table(spec)
        assert fresh is not None
        target = _target(spec, engine.raw.applied(spec, fresh), column, action)
        return rewrite_columns(fresh, target, change, engine.raw.options)

    read, wrote, rows = with_retries(
        attempt,
        retryable=lambda exc: isinstance(exc, CommitFailedError),
        attempts=REWRITE_ATTEMPTS,
        what=f"computed column change of {archive}",
    )
    result = ColumnChange(archive, column, action, wrote, rows)
    result.reingested = refresh_inserted(
        engine.raw.uri(spec), engine.raw.options, engine.raw.applied(spec), read, wrote
    )
    if action is ColumnAction.SET_FORMULA:
        result.recomputes = _recompute_rollups(engine, spec, column, actor, now)
    log.info(
        "'%s': %s of computed column '%s' committed at version %d (%d rows re-ingested)",
        archive,
        action.value,
        column,
        wrote,
        result.reingested,
    )
    return result


def _target(spec: SourceSpec, applied: SourceSpec, column: str, action: ColumnAction) -> SourceSpec:
    """The archive's columns once `action` is applied to `column` (refused when not pending)."""
    declared, current = spec.column(column), applied.column(column)
    readers = sorted(
        c.name
        for c in applied.computed_columns
        if c.name != column and c.formula is not None and column in c.formula.columns
    )
    name = spec.name
    if action is ColumnAction.ADD:
        if declared is None or declared.formula is None:
            raise ColumnChangeError(
                f"'{name}' does not declare a computed column '{column}'; declare it in the spec "
                "(with its formula and type) first"
            )
        if current is not None:
            raise ColumnChangeError(
                f"'{column}' of '{name}' is applied already; change its formula with set-formula"
            )
        columns = (*applied.columns, declared)
    elif action is ColumnAction.SET_FORMULA:
        if current is None or current.formula is None:
            raise ColumnChangeError(f"'{column}' is not a computed column of '{name}' yet; add it")
        if declared is None or declared.formula is None:
            raise ColumnChangeError(
                f"the spec no longer declares '{column}' of '{name}'; remove it with remove-column"
            )
        if declared.formula.text == current.formula.text and declared.type is current.type:
            raise ColumnChangeError(
                f"'{column}' of '{name}' already computes {current.formula.text!r}; change the "
                "formula in the spec first"
            )
        if readers:
            raise ColumnChangeError(
                f"the formula of '{column}' cannot change while computed column(s) {readers} of "
                f"'{name}' read it; re-point or remove them first"
            )
        columns = tuple(declared if c.name == column else c for c in applied.columns)
    else:
        if current is None or current.formula is None:
            raise ColumnChangeError(f"'{column}' is not a computed column of '{name}'")
        if declared is not None:
            raise ColumnChangeError(
                f"the spec still declares '{column}' of '{name}'; delete it from the spec first"
            )
        if readers:
            raise ColumnChangeError(
                f"'{column}' of '{name}' is read by computed column(s) {readers}; remove them first"
            )
        columns = tuple(c for c in applied.columns if c.name != column)
    try:
        return check_computed_columns(replace(applied, columns=columns))
    except SpecError as exc:
        raise ColumnChangeError(str(exc)) from None


def _recompute_rollups(
    engine: Engine, spec: SourceSpec, column: str, actor: str, now: datetime | None
) -> list[Job]:
    """Queue a recompute of every closed bucket of the first-level rollups over `column`."""
    ops = Operations(engine, actor=actor)
    removed = engine.removed_spans(spec)
    jobs = []
    for rollup in engine.catalog.first_levels(spec.name):
        if column not in {a.column for a in rollup.aggregations}:
            continue
        state = engine.states.get(rollup.name)
        if state.status is not ArchiveStatus.ACTIVATED or state.watermark is None:
            continue
        closed = buckets_in(rollup, [Window(first_bucket_start(rollup), state.watermark)])
        # Every bucket whose raw rows are all there, in runs of adjacent buckets.
        kept = [b for b in closed if not any(b.overlaps(r) for r in removed)]
        for run in merge_windows(kept):
            jobs.append(ops.request_recompute(rollup.name, run.start, run.end))
    return jobs
