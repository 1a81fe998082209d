"""Metrics through OpenTelemetry: this project's instruments, and the one function per event
that records each of them.

A process is configured once, at its edge (`configure(settings.metrics)`: the code location,
the CLI, the component); `ROLLUPS_METRICS=off` (the default) leaves every instrument a no-op of
OpenTelemetry's API, so a recording call costs one function call and one check. This module
keeps its own meter provider and never installs a global one: configuring it again (a test's
in-memory reader) replaces the provider, and other libraries' instrumentation is left alone.

The instruments (docs/metrics.md says when each is recorded, and by whom):

  rollups.ingest.rows        counter    {row}      archive, change_source, result
  rollups.ingest.refused     counter    {batch}    archive, reason
  rollups.detection.cells    counter    {cell}     rollup, scope
  rollups.detection.lag      histogram  s          archive
  rollups.jobs               counter    {job}      rollup, lane, trigger, outcome, technique
  rollups.job.duration       histogram  s          rollup, lane, outcome
  rollups.forward.closed     counter    {bucket}   rollup
  rollups.surface.lag        histogram  s          rollup
  rollups.failures           counter    {failure}  where, error.type
"""

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from opentelemetry.metrics import Counter, Histogram, Meter, NoOpMeterProvider

from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import Job, JobState
from rollup_assets.model.placement import cells_of
from rollup_assets.model.specs import Catalog
from rollup_assets.settings import MetricsConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

METER = "rollups"
# Bucket boundaries (seconds) of the time histograms: OpenTelemetry's default ones are made for
# milliseconds; these span a sensor tick (seconds) to a long recompute or a lagging surface.
SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)


@dataclass(frozen=True)
class _Instruments:
    rows_ingested: Counter
    batches_refused: Counter
    cells_detected: Counter
    detection_lag: Histogram
    jobs: Counter
    job_duration: Histogram
    buckets_closed: Counter
    surface_lag: Histogram
    failures: Counter

    @staticmethod
    def on(meter: Meter) -> "_Instruments":
        return _Instruments(
            rows_ingested=meter.create_counter(
                "rollups.ingest.rows",
                "{row}",
                "Rows of ingested batches, by what the upsert did with each",
            ),
            batches_refused=meter.create_counter(
                "rollups.ingest.refused",
                "{batch}",
                "Batches refused whole by validation (nothing written)",
            ),
            cells_detected=meter.create_counter(
                "rollups.detection.cells",
                "{cell}",
                "Dirty cells change detection recorded for first-level rollups",
            ),
            detection_lag=meter.create_histogram(
                "rollups.detection.lag",
                "s",
                "Time from a source commit to change detection reading it",
                explicit_bucket_boundaries_advisory=SECONDS,
            ),
            jobs=meter.create_counter(
                "rollups.jobs", "{job}", "Jobs ended, by outcome (the ledger's terminal states)"
            ),
            job_duration=meter.create_histogram(
                "rollups.job.duration",
                "s",
                "Run time of a job that ended (Coalesced jobs never ran)",
                explicit_bucket_boundaries_advisory=SECONDS,
            ),
            buckets_closed=meter.create_counter(
                "rollups.forward.closed", "{bucket}", "Buckets the forward lane closed"
            ),
            surface_lag=meter.create_histogram(
                "rollups.surface.lag",
                "s",
                "Time from a flip to the publish that brought it to the surface",
                explicit_bucket_boundaries_advisory=SECONDS,
            ),
            failures=meter.create_counter(
                "rollups.failures", "{failure}", "Ingests, runs and maintenance steps that raised"
            ),
        )


@dataclass(frozen=True)
class _State:
    instruments: _Instruments
    provider: "MeterProvider | None" = None  # None: metrics are off
    config: MetricsConfig | None = None
    reader: "MetricReader | None" = None  # a reader installed beside the configured exporter


_OFF = _State(_Instruments.on(NoOpMeterProvider().get_meter(METER)))
_state = _OFF


def configure(config: MetricsConfig, *, reader: "MetricReader | None" = None) -> None:
    """Send this process's metrics where `config` says (off: nowhere), and to `reader` too when
    given (tests read an `InMemoryMetricReader`). Called at the edge; calling it again with the
    same configuration keeps the running exporter, with another one flushes and replaces it."""
    global _state
    if reader is None and _state.reader is None and config == _state.config:
        return
    readers = ([] if config.exporter == "off" else [_periodic(config)]) + (
        [reader] if reader is not None else []
    )
    previous, _state = _state, _OFF
    if previous.provider is not None:
        previous.provider.shutdown()  # exports what it still holds
    if not readers:
        _state = _State(_OFF.instruments, None, config)
        return
    # The SDK is imported only when metrics are on: a process with them off loads the API only.
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    # `shutdown_on_exit` (the default) flushes the last measurements when the process exits.
    provider = MeterProvider(
        metric_readers=readers, resource=Resource.create({"service.name": METER})
    )
    _state = _State(_Instruments.on(provider.get_meter(METER)), provider, config, reader)


def _periodic(config: MetricsConfig) -> "MetricReader":
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricExporter,
        PeriodicExportingMetricReader,
    )

    exporter: MetricExporter
    if config.exporter == "console":
        # stderr: the CLI's stdout is its data (`--format json` piped to another program).
        exporter = ConsoleMetricExporter(out=sys.stderr)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter(endpoint=config.endpoint)
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=config.interval_seconds * 1000
    )


def enabled() -> bool:
    """Does this process record metrics?"""
    return _state.provider is not None


# -- what the owners of the events hand over ---------------------------------------------------


class Ingested(Protocol):
    """An ingest's result (`rollup_assets.resources.raw_ingest.IngestResult`)."""

    @property
    def archive(self) -> str: ...
    @property
    def change_source(self) -> str: ...
    @property
    def inserted(self) -> int: ...
    @property
    def updated(self) -> int: ...
    @property
    def unchanged(self) -> int: ...


class ReadCommit(Protocol):
    """A source commit change detection read (`rollup_assets.sensors.detection.CommitSummary`)."""

    @property
    def archive(self) -> str: ...
    @property
    def committed_at(self) -> datetime | None: ...


class Detected(Protocol):
    """What one detection tick found (`rollup_assets.sensors.detection.Detection`)."""

    @property
    def jobs(self) -> Sequence[Job]: ...
    @property
    def commits(self) -> Sequence[ReadCommit]: ...


# -- recording: one call at the owner of each event --------------------------------------------


def ingested(result: Ingested) -> None:
    """An ingest committed (or found nothing to change): its rows by what the upsert did."""
    if _state.provider is None:
        return
    source = str(result.change_source)
    for what, rows in (
        ("inserted", result.inserted),
        ("updated", result.updated),
        ("unchanged", result.unchanged),
    ):
        if rows:
            _state.instruments.rows_ingested.add(
                rows, {"archive": result.archive, "change_source": source, "result": what}
            )


def ingest_failed(archive: str, error: BaseException) -> None:
    """An ingest into `archive` raised `error`: a refused batch (validation, which stops at the
    first offending row, so the batch and not its rows is counted) or a failure."""
    if _state.provider is None:
        return
    if isinstance(error, IngestValidationError):
        # `row`: a row broke a rule (the error names it); `batch`: the file as a whole (missing,
        # empty, a column missing or mistyped, readings before what retention keeps).
        reason = "batch" if error.row is None else "row"
        _state.instruments.batches_refused.add(1, {"archive": archive, "reason": reason})
    else:
        failed("ingest", error)


def detected(catalog: Catalog, detection: Detected) -> None:
    """A detection tick recorded its dirty jobs: their cells per rollup (a bucket dirty for
    every entity counts once, as scope `bucket`), and each commit's lag (read now, wall clock)."""
    if _state.provider is None:
        return
    ins = _state.instruments
    for job in detection.jobs:
        named = every = 0
        for _, scope in cells_of(catalog.rollup(job.rollup), job):
            if scope is None:
                every += 1
            else:
                named += len(scope)
        for scope_name, n in (("entity", named), ("bucket", every)):
            if n:
                ins.cells_detected.add(n, {"rollup": job.rollup, "scope": scope_name})
    now = datetime.now(UTC)
    for commit in detection.commits:
        if commit.committed_at is not None:
            lag = max(0.0, (now - commit.committed_at).total_seconds())
            ins.detection_lag.record(lag, {"archive": commit.archive})


def jobs_recorded(jobs: Iterable[Job]) -> None:
    """Job events were written to the ledger: count each that ends its job (Completed, Failed,
    Coalesced), with its run time when it ran."""
    if _state.provider is None:
        return
    ins = _state.instruments
    for job in jobs:
        if not job.state.terminal:
            continue
        outcome = _outcome(job)
        lane = job.trigger.lane.value
        ins.jobs.add(
            1,
            {
                "rollup": job.rollup,
                "lane": lane,
                "trigger": job.trigger.value,
                "outcome": outcome,
                "technique": job.technique or "none",
            },
        )
        seconds = _seconds(job)
        if seconds is not None:
            ins.job_duration.record(
                seconds, {"rollup": job.rollup, "lane": lane, "outcome": outcome}
            )


def buckets_closed(rollup: str, buckets: int) -> None:
    """The forward lane closed `buckets` buckets of `rollup` (moved its watermark past them)."""
    if _state.provider is not None and buckets:
        _state.instruments.buckets_closed.add(buckets, {"rollup": rollup})


def surface_published(rollup: str, oldest_flip: datetime | None) -> None:
    """A publish brought flips to `rollup`'s surface, the oldest flipped at `oldest_flip` (None:
    it brought none, e.g. only forward-lane rows, or a rebuild)."""
    if _state.provider is not None and oldest_flip is not None:
        lag = max(0.0, (datetime.now(UTC) - oldest_flip).total_seconds())
        _state.instruments.surface_lag.record(lag, {"rollup": rollup})


def failed(where: str, error: BaseException) -> None:
    """Work at `where` (ingest, recompute, forward, maintenance) raised `error`."""
    if _state.provider is not None:
        _state.instruments.failures.add(1, {"where": where, "error.type": type(error).__name__})


def _outcome(job: Job) -> str:
    if job.state is JobState.COMPLETED:
        return "completed"
    if job.state is JobState.COALESCED:
        return "coalesced"
    return "given_up" if job.gave_up else "failed"


def _seconds(job: Job) -> float | None:
    """How long the job ran (None: it never started)."""
    if job.duration_ms is not None:
        return job.duration_ms / 1000
    if job.started_at is not None and job.finished_at is not None:
        return max(0.0, (job.finished_at - job.started_at).total_seconds())
    return None
