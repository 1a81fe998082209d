"""Bringing the levels above up to date inside the run that changed a level.

A run that writes level N (a recompute, a forward close or an open-bucket refresh) leaves work
for the levels above: recompute jobs queued by chain propagation in the ledger commit that
completed it, and open buckets (or newly closable buckets) that now contain changed data.
Launching one run per level would cost every hop a new process, a new Spark session and a sensor
interval, so the run carries on itself, level by level up to the top, whenever it can:

  * it takes the level's pool slot first (the one-writer-per-rollup lock every run writing that
    rollup holds), without waiting: if another run holds it, the level is left to the sensors;
  * a queued job must still be pending and not launched by the sensor meanwhile, the rollup
    activated, and no forward run of it in flight; otherwise it is left alone.

Whatever is left is drained by the sensors exactly as before, so the ledger, not this shortcut,
stays the source of truth: a run that dies mid-chain leaves Running jobs owned by a dead run,
which the retroactive-write sensor fails and queues again.
"""

import logging
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

import dagster as dg
from pyspark.sql import SparkSession

from resources.control import ArchiveState, ArchiveStatus
from resources.ledger import Job, JobState
from rollup_assets.engine import Engine, RunOutcome
from rollup_assets.errors import RecomputeAbortedError
from rollup_assets.forward import closed_buckets, open_bucket, run_forward, source_limit
from rollup_assets.instance import pool_name
from rollup_assets.partitions import Window
from rollup_assets.recompute import run_recompute
from rollup_assets.specs import RollupSpec
from sensors.runs import DagsterRunLookup

log = logging.getLogger(__name__)


@contextmanager
def pool_slot(instance: dg.DagsterInstance, pool: str, run_id: str, step: str) -> Iterator[bool]:
    """Hold `pool`'s slot for (`run_id`, `step`) if it is free right now; yields whether it is."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        yield True
        return
    claim = storage.claim_concurrency_slot(pool, run_id, step)
    try:
        yield claim.is_claimed
    finally:
        # Frees the slot, or withdraws the queued claim when it was blocked.
        storage.free_concurrency_slot_for_step(run_id, step)


def forward_work(
    engine: Engine,
    spec: RollupSpec,
    changed: list[Window],
    now: datetime,
    states: dict[str, ArchiveState],
) -> list[Window]:
    """What the forward lane of `spec` has to do after its source changed in `changed`: buckets
    that may close now, and the open bucket if the change reached into it (or buckets close)."""
    state = states.get(spec.name)
    if state is None:
        return []
    closed = closed_buckets(spec, state, now, source_limit(engine, spec, states))
    ob = open_bucket(spec, state, now)
    touched = ob is not None and any(w.overlaps(ob) for w in changed)
    if ob is not None and (touched or closed) and ob not in closed:
        return [*closed, ob]
    return closed


class Chain:
    """One run's walk up the chain from the level it wrote."""

    def __init__(
        self,
        engine: Engine,
        spark: SparkSession,
        instance: dg.DagsterInstance,
        run_id: str,
        now: datetime,
        log_progress: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.spark = spark
        self.instance = instance
        self.run_id = run_id
        self.now = now
        self.say = log_progress or log.info
        self.lookup = DagsterRunLookup(instance)

    def run(self, spec: RollupSpec, outcome: RunOutcome) -> Iterator[tuple[RollupSpec, RunOutcome]]:
        """Every level above `spec` this run brought up to date, with what it did, in order;
        yielded while the level's pool slot is still held, so the caller can report it."""
        # Each level once: what it wrote in this run (both lanes) and the jobs it queued above.
        queue = deque([(spec, list(outcome.buckets), list(outcome.propagated))])
        while queue:
            level, changed, propagated = queue.popleft()
            for dep in self.engine.catalog.dependents(level.name):
                wrote: list[Window] = []
                queued: list[Job] = []
                for done in self._bring_up(dep, changed, propagated):
                    yield dep, done
                    wrote += done.buckets
                    queued += done.propagated
                if wrote:
                    queue.append((dep, wrote, queued))

    def _bring_up(
        self, spec: RollupSpec, changed: list[Window], propagated: list[Job]
    ) -> Iterator[RunOutcome]:
        """Under `spec`'s pool slot: its queued recomputes, then its forward work."""
        with pool_slot(self.instance, pool_name(spec), self.run_id, f"{spec.name}__chain") as held:
            if not held:
                self.say(f"{spec.name}: another run writes it; the sensors take it from here")
                return
            states = self.engine.states.all()
            state = states.get(spec.name)
            if state is None or state.status is not ArchiveStatus.ACTIVATED:
                return  # pending work waits for activation
            for job in [j for j in propagated if j.rollup == spec.name]:
                done = self._recompute(spec, job)
                if done is not None:
                    yield done
            forward = self._forward(spec, changed, states)
            if forward is not None:
                yield forward

    def _recompute(self, spec: RollupSpec, job: Job) -> RunOutcome | None:
        current = self.engine.ledger.job(job.job_id)
        if current is None or current.state is not JobState.PENDING:
            return None  # coalesced or taken meanwhile
        if self.lookup.runs_of_job(job.job_id):
            return None  # the sensor launched a run for it already
        self.say(f"{spec.name}: chain propagation continues in this run (job {job.job_id})")
        try:
            return run_recompute(
                self.engine, self.spark, spec, current, run_id=self.run_id, log_progress=self.say
            )
        except RecomputeAbortedError as exc:
            self.say(f"{spec.name}: {exc}")
            return None

    def _forward(
        self, spec: RollupSpec, changed: list[Window], states: dict[str, ArchiveState]
    ) -> RunOutcome | None:
        if spec.name in self.lookup.in_flight("forward"):
            return None  # the forward sensor launched a run for it already
        work = forward_work(self.engine, spec, changed, self.now, states)
        if not work:
            return None
        return run_forward(
            self.engine,
            self.spark,
            spec,
            requested=work,
            now=self.now,
            run_id=self.run_id,
            log_progress=self.say,
        )
