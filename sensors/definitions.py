"""The two sensors, as Dagster definitions.

`retroactive_write_sensor` detects retroactive writes in source tables, records them in the
ledger together with its cursor, and drains pending work into recompute runs.
`forward_aggregation_sensor` closes buckets past each watermark and refreshes open buckets.
Both only read Delta logs (delta-rs); neither starts Spark.
"""

import hashlib
import json
import logging
import os
from typing import Any

import dagster as dg

from resources.ledger import JobState
from resources.warehouse_resource import WarehouseResource
from rollup_assets import clock
from rollup_assets.engine import Engine
from rollup_assets.factory import TAG_JOB, TAG_LANE, TAG_NOW, TAG_ROLLUP, TAG_TRIGGER, job_name
from rollup_assets.faults import checkpoint
from rollup_assets.instance import ensure_pools
from rollup_assets.operations import health
from rollup_assets.partitions import iso_utc, key_range_for, partitions_def_for
from rollup_assets.specs import Catalog
from sensors.detection import detect
from sensors.drain import Launch, plan_drain
from sensors.forward_plan import plan_forward
from sensors.runs import TAG_HOST, DagsterRunLookup, launcher_host

log = logging.getLogger(__name__)
INTERVAL = int(os.environ.get("ROLLUPS_SENSOR_INTERVAL_SECONDS", "30"))


def run_request_for(
    catalog: Catalog, launch: Launch, now_iso: str | None = None, host: str | None = None
) -> dg.RunRequest:
    spec = catalog.rollup(launch.rollup)
    keys = key_range_for(partitions_def_for(spec), launch.buckets)
    tags = {
        "dagster/asset_partition_range_start": keys.start,
        "dagster/asset_partition_range_end": keys.end,
        TAG_ROLLUP: launch.rollup,
        TAG_LANE: launch.lane,
        TAG_TRIGGER: launch.trigger.value,
    }
    run_key = None
    if launch.job_id:
        tags[TAG_JOB] = launch.job_id
        run_key = f"recompute:{launch.job_id}"
    if now_iso:
        tags[TAG_NOW] = now_iso
    if host:  # where the run worker will run: lets a later tick tell that it died
        tags[TAG_HOST] = host
    return dg.RunRequest(job_name=job_name(spec), run_key=run_key, tags=tags)


def _health_events(
    engine: Engine, previous: dict[str, str]
) -> tuple[list[dg.AssetObservation], dict[str, str]]:
    """Observations carrying each rollup's health fields, emitted when they change."""
    snap = engine.ledger.snapshot()
    states = engine.states.all()
    events, digests = [], {}
    for name in engine.catalog.rollups:
        h = health(engine, name, snap, states)
        h_ranges = [str(w) for w in h.pending_recompute_ranges]
        plain = {
            "status": h.status,
            "watermark": iso_utc(h.watermark) if h.watermark else "none",
            "frozen_until": iso_utc(h.frozen_until) if h.frozen_until else "none",
            "recompute_in_progress": h.recompute_in_progress,
            "dirty_windows_pending": h.dirty_windows_pending,
            "pending_recompute_ranges": h_ranges,
            "last_recompute_success_at": iso_utc(h.last_recompute_success_at)
            if h.last_recompute_success_at
            else "none",
            "last_recompute_failure_reason": h.last_recompute_failure_reason or "none",
        }
        digest = hashlib.sha1(json.dumps(plain, default=str, sort_keys=True).encode()).hexdigest()[
            :16
        ]
        meta: dict[str, Any] = {
            **plain,
            "pending_recompute_ranges": dg.MetadataValue.json(h_ranges),
        }
        digests[name] = digest
        if previous.get(name) != digest:
            events.append(dg.AssetObservation(asset_key=name, metadata=meta))
    return events, digests


def _finish_dead_runs(engine: Engine, lookup: DagsterRunLookup) -> None:
    """A recompute run killed after its job completed (while sweeping) never reports its end: its
    Dagster run stays STARTED, keeps its pool slot (blocking every later run of the rollup), and
    its superseded rows stay. Sweep them while the dead run still holds the slot (no other writer
    of the rollup can be past its start), then reap the run. Dead runs of open jobs are left to
    the drain, which recovers their jobs."""
    snapshot = engine.ledger.snapshot()
    for run in lookup.dead_runs("recompute"):
        job = snapshot.jobs.get(run.tags.get(TAG_JOB, ""))
        if job is None or not job.state.terminal:
            continue
        # The run's own job, and those it took over in its chain (they name it as their run).
        owned = [j for j in snapshot.jobs.values() if j.run_id == run.run_id and j is not job]
        for done in [job, *owned]:
            finished_work = done.state is JobState.COMPLETED and done.windows_processed
            if finished_work and not snapshot.active(done.rollup):
                spec = engine.catalog.rollup(done.rollup)
                buckets = engine.buckets_in(spec, list(done.windows))
                engine.rollups.sweep(spec, buckets, done.entities)
        lookup.reap(run)


def build_sensors(catalog: Catalog, rollup_jobs: list) -> list[dg.SensorDefinition]:
    """The sensors, targeting the per-rollup jobs (one partitions definition each)."""

    @dg.sensor(
        name="retroactive_write_sensor",
        jobs=rollup_jobs,
        minimum_interval_seconds=INTERVAL,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Detects late and corrected writes in source tables (Delta change data feed), "
        "records dirty buckets, coalesces them and launches at most one recompute per rollup.",
    )
    def retroactive_write_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource):
        ensure_pools(context.instance, catalog)
        engine = Engine(catalog, warehouse.get())
        states = engine.states.all()
        detection = detect(engine, states, engine.ledger.snapshot())
        checkpoint("sensor_planned")
        if detection.jobs or detection.cursors:
            # The jobs and the cursor move together: a crash before this commit re-reads the same
            # versions next tick, a crash after it has them recorded. Nothing lost, nothing doubled.
            engine.ledger.record(detection.jobs, detection.cursors)
        for note in detection.notes:
            context.log.info(note)
        lookup = DagsterRunLookup(context.instance)
        _finish_dead_runs(engine, lookup)
        plan = plan_drain(engine, engine.states.all(), engine.ledger.snapshot(), lookup)
        engine.ledger.record(plan.events)
        for job in plan.sweeps:
            engine.rollups.sweep(
                catalog.rollup(job.rollup),
                engine.buckets_in(catalog.rollup(job.rollup), list(job.windows)),
                job.entities,
            )
        for note in plan.notes:
            context.log.info(note)
        cursor = json.loads(context.cursor) if context.cursor else {}
        events, digests = _health_events(engine, cursor.get("health", {}))
        new_cursor = json.dumps(
            {"health": digests, "detected": detection.cursors or cursor.get("detected", {})}
        )
        events += [
            dg.AssetObservation(
                asset_key=c.archive,
                metadata={
                    "delta_version": c.version,
                    "change_source": c.change_source or "unknown",
                    "changed_rows": c.rows if c.rows is not None else -1,
                    "min_ts": iso_utc(c.min_ts) if c.min_ts else "none",
                    "max_ts": iso_utc(c.max_ts) if c.max_ts else "none",
                    "dirty_rollups": ", ".join(c.dirty_rollups) or "none (appends)",
                },
            )
            for c in detection.commits
        ]
        host = launcher_host(context.instance)
        requests = [run_request_for(catalog, launch, host=host) for launch in plan.launches]
        if not requests and not events:
            return dg.SkipReason(
                f"no retroactive writes ({detection.versions_read} new source version(s) read) "
                "and no pending work ready"
            )
        return dg.SensorResult(run_requests=requests, cursor=new_cursor, asset_events=events)

    @dg.sensor(
        name="forward_aggregation_sensor",
        jobs=rollup_jobs,
        minimum_interval_seconds=INTERVAL,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Closes buckets past each rollup's watermark (once `end <= now - lag` and the "
        "source level has closed them) and refreshes open buckets whose source changed.",
    )
    def forward_aggregation_sensor(
        context: dg.SensorEvaluationContext, warehouse: WarehouseResource
    ):
        ensure_pools(context.instance, catalog)
        engine = Engine(catalog, warehouse.get())
        now = clock.now()
        lookup = DagsterRunLookup(context.instance)
        in_flight = lookup.in_flight("forward") | lookup.in_flight("recompute")
        launches = plan_forward(
            engine, engine.states.all(), engine.ledger.snapshot(), in_flight, now
        )
        if not launches:
            return dg.SkipReason(f"nothing closed or changed at {iso_utc(now)}")
        return dg.SensorResult(
            run_requests=[
                run_request_for(catalog, launch, iso_utc(now), launcher_host(context.instance))
                for launch in launches
            ]
        )

    return [retroactive_write_sensor, forward_aggregation_sensor]
