"""`RollupChain`: rollups declared in another Dagster project's `defs/` folder.

A project that installs this package adds a `defs.yaml` whose attributes declare archives and
rollups exactly as `rollups.yaml` does, and gets the same assets, checks, sensors and jobs as
this code location:

    type: rollup_assets.component.RollupChain
    attributes:
      warehouse: /data/warehouse          # optional; default $ROLLUPS_WAREHOUSE
      raw_archives:
        meter_raw:
          columns: {energy_kwh: {type: double, required: true}}
      rollups:
        meter_hourly: {source: meter_raw, alignment: FixedSize, size: 1h, start: 2025-01-01,
                       aggregations: [{column: energy_kwh, function: Sum}]}

The declaration is validated as a spec file is (a `SpecError` names the archive and the rule)
when Dagster loads the component; the environment is read then, once, as `definitions.py` does.
"""

from typing import Any

import dagster as dg
from pydantic import Field

from rollup_assets import metrics
from rollup_assets.assembly import build_definitions
from rollup_assets.faults import arm
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.specs import Catalog
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.settings import Settings


class RollupChain(dg.Component, dg.Model, dg.Resolvable):
    """Time-series rollups that stay correct: raw and time-range archives and the rollups over
    them, each rollup a time-partitioned asset kept equal to its source by sensors."""

    raw_archives: dict[str, Any] = Field(
        default_factory=dict, description="Raw archives, as under `raw_archives` in rollups.yaml"
    )
    time_range_archives: dict[str, Any] = Field(
        default_factory=dict, description="Time-range archives, as in rollups.yaml"
    )
    rollups: dict[str, Any] = Field(
        default_factory=dict, description="Rollups, as under `rollups` in rollups.yaml"
    )
    tenants: dict[str, Any] = Field(
        default_factory=dict, description="Tenants, as under `tenants` in rollups.yaml"
    )
    warehouse: str | None = Field(
        default=None,
        description="The warehouse root (a path or URI); default $ROLLUPS_WAREHOUSE",
    )

    def catalog(self, origin: str = "<component>") -> Catalog:
        """The declared archives, validated as a spec file is."""
        sections = {
            "raw_archives": self.raw_archives,
            "time_range_archives": self.time_range_archives,
            "rollups": self.rollups,
            "tenants": self.tenants,
        }
        return parse_catalog({k: v for k, v in sections.items() if v}, origin=origin)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        settings = Settings.from_env()
        arm(settings.fault)
        metrics.configure(settings.metrics)
        warehouse = WarehouseResource.from_settings(settings, self.warehouse)
        catalog = self.catalog(origin=str(context.path))
        return build_definitions(catalog, warehouse, settings=settings)
