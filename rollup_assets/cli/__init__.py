"""The `rollups` command line (console script `rollups = rollup_assets.cli:run`)."""

from rollup_assets.cli import columns, dev, ingest, operate, query, runs, specs, transfer  # noqa: F401  (each registers its commands)
from rollup_assets.cli.app import main, run

__all__ = ["main", "run"]
