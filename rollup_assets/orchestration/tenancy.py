"""The names one tenant's Dagster definitions use, so that tenants never share one.

Without tenants (`Scope()`) every name is the plain one it always was: asset `energy_hourly`,
job `energy_hourly_job`, sensor `retroactive_write_sensor`, pool `rollup_energy_hourly`,
resources `warehouse` and `raw_archives`. A tenant's scope prefixes them: asset key
`acme/energy_hourly`, job `acme__energy_hourly_job`, sensor `acme__retroactive_write_sensor`,
pool `rollup_acme__energy_hourly`, resources `warehouse__acme` (its own warehouse root) and
`raw_archives__acme`, and its runs carry the tag `rollups/tenant=acme`. Archive and tenant names
never contain `__`, so the prefixed names cannot collide.
"""

from dataclasses import dataclass

import dagster as dg

from rollup_assets.model.specs import Catalog
from rollup_assets.orchestration.tags import TAG_TENANT

WAREHOUSE_KEY = "warehouse"
RAW_ARCHIVES_KEY = "raw_archives"


@dataclass(frozen=True)
class Scope:
    """One tenant's definitions (`tenant` None: the code location has no tenants)."""

    tenant: str | None = None

    def name(self, base: str) -> str:
        """A job, sensor, schedule, op or group name of this scope."""
        return f"{self.tenant}__{base}" if self.tenant else base

    def key(self, archive: str) -> dg.AssetKey:
        """The asset key of an archive of this scope."""
        return dg.AssetKey([self.tenant, archive]) if self.tenant else dg.AssetKey(archive)

    @property
    def warehouse_key(self) -> str:
        """The resource key of this scope's warehouse (and so of its engine)."""
        return f"{WAREHOUSE_KEY}__{self.tenant}" if self.tenant else WAREHOUSE_KEY

    @property
    def raw_archives_key(self) -> str:
        """The resource key of this scope's `RawArchives` (writing readings from an asset)."""
        return f"{RAW_ARCHIVES_KEY}__{self.tenant}" if self.tenant else RAW_ARCHIVES_KEY

    def tags(self) -> dict[str, str]:
        """Tags every run of this scope carries."""
        return {TAG_TENANT: self.tenant} if self.tenant else {}

    def describe(self, text: str) -> str:
        """A job's or sensor's description, marked with its tenant for the UI."""
        return f"[{self.tenant}] {text}" if self.tenant else text


NO_TENANT = Scope()


def scopes_of(catalog: Catalog) -> list[Scope]:
    """One scope per declared tenant, or the one plain scope when the spec declares none."""
    return [Scope(name) for name in catalog.tenants] or [Scope()]
