"""Specs -> the Dagster assets: one partitioned asset per rollup, one external asset per source.

The asset body only routes: the run's intent (its tags, written by the sensors) says which lane
(forward or recompute) and which ledger job it executes; a run launched from the UI or CLI without
one is a Manual recompute of the selected partitions. The asset reports a materialization exactly
for the partitions it rewrote, with the generation, rows, trigger, source versions and duration,
and so does every level above that the run brought up to date itself.
"""

import warnings
from collections.abc import Iterator
from datetime import UTC

import dagster as dg
from dagster._core.definitions.metadata import RawMetadataValue
from pydantic import Field

from rollup_assets.model.bucket_rules import freshness_windows
from rollup_assets.model.describe import describe, group_name
from rollup_assets.model.jobs import Lane
from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.instance import pool_name
from rollup_assets.orchestration.partitions import keys_of_bucket, partitions_def_for
from rollup_assets.orchestration.progress import run_progress
from rollup_assets.orchestration.resources import ClockResource, SparkResource, WarehouseResource
from rollup_assets.orchestration.runs import DagsterRunGate
from rollup_assets.orchestration.tags import RunIntent
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope
from rollup_assets.resources.memory import collecting_less
from rollup_assets.services.chain import Chain
from rollup_assets.services.forward import run_forward
from rollup_assets.services.recompute import run_recompute, start_job
from rollup_assets.services.run_outcome import RunOutcome


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


def _metadata(outcome: RunOutcome, spark: SparkResource) -> dict[str, RawMetadataValue]:
    """The run's figures (the `BRIEF` ones on each partition it rewrote, every one on its last):
    among them whether the run had started Spark by then (small corrections are applied without
    it) and how long that took."""
    meta: dict[str, RawMetadataValue] = {
        "spark": spark.describe_use(),
        "spark_ready_ms": spark.ready_ms(),
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
    job = outcome.job
    if job.technique is not None:
        meta |= {
            "technique": job.technique,
            "source_rows": job.source_rows or 0,
            "cells_changed": job.cells_changed or 0,
            "cells_skipped": job.cells_skipped or 0,
            "cells_applied": job.cells_applied or 0,
            "change_rows": job.change_rows or 0,
            "plan": job.plan or "",
        }
    return meta


def _partition_keys(spec: RollupSpec, outcome: RunOutcome) -> list[str]:
    """The keys of every partition of the buckets the run rewrote (several per bucket when a
    bucket is several partitions)."""
    pdef = partitions_def_for(spec)
    return [key for w in outcome.buckets for key in keys_of_bucket(spec, pdef, w)]


# What each partition's materialization of a run says: which job, for which trigger, wrote it
# in which generation and table version from which source versions. A correction rewrites
# thousands of scattered partitions, and Dagster serializes every entry of every event, so the
# run's own figures (its rows, what Spark it used, its plan) are said once, on the last.
BRIEF = (
    "generation",
    "trigger",
    "job_id",
    "source_versions",
    "table_version",
)


def _brief(meta: dict[str, RawMetadataValue]) -> dict[str, RawMetadataValue]:
    """The `BRIEF` entries of a run's figures: what each partition's materialization says."""
    return {k: meta[k] for k in BRIEF}


def _materializations(
    spec: RollupSpec,
    outcome: RunOutcome,
    spark: SparkResource,
    scope: Scope,
    keys: list[str] | None = None,
) -> Iterator[dg.AssetMaterialization]:
    """One materialization per partition of the buckets the run rewrote (`keys`, when known),
    each with the `BRIEF` entries; the last (the asset's latest materialization) with all the
    run's figures. The job's figures are also in the ledger (`rollups jobs`) and the run's
    log."""
    meta = _metadata(outcome, spark)
    brief = _brief(meta)
    keys = _partition_keys(spec, outcome) if keys is None else keys
    for i, key in enumerate(keys):
        yield dg.AssetMaterialization(
            asset_key=scope.key(spec.name),
            partition=key,
            metadata=meta if i == len(keys) - 1 else brief,
        )


def _log_all(
    context: dg.AssetExecutionContext, materializations: Iterator[dg.AssetMaterialization]
) -> None:
    """Hand a run's scattered materializations to Dagster at once. Dagster records a logged
    event as it records a yielded one, but wraps each value a step yields in its interrupt
    boundary (four signal handler swaps): for the thousands of partitions a correction
    rewrites, that was a tenth of its run."""
    for m in materializations:
        context.log_event(m)


def _own_materializations(
    context: dg.AssetExecutionContext,
    spec: RollupSpec,
    outcome: RunOutcome,
    spark: SparkResource,
    scope: Scope,
) -> Iterator[dg.MaterializeResult]:
    """The run's own asset: when it rewrote exactly the partitions it was asked for (a backfill
    range, typically), one result for the range, which Dagster records per partition through its
    batched event path (one transaction per batch instead of two per partition), each partition
    with the `BRIEF` entries and the last (the asset's latest) with every figure, as
    `_materializations` does; otherwise one materialization per bucket it rewrote, logged."""
    if not outcome.buckets:
        return
    keys = _partition_keys(spec, outcome)  # a key costs Dagster a walk of its cron schedule
    asked = context.partition_keys
    if set(keys) == set(asked):
        meta = _metadata(outcome, spark)
        brief = _brief(meta)
        rest = {k: v for k, v in meta.items() if k not in brief}
        context.add_asset_metadata(rest, partition_key=asked[-1])
        yield dg.MaterializeResult(metadata=brief)
    else:
        _log_all(context, _materializations(spec, outcome, spark, scope, keys))


def _freshness(spec: RollupSpec) -> dg.FreshnessPolicy:
    """Dagster's own check that the rollup keeps up with its buckets (see `freshness_windows`)."""
    warn, fail = freshness_windows(spec)
    return dg.FreshnessPolicy.time_window(fail_window=fail, warn_window=warn)


def build_rollup_asset(
    spec: RollupSpec, catalog: Catalog, scope: Scope = NO_TENANT
) -> dg.AssetsDefinition:
    """The rollup's asset, over `scope`'s warehouse only (its tenant's root and engine).
    `backfill_policy` and `allow_nonexistent_upstream_partitions` are beta parameters used on
    purpose; their warnings would otherwise print on every load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _rollup_asset(spec, catalog, scope)


def _rollup_asset(spec: RollupSpec, catalog: Catalog, scope: Scope) -> dg.AssetsDefinition:
    def run(
        context: dg.AssetExecutionContext, config: RollupRunConfig
    ) -> Iterator[dg.MaterializeResult]:
        warehouse: WarehouseResource = getattr(context.resources, scope.warehouse_key)
        spark: SparkResource = context.resources.spark
        clock: ClockResource = context.resources.clock
        engine = warehouse.engine(catalog)
        intent = RunIntent.from_tags(context.run.tags, spec.name)
        tw = context.partition_time_window
        requested = [Window(tw.start.astimezone(UTC), tw.end.astimezone(UTC))]
        say = context.log.info
        run_id = context.run.run_id
        progress = run_progress()
        now = intent.now or clock.current()
        if intent.lane is Lane.FORWARD:
            outcome = run_forward(
                engine,
                spark.session,
                spec,
                requested=requested,
                now=now,
                run_id=run_id,
                log_progress=say,
                progress=progress,
            )
        else:
            job = start_job(
                engine,
                spec,
                job_id=intent.job_id,
                requested=requested,
                entities=frozenset(config.entities) if config.entities else None,
                trigger=intent.trigger,
            )
            if job is None:
                say(f"job {intent.job_id} already finished (coalesced or ended); nothing to do")
                return
            outcome = run_recompute(
                engine,
                spark.session,
                spec,
                job,
                run_id=run_id,
                log_progress=say,
                progress=progress,
            )
        if outcome.note:
            say(outcome.note)
        yield from _own_materializations(context, spec, outcome, spark, scope)
        given_up = [outcome.job] if outcome.job.gave_up else []
        if outcome.buckets and config.propagate_in_run:
            gate = DagsterRunGate(context.instance, run_id, scope)
            chain = Chain(
                engine, spark.session, gate, run_id, now, log_progress=say, progress=progress
            )
            for above, result in chain.run(spec, outcome):
                _log_all(context, _materializations(above, result, spark, scope))
                given_up += [result.job] if result.job.gave_up else []
        say(f"Spark: {spark.describe_use()}")
        if given_up:
            # A job can end Failed for good without raising (the cells it must read stayed
            # unknowable after its last attempt): its run fails too, so the UI and alerts see it.
            raise dg.Failure(
                description="; ".join(
                    f"{j.rollup}: job {j.job_id} ended Failed for good: {j.error}" for j in given_up
                ),
                metadata={"jobs": ", ".join(j.job_id for j in given_up)},
            )

    @dg.asset(
        key=scope.key(spec.name),
        partitions_def=partitions_def_for(spec),
        deps=[
            dg.AssetDep(
                scope.key(spec.source),
                partition_mapping=dg.TimeWindowPartitionMapping(
                    allow_nonexistent_upstream_partitions=True
                ),
            )
        ],
        backfill_policy=dg.BackfillPolicy.single_run(),
        output_required=False,
        pool=pool_name(spec, scope),
        group_name=scope.name(group_name(catalog, spec.name)),
        description=describe(spec, catalog),
        kinds={"spark", "delta"},
        freshness_policy=_freshness(spec),
        metadata={
            "rollups/source": spec.source,
            "rollups/zone": spec.reference_time_zone,
            **scope.tags(),
        },
        # The warehouse by its scope's key: a tenant's asset is handed its own root only.
        required_resource_keys={scope.warehouse_key, "spark", "clock"},
    )
    def _rollup(
        context: dg.AssetExecutionContext, config: RollupRunConfig
    ) -> Iterator[dg.MaterializeResult]:
        with collecting_less():
            yield from run(context, config)

    return _rollup


def build_raw_spec(name: str, catalog: Catalog, scope: Scope = NO_TENANT) -> dg.AssetSpec:
    spec = catalog.archive(name)
    firsts = catalog.first_levels(name)
    return dg.AssetSpec(
        scope.key(name),
        partitions_def=partitions_def_for(firsts[0]) if firsts else None,
        group_name=scope.name(group_name(catalog, name)),
        description=describe(spec, catalog),
        kinds={"delta"},
        metadata={"rollups/kind": spec.kind.value, **scope.tags()},
    )
