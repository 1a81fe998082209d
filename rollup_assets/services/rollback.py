"""Rollback: give the cells a recompute job changed back the generation it replaced.

A recompute flips its cells to a new generation in one pointer commit; the generations it
superseded stay in the row table for the generation retention (`model.keeping`). A rollback reads
the pointer table as it was just before that flip and restores those pointers on exactly the
job's cells in one pointer commit (the moment readers switch back), then records itself as a
completed `Rollback` job naming the job it undid, together with the chain propagation jobs its
cells cause one level up: the levels above are recomputed like after any change. Then it
publishes the rollup's surface table, as a recompute does after its flip.

A correction flips difference pointers (`rollup_assets.resources.genmap`): rolling it back restores
each of its cells' previous difference pointer, which hides its difference rows again. They stay in
the table like any superseded rows: a later correction of such a cell flips a pointer past them and
shows them again, which brings the cell back to its source (the undone change included), as a
recompute would; that correction has the levels above aggregated again on those cells rather
than corrected with its own change alone (`services.correction.shown_again`).

It is fenced and records its intent first: it reads the rollup's fence before anything else,
records itself as a Swapping `Rollback` job, and commits the pointers only if the fence has not
moved (the commit moves it on, so a recompute that read the rows the rollback changes cannot
flip afterwards). A rollback interrupted between its intent and its completion is recovered by
running it again or by the sensor (`recover_rollback`): the fence is moved first, so the
interrupted process can no longer commit, then the pointer table's log tells whether its commit
landed: if it did, the rollback is completed as it would have completed itself; if not, it
failed, having changed nothing.

It refuses, changing nothing, when it cannot restore exactly what readers saw before the flip:
an unknown job, a job that flipped nothing, a flip older than the generation retention allows
(checked again at the commit) or whose superseded rows are gone, cells a later job changed
again, a job already rolled back, a rollup with a recompute in flight or frozen over those
cells, or another action that moved the fence meanwhile.
"""

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import by_start_and_entity
from rollup_assets.faults import checkpoint
from rollup_assets.model.cells import Cells
from rollup_assets.model.durations import format_duration
from rollup_assets.model.errors import FenceMovedError, RollbackRefusedError
from rollup_assets.model.jobs import Job, JobState, Trigger, new_job_id
from rollup_assets.model.operations import Operation
from rollup_assets.model.placement import cells_of, job_scope
from rollup_assets.model.propagation import propagation_jobs
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, iso_utc
from rollup_assets.resources.flips import missing_pointers, newer_pointers, restored_pointers
from rollup_assets.resources.rollup_reads import Unknown
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.resources.visible_rows import covered_mask
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface import publish


@dataclass(frozen=True)
class RollbackOutcome:
    """What a rollback did: its ledger job, the job it undid, the cells given back, the
    generations active on them again, the pointer table version it committed, and the jobs it
    queued one level up."""

    job: Job
    undone: Job
    cells: Cells
    generations: tuple[int, ...]
    version: int
    propagated: list[Job]


def rollback(
    engine: Engine,
    rollup: str,
    job_id: str,
    *,
    run_id: str = "",
    now: datetime | None = None,
) -> RollbackOutcome:
    """Undo the flip of recompute job `job_id` of `rollup` on exactly its cells (see the module
    docstring); raises RollbackRefusedError, having changed nothing, when it cannot."""
    t0 = time.monotonic()
    started = now or datetime.now(UTC)
    spec = engine.catalog.rollup(rollup)
    what = f"rollback of job {job_id} of '{spec.name}'"
    # A rollback of this job that an earlier process left unfinished: finish it first (its
    # effect may have landed without its record: then that is this command's outcome).
    for left in engine.ledger.snapshot().for_rollup(spec.name):
        if left.undoes == job_id and left.state is JobState.SWAPPING:
            recovered = recover_rollback(engine, spec, left, why=f"{what} run again")
            if recovered is not None:
                return recovered
    # The fence first: an action that moves it after this makes the commit below fail.
    fence = engine.rollups.fence(spec)
    state = engine.require_activated(spec)
    snap = engine.ledger.snapshot()
    job = snap.jobs.get(job_id)
    if job is None or job.rollup != spec.name:
        raise RollbackRefusedError(f"{what}: no such job of '{spec.name}' in the ledger")
    if job.trigger is Trigger.ROLLBACK:
        raise RollbackRefusedError(
            f"{what}: it is itself a rollback (of job {job.undoes}); recompute the range instead"
        )
    if job.state is not JobState.COMPLETED or job.generation is None or not job.windows_processed:
        raise RollbackRefusedError(
            f"{what}: the job has not flipped a generation (state {job.state.value}, "
            f"{job.windows_processed or 0} bucket(s) flipped); there is nothing to undo"
        )
    done_before = [
        j
        for j in snap.for_rollup(spec.name)
        if j.undoes == job_id and j.state is JobState.COMPLETED
    ]
    if done_before:
        raise RollbackRefusedError(f"{what}: already rolled back by job {done_before[0].job_id}")
    # Retention dropped the rows the rollback would show again (and their pointers): refused,
    # like any other work over dropped buckets.
    engine.require_kept(spec, job.windows)
    running = snap.active(spec.name)
    if running:
        raise RollbackRefusedError(
            f"{what}: job {running[0].job_id} is recomputing '{spec.name}' now; "
            "retry when it has finished"
        )
    retention = engine.generation_retention
    keeping = engine.keeping
    # A sweep removes the replaced rows once the job's pointers are older than the retention,
    # and a rollback holds no writer slot: it keeps a margin from that edge (`model.keeping`).
    flipped_at = job.finished_at or job.created_at
    if not keeping.may_roll_back(flipped_at, started):
        raise RollbackRefusedError(
            f"{what}: it flipped at {iso_utc(flipped_at)}, longer ago than the generation "
            f"retention ({format_duration(retention)}, ROLLUPS_GENERATION_RETENTION_HOURS): the "
            "generations it replaced may have been swept"
        )

    store = engine.rollups
    flip_version = store.committed_by(spec, job_id, Operation.FLIP)
    rows_version = store.committed_by(spec, job_id, Operation.RECOMPUTE)
    if flip_version is None or rows_version is None:
        raise RollbackRefusedError(
            f"{what}: the pointer or row table's log no longer holds the job's commits"
        )
    at_flip = store.pointers_at(spec, flip_version)
    flipped = at_flip.filter(
        pc.and_(
            pc.equal(at_flip["job_id"], job_id), pc.equal(at_flip["generation"], job.generation)
        )
    )
    if flipped.num_rows == 0:
        raise RollbackRefusedError(
            f"{what}: its flip (pointer table version {flip_version}) holds none of its pointers"
        )
    oldest = min(flipped["flipped_at"].to_pylist())
    if not keeping.may_roll_back(oldest, started):
        raise RollbackRefusedError(
            f"{what}: its pointers were flipped at {iso_utc(oldest)}, too close to or past the "
            f"generation retention ({format_duration(retention)}): the sweep may be removing the "
            "generations it replaced"
        )
    before = store.pointers_at(spec, flip_version - 1)
    cells = _cells(flipped)
    if state.frozen_until is not None:
        frozen = [w for w in cells.windows if w.end <= state.frozen_until]
        if frozen:
            raise RollbackRefusedError(
                f"{what}: '{spec.name}' is frozen until {iso_utc(state.frozen_until)}, and "
                f"{len(frozen)} of the job's bucket(s) end by then (first {frozen[0]})"
            )

    current = store.snapshot(spec)
    _require_unchanged(what, current.pointers, flipped, job.generation)
    restored = restored_pointers(current.pointers, before, flipped, started)
    spans = list(cells.windows)
    try:
        then = Snapshot(store.table_at(spec, rows_version), before, None)
        # Which rows are there, not what a cell adds up to: a cell a fold cannot know is not
        # aggregated again from the level below (`Unknown.BLANK`).
        seen = _cells_rows(
            store.read_arrow(spec, spans, snapshot=then, unknown=Unknown.BLANK), flipped
        )
    except OSError as exc:
        raise RollbackRefusedError(
            f"{what}: the row table as the job found it can no longer be read ({exc}); vacuum "
            f"keeps files for at least the generation retention ({format_duration(retention)})"
        ) from None
    back = _cells_rows(
        store.read_arrow(
            spec, spans, snapshot=Snapshot(current.table, restored, None), unknown=Unknown.BLANK
        ),
        flipped,
    )
    if seen.to_pylist() != back.to_pylist():
        gens = sorted(set(seen["generation"].to_pylist()))
        raise RollbackRefusedError(
            f"{what}: the rows of generation(s) {gens} it replaced are no longer all in the table "
            f"(swept: the generation retention is {format_duration(retention)})"
        )

    generation = job.generation
    generations = tuple(sorted(set(seen["generation"].to_pylist())))

    def change(latest: pa.Table) -> pa.Table:
        # Another writer may have flipped since the check above: check again on what is
        # current, and again that the sweep cannot have reached the rows given back.
        _require_unchanged(what, latest, flipped, generation)
        if not keeping.may_roll_back(oldest, datetime.now(UTC)):
            raise RollbackRefusedError(
                f"{what}: its pointers, flipped at {iso_utc(oldest)}, reached the edge of the "
                f"generation retention ({format_duration(retention)}) during the rollback"
            )
        return restored_pointers(latest, before, flipped, started)

    windows, entities, exact = job_scope(cells)
    intent = Job(
        rollup=spec.name,
        trigger=Trigger.ROLLBACK,
        windows=windows,
        entities=entities,
        cells=exact,
        state=JobState.SWAPPING,
        job_id=new_job_id(),
        rows_processed=back.num_rows,
        source_archive=spec.name,
        run_id=run_id or None,
        created_at=started,
        started_at=started,
        technique="rollback",
        plan=(
            f"undid job {job_id}: generation {job.generation} replaced by generation(s) "
            f"{list(generations)} on its cells"
        ),
        undoes=job_id,
    )
    engine.ledger.record([intent])
    checkpoint("rollback_intent", spec.name)
    try:
        version = engine.rollups.restore_pointers(
            spec, change, job_id=intent.job_id, undoes=job_id, fence=fence
        )
    except BaseException as exc:
        engine.ledger.record(
            [intent.next(state=JobState.FAILED, error=str(exc), finished_at=datetime.now(UTC))]
        )
        if isinstance(exc, FenceMovedError):
            raise RollbackRefusedError(
                f"{what}: another action changed '{spec.name}' while the rollback checked it "
                "(a recompute's flip, a rewind, retention or a disable); nothing was changed: "
                "run it again"
            ) from None
        raise
    checkpoint("rollback_commit", spec.name)
    return _complete(engine, spec, intent, job, version, generations, t0)


def _complete(
    engine: Engine,
    spec: RollupSpec,
    intent: Job,
    undone: Job,
    version: int,
    generations: tuple[int, ...],
    t0: float,
) -> RollbackOutcome:
    """Record a rollback whose pointer commit landed (at `version`) as completed, with the jobs
    its cells cause one level up, and publish the surface."""
    cells = cells_of(spec, intent)
    done = intent.next(
        state=JobState.COMPLETED,
        windows_processed=len(cells),
        source_version=version,
        finished_at=datetime.now(UTC),
        duration_ms=int((time.monotonic() - t0) * 1000),
    )
    # No row-table commit carries the change (the rows were already there): the jobs above name
    # no source version, so nothing reads a commit's rows as theirs (held writes list no count).
    propagated = propagation_jobs(engine.catalog, spec, cells, None, engine.states.all())
    engine.ledger.record([done, *propagated])
    publish(engine, spec)  # plain readers of the surface table see the restored values too
    return RollbackOutcome(done, undone, cells, generations, version, propagated)


def recover_rollback(
    engine: Engine, spec: RollupSpec, intent: Job, *, why: str
) -> RollbackOutcome | None:
    """Finish rollback `intent` (Swapping) that a process left unfinished: move the fence so
    that process can no longer commit, then complete the rollback if its pointer commit landed
    (its outcome), or record it failed, having changed nothing (None)."""
    t0 = time.monotonic()
    engine.rollups.move_fence(spec, f"recover rollback {intent.job_id}", job_id=intent.job_id)
    version = engine.rollups.committed_by(spec, intent.job_id, Operation.ROLLBACK)
    current = engine.ledger.job(intent.job_id)
    if current is None or current.state is not JobState.SWAPPING:
        return None  # finished meanwhile by whoever else found it
    if version is None:
        engine.ledger.record(
            [
                current.next(
                    state=JobState.FAILED,
                    error=f"interrupted before its pointer commit; nothing was changed ({why})",
                    finished_at=datetime.now(UTC),
                )
            ]
        )
        return None
    undone = engine.ledger.job(intent.undoes or "")
    assert undone is not None, intent
    return _complete(
        engine, spec, current, undone, version, _active_after(engine, spec, current, version), t0
    )


def _active_after(engine: Engine, spec: RollupSpec, job: Job, version: int) -> tuple[int, ...]:
    """The generations active on `job`'s cells in the pointer table at `version` (0 where no
    pointer covers a cell)."""
    restored = engine.rollups.pointers_at(spec, version).to_pylist()
    found = set()
    for window, scope in cells_of(spec, job):
        for entity in sorted(scope) if scope is not None else [None]:
            covering = [
                p["generation"]
                for p in restored
                if p["bucket_start"] == window.start
                and (p["entity_id"] is None or p["entity_id"] == entity)
            ]
            found.add(max(covering, default=0))
    return tuple(sorted(found))


def _cells(flipped: pa.Table) -> Cells:
    """The cells a flip's pointers cover (a global pointer: its bucket for every entity)."""
    return Cells.collect(
        (
            (Window(p["bucket_start"], p["bucket_end"]), None if e is None else frozenset([e]))
            for p in flipped.to_pylist()
            for e in [p["entity_id"]]
        ),
        limit=None,
    )


def _require_unchanged(what: str, current: pa.Table, flipped: pa.Table, generation: int) -> None:
    later = newer_pointers(current, flipped, generation)
    if later.num_rows:
        jobs = sorted({j for j in later["job_id"].to_pylist() if j})
        raise RollbackRefusedError(
            f"{what}: {later.num_rows} of its cells were changed again since, by job(s) "
            f"{', '.join(jobs)}; roll those back first (newest first)"
        )
    gone = missing_pointers(current, flipped)
    if gone.num_rows:
        raise RollbackRefusedError(
            f"{what}: {gone.num_rows} of its pointers are no longer in the pointer table (a "
            "rewind or a delete removed them); there is nothing to undo there"
        )


def _cells_rows(rows: pa.Table, flipped: pa.Table) -> pa.Table:
    """The rows of the cells `flipped` covers, in a fixed order."""
    picked = rows.filter(covered_mask(rows, flipped))
    return by_start_and_entity(picked)
