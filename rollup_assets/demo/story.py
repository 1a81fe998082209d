"""`rollups demo`: the whole product in one run, on the embedded defaults.

A year of 15-minute readings for a few dozen meters is ingested and rolled up through the chain
(hourly, daily, ISO-weekly, monthly, yearly in Europe/Vienna). Then a realistic correction lands:
one meter's readings for a day three months ago are replaced, and a few late readings arrive for
last week. The sensors detect exactly which windows changed, recompute them at every level with a
new generation while a reader keeps querying, and a pandas aggregation of the raw data checks
every level. Last, maintenance applies the raw archive's retention: the old raw days go, the
rollups keep their values. Everything lands in ROLLUPS_WAREHOUSE and DAGSTER_HOME, so
`make dev` shows it.
"""

import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import click
import dagster as dg
import pyarrow as pa

from rollup_assets.model.specs import Catalog
from rollup_assets.services.engine import Engine
from rollup_assets.services.query import query_arrow

MARKER = ".rollups-demo"
SEED = 2024
CORRECTED_METER = "meter-0007"
LATE_METERS = ("meter-0003", "meter-0012", "meter-0021")
ONE_DAY = timedelta(days=1)
LEVELS = ("energy_hourly", "energy_daily", "energy_weekly", "energy_monthly", "energy_yearly")
CORRECTION_FACTOR = 1.35  # the meter under-reported that day; the re-read values are 35 % higher


@dataclass
class Story:
    catalog: Catalog
    engine: Engine
    defs: dg.Definitions
    instance: dg.DagsterInstance
    out: Path
    meters: int
    days: int
    log_level: str | None = None  # console log level of the runs it executes
    started: float = field(default_factory=time.monotonic)

    def say(self, text: str = "", dim: bool = False) -> None:
        elapsed = time.monotonic() - self.started
        stamp = f"[{int(elapsed // 60):02d}:{int(elapsed % 60):02d}]"
        click.echo(click.style(f"{stamp} {text}", dim=dim) if text else "")

    def step(self, title: str, why: str) -> None:
        click.echo()
        self.say(click.style(title, bold=True))
        click.echo(click.style(f"        {why}", dim=True))

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.catalog.rollup("energy_daily").reference_time_zone)

    def query(self, archive: str, **kw) -> pa.Table:
        return query_arrow(self.engine, archive, **kw)
