"""The project's definitions: everything under `defs/`, its own assets and the rollups alike,
with the project's own resources and sensors (its top-level `resources` and `sensors`
packages, which installing rollups leaves alone)."""

from pathlib import Path

import dagster as dg

from resources import TariffBook
from sensors import refresh_tariffs, tariff_book_changed


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions.merge(
        dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
        dg.Definitions(
            jobs=[refresh_tariffs],
            sensors=[tariff_book_changed],
            resources={"tariff_book": TariffBook()},
        ),
    )
