"""Raw and time-range archives on Delta: provisioning, upsert ingest, and pruned reads.

A raw table is partitioned by the UTC day of its time column and has the change data feed on,
so the retroactive-write sensor can see every changed row. An ingest is one MERGE commit keyed by
(entity_id, time): required columns take the incoming value, optional ones keep the existing
value when the incoming one is null (COALESCE), so several producers can fill one reading.

Retention and ingest are fenced by the table itself: a retention commit records the instant
every earlier day is dropped before as the version of the app transaction `RETENTION_APP` (its
microseconds since the epoch), and every attempt of an ingest that may reach such old days
checks its rows against the value in the snapshot it merges into, and commits under the same
app id. A retention commit that lands between an attempt's snapshot and its commit makes the
attempt conflict; the next attempt sees the new instant and refuses the rows, writing nothing.
Without that, the MERGE retried on a snapshot without the dropped day would insert an updated
reading as a new one.
"""

import datetime as dt
import logging
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from pyspark.sql import DataFrame, SparkSession

from rollup_assets import metrics
from rollup_assets.compute.arrow_partials import rows_with_keys
from rollup_assets.compute.filters import rows_within
from rollup_assets.faults import checkpoint
from rollup_assets.model.asof import version_at
from rollup_assets.model.cells import Cells
from rollup_assets.model.column_rules import stored_operands
from rollup_assets.model.errors import AsOfUnavailableError, IngestValidationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.operations import OPERATION_KEY, Operation, is_data_change
from rollup_assets.model.progress import Progress
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    RawArchiveSpec,
    SourceSpec,
    TimeRangeArchiveSpec,
    key_columns,
)
from rollup_assets.model.windows import Window, as_utc, iso_utc, merge_windows, micros
from rollup_assets.resources.batch_conversion import with_stored_operands
from rollup_assets.resources.batch_sources import BatchSource, FileSource
from rollup_assets.resources.batches import BatchReader, BatchSummary
from rollup_assets.resources.delta_files import (
    ROW_GROUP_ROWS,
    TargetIndex,
    Targets,
    read_row_groups,
    targets_of,
)
from rollup_assets.resources.delta_tables import (
    TABLE_CONFIGURATION,
    commit_history,
    commit_info,
    file_actions,
    open_table,
    prune_files,
    read_commit,
    refuse_deletion_vectors,
    with_retries,
    with_user_metadata,
)
from rollup_assets.resources.raw_columns import (
    S,
    applied_spec,
    columns_changed_between,
)
from rollup_assets.resources.rollup_table import in_windows
from rollup_assets.resources.schemas import archive_data_schema, archive_schema, spark_schema
from rollup_assets.resources.upsert import ingest_metadata, upsert_clauses
from rollup_assets.resources.warehouse import Warehouse, data_file_uri, filesystem_for, spark_uri

log = logging.getLogger(__name__)
# Raw files are capped (about 15,000 energy readings each), and an ingest's rows are sorted
# by entity and time (`batches.py`): a file holds a narrow range of entities of one
# day, so an upsert rewrites only the capped files holding the rows it changes (the MERGE
# skips the others by their statistics), whatever the number of entities or days.
RAW_FILE_BYTES = 512 * 1024
RAW_CONFIGURATION = {
    **TABLE_CONFIGURATION,
    "delta.enableChangeDataFeed": "true",
    "delta.targetFileSize": str(RAW_FILE_BYTES),
}
MERGE_ATTEMPTS = 8
_DAY = dt.timedelta(days=1)
_LAST_DAYS = (dt.datetime.max - 2 * _DAY).date()  # later days: no window ends after them


def _utc_midnight(day: dt.date) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)


# The change data feed's columns: what a row change was, and the commit that made it.
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
# The app transaction whose version is the instant retention keeps rows from (microseconds).
RETENTION_APP = "rollups.retained_from"
# An ingest reaching days this close to a retention horizon (by the wall clock) commits under
# `RETENTION_APP`; newer batches cannot race a retention pass and do not serialize on it.
RETENTION_SLACK = dt.timedelta(days=2)


class ChangeFeedGone(Exception):
    """The change feed no longer reaches back to a version (log cleaned up, files vacuumed)."""


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


@dataclass(frozen=True)
class DroppedDays:
    """What one retention pass dropped from an archive: whole UTC days and their rows."""

    archive: str
    days: tuple[dt.date, ...]
    rows: int
    version: int | None  # the retention commit; None when nothing was dropped


class RawStore:
    def __init__(self, warehouse: Warehouse) -> None:
        self.warehouse = warehouse
        self.options = warehouse.storage_options
        # Per table: the version read up to, and the retention commits' spans up to it.
        self._retained: dict[str, tuple[int, list[Window]]] = {}

    def uri(self, spec: SourceSpec) -> str:
        return self.warehouse.raw_path(spec.name)

    def table(self, spec: SourceSpec, version: int | None = None) -> DeltaTable | None:
        return open_table(self.uri(spec), self.options, version)

    def table_at(self, spec: SourceSpec, at: dt.datetime) -> DeltaTable:
        """The archive's table as a reader saw it at `at` (Delta time travel by commit time);
        AsOfUnavailableError when `at` is before the table existed or older than retention
        keeps."""
        table = self.table(spec)
        if table is None:
            raise AsOfUnavailableError(
                f"'{spec.name}' has no table yet: nothing to read as of {iso_utc(at)}"
            )
        version = version_at(spec.name, [c for c, _ in commit_history(table)], at)
        table.load_as_version(version)
        return table

    def applied(self, spec: S, table: DeltaTable | None = None) -> S:
        """`spec` with the computed columns its table applies (`raw_columns.applied_spec`)."""
        return applied_spec(spec, table if table is not None else self.table(spec))

    def changed_within(self, spec: SourceSpec, after: int, window: Window) -> bool:
        """Could a commit after version `after` have changed rows placed in `window`? Exact for
        this project's ingests (their commits record the batch's min and max time); any other
        commit that may change data counts as reaching everywhere."""
        table = self.table(spec)
        if table is None or table.version() <= after:
            return False
        for commit in map(with_user_metadata, table.history(limit=table.version() - after)):
            if commit.get("version", after + 1) <= after or not is_data_change(commit):
                continue
            lo, hi = commit.get("rollups.min_ts"), commit.get("rollups.max_ts")
            if lo is None or hi is None:
                return True
            if dt.datetime.fromisoformat(lo) < window.end and window.start <= (
                dt.datetime.fromisoformat(hi)
            ):
                return True
        return False

    def retained_spans(self, spec: SourceSpec) -> list[Window]:
        """The time ranges retention deletes have dropped rows from, as their commits record
        them (whose rollup rows can no longer be aggregated again from the raw rows). Read from
        the table's history; only the commits after the last call are read again."""
        table = self.table(spec)
        if table is None:
            return []
        uri, version = self.uri(spec), table.version()
        known_version, known = self._retained.get(uri, (-1, []))
        if version < known_version:  # a table created again under this name
            known_version, known = -1, []
        if version > known_version:
            commits = [with_user_metadata(c) for c in table.history(limit=version - known_version)]
            known = known + [
                span
                for commit in sorted(commits, key=lambda c: c.get("version", 0))
                if commit.get("version", 0) > known_version
                and commit.get(OPERATION_KEY) == Operation.RETENTION
                for span in [_recorded_span(commit)]
            ]
            self._retained[uri] = (version, known)
        return list(known)

    def ensure_table(self, spec: SourceSpec) -> int:
        """Create the (empty) table if it does not exist (a table created before raw files were
        capped gets the cap); return its version."""
        existing = self.table(spec)
        if existing is not None:
            return _configured(existing).version()
        write_deltalake(
            self.uri(spec),
            archive_schema(spec).empty_table(),
            mode="ignore",
            partition_by=[DAY_COLUMN],
            configuration=RAW_CONFIGURATION,
            commit_properties=CommitProperties(
                custom_metadata={OPERATION_KEY: Operation.PROVISION}
            ),
            storage_options=self.options or None,
        )
        created = self.table(spec)
        assert created is not None
        return created.version()

    def drop(self, spec: SourceSpec) -> None:
        """Delete the archive's table (a deleted archive)."""
        self.warehouse.drop_table(self.uri(spec))

    def ingest(
        self,
        spec: SourceSpec,
        source: BatchSource | str | Path,
        change_source: ChangeSource,
        *,
        not_before: dt.datetime | None = None,
        progress: Progress | None = None,
        written_by: str | None = None,
    ) -> IngestResult:
        """`_ingest` of `source` (a file's path, or a `BatchSource` of data in memory) with the
        computed columns the table applies; when they changed while the batch was being upserted
        (a columns commit it did not see), the batch is upserted again, so its rows hold the new
        formulas' values. `written_by` (who wrote the batch: a run, an asset) is recorded in the
        commit."""
        if not isinstance(source, BatchSource):
            source = FileSource(spec.name, source)
        while True:
            table = self.table(spec)
            seen = table.version() if table is not None else -1
            try:
                result = self._ingest(
                    self.applied(spec, table),
                    source,
                    change_source,
                    not_before=not_before,
                    progress=progress,
                    written_by=written_by,
                )
            except Exception as exc:
                metrics.ingest_failed(spec.name, exc)
                raise
            if not columns_changed_between(self.uri(spec), self.options, seen, result.version):
                metrics.ingested(result)
                return result
            log.info("'%s': computed columns changed during an ingest; upserting again", spec.name)

    def _ingest(
        self,
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
        reader, summary = _validated(spec, source, not_before, progress)
        clauses = upsert_clauses(spec, summary.days)
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
            table = self.table(spec)
            if table is None:
                table = DeltaTable(self.uri(spec), storage_options=self.options or None)
            table = _configured(table)
            fence = retained_from(table)
            _require_retained(spec, summary, fence)
            checkpoint("merge_attempt", spec.name)
            txns = [Transaction(RETENTION_APP, table.transaction_version(RETENTION_APP) or 0)]
            batches = reader.chunks()
            if operands:
                files = file_actions(table) if table.version() >= 0 else []
                batches = (
                    with_stored_operands(
                        spec, b, self._stored_rows_of(spec, b, files, sorted(operands)), operands
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

    def preview_ingest(
        self, spec: SourceSpec, path: str | Path, *, not_before: dt.datetime | None = None
    ) -> "UpsertPreview":
        """What `ingest` of `path` would change, writing nothing: the same validation (raises
        IngestValidationError), then the upsert's rules (`_ingest`) applied on the driver to
        the stored rows with the file's keys."""
        table = self.table(spec)
        spec = self.applied(spec, table)
        reader, summary = _validated(spec, path, not_before, None)
        batch = pa.Table.from_batches(list(reader.chunks()), schema=reader.schema)
        stored = self._stored_rows_of(spec, batch, [] if table is None else file_actions(table))
        day = archive_schema(spec).field(DAY_COLUMN)
        stored = stored.append_column(day, pc.cast(stored[spec.time_column], day.type))
        operands = stored_operands(spec)
        if operands:
            batch = pa.Table.from_batches(
                [with_stored_operands(spec, b, stored, operands) for b in batch.to_batches()],
                schema=reader.schema,
            ).cast(reader.schema)
        keys = key_columns(spec)
        values = [c.name for c in spec.columns]
        t = stored.select([*keys, *values]).rename_columns([*keys, *[f"t__{c}" for c in values]])
        t = t.append_column("__t", pa.array([True] * t.num_rows, pa.bool_()))
        joined = batch.join(t, keys, join_type="left outer")
        matched = pc.fill_null(joined["__t"], False)
        changed = pc.invert(matched)
        merged = {}
        takes_batch = {c.name for c in spec.columns if c.required or c.is_computed}
        for c in values:
            s, old = joined[c], joined[f"t__{c}"]
            if c in takes_batch:
                merged[c] = s
                differs = _distinct(s, old)
            else:
                merged[c] = pc.if_else(pc.is_null(s), old, s)
                differs = pc.and_(pc.is_valid(s), _distinct(s, old))
            changed = pc.or_(changed, pc.and_(matched, differs))
        new = joined.select([*keys, DAY_COLUMN])
        for c in values:
            new = new.append_column(c, merged[c])
        new = new.select(stored.schema.names).cast(stored.schema).filter(changed)
        replaced = new.select(keys).join(stored, keys, join_type="inner")
        old_rows = replaced.select(stored.schema.names).cast(stored.schema)
        return UpsertPreview(
            spec.name, None if table is None else table.version(), summary.rows, old_rows, new
        )

    def delete_rows(
        self,
        spec: SourceSpec,
        span: Window,
        entities: frozenset[str] | None,
        change_source: ChangeSource,
        *,
        retention: bool,
    ) -> tuple[int | None, int]:
        """Delete the rows whose time falls in `span` (and entity in `entities`) in one commit;
        return its version (None when no row matched: nothing is committed) and the rows
        deleted.

        A correction (`retention` False) is a change like any other: the rollups drop what the
        rows contributed. Retention (`retention` True) drops old raw rows on purpose: the commit
        says so, change detection and the change feed skip it, and the rollups keep what they
        aggregated from those rows.
        """
        table = self.table(spec)
        if table is None:
            return None, 0
        time_col = spec.time_column
        lo, hi = span.start.astimezone(dt.UTC), span.end.astimezone(dt.UTC)
        last_day = (hi - dt.timedelta(microseconds=1)).date()
        parts = [
            f"{DAY_COLUMN} >= '{lo.date().isoformat()}'",
            f"{DAY_COLUMN} <= '{last_day.isoformat()}'",
            f"{time_col} >= '{lo.isoformat()}'",
            f"{time_col} < '{hi.isoformat()}'",
        ]
        if entities is not None:
            quoted = ", ".join("'" + e.replace("'", "''") + "'" for e in sorted(entities))
            parts.append(f"entity_id IN ({quoted})")
        metadata = {
            OPERATION_KEY: Operation.RETENTION if retention else Operation.DELETE,
            "rollups.change_source": change_source.value,
            "rollups.min_ts": lo.isoformat(),
            "rollups.max_ts": (hi - dt.timedelta(microseconds=1)).isoformat(),
        }
        return self._delete(spec, " AND ".join(parts), metadata)

    def drop_days_before(self, spec: SourceSpec, cut: dt.datetime) -> "DroppedDays":
        """Retention: drop every UTC-day partition before midnight `cut` in one commit (whole
        files, nothing rewritten), marked as retention so detection, the forward lane and the
        change feed skip it. Returns the days and rows dropped (no commit when none)."""
        table = self.table(spec)
        if table is None:
            return DroppedDays(spec.name, (), 0, None)
        first_kept = cut.astimezone(dt.UTC).date()
        days = sorted(
            {
                day
                # Whole days are deleted by delta-rs, which applies deletion vectors itself.
                for f in file_actions(table, deletion_vectors="mark")
                for day in [_partition_day(f)]
                if day is not None and day < first_kept
            }
        )
        if not days:
            return DroppedDays(spec.name, (), 0, None)
        first = dt.datetime.combine(days[0], dt.time(0), tzinfo=dt.UTC)
        metadata = {
            OPERATION_KEY: Operation.RETENTION,
            "rollups.min_ts": first.isoformat(),
            "rollups.max_ts": (cut - dt.timedelta(microseconds=1)).isoformat(),
            "rollups.retained_from": cut.isoformat(),
        }
        version, rows = self._delete(
            spec,
            f"{DAY_COLUMN} < '{first_kept.isoformat()}'",
            metadata,
            txn=Transaction(RETENTION_APP, micros(cut)),
        )
        return DroppedDays(spec.name, tuple(days), rows, version)

    def fence_retention(self, spec: SourceSpec, cut: dt.datetime) -> None:
        """Record in the table that nothing before midnight `cut` is kept, when no day was left
        to drop (an ingest racing this pass then conflicts, and sees it: see the module)."""
        table = self.table(spec)
        if table is None or (retained_from(table) or BEGINNING_OF_TIME) >= cut:
            return

        def attempt() -> None:
            current = self.table(spec)
            assert current is not None
            if (retained_from(current) or BEGINNING_OF_TIME) >= cut:
                return
            current.create_write_transaction(
                [],
                mode="append",
                schema=current.schema(),
                partition_by=[DAY_COLUMN],
                commit_properties=CommitProperties(
                    custom_metadata={
                        OPERATION_KEY: Operation.RETENTION,
                        "rollups.min_ts": BEGINNING_OF_TIME.isoformat(),
                        "rollups.max_ts": (cut - dt.timedelta(microseconds=1)).isoformat(),
                        "rollups.retained_from": cut.isoformat(),
                    },
                    app_transactions=[Transaction(RETENTION_APP, micros(cut))],
                ),
            )

        with_retries(
            attempt,
            retryable=lambda exc: isinstance(exc, CommitFailedError),
            attempts=MERGE_ATTEMPTS,
            what=f"retention fence of {spec.name}",
        )

    def _delete(
        self,
        spec: SourceSpec,
        predicate: str,
        metadata: dict[str, str],
        txn: Transaction | None = None,
    ) -> tuple[int | None, int]:
        """Delete the rows matching `predicate` in one commit carrying `metadata` (and `txn`):
        (its version, or None when no row matched, and the rows deleted)."""

        def delete() -> tuple[int | None, int]:
            current = self.table(spec)
            assert current is not None
            metrics = current.delete(
                predicate,
                commit_properties=CommitProperties(
                    custom_metadata=metadata, app_transactions=[txn] if txn else None
                ),
            )
            deleted = int(metrics.get("num_deleted_rows", 0) or 0)
            return (current.version() if deleted else None), deleted

        return with_retries(
            delete,
            retryable=lambda exc: isinstance(exc, CommitFailedError),
            attempts=MERGE_ATTEMPTS,
            what=f"delete from {spec.name}",
        )

    # -- reads ---------------------------------------------------------------------------------

    def files_for(
        self,
        table: DeltaTable,
        spec: SourceSpec,
        spans: Sequence[Window] | None,
        entities: frozenset[str] | None,
    ) -> list[dict]:
        """Live files that may hold rows whose time falls in `spans` (partition day + stats);
        UnsupportedTableFeatureError when one of them has rows deleted by a deletion vector."""
        files = prune_files(
            file_actions(table, deletion_vectors="mark"),
            time_column=spec.time_column,
            spans=spans,
            entities=entities,
            day_column=DAY_COLUMN,
        )
        refuse_deletion_vectors(table, files)
        return files

    def read_spark(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        table: DeltaTable | None = None,
    ) -> tuple[DataFrame, int | None]:
        """Rows whose time falls in `spans` (and entity in `entities`), and the version read."""
        table = table or self.table(spec)
        schema = spark_schema(archive_data_schema(spec))
        if table is None:
            return spark.createDataFrame([], schema), None
        files = self.files_for(table, spec, spans, entities)
        if not files:
            return spark.createDataFrame([], schema), table.version()
        root = self.uri(spec)
        df = spark.read.schema(schema).parquet(
            *[spark_uri(data_file_uri(root, f["path"])) for f in files]
        )
        df = rows_within(df, spec.time_column, spans, entities)
        return df, table.version()

    def changes(
        self,
        spec: SourceSpec,
        after: int,
        upto: int,
        spans: Sequence[Window],
        entities: frozenset[str] | None,
    ) -> tuple[pa.Table, int]:
        """Every row change committed after version `after` up to `upto` to rows whose time
        falls in `spans` (and entity in `entities`): the archive's columns, `CHANGE_TYPE`
        (insert, delete, update_preimage, update_postimage) and `COMMIT_VERSION`; and how many
        change rows were read to find them.

        Read from each commit's change files where it has them, otherwise from the files it
        added (inserts) and removed (deletes), as the change data feed defines. Commits that
        change no row, commits of this project's ingests outside `spans` (their time range is
        in the commit) and retention commits are skipped. Raises ChangeFeedGone when a commit
        or a file it names is no longer there.
        """
        uri = self.uri(spec)
        commits: list[tuple[int, list[dict], dict]] = []
        for version in range(after + 1, upto + 1):
            try:
                actions = read_commit(uri, version, self.options)
            except FileNotFoundError:
                raise ChangeFeedGone(
                    f"'{spec.name}': commit {version} is no longer in the table's log"
                ) from None
            info = commit_info(actions)
            if info.get(OPERATION_KEY) == Operation.COLUMNS:
                # The stored partials predate new formulas: changes cannot bring them up to date.
                raise ChangeFeedGone(f"'{spec.name}': its computed columns changed at {version}")
            commits.append((version, actions, info))
        merged = merge_windows(list(spans))
        schema = archive_data_schema(self.applied(spec))
        out_schema = schema.append(pa.field(CHANGE_TYPE, pa.string())).append(
            pa.field(COMMIT_VERSION, pa.int64())
        )
        parts: list[pa.Table] = []
        read = 0
        for version, actions, info in commits:
            cdc = [a["cdc"] for a in actions if "cdc" in a]
            if not is_data_change(info, writes_change_files=bool(cdc)):
                continue
            lo, hi = info.get("rollups.min_ts"), info.get("rollups.max_ts")
            if lo is not None and hi is not None:
                first, last = dt.datetime.fromisoformat(lo), dt.datetime.fromisoformat(hi)
                if not any(first < w.end and w.start <= last for w in merged):
                    continue
            files: list[tuple[dict, str | None]]
            if cdc:
                files = [(body, None) for body in cdc]
            else:
                files = [
                    (a[kind], "insert" if kind == "add" else "delete")
                    for a in actions
                    for kind in ("add", "remove")
                    if kind in a and a[kind].get("dataChange", True)
                ]
            changed: Iterable[pa.Table]
            if not cdc and any(body.get("deletionVector") for body, _ in files):
                # Rows deleted through deletion vectors: the commit has no change files, and
                # its files read whole would hold the deleted rows.
                changed = [self._derived_changes(spec, version)]
            else:
                changed = (
                    self._read_change_file(spec, body["path"], change_type)
                    for body, change_type in files
                    if _day_may_overlap(body, merged)
                )
            for rows in changed:
                read += rows.num_rows
                mask = in_windows(rows[spec.time_column], merged)
                if entities is not None:
                    wanted = pa.array(sorted(entities), pa.string())
                    mask = pc.and_(mask, pc.is_in(rows["entity_id"], value_set=wanted))
                rows = rows.filter(mask)
                if rows.num_rows:
                    rows = rows.append_column(
                        COMMIT_VERSION, pa.array([version] * rows.num_rows, pa.int64())
                    )
                    parts.append(rows.select(out_schema.names).cast(out_schema))
        return (pa.concat_tables(parts) if parts else out_schema.empty_table()), read

    def change_file_rows(self, spec: SourceSpec, cdc: list[dict]) -> int:
        """Rows in the change files of `cdc` actions (their footers only)."""
        fs, root = filesystem_for(self.uri(spec), self.options)
        total = 0
        for body in cdc:
            with fs.open_input_file(f"{root}/{urllib.parse.unquote(body['path'])}") as fh:
                total += pq.ParquetFile(fh).metadata.num_rows
        return total

    def _derived_changes(self, spec: SourceSpec, version: int) -> pa.Table:
        """The row changes of commit `version`, derived by delta-rs (a commit that deleted rows
        through deletion vectors has no change files, and its files read whole would hold
        the deleted rows), with the archive's columns as stored and `CHANGE_TYPE`."""
        schema = archive_data_schema(spec)
        table = self.table(spec)
        if table is None:
            raise ChangeFeedGone(f"'{spec.name}': its table is gone")
        try:
            data = pa.table(table.load_cdf(starting_version=version, ending_version=version))
        except DeltaError as exc:
            raise ChangeFeedGone(f"'{spec.name}': commit {version}'s changes: {exc}") from None
        kinds = data[CHANGE_TYPE].cast(pa.string())
        return data.select(schema.names).cast(schema).append_column(CHANGE_TYPE, kinds)

    def _read_change_file(self, spec: SourceSpec, path: str, change_type: str | None) -> pa.Table:
        """One change file (its `CHANGE_TYPE` column), or a data file whose every row had
        `change_type`, with the archive's columns as stored."""
        schema = archive_data_schema(spec)
        fs, root = filesystem_for(self.uri(spec), self.options)
        names = [*schema.names, *([CHANGE_TYPE] if change_type is None else [])]
        try:
            with fs.open_input_file(f"{root}/{urllib.parse.unquote(path)}") as fh:
                data = pq.read_table(fh, columns=names)
        except FileNotFoundError:
            raise ChangeFeedGone(f"'{spec.name}': file {path} is no longer there") from None
        kinds = (
            data[CHANGE_TYPE].cast(pa.string())
            if change_type is None
            else pa.array([change_type] * data.num_rows, pa.string())
        )
        return data.select(schema.names).cast(schema).append_column(CHANGE_TYPE, kinds)

    def read_rows(
        self,
        spec: SourceSpec,
        spans: Sequence[Window],
        entities: frozenset[str] | None,
        table: DeltaTable | None = None,
        cells: Cells | None = None,
    ) -> tuple[pa.Table, int | None]:
        """On the driver: rows whose time falls in `spans` (and entity in `entities`), and the
        version read (of `table` when given). Only the files and row groups whose statistics
        may hold such rows (of `cells`, when given) are read: a few cells' rows cost about a row
        group each, not the cross product of their buckets and entities."""
        table = table or self.table(spec)
        schema = archive_data_schema(spec)
        if table is None:
            return schema.empty_table(), None
        files = self.files_for(table, spec, spans, entities)
        listed = list(cells) if cells is not None else targets_of(spans, entities)
        targets = None if listed is None else TargetIndex(listed)
        parts = [self._read_file(spec, f, targets) for f in files]
        data = pa.concat_tables(
            [p.select(schema.names).cast(schema) for p in parts] or [schema.empty_table()]
        )
        mask = in_windows(data[spec.time_column], spans)
        if entities is not None:
            wanted = pa.array(sorted(entities), pa.string())
            mask = pc.and_(mask, pc.is_in(data["entity_id"], value_set=wanted))
        return data.filter(mask), table.version()

    def _stored_rows_of(
        self,
        spec: RawArchiveSpec | TimeRangeArchiveSpec,
        batch: pa.RecordBatch | pa.Table,
        files: list[dict],
        values: Sequence[str] | None = None,
    ) -> pa.Table:
        """The stored rows with the keys of `batch` rows (their key columns and `values`; None:
        every column), from the live `files` of the snapshot it upserts into. Only the row
        groups that may hold one of its (UTC day, entity) cells are read, and each file's rows
        are narrowed to the batch's keys as it is read, so a batch of scattered late rows holds
        about its own size, not every row between its first and last instant. Reads files with
        Arrow only (it runs inside a MERGE's input stream, where delta-rs cannot be called)."""
        schema = archive_data_schema(spec)
        key_names = key_columns(spec)
        if values is not None:
            schema = pa.schema([schema.field(n) for n in [*key_names, *values]])
        if not files or batch.num_rows == 0:
            return schema.empty_table()
        wanted_keys = pa.table({k: batch.column(k) for k in key_names}).cast(
            pa.schema([schema.field(k) for k in key_names])
        )

        def read(f: dict, targets: TargetIndex | None) -> pa.Table:
            data = self._read_file(spec, f, targets, schema.names)
            return rows_with_keys(data.select(schema.names).cast(schema), wanted_keys, key_names)

        keys = (
            pa.table(
                {
                    "day": pc.cast(batch.column(spec.time_column), pa.date32()),
                    "entity": batch.column(ENTITY_COLUMN),
                }
            )
            .group_by(["day", "entity"])
            .aggregate([])
        )
        if pc.max(keys["day"]).as_py() > _LAST_DAYS:
            # A row in the last representable days (no window ends after them): read all.
            return pa.concat_tables([read(f, None) for f in files])
        days = {d: _utc_midnight(d) for d in pc.unique(keys["day"]).to_pylist()}
        if not prune_files(
            files,
            time_column=spec.time_column,
            spans=merge_windows([Window(t, t + _DAY) for t in days.values()]),
            entities=None,
            day_column=DAY_COLUMN,
        ):
            return schema.empty_table()  # new days (a first load): nothing stored to match
        pairs = {
            (Window(days[d], days[d] + _DAY), e)
            for d, e in zip(keys["day"].to_pylist(), keys["entity"].to_pylist(), strict=True)
        }
        cells = Cells.from_pairs(pairs, limit=len(pairs))
        spans = merge_windows(list(cells.windows))
        wanted = prune_files(
            files,
            time_column=spec.time_column,
            spans=spans,
            entities=cells.entities,
            day_column=DAY_COLUMN,
        )
        targets = TargetIndex(list(cells))
        return pa.concat_tables([read(f, targets) for f in wanted] or [schema.empty_table()])

    def _read_file(
        self,
        spec: SourceSpec,
        f: dict,
        targets: Targets | TargetIndex | None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The row groups of one data file that may hold rows of `targets` (every stored
        column, or `columns`)."""
        return read_row_groups(
            self.uri(spec),
            self.options,
            f["path"],
            list(columns) if columns is not None else archive_data_schema(spec).names,
            spec.time_column,
            targets,
        )

    def read_arrow(
        self,
        spec: SourceSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        table: DeltaTable | None = None,
    ) -> pa.Table:
        """Rows with their time in `spans` (and entity in `entities`), of `table` when given (a
        snapshot of this archive), else of the latest version."""
        table = table or self.table(spec)
        schema = archive_schema(self.applied(spec, table))
        if table is None:
            return schema.empty_table()
        time_col = spec.time_column
        # One conjunction per merged window (OR-ed), so rows in gaps between spans stay out.
        filters = [
            [(time_col, ">=", w.start), (time_col, "<", w.end)]
            for w in merge_windows(list(spans or []))
        ]
        data = pa.table(table.to_pyarrow_table(filters=filters or None))
        data = data.select(schema.names).cast(schema)
        if entities is not None:
            # Filtered here, not pushed down: MERGE writes string_view files, whose statistics
            # pyarrow cannot compare with a string `in` filter.
            wanted = pa.array(sorted(entities), pa.string())
            data = data.filter(pc.is_in(data["entity_id"], value_set=wanted))
        return data


def _configured(table: DeltaTable) -> DeltaTable:
    """`table` with the raw tables' configuration (one commit changing no row, the first
    time a table created before it is written)."""
    configured = table.metadata().configuration
    missing = {k: v for k, v in RAW_CONFIGURATION.items() if configured.get(k) != v}
    if missing:
        table.alter.set_table_properties(missing, raise_if_not_exists=False)
        table.update_incremental()
    return table


def _validated(
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
        raise IngestValidationError(
            spec.name,
            None,
            f"it holds readings from {as_utc(summary.min_ts).isoformat()}, before "
            f"{not_before.isoformat()}: retention has dropped those days",
        )


BEGINNING_OF_TIME = dt.datetime(1, 1, 1, tzinfo=dt.UTC)


def retained_from(table: DeltaTable) -> dt.datetime | None:
    """The instant a raw table's snapshot keeps rows from (None: retention never dropped)."""
    at = table.transaction_version(RETENTION_APP)
    if not at:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=at)


@dataclass(frozen=True)
class UpsertPreview:
    """What an ingest of a file would change, computed without writing."""

    archive: str
    version: int | None  # the table version the preview read (None: no table yet)
    rows: int  # rows in the file
    old: pa.Table  # the stored rows the upsert would replace (archive schema)
    new: pa.Table  # the rows it would insert or replace, as they would be stored

    @property
    def inserted(self) -> int:
        return self.new.num_rows - self.old.num_rows

    @property
    def updated(self) -> int:
        return self.old.num_rows

    @property
    def unchanged(self) -> int:
        return self.rows - self.new.num_rows


def _distinct(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """`a IS DISTINCT FROM b`, NaN equal to NaN."""
    same = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return pc.invert(same)


def _recorded_span(commit: dict) -> Window:
    """The time range a retention commit recorded; everything for one that recorded none."""
    lo, hi = commit.get("rollups.min_ts"), commit.get("rollups.max_ts")
    if lo is None or hi is None:
        return Window(
            dt.datetime.min.replace(tzinfo=dt.UTC), dt.datetime.max.replace(tzinfo=dt.UTC)
        )
    end = dt.datetime.fromisoformat(hi) + dt.timedelta(microseconds=1)
    return Window(dt.datetime.fromisoformat(lo), end)


def _partition_day(f: dict) -> dt.date | None:
    """The UTC day partition of a live file (`file_actions`; None when it has none)."""
    value = f.get(f"partition.{DAY_COLUMN}")
    if value is None:
        return None
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))


def _day_may_overlap(body: dict, merged: Sequence[Window]) -> bool:
    """Could a file of the UTC-day partition in `body` hold rows in `merged`?"""
    day = (body.get("partitionValues") or {}).get(DAY_COLUMN)
    if not day:
        return True
    d0 = dt.datetime.combine(dt.date.fromisoformat(day), dt.time(0), tzinfo=dt.UTC)
    d1 = d0 + dt.timedelta(days=1)
    return any(w.start < d1 and d0 < w.end for w in merged)
