"""What may name an archive, a tenant or a column, and what may appear in an entity id."""

import re

from rollup_assets.model.formulas import FUNCTIONS, KEYWORDS
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    RANGE_END_COLUMN,
    RANGE_START_COLUMN,
    TIME_COLUMN,
)

# Columns the storage layer owns; a declared value column must not shadow them.
RESERVED_COLUMNS = frozenset(
    {
        ENTITY_COLUMN,
        TIME_COLUMN,
        RANGE_START_COLUMN,
        RANGE_END_COLUMN,
        DAY_COLUMN,
        "bucket_start",
        "bucket_end",
        "bucket_part",
        "generation",
        "run_id",
        "job_id",
        "source_versions",
        "delta",
        "raw_rows",
    }
)
# Words a column must not be named: a formula would read them as its literals (`true`,
# `false`), operators or functions, and SQL (the query engine's filters and casts) reads `null`
# as its literal, so a column of that name fails every ingest without naming itself.
RESERVED_WORDS = frozenset({"null"}) | KEYWORDS | FUNCTIONS
# The name rule (`name_problem`), matched whole: `re.match` with `$` would accept a trailing
# newline ("meter\n"), which then fails deep inside the query engine instead of at load.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
# C0 and C1 control characters (NUL, tab, newline, DEL, ...): part of no name and no entity id.
# Python `re` and RE2 (Arrow's `match_substring_regex`) read this pattern alike.
CONTROL_CHARACTERS = r"[\x00-\x1f\x7f-\x9f]"


def name_problem(name: object) -> str | None:
    """Why `name` cannot name an archive, a tenant or a column (None when it can): a name is a
    lower-case identifier (a-z, 0-9, _; no '__') of at most 63 characters. The name is shown
    with `repr`, so a control character in it is visible in a one-line message."""
    if not isinstance(name, str):
        return f"{name!r} is not text"
    if re.search(CONTROL_CHARACTERS, name):
        return f"{name!r} holds a control character"
    if _NAME.fullmatch(name) is None or "__" in name:
        return (
            f"{name!r} is not a lower-case identifier (a-z, 0-9, _; no '__') of at most 63 "
            "characters"
        )
    return None


def column_name_problem(name: object) -> str | None:
    """Why `name` cannot name a value column or an aggregation's target (None when it can): the
    name rule, not a column the storage layer owns, and not a reserved word."""
    problem = name_problem(name)
    if problem is None and name in RESERVED_COLUMNS:
        problem = f"{name!r} is reserved by the storage layer"
    if problem is None and name in RESERVED_WORDS:
        problem = (
            f"{name!r} is a reserved word (a literal, operator or function of formulas and "
            "SQL); choose another name"
        )
    return problem
