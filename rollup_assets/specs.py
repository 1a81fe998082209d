"""Kept so the import path `rollup_assets.specs` keeps working: the code lives in
`rollup_assets.model.spec_loader`."""

from rollup_assets.model.spec_loader import load_catalog, parse_catalog

__all__ = ["load_catalog", "parse_catalog"]
