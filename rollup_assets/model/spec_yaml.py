"""A spec file's YAML, read safely: PyYAML's SafeLoader (nothing in a spec is ever executed),
with every key unique and text, and a budget on what aliases may repeat.

Every refusal is a `SpecError` naming the spec file (or the archive or tenant a key belongs to)
and the rule, with the line it was found on.
"""

from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from rollup_assets.model.errors import SpecError


def read_spec_document(path: Path) -> Any:
    """The YAML document of the spec file at `path`, read with `_UniqueKeyLoader`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), "readable spec file", f"cannot read spec file: {exc}") from exc
    loader = _UniqueKeyLoader(text, origin=str(path))  # a SafeLoader: no arbitrary objects
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise SpecError(str(path), "valid YAML", f"not valid YAML: {_one_line(exc)}") from exc
    finally:
        loader.dispose()


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
