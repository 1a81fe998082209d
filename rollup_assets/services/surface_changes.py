"""Which cells of a rollup changed between two of its states (pointer and row versions): what a
publish of the surface replaces, and what the level above checks its stored rows against.

Active rows change in two ways only: a pointer commit (a flip, a rewind, a rollback, retention)
changes the cells of the pointers that differ between the two pointer versions; a forward-lane
commit of the row table (generation-0 rows replaced in place), or retention's (every row of the
buckets before its instant deleted), changes the buckets it records and its added files'
statistics span. Every other row-table commit (`NEUTRAL_OPERATIONS`: a recompute's invisible
rows, sweeps, reclaims, compaction) leaves the active rows as they were.
"""

import bisect
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError

from rollup_assets.compute.arrow_types import instants_of
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import Trigger
from rollup_assets.model.operations import (
    NO_DATA_OPERATIONS,
    Operation,
    operation_of,
)
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.delta_tables import read_commit
from rollup_assets.resources.genmap import GENMAP_SCHEMA, pointers_of
from rollup_assets.resources.rollup_snapshots import Reflected
from rollup_assets.resources.rollup_table import REPLACED_KEY, cells_of_rows, in_windows
from rollup_assets.resources.visible_rows import covered_mask
from rollup_assets.services.engine import Engine

log = logging.getLogger(__name__)

# Row-table commits that change which rows are active: the forward lane's in-place writes, and
# retention's deletes (generation-0 rows are active without a pointer). Each records the
# buckets it replaced.
FORWARD_OPERATIONS = frozenset(
    {Trigger.FORWARD.value, Trigger.OPEN_BUCKET.value, Operation.RETENTION}
)
# Row-table commits that leave the active rows as they were (a rewind's pointer commit is what
# changes them; its row commit deletes rows no pointer referenced any more).
NEUTRAL_OPERATIONS = frozenset(
    {Operation.RECOMPUTE, Operation.SWEEP, Operation.RECLAIM, Operation.REWIND, *NO_DATA_OPERATIONS}
)
POINTER_KEY = ("bucket_start", "bucket_end", "entity_id", "generation")
# Of a pointer that differs between two versions: is it the newer version's (or the older's)?
NEWER = "newer"
_GLOBAL = "\x00every entity"  # a global pointer's entity in a join key (no entity id is this)


@dataclass(frozen=True)
class Changed:
    """The cells whose active rows may differ between two versions of a rollup: those of the
    pointers that differ (a global pointer: its bucket for every entity; an entity pointer: its
    cell), and every cell of the buckets in `written` (forward-lane commits)."""

    # (bucket_start, bucket_end, entity_id, generation) of the pointers that differ, whether
    # each is a difference pointer (`delta`) and whether it is the newer version's (`NEWER`).
    pointers: pa.Table
    written: tuple[Window, ...]

    @cached_property
    def _buckets(self) -> pa.Table:
        """The differing pointers' distinct buckets (bucket_start, bucket_end)."""
        keys = ["bucket_start", "bucket_end"]
        return self.pointers.select(keys).group_by(keys, use_threads=False).aggregate([])

    @cached_property
    def spans(self) -> list[Window]:
        """The merged bucket windows holding every changed cell."""
        return merge_windows([*_windows(self._buckets), *self.written])

    @cached_property
    def whole_buckets(self) -> list[Window]:
        """The merged windows of the buckets changed for every entity (global pointers, and the
        buckets of forward-lane commits)."""
        every = self.pointers.filter(pc.is_null(self.pointers["entity_id"]))
        return merge_windows([*_windows(every), *self.written])

    @cached_property
    def cells(self) -> Cells:
        """The changed cells, for reading the row groups that may hold them (their entities
        gathered per bucket in Arrow: Python sees each bucket once, not each cell)."""
        named = self.pointers.filter(pc.is_valid(self.pointers["entity_id"]))
        every = self.pointers.filter(pc.is_null(self.pointers["entity_id"]))
        whole = [(w, None) for w in (*_windows(every), *self.written)]
        return Cells.collect([*cells_of_rows(named), *whole], limit=None)

    @cached_property
    def _starts(self) -> tuple[list[datetime], timedelta]:
        """The changed cells' bucket starts, in order, and how far before a span's start a
        bucket may begin and still overlap it (the longest bucket)."""
        windows = self.cells.windows
        longest = max((w.end - w.start for w in windows), default=timedelta(0))
        return [w.start for w in windows], longest

    def cells_within(self, spans: Sequence[Window]) -> Cells:
        """The changed cells whose buckets overlap `spans`."""
        starts, longest = self._starts
        items = self.cells.by_window
        picked: dict[int, None] = {}
        for span in spans:
            lo = bisect.bisect_left(starts, span.start - longest)
            hi = bisect.bisect_left(starts, span.end)
            for i in range(lo, hi):
                if items[i][0].overlaps(span):
                    picked[i] = None
        return Cells(tuple(items[i] for i in sorted(picked)))

    def oldest_flip(self, pointers: pa.Table) -> datetime | None:
        """When the oldest of the differing pointers still in `pointers` (the newer version's,
        with `flipped_at`) was flipped; None when there is none (pointers only dropped)."""
        if self.pointers.num_rows == 0:
            return None
        keys = list(POINTER_KEY)

        # Joins do not match null keys: a global pointer's entity is keyed as GLOBAL here.
        def keyed(t: pa.Table) -> pa.Table:
            entity = t.schema.get_field_index("entity_id")
            return t.set_column(entity, "entity_id", pc.fill_null(t["entity_id"], _GLOBAL))

        flips = keyed(pointers.select([*keys, "flipped_at"]))
        brought = keyed(self.pointers.select(keys)).join(flips, keys, join_type="inner")
        return pc.min(brought["flipped_at"]).as_py() if brought.num_rows else None

    def mask(self, rows: pa.Table) -> pa.ChunkedArray:
        """For rows with (bucket_start, entity_id): is each row's cell changed?"""
        mask = covered_mask(rows, self.pointers)
        if self.written:
            mask = pc.or_(mask, pc.fill_null(in_windows(rows["bucket_start"], self.written), False))
        return mask


def _windows(rows: pa.Table) -> list[Window]:
    """The bucket windows of `rows` (bucket_start, bucket_end)."""
    starts, ends = instants_of(rows["bucket_start"]), instants_of(rows["bucket_end"])
    return [Window(a, b) for a, b in zip(starts, ends, strict=True)]


def changed_cells(
    engine: Engine,
    spec: RollupSpec,
    done: Reflected,
    now: Reflected,
    pointers: pa.Table | None = None,
) -> Changed | None:
    """The cells whose active rows may differ between the versions `done` and `now` (`pointers`:
    those of `now`, when the caller holds them); None when that cannot be told (then the surface
    is rebuilt whole)."""
    if done.genmap > now.genmap or done.rows > now.rows:
        return None  # the tables were re-created since
    moved = _KEY.append(pa.field(NEWER, pa.bool_())).empty_table()
    if done.genmap != now.genmap:
        found = _pointer_changes(engine, spec, done.genmap, now.genmap, pointers)
        if found is None:
            return None
        moved = found
    written: list[Window] = []
    for version in range(done.rows + 1, now.rows + 1):
        spans = _forward_buckets(engine, spec, version)
        if spans is None:
            return None
        written += spans
    return Changed(moved, tuple(merge_windows(written)))


# The columns that tell two pointers apart, and what kind of pointer each is.
_KEY = pa.schema([GENMAP_SCHEMA.field(c) for c in (*POINTER_KEY, "delta")])


def _pointers_at(engine: Engine, spec: RollupSpec, version: int) -> pa.Table:
    if version < 0:
        return _KEY.empty_table()
    uri = engine.rollups.genmap_uri(spec)
    pointers = pointers_of(uri, version, engine.warehouse.storage_options)
    if pointers is None:
        raise FileNotFoundError(f"no pointer table of '{spec.name}'")
    return pointers.select(_KEY.names).cast(_KEY)


def _pointer_changes(
    engine: Engine, spec: RollupSpec, old: int, new: int, held: pa.Table | None
) -> pa.Table | None:
    """The pointers (bucket_start, bucket_end, entity_id, generation, delta) in one of two
    pointer-table versions and not the other (`held`: those of `new`, when given), and which
    version each is in (`NEWER`)."""
    try:
        before = _pointers_at(engine, spec, old)
        after = (
            _pointers_at(engine, spec, new) if held is None else held.select(_KEY.names).cast(_KEY)
        )
    except (OSError, pa.ArrowException, DeltaError) as exc:
        log.info("%s: pointer version %d is not readable (%s); rebuilding", spec.name, old, exc)
        return None
    gone, came = _minus(before, after), _minus(after, before)
    return pa.concat_tables(
        [
            gone.append_column(NEWER, pa.array([False] * gone.num_rows, pa.bool_())),
            came.append_column(NEWER, pa.array([True] * came.num_rows, pa.bool_())),
        ]
    )


def _minus(a: pa.Table, b: pa.Table) -> pa.Table:
    """Rows of `a` (pointer keys and kinds, no duplicates) whose keys are not in `b`."""
    if a.num_rows == 0 or b.num_rows == 0:
        return a

    # Joins do not match null keys: a global pointer's entity is keyed as GLOBAL here.
    def keyed(t: pa.Table) -> pa.Table:
        return t.set_column(
            t.schema.get_field_index("entity_id"),
            "entity_id",
            pc.fill_null(t["entity_id"], _GLOBAL),
        )

    marked = keyed(b.select(list(POINTER_KEY)))
    marked = marked.append_column("__in_b", pa.array(np.ones(b.num_rows, dtype=bool)))
    joined = keyed(a).join(marked, list(POINTER_KEY), join_type="left outer")
    kept = joined.filter(pc.is_null(joined["__in_b"])).drop_columns(["__in_b"])
    entity = kept["entity_id"]
    restored = pc.if_else(pc.equal(entity, _GLOBAL), pa.scalar(None, pa.string()), entity)
    return (
        kept.set_column(kept.schema.get_field_index("entity_id"), "entity_id", restored)
        .select(a.column_names)
        .cast(a.schema)
    )


def _forward_buckets(engine: Engine, spec: RollupSpec, version: int) -> list[Window] | None:
    """Buckets whose active rows row-table commit `version` changed ([] for none); None when it
    cannot be told."""
    try:
        actions = read_commit(engine.rollups.uri(spec), version, engine.warehouse.storage_options)
    except (OSError, ValueError) as exc:
        log.info("%s: row commit %d is not readable (%s); rebuilding", spec.name, version, exc)
        return None
    info: dict = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    operation = operation_of(info)
    if operation in NEUTRAL_OPERATIONS:
        return []
    if operation not in FORWARD_OPERATIONS:
        log.info(
            "%s: row commit %d (%s) is not a known kind; rebuilding", spec.name, version, operation
        )
        return None
    # The buckets the commit replaced, written or emptied (a bucket that lost all its source
    # rows gets no file, only removes).
    replaced = info.get(REPLACED_KEY)
    if replaced is None:
        return None
    out = [Window(_instant(a), _instant(b)) for a, b in json.loads(replaced)]
    for action in actions:
        add = action.get("add")
        if add is None:
            continue
        stats = json.loads(add.get("stats") or "{}")
        lo = stats.get("minValues", {}).get("bucket_start")
        hi = stats.get("maxValues", {}).get("bucket_end")
        if lo is None or hi is None:
            return None
        out.append(Window(_instant(lo), _instant(hi)))
    return out


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
