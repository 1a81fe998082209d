"""Running the sensors and their runs in this process: `rollups tick`, `rollups materialize`, tests.

A tick evaluates the real sensors (`evaluate_tick`, as the daemon does), then executes each run
request in-process through its Dagster job, so every run is recorded in the instance exactly like
a daemon launch. Run keys are honoured as the daemon honours them (a key never runs twice).
"""

import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import dagster as dg

from rollup_assets.partitions import iso_utc
from sensors.runs import TAG_HOST, TAG_PID

log = logging.getLogger(__name__)
SENSORS = ("retroactive_write_sensor", "forward_aggregation_sensor")
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

    @property
    def launched(self) -> int:
        return len(self.runs)


@contextlib.contextmanager
def pinned_now(now: datetime | None) -> Iterator[None]:
    if now is None:
        yield
        return
    old = os.environ.get("ROLLUPS_NOW")
    os.environ["ROLLUPS_NOW"] = iso_utc(now)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ROLLUPS_NOW", None)
        else:
            os.environ["ROLLUPS_NOW"] = old


def _run_key_taken(instance: dg.DagsterInstance, run_key: str) -> bool:
    return bool(
        instance.get_run_records(filters=dg.RunsFilter(tags={"dagster/run_key": run_key}), limit=1)
    )


def execute(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    job_name: str,
    tags: dict[str, str],
    run_config: dict | None = None,
    run_key: str | None = None,
) -> RunReport | None:
    """Execute one run of `job_name` in this process; None if its run key already ran."""
    if run_key and _run_key_taken(instance, run_key):
        return None
    job = defs.resolve_job_def(job_name)
    tags = {**tags, TAG_PID: str(os.getpid()), TAG_HOST: socket.gethostname()}
    level = os.environ.get("ROLLUPS_RUN_LOG_LEVEL")
    if level:  # the console logger of in-process runs (the event log keeps every record)
        run_config = {
            **(run_config or {}),
            "loggers": {"console": {"config": {"log_level": level}}},
        }
    if run_key:
        tags["dagster/run_key"] = run_key
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
) -> TickReport:
    """One evaluation of each sensor, with its run requests executed in-process."""
    report = TickReport()
    with pinned_now(now):
        for name in sensors:
            sensor = defs.resolve_sensor_def(name)
            key = CURSOR_KEY.format(name)
            cursor = instance.run_storage.get_cursor_values({key}).get(key)
            ctx = dg.build_sensor_context(
                instance=instance,
                cursor=cursor,
                definitions=defs,
                # Sensors read Delta logs only; never hand them the Spark resource.
                resources={"warehouse": (defs.resources or {})["warehouse"]},
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
) -> list[TickReport]:
    """Tick until a tick launches nothing (or `max_ticks`)."""
    reports = []
    for _ in range(max_ticks):
        r = tick(defs, instance, now, sensors)
        reports.append(r)
        if not r.runs:
            break
    return reports


def partition_range_tags(start_key: str, end_key: str) -> dict[str, str]:
    return {
        "dagster/asset_partition_range_start": start_key,
        "dagster/asset_partition_range_end": end_key,
    }


def summarize(report: TickReport) -> str:
    return json.dumps(
        [
            {"job": r.job_name, "ok": r.success, "lane": r.tags.get("rollups/lane")}
            for r in report.runs
        ]
    )
