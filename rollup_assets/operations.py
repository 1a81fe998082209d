"""Kept so the import path `rollup_assets.operations` keeps working: the code lives in
`rollup_assets.services.operations`."""

from rollup_assets.services.operations import Operations

__all__ = ["Operations"]
