"""The asset check's use case: stored buckets equal a fresh aggregation of their source.

A check publishes the rollup's surface first (`services.surface`), so one that a dead run left
behind its pointers is repaired by checking the rollup."""

from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from rollup_assets.compute.compare import diff_partials
from rollup_assets.model.cells import Cells
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.retention import removed_within
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.rollup_reads import Unknown
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface import publish


@dataclass(frozen=True)
class CheckDiff:
    buckets: int
    rows: int
    differing: int
    examples: list[dict] = field(default_factory=list)
    retained: int = 0  # buckets not checked: retention removed their source rows or them


def compare_with_source(
    engine: Engine, spark: SparkSession, spec: RollupSpec, spans: list[Window]
) -> CheckDiff:
    """Compare the aggregated (closed) buckets in `spans`; later buckets are skipped, and so
    are buckets whose source rows retention removed, or which the rollup's own retention
    dropped (counted in `retained`)."""
    publish(engine, spec)
    state = engine.states.get(spec.name)
    mark = state.watermark
    buckets = [w for w in buckets_in(spec, spans) if mark is not None and w.end <= mark]
    # A bucket whose source rows retention removed has no source left to compare with, and one
    # the rollup's own retention dropped has no stored rows.
    removed = [
        *engine.removed_spans(engine.catalog.archive(spec.source)),
        *engine.removed_spans(spec),
    ]
    kept = [w for w in buckets if not removed_within([w], removed)]
    retained = len(buckets) - len(kept)
    buckets = kept
    if not buckets:
        return CheckDiff(0, 0, 0, retained=retained)
    fresh, _ = engine.partials.on_spark(spark, spec, Cells.of(buckets), unknown=Unknown.REFILL)
    stored = engine.rollups.read_spark(spark, spec, buckets)
    diff = diff_partials(fresh, stored, spec)
    return CheckDiff(len(buckets), diff.rows, diff.differing, diff.examples, retained)
