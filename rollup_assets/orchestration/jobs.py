"""The per-rollup jobs the sensors launch (one partitions definition each)."""

import dagster as dg

from rollup_assets.model.specs import RollupSpec
from rollup_assets.orchestration.tags import TAG_ROLLUP
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope


def job_name(spec: RollupSpec, scope: Scope = NO_TENANT) -> str:
    return scope.name(f"{spec.name}_job")


def build_rollup_job(spec: RollupSpec, scope: Scope = NO_TENANT):
    return dg.define_asset_job(
        name=job_name(spec, scope),
        selection=dg.AssetSelection.assets(scope.key(spec.name)).without_checks(),
        description=scope.describe(
            f"Materialize partitions of {spec.name} (the sensors launch it; so can you)."
        ),
        tags={TAG_ROLLUP: spec.name, **scope.tags()},
    )
