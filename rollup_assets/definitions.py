"""The code location: one Definitions assembled explicitly from the declared specs.

This module is the edge where the code location reads its configuration: `Settings.from_env()`
once, when Dagster loads it; everything below receives what it needs.
"""

from rollup_assets import metrics
from rollup_assets.assembly import build_definitions
from rollup_assets.faults import arm
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.settings import Settings

_settings = Settings.from_env()
arm(_settings.fault)
metrics.configure(_settings.metrics)
catalog = load_catalog(_settings.specs)
defs = build_definitions(catalog, settings=_settings)
