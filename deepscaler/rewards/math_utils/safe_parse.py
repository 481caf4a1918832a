"""Safe conversion of an answer string to a SymPy object, with size and complexity guards.

Parsing goes through ``latex2sympy2_extended`` (an ANTLR grammar that builds SymPy objects node by
node): no ``eval``, ``exec``, ``sympify`` or ``parse_expr`` ever sees model text, so an answer such as
``__import__('os').system(...)`` is at worst a product of symbols. Before any evaluation the parsed
tree is checked against limits (node count, exponent and factorial sizes, nesting), because SymPy
would otherwise happily try to expand ``9^{9^{9}}`` for hours. Inputs that fail a guard parse to None.
"""
from __future__ import annotations

import math
from functools import lru_cache

import sympy

MAX_PARSE_CHARS = 400
MAX_NESTING = 24
MAX_TREE_NODES = 1500
MAX_FREE_SYMBOLS = 8
# Largest |exponent| allowed on a numeric base, and the largest result size in decimal digits.
MAX_NUMERIC_EXPONENT = 10_000
MAX_RESULT_DIGITS = 50_000
# Largest |exponent| on a base with free symbols (expand() cost grows with it).
MAX_SYMBOLIC_EXPONENT = 64
MAX_FACTORIAL_ARG = 2_000


class UnsafeExpression(ValueError):
    """The expression is too large to evaluate within the grading time budget."""


def nesting_depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch in "({[":
            depth += 1
            best = max(best, depth)
        elif ch in ")}]":
            depth = max(0, depth - 1)
    return best


def _number_value(expr: sympy.Basic) -> float | None:
    """Float value of a small numeric subtree, or None when it is not a plain number."""
    if isinstance(expr, (sympy.Integer, sympy.Rational, sympy.Float)):
        return float(expr)
    if expr.is_number and expr.free_symbols == set():
        check_complexity(expr)
        try:
            value = complex(sympy.N(expr, 15))
        except (TypeError, ValueError, OverflowError, ZeroDivisionError):
            return None
        return value.real if abs(value.imag) < 1e-12 else None
    return None


def check_complexity(expr: sympy.Basic) -> None:
    """Raise UnsafeExpression when evaluating ``expr`` could take unbounded time or memory."""
    if isinstance(expr, sympy.MatrixBase):
        if expr.rows * expr.cols > MAX_TREE_NODES:
            raise UnsafeExpression("matrix too large")
        for entry in expr:
            check_complexity(entry)
        return
    nodes = 0
    for node in sympy.preorder_traversal(expr):
        nodes += 1
        if nodes > MAX_TREE_NODES:
            raise UnsafeExpression(f"more than {MAX_TREE_NODES} nodes")
        if isinstance(node, sympy.Integer) and abs(int(node)).bit_length() > 3 * MAX_RESULT_DIGITS:
            raise UnsafeExpression("integer literal too large")
        if isinstance(node, sympy.Pow):
            base, exp = node.args
            if exp.free_symbols:
                continue
            exp_value = _number_value(exp)
            if exp_value is None:
                continue
            if base.free_symbols:
                if abs(exp_value) > MAX_SYMBOLIC_EXPONENT:
                    raise UnsafeExpression(f"symbolic power with exponent {exp_value:g}")
                continue
            if abs(exp_value) > MAX_NUMERIC_EXPONENT:
                raise UnsafeExpression(f"numeric power with exponent {exp_value:g}")
            base_value = _number_value(base)
            if base_value is not None and base_value not in (0.0,):
                digits = abs(exp_value) * math.log10(max(abs(base_value), 1.0) + 1.0)
                if digits > MAX_RESULT_DIGITS:
                    raise UnsafeExpression("power result too large")
        elif isinstance(node, (sympy.factorial, sympy.factorial2, sympy.gamma)):
            arg_value = _number_value(node.args[0])
            if arg_value is not None and abs(arg_value) > MAX_FACTORIAL_ARG:
                raise UnsafeExpression("factorial argument too large")
        elif isinstance(node, sympy.binomial):
            arg_value = _number_value(node.args[0])
            if arg_value is not None and abs(arg_value) > 10**6:
                raise UnsafeExpression("binomial argument too large")
    if len(getattr(expr, "free_symbols", ())) > MAX_FREE_SYMBOLS:
        raise UnsafeExpression("too many free symbols")


def _latex2sympy():
    # Imported lazily: the ANTLR runtime costs ~0.5 s and workers that never parse skip it.
    from latex2sympy2_extended import NormalizationConfig, latex2sympy

    return latex2sympy, NormalizationConfig(
        basic_latex=True, units=True, malformed_operators=True, nits=True, boxed="none", equations=False
    )


@lru_cache(maxsize=4096)
def parse_answer(cleaned: str) -> sympy.Basic | None:
    """SymPy object for a cleaned answer, or None when it is unparsable or fails a guard.

    The result is cached per worker: a GRPO group grades n responses against the same ground truth.
    """
    if not cleaned or len(cleaned) > MAX_PARSE_CHARS or nesting_depth(cleaned) > MAX_NESTING:
        return None
    latex2sympy, normalization = _latex2sympy()
    try:
        expr = latex2sympy(cleaned, normalization_config=normalization)
    except (Exception, RecursionError):  # noqa: BLE001 - any grammar error means "not parsable"
        return None
    if not isinstance(expr, (sympy.Basic, sympy.MatrixBase)):
        return None
    try:
        check_complexity(expr)
    except (UnsafeExpression, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - SymPy raising while inspecting an odd tree: treat as unparsable
        return None
    return expr
