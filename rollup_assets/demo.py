"""`rollups demo`: the whole product in one run, on the embedded defaults.

A year of 15-minute readings for a few dozen meters is ingested and rolled up through the chain
(hourly, daily, ISO-weekly, monthly, yearly in Europe/Vienna). Then a realistic correction lands:
one meter's readings for a day three months ago are replaced, and a few late readings arrive for
last week. The sensors detect exactly which windows changed, recompute them at every level with a
new generation while a reader keeps querying, and a pandas aggregation of the raw data checks
every level. Everything lands in ROLLUPS_WAREHOUSE and DAGSTER_HOME, so `make dev` shows it.
"""

import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import click
import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from resources.ledger import ChangeSource, Job
from resources.warehouse import Warehouse
from rollup_assets.engine import Engine
from rollup_assets.errors import RollupsError
from rollup_assets.factory import job_name
from rollup_assets.operations import Operations
from rollup_assets.partitions import Window, key_range_for, partitions_def_for
from rollup_assets.query import query_arrow
from rollup_assets.runner import RunReport, execute, partition_range_tags, tick_until_quiet
from rollup_assets.sample_data import day_batch
from rollup_assets.specs import Catalog
from rollup_assets.verify import compare_all, raw_frame

MARKER = ".rollups-demo"
SEED = 2024
CORRECTED_METER = "meter-0007"
LATE_METERS = ("meter-0003", "meter-0012", "meter-0021")
ONE_DAY = timedelta(days=1)
CORRECTION_FACTOR = 1.35  # the meter under-reported that day; the re-read values are 35 % higher


class DemoError(RollupsError):
    """The demo cannot run as asked (e.g. its directories hold data it did not write)."""


@dataclass
class Story:
    catalog: Catalog
    engine: Engine
    defs: dg.Definitions
    instance: dg.DagsterInstance
    out: Path
    meters: int
    days: int
    started: float = field(default_factory=time.monotonic)

    def say(self, text: str = "", dim: bool = False) -> None:
        elapsed = time.monotonic() - self.started
        stamp = f"[{int(elapsed // 60):02d}:{int(elapsed % 60):02d}]"
        click.echo(click.style(f"{stamp} {text}", dim=dim) if text else "")

    def step(self, title: str, why: str) -> None:
        click.echo()
        self.say(click.style(title, bold=True))
        click.echo(click.style(f"        {why}", dim=True))

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.catalog.rollup("energy_daily").reference_time_zone)

    def query(self, archive: str, **kw) -> pa.Table:
        return query_arrow(self.engine, archive, **kw)


# -- setup ----------------------------------------------------------------------------------------


def prepare_dirs(warehouse: Path, home: Path) -> str:
    """Start clean: remove what an earlier demo wrote; refuse to touch anything else."""
    reused = []
    for path, what in ((warehouse, "warehouse"), (home, "Dagster home")):
        if not path.exists():
            continue
        contents = {p.name for p in path.iterdir()}
        if not contents or contents <= {"dagster.yaml"} or MARKER in contents:
            if MARKER in contents:
                reused.append(what)
            keep_yaml = (path / "dagster.yaml").read_text() if "dagster.yaml" in contents else None
            shutil.rmtree(path)
            if keep_yaml is not None:
                path.mkdir(parents=True)
                (path / "dagster.yaml").write_text(keep_yaml)
            continue
        raise DemoError(
            f"{what} {path} holds data the demo did not write; remove it (`make clean`) or point "
            f"{'ROLLUPS_WAREHOUSE' if path == warehouse else 'DAGSTER_HOME'} somewhere else"
        )
    for path in (warehouse, home):
        path.mkdir(parents=True, exist_ok=True)
        (path / MARKER).write_text("written by `rollups demo`; the next demo run replaces it\n")
    if reused:
        return f"removed the previous demo's {' and '.join(reused)} to start clean"
    return "fresh directories"


def run_demo(meters: int, days: int, out: Path) -> None:
    from resources.spark import build_session
    from resources.warehouse_resource import WarehouseResource
    from rollup_assets.definitions import build_definitions
    from rollup_assets.instance import ensure_home, ensure_pools
    from rollup_assets.specs import load_catalog

    warehouse = Warehouse.from_env()
    home = ensure_home()
    catalog = load_catalog()
    click.echo(click.style("rollups demo: rollups that stay correct", bold=True))
    click.echo(f"  warehouse     {warehouse.root}")
    click.echo(f"  Dagster home  {home}")
    click.echo(f"  output        {out}")
    note = prepare_dirs(Path(warehouse.root), home) if "://" not in warehouse.root else "as is"
    click.echo(f"  ({note})")
    ensure_home()
    out.mkdir(parents=True, exist_ok=True)
    defs = build_definitions(catalog, WarehouseResource(root=warehouse.root))
    instance = dg.DagsterInstance.get()
    ensure_pools(instance, catalog)
    story = Story(catalog, Engine(catalog, warehouse), defs, instance, out, meters, days)
    story.say("starting a local Spark session (one JVM for every run of this demo)", dim=True)
    os.environ.setdefault("ROLLUPS_RUN_LOG_LEVEL", "WARNING")  # the story, not every event
    build_session(conf={"spark.ui.showConsoleProgress": "false"})

    today = datetime.now(UTC).date()
    first = today - timedelta(days=days)
    ingest_year(story, first, today)
    activate_rollups(story)
    backfill(story, first)
    before = show_values(story, first, today)
    corrected_day, late = ingest_correction(story, today)
    snapshot = capture(story, corrected_day)
    reader = Reader(story, corrected_day)
    reader.start()
    jobs = propagate(story)
    reader.stop()
    after = capture(story, corrected_day)
    show_before_after(story, snapshot, after, corrected_day)
    show_jobs(story, jobs)
    reader.report(snapshot, after)
    verify(story)
    chart(story, before, corrected_day, late)
    epilogue(story)


# -- the story ------------------------------------------------------------------------------------


def ingest_year(story: Story, first: date, today: date) -> None:
    story.step(
        f"1. Ingest a year of readings: {story.meters} meters x {story.days} days, every 15 min",
        "Raw data lands in a Delta table (change data feed on) in monthly batches, each one "
        "all-or-nothing. The archive is activated first: declared archives start Created.",
    )
    ops = Operations(story.engine, actor="demo")
    ops.activate("energy_raw")
    spec = story.catalog.raw["energy_raw"]
    landing = story.out / "landing"
    landing.mkdir(parents=True, exist_ok=True)
    months: dict[tuple[int, int], list[date]] = {}
    for i in range(story.days):
        d = first + timedelta(days=i)
        months.setdefault((d.year, d.month), []).append(d)
    total = version = 0
    with click.progressbar(
        list(months.items()),
        label="        ingesting",
        item_show_func=lambda m: f"{m[0][0]}-{m[0][1]:02d}" if m else "",
    ) as bar:
        for (year, month), month_days in bar:
            path = landing / f"readings-{year}-{month:02d}.parquet"
            pq.write_table(
                pa.concat_tables(day_batch(d, story.meters, SEED) for d in month_days), path
            )
            result = story.engine.raw.ingest(spec, path, ChangeSource.IMPORT)
            total, version = total + result.rows, result.version
    story.say(f"energy_raw: {total:,} readings, table version {version}")


def activate_rollups(story: Story) -> None:
    story.step(
        "2. Activate the rollup chain",
        "A new rollup starts one bucket back from now (no implicit history scan): history is "
        "an explicit backfill, the forward lane takes everything after the watermark.",
    )
    ops = Operations(story.engine, actor="demo")
    for name, spec in story.catalog.rollups.items():
        state = ops.activate(name)
        mark = state.watermark.astimezone(story.zone) if state.watermark else None
        align = spec.alignment.value + (f" {spec.size}" if spec.size else "")
        story.say(
            f"{name:<15} {align:<13} from {spec.source:<15} watermark {mark:%Y-%m-%d %H:%M %Z}"
        )


def backfill(story: Story, first: date) -> None:
    story.step(
        "3. Backfill the year through Dagster",
        "Hourly partitions are materialized one month per run (each run is one Spark job over "
        "a range of partitions); the retroactive-write sensor then carries the new hourly rows "
        "up the chain, and the forward sensor closes what is left up to now.",
    )
    spec = story.catalog.rollup("energy_hourly")
    mark = story.engine.states.get("energy_hourly").watermark
    assert mark is not None
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    chunks = []
    while start < mark:
        nxt = (start.replace(day=1) + timedelta(days=32)).replace(day=1)
        chunks.append(Window(start, min(nxt, mark)))
        start = nxt
    pdef = partitions_def_for(spec)
    with click.progressbar(
        chunks,
        label="        energy_hourly",
        item_show_func=lambda w: f"{w.start:%Y-%m}" if w else "",
    ) as bar:
        for span in bar:
            buckets = [w for w in story.engine.buckets_in(spec, [span]) if w.end <= mark]
            keys = key_range_for(pdef, buckets)
            run = execute(
                story.defs,
                story.instance,
                job_name(spec),
                partition_range_tags(keys.start, keys.end),
                # One month at a time; the levels above are brought up once, for the whole year.
                {"ops": {spec.name: {"config": {"propagate_in_run": False}}}},
            )
            require_success([run])
    story.say(f"energy_hourly: {len(chunks)} runs done; propagating up the chain")
    reports = tick_until_quiet(story.defs, story.instance, sensors=("retroactive_write_sensor",))
    print_runs(story, [r for rep in reports for r in rep.runs])
    reports = tick_until_quiet(story.defs, story.instance)
    print_runs(story, [r for rep in reports for r in rep.runs])


def require_success(runs: list[RunReport | None]) -> None:
    failed = [r for r in runs if r is not None and not r.success]
    if failed:
        raise DemoError(f"run {failed[0].run_id} of {failed[0].job_name} failed: {failed[0].error}")


def print_runs(story: Story, runs: list[RunReport]) -> None:
    require_success(list(runs))
    for r in runs:
        rng = (
            r.tags.get("dagster/asset_partition_range_start", "?"),
            r.tags.get("dagster/asset_partition_range_end", "?"),
        )
        span = rng[0] if rng[0] == rng[1] else f"{rng[0]} .. {rng[1]}"
        story.say(
            f"{r.tags.get('rollups/rollup', r.job_name):<15} "
            f"{r.tags.get('rollups/trigger', ''):<17} partitions {span}",
            dim=True,
        )


def show_values(story: Story, first: date, today: date) -> dict[str, pa.Table]:
    story.step(
        f"4. What readers see for {CORRECTED_METER}",
        "Reads resolve each bucket's active generation through the pointer table, without Spark.",
    )
    tables = {
        name: story.query(name, entities=[CORRECTED_METER])
        for name in ("energy_daily", "energy_monthly")
    }
    daily = tables["energy_daily"].to_pylist()
    monthly = tables["energy_monthly"].to_pylist()
    click.echo(table([_row(story, r, "%a %Y-%m-%d") for r in daily[-5:]], "last days"))
    click.echo(table([_row(story, r, "%Y-%m") for r in monthly[-5:]], "last months"))
    return tables


def _row(story: Story, r: dict, fmt: str) -> dict:
    return {
        "bucket": r["bucket_start"].astimezone(story.zone).strftime(fmt),
        "kWh": f"{r['energy_kwh_sum']:.2f}",
        "readings": r["energy_kwh_count"],
        "avg kW": f"{r['power_kw_avg']:.3f}" if r["power_kw_avg"] is not None else "-",
        "V min..max": f"{r['voltage_v_min']:.1f}..{r['voltage_v_max']:.1f}",
    }


def local_time(story: Story, t: datetime) -> str:
    return f"{t.astimezone(story.zone):%Y-%m-%d %H:%M}"


def table(rows: list[dict], title: str) -> str:
    if not rows:
        return f"        {title}: (no rows)"
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = [f"        {title}:"]
    lines.append("          " + "  ".join(c.rjust(width[c]) for c in cols))
    lines += ["          " + "  ".join(str(r[c]).rjust(width[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def ingest_correction(story: Story, today: date) -> tuple[date, pa.Table]:
    corrected = today - timedelta(days=91)
    story.step(
        f"5. A correction arrives: {CORRECTED_METER} on {corrected}, plus late readings",
        f"The meter's readings for that whole day were {CORRECTION_FACTOR - 1:.0%} too low and "
        f"are re-sent; {len(LATE_METERS)} meters deliver readings that were missing last week.",
    )
    spec = story.catalog.raw["energy_raw"]
    local = datetime(corrected.year, corrected.month, corrected.day, tzinfo=story.zone)
    both = pa.concat_tables(
        day_batch(d, story.meters, SEED) for d in (corrected, corrected + ONE_DAY)
    )
    in_day = pc.and_(
        pc.greater_equal(both["ts"], pa.scalar(local, both.schema.field("ts").type)),
        pc.less(both["ts"], pa.scalar(local + ONE_DAY, both.schema.field("ts").type)),
    )
    day = both.filter(pc.and_(in_day, pc.equal(both["entity_id"], CORRECTED_METER)))
    fixed = day.set_column(
        day.schema.get_field_index("energy_kwh"),
        "energy_kwh",
        pc.round(pc.multiply(day["energy_kwh"], CORRECTION_FACTOR), 6),
    )
    late = late_readings(story, today)
    path = story.out / "landing" / "correction.parquet"
    pq.write_table(pa.concat_tables([fixed, late]), path)
    result = story.engine.raw.ingest(spec, path, ChangeSource.MANUAL)
    story.say(
        f"energy_raw: {fixed.num_rows} corrected + {late.num_rows} late readings upserted "
        f"(table version {result.version}, change source Manual)"
    )
    return corrected, late


def late_readings(story: Story, today: date) -> pa.Table:
    """Readings of the last week that the first delivery was missing (the generator's gaps)."""
    out = []
    for d in (today - timedelta(days=k) for k in range(2, 9)):
        full = day_batch(d, story.meters, SEED, missing=0.0)
        sent = day_batch(d, story.meters, SEED)
        mine = pc.is_in(full["entity_id"], pa.array(LATE_METERS))
        full = full.filter(mine)
        have = {
            (e, t) for e, t in zip(*(sent[c].to_pylist() for c in ("entity_id", "ts")), strict=True)
        }
        keys = zip(*(full[c].to_pylist() for c in ("entity_id", "ts")), strict=True)
        out.append(full.filter(pa.array([k not in have for k in keys])))
    return pa.concat_tables(out)


LEVELS = ("energy_hourly", "energy_daily", "energy_weekly", "energy_monthly", "energy_yearly")


def capture(story: Story, corrected: date) -> dict[str, pa.Table]:
    """Every level's rows for the corrected meter in the buckets that hold the corrected day."""
    start = datetime(corrected.year, corrected.month, corrected.day, tzinfo=story.zone)
    noon = start + timedelta(hours=12)
    out = {}
    for name in LEVELS:
        spec = story.catalog.rollup(name)
        bucket = story.engine.buckets_in(spec, [Window(noon, noon + timedelta(seconds=1))])[0]
        if name == "energy_hourly":
            bucket = Window(noon, noon + timedelta(hours=1))
        out[name] = story.query(
            name, start=bucket.start, end=bucket.end, entities=[CORRECTED_METER]
        )
    return out


def propagate(story: Story) -> list[Job]:
    story.step(
        "6. The sensors run until quiet",
        "The retroactive-write sensor reads the new commit's change feed, finds rows older than "
        "each level's watermark, and queues exactly those windows for exactly those meters; each "
        "recompute writes a new generation, flips the pointer in one commit, and queues the level "
        "above (chain propagation).",
    )
    since = datetime.now(UTC)
    reports = tick_until_quiet(story.defs, story.instance)
    print_runs(story, [r for rep in reports for r in rep.runs])
    snap = story.engine.ledger.snapshot()
    jobs = [
        j
        for name in LEVELS
        for j in snap.for_rollup(name)
        if j.created_at >= since and j.trigger.value not in ("Forward", "OpenBucket")
    ]
    return sorted(jobs, key=lambda j: (LEVELS.index(j.rollup), j.created_at))


def show_before_after(
    story: Story, before: dict[str, pa.Table], after: dict[str, pa.Table], corrected: date
) -> None:
    story.step(
        f"7. Before and after, at every level, for the buckets holding {corrected}",
        "The day, its ISO week, month and year all moved by the same kWh (one hour is shown "
        "for the hourly level); reading counts did not change, only values.",
    )
    rows = []
    for name in LEVELS:
        b = before[name].to_pylist()
        a = after[name].to_pylist()
        if not a:
            continue
        bucket = a[0]["bucket_start"].astimezone(story.zone)
        rows.append(
            {
                "level": name,
                "bucket (local)": f"{bucket:%Y-%m-%d %H:%M}",
                "kWh before": f"{b[0]['energy_kwh_sum']:.3f}" if b else "-",
                "kWh after": f"{a[0]['energy_kwh_sum']:.3f}",
                "delta": f"{a[0]['energy_kwh_sum'] - (b[0]['energy_kwh_sum'] if b else 0):+.3f}",
                "readings": a[0]["energy_kwh_count"],
            }
        )
    click.echo(table(rows, CORRECTED_METER))


def show_jobs(story: Story, jobs: list[Job]) -> None:
    story.step(
        "8. The job records (`rollups jobs ROLLUP`)",
        "Each recompute is a job with its trigger, state, windows, meters, rows and generation.",
    )
    rows = [
        {
            "rollup": j.rollup,
            "trigger": j.trigger.value,
            "state": j.state.value,
            "windows": j.windows_processed if j.windows_processed is not None else len(j.windows),
            "first window": local_time(story, min(w.start for w in j.windows)) if j.windows else "",
            "meters": "all" if j.entities is None else len(j.entities),
            "rows": j.rows_processed if j.rows_processed is not None else "",
            "gen": j.generation if j.generation is not None else "",
            "ms": j.duration_ms if j.duration_ms is not None else "",
        }
        for j in jobs
    ]
    click.echo(table(rows, f"{len(rows)} job(s) since the correction"))


class Reader:
    """Queries the corrected day's daily and monthly rows in a loop while the recomputes run."""

    def __init__(self, story: Story, corrected: date) -> None:
        self.story = story
        start = datetime(corrected.year, corrected.month, corrected.day, tzinfo=story.zone)
        self.day = Window(start, start + timedelta(days=1))
        self.reads: list[float | None] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                rows = self.story.query(
                    "energy_daily",
                    start=self.day.start,
                    end=self.day.end,
                    entities=[CORRECTED_METER],
                ).to_pylist()
                self.reads.append(rows[0]["energy_kwh_sum"] if rows else None)
            except Exception as exc:  # a reader must never fail; report it rather than hide it
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(0.2)

    def report(self, before: dict[str, pa.Table], after: dict[str, pa.Table]) -> None:
        old = before["energy_daily"]["energy_kwh_sum"][0].as_py()
        new = after["energy_daily"]["energy_kwh_sum"][0].as_py()
        n_old = sum(1 for v in self.reads if v == old)
        n_new = sum(1 for v in self.reads if v == new)
        other = len(self.reads) - n_old - n_new
        self.story.say(
            f"reader: {len(self.reads)} reads of the corrected day during the recomputes: "
            f"{n_old} saw the old value, {n_new} the new one, {other} anything else, "
            f"{len(self.errors)} failed"
        )
        if other or self.errors:
            raise DemoError(
                f"a reader saw a partial state: {other} odd value(s), errors {self.errors[:1]}"
            )


def verify(story: Story) -> None:
    story.step(
        "9. The proof",
        "Every level is compared with a pandas aggregation straight from the raw rows (buckets "
        "from pandas' own calendar arithmetic in Europe/Vienna, sharing no code with Spark).",
    )
    raw = raw_frame(story.engine.raw.read_arrow(story.catalog.raw["energy_raw"]))
    problems = compare_all(lambda name: story.query(name), raw, story.catalog)
    if problems:
        for p in problems:
            story.say(click.style(p, fg="red"))
        raise DemoError(f"{len(problems)} difference(s) between the rollups and the raw data")
    counts = ", ".join(f"{name.split('_')[1]} {story.query(name).num_rows:,}" for name in LEVELS)
    story.say(
        click.style("all levels equal the raw data", fg="green", bold=True)
        + f" ({len(raw):,} readings; rows: {counts})"
    )


def chart(story: Story, before: dict[str, pa.Table], corrected: date, late: pa.Table) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    after_daily = story.query("energy_daily", entities=[CORRECTED_METER])
    after_monthly = story.query("energy_monthly", entities=[CORRECTED_METER])
    lo = datetime(corrected.year, corrected.month, corrected.day, tzinfo=story.zone) - timedelta(
        days=21
    )
    hi = lo + timedelta(days=43)

    def series(t: pa.Table, window: bool) -> tuple[list[datetime], list[float]]:
        rows = [r for r in t.to_pylist() if not window or lo <= r["bucket_start"] < hi]
        return (
            [r["bucket_start"].astimezone(story.zone) for r in rows],
            [r["energy_kwh_sum"] for r in rows],
        )

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), constrained_layout=True)
    x, y = series(before["energy_daily"], True)
    ax1.plot(x, y, "o-", color="#9aa5b1", label="before the correction")
    x, y = series(after_daily, True)
    ax1.plot(x, y, ".-", color="#1f6feb", label="after")
    ax1.set_title(f"{CORRECTED_METER}: daily energy (kWh) around {corrected}")
    ax1.legend()
    old = dict(zip(*series(before["energy_monthly"], False), strict=True))
    ax, ay = series(after_monthly, False)
    by = [old.get(d, 0.0) for d in ax]
    idx = range(len(ax))
    ax2.bar([i - 0.2 for i in idx], by, width=0.4, color="#9aa5b1", label="before")
    ax2.bar([i + 0.2 for i in idx], ay, width=0.4, color="#1f6feb", label="after")
    ax2.set_xticks(list(idx), [f"{d:%Y-%m}" for d in ax], rotation=45)
    ax2.set_title(f"{CORRECTED_METER}: monthly energy (kWh)")
    ax2.legend()
    path = story.out / "correction.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    story.step("10. Chart", "Daily and monthly energy of the corrected meter, before vs after.")
    story.say(f"wrote {path}")


def epilogue(story: Story) -> None:
    click.echo()
    story.say(click.style("Done.", bold=True) + " Next:")
    for line in (
        "make dev                          the Dagster UI on this history (http://127.0.0.1:3000)",
        "rollups status                    health of every rollup",
        "rollups jobs energy_daily         the newest recompute jobs",
        f"rollups query energy_monthly --entity {CORRECTED_METER}",
    ):
        click.echo(f"        {line}")
