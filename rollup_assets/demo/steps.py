"""The demo's actions: ingest a year, activate, backfill, land a correction, let it propagate."""

from datetime import UTC, date, datetime, timedelta

import click
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollup_assets.demo.report import print_runs, require_success
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.demo.story import (
    CORRECTED_METER,
    CORRECTION_FACTOR,
    LATE_METERS,
    LEVELS,
    ONE_DAY,
    SEED,
    Story,
)
from rollup_assets.model.durations import format_duration
from rollup_assets.model.errors import DemoError
from rollup_assets.model.jobs import ChangeSource, Job, Lane
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.jobs import job_name
from rollup_assets.orchestration.partitions import key_range_for, partitions_def_for
from rollup_assets.orchestration.runner import execute, tick_until_quiet
from rollup_assets.orchestration.tags import partition_range_tags
from rollup_assets.services.ingest import ingest_file
from rollup_assets.services.operations import Operations
from rollup_assets.services.retention import apply_retention
from rollup_assets.services.verify import compare_all, raw_frame


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
            result = ingest_file(story.engine, spec.name, path, ChangeSource.IMPORT)
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
            buckets = [w for w in buckets_in(spec, [span]) if w.end <= mark]
            keys = key_range_for(pdef, buckets)
            run = execute(
                story.defs,
                story.instance,
                job_name(spec),
                partition_range_tags(keys.start, keys.end),
                # One month at a time; the levels above are brought up once, for the whole year.
                {"ops": {spec.name: {"config": {"propagate_in_run": False}}}},
                log_level=story.log_level,
            )
            require_success([run])
    story.say(f"energy_hourly: {len(chunks)} runs done; propagating up the chain")
    reports = tick_until_quiet(
        story.defs,
        story.instance,
        sensors=("retroactive_write_sensor",),
        log_level=story.log_level,
    )
    print_runs(story, [r for rep in reports for r in rep.runs])
    reports = tick_until_quiet(story.defs, story.instance, log_level=story.log_level)
    print_runs(story, [r for rep in reports for r in rep.runs])


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
    result = ingest_file(story.engine, spec.name, path, ChangeSource.MANUAL)
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


def capture(story: Story, corrected: date) -> dict[str, pa.Table]:
    """Every level's rows for the corrected meter in the buckets that hold the corrected day."""
    start = datetime(corrected.year, corrected.month, corrected.day, tzinfo=story.zone)
    noon = start + timedelta(hours=12)
    out = {}
    for name in LEVELS:
        spec = story.catalog.rollup(name)
        bucket = buckets_in(spec, [Window(noon, noon + timedelta(seconds=1))])[0]
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
    reports = tick_until_quiet(story.defs, story.instance, log_level=story.log_level)
    print_runs(story, [r for rep in reports for r in rep.runs])
    snap = story.engine.ledger.snapshot()
    jobs = [
        j
        for name in LEVELS
        for j in snap.for_rollup(name)
        if j.created_at >= since and j.trigger.lane is Lane.RECOMPUTE
    ]
    return sorted(jobs, key=lambda j: (LEVELS.index(j.rollup), j.created_at))


def retention(story: Story) -> None:
    spec = story.catalog.raw["energy_raw"]
    kept = format_duration(spec.retention) if spec.retention else "forever"
    story.step(
        f"12. Nightly maintenance: energy_raw keeps {kept} of raw readings",
        "The first step of `rollups maintain` (the nightly schedule) drops the raw UTC days older "
        "than the archive's retention (compaction and vacuum, which follow it there, are left "
        "out here to keep the demo short). The rollups are the long-term store: a retention "
        "delete is not a correction, so every level keeps its values.",
    )
    upper = [name for name in LEVELS if name != "energy_hourly"]
    before = {name: story.query(name) for name in upper}
    outcomes = apply_retention(story.engine, datetime.now(UTC))
    for outcome in outcomes:
        story.say(outcome.describe())
    dropped = sum(len(o.days) for o in outcomes)
    rows = sum(o.rows for o in outcomes)
    unchanged = all(story.query(name).equals(before[name]) for name in upper)
    if not unchanged:
        raise DemoError("a level changed when retention dropped raw days")
    removed = story.engine.removed_spans(spec)
    raw = raw_frame(story.engine.raw.read_arrow(spec))
    skipped: dict[str, int] = {}
    problems = compare_all(story.query, raw, story.catalog, removed=removed, skipped=skipped)
    if problems:
        raise DemoError("; ".join(problems))
    story.say(
        click.style("every level kept its values", fg="green", bold=True)
        + f" ({dropped} raw day(s), {rows:,} readings dropped;"
        f" {len(raw):,} readings left equal the rollups outside the dropped range, "
        f"{skipped.get('energy_hourly', 0):,} hourly buckets now live only in the rollups)"
    )
