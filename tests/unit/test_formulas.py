"""Computed columns: the formula grammar, its limits, the spec rules, and evaluation semantics.

The Arrow evaluator used at ingest is checked against plain Python arithmetic on single values
and, for random formulas over random rows, against the numpy evaluator of the verification path.
"""

import math
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollup_assets.compute.formulas import computed_values, evaluate
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.errors import IngestValidationError, SpecError
from rollup_assets.model.formulas import (
    MAX_DEPTH,
    MAX_FORMULA_CHARS,
    MAX_NODES,
    FormulaSyntaxError,
    parse_formula,
)
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.specs import RawArchiveSpec
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.verify import raw_frame


def catalog_with(columns: dict) -> dict:
    return {"raw_archives": {"meters": {"columns": {"p": "double", "s": "double", **columns}}}}


def load(columns: dict) -> RawArchiveSpec:
    return parse_catalog(catalog_with(columns)).raw["meters"]


def value(text: str, **cols: float | None) -> float | None:
    """One row's value of `text`, the columns given as keyword arguments."""
    arrays = {k: pa.array([v], pa.float64()) for k, v in cols.items()}
    return evaluate(parse_formula(text), arrays, 1).to_pylist()[0]


# ---------------------------------------------------------------------------------------------
# The grammar


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("2 ^ 3 ^ 2", 512.0),  # right-associative
        ("-2 ^ 2", -4.0),  # the sign applies to the power
        ("2 ^ -1", 0.5),
        ("10 - 4 - 3", 3.0),  # left-associative
        ("12 / 4 / 3", 1.0),
        ("1 < 2", 1.0),
        ("2 = 2", 1.0),
        ("2 <> 2", 0.0),
        ("1 < 2 and 3 < 2", 0.0),
        ("1 < 2 or 3 < 2", 1.0),
        ("not 0", 1.0),
        ("!1 || true", 1.0),
        ("true && false", 0.0),
        ("if(1 > 2, 10, 20)", 20.0),
        ("min(3, 1, 2) + max(3, 1, 2)", 4.0),
        ("round(2.5) + round(-2.5)", 0.0),  # half away from zero
        ("round(1.23456, 2)", 1.23),
        ("abs(-3) + sqrt(16) + floor(1.7) + ceil(1.2) + sign(-9)", 3 + 4 + 1 + 2 - 1),
        ("ln(exp(2)) + log10(1000)", 5.0),
        ("1.5e3 + .5", 1500.5),
        ("ABS(-1)", 1.0),  # function names ignore case
    ],
)
def test_arithmetic_follows_the_usual_precedence(text: str, expected: float) -> None:
    assert value(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("p.real", "no attribute access"),
        ("p.__class__", "no attribute access"),
        ("__import__('os')", "not allowed"),
        ("exec(1)", "'exec' is not an allowed function"),
        ("eval(p)", "'eval' is not an allowed function"),
        ("open(p)", "'open' is not an allowed function"),
        ("lambda: 1", "':' is not allowed"),
        ("p[0]", "'[' is not allowed"),
        ("p if s else 1", "unexpected 'if'"),
        ("'text'", "is not allowed"),
        ("p; s", "';' is not allowed"),
        ("p s", "unexpected 's'"),
        ("(p", "expected ')'"),
        ("p +", "ends too early"),
        ("1 < 2 < 3", "do not chain"),
        ("abs(1, 2)", "abs() takes one argument"),
        ("min(1)", "min() takes two or more"),
        ("if(1, 2)", "if() takes three"),
        ("round(p, s)", "round(x, n) needs n"),
        ("P + 1", "lower case"),
        ("and", "operator, not a value"),
        ("", "empty"),
    ],
)
def test_everything_outside_the_grammar_is_refused(text: str, message: str) -> None:
    with pytest.raises(FormulaSyntaxError, match=None) as err:
        parse_formula(text)
    assert message in str(err.value)


def test_huge_and_deep_formulas_are_refused_before_they_cost_anything() -> None:
    with pytest.raises(FormulaSyntaxError, match=f"at most {MAX_FORMULA_CHARS}"):
        parse_formula("p + " * 300 + "p")
    with pytest.raises(FormulaSyntaxError, match=f"more than {MAX_NODES} parts"):
        parse_formula("+".join(["1"] * 400))
    with pytest.raises(FormulaSyntaxError, match=f"deeper than {MAX_DEPTH}"):
        parse_formula("(" * 40 + "1" + ")" * 40)
    with pytest.raises(FormulaSyntaxError, match=f"deeper than {MAX_DEPTH}"):
        parse_formula("abs(" * 40 + "1" + ")" * 40)
    with pytest.raises(FormulaSyntaxError, match=f"deeper than {MAX_DEPTH}"):
        parse_formula("-" * 100 + "1")


def test_the_columns_a_formula_reads() -> None:
    f = parse_formula("if(s > 0, p / s, max(p, ts))")
    assert f.columns == {"s", "p", "ts"}


# ---------------------------------------------------------------------------------------------
# Spec rules: every refusal names the archive and the column


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"x": {"type": "double", "formula": "p / q"}}, "reads 'q', which is not a column"),
        ({"x": {"type": "double", "formula": "x + 1"}}, "reads itself"),
        (
            {
                "x": {"type": "double", "formula": "y + 1"},
                "y": {"type": "double", "formula": "x + 1"},
            },
            "read each other: x -> y -> x",
        ),
        ({"n": "string", "x": {"type": "double", "formula": "n"}}, "a string column"),
        ({"x": {"type": "string", "formula": "p"}}, "has type string"),
        ({"x": {"type": "double", "formula": "p", "required": True}}, "cannot be required"),
        ({"x": {"type": "double", "formula": 3}}, "must be text"),
        ({"x": {"type": "double", "formula": "p.__class__"}}, "column 'x'"),
        ({"x": {"type": "double", "formula": "entity_id"}}, "reads 'entity_id'"),
        ({"x": {"type": "double", "formula": "system(1)"}}, "'system' is not an allowed"),
        ({"x": {"type": "double", "formula": "p" + "+p" * 600}}, "column 'x'"),
    ],
)
def test_bad_computed_columns_are_refused_at_load(columns: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        load(columns)
    assert err.value.archive == "meters"
    assert message in str(err.value)


def test_computed_columns_are_ordered_after_what_they_read() -> None:
    spec = load(
        {
            "flag": {"type": "boolean", "formula": "ratio > 0.5"},
            "ratio": {"type": "double", "formula": "p / s"},
            "stamp": {"type": "timestamp", "formula": "ts + 60000"},
        }
    )
    assert [c.name for c in spec.columns] == ["p", "s", "ratio", "flag", "stamp"]
    assert [c.name for c in spec.computed_columns] == ["ratio", "flag", "stamp"]


def test_computed_columns_are_not_part_of_the_frozen_schema() -> None:
    from rollup_assets.model.specs import schema_fingerprint

    a = load({"x": {"type": "double", "formula": "p / s"}})
    b = load({"x": {"type": "double", "formula": "p * s"}})
    plain = parse_catalog(
        {"raw_archives": {"meters": {"columns": {"p": "double", "s": "double"}}}}
    ).raw["meters"]
    other = parse_catalog(
        {"raw_archives": {"meters": {"columns": {"p": "double", "s": "long"}}}}
    ).raw["meters"]
    assert schema_fingerprint(a) == schema_fingerprint(b) == schema_fingerprint(plain)
    assert schema_fingerprint(other) != schema_fingerprint(plain)


# ---------------------------------------------------------------------------------------------
# Evaluation: errors, NaN and null operands store null; result types


@pytest.mark.parametrize(
    ("text", "cols", "expected"),
    [
        ("p / s", {"p": 1.0, "s": 0.0}, None),  # x / 0
        ("p / s", {"p": 0.0, "s": 0.0}, None),  # 0 / 0
        ("sqrt(p)", {"p": -1.0}, None),
        ("ln(p)", {"p": 0.0}, None),
        ("p ^ 0.5", {"p": -4.0}, None),
        ("p * p", {"p": 1e200}, None),  # overflow
        ("p + s", {"p": None, "s": 1.0}, None),
        ("p > s", {"p": None, "s": 1.0}, None),
        ("if(p, 1, 2)", {"p": None}, None),
        ("min(p, s)", {"p": None, "s": 1.0}, None),
        ("if(s > 0, p / s, 0)", {"p": 1.0, "s": 0.0}, 0.0),  # only the branch taken matters
        ("p / s", {"p": 1.0, "s": 4.0}, 0.25),
    ],
)
def test_a_formula_error_or_null_operand_gives_null(text: str, cols: dict, expected) -> None:
    assert value(text, **cols) == expected


def test_result_types() -> None:
    cols = {
        "p": pa.array([2.9, -2.9, 3e9, None, 0.0]),
        "ts": pa.array([datetime(2025, 3, 30, 1, tzinfo=UTC)] * 5, pa.timestamp("us", tz="UTC")),
    }

    def typed(text: str, ctype: ColumnType, arrow: pa.DataType) -> list:
        return computed_values(parse_formula(text), ctype, cols, 5, arrow).to_pylist()

    assert typed("p", ColumnType.LONG, pa.int64()) == [2, -2, 3_000_000_000, None, 0]
    assert typed("p", ColumnType.INT, pa.int32()) == [2, -2, None, None, 0]  # outside int32
    assert typed("p", ColumnType.BOOLEAN, pa.bool_()) == [True, True, True, None, False]
    shifted = typed("ts + p * 1000", ColumnType.TIMESTAMP, pa.timestamp("us", tz="UTC"))
    assert shifted[0] == datetime(2025, 3, 30, 1, 0, 2, 900_000, tzinfo=UTC)
    assert shifted[3] is None
    far = typed("ts * 1e6", ColumnType.TIMESTAMP, pa.timestamp("us", tz="UTC"))
    assert far == [None] * 5  # after year 9999


_leaf = st.one_of(
    st.sampled_from(["p", "s", "b"]),
    st.floats(-5, 5, allow_nan=False).map(lambda x: f"{x:.3f}"),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(
        children, st.sampled_from(["+", "-", "*", "/", "^", "<", ">=", "==", "and", "or"]), children
    ).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
    unary = st.tuples(
        st.sampled_from(["abs", "sqrt", "ln", "floor", "ceil", "sign", "-", "not "]), children
    ).map(lambda t: f"({t[0]}({t[1]}))")  # `not` binds looser than `+`: parenthesized
    calls = st.one_of(
        st.tuples(children, children).map(lambda t: f"min({t[0]}, {t[1]})"),
        st.tuples(children, children, children).map(lambda t: f"if({t[0]}, {t[1]}, {t[2]})"),
        children.map(lambda c: f"round({c}, 2)"),
    )
    return st.one_of(binary, unary, calls)


formulas = st.recursive(_leaf, _combine, max_leaves=8)
values = st.one_of(st.none(), st.floats(-100, 100, allow_nan=False), st.just(0.0))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=formulas,
    rows=st.lists(
        st.tuples(values, values, st.one_of(st.none(), st.booleans())), min_size=1, max_size=6
    ),
)
def test_ingest_evaluation_equals_the_verification_evaluator(text: str, rows: list) -> None:
    formula = parse_formula(text)
    cols = {
        "p": pa.array([r[0] for r in rows], pa.float64()),
        "s": pa.array([r[1] for r in rows], pa.float64()),
        "b": pa.array([r[2] for r in rows], pa.bool_()),
    }
    got = evaluate(formula, cols, len(rows)).to_pylist()
    spec = load({"b": "boolean", "x": {"type": "double", "formula": text}})
    frame = pa.table(
        {
            "entity_id": ["m"] * len(rows),
            "ts": pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * len(rows)),
            **cols,
        }
    )
    want = raw_frame(frame, spec)["x"].tolist()
    for g, w in zip(got, want, strict=True):
        if w is None or (isinstance(w, float) and math.isnan(w)):
            assert g is None, (text, rows, got, want)
        else:
            assert g == pytest.approx(w, rel=1e-9, abs=1e-9), (text, rows, got, want)


# ---------------------------------------------------------------------------------------------
# Ingest: computed on every row, never supplied, over the row the upsert leaves


@pytest.fixture
def meters(tmp_path: Path) -> tuple[RawStore, RawArchiveSpec]:
    spec = parse_catalog(
        {
            "raw_archives": {
                "meters": {
                    "columns": {
                        "active": "double",
                        "apparent": "double",
                        "power_factor": {
                            "type": "double",
                            "formula": "active / apparent",
                        },
                        "low": {"type": "boolean", "formula": "power_factor < 0.9"},
                    }
                }
            }
        }
    ).raw["meters"]
    store = RawStore(Warehouse(str(tmp_path / "warehouse")))
    store.ensure_table(spec)
    return store, spec


def _ingest(store: RawStore, spec: RawArchiveSpec, path: Path, frame: pd.DataFrame) -> None:
    frame.to_parquet(path, index=False)
    store.ingest(spec, path, ChangeSource("Pipeline"))


def _stored(store: RawStore, spec: RawArchiveSpec) -> list[tuple]:
    t = store.read_arrow(spec).sort_by([("entity_id", "ascending"), ("ts", "ascending")])
    return [(r["entity_id"], r["power_factor"], r["low"]) for r in t.to_pylist()]


def test_computed_columns_are_stored_on_ingest(meters, tmp_path: Path) -> None:
    store, spec = meters
    frame = pd.DataFrame(
        {
            "entity_id": ["a", "b", "c", "d"],
            "ts": pd.to_datetime(["2025-01-01T00:00Z"] * 4),
            "active": [8.0, 9.5, 1.0, None],
            "apparent": [10.0, 10.0, 0.0, 3.0],
        }
    )
    _ingest(store, spec, tmp_path / "a.parquet", frame)
    assert _stored(store, spec) == [
        ("a", 0.8, True),
        ("b", 0.95, False),
        ("c", None, None),  # x / 0 stores null, the ingest goes on
        ("d", None, None),
    ]


def one_row(ts: pd.DatetimeIndex, **values: float) -> pd.DataFrame:
    return pd.DataFrame({"entity_id": ["a"], "ts": ts, **{k: [v] for k, v in values.items()}})


def test_a_later_batch_recomputes_over_the_merged_row(meters, tmp_path: Path) -> None:
    store, spec = meters
    ts = pd.to_datetime(["2025-01-01T00:00Z"])
    _ingest(store, spec, tmp_path / "a.parquet", one_row(ts, apparent=10.0))
    assert _stored(store, spec) == [("a", None, None)]
    # A second producer fills the other operand: the stored apparent power takes part.
    _ingest(store, spec, tmp_path / "b.parquet", one_row(ts, active=7.0))
    assert _stored(store, spec) == [("a", 0.7, True)]
    # A correction of one operand recomputes from the stored other one.
    _ingest(store, spec, tmp_path / "c.parquet", one_row(ts, apparent=7.0))
    assert _stored(store, spec) == [("a", 1.0, False)]


def test_a_batch_may_not_supply_a_computed_column(meters, tmp_path: Path) -> None:
    store, spec = meters
    frame = pd.DataFrame(
        {
            "entity_id": ["a"],
            "ts": pd.to_datetime(["2025-01-01T00:00Z"]),
            "active": [1.0],
            "power_factor": [0.5],
        }
    )
    with pytest.raises(IngestValidationError, match=r"\['power_factor'\] are computed"):
        _ingest(store, spec, tmp_path / "a.parquet", frame)
    assert store.read_arrow(spec).num_rows == 0


@pytest.mark.parametrize("prefix", ["-", "+", "!", "~", "not "])
def test_long_prefix_chains_are_refused_not_crashed(prefix: str) -> None:
    with pytest.raises(FormulaSyntaxError, match=f"deeper than {MAX_DEPTH}"):
        parse_formula(prefix * (MAX_FORMULA_CHARS // len(prefix) - 1) + "1")


def test_rounding_never_fails_a_batch_and_both_evaluators_agree() -> None:
    cols = {"p": pa.array([1e307, 2.345, 0.49999999999999994, 4503599627370497.0, -2.5, None])}
    got = evaluate(parse_formula("round(p, 2) + round(p) * 0"), cols, 6).to_pylist()
    assert got[0] is None and got[1] == pytest.approx(2.35) and got[5] is None
    rounded = evaluate(parse_formula("round(p)"), cols, 6).to_pylist()
    assert rounded[2:5] == [0.0, 4503599627370497.0, -3.0]
    spec = load({"r": {"type": "double", "formula": "round(p)"}})
    frame = pa.table(
        {"entity_id": ["m"] * 6, "ts": pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * 6), **cols}
    )
    assert raw_frame(frame, spec)["r"].tolist()[2:5] == rounded[2:5]


def test_timestamp_operands_are_milliseconds_in_both_evaluators() -> None:
    ts = pa.array([datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
    spec = load({"t": {"type": "double", "formula": "ts"}})
    frame = pa.table({"entity_id": ["m"], "ts": ts, "p": [1.0], "s": [1.0]})
    assert evaluate(parse_formula("ts"), {"ts": ts}, 1).to_pylist() == [1704067200001.5]
    assert raw_frame(frame, spec)["t"].tolist() == [1704067200001.5]
