"""What the demo shows: values before and after, the jobs, a reader's view, the proof, a chart."""

import threading
from datetime import date, datetime, timedelta

import click
import pyarrow as pa

from rollup_assets.demo.story import CORRECTED_METER, LEVELS, Story
from rollup_assets.model.errors import DemoError
from rollup_assets.model.jobs import Job
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.runner import RunReport
from rollup_assets.services.verify import compare_all, raw_frame


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
        "Reads resolve each bucket's active generation through the pointer table, without Spark. "
        "'peak A' aggregates current_a, a column computed from each reading at ingest.",
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
        # current_a is computed at ingest (power_kw * 1000 / voltage_v); its peak is a rollup
        "peak A": f"{r['current_a_max']:.2f}" if r["current_a_max"] is not None else "-",
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
    energy = story.catalog.raw["energy_raw"]
    raw = raw_frame(story.engine.raw.read_arrow(energy), energy)
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
    story.step("11. Chart", "Daily and monthly energy of the corrected meter, before vs after.")
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
