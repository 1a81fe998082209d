"""The demo's step 10: a rollup read by delta-spark, as any Spark job of the user's reads it.

The rollup's surface table (`rollups/<rollup>__active`) is a plain Delta table of the active
rows; delta-spark reads it in the demo's own session (which loads Delta's jars), and the rows
must equal what the project's query returns.
"""

import click
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rollup_assets.demo.report import table
from rollup_assets.demo.story import CORRECTED_METER, Story
from rollup_assets.model.errors import DemoError
from rollup_assets.resources.warehouse import spark_uri
from rollup_assets.services.surface import publish

ROLLUP = "energy_monthly"


def read_with_delta_spark(story: Story, spark: SparkSession) -> None:
    from delta.tables import DeltaTable

    path = spark_uri(story.engine.warehouse.surface_path(ROLLUP))
    story.step(
        f"10. The same rollup through delta-spark: spark.read.format('delta') on {ROLLUP}__active",
        "The surface table holds exactly the active rows; Spark, Databricks, Trino, DuckDB or "
        "Polars read it as a plain Delta table.",
    )
    # The surface publish sensor keeps it within its lag bound; the demo publishes on the spot,
    # as `rollups publish` does, so what Spark reads is the state the query reads.
    publish(story.engine, story.engine.catalog.rollup(ROLLUP))
    ours = story.query(ROLLUP)
    frame = spark.read.format("delta").load(path)
    theirs = frame.select(*ours.column_names).toArrow()
    order = [("entity_id", "ascending"), ("bucket_start", "ascending")]
    if theirs.sort_by(order).to_pylist() != ours.sort_by(order).to_pylist():
        raise DemoError(f"delta-spark reads {ROLLUP}'s surface differently from the query")
    story.say(
        click.style(f"{theirs.num_rows:,} rows, equal to `rollups query {ROLLUP}`", fg="green")
    )
    months = (
        frame.where(F.col("entity_id") == CORRECTED_METER)
        .orderBy(F.col("bucket_start").desc())
        .limit(3)
        .collect()
    )
    rows = [
        {
            "month": f"{r['bucket_start'].astimezone(story.zone):%Y-%m}",
            "kWh": f"{r['energy_kwh_sum']:.2f}",
            "readings": f"{r['energy_kwh_count']:,}",
        }
        for r in months
    ]
    click.echo(table(rows, f"{CORRECTED_METER}, newest months, read by delta-spark"))
    last = DeltaTable.forPath(spark, path).history(1).collect()[0]
    story.say(
        f"the surface's latest commit: version {last['version']}, {last['operation']}",
        dim=True,
    )
