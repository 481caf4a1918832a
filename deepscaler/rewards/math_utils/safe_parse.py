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

from deepscaler.rewards.math_utils.deadline import check_deadline
from deepscaler.rewards.math_utils.input_guard import (
    GuardLimits,
    active_limits,
    check_expression,
    note_rejection,
)

MAX_PARSE_CHARS = 400
MAX_FREE_SYMBOLS = 8
# Size limits of parsed trees come from ``input_guard.GuardLimits`` (the active limits of the thread):
# node count, largest |exponent| on a numeric base and result size in decimal digits, largest
# |exponent| on a base with free symbols (expand() cost grows with it), largest factorial argument.


class UnsafeExpression(ValueError):
    """The expression is too large to evaluate within the grading time budget."""


def _number_value(expr: sympy.Basic, limits: GuardLimits) -> float | None:
    """Float value of a small numeric subtree, or None when it is not a plain number."""
    if isinstance(expr, (sympy.Integer, sympy.Rational, sympy.Float)):
        try:
            return float(expr)
        except OverflowError:
            return math.inf
    if expr.is_number and expr.free_symbols == set():
        check_complexity(expr, limits)
        try:
            value = complex(sympy.N(expr, 15))
        except (TypeError, ValueError, OverflowError, ZeroDivisionError):
            return None
        return value.real if abs(value.imag) < 1e-12 else None
    return None


def check_complexity(expr: sympy.Basic, limits: GuardLimits | None = None) -> None:
    """Raise UnsafeExpression when evaluating ``expr`` could take unbounded time or memory.

    Checked on the unevaluated tree, before any ``doit``/``N``/``simplify``: node count, literal
    sizes, numeric powers (exponent and result digits), symbolic exponents, factorial/binomial
    arguments, sum/product ranges, free-symbol count.
    """
    limits = limits or active_limits()
    MAX_TREE_NODES = limits.max_tree_nodes
    MAX_RESULT_DIGITS = limits.max_result_digits
    MAX_NUMERIC_EXPONENT = limits.max_numeric_exponent
    MAX_SYMBOLIC_EXPONENT = limits.max_symbolic_exponent
    MAX_FACTORIAL_ARG = limits.max_factorial_value
    if isinstance(expr, sympy.MatrixBase):
        if expr.rows * expr.cols > MAX_TREE_NODES:
            raise UnsafeExpression("matrix too large")
        for entry in expr:
            check_complexity(entry, limits)
        return
    if not isinstance(expr, sympy.Basic):
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
            exp_value = _number_value(exp, limits)
            if exp_value is None:
                continue
            if base.free_symbols:
                if abs(exp_value) > MAX_SYMBOLIC_EXPONENT:
                    raise UnsafeExpression(f"symbolic power with exponent {exp_value:g}")
                # expand()/simplify() multiply it out: (a+b+c+d+e)^20 has C(24, 4) = 10,626 terms.
                if isinstance(base, sympy.Add) and abs(exp_value) >= 2:
                    n, k = int(abs(exp_value)), len(base.args)
                    if math.comb(n + k - 1, k - 1) > MAX_TREE_NODES:
                        raise UnsafeExpression("symbolic power with too many expanded terms")
                continue
            if abs(exp_value) > MAX_NUMERIC_EXPONENT:
                raise UnsafeExpression(f"numeric power with exponent {exp_value:g}")
            base_value = _number_value(base, limits)
            if base_value is not None and base_value not in (0.0,):
                digits = abs(exp_value) * math.log10(max(abs(base_value), 1.0) + 1.0)
                if digits > MAX_RESULT_DIGITS:
                    raise UnsafeExpression("power result too large")
        elif isinstance(node, (sympy.exp, sympy.sinh, sympy.cosh)):
            # exp(exp(exp(100))) is a power tower too; mpmath would evaluate it in C.
            arg_value = _number_value(node.args[0], limits)
            if arg_value is not None and not abs(arg_value) <= MAX_RESULT_DIGITS * 2.31:
                raise UnsafeExpression("exponential of a huge argument")
        elif isinstance(node, (sympy.factorial, sympy.factorial2, sympy.gamma)):
            arg_value = _number_value(node.args[0], limits)
            if arg_value is not None and abs(arg_value) > MAX_FACTORIAL_ARG:
                raise UnsafeExpression("factorial argument too large")
        elif isinstance(node, sympy.binomial):
            arg_value = _number_value(node.args[0], limits)
            if arg_value is not None and abs(arg_value) > 10**6:
                raise UnsafeExpression("binomial argument too large")
        elif isinstance(node, (sympy.Integral, sympy.Limit)):
            # doit() may search for minutes (\int e^{x^2}\sin(x^3) dx took 7 s); no benchmark answer has one.
            raise UnsafeExpression("integrals and limits are not evaluated")
        elif isinstance(node, (sympy.Sum, sympy.Product)):
            # doit() iterates a numeric range it has no closed form for (\prod_{i=1}^{10^7} i).
            for bounds in node.limits:
                if len(bounds) == 3:
                    low, high = _number_value(bounds[1], limits), _number_value(bounds[2], limits)
                    if low is not None and high is not None and not abs(high - low) <= MAX_FACTORIAL_ARG:
                        raise UnsafeExpression("sum/product range too large")
    if len(getattr(expr, "free_symbols", ())) > MAX_FREE_SYMBOLS:
        raise UnsafeExpression("too many free symbols")


def _latex2sympy():
    # Imported lazily: the ANTLR runtime costs ~0.5 s and workers that never parse skip it.
    from latex2sympy2_extended import NormalizationConfig, latex2sympy

    return latex2sympy, NormalizationConfig(
        basic_latex=True, units=True, malformed_operators=True, nits=True, boxed="none", equations=False
    )


def parse_answer(cleaned: str) -> sympy.Basic | None:
    """SymPy object for a cleaned answer, or None when it is unparsable or fails a guard.

    A guard rejection is recorded (``input_guard.note_rejection``) so the grader can count it as an
    unparseable answer. Results are cached per worker and per limits: a GRPO group grades n responses
    against the same ground truth.
    """
    if not cleaned:
        return None
    limits = active_limits()
    reason = "expression longer than 400 characters" if len(cleaned) > MAX_PARSE_CHARS else None
    reason = reason or check_expression(cleaned, limits)
    if reason is not None:
        note_rejection(reason)
        return None
    expr = _parse_checked(cleaned, limits)
    if expr is _REJECTED:
        note_rejection("parsed tree beyond the size limits")
        return None
    return expr


_REJECTED = object()


@lru_cache(maxsize=4096)
def _parse_checked(cleaned: str, limits: GuardLimits):
    check_deadline()
    latex2sympy, normalization = _latex2sympy()
    try:
        expr = latex2sympy(cleaned, normalization_config=normalization)
    except (Exception, RecursionError):  # noqa: BLE001 - any grammar error means "not parsable"
        return None
    if not isinstance(expr, (sympy.Basic, sympy.MatrixBase)):
        return None
    try:
        check_complexity(expr, limits)
    except (UnsafeExpression, RecursionError):
        return _REJECTED
    except Exception:  # noqa: BLE001 - SymPy raising while inspecting an odd tree: treat as unparsable
        return None
    return expr
