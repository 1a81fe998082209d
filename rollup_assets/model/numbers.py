"""Numbers written in specs and on the command line: ASCII digits only, finite values only.

Python's `int()`, `float()`, `str.isdigit()` and a regex `\\d` accept every Unicode decimal
digit (`'١٢'` and `'１２'` are 12 to them), and `float('1e999')` is infinity. Formula literals
and durations are read with the patterns and functions here instead, so that a number is what
it looks like to every other reader of the spec, and never infinite.
"""

import math
import re

# Patterns for building larger ones (a formula token, a duration); never `\d`.
WHOLE = "[0-9]+"
DECIMAL = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"


def whole_number(text: str) -> int:
    """`text` as a whole number: ASCII digits only. Raises ValueError naming the text."""
    if re.fullmatch(WHOLE, text) is None:
        raise ValueError(f"{text!r} is not a whole number (digits 0-9)")
    return int(text)


def decimal_number(text: str) -> float:
    """`text` as a finite number: ASCII digits, an optional point and exponent. Raises
    ValueError naming the text, also when it is too large to be anything but infinity."""
    if re.fullmatch(DECIMAL, text) is None:
        raise ValueError(f"{text!r} is not a number (digits 0-9, '.', an exponent)")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is too large (it would be infinity)")
    return value
