"""An asset the project had before it added rollups."""

import dagster as dg

from resources import TariffBook


@dg.asset(group_name="billing")
def tariffs(tariff_book: TariffBook) -> dg.MaterializeResult:
    return dg.MaterializeResult(
        metadata={"tariffs": len(tariff_book.rates_eur_per_kwh), "edition": tariff_book.edition()}
    )
