"""Bringing the levels above up to date inside the run that changed a level.

A run that writes level N (a recompute, a forward close or an open-bucket refresh) leaves work
for the levels above: recompute jobs queued by chain propagation in the ledger commit that
completed it, and open buckets (or newly closable buckets) that now contain changed data.
Launching one run per level would cost every hop a new process, a new Spark session and a sensor
interval, so the run carries on itself, level by level up to the top, whenever it can:

  * it takes the level's pool slot first (the one-writer-per-rollup lock every run writing that
    rollup holds), without waiting: if another run holds it, the level is left to the sensors;
  * a queued job must still be pending and not launched by the sensor meanwhile, the rollup
    activated, and no forward run of it in flight; otherwise it is left alone. Neither a job
    nor forward work over buckets that a refresh of the level below aggregates again is run
    (`Trigger.REFRESH`): the sensors launch it once the refresh is done.

The chain asks the orchestrator about other runs through a `RunGate` (the Dagster one holds the
level's pool slot and looks up runs by their tags). Whatever is left is drained by the sensors
exactly as before, so the ledger, not this shortcut,
stays the source of truth: a run that dies mid-chain leaves Running jobs owned by a dead run,
which the retroactive-write sensor fails and queues again.
"""

import logging
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol

from pyspark.sql import SparkSession

from rollup_assets.model.errors import RecomputeAbortedError
from rollup_assets.model.forward import forward_work
from rollup_assets.model.jobs import Job, JobState, refreshed_first
from rollup_assets.model.progress import Progress
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.services.correction import SourceChange
from rollup_assets.services.engine import Engine
from rollup_assets.services.forward import run_forward
from rollup_assets.services.recompute import run_recompute
from rollup_assets.services.run_outcome import RunOutcome

log = logging.getLogger(__name__)


class RunGate(Protocol):
    """What a run needs to know about the other runs before it writes a level."""

    def hold(self, spec: RollupSpec) -> AbstractContextManager[bool]:
        """Hold `spec`'s one-writer slot while the context is open, if it is free right now;
        the context yields whether it is held."""
        ...

    def launched_for(self, job_id: str) -> bool:
        """Has a run already been launched for this job?"""
        ...

    def forward_in_flight(self) -> set[str]:
        """The rollups a forward run is writing now."""
        ...


def _queued(outcome: RunOutcome) -> list[tuple[Job, SourceChange | None]]:
    """The jobs `outcome` queued one level up, each with the source rows it applied (a
    correction's; None otherwise)."""
    return [(job, outcome.change) for job in outcome.propagated]


class Chain:
    """One run's walk up the chain from the level it wrote."""

    def __init__(
        self,
        engine: Engine,
        spark: SparkSession,
        gate: RunGate,
        run_id: str,
        now: datetime,
        log_progress: Callable[[str], None] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.engine = engine
        self.progress = progress  # hears of each level's buckets done
        self.spark = spark
        self.gate = gate
        self.run_id = run_id
        self.now = now
        self.say = log_progress or log.info

    def run(self, spec: RollupSpec, outcome: RunOutcome) -> Iterator[tuple[RollupSpec, RunOutcome]]:
        """Every level above `spec` this run brought up to date, with what it did, in order;
        yielded while the level's pool slot is still held, so the caller can report it."""
        # Each level once: what it wrote in this run (both lanes), and the jobs it queued above,
        # each with the source rows the run that queued it applied, when it was a correction (a
        # correction above applies the same rows without reading them again:
        # `services.correction`).
        queue = deque([(spec, list(outcome.buckets), _queued(outcome))])
        while queue:
            level, changed, propagated = queue.popleft()
            for dep in self.engine.catalog.dependents(level.name):
                wrote: list[Window] = []
                queued: list[tuple[Job, SourceChange | None]] = []
                for done in self._bring_up(dep, changed, propagated):
                    yield dep, done
                    wrote += done.buckets
                    queued += _queued(done)
                if wrote:
                    queue.append((dep, wrote, queued))

    def _bring_up(
        self,
        spec: RollupSpec,
        changed: list[Window],
        propagated: list[tuple[Job, SourceChange | None]],
    ) -> Iterator[RunOutcome]:
        """Under `spec`'s pool slot: its queued recomputes (each given the source rows the run
        that queued it applied, when known), then its forward work."""
        with self.gate.hold(spec) as held:
            if not held:
                self.say(f"{spec.name}: another run writes it; the sensors take it from here")
                return
            states = self.engine.states.all()
            state = states.get(spec.name)
            if state is None or state.status is not ArchiveStatus.ACTIVATED:
                return  # pending work waits for activation
            for job, below in [(j, c) for j, c in propagated if j.rollup == spec.name]:
                done = self._recompute(spec, job, below)
                if done is not None:
                    yield done
            forward = self._forward(spec, changed, states)
            if forward is not None:
                yield forward

    def _recompute(
        self, spec: RollupSpec, job: Job, below: SourceChange | None
    ) -> RunOutcome | None:
        current = self.engine.ledger.job(job.job_id)
        if current is None or current.state is not JobState.PENDING:
            return None  # coalesced or taken meanwhile
        if self.gate.launched_for(job.job_id):
            return None  # the sensor launched a run for it already
        if refreshed_first(job.windows, self._refreshing(spec)):
            return None  # it reads cells a refresh below aggregates again: the sensors wait
        self.say(f"{spec.name}: chain propagation continues in this run (job {job.job_id})")
        try:
            return run_recompute(
                self.engine,
                self.spark,
                spec,
                current,
                run_id=self.run_id,
                log_progress=self.say,
                progress=self.progress,
                below=below,
            )
        except RecomputeAbortedError as exc:
            self.say(f"{spec.name}: {exc}")
            return None

    def _refreshing(self, spec: RollupSpec) -> list[Window]:
        """The buckets of `spec`'s source a refresh pending or in flight aggregates again."""
        if spec.source not in self.engine.catalog.rollups:
            return []
        return self.engine.ledger.snapshot().refreshing(spec.source)

    def _forward(
        self, spec: RollupSpec, changed: list[Window], states: dict[str, ArchiveState]
    ) -> RunOutcome | None:
        if spec.name in self.gate.forward_in_flight():
            return None  # the forward sensor launched a run for it already
        state = states.get(spec.name)
        if state is None:
            return None
        work = forward_work(
            self.engine.catalog,
            spec,
            state,
            self.now,
            states,
            lambda bucket: any(w.overlaps(bucket) for w in changed),
        )
        work = work.without(self._refreshing(spec))
        if not work:
            return None
        return run_forward(
            self.engine,
            self.spark,
            spec,
            requested=work.buckets,
            now=self.now,
            run_id=self.run_id,
            log_progress=self.say,
            progress=self.progress,
        )
