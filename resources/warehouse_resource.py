"""The warehouse as a Dagster resource (root URI + delta-rs storage options)."""

import dagster as dg
from pydantic import Field

from resources.warehouse import Warehouse, warehouse_root_from_env


class WarehouseResource(dg.ConfigurableResource):
    """Where the Delta tables live. Defaults to $ROLLUPS_WAREHOUSE, else ./warehouse."""

    root: str = Field(
        default_factory=warehouse_root_from_env,
        description="Local directory or object-store URI (s3://, gs://, abfss://, file://).",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="delta-rs storage options (credentials, endpoint, region) for an object store.",
    )

    def get(self) -> Warehouse:
        return Warehouse(self.root, dict(self.storage_options))
