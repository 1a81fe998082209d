"""The sensors, as Dagster definitions: thin shells around the planners.

`retroactive_write_sensor` detects retroactive writes in source tables (`detection`), records
them in the ledger together with its cursor, and drains pending work into recompute runs
(`drain`). `forward_aggregation_sensor` closes buckets past each watermark and refreshes open
buckets (`forward_plan`). `surface_publish_sensor` publishes lagging surfaces off the runs'
critical path (`surface_plan`). Each reads its snapshots (control tables, Delta logs, Dagster's
runs), asks the planner, and records and requests what the plan says. None starts Spark.
"""

import hashlib
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from rollup_assets import metrics
from rollup_assets.faults import checkpoint
from rollup_assets.model.jobs import JobState, Lane
from rollup_assets.model.operations import Operation
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.specs import Catalog
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import iso_utc
from rollup_assets.orchestration.instance import ensure_pools
from rollup_assets.orchestration.jobs import job_name
from rollup_assets.orchestration.partitions import key_range_for, partitions_def_for
from rollup_assets.orchestration.resources import ClockResource, WarehouseResource
from rollup_assets.orchestration.runs import DagsterRunLookup, launcher_host
from rollup_assets.orchestration.surface_jobs import publish_op_name
from rollup_assets.orchestration.tags import (
    TAG_HOST,
    TAG_SURFACES,
    RunIntent,
    partition_range_tags,
)
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope
from rollup_assets.resources.change_feed import ChangeFeed, SourceLog
from rollup_assets.resources.memory import collecting_less
from rollup_assets.sensors.detection import DEFAULT_LIMITS, commits_pending, detect
from rollup_assets.sensors.drain import Launch, plan_drain
from rollup_assets.sensors.forward_plan import plan_forward
from rollup_assets.sensors.surface_plan import plan_publish
from rollup_assets.services.engine import Engine
from rollup_assets.services.health import health
from rollup_assets.services.recovery import recover
from rollup_assets.services.surface_lag import SurfaceLag, surface_lag
from rollup_assets.settings import DetectionLimits

log = logging.getLogger(__name__)


def run_request_for(
    catalog: Catalog,
    launch: Launch,
    now: datetime | None = None,
    host: str | None = None,
    scope: Scope = NO_TENANT,
) -> dg.RunRequest:
    """A range run of the launch's buckets, by `scope`'s job; `now` pins the run's clock, `host`
    says where its worker will run (so a later tick can tell that it died)."""
    spec = catalog.rollup(launch.rollup)
    keys = key_range_for(partitions_def_for(spec), launch.buckets)
    intent = RunIntent(launch.rollup, launch.lane, launch.trigger, launch.job_id, now, host)
    return dg.RunRequest(
        job_name=job_name(spec, scope),
        run_key=f"recompute:{launch.job_id}" if launch.job_id else None,
        tags={**partition_range_tags(keys.start, keys.end), **intent.tags(), **scope.tags()},
    )


def _health_events(
    engine: Engine, previous: dict[str, str], scope: Scope
) -> tuple[list[dg.AssetObservation], dict[str, str]]:
    """Observations carrying each rollup's health fields, emitted when they change."""
    snap = engine.ledger.snapshot()
    states = engine.states.all()
    events, digests = [], {}
    for name in engine.catalog.rollups:
        h = health(engine.catalog, name, snap, states)
        h_ranges = [str(w) for w in h.pending_recompute_ranges]
        held_ranges = [str(w) for w in h.held_ranges]
        plain = {
            "status": h.status,
            "watermark": iso_utc(h.watermark) if h.watermark else "none",
            "frozen_until": iso_utc(h.frozen_until) if h.frozen_until else "none",
            "recompute_in_progress": h.recompute_in_progress,
            "dirty_windows_pending": h.dirty_windows_pending,
            "pending_recompute_ranges": h_ranges,
            "held_writes": h.held_writes,
            "held_ranges": held_ranges,
            "last_recompute_success_at": iso_utc(h.last_recompute_success_at)
            if h.last_recompute_success_at
            else "none",
            "last_recompute_failure_reason": h.last_recompute_failure_reason or "none",
            "last_rollback": h.last_rollback or "none",
            "jobs_given_up": h.jobs_given_up,
            "last_given_up": h.last_given_up or "none",
            "action_under_way": h.action_under_way or "none",
        }
        digest = hashlib.sha1(json.dumps(plain, default=str, sort_keys=True).encode()).hexdigest()[
            :16
        ]
        meta: dict[str, Any] = {
            **plain,
            "pending_recompute_ranges": dg.MetadataValue.json(h_ranges),
            "held_ranges": dg.MetadataValue.json(held_ranges),
        }
        digests[name] = digest
        if previous.get(name) != digest:
            events.append(dg.AssetObservation(asset_key=scope.key(name), metadata=meta))
    return events, digests


def _finish_dead_runs(engine: Engine, lookup: DagsterRunLookup) -> None:
    """A recompute run killed after its job completed (while sweeping) never reports its end: its
    Dagster run stays STARTED, keeps its pool slot (blocking every later run of the rollup), and
    its superseded rows stay. Sweep them while the dead run still holds the slot (no other writer
    of the rollup can be past its start), then reap the run (the surface publish sensor publishes
    its flip). Dead runs of open jobs are left to the drain, which recovers their jobs."""
    snapshot = engine.ledger.snapshot()
    for run in lookup.dead_runs(Lane.RECOMPUTE):
        job = snapshot.jobs.get(RunIntent.from_tags(run.tags, "").job_id or "")
        if job is None or not job.state.terminal:
            continue
        # The run's own job, and those it took over in its chain (they name it as their run).
        owned = [j for j in snapshot.jobs.values() if j.run_id == run.run_id and j is not job]
        for done in [job, *owned]:
            finished_work = done.state is JobState.COMPLETED and done.windows_processed
            if finished_work and not snapshot.active(done.rollup):
                spec = engine.catalog.rollup(done.rollup)
                engine.rollups.sweep(spec, buckets_in(spec, list(done.windows)), done.entities)
        lookup.reap(run)


def _flipped_jobs(engine: Engine) -> dict[str, int | None]:
    """The jobs in Swapping state whose pointers are in their rollup's pointer table, each with
    its flip's version when it is a correction (its changes go up as corrections from there)."""
    swapping = [j for j in engine.ledger.snapshot().jobs.values() if j.state is JobState.SWAPPING]
    out: dict[str, int | None] = {}
    for name in {j.rollup for j in swapping}:
        spec = engine.catalog.rollup(name)
        flipped = engine.rollups.flipped_jobs(spec)
        for job in swapping:
            if job.rollup == name and job.job_id in flipped:
                out[job.job_id] = (
                    engine.rollups.committed_by(spec, job.job_id, Operation.FLIP)
                    if job.corrects
                    else None
                )
    return out


def build_sensors(
    catalog: Catalog,
    rollup_jobs: list,
    interval_seconds: int = 30,
    limits: DetectionLimits = DEFAULT_LIMITS,
    scope: Scope = NO_TENANT,
) -> list[dg.SensorDefinition]:
    """The sensors of `scope`, targeting its per-rollup jobs (one partitions definition each),
    evaluated every `interval_seconds`. A tenant's sensors read and write its own warehouse
    (its resource) and see only its own runs."""
    resource_keys = {scope.warehouse_key, "clock"}

    def resources(context: dg.SensorEvaluationContext) -> tuple[WarehouseResource, ClockResource]:
        return getattr(context.resources, scope.warehouse_key), context.resources.clock

    @dg.sensor(
        name=scope.name("retroactive_write_sensor"),
        jobs=rollup_jobs,
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=scope.describe(
            "Detects late and corrected writes in source tables (Delta change data feed), "
            "records dirty buckets, coalesces them and launches at most one recompute per rollup."
        ),
        required_resource_keys=resource_keys,
    )
    @collecting_less()
    def retroactive_write_sensor(context: dg.SensorEvaluationContext):
        warehouse, clock = resources(context)
        ensure_pools(context.instance, catalog, scope)
        engine = warehouse.engine(catalog)
        # Operator actions a dead process left half done are finished before anything else.
        for note in recover(engine, actor="retroactive_write_sensor"):
            context.log.warning(note)
        feed = ChangeFeed(engine.raw, limits.max_cdf_rows, engine.removed_spans)
        detection = detect(catalog, engine.states.all(), engine.ledger.snapshot(), feed, limits)
        checkpoint("sensor_planned")
        if detection.jobs or detection.cursors or detection.forget:
            # The jobs and the cursor move together: a crash before this commit re-reads the same
            # versions next tick, a crash after it has them recorded. Nothing lost, nothing doubled.
            engine.ledger.record(
                detection.jobs, detection.cursors, tables=detection.tables, forget=detection.forget
            )
            metrics.detected(catalog, detection)
        for note in detection.notes:
            context.log.info(note)
        lookup = DagsterRunLookup(context.instance, scope)
        _finish_dead_runs(engine, lookup)
        plan = plan_drain(
            catalog,
            engine.states.all(),
            engine.ledger.snapshot(),
            lookup,
            _flipped_jobs(engine),
            limits.entity_scope_limit,
            engine.retry,
        )
        engine.ledger.record(plan.events)
        for job in plan.sweeps:
            spec = catalog.rollup(job.rollup)
            engine.rollups.sweep(spec, buckets_in(spec, list(job.windows)), job.entities)
        for note in plan.notes:
            context.log.info(note)
        cursor = json.loads(context.cursor) if context.cursor else {}
        events, digests = _health_events(engine, cursor.get("health", {}), scope)
        new_cursor = json.dumps(
            {"health": digests, "detected": detection.cursors or cursor.get("detected", {})}
        )
        events += [
            dg.AssetObservation(
                asset_key=scope.key(c.archive),
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
        # A pinned clock (tests, `rollups tick --now`) travels with the runs it requests.
        now = clock.current() if clock.pinned else None
        requests = [run_request_for(catalog, launch, now, host, scope) for launch in plan.launches]
        if not requests and not events:
            return dg.SkipReason(
                f"no retroactive writes ({detection.versions_read} new source version(s) read) "
                "and no pending work ready"
            )
        return dg.SensorResult(run_requests=requests, cursor=new_cursor, asset_events=events)

    @dg.sensor(
        name=scope.name("forward_aggregation_sensor"),
        jobs=rollup_jobs,
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=scope.describe(
            "Closes buckets past each rollup's watermark (once `end <= now - lag` and the "
            "source level has closed them) and refreshes open buckets whose source changed."
        ),
        required_resource_keys=resource_keys,
    )
    @collecting_less()
    def forward_aggregation_sensor(context: dg.SensorEvaluationContext):
        warehouse, clock = resources(context)
        ensure_pools(context.instance, catalog, scope)
        engine = warehouse.engine(catalog)
        now = clock.current()
        lookup = DagsterRunLookup(context.instance, scope)
        in_flight = lookup.in_flight(Lane.FORWARD) | lookup.in_flight(Lane.RECOMPUTE)
        launches = plan_forward(
            catalog,
            engine.states.all(),
            engine.ledger.snapshot(),
            in_flight,
            now,
            SourceLog(engine.raw, engine.rollups),
            engine.states.deleted_at(),
        )
        if not launches:
            return dg.SkipReason(f"nothing closed or changed at {iso_utc(now)}")
        return dg.SensorResult(
            run_requests=[
                run_request_for(catalog, launch, now, launcher_host(context.instance), scope)
                for launch in launches
            ]
        )

    return [retroactive_write_sensor, forward_aggregation_sensor]


def _lag_events(
    lags: list[SurfaceLag], now: datetime, previous: dict[str, str], scope: Scope
) -> tuple[list[dg.AssetObservation], dict[str, str]]:
    """Observations of each rollup's surface lag, emitted when it starts or stops lagging (or
    its oldest unpublished change moves): the lag in seconds, and since when."""
    events, marks = [], {}
    for lag in lags:
        mark = "none" if lag.since is None else iso_utc(lag.since)
        if lag.since is None and lag.unknown:
            mark = "unknown"
        marks[lag.rollup] = mark
        if previous.get(lag.rollup, "none") == mark:
            continue
        seconds = lag.seconds(now)
        events.append(
            dg.AssetObservation(
                asset_key=scope.key(lag.rollup),
                metadata={
                    "surface_lag_seconds": -1.0 if seconds is None else round(seconds, 3),
                    "surface_lagging_since": mark,
                },
            )
        )
    return events, marks


def build_surface_sensor(
    catalog: Catalog,
    publish_job: dg.JobDefinition,
    interval_seconds: int = 30,
    max_lag_seconds: int = 60,
    scope: Scope = NO_TENANT,
) -> dg.SensorDefinition:
    """`scope`'s surface publish sensor: one run of `publish_job` for the rollups whose surfaces
    lag and are due (`plan_publish`), keeping each within `max_lag_seconds` of its last flip."""

    @dg.sensor(
        name=scope.name("surface_publish_sensor"),
        job=publish_job,
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=scope.describe(
            "Publishes the surface tables (the active rows plain Delta readers see) of rollups "
            f"whose flips they do not show yet: at most {max_lag_seconds} s behind the last flip, "
            "coalescing a stream of corrections into few publishes."
        ),
        required_resource_keys={scope.warehouse_key},
    )
    @collecting_less()
    def surface_publish_sensor(context: dg.SensorEvaluationContext):
        warehouse: WarehouseResource = getattr(context.resources, scope.warehouse_key)
        engine = warehouse.engine(catalog)
        # Lags are measured against Delta commit times: the real clock, never a pinned one.
        now = datetime.now(UTC)
        states = engine.states.all()
        lags = [
            surface_lag(engine, spec)
            for spec in catalog.rollups.values()
            if spec.name in states and states[spec.name].status is not ArchiveStatus.DELETED
        ]
        cursor = json.loads(context.cursor) if context.cursor else {}
        lookup = DagsterRunLookup(context.instance, scope)
        # Work queued or running, or about to be: a source's commits not detected yet start a
        # correction at the change sensor's next tick, which a publish launched now would delay.
        ledger = engine.ledger.snapshot()
        working = any(not j.state.terminal for j in ledger.jobs.values())
        if not working and any(lag.needs_publish for lag in lags):
            feed = ChangeFeed(engine.raw, DEFAULT_LIMITS.max_cdf_rows, engine.removed_spans)
            working = commits_pending(catalog, states, ledger, feed)
        plan = plan_publish(
            lags,
            lookup.publishing(publish_job.name),
            cursor.get("launched", {}),
            cursor.get("attempts", {}),
            now,
            timedelta(seconds=max_lag_seconds),
            prefix=scope.name(""),
            working=working,
        )
        for note in plan.notes:
            context.log.info(note)
        events, marks = _lag_events(lags, now, cursor.get("lagging", {}), scope)
        new_cursor = json.dumps(
            {"launched": plan.launched, "attempts": plan.attempts, "lagging": marks},
            sort_keys=True,
        )
        if not plan.rollups:
            if events or new_cursor != context.cursor:
                return dg.SensorResult(cursor=new_cursor, asset_events=events)
            return dg.SkipReason("; ".join(plan.notes) or "every surface shows its rollup's flips")
        host = launcher_host(context.instance)
        config = {"config": {"rollups": list(plan.rollups)}}
        request = dg.RunRequest(
            job_name=publish_job.name,
            run_key=plan.run_key,
            run_config={"ops": {publish_op_name(scope): config}},
            tags={
                TAG_SURFACES: ",".join(plan.rollups),
                **({TAG_HOST: host} if host else {}),
                **scope.tags(),
            },
        )
        return dg.SensorResult(run_requests=[request], cursor=new_cursor, asset_events=events)

    return surface_publish_sensor
