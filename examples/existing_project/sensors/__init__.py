"""The project's own sensors (a top-level `sensors` package, as many Dagster projects have)."""

import dagster as dg

from resources import TariffBook

refresh_tariffs = dg.define_asset_job("refresh_tariffs", selection=["tariffs"])


@dg.sensor(job=refresh_tariffs, minimum_interval_seconds=300)
def tariff_book_changed(
    context: dg.SensorEvaluationContext, tariff_book: TariffBook
) -> dg.SensorResult | dg.SkipReason:
    """Prices the tariffs again when the tariff book's rates change (one run per edition)."""
    edition = tariff_book.edition()
    if context.cursor == edition:
        return dg.SkipReason(f"tariff book edition {edition} is already priced")
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=edition)], cursor=edition)
