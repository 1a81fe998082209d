"""The per-rollup jobs the sensors launch (one partitions definition each)."""

import dagster as dg

from rollup_assets.model.specs import RollupSpec
from rollup_assets.orchestration.tags import TAG_ROLLUP


def job_name(spec: RollupSpec) -> str:
    return f"{spec.name}_job"


def build_rollup_job(spec: RollupSpec):
    return dg.define_asset_job(
        name=job_name(spec),
        selection=dg.AssetSelection.assets(spec.name).without_checks(),
        description=f"Materialize partitions of {spec.name} (the sensors launch it; so can you).",
        tags={TAG_ROLLUP: spec.name},
    )
