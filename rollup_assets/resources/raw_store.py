"""The store of raw and time-range archives: provisioning and history of their tables, and the
one surface the engine and services call for ingest, preview, deletes, reads and row changes.

Each concern lives in its own module: the tables and the retention fence (`raw_tables`), the
MERGE ingest (`raw_ingest`) and its preview (`upsert_preview`), deletes and retention
(`raw_deletes`), pruned reads (`raw_reads`) and the change feed (`commit_changes`).
"""

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession

from rollup_assets.model.asof import version_at
from rollup_assets.model.cells import Cells
from rollup_assets.model.errors import AsOfUnavailableError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.operations import OPERATION_KEY, Operation, is_data_change
from rollup_assets.model.progress import Progress
from rollup_assets.model.specs import DAY_COLUMN, SourceSpec
from rollup_assets.model.windows import Window, iso_utc
from rollup_assets.resources import (
    commit_changes,
    raw_deletes,
    raw_ingest,
    raw_reads,
    upsert_preview,
)
from rollup_assets.resources.batch_sources import BatchSource
from rollup_assets.resources.delta_commits import table_identity
from rollup_assets.resources.delta_tables import commit_history, with_user_metadata
from rollup_assets.resources.memory import returning_memory
from rollup_assets.resources.raw_deletes import DroppedDays
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.raw_tables import RAW_CONFIGURATION, RawTables, configured
from rollup_assets.resources.schemas import archive_schema
from rollup_assets.resources.upsert_preview import UpsertPreview
from rollup_assets.resources.warehouse import Warehouse


class RawStore(RawTables):
    """The raw and time-range archives of one warehouse."""

    def __init__(self, warehouse: Warehouse) -> None:
        super().__init__(warehouse)
        # Per table location: the table read (its identity), the version read up to, and the
        # retention commits' spans up to it.
        self._retained: dict[str, tuple[str, int, list[Window]]] = {}

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
        uri, version, identity = self.uri(spec), table.version(), table_identity(table)
        known_identity, known_version, known = self._retained.get(uri, ("", -1, []))
        if identity != known_identity:  # a table created again under this name
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
            self._retained[uri] = (identity, version, known)
        return list(known)

    def ensure_table(self, spec: SourceSpec) -> int:
        """Create the (empty) table if it does not exist (a table created before raw files were
        capped gets the cap); return its version."""
        existing = self.table(spec)
        if existing is not None:
            return configured(existing).version()
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

    @returning_memory
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
        """Upsert `source` into the archive in one MERGE commit (`raw_ingest.ingest`)."""
        return raw_ingest.ingest(
            self,
            spec,
            source,
            change_source,
            not_before=not_before,
            progress=progress,
            written_by=written_by,
        )

    def preview_ingest(
        self, spec: SourceSpec, path: str | Path, *, not_before: dt.datetime | None = None
    ) -> UpsertPreview:
        """What `ingest` of `path` would change, writing nothing (`upsert_preview`)."""
        return upsert_preview.preview_ingest(self, spec, path, not_before=not_before)

    def delete_rows(
        self,
        spec: SourceSpec,
        span: Window,
        entities: frozenset[str] | None,
        change_source: ChangeSource,
        *,
        retention: bool,
    ) -> tuple[int | None, int]:
        """Delete the rows in `span` (and of `entities`) in one commit, a correction or
        retention (`raw_deletes.delete_rows`)."""
        return raw_deletes.delete_rows(
            self, spec, span, entities, change_source, retention=retention
        )

    def drop_days_before(self, spec: SourceSpec, cut: dt.datetime) -> DroppedDays:
        """Retention: drop every UTC day before midnight `cut` (`raw_deletes`)."""
        return raw_deletes.drop_days_before(self, spec, cut)

    def fence_retention(self, spec: SourceSpec, cut: dt.datetime) -> None:
        """Record that nothing before midnight `cut` is kept (`raw_deletes`)."""
        raw_deletes.fence_retention(self, spec, cut)

    def files_for(
        self,
        table: DeltaTable,
        spec: SourceSpec,
        spans: Sequence[Window] | None,
        entities: frozenset[str] | None,
    ) -> list[dict]:
        """Live files that may hold rows in `spans` (and of `entities`) (`raw_reads`)."""
        return raw_reads.files_for(table, spec, spans, entities)

    def read_spark(
        self,
        spark: SparkSession,
        spec: SourceSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        table: DeltaTable | None = None,
    ) -> tuple[DataFrame, int | None]:
        """Rows in `spans` (and of `entities`) read by Spark, and the version read
        (`raw_reads`)."""
        return raw_reads.read_spark(self, spark, spec, spans, entities, table)

    def read_rows(
        self,
        spec: SourceSpec,
        spans: Sequence[Window],
        entities: frozenset[str] | None,
        table: DeltaTable | None = None,
        cells: Cells | None = None,
    ) -> tuple[pa.Table, int | None]:
        """Rows in `spans` (and of `entities`) read on the driver, and the version read
        (`raw_reads`)."""
        return raw_reads.read_rows(self, spec, spans, entities, table, cells)

    def read_arrow(
        self,
        spec: SourceSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        table: DeltaTable | None = None,
    ) -> pa.Table:
        """Rows in `spans` (and of `entities`) with the columns the table applies
        (`raw_reads`)."""
        return raw_reads.read_arrow(self, spec, spans, entities, table)

    def changes(
        self,
        spec: SourceSpec,
        after: int,
        upto: int,
        spans: Sequence[Window],
        entities: frozenset[str] | None,
    ) -> tuple[pa.Table, int]:
        """Every row change committed after version `after` up to `upto` to rows in `spans`
        (and of `entities`), and the change rows read (`commit_changes.row_changes`)."""
        return commit_changes.row_changes(self, spec, after, upto, spans, entities)


def _recorded_span(commit: dict) -> Window:
    """The time range a retention commit recorded; everything for one that recorded none."""
    lo, hi = commit.get("rollups.min_ts"), commit.get("rollups.max_ts")
    if lo is None or hi is None:
        return Window(
            dt.datetime.min.replace(tzinfo=dt.UTC), dt.datetime.max.replace(tzinfo=dt.UTC)
        )
    end = dt.datetime.fromisoformat(hi) + dt.timedelta(microseconds=1)
    return Window(dt.datetime.fromisoformat(lo), end)
