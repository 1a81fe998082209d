"""Running the sensors and their runs in this process: `rollups tick`, `rollups materialize`, tests.

A tick evaluates the real sensors (`evaluate_tick`, as the daemon does), then executes each run
request in-process through its Dagster job, so every run is recorded in the instance exactly like
a daemon launch. Run keys are honoured as the daemon honours them (a key never runs twice).
"""

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import dagster as dg

from rollup_assets.model.progress import Progress
from rollup_assets.model.windows import iso_utc
from rollup_assets.orchestration.progress import listening
from rollup_assets.orchestration.resources import ClockResource
from rollup_assets.orchestration.tags import RUN_KEY, TAG_HOST, TAG_PID
from rollup_assets.orchestration.tenancy import Scope

log = logging.getLogger(__name__)
SENSORS = ("retroactive_write_sensor", "forward_aggregation_sensor", "surface_publish_sensor")
CURSOR_KEY = "rollups/tick_cursor/{}"


@dataclass
class RunReport:
    job_name: str
    run_id: str
    success: bool
    tags: dict[str, str]
    error: str | None = None


@dataclass
class TickReport:
    runs: list[RunReport] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)


# The console of a run executed here shows its own messages (INFO), not a line per Dagster event
# (DEBUG): a correction or a backfill records thousands of partition materializations, each
# formatted and printed again besides being stored in the event log, where the UI reads them.
RUN_LOG_LEVEL = "INFO"


def _run_key_taken(instance: dg.DagsterInstance, run_key: str) -> bool:
    return bool(instance.get_run_records(filters=dg.RunsFilter(tags={RUN_KEY: run_key}), limit=1))


def execute(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    job_name: str,
    tags: dict[str, str],
    run_config: dict | None = None,
    run_key: str | None = None,
    log_level: str | None = None,
    progress: Progress | None = None,
) -> RunReport | None:
    """Execute one run of `job_name` in this process; None if its run key already ran.
    `log_level` sets the run's console logger (default `RUN_LOG_LEVEL`; the event log keeps
    every record); `progress` hears of each level the run writes (partitions done of the
    level's total)."""
    if run_key and _run_key_taken(instance, run_key):
        return None
    job = defs.resolve_job_def(job_name)
    tags = {**tags, TAG_PID: str(os.getpid()), TAG_HOST: socket.gethostname()}
    run_config = {
        **(run_config or {}),
        "loggers": {"console": {"config": {"log_level": log_level or RUN_LOG_LEVEL}}},
    }
    if run_key:
        tags[RUN_KEY] = run_key
    with listening(progress):
        result = job.execute_in_process(
            instance=instance, tags=tags, run_config=run_config or None, raise_on_error=False
        )
    error = None
    if not result.success:
        failures = [e for e in result.all_events if e.is_step_failure or e.is_failure]
        infos = [getattr(e.event_specific_data, "error", None) for e in failures]
        error = next((_root_cause(i) for i in infos if i is not None), "run failed")
    return RunReport(job_name, result.run_id, result.success, tags, error)


def _root_cause(info) -> str:
    """The innermost error of a Dagster error chain, as 'Type: message'."""
    while getattr(info, "cause", None) is not None:
        info = info.cause
    message = info.message.strip().split(": ", 1)[-1] if info.cls_name else info.message.strip()
    return f"{info.cls_name}: {message}" if info.cls_name else message


def check_evaluations(instance: dg.DagsterInstance, run_id: str) -> list[dict]:
    """The asset-check results a run recorded: passed flag, partition and plain metadata."""
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    out = []
    for r in records:
        event = r.event_log_entry.dagster_event
        data: Any = event.event_specific_data if event is not None else None
        if data is None:
            continue
        meta = {k: getattr(v, "value", v) for k, v in (data.metadata or {}).items()}
        out.append({"passed": data.passed, "partition": data.partition, "metadata": meta})
    return out


def tick(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    now: datetime | None = None,
    sensors: tuple[str, ...] = SENSORS,
    log_level: str | None = None,
    tenant: str | None = None,
    progress: Progress | None = None,
) -> TickReport:
    """One evaluation of each sensor (of `tenant`'s, when the code location has tenants), with
    its run requests executed in-process. With `now` the sensors' clock is pinned, and so is the
    clock of every run they request (its tags carry it)."""
    report = TickReport()
    resources = defs.resources or {}
    clock = ClockResource(now=iso_utc(now)) if now is not None else resources["clock"]
    for name in (Scope(tenant).name(s) for s in sensors):
        sensor = defs.resolve_sensor_def(name)
        key = CURSOR_KEY.format(name)
        cursor = instance.run_storage.get_cursor_values({key}).get(key)
        ctx = dg.build_sensor_context(
            instance=instance,
            cursor=cursor,
            definitions=defs,
            # Only what the sensor asks for: its own tenant's warehouse and the clock (sensors
            # read Delta logs only; never hand them the Spark resource).
            resources={
                k: clock if k == "clock" else resources[k] for k in sensor.required_resource_keys
            },
        )
        data = sensor.evaluate_tick(ctx)
        for event in data.asset_events:
            instance.report_runless_asset_event(event)
        if data.cursor is not None:
            instance.run_storage.set_cursor_values({key: data.cursor})
        if data.skip_message:
            report.skips.append(f"{name}: {data.skip_message}")
        for request in data.run_requests or []:
            if request.job_name is None:
                raise RuntimeError(f"sensor {name} requested a run without naming its job")
            run = execute(
                defs,
                instance,
                request.job_name,
                dict(request.tags),
                dict(request.run_config),
                request.run_key,
                log_level,
                progress,
            )
            if run is not None:
                report.runs.append(run)
    return report


def tick_until_quiet(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    now: datetime | None = None,
    max_ticks: int = 25,
    sensors: tuple[str, ...] = SENSORS,
    log_level: str | None = None,
    tenant: str | None = None,
    progress: Progress | None = None,
) -> list[TickReport]:
    """Tick until a tick launches nothing (or `max_ticks`)."""
    reports = []
    for _ in range(max_ticks):
        r = tick(defs, instance, now, sensors, log_level, tenant, progress)
        reports.append(r)
        if not r.runs:
            break
    return reports
