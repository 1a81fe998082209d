"""The results: goals judged from the measurements, a printed table, results.json and a plot."""

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt

GOALS = {
    "backfill_overhead_vs_bare_spark": ("<=", 1.5, "x"),
    "one_reading_rows_read_pct_of_full_rebuild": ("<=", 0.1, "%"),
    "hundred_readings_rows_read_pct_of_full_rebuild": ("<=", 0.1, "%"),
    "ten_thousand_readings_rows_read_pct_of_full_rebuild": ("<=", 1.0, "%"),
    "ten_thousand_readings_time_pct_of_full_rebuild": ("<=", 10.0, "%"),
    "identical_reingest_cells_recomputed": ("<=", 0.0, "cells"),
    "year_daily_read_after_corrections_vs_plain": ("<=", 1.0, "x"),
    "one_reading_daemon_latency_s": ("<=", 10.0, "s"),
    "read_path_vs_plain_read": ("<=", 1.3, "x"),
    "realtime_read_vs_plain_read": ("<=", 1.5, "x"),
    "downsample_daily_to_months_vs_plain_read": ("<=", 1.5, "x"),
    "wave_cost_at_10x_meters": ("<=", 1.2, "x"),
    "wave_cost_at_longest_archive": ("<=", 1.2, "x"),
    "year_daily_read_after_waves_current_vs_plain": ("<=", 1.0, "x"),
    "year_daily_read_after_waves_folding_vs_plain": ("<=", 1.5, "x"),
    "downsample_after_waves_vs_plain_read": ("<=", 1.5, "x"),
    "surface_plain_read_vs_partition_files": ("<=", 1.3, "x"),
    "surface_publish_rows_written_per_level_max": ("<=", 131_072.0, "rows"),
    "surface_publish_surface_rows_read_per_level_max": ("<=", 131_072.0, "rows"),
    "surface_lag_after_one_reading_s": ("<=", 60.0, "s"),
    "peak_driver_memory_mb": ("<=", 2048.0, "MiB"),
}


# Results keys of the alternatives a step of ours is compared with: their memory is not ours.
BASELINES = frozenset({"bare_spark_hourly", "duckdb_hourly", "bare_spark_chain", "lookback"})


def ours_peaks(results: dict) -> dict[str, float]:
    """The driver's peak RSS (MiB) of every step of ours that measured it (ingests, backfill,
    corrections, publishes, reads, folds), by where it is in the results; baselines excluded."""
    out: dict[str, float] = {}

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in BASELINES:
                    continue
                if key == "driver_peak_mb" and isinstance(value, int | float):
                    out[where] = float(value)
                else:
                    walk(value, f"{where}/{key}" if where else str(key))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                label = (
                    f"{item['readings']:,} readings"
                    if isinstance(item, dict) and "readings" in item
                    else i
                )
                walk(item, f"{where}[{label}]")

    walk(results["scenarios"], "")
    return out


def judge(results: dict) -> list[dict]:
    """Each goal with its measured value and met (True/False) or None when not measured."""
    sc = results["scenarios"]
    backfill, corr = sc.get("backfill"), sc.get("correction")
    one = next((c for c in (corr or {}).get("cases", []) if c["readings"] == 1), None)
    values: dict[str, tuple[float | None, str]] = {}
    if backfill:
        values["backfill_overhead_vs_bare_spark"] = (
            backfill["overhead_vs_bare_spark"],
            "first-level range run (Dagster + Delta commit + flip + sweep) / bare PySpark script; "
            "where its time went (s): "
            + ", ".join(
                f"{k} {v}" for k, v in backfill["ours"]["first_level"].get("breakdown", {}).items()
            ),
        )
    if backfill and one:
        full = backfill["ours"]["total"]["rows_read"]["total"]
        values["one_reading_rows_read_pct_of_full_rebuild"] = (
            100.0 * one["rows_read"] / full if full else None,
            f"{one['rows_read']:,} rows (recompute runs {one['recompute_rows_read']:,}, "
            f"open-bucket refreshes the rest) vs {full:,} for the full chain",
        )
    for count, name in ((100, "hundred"), (10_000, "ten_thousand")):
        case = next((c for c in (corr or {}).get("cases", []) if c["readings"] == count), None)
        if backfill and case:
            full = backfill["ours"]["total"]
            rows, secs = full["rows_read"]["total"], full["seconds"]
            work = case.get("jobs", {})
            values[f"{name}_readings_rows_read_pct_of_full_rebuild"] = (
                100.0 * case["rows_read"] / rows if rows else None,
                f"{case['rows_read']:,} rows vs {rows:,}; cells changed "
                f"{work.get('cells_changed', 0):,}, skipped {work.get('cells_skipped', 0):,}, "
                f"corrected from {work.get('change_rows', 0):,} change rows "
                f"{work.get('cells_applied', 0):,}",
            )
            if count == 10_000:
                took = case["tick_loop"]["seconds"]
                values[f"{name}_readings_time_pct_of_full_rebuild"] = (
                    100.0 * took / secs if secs else None,
                    f"{took:.1f} s vs the rebuild's {secs:.1f} s",
                )
    same = (corr or {}).get("identical_reingest")
    if same:
        values["identical_reingest_cells_recomputed"] = (
            same["cells_recomputed"],
            f"{same['rows']:,} rows re-ingested: {same['inserted']} inserted, "
            f"{same['updated']} updated, {same['jobs']} job(s)",
        )
    daemon = sc.get("daemon")
    values["one_reading_daemon_latency_s"] = (
        daemon["commit_to_last_level_s"] if daemon else None,
        "raw commit -> last level's commit, real dagster-daemon with the shipped defaults, "
        f"median of {daemon['repeats']}; phases {daemon['median_phases_s']}"
        if daemon
        else "not run (--no-daemon)",
    )
    reads = sc.get("read")
    if reads:
        ratios = {k: v["ratio"] for k, v in reads.items()}
        values["read_path_vs_plain_read"] = (
            max(ratios.values()),
            ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()),
        )
    if reads and "year_daily" in reads:
        pointers = (corr or {}).get("pointer_rows", {})
        folded = (corr or {}).get("fold", {}).get("pointer_rows", {})
        values["year_daily_read_after_corrections_vs_plain"] = (
            reads["year_daily"]["ratio"],
            f"read after every correction wave and a fold; pointer rows {pointers}, after the "
            f"fold {folded}",
        )
    modes = sc.get("read_modes")
    if modes:
        live, down = modes["realtime_month_hourly"], modes["downsample_year_daily"]
        values["realtime_read_vs_plain_read"] = (
            live["ratio"],
            f"{live['days']} d of {live['rollup']}, {live['live_days']} d beyond the watermark "
            f"aggregated from raw: {live['mode_s']:.3f}s vs the query path's read of the same "
            f"rows {live['plain_s']:.3f}s{_vs_delta_rs(live)}",
        )
        values["downsample_daily_to_months_vs_plain_read"] = (
            down["ratio"],
            f"{down['plain_rows']:,} {down['rollup']} rows to {down['rows']:,} monthly: "
            f"{down['mode_s']:.3f}s vs the query path's read of the same rows "
            f"{down['plain_s']:.3f}s{_vs_delta_rs(down)}",
        )
    scaling = sc.get("scaling")
    if scaling:
        for goal, key, unit in (
            ("wave_cost_at_10x_meters", "width", "meters"),
            ("wave_cost_at_longest_archive", "length", "days"),
        ):
            r = scaling[key]
            figures = {k: r[k] for k in ("rows_read", "bytes_written", "seconds")}
            values[goal] = (
                max(figures.values()),
                f"{scaling['wave']} late readings, {r['from']:,} vs {r['to']:,} {unit} (ingest, "
                "correction and publish): "
                + ", ".join(f"{k.replace('_', ' ')} {v:.2f}x" for k, v in figures.items()),
            )
    waves = [
        c
        for c in (corr or {}).get("cases", [])
        if (c.get("reads_after") or {}).get("surface_current")
    ]
    if waves:
        for goal, key, what in (
            ("year_daily_read_after_waves_current_vs_plain", "surface_current", "published"),
            ("year_daily_read_after_waves_folding_vs_plain", "surface_lagging", "not published"),
            ("downsample_after_waves_vs_plain_read", "downsample_to_months", "published"),
        ):
            each = {c["readings"]: c["reads_after"][key]["ratio"] for c in waves}
            base = " vs the query path's read" if key == "downsample_to_months" else ""
            plain = [c["reads_after"][key].get("vs_delta_rs") for c in waves]
            known = [v for v in plain if v is not None]
            beside = f"; vs a plain delta-rs read at most {max(known):.2f}x" if known else ""
            values[goal] = (
                max(each.values()),
                f"worst of the waves, read right after each ({what}, no fold){base}: "
                + ", ".join(f"{n:,} readings {v:.2f}x" for n, v in each.items())
                + beside,
            )
    if surf := sc.get("surface"):
        widths = surf["widths"]
        narrow, wide = widths[0], widths[-1]
        reads = max(surf["reads"], key=lambda r: r["plain_capped_vs_partition_files"])
        values["surface_plain_read_vs_partition_files"] = (
            reads["plain_capped_vs_partition_files"],
            "a year of daily rows, delta-rs to pyarrow, files of at most "
            f"{surf['file_rows']:,} rows vs partition-sized files: "
            + "; ".join(
                f"{r['meters']:,} meters ({r['rows']:,} rows) {r['files']['capped']} vs "
                f"{r['files']['partition_files']} files, "
                f"{r['plain_capped_vs_partition_files']:.2f}x (CPU "
                f"{r['plain_capped_vs_partition_files_cpu']:.2f}x)"
                for r in surf["reads"]
            ),
        )
        most = max(v["rows_written"] for w in widths for v in w["levels"].values())
        values["surface_publish_rows_written_per_level_max"] = (
            most,
            f"one changed cell, any level, at {narrow['meters']:,} and {wide['meters']:,} "
            f"meters (files of at most {surf['file_rows']:,} rows)",
        )
        ratio = surf["wide_vs_narrow"]
        values["surface_publish_surface_rows_read_per_level_max"] = (
            max(v["surface_rows_read"] for w in widths for v in w["levels"].values()),
            f"one changed cell, any level, at {narrow['meters']:,} and {wide['meters']:,} "
            f"meters; every row read, the row table's included: "
            f"{narrow['total']['rows_read']:,} and {wide['total']['rows_read']:,} "
            f"({ratio['rows_read']}x; a partition below the cap is one file, rewritten whole)",
        )
    if one and "surface" in one:
        lags = one["repeats"]["surface_lag_closed_s"]
        values["surface_lag_after_one_reading_s"] = (
            max(lags),
            f"oldest unpublished flip -> publish committed, right after each one-reading "
            f"correction (publish {one['surface']['publish']['seconds']:.2f}s, "
            f"{one['surface']['rows_read']:,} rows read, "
            f"{one['surface']['written']['bytes']:,} bytes written); with the daemon add up to "
            "half of ROLLUPS_SURFACE_MAX_LAG_SECONDS and a sensor interval",
        )
    peaks = ours_peaks(results)
    top = max(peaks, key=peaks.__getitem__) if peaks else None
    values["peak_driver_memory_mb"] = (
        peaks[top] if top is not None else None,
        f"max driver RSS over every step of ours (ingests, backfill, corrections, publishes, "
        f"reads, folds), at {top}; whole process "
        f"incl. DuckDB/oracle {results['peak_driver_rss_mb']:.0f} MiB, Spark JVM "
        f"{results['peak_jvm_rss_mb']:.0f} MiB; goal stated for SIZE=default, this run: "
        f"{results['meta']['size']}",
    )
    goals = []
    for name, (op, target, unit) in GOALS.items():
        value, note = values.get(name, (None, "scenario not run"))
        ok = None if value is None or math.isnan(value) else value <= target
        goals.append(
            {
                "goal": name,
                "target": f"{op} {target:g} {unit}",
                "value": None if value is None else round(float(value), 4),
                "unit": unit,
                "met": ok,
                "note": note,
            }
        )
    return goals


Num = int | float | None


def _row(
    scenario: str,
    variant: str,
    secs: Num,
    rows: Num = None,
    windows: Num = None,
    peak: Num = None,
    note: str = "",
) -> dict:
    return {
        "scenario": scenario,
        "variant": variant,
        "wall_s": secs,
        "rows_read": rows,
        "windows": windows,
        "peak_driver_mb": peak,
        "note": note,
    }


def table_rows(results: dict) -> list[dict]:
    sc = results["scenarios"]
    rows = []
    if b := sc.get("backfill"):
        ours = b["ours"]
        written = sum(v["windows"] for v in ours["levels"].values())
        rows += [
            _row(
                "backfill",
                "ingest (MERGE commits)",
                ours["ingest"]["seconds"],
                peak=ours["ingest"]["driver_peak_mb"],
                note=f"{results['meta']['raw_rows']:,} rows",
            ),
            _row(
                "backfill",
                "ours: whole chain",
                ours["total"]["seconds"],
                ours["total"]["rows_read"]["total"],
                written,
                ours["total"]["driver_peak_mb"],
                f"{b['chain_vs_bare_chain']:.2f}x bare chain",
            ),
            _row(
                "backfill",
                "ours: first level (1 range run)",
                ours["first_level"]["seconds"],
                ours["first_level"]["rows_read"]["total"],
                ours["levels"]["energy_hourly"]["windows"],
                ours["first_level"]["driver_peak_mb"],
                f"{b['overhead_vs_bare_spark']:.2f}x bare",
            ),
            _row(
                "backfill",
                "bare PySpark: first level",
                b["bare_spark_hourly"]["seconds"],
                b["bare_spark_hourly"]["rows_read"]["total"],
            ),
            _row(
                "backfill",
                "DuckDB: first level",
                b["duckdb_hourly"]["seconds"],
                note=f"ours {b['duckdb_floor_ratio']:.2f}x",
            ),
            _row(
                "backfill",
                "bare PySpark: whole chain",
                b["bare_spark_chain"]["seconds"],
                b["bare_spark_chain"]["rows_read"]["total"],
            ),
        ]
    if w := sc.get("writers"):
        for case in w["cases"]:
            for writer, f in case["writers"].items():
                note = (
                    f"{case['rows']:,} rows: {f['inserted']:,} inserted, {f['updated']:,} "
                    f"updated; JVM {f['jvm_peak_mb']:,.0f} MiB"
                )
                if "purge" in f:
                    note += f"; purge {f['purge']['seconds']:.1f}s"
                if not case["same_rows"]:
                    note += "; TABLES DIFFER"
                rows.append(
                    _row(
                        "writers",
                        f"{case['case']}: {writer}",
                        f["seconds"],
                        peak=f["driver_peak_mb"],
                        note=note,
                    )
                )
    if c := sc.get("correction"):
        for case in c["cases"]:
            changed = case["windows_changed"]
            wrong = sum(v["left_wrong"] for v in changed.values())
            latency = _fmt(case["commit_to_last_level_s"])
            note = f"commit->last level {latency}s; look-back leaves {wrong} wrong"
            rows.append(
                _row(
                    "correction",
                    f"{case['readings']:,} reading(s), in-process",
                    case["tick_loop"]["seconds"],
                    case["rows_read"],
                    case["windows_recomputed"],
                    case["tick_loop"]["driver_peak_mb"],
                    note,
                )
            )
            if per := case.get("per_reading"):
                rows.append(
                    _row(
                        "correction",
                        "  per reading (ingest, correction, publish)",
                        per["seconds"],
                        note=f"{per['rows_read']:,.1f} rows read, "
                        f"{per['bytes_written'] / 1e3:,.1f} kB written",
                    )
                )
            if pub := case.get("surface"):
                rows.append(
                    _row(
                        "correction",
                        "  then its surface publish (1 run)",
                        pub["publish"]["seconds"],
                        pub["rows_read"],
                        peak=pub["publish"]["driver_peak_mb"],
                        note=f"lag closed {pub['max_lag_closed_s']:.1f}s; wrote "
                        f"{pub['written']['rows']:,} rows, {pub['written']['bytes'] / 1e6:.2f} MB",
                    )
                )
        if d := sc.get("daemon"):
            rows.append(
                _row(
                    "correction",
                    "1 reading, dagster-daemon",
                    d["commit_to_last_level_s"],
                    note=", ".join(f"{k} {v}" for k, v in d["median_phases_s"].items()),
                )
            )
        if b:
            rows.append(
                _row(
                    "correction",
                    "(a) full rebuild = backfill chain",
                    b["ours"]["total"]["seconds"],
                    b["ours"]["total"]["rows_read"]["total"],
                )
            )
        lb = c["lookback"]
        rows.append(
            _row(
                "correction",
                "(b) 7-day look-back (bare PySpark)",
                lb["seconds"],
                lb["rows_read"]["total"],
                note="wrong windows: see cases",
            )
        )
        rows.append(
            _row(
                "correction",
                "ours: windows wrong after",
                None,
                note=", ".join(
                    f"{k.removeprefix('energy_')} {v}" for k, v in c["wrong_windows_after"].items()
                ),
            )
        )
    if r := sc.get("read"):
        for v in r.values():
            rows.append(
                _row(
                    "read",
                    f"{v['rollup']} {v['days']} d: query path",
                    v["query_path_s"],
                    v["rows"],
                    peak=v["driver_peak_mb"],
                    note=f"plain delta-rs {v['plain_read_s']:.3f}s, {v['ratio']:.2f}x",
                )
            )
    if m := sc.get("read_modes"):
        for name, v in m.items():
            rows.append(
                _row(
                    "read",
                    f"{name.replace('_', ' ')}",
                    v["mode_s"],
                    v["rows"],
                    note=f"plain read {v['plain_s']:.3f}s, {v['ratio']:.2f}x",
                )
            )
    if surf := sc.get("surface"):
        for w in surf["widths"]:
            total = w["total"]
            rows.append(
                _row(
                    "surface",
                    f"one-cell publish, 5 levels, {w['meters']:,} meters",
                    round(sum(v["seconds"] for v in w["levels"].values()), 3),
                    total["rows_read"],
                    note=f"wrote {total['rows_written']:,} rows, "
                    f"{total['bytes_written'] / 1e6:.2f} MB",
                )
            )
        for rd in surf["reads"]:
            for key in ("plain_capped", "plain_partition_files", "query_capped"):
                rows.append(
                    _row(
                        "surface",
                        f"year of daily rows, {rd['meters']:,} meters: {key.replace('_', ' ')}",
                        rd["wall_s"][key],
                        rd["rows"],
                        note=f"{rd['files'][key.split('_', 1)[1]]} files, "
                        f"CPU {rd['cpu_s'][key]:.3f}s",
                    )
                )
    if s := sc.get("scaling"):
        for p in s["points"]:
            rows.append(
                _row(
                    "width and length",
                    f"{s['wave']} readings, {p['meters']:,} meters x {p['days']} d",
                    p["seconds"],
                    p["rows_read"],
                    note=f"wrote {p['bytes_written'] / 1e6:.2f} MB (ingest, correction, publish)",
                )
            )
    return rows


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def render(results: dict) -> str:
    cols = ["scenario", "variant", "wall_s", "rows_read", "windows", "peak_driver_mb", "note"]
    body = [[_fmt(r[c]) for c in cols] for r in results["table"]]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)) for b in body]
    lines.append("")
    for g in results["goals"]:
        verdict = {True: "MET", False: "MISSED", None: "NOT MEASURED"}[g["met"]]
        value = f"{_fmt(g['value'])} {g['unit']}"
        lines.append(f"{verdict:12s} {g['goal']}: {value} (goal {g['target']}) - {g['note']}")
    return "\n".join(lines)


GOALS_START = "<!-- goals: generated from bench/results.json by bench.report.goals_markdown -->"
GOALS_END = "<!-- end of goals -->"


def _vs_delta_rs(mode: dict) -> str:
    """A read mode's time against a plain delta-rs read of the surface's same rows (runs that
    timed it)."""
    if mode.get("vs_delta_rs") is None:
        return ""
    return f" (a plain delta-rs read {mode['delta_rs_s']:.3f}s: {mode['vs_delta_rs']:.2f}x)"


def goals_markdown(results: dict) -> str:
    """The goals of a run as the Markdown table docs/performance.md shows (between `GOALS_START`
    and `GOALS_END`; a test keeps the two equal)."""
    lines = ["| goal | target | figure | verdict | what was measured |", "|---|---|---|---|---|"]
    for g in results["goals"]:
        verdict = {True: "met", False: "missed", None: "not measured"}[g["met"]]
        value = "-" if g["value"] is None else f"{_fmt(g['value'])} {g['unit']}"
        note = str(g["note"]).replace("|", "/")
        lines.append(f"| {g['goal']} | {g['target']} | {value} | {verdict} | {note} |")
    return "\n".join([GOALS_START, *lines, GOALS_END])


def _finite(value: object) -> object:
    """NaN and infinities (a ratio over a zero) become null: JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(results), indent=2, default=str, allow_nan=False)
    path.write_text(text + "\n")


def plot(results: dict, path: Path) -> None:
    sc = results["scenarios"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    meta = results["meta"]
    fig.suptitle(
        f"rollups benchmark, {meta['meters']} meters x {meta['days']} days ({meta['size']})"
    )
    ax = axes[0][0]
    if b := sc.get("backfill"):
        labels = ["ours chain", "ours hourly", "bare Spark hourly", "DuckDB hourly", "bare chain"]
        vals = [
            b["ours"]["total"]["seconds"],
            b["ours"]["first_level"]["seconds"],
            b["bare_spark_hourly"]["seconds"],
            b["duckdb_hourly"]["seconds"],
            b["bare_spark_chain"]["seconds"],
        ]
        ax.bar(labels, vals, color=["C0", "C0", "C1", "C2", "C1"])
        ax.tick_params(axis="x", labelrotation=20)
    ax.set_title("1. backfill (s)")
    ax = axes[0][1]
    if c := sc.get("correction"):
        cases = [case for case in c["cases"] if "per_reading" in case]
        n = [case["readings"] for case in cases]
        ax.plot(n, [case["per_reading"]["seconds"] for case in cases], "o-", label="ours, s")
        if b:
            full = b["ours"]["total"]["seconds"]
            ax.plot(n, [full / k for k in n], "--", label="full rebuild / readings, s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("late readings in the wave")
        ax.legend()
    ax.set_title("2. cost per late reading (s, ingest + correction + publish)")
    ax = axes[1][0]
    if r := sc.get("read"):
        labels = [f"{v['rollup'].removeprefix('energy_')} {v['days']}d" for v in r.values()]
        x = range(len(labels))
        ax.bar(
            [i - 0.2 for i in x], [v["query_path_s"] for v in r.values()], 0.4, label="query path"
        )
        ax.bar(
            [i + 0.2 for i in x],
            [v["plain_read_s"] for v in r.values()],
            0.4,
            label="plain delta-rs",
        )
        ax.set_xticks(list(x), labels)
        ax.legend()
    ax.set_title("3. read (s)")
    ax = axes[1][1]
    if s := sc.get("scaling"):
        figures = ("rows_read", "bytes_written", "seconds")
        x = range(len(figures))
        for i, key in enumerate(("width", "length")):
            r = s[key]
            label = f"{r['to']:,} vs {r['from']:,} {'meters' if key == 'width' else 'days'}"
            ax.bar([j + (i - 0.5) * 0.4 for j in x], [r[f] for f in figures], 0.4, label=label)
        ax.axhline(1.2, color="grey", linestyle=":", label="goal")
        ax.set_xticks(list(x), [f.replace("_", " ") for f in figures])
        ax.legend()
    ax.set_title("4. 100-reading wave: larger archive / smaller (x)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
