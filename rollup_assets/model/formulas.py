"""Formulas of computed columns: a small whitelisted grammar, parsed without executing anything.

A formula is text in the spirit of the reference's formula dialect, over the other columns of
the same row:

    expression  := or
    or          := and   ( ("or" | "||") and )*
    and         := not   ( ("and" | "&&") not )*
    not         := ("not" | "!" | "~") not | compare
    compare     := sum   ( ("<" | "<=" | ">" | ">=" | "=" | "==" | "!=" | "<>") sum )?
    sum         := product ( ("+" | "-") product )*
    product     := sign  ( ("*" | "/") sign )*
    sign        := ("-" | "+") sign | power
    power       := atom  ( "^" sign )?                  (right-associative)
    atom        := number | "true" | "false" | column
                 | function "(" arguments ")" | "(" expression ")"

Functions: `abs sqrt exp ln log10 floor ceil sign` (one argument), `round(x)` or `round(x, n)`
with a whole literal `n`, `min(a, b, ...)` and `max(a, b, ...)`, `if(condition, then, else)`.

A number literal is written in ASCII digits (`12`, `0.5`, `2.5e3`; `١٢` is no number) and must
be finite: `1e999`, which a float would hold as infinity, is refused.

Every value is a number: a boolean operand or result is 1 or 0, a condition is true when it is
not 0, a timestamp operand (`ts`, `range_start`, `range_end` or a timestamp column) is its
milliseconds since 1970-01-01 UTC. Nothing else exists: no attribute access, no indexing, no
strings, no other names or calls. The parser is a hand-written recursive descent over tokens;
it never hands text to Python's `eval`, `compile` or `ast`.

Limits keep a hostile spec from costing anything: `MAX_FORMULA_CHARS` characters, `MAX_NODES`
nodes, `MAX_DEPTH` levels of nesting.
"""

import re
from dataclasses import dataclass

from rollup_assets.model.numbers import DECIMAL, decimal_number

MAX_FORMULA_CHARS = 1_000
MAX_NODES = 256
MAX_DEPTH = 32

UNARY_FUNCTIONS = frozenset({"abs", "sqrt", "exp", "ln", "log10", "floor", "ceil", "sign"})
VARIADIC_FUNCTIONS = frozenset({"min", "max"})
FUNCTIONS = UNARY_FUNCTIONS | VARIADIC_FUNCTIONS | {"round", "if"}
KEYWORDS = frozenset({"and", "or", "not", "true", "false"})
COMPARISONS = {
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
    "=": "==",
    "==": "==",
    "!=": "!=",
    "<>": "!=",
}

# Numbers are ASCII digits only (`numbers.DECIMAL`): `\d` would take any Unicode digit.
_TOKEN = re.compile(
    rf"\s*(?:(?P<number>{DECIMAL})"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op><=|>=|==|!=|<>|&&|\|\||[-+*/^()<>=!~,]))"
)


class FormulaSyntaxError(ValueError):
    """The formula text breaks the grammar or a limit; the message names the position."""


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class ColumnRef:
    name: str


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "not"
    operand: "Node"


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / ^ < <= > >= == != and or
    left: "Node"
    right: "Node"


@dataclass(frozen=True)
class Call:
    function: str
    args: tuple["Node", ...]


Node = Number | ColumnRef | Unary | Binary | Call


@dataclass(frozen=True)
class Formula:
    """A parsed formula: its text (as declared) and its tree."""

    text: str
    tree: Node

    @property
    def columns(self) -> frozenset[str]:
        """The column names the formula reads."""
        return frozenset(_columns(self.tree))


def _columns(node: Node) -> list[str]:
    match node:
        case ColumnRef(name):
            return [name]
        case Unary(_, operand):
            return _columns(operand)
        case Binary(_, left, right):
            return [*_columns(left), *_columns(right)]
        case Call(_, args):
            return [c for a in args for c in _columns(a)]
    return []


def parse_formula(text: str) -> Formula:
    """The formula in `text`; raises FormulaSyntaxError naming what is wrong and where."""
    if not isinstance(text, str) or not text.strip():
        raise FormulaSyntaxError("the formula is empty")
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaSyntaxError(
            f"the formula has {len(text)} characters; at most {MAX_FORMULA_CHARS} are allowed"
        )
    parser = _Parser(text, _tokenize(text))
    tree = parser.expression(0)
    if parser.peek() is not None:
        raise parser.error(f"unexpected {parser.peek()!r}")
    return Formula(text, tree)


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip())
            what = " (there is no attribute access)" if text[col] == "." else ""
            if text[col].isdecimal():  # a digit of another script: '١', '１'
                what = " (numbers are written with the digits 0-9)"
            raise FormulaSyntaxError(f"position {col + 1}: {text[col]!r} is not allowed{what}")
        kind = m.lastgroup or ""
        start = m.start(kind)
        tokens.append((kind, m.group(kind), start))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, text: str, tokens: list[tuple[str, str, int]]) -> None:
        self.text = text
        self.tokens = tokens
        self.i = 0
        self.nodes = 0

    # -- token access ------------------------------------------------------------------------

    def peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def error(self, message: str) -> FormulaSyntaxError:
        where = self.tokens[self.i][2] + 1 if self.i < len(self.tokens) else len(self.text) + 1
        return FormulaSyntaxError(f"position {where}: {message}")

    def take(self, *values: str) -> str | None:
        tok = self.peek()
        if tok is not None and (tok in values or tok.lower() in values):
            self.i += 1
            return tok.lower()
        return None

    def expect(self, value: str) -> None:
        if self.take(value) is None:
            found = self.peek()
            raise self.error(
                f"expected {value!r}, found {found!r}" if found else f"expected {value!r}"
            )

    def check_depth(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.error(f"the formula nests deeper than {MAX_DEPTH} levels")

    def node(self, n: Node, depth: int) -> Node:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.error(f"the formula has more than {MAX_NODES} parts")
        if depth > MAX_DEPTH:
            raise self.error(f"the formula nests deeper than {MAX_DEPTH} levels")
        return n

    # -- grammar -----------------------------------------------------------------------------

    def expression(self, depth: int) -> Node:
        left = self.conjunction(depth)
        while self.take("or", "||"):
            left = self.node(Binary("or", left, self.conjunction(depth + 1)), depth)
        return left

    def conjunction(self, depth: int) -> Node:
        left = self.negation(depth)
        while self.take("and", "&&"):
            left = self.node(Binary("and", left, self.negation(depth + 1)), depth)
        return left

    def negation(self, depth: int) -> Node:
        self.check_depth(depth)
        if self.take("not", "!", "~"):
            return self.node(Unary("not", self.negation(depth + 1)), depth)
        return self.comparison(depth)

    def comparison(self, depth: int) -> Node:
        left = self.sum(depth)
        op = self.take(*COMPARISONS)
        if op is not None:
            left = self.node(Binary(COMPARISONS[op], left, self.sum(depth + 1)), depth)
            if self.peek() in COMPARISONS:
                raise self.error("comparisons do not chain; use 'and'")
        return left

    def sum(self, depth: int) -> Node:
        left = self.product(depth)
        while (op := self.take("+", "-")) is not None:
            left = self.node(Binary(op, left, self.product(depth + 1)), depth)
        return left

    def product(self, depth: int) -> Node:
        left = self.sign(depth)
        while (op := self.take("*", "/")) is not None:
            left = self.node(Binary(op, left, self.sign(depth + 1)), depth)
        return left

    def sign(self, depth: int) -> Node:
        self.check_depth(depth)
        if self.take("+"):
            return self.sign(depth + 1)
        if self.take("-"):
            return self.node(Unary("-", self.sign(depth + 1)), depth)
        return self.power(depth)

    def power(self, depth: int) -> Node:
        base = self.atom(depth)
        if self.take("^"):
            return self.node(Binary("^", base, self.sign(depth + 1)), depth)
        return base

    def atom(self, depth: int) -> Node:
        self.check_depth(depth)
        if self.i >= len(self.tokens):
            raise self.error("the formula ends too early")
        kind, value, _ = self.tokens[self.i]
        if kind == "number":
            try:
                number = decimal_number(value)
            except ValueError as exc:  # 1e999: a literal is never infinity
                raise self.error(str(exc)) from None
            self.i += 1
            return self.node(Number(number), depth)
        if self.take("("):
            inner = self.expression(depth + 1)
            self.expect(")")
            return inner
        if kind != "name":
            raise self.error(f"unexpected {value!r}")
        name = value.lower()
        if name in ("true", "false"):
            self.i += 1
            return self.node(Number(1.0 if name == "true" else 0.0), depth)
        if name in KEYWORDS:
            raise self.error(f"'{value}' is an operator, not a value")
        self.i += 1
        if self.peek() == "(":
            return self.call(name, value, depth)
        if value != name:
            raise self.error(f"column names are lower case: '{value}'")
        return self.node(ColumnRef(name), depth)

    def call(self, name: str, spelled: str, depth: int) -> Node:
        if name not in FUNCTIONS:
            self.i -= 1
            allowed = ", ".join(sorted(FUNCTIONS))
            raise self.error(f"'{spelled}' is not an allowed function (allowed: {allowed})")
        self.expect("(")
        args: list[Node] = []
        if self.peek() != ")":
            args.append(self.expression(depth + 1))
            while self.take(","):
                args.append(self.expression(depth + 1))
        self.expect(")")
        self._check_arity(name, args)
        return self.node(Call(name, tuple(args)), depth)

    def _check_arity(self, name: str, args: list[Node]) -> None:
        n = len(args)
        if name in UNARY_FUNCTIONS and n != 1:
            raise self.error(f"{name}() takes one argument, not {n}")
        if name in VARIADIC_FUNCTIONS and n < 2:
            raise self.error(f"{name}() takes two or more arguments, not {n}")
        if name == "if" and n != 3:
            raise self.error(f"if() takes three arguments (condition, then, else), not {n}")
        if name == "round":
            if n not in (1, 2):
                raise self.error(f"round() takes one or two arguments, not {n}")
            if n == 2 and not (
                isinstance(args[1], Number)
                and args[1].value.is_integer()
                and 0 <= args[1].value <= 15
            ):
                raise self.error("round(x, n) needs n as a whole number from 0 to 15")
