"""The oracle chain scenario of `tests/integration/test_chain_oracle.py`, run in its own process
against a Spark given by URL, so its session can never be the test session's local one.

    python -m tests.system.chain_scenario --spark spark://host:port --root DIR --out result.json

What these runs prove is the deployment (the work runs there, and every level equals pandas);
the calendar's breadth is `test_chain_oracle`'s, in-process. So by default the scenario covers
one span of its days, backfilled in one run (`--span FIRST:DAYS`, repeatable, sets others): the
2024/2025 year end, where every level has a closed bucket and the open year holds data.

`--spark` is a master URL (spark://, local[N]) or a Spark Connect URL (sc://). The result JSON
holds the oracle differences (empty: every level equals pandas), the error of the scenario if it
raised, and what the session really ran on (master, application id, Spark Connect or not), so the
caller can prove the work did not silently happen in a local session.
"""

import argparse
import json
import os
import sys
import traceback
from datetime import date
from pathlib import Path

from pyspark.sql import SparkSession

from rollup_assets.assembly import build_definitions
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.resources.spark import build_session
from rollup_assets.resources.warehouse import Warehouse, spark_uri
from rollup_assets.services.engine import Engine
from rollup_assets.services.query import query_spark
from rollup_assets.settings import Settings
from tests.conftest import World, instance_in
from tests.integration import test_chain_oracle as chain
from tests.oracle import compare_all

# 2024-12-30 (Mon) .. 2025-01-01 (UTC), within test_chain_oracle's spans: ISO week 2025-W01
# across the year end, December and January, the closed year 2024 and the open 2025 (at NOW).
SPANS = [(date(2024, 12, 30), 3)]


def session_for(url: str, conf: dict[str, str]) -> SparkSession:
    """The session, chosen the way a deployment chooses it: through the environment, which the
    runs' `SparkResource` reads too (and must attach to this session, not stop it)."""
    os.environ["ROLLUPS_SPARK_REMOTE" if url.startswith("sc://") else "ROLLUPS_SPARK_MASTER"] = url
    settings = Settings.from_env()
    return build_session(
        master=settings.spark_master,
        remote=settings.spark_remote,
        conf=conf,
        delta_jars=settings.delta_jars,
        python=settings.pyspark_python,
        java_home=settings.java_home,
    )


def describe(spark: SparkSession) -> dict:
    """Where the session computes, read through SQL only (no sparkContext under Spark Connect)."""
    from pyspark import SparkContext

    return {
        "connect": type(spark).__module__.startswith("pyspark.sql.connect"),
        # Under Spark Connect this process must not have started a JVM of its own.
        "client_jvm": SparkContext._active_spark_context is not None,
        "master": spark.conf.get("spark.master", None),
        "app_id": spark.conf.get("spark.app.id", None),
        "rows": spark.range(0, 1000, numPartitions=4).count(),
    }


def run(
    spark_url: str,
    root: Path,
    warehouse_root: str,
    conf: dict[str, str],
    spans: list[tuple[date, int]] = SPANS,
) -> dict:
    home = root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    os.environ["ROLLUPS_WAREHOUSE"] = warehouse_root
    os.environ["DAGSTER_HOME"] = str(home)
    spark = session_for(spark_url, conf)
    result: dict = {"session": describe(spark), "error": None, "problems": None}
    catalog = load_catalog()
    # Every aggregation that reads a row on Spark, however few (this world's would run on the
    # driver); only the forward lane's empty open buckets stay there.
    resource = WarehouseResource(root=warehouse_root, driver_source_rows=1)
    defs = build_definitions(catalog, resource, settings=Settings.from_env())
    engine = Engine(catalog, Warehouse(warehouse_root), driver_source_rows=1)
    try:
        with instance_in(home, catalog) as instance:
            world = World(root, catalog, engine, defs, instance)
            try:
                chain.build_chain(world, spans)
            except Exception:  # reported, then judged by the caller
                result["error"] = traceback.format_exc()
            result["problems"] = compare_all(world.query, world.raw(), world.catalog)
            # The Spark read path and `toArrow` against the delta-rs/Arrow one.
            via_spark = query_spark(world.engine, spark, "energy_daily").toArrow()
            via_arrow = world.query("energy_daily")
            result["spark_query_rows"] = via_spark.num_rows
            result["spark_query_equal"] = (
                via_spark.select(via_arrow.column_names).to_pylist() == via_arrow.to_pylist()
            )
            # delta-spark in the same session (the executors, or the Connect server, load
            # Delta's jars): the daily surface read as a plain Delta table equals the query.
            surface = spark_uri(world.engine.warehouse.surface_path("energy_daily"))
            via_delta = spark.read.format("delta").load(surface).toArrow()
            order = [("entity_id", "ascending"), ("bucket_start", "ascending")]
            result["delta_spark_rows"] = via_delta.num_rows
            result["delta_spark_equal"] = (
                via_delta.select(via_arrow.column_names).sort_by(order).to_pylist()
                == via_arrow.sort_by(order).to_pylist()
            )
            result["runs"] = [(r.job_name, r.status.value) for r in instance.get_runs()]
        try:  # the runs attached to this session: had one stopped it, this would raise
            result["session_after"] = describe(spark)
        except Exception:
            result["error"] = f"{result['error'] or ''}{traceback.format_exc()}"
    finally:
        spark.stop()
    return result


def span(text: str) -> tuple[date, int]:
    first, _, n = text.partition(":")
    return date.fromisoformat(first), int(n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spark", required=True, help="master URL or sc:// Spark Connect URL")
    parser.add_argument("--root", required=True, type=Path, help="scratch directory")
    parser.add_argument("--warehouse", help="warehouse root (default: <root>/warehouse)")
    parser.add_argument("--out", required=True, type=Path, help="where to write the result")
    parser.add_argument("--conf", action="append", default=[], help="key=value Spark conf")
    parser.add_argument(
        "--span",
        action="append",
        type=span,
        help="FIRST:DAYS, e.g. 2024-12-30:3 (repeatable; default: the one span of SPANS)",
    )
    args = parser.parse_args(argv)
    conf = dict(kv.split("=", 1) for kv in args.conf)
    warehouse = args.warehouse or str(args.root / "warehouse")
    result = run(args.spark, args.root, warehouse, conf, args.span or SPANS)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["error"] is None and result["problems"] == [] else 1


if __name__ == "__main__":
    sys.exit(main())
