"""Specs -> Dagster definitions: one partitioned asset, check and job per rollup.

The asset body only routes: run tags written by the sensors say which lane (forward or
recompute) and which ledger job a run executes; a run launched from the UI or CLI without them
is a Manual recompute of the selected partitions. The asset reports a materialization exactly
for the partitions it rewrote, with the generation, rows, trigger, source versions and duration.
"""

import warnings
from datetime import UTC

import dagster as dg
from pydantic import Field

from resources.ledger import Trigger
from resources.spark import SparkResource
from resources.warehouse_resource import WarehouseResource
from rollup_assets import clock
from rollup_assets.chain import Chain
from rollup_assets.checks import compare_with_source
from rollup_assets.durations import format_duration
from rollup_assets.engine import Engine, RunOutcome
from rollup_assets.forward import run_forward
from rollup_assets.instance import pool_name
from rollup_assets.partitions import Window, partitions_def_for
from rollup_assets.recompute import run_recompute, start_job
from rollup_assets.specs import Alignment, ArchiveSpec, Catalog, RollupSpec

TAG_LANE = "rollups/lane"
TAG_JOB = "rollups/job_id"
TAG_TRIGGER = "rollups/trigger"
TAG_NOW = "rollups/now"
TAG_ROLLUP = "rollups/rollup"
CHECK_NAME = "matches_source"


class RollupRunConfig(dg.Config):
    """Launchpad options of a manual materialization (a recompute of the selected partitions)."""

    entities: list[str] = Field(
        default_factory=list,
        description="Recompute only these entity ids (empty: every entity).",
    )
    propagate_in_run: bool = Field(
        default=True,
        description="After writing this rollup, bring the rollups above it up to date in this "
        "same run (chain propagation and their open buckets, level by level, each under its own "
        "pool). Off: the sensors launch a run per level.",
    )


def job_name(spec: RollupSpec) -> str:
    return f"{spec.name}_job"


def group_name(catalog: Catalog, name: str) -> str:
    base = catalog.base_source(name).name
    return base.removesuffix("_raw") or base


def describe(spec: ArchiveSpec, catalog: Catalog) -> str:
    if not isinstance(spec, RollupSpec):
        cols = ", ".join(
            f"{c.name} ({c.type.value}{', required' if c.required else ''})" for c in spec.columns
        )
        kind = "Raw archive" if spec.kind.value == "raw" else "Time-range archive"
        return (
            f"{spec.description or kind}.\n\n{kind} written by `rollups ingest`; columns: {cols}."
        )
    align = spec.alignment.value
    if spec.alignment is Alignment.FIXED_SIZE and spec.size is not None:
        align += f" {format_duration(spec.size)}"
    aggs = ", ".join(
        f"{a.function.value}({a.column}) -> {a.output_name}" for a in spec.aggregations
    )
    return (
        f"{spec.description or 'Rollup'}.\n\n"
        f"- source: `{spec.source}`\n- alignment: {align} in {spec.reference_time_zone}\n"
        f"- first partition: {spec.start:%Y-%m-%d %H:%M} local\n"
        f"- watermark lag: {format_duration(spec.watermark_lag)}; open bucket refreshed: "
        f"{'yes' if spec.refresh_open_bucket else 'no'}\n- aggregations: {aggs}"
    )


def _materializations(
    spec: RollupSpec, pdef: dg.TimeWindowPartitionsDefinition, outcome: RunOutcome, key: dg.AssetKey
):
    meta = {
        "generation": outcome.generation if outcome.generation is not None else 0,
        "windows": len(outcome.buckets),
        "rows": outcome.rows,
        "trigger": outcome.job.trigger.value,
        "job_id": outcome.job.job_id,
        "source_versions": dg.MetadataValue.json(outcome.source_versions),
        "duration_ms": outcome.duration_ms,
        "entities": "all"
        if outcome.job.entities is None
        else ", ".join(sorted(outcome.job.entities)),
        "table_version": outcome.version if outcome.version is not None else -1,
    }
    for w in outcome.buckets:
        yield dg.AssetMaterialization(
            asset_key=key,
            partition=pdef.get_partition_key_for_timestamp(w.start.timestamp()),
            metadata=meta,
        )


def build_rollup_asset(spec: RollupSpec, catalog: Catalog) -> dg.AssetsDefinition:
    """The rollup's asset. `backfill_policy` and `allow_nonexistent_upstream_partitions` are beta
    parameters used on purpose; their warnings would otherwise print on every load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _rollup_asset(spec, catalog)


def _rollup_asset(spec: RollupSpec, catalog: Catalog) -> dg.AssetsDefinition:
    pdef = partitions_def_for(spec)

    @dg.asset(
        name=spec.name,
        partitions_def=pdef,
        deps=[
            dg.AssetDep(
                spec.source,
                partition_mapping=dg.TimeWindowPartitionMapping(
                    allow_nonexistent_upstream_partitions=True
                ),
            )
        ],
        backfill_policy=dg.BackfillPolicy.single_run(),
        output_required=False,
        pool=pool_name(spec),
        group_name=group_name(catalog, spec.name),
        description=describe(spec, catalog),
        kinds={"spark", "delta"},
        metadata={"rollups/source": spec.source, "rollups/zone": spec.reference_time_zone},
    )
    def _rollup(
        context: dg.AssetExecutionContext,
        config: RollupRunConfig,
        spark: SparkResource,
        warehouse: WarehouseResource,
    ):
        engine = Engine(catalog, warehouse.get())
        tags = context.run.tags
        tw = context.partition_time_window
        requested = [Window(tw.start.astimezone(UTC), tw.end.astimezone(UTC))]
        say = context.log.info
        now = clock.parse_instant(tags[TAG_NOW], TAG_NOW) if TAG_NOW in tags else clock.now()
        if tags.get(TAG_LANE) == "forward":
            outcome = run_forward(
                engine,
                spark.session,
                spec,
                requested=requested,
                now=now,
                run_id=context.run.run_id,
                log_progress=say,
            )
        else:
            trigger = Trigger(tags.get(TAG_TRIGGER, Trigger.MANUAL.value))
            entities = frozenset(config.entities) if config.entities else None
            job = start_job(
                engine,
                spec,
                job_id=tags.get(TAG_JOB),
                requested=requested,
                entities=entities,
                trigger=trigger,
            )
            if job is None:
                say(f"job {tags.get(TAG_JOB)} already finished (coalesced or ended); nothing to do")
                return
            outcome = run_recompute(
                engine, spark.session, spec, job, run_id=context.run.run_id, log_progress=say
            )
        if outcome.note:
            say(outcome.note)
        yield from _materializations(spec, pdef, outcome, context.asset_key)
        if outcome.buckets and config.propagate_in_run:
            chain = Chain(
                engine, spark.session, context.instance, context.run.run_id, now, log_progress=say
            )
            for above, result in chain.run(spec, outcome):
                yield from _materializations(
                    above, partitions_def_for(above), result, dg.AssetKey(above.name)
                )

    return _rollup


def build_rollup_check(spec: RollupSpec, catalog: Catalog) -> dg.AssetChecksDefinition:
    pdef = partitions_def_for(spec)

    @dg.asset_check(
        asset=spec.name,
        name=CHECK_NAME,
        partitions_def=pdef,
        description="Every stored bucket of the selected partitions equals a fresh "
        "aggregation of the "
        "source (reports the differing buckets and entities).",
    )
    def _check(
        context: dg.AssetCheckExecutionContext, spark: SparkResource, warehouse: WarehouseResource
    ) -> dg.AssetCheckResult:
        engine = Engine(catalog, warehouse.get())
        tw = context.partition_time_window
        diff = compare_with_source(
            engine, spark.session, spec, [Window(tw.start.astimezone(UTC), tw.end.astimezone(UTC))]
        )
        return dg.AssetCheckResult(
            passed=diff.differing == 0,
            metadata={
                "buckets_checked": diff.buckets,
                "rows_checked": diff.rows,
                "differing_rows": diff.differing,
                "differing_windows": dg.MetadataValue.json(diff.examples),
            },
        )

    return _check


def build_rollup_job(spec: RollupSpec):
    return dg.define_asset_job(
        name=job_name(spec),
        selection=dg.AssetSelection.assets(spec.name).without_checks(),
        description=f"Materialize partitions of {spec.name} (the sensors launch it; so can you).",
        tags={TAG_ROLLUP: spec.name},
    )


def check_job_name(spec: RollupSpec) -> str:
    return f"{spec.name}_check_job"


def build_check_job(spec: RollupSpec):
    """Runs `matches_source` on the selected partitions (one partition per run keeps the result
    attributed to that partition in the UI)."""
    return dg.define_asset_job(
        name=check_job_name(spec),
        selection=dg.AssetSelection.checks_for_assets(spec.name),
        description=f"Verify partitions of {spec.name} against a fresh aggregation of its source.",
        tags={TAG_ROLLUP: spec.name},
    )


def build_raw_spec(name: str, catalog: Catalog) -> dg.AssetSpec:
    spec = catalog.archive(name)
    firsts = catalog.first_levels(name)
    return dg.AssetSpec(
        name,
        partitions_def=partitions_def_for(firsts[0]) if firsts else None,
        group_name=group_name(catalog, name),
        description=describe(spec, catalog),
        kinds={"delta"},
        metadata={"rollups/kind": spec.kind.value},
    )
