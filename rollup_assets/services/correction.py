"""Corrections: a change of the source applied to a rollup's cells as differences.

A late or corrected reading changes a few rows of the raw archive. Its correction never reads
the cells it corrects, at any level: from the change data feed's rows of the job's commits (the
old values of updated and deleted rows, the new values of updated and inserted ones) it makes
one difference row per changed cell of the level (`compute.folding.difference_rows`), which the
job writes at its generation and makes visible with one difference flip. Reads fold them into
the cells' bases (`compute.folding.fold`); maintenance folds them into new bases.

The same rows correct every level of the chain, a source row's value being a value of one cell
at each: the run that corrected a level hands the rows it applied to the level above
(`SourceChange`), and a correction queued up the chain names them (its parts: the commits and
the first level's cells whose rows they changed), so the sensors can read them again when the
run died first.

Exactly once. Each commit's change to a cell is in one part of one job (`Job.parts`), and a cell
whose state a job aggregated from its source holds the changes that source version held: a
correction skips, per cell, the changes of commits at or before the newest such version
(`Absorbed`: a forward run's close, a recompute, a first fill; up the chain, versions of the
pointer table below, from which a change showed there).
"""

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np
import pyarrow as pa

from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.folding import (
    RowCells,
    bucket_bounds,
    difference_rows,
    instants,
)
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import ChangePart, Job, JobState, LedgerSnapshot, Trigger
from rollup_assets.model.placement import buckets_of_each, cells_of
from rollup_assets.model.specs import ENTITY_COLUMN, Catalog, RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.commit_changes import CHANGE_TYPE, COMMIT_VERSION
from rollup_assets.resources.delta_tables import read_commit
from rollup_assets.resources.rollup_table import cells_of_rows
from rollup_assets.resources.visible_rows import base_generation
from rollup_assets.services.engine import Engine

log = logging.getLogger(__name__)
# The technique a job that wrote differences records.
DIFFERENCE = "difference"


@dataclass(frozen=True)
class SourceChange:
    """The source rows a correction applied to a level (their change type and commit, their
    times in `time_column`), as the parts of the level above's correction will name them: the
    commits and the first level's cells of those rows. `seen_at` is set once the level's flip
    made them visible (its pointer table version)."""

    rows: pa.Table
    time_column: str
    parts: tuple[ChangePart, ...]

    def shown_at(self, version: int) -> "SourceChange":
        return replace(self, parts=tuple(replace(p, seen_at=version) for p in self.parts))


@dataclass(frozen=True)
class Correction:
    """What a correction of a level found: its difference rows (to write), the cells they
    change, the source rows applied (for the level above), and the rows it read."""

    rows: pa.Table
    changed: Cells
    applied: SourceChange
    change_rows: int
    skipped: int  # change rows a cell's newer aggregation already held

    @property
    def reason(self) -> str:
        held = f"; {self.skipped} already held by a newer aggregation" if self.skipped else ""
        return (
            f"{self.rows.num_rows} cell(s) corrected from {self.change_rows} change row(s) as "
            f"differences, no stored cell read{held}"
        )


def first_level(catalog: Catalog, spec: RollupSpec) -> RollupSpec:
    """The chain's first level below (or at) `spec`: the rollup over a raw or time-range
    archive, whose cells a correction's parts name."""
    while spec.source in catalog.rollups:
        spec = catalog.rollup(spec.source)
    return spec


def correct(
    engine: Engine, spec: RollupSpec, job: Job, ready: Cells, below: SourceChange | None = None
) -> Correction:
    """The correction `job` makes to its `ready` cells of `spec` (see the module): from the
    rows `below` handed up when given (the run that queued the job corrected the level below),
    else from the change feed. Raises ChangeFeedGone when the change feed no longer holds them."""
    assert job.parts is not None, job
    root = first_level(engine.catalog, spec)
    source = engine.catalog.archive(root.source)
    time_column = source.time_column
    parts = job.parts_within(ready.windows) or ()
    # The rows the run below applied, when every part of this job came from it (its flip's
    # version identifies them); a job merged with others since reads the change feed.
    handed = below is not None and {(p.commits, p.seen_at) for p in job.parts} <= {
        (p.commits, p.seen_at) for p in below.parts
    }
    rows = below.rows if handed and below is not None else _read(engine, source, root, parts)
    read = rows.num_rows
    rows, seen = _rows_of(rows, parts, root, time_column)
    mine = Bucketing.of(spec)
    cells = RowCells.of(rows, time_column, mine)
    absorbed = Absorbed.of(
        engine.ledger.snapshot(),
        spec,
        engine.states.deleted_at().get(spec.name),
        newer_than=int(seen.min()) - 1 if len(seen) else None,
    )
    new = _not_absorbed(cells, seen, absorbed)
    skipped = int((~new).sum())
    kept = rows.filter(pa.array(new & _within(cells, ready)))
    differences = difference_rows(kept, spec, time_column, CHANGE_TYPE, mine)
    changed = cells_of_rows(differences)
    # Every row handed up applied here too (the usual case up a chain): the same rows, so the
    # same parts name them, worked out once for the whole chain.
    if handed and below is not None and kept.num_rows == below.rows.num_rows:
        named = tuple(replace(p, seen_at=None) for p in below.parts)
    else:
        named = _parts_of(kept, root, time_column)
    applied = SourceChange(kept, time_column, named)
    return Correction(differences, changed, applied, read, skipped)


def _read(engine: Engine, source, root: RollupSpec, parts: Sequence[ChangePart]) -> pa.Table:
    """The change rows of `parts` from the change feed: each part's commits, in its cells'
    spans (rows of other cells are dropped by `_rows_of`)."""
    tables = []
    for part in parts:
        spans = merge_windows(list(part.cells.windows))
        for first, last in _runs(part.commits):
            rows, _ = engine.raw.changes(source, first - 1, last, spans, part.cells.entities)
            tables.append(rows)
    if not tables:
        return engine.raw.changes(source, 0, 0, [], frozenset())[0]
    return pa.concat_tables(tables, promote_options="default")


def _runs(commits: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted commits as runs of consecutive versions: [(first, last), ...]."""
    out: list[tuple[int, int]] = []
    for c in sorted(set(commits)):
        if out and c == out[-1][1] + 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return out


def _rows_of(
    rows: pa.Table, parts: Sequence[ChangePart], root: RollupSpec, time_column: str
) -> tuple[pa.Table, np.ndarray]:
    """The change rows that belong to one of `parts` (their commit among the part's, their
    first-level cell among its cells), and for each the version from which it counts: its commit
    at the first level, the part's `seen_at` up the chain."""
    if rows.num_rows == 0:
        return rows, np.zeros(0, dtype=np.int64)
    cells = RowCells.of(rows, time_column, Bucketing.of(root))
    commits = rows[COMMIT_VERSION].to_numpy(zero_copy_only=False).astype(np.int64)
    keep = np.zeros(rows.num_rows, dtype=bool)
    seen = np.zeros(rows.num_rows, dtype=np.int64)
    for part in parts:
        whole, named = _keys(part, root)
        mine = ~keep & np.isin(commits, np.array(part.commits, dtype=np.int64))
        if not mine.any():
            continue
        mine &= cells.each(_in_cells(whole, named), bool)
        keep |= mine
        seen[mine] = commits[mine] if part.seen_at is None else part.seen_at
    return rows.filter(pa.array(keep)), seen[keep]


def _in_cells(
    whole: frozenset[datetime], named: frozenset[tuple[datetime, str]]
) -> Callable[[datetime, str], bool]:
    """Whether a cell (bucket start, entity) is among those `_keys` gave."""
    return lambda start, entity: start in whole or (start, entity) in named


def _keys(
    part: ChangePart, root: RollupSpec
) -> tuple[frozenset[datetime], frozenset[tuple[datetime, str]]]:
    """The first-level cells of `part` (its cells' spans cut into `root`'s buckets): the
    buckets it names for every entity, and the (bucket start, entity) cells."""
    return _first_level_keys(part.cells, root)


# Every level of a chain filters the change rows handed up by the same parts' cells.
@functools.lru_cache(maxsize=16)
def _first_level_keys(
    cells: Cells, root: RollupSpec
) -> tuple[frozenset[datetime], frozenset[tuple[datetime, str]]]:
    whole: set[datetime] = set()
    named: set[tuple[datetime, str]] = set()
    spans = [span for span, _ in cells]
    for (_, scope), buckets in zip(cells, buckets_of_each(root, spans), strict=True):
        for w in buckets:
            if scope is None:
                whole.add(w.start)
            else:
                named.update((w.start, e) for e in scope)
    return frozenset(whole), frozenset(named)


@dataclass(frozen=True)
class Absorbed:
    """Per cell of a level, the newest source version a completed aggregation of it read (a
    forward run, a recompute, a first fill; not one a rollback undid): a correction's changes
    counting from that version or before are in the cell already."""

    buckets: dict[datetime, int]  # every entity of the bucket
    cells: dict[tuple[datetime, str], int]

    @classmethod
    def of(
        cls,
        snapshot: LedgerSnapshot,
        spec: RollupSpec,
        since: datetime | None = None,
        newer_than: int | None = None,
    ) -> "Absorbed":
        """From the completed aggregations of `spec` in the ledger created at or after `since`
        (the rollup's last deletion: the jobs of a deleted rollup read tables that are gone,
        whose versions count again from 0 once it is declared again) that read a source version
        above `newer_than`. An aggregation that read `newer_than` or before holds no change
        counting from after it, so a correction whose changes all count from later leaves the
        older ones out (a first fill alone names every bucket of the archive)."""
        buckets: dict[datetime, int] = {}
        cells: dict[tuple[datetime, str], int] = {}
        jobs = [j for j in snapshot.for_rollup(spec.name) if since is None or j.created_at >= since]
        # A rolled-back job's cells show what they showed before it again.
        undone = {j.undoes for j in jobs if j.undoes and j.state is JobState.COMPLETED}
        for job in jobs:
            v = job.read_version
            if v is None or job.corrects or job.state is not JobState.COMPLETED:
                continue
            if newer_than is not None and v <= newer_than:
                continue
            if job.job_id in undone:
                continue
            for w, scope in cells_of(spec, job):
                if scope is None:
                    buckets[w.start] = max(buckets.get(w.start, -1), v)
                else:
                    for e in scope:
                        cells[(w.start, e)] = max(cells.get((w.start, e), -1), v)
        return cls(buckets, cells)

    def version(self, start: datetime, entity: str) -> int:
        return max(self.buckets.get(start, -1), self.cells.get((start, entity), -1))


def _not_absorbed(cells: RowCells, seen: np.ndarray, absorbed: Absorbed) -> np.ndarray:
    """Per row (its cell of this level in `cells`, the version its change counts from in
    `seen`), whether a newer aggregation of its cell does not hold its change yet."""
    if not absorbed.buckets and not absorbed.cells:
        return np.ones(len(seen), dtype=bool)
    return seen > cells.each(absorbed.version, np.int64)


def _within(cells: RowCells, ready: Cells) -> np.ndarray:
    """Per row (its cell of this level in `cells`), whether it is in one of the `ready`
    cells."""
    scopes = {w.start: scope for w, scope in ready}
    return cells.each(
        lambda s, e: s in scopes and (scopes[s] is None or e in scopes[s]),  # type: ignore[operator]
        bool,
    )


def _parts_of(rows: pa.Table, root: RollupSpec, time_column: str) -> tuple[ChangePart, ...]:
    """The parts naming `rows`: per commit, the first-level cells of its rows."""
    if rows.num_rows == 0:
        return ()
    starts, ends = bucket_bounds(rows[time_column], Bucketing.of(root))
    cells = (
        pa.table(
            {
                "commit": rows[COMMIT_VERSION],
                "start": pa.array(starts, pa.int64()),
                "end": pa.array(ends, pa.int64()),
                ENTITY_COLUMN: rows[ENTITY_COLUMN],
            }
        )
        .group_by(["commit", "start", "end"])
        .aggregate([(ENTITY_COLUMN, "distinct")])
    )
    windows = {
        s: Window(a, b)
        for s, a, b in zip(
            cells["start"].to_pylist(),
            instants(cells["start"].to_numpy()),
            instants(cells["end"].to_numpy()),
            strict=True,
        )
    }
    by_commit: dict[int, list[tuple[Window, frozenset[str]]]] = {}
    for c, s, entities in zip(
        cells["commit"].to_pylist(),
        cells["start"].to_pylist(),
        cells[f"{ENTITY_COLUMN}_distinct"].to_pylist(),
        strict=True,
    ):
        by_commit.setdefault(c, []).append((windows[s], frozenset(entities)))
    return tuple(
        ChangePart((c,), Cells.collect(items, limit=None)) for c, items in sorted(by_commit.items())
    )


def shown_again(engine: Engine, spec: RollupSpec, cells: Cells, generation: int) -> Cells:
    """The cells among `cells` on which a flip of differences at `generation` shows again
    differences a completed rollback hid: those of a rolled-back difference job, newer than the
    cell's base. A cell's differences are visible up to its difference pointer, so the flip
    brings such a cell back to its source (the rolled-back change included), while the level
    above still holds what the rollback propagated: it must be aggregated again there, not
    corrected with this flip's change alone."""
    snap = engine.ledger.snapshot()
    rolled_back = [
        snap.jobs.get(j.undoes or "")
        for j in snap.for_rollup(spec.name)
        if j.trigger is Trigger.ROLLBACK and j.state is JobState.COMPLETED
    ]
    hidden: dict[datetime, list[tuple[int, frozenset[str] | None]]] = {}
    for j in rolled_back:
        if j is None or j.technique != DIFFERENCE or j.generation is None:
            continue
        if j.generation >= generation:
            continue
        for window, scope in cells_of(spec, j):
            hidden.setdefault(window.start, []).append((j.generation, scope))
    if not hidden:
        return Cells(())
    keys: list[tuple[Window, str | None, int]] = []
    for window, scope in cells:
        for gen, theirs in hidden.get(window.start, []):
            if scope is None and theirs is None:
                keys.append((window, None, gen))
            else:
                named = scope if theirs is None else theirs if scope is None else scope & theirs
                keys += [(window, e, gen) for e in sorted(named or ())]
    if not keys:
        return Cells(())
    rows = pa.table(
        {
            "bucket_start": pa.array([w.start for w, _, _ in keys], TS),
            ENTITY_COLUMN: pa.array([e for _, e, _ in keys], pa.string()),
        }
    )
    base = base_generation(rows, engine.rollups.snapshot(spec).pointers)
    return Cells.collect(
        (
            (w, None if e is None else frozenset([e]))
            for (w, e, gen), b in zip(keys, base.tolist(), strict=True)
            if gen > b
        ),
        limit=None,
    )


def undone_below(engine: Engine, spec: RollupSpec, job: Job) -> str | None:
    """The job of the level below whose flip showed a part of correction `job` and which a
    rollback has undone since (None: none was): its change no longer holds below, so the
    cells are aggregated again from the level below as it is, not corrected with it."""
    source = engine.catalog.archive(spec.source)
    if not isinstance(source, RollupSpec) or not job.parts:
        return None
    undone = {
        j.undoes
        for j in engine.ledger.snapshot().for_rollup(source.name)
        if j.trigger is Trigger.ROLLBACK and j.state is JobState.COMPLETED and j.undoes
    }
    if not undone:
        return None
    uri = engine.rollups.genmap_uri(source)
    for version in sorted({p.seen_at for p in job.parts if p.seen_at is not None}):
        actions = read_commit(uri, version, engine.warehouse.storage_options)
        info: dict = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if info.get("rollups.job_id") in undone:
            return str(info["rollups.job_id"])
    return None
