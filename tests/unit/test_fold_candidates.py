"""Which buckets maintenance may fold, told from the pointer table in Arrow: the cell pointers
per bucket and the buckets a recent flip keeps, equal to the rule applied pointer by pointer."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rollup_assets.model.keeping import Keeping
from rollup_assets.model.windows import Window
from rollup_assets.resources.flips import buckets_flipped_when, cell_pointer_counts
from rollup_assets.resources.genmap import GENMAP_SCHEMA

T0 = datetime(2025, 3, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=10)
POINTER = st.tuples(
    st.integers(0, 5),  # bucket (hours after T0)
    st.sampled_from([None, "m1", "m2", "m3"]),  # entity: None is a bucket pointer
    st.one_of(st.none(), st.integers(0, 10 * 24)),  # flipped, hours after T0
)


def pointer_table(pointers: list[tuple[int, str | None, int | None]]) -> pa.Table:
    rows = [
        {
            "bucket_start": T0 + timedelta(hours=b),
            "bucket_end": T0 + timedelta(hours=b + 1),
            "entity_id": e,
            "generation": 1,
            "job_id": "j",
            "run_id": "r",
            "flipped_at": None if f is None else T0 + timedelta(hours=f),
            "delta": False,
        }
        for b, e, f in pointers
    ]
    return pa.Table.from_pylist(rows, schema=GENMAP_SCHEMA)


@settings(max_examples=60, deadline=None)
@given(pointers=st.lists(POINTER, max_size=30), closed=st.one_of(st.none(), st.integers(0, 6)))
def test_pointer_counts_and_recent_buckets_equal_the_rule_pointer_by_pointer(
    pointers, closed
) -> None:
    table = pointer_table(pointers)
    closed_before = None if closed is None else T0 + timedelta(hours=closed)
    keeping = Keeping(timedelta(days=7))
    counts: dict[Window, int] = {}
    recent: set[datetime] = set()
    for b, e, f in pointers:
        start = T0 + timedelta(hours=b)
        if f is not None and keeping.may_roll_back(T0 + timedelta(hours=f), NOW):
            recent.add(start)
        if e is None or (closed_before is not None and start + timedelta(hours=1) > closed_before):
            continue
        w = Window(start, start + timedelta(hours=1))
        counts[w] = counts.get(w, 0) + 1
    assert cell_pointer_counts(table, closed_before) == counts
    assert buckets_flipped_when(table, lambda t: keeping.may_roll_back(t, NOW)) == recent
