"""The `matches_source` asset check of every rollup, and the job that runs it."""

from datetime import UTC

import dagster as dg

from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.partitions import partitions_def_for
from rollup_assets.orchestration.resources import SparkResource, WarehouseResource
from rollup_assets.orchestration.tags import TAG_ROLLUP
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope
from rollup_assets.services.check import compare_with_source

CHECK_NAME = "matches_source"


def build_rollup_check(
    spec: RollupSpec, catalog: Catalog, scope: Scope = NO_TENANT
) -> dg.AssetChecksDefinition:
    """The check reads only `scope`'s warehouse (its tenant's root)."""
    pdef = partitions_def_for(spec)

    @dg.asset_check(
        asset=scope.key(spec.name),
        name=CHECK_NAME,
        partitions_def=pdef,
        description="Every stored bucket of the selected partitions equals a fresh "
        "aggregation of the "
        "source (reports the differing buckets and entities).",
        required_resource_keys={scope.warehouse_key, "spark"},
    )
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        warehouse: WarehouseResource = getattr(context.resources, scope.warehouse_key)
        spark: SparkResource = context.resources.spark
        engine = warehouse.engine(catalog)
        tw = context.partition_time_window
        diff = compare_with_source(
            engine, spark.session, spec, [Window(tw.start.astimezone(UTC), tw.end.astimezone(UTC))]
        )
        return dg.AssetCheckResult(
            passed=diff.differing == 0,
            metadata={
                "buckets_checked": diff.buckets,
                "buckets_removed_by_retention": diff.retained,
                "rows_checked": diff.rows,
                "differing_rows": diff.differing,
                "differing_windows": dg.MetadataValue.json(diff.examples),
            },
        )

    return _check


def check_job_name(spec: RollupSpec, scope: Scope = NO_TENANT) -> str:
    return scope.name(f"{spec.name}_check_job")


def build_check_job(spec: RollupSpec, scope: Scope = NO_TENANT):
    """Runs `matches_source` on the selected partitions (one partition per run keeps the result
    attributed to that partition in the UI)."""
    return dg.define_asset_job(
        name=check_job_name(spec, scope),
        selection=dg.AssetSelection.checks_for_assets(scope.key(spec.name)),
        description=scope.describe(
            f"Verify partitions of {spec.name} against a fresh aggregation of its source."
        ),
        tags={TAG_ROLLUP: spec.name, **scope.tags()},
    )
