"""Writing an activated raw or time-range archive: ingest a file, or delete rows.

This is the Python API for writing an archive (the CLI's `ingest` and `delete-rows` call it).
The archive must be a raw or time-range archive, activated with the spec it is declared with
(`ArchiveNotActivatedError` otherwise, before anything is read or written). An ingest validates
the file whole and upserts it in one commit (`RawStore.ingest`), or writes nothing; a file with
readings before what retention keeps (the archive's `retained_from`) is refused whole. The
store below (`Engine.raw`) applies no gate: it is the adapter these use cases guard.

A large batch (a Spark DataFrame, or a file larger than this process should hold) is upserted
by delta-spark on the executors instead (`ingest_with_spark`), with the same rules and the same
all-or-nothing commit.

`ingest` takes readings wherever they are: a file's path, a pandas DataFrame, a pyarrow Table or
RecordBatchReader (each fed to the file ingest's validation and MERGE, `batch_sources`), or a
Spark DataFrame (`ingest_with_spark`). The rows, the refusals (with the row's 0-based position in
the caller's data), the change feed and the result are those of the same rows in a file.

A delete is one commit too: a correction (the rollups drop what the rows contributed) or
retention (the rollups keep it).
"""

from pathlib import Path
from typing import TypeAlias

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from rollup_assets.model.errors import IngestValidationError, InvalidArchiveOperationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.progress import Progress
from rollup_assets.model.specs import RollupSpec, SourceSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window
from rollup_assets.resources import spark_batches, spark_ingest
from rollup_assets.resources.batch_sources import (
    BatchSource,
    FileSource,
    StreamSource,
    TableSource,
    table_from_pandas,
)
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.services.engine import Engine


def writable_archive(engine: Engine, archive: str) -> tuple[SourceSpec, ArchiveState]:
    """The spec and state of `archive`, which must be an activated raw or time-range archive."""
    spec = engine.catalog.archive(archive)
    if isinstance(spec, RollupSpec):
        raise InvalidArchiveOperationError(
            f"'{archive}' is a rollup; rollups are written by the system only"
        )
    return spec, engine.require_activated(spec)


def delete_rows(
    engine: Engine,
    archive: str,
    span: Window,
    entities: frozenset[str] | None,
    change_source: ChangeSource,
    *,
    retention: bool,
) -> tuple[int | None, int]:
    """Delete the archive's rows in `span` (of `entities`): (commit version or None, rows)."""
    spec, _ = writable_archive(engine, archive)
    return engine.raw.delete_rows(spec, span, entities, change_source, retention=retention)


# What `ingest` takes: a file's path, or readings in memory.
Readings: TypeAlias = (
    str | Path | pd.DataFrame | pa.Table | pa.RecordBatch | pa.RecordBatchReader | DataFrame
)


def ingest(
    engine: Engine,
    archive: str,
    data: Readings,
    change_source: ChangeSource,
    *,
    progress: Progress | None = None,
    written_by: str | None = None,
) -> IngestResult:
    """Upsert `data` into an activated raw or time-range archive, all or nothing, as a file
    ingest does: a path is a Parquet or CSV file (`ingest_file`); a pandas DataFrame (its
    columns; the index is not a column), a pyarrow Table or RecordBatch, or a RecordBatchReader
    (streamed: its batches are kept in a temporary file between the passes, never in memory
    whole) is validated and upserted by the same code; a Spark DataFrame by delta-spark on the
    executors (`ingest_with_spark`). A bad row raises IngestValidationError naming its 0-based
    position in `data` (for a DataFrame, its position, not its index label), and nothing is
    written. `written_by` (a run, an asset) is recorded in the commit; `progress(pass, rows)`
    hears of each chunk validated and upserted (not for a Spark DataFrame)."""
    if isinstance(data, DataFrame):
        return ingest_with_spark(
            engine, data.sparkSession, archive, data, change_source, written_by=written_by
        )
    spec, state = writable_archive(engine, archive)
    with _source_of(spec, data) as source:
        return engine.raw.ingest(
            spec,
            source,
            change_source,
            not_before=state.retained_from,
            progress=progress,
            written_by=written_by,
        )


def _source_of(spec: SourceSpec, data: Readings) -> BatchSource:
    """The rows of `data` as the file ingest reads them; a file's path stays a file."""
    if isinstance(data, str | Path):
        return FileSource(spec.name, data)
    if isinstance(data, pd.DataFrame):
        return TableSource(spec.name, table_from_pandas(data), "the pandas DataFrame")
    if isinstance(data, pa.Table):
        return TableSource(spec.name, data)
    if isinstance(data, pa.RecordBatch):
        return TableSource(spec.name, pa.Table.from_batches([data]), "the record batch")
    if isinstance(data, pa.RecordBatchReader):
        return StreamSource(spec.name, data)
    raise IngestValidationError(
        spec.name,
        None,
        f"cannot ingest a {type(data).__name__}: pass a file's path, a pandas DataFrame, a "
        "pyarrow Table, RecordBatch or RecordBatchReader, or a Spark DataFrame",
    )


def ingest_file(
    engine: Engine,
    archive: str,
    path: str | Path,
    change_source: ChangeSource,
    progress: Progress | None = None,
) -> IngestResult:
    """Ingest a Parquet or CSV file into an activated raw or time-range archive, as
    `rollups ingest` does; `progress(pass, rows)` hears of each chunk validated and upserted."""
    spec, state = writable_archive(engine, archive)
    return engine.raw.ingest(
        spec, path, change_source, not_before=state.retained_from, progress=progress
    )


def ingest_with_spark(
    engine: Engine,
    spark: SparkSession,
    archive: str,
    source: DataFrame | str | Path,
    change_source: ChangeSource,
    *,
    written_by: str | None = None,
) -> IngestResult:
    """Upsert `source` (a DataFrame with a file's columns, or a Parquet or CSV file, path or URI,
    that Spark reads) into an activated raw or time-range archive with delta-spark's MERGE on
    the executors: validated whole in Spark tasks, then one commit, as `ingest_file` does on the
    driver."""
    spec, state = writable_archive(engine, archive)
    file = None
    if not isinstance(source, DataFrame):
        file = str(source).rstrip("/").rsplit("/", 1)[-1]
        source = spark_batches.read_file(spark, spec, source)
    return spark_ingest.ingest_frame(
        engine.raw,
        spark,
        spec,
        source,
        change_source,
        not_before=state.retained_from,
        file=file,
        written_by=written_by,
    )
