"""An asset the project had before it added rollups."""

import dagster as dg


@dg.asset(group_name="billing")
def tariffs() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"tariffs": 3})
