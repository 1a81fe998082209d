"""Computed columns of an activated archive: what the spec declares against what the table
applies, and applying one column's change (add, new formula, remove) without stopping ingest.

The spec file is where a column is declared; the table records the formulas its rows were
computed with (`rollup_assets/resources/raw_columns.py`). A difference is a pending change, shown by
`column_states` and applied by `change_column`: every row is rewritten with the new formulas
into files readers do not see, then one commit switches the table (a failure leaves the
previous columns and values). Rows an ingest inserted while the rewrite ran are upserted again
afterwards (their computed columns only, and only where nothing changed them since), so
they hold the new values too. A new formula is a change of every first-level rollup
aggregating the column: change detection reads the switch commit and queues a recompute of its
closed buckets (those whose raw rows retention has not removed), exactly once, with its cursor;
the chain carries it up.

A change takes two commits (the switch, then the upsert of rows inserted meanwhile), so it
records its intent in the archive's state first (`model.intents`). An interrupted change is
finished by running the command again, by `rollups maintain` or by the sensor: if the switch
landed, the rows inserted meanwhile are upserted and the intent cleared (a retry of the command
then reports the change, it does not refuse it); if not, the intent is cleared, having changed
nothing.
"""

import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from deltalake.exceptions import CommitFailedError

from rollup_assets.faults import checkpoint
from rollup_assets.model.column_rules import ColumnAction, check_computed_columns
from rollup_assets.model.errors import ColumnChangeError, InvalidArchiveOperationError, SpecError
from rollup_assets.model.intents import Intent, IntentKind, require_no_intent
from rollup_assets.model.specs import RawArchiveSpec, SourceSpec, TimeRangeArchiveSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import iso_utc
from rollup_assets.resources.delta_tables import with_retries
from rollup_assets.resources.raw_columns import (
    INTENT_KEY,
    refresh_inserted,
    rewrite_columns,
    switch_commit,
)
from rollup_assets.services.engine import Engine

log = logging.getLogger(__name__)
REWRITE_ATTEMPTS = 8


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
    # First-level rollups over the column whose closed buckets change detection recomputes.
    recomputed: list[str] = field(default_factory=list)


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
) -> ColumnChange:
    """Apply the spec's declaration of one computed column to the activated `archive`."""
    spec = source_spec(engine, archive)
    engine.require_activated(spec)
    left = Intent.decode(engine.states.get(archive).intent)
    if left is not None and left.kind is IntentKind.COLUMN:
        # An earlier run of a change was interrupted: finish it; if it was this very change
        # and its switch landed, that is this command's outcome.
        finished = finish_column_change(engine, spec, left, actor=actor)
        if finished is not None and (finished.column, finished.action) == (column, action):
            return finished
    table = engine.raw.table(spec)
    if table is None:
        raise ColumnChangeError(f"'{archive}' has no table yet; activate it first")
    _target(spec, engine.raw.applied(spec, table), column, action)  # refuse before any work
    intent = Intent(
        IntentKind.COLUMN, {"column": column, "action": action.value}, datetime.now(UTC), actor
    )

    def begin(s: ArchiveState) -> ArchiveState:
        require_no_intent(archive, s)
        return replace(s, intent=intent.encode())

    engine.states.update(archive, begin, reason=f"{action.value} of '{column}' begins", actor=actor)
    checkpoint("column_intent", archive)
    change = {
        "rollups.column": column,
        "rollups.column_action": action.value,
        INTENT_KEY: iso_utc(intent.began_at),
    }

    def attempt() -> tuple[int, int, int]:
        # From the snapshot this attempt rewrites: a change another one committed meanwhile
        # (say, another column added) is kept, not overwritten with what was read before.
        fresh = engine.raw.table(spec)
        assert fresh is not None
        target = _target(spec, engine.raw.applied(spec, fresh), column, action)
        return rewrite_columns(fresh, target, change, engine.raw.options)

    try:
        read, wrote, rows = with_retries(
            attempt,
            retryable=lambda exc: isinstance(exc, CommitFailedError),
            attempts=REWRITE_ATTEMPTS,
            what=f"computed column change of {archive}",
        )
    except Exception:
        _end(engine, spec, intent, "failed before its switch; nothing was changed", actor)
        raise
    checkpoint("column_switch", archive)
    return _after_switch(engine, spec, intent, read, wrote, rows, actor)


def _after_switch(
    engine: Engine,
    spec: SourceSpec,
    intent: Intent,
    read: int,
    wrote: int,
    rows: int,
    actor: str,
) -> ColumnChange:
    """The rest of a change whose switch landed at `wrote` (having read `read`): upsert the
    rows inserted in between with the new formulas, then clear the intent."""
    column, action = intent.what["column"], ColumnAction(intent.what["action"])
    result = ColumnChange(spec.name, column, action, wrote, rows)
    result.reingested = refresh_inserted(
        engine.raw.uri(spec), engine.raw.options, engine.raw.applied(spec), read, wrote
    )
    if action is ColumnAction.SET_FORMULA:
        result.recomputed = [
            r.name
            for r in engine.catalog.first_levels(spec.name)
            if column in {a.column for a in r.aggregations}
        ]
    _end(engine, spec, intent, f"committed at version {wrote}", actor)
    log.info(
        "'%s': %s of computed column '%s' committed at version %d (%d rows re-ingested)",
        spec.name,
        action.value,
        column,
        wrote,
        result.reingested,
    )
    return result


def finish_column_change(
    engine: Engine, spec: SourceSpec, intent: Intent, *, actor: str
) -> ColumnChange | None:
    """Finish the column change `intent` an interrupted process left on `spec`: what it did,
    when its switch landed; None when it never did (the intent is cleared, nothing changed)."""
    switch = switch_commit(engine.raw.uri(spec), engine.raw.options, iso_utc(intent.began_at))
    if switch is None:
        _end(engine, spec, intent, "interrupted before its switch; nothing was changed", actor)
        return None
    read, wrote, rows = switch
    return _after_switch(engine, spec, intent, read, wrote, rows, actor)


def _end(engine: Engine, spec: SourceSpec, intent: Intent, how: str, actor: str) -> None:
    encoded = intent.encode()
    engine.states.update(
        spec.name,
        lambda s: replace(s, intent=None) if s.intent == encoded else None,
        reason=f"{intent.what['action']} of '{intent.what['column']}' {how}",
        actor=actor,
    )


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
