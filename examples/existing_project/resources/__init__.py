"""The project's own resources (a top-level `resources` package, as many Dagster projects have)."""

import hashlib
import json

import dagster as dg
from pydantic import Field


class TariffBook(dg.ConfigurableResource):
    """The energy tariffs the billing assets price readings with."""

    rates_eur_per_kwh: dict[str, float] = Field(
        default_factory=lambda: {"day": 0.31, "night": 0.22, "weekend": 0.25},
        description="Price per kWh (EUR) of each tariff, by tariff name",
    )

    def edition(self) -> str:
        """A short digest of the rates: it changes whenever a rate does."""
        text = json.dumps(self.rates_eur_per_kwh, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]
