"""The project's own meter readings, collected by an asset and written into the rollups' raw
archive `meter_raw` (declared in `meters/defs.yaml`) through the `raw_archives` resource."""

from datetime import date

import dagster as dg
import numpy as np
import pandas as pd
from pydantic import Field

from rollup_assets.api import RawArchives

METERS = ("meter-0001", "meter-0002")


class ReadingsConfig(dg.Config):
    day: str = Field(description="The UTC day (YYYY-MM-DD) whose readings to collect.")


def collect_readings(day: date) -> pd.DataFrame:
    """One UTC day of 15-minute readings per meter, as the project's meter export gives them
    (a fixed load curve here, so the example is reproducible)."""
    ts = pd.date_range(pd.Timestamp(day, tz="UTC"), periods=96, freq="15min")
    curve = 0.4 + 0.3 * np.sin(np.arange(96) * 2 * np.pi / 96) ** 2
    frames = [
        pd.DataFrame(
            {
                "entity_id": meter,
                "ts": ts,
                "energy_kwh": (curve * (1 + i)).round(4),
                "power_kw": (curve * (1 + i) * 4).round(4),
                "voltage_v": 230.0 - i,
            }
        )
        for i, meter in enumerate(METERS)
    ]
    return pd.concat(frames, ignore_index=True)


@dg.asset(group_name="meters", kinds={"pandas"})
def meter_readings(
    context: dg.AssetExecutionContext,
    config: ReadingsConfig,
    raw_archives: dg.ResourceParam[RawArchives],
) -> dg.MaterializeResult:
    """A day of the meters' readings, upserted into `meter_raw` in one commit (a bad reading
    fails the run and writes nothing); the rollups over it are corrected by their sensors."""
    readings = collect_readings(date.fromisoformat(config.day))
    written = raw_archives.ingest(context, archive="meter_raw", data=readings)
    return dg.MaterializeResult(
        metadata={
            "rows": written.rows,
            "inserted": written.inserted,
            "updated": written.updated,
            "meter_raw_version": written.version,
        }
    )
