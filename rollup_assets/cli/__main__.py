"""`python -m rollup_assets.cli`."""

from rollup_assets.cli.app import run

run()
