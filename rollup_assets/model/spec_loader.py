"""Reading a spec file: YAML (safe, unique keys) -> typed specs -> a validated `Catalog`.

Every rule failure raises `SpecError` naming the archive and the rule, so a bad spec never
reaches the warehouse. Specs are data: nothing in them is ever executed.
"""

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from rollup_assets.model.durations import parse_duration
from rollup_assets.model.errors import SpecError
from rollup_assets.model.formulas import Formula, FormulaSyntaxError, parse_formula
from rollup_assets.model.spec_rules import validate_catalog
from rollup_assets.model.specs import (
    AggregateFunction,
    AggregationSpec,
    Alignment,
    Catalog,
    ColumnSpec,
    ColumnType,
    RawArchiveSpec,
    RollupSpec,
    Tenant,
    TimeRangeArchiveSpec,
)
from rollup_assets.model.windows import EPOCH
from rollup_assets.settings import Settings


def specs_path() -> Path:
    """The spec file: $ROLLUPS_SPECS, else the bundled energy example (`DEFAULT_SPECS`)."""
    return Settings.from_env().specs


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """Load and validate the spec file at `path` (default: `specs_path()`)."""
    p = Path(path) if path is not None else specs_path()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(p), "readable spec file", f"cannot read spec file: {exc}") from exc
    loader = _UniqueKeyLoader(text, origin=str(p))  # a SafeLoader: no arbitrary objects
    try:
        doc = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise SpecError(str(p), "valid YAML", f"not valid YAML: {_one_line(exc)}") from exc
    finally:
        loader.dispose()
    if isinstance(doc, Mapping) and str(doc.get("type", "")).endswith(COMPONENT_TYPE):
        # A Dagster project's `defs.yaml` declaring the rollups as a component: its attributes
        # are the spec (the warehouse root among them belongs to the component, not the spec).
        doc = {k: v for k, v in (doc.get("attributes") or {}).items() if k != "warehouse"}
    return parse_catalog(doc or {}, origin=str(p))


COMPONENT_TYPE = ".RollupChain"


def _one_line(exc: yaml.YAMLError) -> str:
    """A YAML error as one line (PyYAML's spans several, and the CLI shows the first only):
    the problem, where it is, and what the parser was doing."""
    if not isinstance(exc, yaml.MarkedYAMLError) or not exc.problem:
        return " ".join(str(exc).split())
    mark = exc.problem_mark or exc.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = f" ({exc.context})" if exc.context else ""
    return f"{exc.problem}{where}{context}"


ARCHIVE_SECTIONS = ("raw_archives", "time_range_archives", "rollups")
# What a spec may repeat through YAML aliases, counted as if each alias were written out: a list
# or mapping counts 1, a scalar 1 plus its length. The shipped spec repeats about 1,500 this way
# (its chain shares one zone and one list of aggregations); a "billion laughs" of nine nested
# aliases, 558 bytes of YAML, would be 2 GB once something turned it into text.
MAX_ALIAS_EXPANSION = 100_000
ALIAS_RULE = "alias expansion"
KEYS_ARE_TEXT = "keys are text"
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping (YAML requires unique keys;
    PyYAML would silently keep the last, dropping e.g. one of two rollups of the same name),
    and a key YAML does not read as text. Keys merged in with `<<:` may still be overridden.

    YAML 1.1 reads an unquoted `on`, `off`, `yes` or `no` as a boolean, `12` as a number, `null`
    or `~` as null, `2025-01-01` as a date; as a key that would become a column named 'True'.
    Such a key is refused with what was written and where, before anything is constructed.
    """

    def __init__(self, stream: str, origin: str = "<memory>") -> None:
        super().__init__(stream)
        self.origin = origin
        self._expanded: dict[int, int] = {}  # id(node) -> its size written out (see above)
        self._aliased = 0  # what the aliases so far repeat, in that measure
        self._open: set[str] = set()  # anchors of the nodes being composed

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        """Compose as PyYAML does, counting what each alias repeats: past
        `MAX_ALIAS_EXPANSION`, or for an alias inside the node it names, the spec is refused
        at that alias, before anything is constructed. PyYAML shares an aliased node, so
        composing stays cheap; the cost would come when the value is written out as text."""
        event = self.peek_event()
        if not isinstance(event, yaml.AliasEvent):
            if event.anchor is None:
                return super().compose_node(parent, index)
            self._open.add(event.anchor)
            try:
                return super().compose_node(parent, index)
            finally:
                self._open.discard(event.anchor)
        line = event.start_mark.line + 1 if event.start_mark is not None else "?"
        where = f"alias *{event.anchor} (line {line} of {self.origin})"
        if event.anchor in self._open:
            raise SpecError(
                self.origin, ALIAS_RULE, f"{where} is inside the node it names (a cycle)"
            )
        node = super().compose_node(parent, index)
        assert node is not None  # an alias names a node composed before it
        self._aliased += self._size(node)
        if self._aliased > MAX_ALIAS_EXPANSION:
            raise SpecError(
                self.origin,
                ALIAS_RULE,
                f"{where} brings what the aliases repeat past {MAX_ALIAS_EXPANSION:,} values "
                "and characters; aliases share a declaration, they do not multiply one",
            )
        return node

    def _size(self, node: yaml.Node) -> int:
        """`node` written out: 1 per list or mapping, 1 plus its length per scalar. Memoised,
        so a node shared by many aliases is measured once."""
        size = self._expanded.get(id(node))
        if size is None:
            if isinstance(node, yaml.ScalarNode):
                size = 1 + len(node.value)
            elif isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self._size(item) for item in node.value)
            else:
                size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            self._expanded[id(node)] = size
        return size

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            self._check_keys(node, (), set())
        return node

    def _check_keys(self, node: yaml.Node, path: tuple[str, ...], seen: set[int]) -> None:
        """Refuse the first key (in document order) under `node` that YAML does not read as text;
        `path` is the keys leading to `node`, `seen` the nodes already checked (an alias
        repeats a node)."""
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                self._check_keys(item, path, seen)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    self._check_keys(value_node, path, seen)
                    continue
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                    raise self._key_not_text(path, key_node)
                self._check_keys(value_node, (*path, key_node.value), seen)

    def _key_not_text(self, path: tuple[str, ...], key_node: yaml.Node) -> SpecError:
        subject, what = key_subject(path, self.origin)
        where = f"line {key_node.start_mark.line + 1} of {self.origin}"
        if not isinstance(key_node, yaml.ScalarNode):
            kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
            return SpecError(subject, KEYS_ARE_TEXT, f"{what} ({where}) is a {kind}, not a name")
        value = self.construct_object(key_node)
        if value is None:
            read = "null"
        elif isinstance(value, bool):
            read = f"the boolean {value}"
        elif isinstance(value, int | float):
            read = f"the number {value!r}"
        elif isinstance(value, date):
            read = f"the date {value.isoformat()}"
        else:
            read = f"a {type(value).__name__}"
        text = key_node.value
        if not text:
            return SpecError(subject, KEYS_ARE_TEXT, f"{what} ({where}) is empty")
        return SpecError(
            subject,
            KEYS_ARE_TEXT,
            f"{what} `{text}` ({where}) is read by YAML as {read}; quote it ('{text}') to mean "
            "the name",
        )

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def key_subject(path: Sequence[str], origin: str) -> tuple[str, str]:
    """For a key found under `path` (the keys leading to its mapping): the subject a SpecError
    names (the archive or tenant it belongs to, else the spec file) and what the key is."""
    if path and path[0] == "attributes":  # a Dagster `defs.yaml`: its attributes are the spec
        path = path[1:]
    subject = origin
    if len(path) >= 2 and path[0] in ARCHIVE_SECTIONS:
        subject = path[1]
    elif len(path) >= 2 and path[0] == "tenants":
        subject = f"tenants.{path[1]}"
    if not path:
        return subject, "top-level key"
    if len(path) == 1 and path[0] in ARCHIVE_SECTIONS:
        return subject, "archive name"
    if len(path) == 1 and path[0] == "tenants":
        return subject, "tenant name"
    if len(path) == 3 and path[0] != "rollups" and path[2] == "columns":
        return subject, "column name"
    return subject, f"key under {'.'.join(path)}"


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
    raw = {n: _parse_raw(n, b) for n, b in _section(doc, "raw_archives", origin).items()}
    tr = {
        n: _parse_time_range(n, b) for n, b in _section(doc, "time_range_archives", origin).items()
    }
    rollups = {n: _parse_rollup(n, b) for n, b in _section(doc, "rollups", origin).items()}
    tenants = {n: _parse_tenant(n, b) for n, b in _section(doc, "tenants", origin).items()}
    return validate_catalog(raw, tr, rollups, origin, tenants)


def _section(doc: Mapping[str, Any], key: str, origin: str) -> dict[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, Mapping):
        raise SpecError(origin, f"{key} is a mapping", f"'{key}' must map archive names to specs")
    return {str(k): v for k, v in value.items()}


def _mapping(name: str, body: Any, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise SpecError(name, "archive body is a mapping", "the archive spec must be a mapping")
    unknown = set(body) - allowed
    if unknown:
        raise SpecError(
            name, "known keys", f"unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}"
        )
    return body


def _columns(name: str, body: Mapping[str, Any]) -> tuple[ColumnSpec, ...]:
    cols = body.get("columns")
    if not isinstance(cols, Mapping) or not cols:
        raise SpecError(
            name, "has value columns", "'columns' must map at least one column name to its type"
        )
    out = []
    for col, decl in cols.items():
        if isinstance(decl, str):
            decl = {"type": decl}
        if not isinstance(decl, Mapping):
            raise SpecError(
                name, "column declaration", f"column '{col}' must be a type or a mapping"
            )
        bad = set(decl) - {"type", "required", "formula"}
        if bad:
            raise SpecError(
                name, "column declaration", f"column '{col}' has unknown keys {sorted(bad)}"
            )
        try:
            ctype = ColumnType(str(decl.get("type", "")).lower())
        except ValueError:
            raise SpecError(
                name,
                "column type",
                f"column '{col}' has type {decl.get('type')!r}; use one of "
                f"{[t.value for t in ColumnType]}",
            ) from None
        required = decl.get("required", False)
        if not isinstance(required, bool):
            raise SpecError(
                name, "column declaration", f"column '{col}': 'required' must be true or false"
            )
        out.append(ColumnSpec(str(col), ctype, required, _formula(name, str(col), decl)))
    return tuple(out)


def _formula(name: str, col: str, decl: Mapping[str, Any]) -> Formula | None:
    """The parsed formula of a computed column (None for an ingested column)."""
    if "formula" not in decl:
        return None
    text = decl["formula"]
    if not isinstance(text, str):
        raise SpecError(name, "formula", f"column '{col}': the formula must be text")
    if decl.get("required", False):
        raise SpecError(
            name,
            "formula",
            f"column '{col}' is computed; it cannot be required (a formula error stores null)",
        )
    try:
        return parse_formula(text)
    except FormulaSyntaxError as exc:
        raise SpecError(name, "formula", f"column '{col}': {exc}") from None


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


def _parse_raw(name: str, body: Any) -> RawArchiveSpec:
    b = _mapping(name, body, {"columns", "description", "retention"})
    return RawArchiveSpec(
        name=name,
        columns=_columns(name, b),
        description=str(b.get("description", "")),
        retention=_retention(name, b),
    )


def _parse_time_range(name: str, body: Any) -> TimeRangeArchiveSpec:
    b = _mapping(name, body, {"columns", "description", "period", "retention"})
    period = _duration(name, "period", b.get("period")) if b.get("period") is not None else None
    return TimeRangeArchiveSpec(
        name=name,
        columns=_columns(name, b),
        period=period,
        description=str(b.get("description", "")),
        retention=_retention(name, b),
    )


_ROLLUP_KEYS = {
    "source",
    "alignment",
    "size",
    "origin",
    "reference_time_zone",
    "watermark_lag",
    "refresh_open_bucket",
    "start",
    "aggregations",
    "description",
    "retention",
}


def _parse_rollup(name: str, body: Any) -> RollupSpec:
    b = _mapping(name, body, _ROLLUP_KEYS)
    if not b.get("source"):
        raise SpecError(name, "source is set", "a rollup needs a 'source' archive")
    try:
        alignment = Alignment(str(b.get("alignment")))
    except ValueError:
        raise SpecError(
            name,
            "alignment",
            f"alignment {b.get('alignment')!r} is not one of {[a.value for a in Alignment]}",
        ) from None
    aggs_raw = b.get("aggregations")
    if not isinstance(aggs_raw, list) or not aggs_raw:
        raise SpecError(name, "has aggregations", "'aggregations' must be a non-empty list")
    aggs = tuple(_aggregation(name, i, a) for i, a in enumerate(aggs_raw))
    refresh = b.get("refresh_open_bucket", True)
    if not isinstance(refresh, bool):
        raise SpecError(name, "refresh_open_bucket", "'refresh_open_bucket' must be true or false")
    return RollupSpec(
        name=name,
        source=str(b["source"]),
        alignment=alignment,
        size=_duration(name, "size", b["size"]) if b.get("size") is not None else None,
        origin=_origin(name, b.get("origin")),
        reference_time_zone=str(b.get("reference_time_zone", "UTC")),
        watermark_lag=_duration(name, "watermark_lag", b.get("watermark_lag", "0s")),
        refresh_open_bucket=refresh,
        start=_start(name, b.get("start")),
        aggregations=aggs,
        description=str(b.get("description", "")),
        retention=_retention(name, b),
    )


def _aggregation(name: str, index: int, a: Any) -> AggregationSpec:
    if not isinstance(a, Mapping) or not a.get("column") or not a.get("function"):
        raise SpecError(name, "aggregation", f"aggregation #{index} needs 'column' and 'function'")
    bad = set(a) - {"column", "function", "target"}
    if bad:
        raise SpecError(name, "aggregation", f"aggregation #{index} has unknown keys {sorted(bad)}")
    try:
        fn = AggregateFunction(str(a["function"]))
    except ValueError:
        raise SpecError(
            name,
            "aggregation function",
            f"aggregation #{index}: function {a['function']!r} is not one of "
            f"{[f.value for f in AggregateFunction]}",
        ) from None
    target = a.get("target")
    return AggregationSpec(str(a["column"]), fn, str(target) if target is not None else None)


def _retention(name: str, body: Mapping[str, Any]) -> timedelta | None:
    """`retention` of a raw or time-range archive or of a rollup; absent or null: rows are kept
    forever."""
    value = body.get("retention")
    return None if value is None else _duration(name, "retention", value)


def _duration(name: str, key: str, value: Any) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise SpecError(name, key, f"'{key}': {exc}") from None


def _origin(name: str, value: Any) -> datetime:
    """A FixedSize rollup's `origin`: an instant with its offset (`2024-01-01T06:00:00Z`), in
    UTC; absent: the Unix epoch. A local time (no offset) or a date is refused, as it could be
    read in UTC or in the reference zone."""
    if value is None:
        return EPOCH
    parsed = value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            parsed = None
    if isinstance(parsed, datetime) and parsed.tzinfo is not None:
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # an offset taking it before year 1 or past 9999
            pass
    raise SpecError(
        name,
        "origin",
        f"'origin' {value!r} is not an instant with its UTC offset in the years 1 to 9999 "
        "(e.g. 2024-01-01T06:00:00Z or 2024-01-01T00:00:00+01:00)",
    )


def _start(name: str, value: Any) -> datetime:
    if value is None:
        return datetime.min  # "inherit from the source rollup"; resolved during validation
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            raise SpecError(
                name, "start", "'start' is a local time in the reference zone; drop the offset"
            )
        return value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise SpecError(
            name, "start", f"'start' {value!r} is not an ISO date (YYYY-MM-DD)"
        ) from None
    if parsed.tzinfo is not None:
        raise SpecError(
            name, "start", "'start' is a local time in the reference zone; drop the offset"
        )
    return parsed
