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

A delete is one commit too: a correction (the rollups drop what the rows contributed) or
retention (the rollups keep it).
"""

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from rollup_assets.model.errors import InvalidArchiveOperationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.progress import Progress
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window
from rollup_assets.resources import spark_ingest
from rollup_assets.resources.raw_store import IngestResult, SourceSpec
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
) -> IngestResult:
    """Upsert `source` (a DataFrame with a file's columns, or a Parquet or CSV file, path or URI,
    that Spark reads) into an activated raw or time-range archive with delta-spark's MERGE on
    the executors: validated whole in Spark tasks, then one commit, as `ingest_file` does on the
    driver."""
    spec, state = writable_archive(engine, archive)
    file = None
    if not isinstance(source, DataFrame):
        file = str(source).rstrip("/").rsplit("/", 1)[-1]
        source = spark_ingest.read_file(spark, spec, source)
    return spark_ingest.ingest_frame(
        engine.raw, spark, spec, source, change_source, not_before=state.retained_from, file=file
    )
