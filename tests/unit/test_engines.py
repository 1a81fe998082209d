"""One engine per process and warehouse configuration: Dagster makes the warehouse resource
anew for every sensor tick and run, and the engine's caches are what spare a tick from reading
every control table whole."""

from pathlib import Path

import dagster as dg
import pydantic
import pytest

from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.settings import DEFAULT_SPECS

CATALOG = load_catalog(DEFAULT_SPECS)


def engine_of_a_fresh_resource(root: Path, **config) -> object:
    """The engine as a tick sees it: through a resource Dagster initializes for it."""
    with dg.build_resources({"warehouse": WarehouseResource(root=str(root), **config)}) as r:
        return r.warehouse.engine(CATALOG)


def test_every_tick_of_one_configuration_gets_the_same_engine(tmp_path: Path) -> None:
    first = engine_of_a_fresh_resource(tmp_path / "w")
    assert engine_of_a_fresh_resource(tmp_path / "w") is first
    assert engine_of_a_fresh_resource(tmp_path / "other") is not first
    assert engine_of_a_fresh_resource(tmp_path / "w", retry_attempts=2) is not first
    assert engine_of_a_fresh_resource(tmp_path / "w", generation_retention_hours=0) is not first
    another_catalog = load_catalog(DEFAULT_SPECS)
    assert WarehouseResource(root=str(tmp_path / "w")).engine(another_catalog) is not first


def test_a_negative_driver_bound_is_refused_where_it_is_given(tmp_path: Path) -> None:
    """0 sends every aggregation of buckets for every entity to Spark; below that means
    nothing, and is refused by the resource (naming the field) and by the engine."""
    with pytest.raises(pydantic.ValidationError, match="driver_source_rows"):
        WarehouseResource(root=str(tmp_path / "w"), driver_source_rows=-1)
    with pytest.raises(ValueError, match="not -5"):
        Engine(CATALOG, Warehouse(str(tmp_path / "w")), driver_source_rows=-5)
