"""Incremental maintenance of partials: a stored partial corrected by the changes of its source.

A change is one row leaving a cell (a pre-image: the old side of an update, or a delete) or
entering it (a post-image: an insert, or the new side of an update). As in the reference's
retraction protocol, reversible partials absorb both directions:

- count: stored + the non-null values entering - the non-null values leaving (exact);
- sum: stored - the values leaving + the values entering, added exactly (`math.fsum`, or integers
  for integer columns), so applying changes adds no rounding of its own;
- min / max: a value entering only ever lowers the minimum (raises the maximum); a value leaving
  is harmless unless it is the stored extreme itself, which only the cell's source rows can
  replace.

Where the stored partial alone cannot tell the new value, the cell is recomputed from its source
rows instead, with the reason: a retraction of the stored extreme, a delete (the cell may now be
empty, and an empty cell has no row), a sum that may turn null (no count of the same column is
stored), a NaN or infinite value (not reversible), a sum that cancels (the retracted magnitude is
large against the result, so the stored sum's own rounding would show), or no stored partial.

Up the chain the same rules apply to partials (`merge_changes`): a cell of a rollup over a rollup
takes the old partials of the cells below it that changed out and their new ones in, as one
merge of partials would (a count is a sum of counts there); a cell below that vanished (its
source rows all gone) may empty the cell above, which is then recomputed.
"""

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from rollup_assets.model.cells import ROUNDING
from rollup_assets.model.specs import ColumnType, StoredColumn

# A sum is applied as a delta only while the magnitudes it retracts stay below this multiple of
# the result: the stored sum carries the rounding of the values it was built from, which must not
# grow past the relative tolerance the checks use (1e-9) when most of it is taken away again.
CANCELLATION_LIMIT = 1e6
K = TypeVar("K", bound=Hashable)  # how a caller names a cell
NO_STORED_PARTIAL = "no stored partial to correct"
# A cell below's partials before and after a change (None: the cell had, or has, no row).
Replacement = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]


class ChangeType(StrEnum):
    INSERT = "insert"
    DELETE = "delete"
    UPDATE_PREIMAGE = "update_preimage"
    UPDATE_POSTIMAGE = "update_postimage"

    @property
    def enters(self) -> bool:
        return self in (ChangeType.INSERT, ChangeType.UPDATE_POSTIMAGE)


@dataclass(frozen=True)
class Change:
    """One changed source row of a cell: its type and its values by source column."""

    type: ChangeType
    values: dict[str, Any]


@dataclass(frozen=True)
class CellDelta:
    """What applying a cell's changes found: the new partials (by stored column name), or why
    the cell must be recomputed from its source rows instead."""

    partials: dict[str, Any] | None
    reason: str | None = None  # set when `partials` is None

    @property
    def applied(self) -> bool:
        return self.partials is not None


def apply_changes(
    stored: dict[str, Any],
    changes: Sequence[Change],
    columns: Sequence[StoredColumn],
) -> CellDelta:
    """The partials of a cell after `changes` (in any order), from its `stored` partials."""
    if any(c.type is ChangeType.DELETE for c in changes):
        return CellDelta(None, "a delete may leave the cell empty")
    moves: dict[str, tuple[list[Any], list[Any]]] = {}
    for sc in columns:
        leaving = _present(c.values.get(sc.column) for c in changes if not c.type.enters)
        entering = _present(c.values.get(sc.column) for c in changes if c.type.enters)
        moves[sc.name] = _net(leaving, entering)
    return _apply(stored, columns, moves, lambda leaving, entering: len(entering) - len(leaving))


def merge_changes(
    stored: dict[str, Any],
    replaced: Sequence[Replacement],
    columns: Sequence[StoredColumn],
    inputs: Mapping[str, str],
) -> CellDelta:
    """The partials of a cell of a rollup over a rollup after cells below it had their partials
    replaced (`replaced`: old and new, None where a cell had or has no row), from its `stored`
    partials. `inputs` names, per stored column, the column below it merges: counts are sums of
    counts there, sums sums of sums, extremes extremes of extremes, with the rules above. A
    cell below whose extreme only moved outward (a lower minimum, a higher maximum) retracts
    nothing: the new value alone enters."""
    moves: dict[str, tuple[list[Any], list[Any]]] = {}
    for sc in columns:
        name = inputs[sc.name]
        leaving, entering = [], []
        for old, new in replaced:
            a = None if old is None else old.get(name)
            b = None if new is None else new.get(name)
            if b is not None:
                entering.append(b)
            if a is not None and not (b is not None and _outward(sc.partial, a, b)):
                leaving.append(a)
        moves[sc.name] = _net(leaving, entering)
    return _apply(stored, columns, moves, lambda leaving, entering: sum(entering) - sum(leaving))


def _outward(partial: str, old: Any, new: Any) -> bool:
    """Does an extreme move from `old` to `new` only outward (so `old` need not be retracted)?
    Never for NaN, which no comparison orders."""
    if _is_nan(old) or _is_nan(new):
        return False
    if partial == "min":
        return bool(new <= old)
    if partial == "max":
        return bool(new >= old)
    return False


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _apply(
    stored: dict[str, Any],
    columns: Sequence[StoredColumn],
    moves: Mapping[str, tuple[list[Any], list[Any]]],
    counted_change: Callable[[list[Any], list[Any]], int],
) -> CellDelta:
    """`stored` after the values leaving and entering each stored column (`moves`, by stored
    column name); `counted_change(leaving, entering)` is what they add to a count."""
    for sc in columns:
        leaving, entering = moves[sc.name]
        if sc.partial != "count" and _non_finite([stored.get(sc.name), *leaving, *entering]):
            return CellDelta(None, f"{sc.name}: a NaN or infinite value cannot be retracted")
    out: dict[str, Any] = {}
    for sc in columns:
        if sc.partial == "count":
            out[sc.name] = (stored.get(sc.name) or 0) + counted_change(*moves[sc.name])
    emptied = {sc.column for sc in columns if sc.partial == "count" and out[sc.name] == 0}
    counted = {sc.column for sc in columns if sc.partial == "count"}
    for sc in columns:
        if sc.partial == "count":
            continue
        leaving, entering = moves[sc.name]
        old = stored.get(sc.name)
        if sc.column in emptied:
            value, reason = None, None  # no value left: null, as an aggregate of nothing
        elif sc.partial == "sum":
            value, reason = _sum(sc, old, leaving, entering, sc.column in counted)
        else:
            value, reason = _extreme(sc, old, leaving, entering)
        if reason is not None:
            return CellDelta(None, reason)
        out[sc.name] = value
    return CellDelta(out)


def _net(leaving: list[Any], entering: list[Any]) -> tuple[list[Any], list[Any]]:
    """The values that leave and enter, less those that do both (the same multiset results:
    a reading inserted and then updated, within the changes applied, only enters once)."""
    pool = Counter(entering)
    kept_leaving = []
    for v in leaving:
        if pool[v] > 0:
            pool[v] -= 1
        else:
            kept_leaving.append(v)
    return kept_leaving, list(pool.elements())


def _present(values: Iterable[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _non_finite(values: Iterable[Any]) -> bool:
    return any(isinstance(v, float) and not math.isfinite(v) for v in values)


def _sum(
    sc: StoredColumn, old: Any, leaving: list[Any], entering: list[Any], counted: bool
) -> tuple[Any, str | None]:
    if old is None and leaving:
        return None, f"{sc.name}: the stored sum is null but values leave the cell"
    if not counted and leaving and not entering:
        return None, f"{sc.name}: values leave and none enter, so the sum may become null"
    if old is None and not entering:
        return None, None
    exact = all(isinstance(v, int) and not isinstance(v, bool) for v in [*leaving, *entering])
    if sc.type is ColumnType.LONG or (exact and isinstance(old, int)):
        value: Any = int(old or 0) - sum(int(v) for v in leaving) + sum(int(v) for v in entering)
        if sc.type is ColumnType.LONG and not -(2**63) <= value < 2**63:
            return None, f"{sc.name}: the sum leaves the 64-bit range"
        return (value if sc.type is ColumnType.LONG else float(value)), None
    terms = [float(old or 0.0), *(-float(v) for v in leaving), *(float(v) for v in entering)]
    value = math.fsum(terms)
    retracted = abs(float(old or 0.0)) + sum(abs(float(v)) for v in leaving)
    if leaving and retracted > CANCELLATION_LIMIT * max(1.0, abs(value)):
        return None, f"{sc.name}: the retracted values nearly cancel the sum"
    return value, None


def _extreme(
    sc: StoredColumn, old: Any, leaving: list[Any], entering: list[Any]
) -> tuple[Any, str | None]:
    lowest = sc.partial == "min"
    if leaving:
        if old is None:
            return None, f"{sc.name}: the stored {sc.partial} is null but values leave the cell"
        if any((v <= old) if lowest else (v >= old) for v in leaving):
            return None, f"{sc.name}: a change retracts the stored {sc.partial}"
    candidates = [v for v in [old, *entering] if v is not None]
    if not candidates:
        return None, None
    return (min(candidates) if lowest else max(candidates)), None


@dataclass(frozen=True)
class StoredCell:
    """A cell's stored partials and the source version they reflect."""

    version: int
    partials: dict[str, Any]


@dataclass
class Applied(Generic[K]):
    """The outcome of applying changes to a set of cells."""

    changed: dict[K, dict[str, Any]] = field(default_factory=dict)  # new partials
    unchanged: set[K] = field(default_factory=set)  # changes left every partial as is
    recompute: dict[K, str] = field(default_factory=dict)  # cell -> why
    change_rows: int = 0  # changes applied (those after each cell's version)

    def take(
        self,
        key: K,
        result: CellDelta,
        stored: dict[str, Any],
        columns: Sequence[StoredColumn],
    ) -> None:
        """File a cell's `result` against its `stored` partials: changed, unchanged, or to be
        recomputed."""
        if result.partials is None:
            self.recompute[key] = result.reason or "not reversible"
        elif _same_partials(result.partials, stored, columns):
            self.unchanged.add(key)
        else:
            self.changed[key] = result.partials

    def reasons(self) -> str:
        """'3 cell(s): a change retracts the stored min; 1 cell(s): ...' (most frequent first)."""
        tally = Counter(self.recompute.values())
        return "; ".join(f"{n} cell(s): {why}" for why, n in tally.most_common())


def apply_to_cells(
    cells: Iterable[K],
    stored: Mapping[K, StoredCell],
    changes: Iterable[tuple[K, int, Change]],
    columns: Sequence[StoredColumn],
) -> Applied[K]:
    """Correct every cell of `cells` by the changes committed after the version its stored
    partials reflect. `changes` are (cell, commit version, change); changes of other cells are
    ignored. A cell without stored partials is recomputed."""
    wanted = set(cells)
    per_cell: dict[K, list[Change]] = {}
    out: Applied[K] = Applied()
    for key, version, change in changes:
        cell = stored.get(key)
        if key in wanted and cell is not None and version > cell.version:
            per_cell.setdefault(key, []).append(change)
            out.change_rows += 1
    for key in wanted:
        cell = stored.get(key)
        if cell is None:
            out.recompute[key] = NO_STORED_PARTIAL
            continue
        mine = per_cell.get(key, [])
        result = apply_changes(cell.partials, mine, columns) if mine else CellDelta(cell.partials)
        out.take(key, result, cell.partials, columns)
    return out


def merge_into_cells(
    cells: Iterable[K],
    stored: Mapping[K, dict[str, Any]],
    below: Mapping[K, Sequence[Replacement]],
    columns: Sequence[StoredColumn],
    inputs: Mapping[str, str],
) -> Applied[K]:
    """Correct every cell of `cells` of a rollup over a rollup by the replaced partials of the
    cells below it (`below`, per cell; see `merge_changes`). The caller vouches that the stored
    partials reflect exactly the old side of each replacement and every other cell below them
    as it is. A cell without stored partials, or one a cell below of which was emptied (it may
    be empty now), is recomputed."""
    out: Applied[K] = Applied()
    for key in cells:
        partials = stored.get(key)
        if partials is None:
            out.recompute[key] = NO_STORED_PARTIAL
            continue
        pairs = below.get(key, ())
        out.change_rows += len(pairs)
        if any(old is not None and new is None for old, new in pairs):
            out.recompute[key] = "a cell below was emptied, so the cell may be empty"
            continue
        out.take(key, merge_changes(partials, pairs, columns, inputs), partials, columns)
    return out


def _same_partials(a: dict[str, Any], b: dict[str, Any], columns: Sequence[StoredColumn]) -> bool:
    return all(_same(a.get(sc.name), b.get(sc.name)) for sc in columns)


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return a == b or abs(a - b) <= ROUNDING * max(abs(a), abs(b))
    return bool(a == b)
