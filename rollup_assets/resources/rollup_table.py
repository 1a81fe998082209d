"""A rollup table: where its rows and pointers live, its commits, its file reads, and the file
rewrite by which rows leave it.

A rollup table holds rows of every generation. Rows leave it only by a file rewrite
(`RollupTable._rewrite`): each file holding rows to drop is removed and its other rows are
written to a new file, all in one commit (readers keep their snapshot meanwhile). Which rows go
is `rollup_deletions`; the forward lane's replacement (`rollup_writes`) rewrites the same way.
"""

import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from rollup_assets.compute.arrow_types import instants_of
from rollup_assets.compute.window_bounds import WindowBounds
from rollup_assets.model.cells import Cells
from rollup_assets.model.keeping import Keeping
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, micros
from rollup_assets.resources.delta_commits import (
    CommitPlan,
    commit,
    remove_action,
    table_identity,
)
from rollup_assets.resources.delta_files import (
    ROW_GROUP_ROWS,
    TargetIndex,
    Targets,
    add_action,
    read_row_groups,
    write_file,
)
from rollup_assets.resources.delta_tables import (
    file_actions,
    open_table,
    prune_files,
    read_commit,
)
from rollup_assets.resources.schemas import PART_COLUMN, TS, data_schema, table_schema
from rollup_assets.resources.warehouse import Warehouse, filesystem_for

# The commit metadata key of a forward commit's replaced bucket spans (a JSON list of
# [start, end] ISO pairs); a retention commit of the row table records the same.
REPLACED_KEY = "rollups.replaced"


def in_windows(
    starts: pa.ChunkedArray | pa.Array, windows: Sequence[Window] | WindowBounds
) -> pa.ChunkedArray:
    """Mask: does each bucket start fall in one of `windows`? (Null for a null start.) One
    binary search per row over the merged windows, however many there are."""
    bounds = windows if isinstance(windows, WindowBounds) else WindowBounds.of(windows)
    values = pc.cast(starts, TS)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    at = pc.fill_null(values.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    lo, hi = bounds.lo, bounds.hi
    i = np.searchsorted(lo, at, side="right") - 1
    inside = (i >= 0) & (at < hi[np.clip(i, 0, None)]) if len(lo) else i >= 0
    nulls = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
    return pa.chunked_array([pa.array(inside, pa.bool_(), mask=nulls)])


def cell_keys(cells: Cells) -> pa.Table:
    """The named cells of `cells` as (bucket_start, entity_id) rows."""
    named = [(w, sorted(scope)) for w, scope in cells if scope]
    starts = np.array([micros(w.start) for w, _ in named], dtype=np.int64)
    counts = np.array([len(entities) for _, entities in named], dtype=np.int64)
    return pa.table(
        {
            "bucket_start": pa.array(np.repeat(starts, counts)).cast(TS),
            "entity_id": pa.array([e for _, entities in named for e in entities], pa.string()),
        }
    )


def cells_of_rows(rows: pa.Table) -> Cells:
    """The cells of `rows` (entity_id, bucket_start, bucket_end), each bucket's entities
    gathered in Arrow: Python sees each bucket once, not each row."""
    if rows.num_rows == 0:
        return Cells()
    grouped = (
        rows.select(["bucket_start", "bucket_end", "entity_id"])
        .group_by(["bucket_start", "bucket_end"], use_threads=False)
        .aggregate([("entity_id", "distinct")])
    )
    return Cells.collect(
        (
            (Window(start, end), frozenset(entities))
            for start, end, entities in zip(
                instants_of(grouped["bucket_start"]),
                instants_of(grouped["bucket_end"]),
                grouped["entity_id_distinct"].to_pylist(),
                strict=True,
            )
        ),
        limit=None,
    )


@dataclass(frozen=True)
class Written:
    adds: list[AddAction]
    rows: int
    # Per bucket start: (cells written, source rows behind them), when the writer counted them.
    counts: dict[datetime, tuple[int, int]] = field(default_factory=dict)
    # Source rows the executors decoded outside Spark's scans to write them (a first fill).
    rows_read: int = 0


class RollupTable:
    """Where a rollup's rows and pointers live, its commits and file reads, and the file
    rewrite through which rows leave it."""

    def __init__(
        self, warehouse: Warehouse, generation_retention: timedelta = timedelta(0)
    ) -> None:
        self.warehouse = warehouse
        self.options = warehouse.storage_options
        # Which superseded rows stay (a pointer of their cell younger than the retention).
        self.keeping = Keeping(generation_retention)

    def uri(self, spec: RollupSpec) -> str:
        return self.warehouse.rollup_path(spec.name)

    def genmap_uri(self, spec: RollupSpec) -> str:
        return self.warehouse.genmap_path(spec.name)

    def surface_uri(self, spec: RollupSpec) -> str:
        return self.warehouse.surface_path(spec.name)

    def drop(self, spec: RollupSpec) -> None:
        """Delete the rollup's surface, row and pointer tables (a deleted archive). The surface
        goes first: left behind by a crash, it could record versions a re-created rollup reaches."""
        self.warehouse.drop_table(self.surface_uri(spec))
        self.warehouse.drop_table(self.uri(spec))
        self.warehouse.drop_table(self.genmap_uri(spec))

    def commit(
        self,
        spec: RollupSpec,
        plan: Callable[[DeltaTable | None], CommitPlan],
        metadata: dict[str, str],
        identity: str | None = None,
    ) -> int:
        """Commit `plan(snapshot)` to the rollup's row table; its new version. With `identity`
        (`identity(spec)` read when the action began), only to that very table."""
        return commit(
            self.uri(spec),
            plan,
            schema=table_schema(spec),
            partition_by=[PART_COLUMN],
            metadata=metadata,
            storage_options=self.options,
            identity=identity,
        )

    def identity(self, spec: RollupSpec) -> str:
        """The row table's identity now (`delta_commits.table_identity`): an action that writes
        files and commits them later reads it first, so that a rollup deleted and created again
        meanwhile never gets files written for the deleted one."""
        return table_identity(open_table(self.uri(spec), self.options))

    def overlapping(
        self,
        files: list[dict],
        spans: Sequence[Window] | WindowBounds | None,
        entities: frozenset[str] | None,
    ) -> list[dict]:
        """Files whose stats say they may hold rows in `spans` (and `entities`)."""
        return prune_files(files, time_column="bucket_start", spans=spans, entities=entities)

    def _read_file(
        self,
        spec: RollupSpec,
        f: dict,
        columns: Sequence[str] | None = None,
        targets: Targets | TargetIndex | None = None,
    ) -> pa.Table:
        """The file's rows (its `columns`); with `targets`, only the row groups whose statistics
        say they may hold rows of them (`delta_files.read_row_groups`)."""
        return read_row_groups(
            self.uri(spec), self.options, f["path"], columns, "bucket_start", targets
        )

    def committed_rows(
        self, spec: RollupSpec, version: int, spans: Sequence[Window], columns: Sequence[str]
    ) -> pa.Table:
        """The `columns` of the rows that commit `version` of the row table added, of buckets
        starting in `spans` (whatever generation they carry)."""
        added = [a["add"] for a in read_commit(self.uri(spec), version, self.options) if "add" in a]
        wanted = [*columns, *(["bucket_start"] if "bucket_start" not in columns else [])]
        schema = pa.schema([data_schema(spec).field(c) for c in wanted])
        parts = [self._read_file(spec, f, wanted).cast(schema) for f in added]
        rows = pa.concat_tables(parts) if parts else schema.empty_table()
        return rows.filter(in_windows(rows["bucket_start"], spans)).select(list(columns))

    def _rewrite(
        self,
        spec: RollupSpec,
        snapshot: DeltaTable | None,
        select: Callable[[list[dict]], list[dict]],
        drop: Callable[[pa.Table], pa.ChunkedArray],
    ) -> tuple[list[RemoveAction], list[AddAction], int]:
        """Remove the selected files that hold rows matching `drop`; rewrite their other rows."""
        if snapshot is None:
            return [], [], 0
        fs, root = filesystem_for(self.uri(spec), self.options)
        schema = data_schema(spec)
        removes: list[RemoveAction] = []
        adds: list[AddAction] = []
        dropped = 0
        for f in select(file_actions(snapshot)):
            rows = self._read_file(spec, f, schema.names).cast(schema)
            mask = pc.fill_null(drop(rows), False)
            n = pc.sum(mask.cast(pa.int64())).as_py() or 0
            if n == 0:
                continue
            dropped += n
            removes.append(remove_action(f))
            if n == rows.num_rows:
                continue
            keep = rows.filter(pc.invert(mask))
            path = urllib.parse.unquote(f["path"])
            directory = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
            pv = {k.split(".", 1)[1]: v for k, v in f.items() if k.startswith("partition.")}
            adds.append(
                add_action(
                    write_file(
                        fs,
                        root,
                        directory,
                        keep,
                        {k: None if v is None else str(v) for k, v in pv.items()},
                        row_group_rows=ROW_GROUP_ROWS,
                    )
                )
            )
        return removes, adds, dropped
