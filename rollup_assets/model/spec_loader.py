"""Reading a spec: its YAML (`spec_yaml`) -> typed specs (`archive_declarations`) -> a validated
`Catalog` (`spec_rules`).

Every rule failure raises `SpecError` naming the archive and the rule, so a bad spec never
reaches the warehouse. Specs are data: nothing in them is ever executed.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollup_assets.model.archive_declarations import (
    parse_raw_archive,
    parse_rollup,
    parse_time_range_archive,
)
from rollup_assets.model.errors import SpecError
from rollup_assets.model.spec_rules import validate_catalog
from rollup_assets.model.spec_yaml import KEYS_ARE_TEXT, key_subject, read_spec_document
from rollup_assets.model.specs import Catalog, Tenant
from rollup_assets.settings import DEFAULT_SPECS


def load_catalog(path: str | os.PathLike[str] = DEFAULT_SPECS) -> Catalog:
    """Load and validate the spec file at `path`: the edges pass the configured one
    (`Settings.specs`, $ROLLUPS_SPECS); the default is the bundled energy example."""
    p = Path(path)
    doc = read_spec_document(p)
    if isinstance(doc, Mapping) and str(doc.get("type", "")).endswith(COMPONENT_TYPE):
        # A Dagster project's `defs.yaml` declaring the rollups as a component: its attributes
        # are the spec (the warehouse root among them belongs to the component, not the spec).
        doc = {k: v for k, v in (doc.get("attributes") or {}).items() if k != "warehouse"}
    return parse_catalog(doc or {}, origin=str(p))


COMPONENT_TYPE = ".RollupChain"


def _check_text_keys(
    value: Any, path: tuple[str, ...], origin: str, seen: set[int] | None = None
) -> None:
    """Refuse a mapping key that is not text anywhere in a spec given as Python data (a spec read
    from YAML had its keys checked by the loader, which can still name the source text). Each
    mapping or list is checked once, however often the data repeats it."""
    seen = set() if seen is None else seen
    if not isinstance(value, Mapping | list | tuple) or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                subject, what = key_subject(path, origin)
                raise SpecError(
                    subject, KEYS_ARE_TEXT, f"{what} {key!r} is a {type(key).__name__}, not text"
                )
            _check_text_keys(item, (*path, key), origin, seen)
    else:
        for item in value:
            _check_text_keys(item, path, origin, seen)


def parse_catalog(doc: Mapping[str, Any], origin: str = "<memory>") -> Catalog:
    """Validate a spec given as data (`doc`, as its YAML reads); `origin` names it in errors."""
    if not isinstance(doc, Mapping):
        raise SpecError(origin, "top-level mapping", "the spec file must be a mapping")
    _check_text_keys(doc, (), origin)
    unknown = {k for k in doc if not str(k).startswith("x-")} - {
        "raw_archives",
        "time_range_archives",
        "rollups",
        "tenants",
    }
    if unknown:
        raise SpecError(
            origin,
            "known top-level keys",
            f"unknown top-level keys {sorted(unknown)}; expected raw_archives, "
            "time_range_archives, rollups, tenants",
        )
    raw = {n: parse_raw_archive(n, b) for n, b in _section(doc, "raw_archives", origin).items()}
    tr = {
        n: parse_time_range_archive(n, b)
        for n, b in _section(doc, "time_range_archives", origin).items()
    }
    rollups = {n: parse_rollup(n, b) for n, b in _section(doc, "rollups", origin).items()}
    tenants = {n: _parse_tenant(n, b) for n, b in _section(doc, "tenants", origin).items()}
    return validate_catalog(raw, tr, rollups, origin, tenants)


def _section(doc: Mapping[str, Any], key: str, origin: str) -> dict[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, Mapping):
        raise SpecError(origin, f"{key} is a mapping", f"'{key}' must map archive names to specs")
    return {str(k): v for k, v in value.items()}


def _parse_tenant(name: str, body: Any) -> Tenant:
    """A tenant: `{}` (or nothing) for the default root, or `{warehouse: <root>}`."""
    subject = f"tenants.{name}"
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise SpecError(subject, "tenant body is a mapping", "a tenant must be {} or a mapping")
    unknown = set(body) - {"warehouse"}
    if unknown:
        raise SpecError(
            subject, "known keys", f"unknown keys {sorted(unknown)}; allowed: ['warehouse']"
        )
    root = body.get("warehouse")
    if root is not None and (not isinstance(root, str) or not root.strip()):
        raise SpecError(
            subject, "tenant warehouse", "'warehouse' must be a directory or an object-store URI"
        )
    return Tenant(name=name, warehouse=root.strip() if root is not None else None)
