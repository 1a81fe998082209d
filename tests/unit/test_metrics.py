"""Metrics: off by default (no provider, no global state), each recording function counts what
its event says, and the configured exporter (console, OTLP over HTTP) receives the instruments.
The end-to-end values after an ingest and a correction are in
tests/integration/test_metrics.py."""

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from rollup_assets import metrics
from rollup_assets.demo.sample_data import SCHEMA
from rollup_assets.model.cells import Cells
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource, Job, JobState, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.genmap import GENMAP_SCHEMA
from rollup_assets.services.surface_changes import POINTER_KEY, Changed
from rollup_assets.settings import MetricsConfig, Settings, SettingsError
from tests.metric_points import read, reading

T0 = datetime(2025, 6, 2, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)


def hours(n: int) -> tuple[Window, ...]:
    return tuple(Window(T0 + i * HOUR, T0 + (i + 1) * HOUR) for i in range(n))


@dataclass(frozen=True)
class Result:
    archive: str
    change_source: ChangeSource
    inserted: int
    updated: int
    unchanged: int


@dataclass(frozen=True)
class Commit:
    archive: str
    committed_at: datetime | None


@dataclass(frozen=True)
class Detection:
    jobs: list[Job]
    commits: list[Commit]


@pytest.fixture(autouse=True)
def metrics_off() -> Iterator[None]:
    metrics.configure(MetricsConfig())
    yield
    metrics.configure(MetricsConfig())


def test_importing_changes_nothing_and_off_records_nothing() -> None:
    # A fresh process: importing every module that records, and the code location with
    # nothing configured, leaves metrics off and installs no global SDK meter provider.
    code = (
        "import opentelemetry.metrics as api\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "import rollup_assets.resources.ledger, rollup_assets.resources.raw_ingest\n"
        "import rollup_assets.sensors.definitions\n"
        "import rollup_assets.services.surface, rollup_assets.definitions\n"
        "from rollup_assets import metrics\n"
        "assert not metrics.enabled()\n"
        "assert not isinstance(api.get_meter_provider(), MeterProvider)\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLUPS_", "OTEL_"))}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr

    with reading() as reader:
        pass
    assert not metrics.enabled()
    # Recorded while off: nothing reaches a reader installed afterwards.
    metrics.failed("recompute", RuntimeError("x"))
    metrics.jobs_recorded([Job("energy_hourly", Trigger.MANUAL, (), state=JobState.COMPLETED)])
    with reading() as reader:
        assert metrics.enabled()
        assert read(reader) == {}


def test_configuring_again_replaces_the_reader() -> None:
    with reading() as first:
        metrics.buckets_closed("energy_hourly", 2)
        assert read(first)["rollups.forward.closed"].total() == 2
        with reading() as second:
            metrics.buckets_closed("energy_hourly", 3)
            assert read(second)["rollups.forward.closed"].total() == 3
    assert not metrics.enabled()


def test_job_events_count_by_outcome_with_their_run_time() -> None:
    running = Job("energy_hourly", Trigger.PERIODIC, hours(2), state=JobState.RUNNING)
    done = running.next(state=JobState.COMPLETED, duration_ms=1500, technique="difference")
    start = datetime(2025, 6, 3, tzinfo=UTC)
    failed = Job(
        "energy_daily",
        Trigger.CHAIN,
        hours(1),
        state=JobState.FAILED,
        started_at=start,
        finished_at=start + timedelta(seconds=2),
    )
    given_up = Job("energy_daily", Trigger.CHAIN, hours(1), state=JobState.FAILED, gave_up=True)
    coalesced = Job("energy_hourly", Trigger.PERIODIC, hours(1), state=JobState.COALESCED)
    forward = Job("energy_hourly", Trigger.FORWARD, hours(1), state=JobState.COMPLETED)
    with reading() as reader:
        metrics.jobs_recorded([running])  # not an end: not counted
        metrics.jobs_recorded([done, failed, given_up, coalesced, forward])
        seen = read(reader)
    jobs = seen["rollups.jobs"]
    assert jobs.unit == "{job}"
    assert jobs.total() == 5
    assert jobs.total(rollup="energy_hourly", outcome="completed", lane="recompute") == 1
    assert jobs.total(technique="difference", trigger="Periodic") == 1
    assert jobs.total(rollup="energy_daily", outcome="failed", trigger="ChainPropagation") == 1
    assert jobs.total(outcome="given_up") == 1 and jobs.total(outcome="coalesced") == 1
    assert jobs.total(lane="forward", outcome="completed", technique="none") == 1
    duration = seen["rollups.job.duration"]
    assert duration.unit == "s"
    [completed] = duration.recorded(outcome="completed", lane="recompute")
    assert (completed.count, completed.sum) == (1, 1.5)
    [ran] = duration.recorded(outcome="failed")
    assert (ran.count, ran.sum) == (1, 2.0)
    # Never started: no run time (given up before running, coalesced, a forward job without one).
    assert duration.recorded(outcome="coalesced") == []
    assert duration.recorded(outcome="given_up") == []


def test_ingest_rows_refusals_and_failures() -> None:
    with reading() as reader:
        metrics.ingested(Result("energy_raw", ChangeSource.IMPORT, 90, 0, 0))
        metrics.ingested(Result("energy_raw", ChangeSource.MANUAL, 0, 4, 6))
        metrics.ingest_failed("energy_raw", IngestValidationError("energy_raw", 3, "bad"))
        metrics.ingest_failed("energy_raw", IngestValidationError("energy_raw", None, "empty"))
        metrics.ingest_failed("energy_raw", OSError("disk full"))
        seen = read(reader)
    rows = seen["rollups.ingest.rows"]
    assert rows.unit == "{row}"
    assert rows.total() == 100
    assert rows.total(change_source="Import", result="inserted") == 90
    assert rows.total(change_source="Manual", result="updated") == 4
    assert rows.total(change_source="Manual", result="unchanged") == 6
    refused = seen["rollups.ingest.refused"]
    assert refused.total(archive="energy_raw", reason="row") == 1
    assert refused.total(archive="energy_raw", reason="batch") == 1
    assert seen["rollups.failures"].counts == {
        frozenset({("where", "ingest"), ("error.type", "OSError")}): 1
    }


def test_detection_counts_cells_and_the_lag_of_each_commit() -> None:
    catalog = load_catalog()
    w = hours(3)
    cells = Cells(((w[0], frozenset({"m1", "m2"})), (w[1], frozenset({"m3"})), (w[2], None)))
    job = Job("energy_hourly", Trigger.PERIODIC, w, entities=None, cells=cells)
    whole = Job("energy_hourly", Trigger.PERIODIC, hours(2), entities=frozenset({"m9"}))
    before = datetime.now(UTC) - timedelta(seconds=30)
    commits = [Commit("energy_raw", before), Commit("energy_raw", None)]
    with reading() as reader:
        metrics.detected(catalog, Detection([job, whole], commits))
        seen = read(reader)
    detected = seen["rollups.detection.cells"]
    # Named cells: m1, m2 in the first hour, m3 in the second, m9 in two hours; the third
    # hour dirty for every entity counts once.
    assert detected.total(rollup="energy_hourly", scope="entity") == 5
    assert detected.total(rollup="energy_hourly", scope="bucket") == 1
    [lag] = seen["rollups.detection.lag"].recorded(archive="energy_raw")
    assert lag.count == 1 and 30 <= lag.sum < 60


def test_surface_lag_buckets_closed_and_failures() -> None:
    with reading() as reader:
        metrics.surface_published("energy_daily", datetime.now(UTC) - timedelta(seconds=5))
        metrics.surface_published("energy_daily", None)  # it brought no flip
        metrics.buckets_closed("energy_hourly", 4)
        metrics.buckets_closed("energy_hourly", 0)
        metrics.failed("recompute", KeyError("k"))
        metrics.failed("maintenance", KeyError("k"))
        seen = read(reader)
    [lag] = seen["rollups.surface.lag"].recorded(rollup="energy_daily")
    assert lag.count == 1 and 5 <= lag.sum < 30
    assert seen["rollups.forward.closed"].total(rollup="energy_hourly") == 4
    failures = seen["rollups.failures"]
    assert failures.total(**{"where": "recompute", "error.type": "KeyError"}) == 1
    assert failures.total(where="maintenance") == 1 and failures.total() == 2


def pointer(w: Window, entity: str | None, generation: int, flipped_at: datetime) -> dict:
    return {
        "bucket_start": w.start,
        "bucket_end": w.end,
        "entity_id": entity,
        "generation": generation,
        "job_id": "j",
        "run_id": "r",
        "flipped_at": flipped_at,
    }


def test_the_surface_lag_counts_from_the_oldest_flip_a_publish_brings() -> None:
    # The pointers a publish brings: a global one (every entity) and an entity's; a dropped
    # pointer (a rewind) has no flip in the newer version and does not count.
    w = hours(3)
    flipped = [T0 + timedelta(minutes=m) for m in (50, 10, 30)]
    now = pa.Table.from_pylist(
        [
            pointer(w[0], None, 7, flipped[0]),
            pointer(w[1], "m1", 7, flipped[1]),
            pointer(w[2], "m2", 3, flipped[2]),
        ],
        schema=GENMAP_SCHEMA,
    )
    keys = now.select(list(POINTER_KEY))
    dropped = pa.Table.from_pylist(
        [{"bucket_start": w[2].start, "bucket_end": w[2].end, "entity_id": "m3", "generation": 2}],
        schema=keys.schema,
    )
    assert Changed(keys.slice(0, 1), ()).oldest_flip(now) == flipped[0]  # the global pointer
    assert Changed(keys.slice(0, 2), ()).oldest_flip(now) == flipped[1]
    assert Changed(pa.concat_tables([keys.slice(2), dropped]), ()).oldest_flip(now) == flipped[2]
    assert Changed(dropped, ()).oldest_flip(now) is None
    assert Changed(keys.slice(0, 0), (w[0],)).oldest_flip(now) is None  # forward rows only


def test_console_exporter_writes_to_stderr_when_flushed(capsys: pytest.CaptureFixture) -> None:
    metrics.configure(MetricsConfig("console", interval_seconds=3600))
    metrics.buckets_closed("energy_hourly", 7)
    metrics.configure(MetricsConfig())  # the shutdown exports what is held
    out = capsys.readouterr()
    assert out.out == ""
    exported = json.loads(out.err)
    [metric] = [
        m
        for rm in exported["resource_metrics"]
        for sm in rm["scope_metrics"]
        for m in sm["metrics"]
    ]
    assert metric["name"] == "rollups.forward.closed"
    assert metric["data"]["data_points"][0]["value"] == 7


def test_otlp_exporter_posts_the_instruments_to_the_endpoint() -> None:
    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/metrics"
        metrics.configure(MetricsConfig("otlp", endpoint=url, interval_seconds=3600))
        metrics.failed("forward", ValueError("v"))
        metrics.configure(MetricsConfig())
    finally:
        server.shutdown()
    [(path, body)] = received
    assert path == "/v1/metrics"
    request = ExportMetricsServiceRequest.FromString(body)
    [metric] = [m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    assert metric.name == "rollups.failures" and metric.unit == "{failure}"
    [point] = metric.sum.data_points
    assert point.as_int == 1 or point.as_double == 1
    attrs = {a.key: a.value.string_value for a in point.attributes}
    assert attrs == {"where": "forward", "error.type": "ValueError"}


# -- configuration ----------------------------------------------------------------------------


def test_settings_default_to_off() -> None:
    assert Settings.from_env({}).metrics == MetricsConfig("off", None, 60)


def test_settings_read_exporter_endpoint_and_interval() -> None:
    env = {
        "ROLLUPS_METRICS": "OTLP",
        "ROLLUPS_METRICS_ENDPOINT": "https://collector:4318/v1/metrics",
        "ROLLUPS_METRICS_INTERVAL_SECONDS": "15",
    }
    assert Settings.from_env(env).metrics == MetricsConfig(
        "otlp", "https://collector:4318/v1/metrics", 15
    )
    assert Settings.from_env({"ROLLUPS_METRICS": "console"}).metrics.exporter == "console"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"ROLLUPS_METRICS": "prometheus"}, "ROLLUPS_METRICS='prometheus' is not one of off, "),
        ({"ROLLUPS_METRICS_ENDPOINT": "collector:4318"}, "not an http:// or https:// URL"),
        ({"ROLLUPS_METRICS_INTERVAL_SECONDS": "0"}, "at least 1"),
    ],
)
def test_settings_refuse_unusable_metrics_values(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        Settings.from_env(env)


def rollups_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLUPS_", "OTEL_"))}
    base.update(ROLLUPS_WAREHOUSE=str(tmp_path / "warehouse"), DAGSTER_HOME=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "-m", "rollup_assets.cli", *args],
        capture_output=True,
        text=True,
        env=base,
        timeout=180,
        check=False,
    )


def test_the_cli_exports_to_the_console_at_exit_and_refuses_an_unknown_exporter(
    tmp_path: Path,
) -> None:
    batch = tmp_path / "batch.parquet"
    ts = [T0 + i * timedelta(minutes=15) for i in range(3)]
    pq.write_table(
        pa.table(
            {"entity_id": ["m1"] * 3, "ts": ts, "energy_kwh": [1.0, 2.0, 3.0]},
            schema=pa.schema([SCHEMA.field(c) for c in ("entity_id", "ts", "energy_kwh")]),
        ),
        batch,
    )
    assert rollups_cli(tmp_path, "activate", "energy_raw").returncode == 0
    out = rollups_cli(
        tmp_path, "ingest", "energy_raw", str(batch), "--format", "json", ROLLUPS_METRICS="console"
    )
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)  # stdout stays the command's data
    assert row["inserted"] == 3
    exported = json.loads(out.stderr[out.stderr.index("{") :])
    points = {
        m["name"]: m["data"]["data_points"]
        for rm in exported["resource_metrics"]
        for sm in rm["scope_metrics"]
        for m in sm["metrics"]
    }
    [point] = points["rollups.ingest.rows"]
    assert point["value"] == 3
    assert point["attributes"] == {
        "archive": "energy_raw",
        "change_source": "Pipeline",
        "result": "inserted",
    }

    bad = rollups_cli(tmp_path, "status", ROLLUPS_METRICS="statsd")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "error: ROLLUPS_METRICS='statsd' is not one of off, console, otlp"
    ]
