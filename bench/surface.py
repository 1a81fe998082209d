"""Scenario 5, the surface at two widths: what a publish of one changed cell reads and writes at
each level with M and 10 x M meters, and a plain delta-rs read of a year of daily rows from the
surface's files (capped by entity range) against the partition-sized files it had before.

The rollups' rows are written directly through the rollup store (no Spark, no Dagster): the
publish and the reads are what is measured, and they do not care how the rows were computed.
A correction is one cell pointer flipped to a new generation, as a recompute flips it.
"""

import resource
import shutil
import statistics
import time
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable

import rollup_assets.services.surface_layout as layout
from bench.context import Bench
from bench.generate import PERIOD_END
from bench.metrics import say
from rollup_assets.compute.arrow_types import TS
from rollup_assets.demo.sample_data import meter_ids
from rollup_assets.model.cells import Cells
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.schemas import part_values
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface import publish
from rollup_assets.services.surface_reads import current_rows

YEAR = Window(datetime(2025, 1, 1, tzinfo=UTC), PERIOD_END)
# What each level holds in this scenario: its storage partitions around the corrected cell (two
# UTC days of hours, two months of days, the year above) are what a publish may rewrite.
SPANS = {
    "energy_hourly": Window(datetime(2025, 6, 10, tzinfo=UTC), datetime(2025, 6, 12, tzinfo=UTC)),
    "energy_daily": Window(datetime(2025, 6, 1, tzinfo=UTC), datetime(2025, 8, 1, tzinfo=UTC)),
    "energy_weekly": YEAR,
    "energy_monthly": YEAR,
    "energy_yearly": Window(
        datetime(2024, 12, 31, 23, tzinfo=UTC), datetime(2025, 12, 31, 23, tzinfo=UTC)
    ),
}
# A cap no partition reaches: one file per partition, the layout before files were capped.
PARTITION_FILES = 1 << 40
READ_REPEATS = 9


def partials(spec: RollupSpec, meters: list[str], buckets: list[Window], seed: int) -> pa.Table:
    """Stored rows of every meter and bucket, with plausible partials."""
    n = len(meters) * len(buckets)
    rng = np.random.default_rng(seed)
    starts = pa.array([w.start for w in buckets], TS).cast(pa.int64()).to_numpy()
    ends = pa.array([w.end for w in buckets], TS).cast(pa.int64()).to_numpy()
    cols: dict[str, pa.Array] = {
        "entity_id": pa.array(np.repeat(meters, len(buckets))),
        "bucket_start": pa.array(np.tile(starts, len(meters))).cast(TS),
        "bucket_end": pa.array(np.tile(ends, len(meters))).cast(TS),
    }
    for c in spec.stored_columns:
        cols[c.name] = pa.array(np.full(n, 4.0) if c.partial == "count" else rng.random(n) * 10)
    return pa.table(cols)


def stored(engine: Engine, spec: RollupSpec, rows: pa.Table, buckets: list[Window]) -> None:
    """`rows` as the rollup's generation-0 rows (a forward commit)."""
    store = engine.rollups
    written = store.write_rows(rows, spec, generation=0, job_id="f", run_id="b", source_versions={})
    store.replace_forward(
        spec, written, buckets, {"rollups.operation": "Forward"}, store.identity(spec)
    )


def flip_one_cell(engine: Engine, spec: RollupSpec, meter: str, bucket: Window) -> None:
    """One cell corrected: its new row at a new generation, flipped by a cell pointer."""
    store = engine.rollups
    g = store.next_generation(spec)
    row = partials(spec, [meter], [bucket], seed=g)
    written = store.write_rows(
        row, spec, generation=g, job_id=f"j{g}", run_id="b", source_versions={}
    )
    store.commit_generation(spec, written, {"rollups.operation": "recompute"}, store.identity(spec))
    cell = Cells(((bucket, frozenset({meter})),))
    store.flip(spec, cell, g, job_id=f"j{g}", run_id="b", fence=store.fence(spec))


def one_cell_publishes(bench: Bench, meters: int) -> dict:
    """Each level's one-cell publish at `meters` meters: time, rows read (surface files and
    the row table's changed cells), rows and bytes written, files replaced."""
    root = bench.work / f"surface-{meters}"
    engine = Engine(bench.catalog, Warehouse(str(root)))
    ids = meter_ids(meters)
    levels = {}
    try:
        for name, span in SPANS.items():
            spec = bench.catalog.rollup(name)
            buckets = buckets_in(spec, [span])
            stored(engine, spec, partials(spec, ids, buckets, seed=1), buckets)
            publish(engine, spec)  # built whole, in capped files
            files = len(DeltaTable(engine.rollups.surface_uri(spec)).file_uris())
            flip_one_cell(engine, spec, ids[len(ids) // 2], buckets[len(buckets) // 2])
            t0, started = time.perf_counter(), time.time()
            done = publish(engine, spec)
            seconds = time.perf_counter() - t0
            row_table = bench.probe.driver.rows_between(started, time.time())
            levels[name] = {
                "partition_rows": meters * _per_partition(spec, buckets),
                "surface_files": files,
                "seconds": round(seconds, 3),
                # Every row the publish read: the surface files it rewrote (also on their own
                # below) and the changed cell's row groups of the row table.
                "rows_read": row_table,
                "surface_rows_read": done.surface_rows_read,
                "rows_written": done.file_rows_written,
                "bytes_written": done.bytes_written,
                "files_replaced": done.files_removed,
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = {k: sum(v[k] for v in levels.values()) for k in ("rows_read", "bytes_written")}
    total["rows_written"] = sum(v["rows_written"] for v in levels.values())
    say(
        f"surface, {meters:,} meters: one-cell publish of every level read "
        f"{total['rows_read']:,} rows, wrote {total['rows_written']:,} rows "
        f"({total['bytes_written'] / 1e6:.2f} MB)"
    )
    return {"meters": meters, "levels": levels, "total": total}


def _per_partition(spec: RollupSpec, buckets: list[Window]) -> int:
    """The most buckets of one storage partition among `buckets` (rows per meter)."""
    parts = part_values(spec, pa.array([w.start for w in buckets], TS)).to_pylist()
    return max(parts.count(p) for p in set(parts))


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def layout_reads(bench: Bench, meters: int) -> dict:
    """A year of daily rows of `meters` meters, read plainly (delta-rs to pyarrow, as a user
    would) from the surface in capped files and in one file per partition, interleaved, and
    read by the project's query path from the capped one: median wall and CPU seconds."""
    spec = bench.catalog.rollup("energy_daily")
    buckets = buckets_in(spec, [YEAR])
    rows = partials(spec, meter_ids(meters), buckets, seed=2)
    engines = {}
    cap = layout.SURFACE_FILE_ROWS
    try:
        for name, file_rows in (("capped", cap), ("partition_files", PARTITION_FILES)):
            engine = Engine(bench.catalog, Warehouse(str(bench.work / f"surface-{name}")))
            stored(engine, spec, rows, buckets)
            layout.SURFACE_FILE_ROWS = file_rows
            publish(engine, spec)
            engines[name] = engine
    finally:
        layout.SURFACE_FILE_ROWS = cap
    span = Window(buckets[0].start, buckets[-1].end)
    cond = (ds.field("bucket_start") >= pa.scalar(span.start, TS)) & (
        ds.field("bucket_start") < pa.scalar(span.end, TS)
    )

    # The columns a query returns, as the read scenario's plain read takes them (a reader of
    # every column also decodes the averages' partials and each row's fold state).
    columns = layout.query_columns(spec)

    def plain(engine: Engine) -> int:
        table = DeltaTable(engine.rollups.surface_uri(spec))
        return table.to_pyarrow_dataset().to_table(columns=columns, filter=cond).num_rows

    def query(engine: Engine) -> int:
        got = current_rows(engine, spec, engine.rollups.reflects_now(spec), span)
        assert got is not None, "the surface is current"
        return got.num_rows

    reads = {
        "plain_capped": lambda: plain(engines["capped"]),
        "plain_partition_files": lambda: plain(engines["partition_files"]),
        "query_capped": lambda: query(engines["capped"]),
    }
    wall: dict[str, list[float]] = {k: [] for k in reads}
    cpu: dict[str, list[float]] = {k: [] for k in reads}
    for read in reads.values():
        read()  # warm
    for _ in range(READ_REPEATS):
        for key, read in reads.items():
            c0, t0 = _cpu(), time.perf_counter()
            assert read() == rows.num_rows
            wall[key].append(time.perf_counter() - t0)
            cpu[key].append(_cpu() - c0)
    files = {
        k: len(DeltaTable(e.rollups.surface_uri(spec)).file_uris()) for k, e in engines.items()
    }
    for engine in engines.values():
        shutil.rmtree(engine.warehouse.root, ignore_errors=True)
    out = {
        "meters": meters,
        "rows": rows.num_rows,
        "files": files,
        "wall_s": {k: round(statistics.median(v), 4) for k, v in wall.items()},
        "cpu_s": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
    }
    w, c = out["wall_s"], out["cpu_s"]
    out["plain_capped_vs_partition_files"] = round(
        w["plain_capped"] / w["plain_partition_files"], 3
    )
    out["plain_capped_vs_partition_files_cpu"] = round(
        c["plain_capped"] / c["plain_partition_files"], 3
    )
    out["query_vs_plain_capped"] = round(w["query_capped"] / w["plain_capped"], 3)
    say(
        f"surface reads, a year of daily rows of {meters:,} meters ({rows.num_rows:,}): plain "
        "read of capped files "
        f"({files['capped']}) {w['plain_capped']:.3f}s, of one file per partition "
        f"({files['partition_files']}) {w['plain_partition_files']:.3f}s "
        f"({out['plain_capped_vs_partition_files']:.2f}x, CPU "
        f"{out['plain_capped_vs_partition_files_cpu']:.2f}x); query path "
        f"{w['query_capped']:.3f}s"
    )
    return out


def run_surface(bench: Bench) -> dict:
    say(f"surface: files of at most {layout.SURFACE_FILE_ROWS:,} rows by entity range")
    narrow = one_cell_publishes(bench, bench.meters)
    wide = one_cell_publishes(bench, bench.meters * 10)
    ratio = {
        k: round(wide["total"][k] / narrow["total"][k], 3) if narrow["total"][k] else None
        for k in ("rows_read", "rows_written", "bytes_written")
    }
    say(f"surface: one-cell publish at 10x the meters: {ratio}")
    return {
        "file_rows": layout.SURFACE_FILE_ROWS,
        "widths": [narrow, wide],
        "wide_vs_narrow": ratio,
        # Below the cap a partition is one file: the capped layout shows at the wider width.
        "reads": [layout_reads(bench, m) for m in (bench.meters, bench.meters * 10)],
    }
