"""The computed columns a raw table applies, and changing them in one commit.

The table records its own computed columns: each one's field in the Delta schema carries its
formula and type (`schemas.FORMULA_KEY`, `TYPE_KEY`). That record, not the spec file, is what
ingest evaluates and readers project, so a spec that declares a new, changed or removed
computed column leaves the archive as it is until the change is applied.

Applying a change (`rewrite_columns`) recomputes every computed column of every row under the
new set of formulas into new files, invisible to readers, and commits them with the new schema
in one overwrite commit marked `rollups.operation = columns`: a reader sees the old columns and
values or the new ones, never a mix, and a failure before the commit changes nothing. The commit
records the column, the action, the version the rewrite read and the change's intent
(`INTENT_KEY`), so an interrupted change can be finished from the log (`switch_commit`). Its rows
are no row change of the change feed; change detection queues a recompute of the rollups over a
re-formulated column instead (`formula_changed`).

A concurrent ingest that updates or deletes rows makes the overwrite fail (it removed data the
overwrite read), and the rewrite runs again; one that only inserts new rows does not, so the
commits between the rewrite's snapshot and its own are returned for the caller to bring up to
date. An ingest whose snapshot predates a columns commit it did not see runs again
(`columns_changed_between`).
"""

import dataclasses
import urllib.parse
from collections.abc import Iterator
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from rollup_assets.model.column_rules import ColumnAction, check_computed_columns
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.formulas import parse_formula
from rollup_assets.model.operations import OPERATION_KEY, Operation
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ColumnSpec,
    RawArchiveSpec,
    SourceSpec,
    TimeRangeArchiveSpec,
    key_columns,
)
from rollup_assets.resources.batch_conversion import fill_computed
from rollup_assets.resources.delta_tables import (
    MERGE_ATTEMPTS,
    commit_info,
    file_actions,
    read_commit,
    with_retries,
)
from rollup_assets.resources.schemas import FORMULA_KEY, TYPE_KEY, archive_schema
from rollup_assets.resources.warehouse import filesystem_for

S = TypeVar("S", bound=RawArchiveSpec | TimeRangeArchiveSpec)
# Commit metadata of a columns commit: the version its rewrite read, and the intent it carries
# out (when the change began, `model.intents`).
READ_KEY = "rollups.read_version"
INTENT_KEY = "rollups.intent"


def applied_spec(spec: S, table: DeltaTable | None) -> S:
    """`spec` with the computed columns `table` applies (the spec's own for a table not yet
    created, or a column written before formulas were recorded in the schema)."""
    if table is None:
        return spec
    computed: list[ColumnSpec] = []
    for f in table.schema().fields:
        meta = f.metadata or {}
        if FORMULA_KEY in meta:
            ctype = ColumnType(meta.get(TYPE_KEY, ColumnType.DOUBLE.value))
            computed.append(ColumnSpec(f.name, ctype, False, parse_formula(meta[FORMULA_KEY])))
        elif (declared := spec.column(f.name)) is not None and declared.is_computed:
            computed.append(declared)
    ingested = [c for c in spec.columns if not c.is_computed]
    return check_computed_columns(dataclasses.replace(spec, columns=(*ingested, *computed)))


def rewrite_columns(
    table: DeltaTable, target: SourceSpec, change: dict[str, str], options: dict[str, str]
) -> tuple[int, int, int]:
    """Rewrite every row of `table` with `target`'s computed columns in one overwrite commit;
    return the version it read, the version it committed and the rows it wrote. `change` is
    recorded in the commit's metadata. Raises deltalake's CommitFailedError when a concurrent
    commit deleted data it read (the caller runs it again)."""
    read = table.version()
    change = {**change, READ_KEY: str(read)}
    written = 0
    schema = archive_schema(target)
    names = [f.name for f in schema if f.name != DAY_COLUMN]
    keep = [n for n in names if (c := target.column(n)) is None or not c.is_computed]

    # Read with pyarrow alone: the writer below drives delta-rs while it pulls these batches.
    fs, root = filesystem_for(table.table_uri, options)
    dataset = ds.dataset(
        [f"{root}/{urllib.parse.unquote(f['path'])}" for f in file_actions(table)],
        filesystem=fs,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([(DAY_COLUMN, pa.date32())]), flavor="hive"),
        partition_base_dir=root,
    )

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal written
        for batch in dataset.to_batches(columns=[*keep, DAY_COLUMN]):
            columns = {n: batch.column(n) for n in [*keep, DAY_COLUMN]}
            fill_computed(target, columns, batch.num_rows)
            written += batch.num_rows
            out = pa.table({f.name: columns[f.name] for f in schema}, schema=schema)
            yield from out.to_batches()

    write_deltalake(
        table,
        pa.RecordBatchReader.from_batches(schema, batches()),
        mode="overwrite",
        schema_mode="overwrite",
        partition_by=[DAY_COLUMN],
        commit_properties=CommitProperties(
            custom_metadata={OPERATION_KEY: Operation.COLUMNS, **change}
        ),
    )
    table.update_incremental()
    return read, table.version(), written


def columns_changed_between(uri: str, options: dict[str, str], after: int, upto: int) -> bool:
    """Did a commit after version `after`, up to `upto`, change the computed columns?"""
    return any(
        _info(uri, options, v).get(OPERATION_KEY) == Operation.COLUMNS
        for v in range(after + 1, upto + 1)
    )


def switch_commit(uri: str, options: dict[str, str], intent: str) -> tuple[int, int, int] | None:
    """The columns commit that carried out the change begun at `intent` (an ISO instant), if it
    landed: (the version it read, its own version, the rows it wrote)."""
    table = DeltaTable(uri, storage_options=options or None)
    for info in table.history():
        if info.get(OPERATION_KEY) == Operation.COLUMNS and info.get(INTENT_KEY) == intent:
            metrics = info.get("operationMetrics") or {}
            rows = int(metrics.get("num_added_rows", 0) or 0)
            return int(info[READ_KEY]), int(info["version"]), rows
    return None


def formula_changed(info: dict) -> str | None:
    """The column whose formula a commit (its commit info) changed, if it is such a commit."""
    if info.get(OPERATION_KEY) != Operation.COLUMNS:
        return None
    if info.get("rollups.column_action") != ColumnAction.SET_FORMULA.value:
        return None
    return info.get("rollups.column")


def _info(uri: str, options: dict[str, str], version: int) -> dict:
    return commit_info(read_commit(uri, version, options))


def refresh_inserted(
    uri: str, options: dict[str, str], target: SourceSpec, read: int, wrote: int
) -> int:
    """Recompute the computed columns of the rows commits between a rewrite's snapshot (`read`)
    and its own commit (`wrote`) inserted: the rewrite did not see them. One MERGE updates only
    the computed columns, and only of rows whose other columns are still what was read (a row
    an ingest changed since holds values of the new formulas already); returns the rows read."""
    if wrote - read <= 1:
        return 0
    keys = key_columns(target)

    def attempt() -> int:
        table = DeltaTable(uri, storage_options=options or None)
        changed = pa.table(
            table.load_cdf(starting_version=read + 1, ending_version=wrote - 1, columns=keys)
        )
        if changed.num_rows == 0:
            return 0
        schema = archive_schema(target)
        key_schema = pa.schema([schema.field(k) for k in keys])
        wanted = changed.select(keys).cast(key_schema).group_by(keys).aggregate([])
        days = sorted({d.isoformat() for d in pc.cast(wanted[keys[1]], pa.date32()).to_pylist()})
        current = pa.table(table.to_pyarrow_table(filters=[(DAY_COLUMN, "in", days)]))
        current = current.select(schema.names).cast(schema)
        rows = current.join(wanted, keys=keys, join_type="inner")
        if rows.num_rows == 0:
            return 0
        columns = {n: rows[n] for n in rows.column_names}
        fill_computed(target, columns, rows.num_rows)
        source = pa.table({n: columns[n] for n in schema.names}, schema=schema)
        ingested = [c.name for c in target.columns if not c.is_computed]
        same = " AND ".join([f"t.{DAY_COLUMN} = s.{DAY_COLUMN}"] + [f"t.{k} = s.{k}" for k in keys])
        unchanged = " AND ".join(f"(t.{c} IS NOT DISTINCT FROM s.{c})" for c in ingested)
        # Run twice (an interrupted change finished later), it rewrites nothing the first did.
        differs = " OR ".join(
            f"(t.{c.name} IS DISTINCT FROM s.{c.name})" for c in target.computed_columns
        )
        if differs:
            unchanged = f"({unchanged}) AND ({differs})" if unchanged else f"({differs})"
        lo, hi = pc.min_max(source[keys[1]]).values()
        table.merge(
            source,
            predicate=same,
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(
                custom_metadata={
                    OPERATION_KEY: Operation.REFRESH_COMPUTED,
                    "rollups.min_ts": lo.as_py().isoformat(),
                    "rollups.max_ts": hi.as_py().isoformat(),
                }
            ),
        ).when_matched_update(
            updates={c.name: f"s.{c.name}" for c in target.computed_columns},
            predicate=unchanged or None,
        ).execute()
        return rows.num_rows

    return with_retries(
        attempt,
        retryable=lambda exc: isinstance(exc, CommitFailedError),
        attempts=MERGE_ATTEMPTS,
        what=f"refreshing computed columns of {uri}",
    )
