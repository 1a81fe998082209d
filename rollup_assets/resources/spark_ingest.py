"""Ingest at scale: a Spark DataFrame, or a file Spark reads (`spark_batches.read_file`),
upserted into a raw or time-range archive by delta-spark's MERGE on the executors, with the
semantics of `RawStore.ingest`.

Nothing of the batch is collected on the driver. The frame is validated whole in Spark tasks
(`spark_batches.validate_frame`), and nothing is written when a row is invalid. The rows then
reach one MERGE, built from the same clauses as the delta-rs ingest
(`rollup_assets/resources/upsert.py`): keyed by (entity_id, time) within the batch's UTC days,
required and computed columns take the batch's value, optional ones left null keep the stored
value, and an unchanged row is not rewritten (so a batch of such rows commits nothing).
Computed columns are evaluated by the same formulas, over the stored values of optional
operands the batch leaves null. The commit records the ingest's metadata as JSON in
`userMetadata` (the one free-form field delta-spark writes), which change detection reads as
it reads a delta-rs ingest's (`delta_tables.with_user_metadata`).

The frame is evaluated once per pass (validation, duplicate keys, the MERGE), so it must give
the same rows each time, as a file scan does; cache it otherwise.
"""

import datetime as dt
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.model.column_rules import stored_operands
from rollup_assets.model.errors import DeltaSparkMissingError, IngestValidationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.specs import DAY_COLUMN, SourceSpec, key_columns
from rollup_assets.resources.batch_conversion import BatchConverter, fill_computed
from rollup_assets.resources.delta_jars import INSTALL_COMMAND, has_delta
from rollup_assets.resources.delta_tables import MERGE_ATTEMPTS, read_commit, with_user_metadata
from rollup_assets.resources.raw_columns import columns_changed_between
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.raw_tables import retained_from
from rollup_assets.resources.schemas import archive_schema, spark_schema
from rollup_assets.resources.spark_batches import validate_frame, without_malformed
from rollup_assets.resources.upsert import UpsertClauses, ingest_metadata, upsert_clauses
from rollup_assets.resources.warehouse import spark_uri

log = logging.getLogger(__name__)

USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
STORED = "__stored"
# The commit metadata is a session setting: one MERGE of this process sets it at a time.
_COMMITTING = threading.Lock()


def ingest_frame(
    raw: RawStore,
    spark: SparkSession,
    spec: SourceSpec,
    frame: DataFrame,
    change_source: ChangeSource,
    *,
    not_before: dt.datetime | None = None,
    file: str | None = None,
    written_by: str | None = None,
) -> IngestResult:
    """Upsert `frame` (columns named and typed as a file ingest takes them) into the archive in
    one delta-spark MERGE commit; IngestValidationError, writing nothing, when a row is invalid
    or before `not_before`. When the archive's computed columns changed while it ran, the frame
    is upserted again, so its rows hold the new formulas' values (as `RawStore.ingest`).
    `written_by` (a run, an asset) is recorded in the commit."""
    require_delta(spark)
    raw.ensure_table(spec)
    while True:
        table = raw.table(spec)
        seen = table.version() if table is not None else -1
        result = _ingest(
            raw,
            spark,
            raw.applied(spec, table),
            frame,
            change_source,
            not_before,
            file,
            written_by,
        )
        if not columns_changed_between(raw.uri(spec), raw.options, seen, result.version):
            return result
        log.info("'%s': computed columns changed during an ingest; upserting again", spec.name)


def require_delta(spark: SparkSession) -> None:
    """DeltaSparkMissingError unless the session loads Delta's SQL extension."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if not has_delta({"spark.sql.extensions": extensions}):
        raise DeltaSparkMissingError(
            "this Spark session does not load Delta (spark.sql.extensions has no "
            "DeltaSparkSessionExtension): start it with the project's Spark resource or "
            "`rollup_assets.resources.spark.build_session`, after "
            f"`{INSTALL_COMMAND}` fetched Delta's jars"
        )


def _ingest(
    raw: RawStore,
    spark: SparkSession,
    spec: SourceSpec,
    frame: DataFrame,
    change_source: ChangeSource,
    not_before: dt.datetime | None,
    file: str | None,
    written_by: str | None,
) -> IngestResult:
    summary = validate_frame(spec, frame, not_before, file)
    clauses = upsert_clauses(spec, summary.days)
    metadata = ingest_metadata(
        change_source, summary.rows, summary.min_ts, summary.max_ts, file, written_by=written_by
    )
    # How this ingest's commit is found in the log afterwards.
    metadata["rollups.ingest_id"] = uuid.uuid4().hex
    uri = raw.uri(spec)
    rows = frame.mapInArrow(_converting_task(spec), spark_schema(archive_schema(spec)))
    inserted = updated = 0
    for attempt in range(MERGE_ATTEMPTS):
        snapshot = DeltaTable(uri, storage_options=raw.options or None)
        base = snapshot.version()
        # Retention may have dropped days since the batch was validated or the last attempt
        # conflicted (with that very drop): the boundary is checked on every attempt's snapshot.
        kept = retained_from(snapshot)
        if kept is not None and summary.min_ts < kept:
            raise IngestValidationError.before_retention(
                spec.name, None, f"its first reading, at {summary.min_ts.isoformat()},", kept
            )
        # Computed once (conversion, formulas, the join with the stored rows), then counted and
        # merged from the copy Spark keeps.
        changing = _changing_rows(spark, spec, uri, base, rows, summary.days, clauses)
        changing = changing.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            metrics = (
                {} if not changing.count() else _merge(spark, uri, changing, clauses, metadata)
            )
        except Exception as exc:
            if not _conflicted(exc) or attempt == MERGE_ATTEMPTS - 1:
                raise
            log.debug("ingest into %s conflicted (%s); retrying", spec.name, exc)
            time.sleep(0.05 * 2**attempt)
            continue
        finally:
            changing.unpersist()
        inserted += int(metrics.get("num_inserted_rows", 0) or 0)
        updated += int(metrics.get("num_updated_rows", 0) or 0)
        version, read = _committed(uri, raw.options, metadata["rollups.ingest_id"])
        # The rows left out as unchanged were judged at `base`; a commit to the batch's days
        # after it (before the MERGE read the table) may have changed them: upsert again.
        if not _changed_days(uri, raw.options, base, read, summary.days):
            break
        log.info("'%s': rows changed while an ingest ran; upserting again", spec.name)
    return IngestResult(
        spec.name,
        version,
        summary.rows,
        summary.min_ts,
        summary.max_ts,
        summary.entities,
        change_source,
        inserted=inserted,
        updated=updated,
    )


def _changing_rows(
    spark: SparkSession,
    spec: SourceSpec,
    uri: str,
    version: int,
    rows: DataFrame,
    days: list[dt.date],
    clauses: UpsertClauses,
) -> DataFrame:
    """The batch's rows the upsert would change at `version`: new keys, and rows that differ
    from the stored ones (computed columns evaluated over the stored optional operands the
    batch leaves null). delta-spark rewrites every file a matched row is in, and a file
    rewritten with no changed row would show its rows in the change feed as deleted and
    inserted again, so the MERGE gets only these."""
    keys = key_columns(spec)
    stored = (
        spark.read.format("delta")
        .option("versionAsOf", version)
        .load(spark_uri(uri))
        .where(F.col(DAY_COLUMN).isin(*[F.lit(d) for d in days]))
    )
    operands = sorted(stored_operands(spec))
    if operands:
        kept = stored.select(*keys, *[F.col(o).alias(o + STORED) for o in operands])
        refill = _refilling_task(spec, operands)
        rows = rows.join(kept, keys, "left").mapInArrow(refill, rows.schema)
    on = [F.col(f"s.{k}") == F.col(f"t.{k}") for k in keys]
    joined = rows.alias("s").join(stored.alias("t"), on, "left")
    return joined.where(f"t.{keys[0]} IS NULL OR ({clauses.differs})").select("s.*")


def _merge(
    spark: SparkSession,
    uri: str,
    source: DataFrame,
    clauses: UpsertClauses,
    metadata: dict[str, str],
) -> dict:
    """One MERGE of `source` committing `metadata`; its metrics."""
    from delta.tables import DeltaTable as SparkDeltaTable

    target = SparkDeltaTable.forPath(spark, spark_uri(uri)).alias("t")
    merger = target.merge(source.alias("s"), clauses.predicate)
    if clauses.updates:
        updates: dict[str, str | Column] = dict(clauses.updates)
        merger = merger.whenMatchedUpdate(condition=clauses.differs, set=updates)
    with _COMMITTING:
        previous = spark.conf.get(USER_METADATA_CONF, None)
        spark.conf.set(USER_METADATA_CONF, json.dumps(metadata, sort_keys=True))
        try:
            result = merger.whenNotMatchedInsertAll().execute()
        finally:
            if previous is None:
                spark.conf.unset(USER_METADATA_CONF)
            else:
                spark.conf.set(USER_METADATA_CONF, previous)
    row = result.first() if result is not None else None
    return row.asDict() if row is not None else {}


def _conflicted(exc: Exception) -> bool:
    """Did the MERGE lose a race with a concurrent commit (and may simply run again)?"""
    from delta.exceptions import DeltaConcurrentModificationException

    return isinstance(exc, DeltaConcurrentModificationException) or "DELTA_CONCURRENT" in str(exc)


def _committed(uri: str, options: dict[str, str], ingest_id: str) -> tuple[int, int]:
    """(version of the commit recording `ingest_id`, the version its MERGE read); the table's
    current version twice when no such commit was made (nothing changed)."""
    table = DeltaTable(uri, storage_options=options or None)
    for commit in map(with_user_metadata, table.history(limit=50)):
        if commit.get("rollups.ingest_id") == ingest_id:
            version = int(commit["version"])
            return version, int(commit.get("readVersion", version - 1))
    return table.version(), table.version()


def _changed_days(
    uri: str, options: dict[str, str], after: int, upto: int, days: list[dt.date]
) -> bool:
    """Did a commit after `after`, up to `upto`, change rows of one of the UTC `days`?"""
    wanted = {d.isoformat() for d in days}
    for version in range(after + 1, upto + 1):
        for action in read_commit(uri, version, options):
            body = action.get("add") or action.get("remove")
            if body is None or not body.get("dataChange", True):
                continue
            day = (body.get("partitionValues") or {}).get(DAY_COLUMN)
            if day is None or day in wanted:
                return True
    return False


# -- Spark tasks (run on the executors) ----------------------------------------------------------


def _converting_task(
    spec: SourceSpec,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Rows in the archive's schema, computed columns from the batch's values."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        converter = BatchConverter(spec, archive_schema(spec))
        for batch in batches:
            yield from converter.convert(without_malformed(batch), 0).to_batches()

    return run


def _refilling_task(
    spec: SourceSpec, operands: list[str]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Rows whose optional operands the batch leaves null take the stored values (what the
    upsert leaves), with the computed columns evaluated again over them (`with_stored_operands`
    on the driver's path)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = archive_schema(spec)
        for batch in batches:
            columns = {name: batch.column(name) for name in schema.names}
            for o in operands:
                columns[o] = pc.coalesce(batch.column(o), batch.column(o + STORED))
            fill_computed(spec, columns, batch.num_rows)
            yield from pa.table({n: columns[n] for n in schema.names}, schema=schema).to_batches()

    return run
