"""Kept so the import path `rollup_assets.engine` keeps working: the code lives in
`rollup_assets.services.engine`."""

from rollup_assets.services.engine import Engine, RunOutcome

__all__ = ["Engine", "RunOutcome"]
