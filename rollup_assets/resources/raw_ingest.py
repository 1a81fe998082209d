"""An ingest into a raw or time-range archive: the batch validated whole, then upserted in one
delta-rs MERGE commit on the driver, by the rules of `upsert.py`.

An attempt that may reach days close to what retention keeps is fenced against a concurrent
retention pass (`raw_tables`); one that loses a race with a concurrent commit runs again on a
fresh snapshot.
"""

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties
from deltalake.exceptions import CommitFailedError

from rollup_assets import metrics
from rollup_assets.faults import checkpoint
from rollup_assets.model.column_rules import stored_operands
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.operations import RETAINED_FROM_KEY
from rollup_assets.model.progress import Progress
from rollup_assets.model.specs import SourceSpec
from rollup_assets.model.windows import as_utc
from rollup_assets.resources.batch_conversion import with_stored_operands
from rollup_assets.resources.batch_sources import BatchSource, FileSource
from rollup_assets.resources.batches import BatchReader, BatchSummary
from rollup_assets.resources.delta_files import ROW_GROUP_ROWS
from rollup_assets.resources.delta_tables import MERGE_ATTEMPTS, file_actions, with_retries
from rollup_assets.resources.raw_columns import columns_changed_between
from rollup_assets.resources.raw_reads import stored_rows_of
from rollup_assets.resources.raw_tables import (
    RawTables,
    configured,
    retained_from,
)
from rollup_assets.resources.upsert import ingest_metadata, upsert_clauses

log = logging.getLogger(__name__)
# An ingest reaching days this close to a retention horizon (by the wall clock) commits under
# `RETAINED_FROM_KEY`; newer batches cannot race a retention pass and do not serialize on it.
RETENTION_SLACK = dt.timedelta(days=2)


@dataclass(frozen=True)
class IngestResult:
    archive: str
    version: int  # the commit's version; the table's current one when nothing changed
    rows: int
    min_ts: dt.datetime
    max_ts: dt.datetime
    entities: int
    change_source: ChangeSource
    inserted: int = 0
    updated: int = 0

    @property
    def unchanged(self) -> int:
        """Rows equal to the stored ones: not written, so they are nobody's dirty work."""
        return self.rows - self.inserted - self.updated


def ingest(
    tables: RawTables,
    spec: SourceSpec,
    source: BatchSource | str | Path,
    change_source: ChangeSource,
    *,
    not_before: dt.datetime | None = None,
    progress: Progress | None = None,
    written_by: str | None = None,
) -> IngestResult:
    """`_upsert` of `source` (a file's path, or a `BatchSource` of data in memory) with the
    computed columns the table applies; when they changed while the batch was being upserted
    (a columns commit it did not see), the batch is upserted again, so its rows hold the new
    formulas' values. `written_by` (who wrote the batch: a run, an asset) is recorded in the
    commit."""
    if not isinstance(source, BatchSource):
        source = FileSource(spec.name, source)
    while True:
        table = tables.table(spec)
        seen = table.version() if table is not None else -1
        try:
            result = _upsert(
                tables,
                tables.applied(spec, table),
                source,
                change_source,
                not_before=not_before,
                progress=progress,
                written_by=written_by,
            )
        except Exception as exc:
            metrics.ingest_failed(spec.name, exc)
            raise
        if not columns_changed_between(tables.uri(spec), tables.options, seen, result.version):
            metrics.ingested(result)
            return result
        log.info("'%s': computed columns changed during an ingest; upserting again", spec.name)


def _upsert(
    tables: RawTables,
    spec: SourceSpec,
    source: BatchSource,
    change_source: ChangeSource,
    *,
    not_before: dt.datetime | None = None,
    progress: Progress | None = None,
    written_by: str | None = None,
) -> IngestResult:
    """Validate the whole batch, then upsert it in one MERGE commit (`progress` hears of
    each chunk of both passes).

    A row equal to the stored one (every column the same, NaN equal to NaN; an optional
    column left null keeps the stored value) is not rewritten: it changes nothing, so it is
    not in the change feed and makes nothing dirty. A batch of such rows commits nothing.
    Raises IngestValidationError, leaving the table untouched, if any row is invalid, or if a
    row's time is before `not_before` (retention dropped those days; its rollups keep their
    values and would not be corrected from the raw rows).
    """
    reader, summary = validated(spec, source, not_before, progress)
    clauses = upsert_clauses(spec, summary.days, summary.cells)
    predicate, updates, differs = clauses.predicate, clauses.updates, clauses.differs
    operands = stored_operands(spec)
    metadata = ingest_metadata(
        change_source,
        summary.rows,
        summary.min_ts,
        summary.max_ts,
        source.file,
        written_by=written_by,
    )

    fenced = spec.retention is not None and as_utc(summary.min_ts) < (
        dt.datetime.now(dt.UTC) - spec.retention + RETENTION_SLACK
    )

    def merge() -> tuple[int, dict]:
        table = tables.table(spec)
        if table is None:
            table = DeltaTable(tables.uri(spec), storage_options=tables.options or None)
        table = configured(table)
        fence = retained_from(table)
        _require_retained(spec, summary, fence)
        checkpoint("merge_attempt", spec.name)
        txns = [Transaction(RETAINED_FROM_KEY, table.transaction_version(RETAINED_FROM_KEY) or 0)]
        batches = reader.chunks()
        if operands:
            files = file_actions(table) if table.version() >= 0 else []
            batches = (
                with_stored_operands(
                    spec, b, stored_rows_of(tables, spec, b, files, sorted(operands)), operands
                )
                for b in batches
            )
        source = pa.RecordBatchReader.from_batches(reader.schema, batches)
        merger = table.merge(
            source,
            predicate=predicate,
            source_alias="s",
            target_alias="t",
            writer_properties=WriterProperties(max_row_group_size=ROW_GROUP_ROWS),
            commit_properties=CommitProperties(
                custom_metadata=metadata, app_transactions=txns if fenced else None
            ),
        )
        if updates:
            merger = merger.when_matched_update(updates=updates, predicate=differs)
        # `table` now stands at this commit's version (not refreshed past it).
        metrics = merger.when_not_matched_insert_all().execute()
        return table.version(), metrics

    # A concurrent ingest added rows to the partitions this MERGE read: run the MERGE again
    # on a fresh snapshot (the upsert then applies on top of it).
    version, metrics = with_retries(
        merge,
        retryable=lambda exc: isinstance(exc, CommitFailedError),
        attempts=MERGE_ATTEMPTS,
        what=f"ingest into {spec.name}",
    )
    return IngestResult(
        spec.name,
        version,
        summary.rows,
        as_utc(summary.min_ts),
        as_utc(summary.max_ts),
        summary.entities,
        change_source,
        inserted=int(metrics.get("num_target_rows_inserted", 0)),
        updated=int(metrics.get("num_target_rows_updated", 0)),
    )


def validated(
    spec: SourceSpec,
    source: BatchSource | str | Path,
    not_before: dt.datetime | None,
    progress: Progress | None,
) -> tuple[BatchReader, BatchSummary]:
    """The batch validated whole, as an ingest does (IngestValidationError otherwise)."""
    reader = BatchReader(spec, source, progress)
    return reader, reader.validate(not_before)


def _require_retained(
    spec: SourceSpec, summary: BatchSummary, not_before: dt.datetime | None
) -> None:
    """Refuse a batch holding readings before what retention keeps (`not_before`)."""
    if not_before is not None and as_utc(summary.min_ts) < not_before:
        raise IngestValidationError.before_retention(
            spec.name,
            None,
            f"its first reading, at {as_utc(summary.min_ts).isoformat()},",
            not_before,
        )
