"""Answer equivalence: literal match of normalised strings, then structure, then SymPy equality.

``answers_match(pred, gt)`` is the rule-based grader's core. Structures are split at the string level
(matrices, ``\\cup`` unions, intervals and tuples with matching brackets, ``\\{...\\}`` sets and bare
comma lists compared as multisets, ``\\pm`` expanded into two answers); each scalar is compared by its
normalised string, then numerically (relative tolerance 1e-6) or symbolically (random-point evaluation,
then ``simplify``) through the guarded parser in ``safe_parse``; exact rationals compare exactly. Base-n numerals (``52_8``), word
answers and option letters are compared as strings only.
"""

from __future__ import annotations

import math
import re

import sympy

from deepscaler.rewards.math_utils.extract import choice_letter_of, is_choice_ground_truth
from deepscaler.rewards.math_utils.input_guard import active_limits, note_rejection
from deepscaler.rewards.math_utils.normalize import clean_answer, had_percent, match_key
from deepscaler.rewards.math_utils.safe_parse import UnsafeExpression, check_complexity, parse_answer

REL_TOL = 1e-6
ABS_TOL = 1e-9

_BASE_NUMERAL = re.compile(r"\d_\{?\d+\}?(?![\d.])")
_WORD = re.compile(r"^[A-Za-z][A-Za-z ]+[A-Za-z]$")
_INT_FRACTION = re.compile(r"\\frac\{(\d+)\}\{(\d+)\}")
_MATRIX = re.compile(r"^\\begin\{pmatrix\}(.*)\\end\{pmatrix\}$", re.DOTALL)
# Sample points for symbolic comparison: positive, irregular, distinct per symbol.
_SAMPLE_POINTS = (sympy.Rational(7, 10), sympy.Rational(13, 10), sympy.Rational(21, 10), sympy.Rational(29, 10))


def _split_top_level(s: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside any bracket pair (``()[]{}`` in any combination, as intervals mix them)."""
    items, depth, start, i = [], 0, 0, 0
    n = len(s)
    while i < n:
        ch = s[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            items.append(s[start:i].strip())
            i += len(sep)
            start = i
            continue
        i += 1
    items.append(s[start:].strip())
    return items


def _as_bracketed(s: str) -> tuple[str, list[str], str] | None:
    """``(a, b]`` -> ``('(', ['a', 'b'], ']')`` when one bracket pair wraps a comma list, else None."""
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
        return None
    depth = 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and i != len(s) - 1:
                return None
    items = _split_top_level(s[1:-1])
    if len(items) < 2:
        return None
    return s[0], items, s[-1]


def _as_matrix(s: str) -> list[list[str]] | None:
    m = _MATRIX.match(s.strip())
    if not m:
        return None
    rows = [r for r in (row.strip() for row in m.group(1).split("\\\\")) if r]
    return [[c.strip() for c in row.split("&")] for row in rows]


def _expand_pm(item: str) -> list[str]:
    for sign in ("\\pm", "\\mp"):
        if item.count(sign) == 1:
            return [item.replace(sign, "+"), item.replace(sign, "-")]
    return [item]


def _as_list(s: str) -> list[str]:
    """Items of a set ``\\{...\\}`` or a bare comma list (each cleaned, ``\\pm`` expanded)."""
    if s.startswith("\\{") and s.endswith("\\}"):
        s = s[2:-2]
    items = [clean_answer(x) for x in _split_top_level(s) if x.strip()]
    out: list[str] = []
    for item in items:
        out.extend(_expand_pm(item))
    return out


def _unordered_match(preds: list, golds: list, equal) -> bool:
    """Every gold item matched by a distinct predicted item (greedy; lists are short)."""
    if len(preds) != len(golds):
        return False
    remaining = list(preds)
    for g in golds:
        for k, p in enumerate(remaining):
            if equal(p, g):
                del remaining[k]
                break
        else:
            return False
    return True


def _has_unreduced_fraction(s: str) -> bool:
    return any(math.gcd(int(a), int(b)) > 1 for a, b in _INT_FRACTION.findall(s) if int(b) != 0)


def _to_complex(value: sympy.Basic) -> complex | None:
    try:
        c = complex(value)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    if math.isnan(c.real) or math.isnan(c.imag) or math.isinf(c.real) or math.isinf(c.imag):
        return None
    return c


def _close(x: complex, y: complex) -> bool:
    return abs(x - y) <= max(ABS_TOL, REL_TOL * max(abs(x), abs(y)))


def _with_imaginary_unit(expr: sympy.Basic) -> sympy.Basic:
    """Treat a free symbol named ``i`` as the imaginary unit (``6 - 5i``)."""
    symbols = [s for s in getattr(expr, "free_symbols", ()) if getattr(s, "name", "") == "i"]
    if not symbols:
        return expr
    return expr.xreplace({s: sympy.I for s in symbols})


def _names(expr: sympy.Basic) -> set[str]:
    return {str(s) for s in expr.free_symbols}


def expr_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Numeric (no symbols) or symbolic equality of two guarded SymPy expressions."""
    a, b = _with_imaginary_unit(a), _with_imaginary_unit(b)
    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo, sympy.zoo) or b.has(sympy.oo, -sympy.oo, sympy.zoo):
        return False
    if _names(a) != _names(b):
        return False
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    by_name: dict[str, sympy.Basic] = {}
    for s in symbols:
        by_name.setdefault(str(s), s)
    if not symbols:
        # Exact values (no floats anywhere) compare exactly: 343943886 is not 2021*505*337.
        if not a.has(sympy.Float) and not b.has(sympy.Float):
            ea, eb = a.doit(), b.doit()
            if isinstance(ea, sympy.Rational) and isinstance(eb, sympy.Rational):
                return ea == eb
        va, vb = _to_complex(sympy.N(a, 30)), _to_complex(sympy.N(b, 30))
        return va is not None and vb is not None and _close(va, vb)
    undecided = False
    for k, base in enumerate(_SAMPLE_POINTS):
        subs = {s: base + sympy.Rational(37 * (j + 1), 100) * (k + 1) for j, s in enumerate(symbols)}
        va = _to_complex(sympy.N(a.xreplace(subs), 20))
        vb = _to_complex(sympy.N(b.xreplace(subs), 20))
        if va is None or vb is None:
            undecided = True
            continue
        if not _close(va, vb):
            return False
    if not undecided:
        return True
    diff = a - b
    try:
        check_complexity(diff)
    except UnsafeExpression:
        return False
    # simplify() is the one step whose cost grows fast with size; larger differences are not equal.
    if sum(1 for _ in sympy.preorder_traversal(diff)) > active_limits().max_simplify_nodes:
        note_rejection("difference too large to simplify")
        return False
    return sympy.simplify(diff) == 0


def _relation_parts(rel: sympy.Basic) -> tuple[str, sympy.Basic, sympy.Basic]:
    """Canonical (op, small side, big side) so ``k >= 2`` and ``2 <= k`` compare equal."""
    if isinstance(rel, (sympy.GreaterThan, sympy.StrictGreaterThan)):
        op = ">=" if isinstance(rel, sympy.GreaterThan) else ">"
        return op, rel.lhs, rel.rhs
    if isinstance(rel, (sympy.LessThan, sympy.StrictLessThan)):
        op = ">=" if isinstance(rel, sympy.LessThan) else ">"
        return op, rel.rhs, rel.lhs
    return type(rel).__name__, rel.lhs, rel.rhs


def objects_equal(a, b) -> bool:
    """Structural equality of parsed answers (matrices, tuples, sets, intervals, relations, exprs)."""
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        if not (isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase)) or a.shape != b.shape:
            return False
        return all(objects_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, sympy.Tuple) or isinstance(b, sympy.Tuple):
        return (
            isinstance(a, sympy.Tuple)
            and isinstance(b, sympy.Tuple)
            and len(a) == len(b)
            and all(objects_equal(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, sympy.FiniteSet) or isinstance(b, sympy.FiniteSet):
        return (
            isinstance(a, sympy.FiniteSet)
            and isinstance(b, sympy.FiniteSet)
            and _unordered_match(list(a.args), list(b.args), objects_equal)
        )
    if isinstance(a, sympy.Interval) or isinstance(b, sympy.Interval):
        return (
            isinstance(a, sympy.Interval)
            and isinstance(b, sympy.Interval)
            and a.left_open == b.left_open
            and a.right_open == b.right_open
            and objects_equal(a.start, b.start)
            and objects_equal(a.end, b.end)
        )
    if isinstance(a, sympy.Union) or isinstance(b, sympy.Union):
        return (
            isinstance(a, sympy.Union)
            and isinstance(b, sympy.Union)
            and _unordered_match(list(a.args), list(b.args), objects_equal)
        )
    if isinstance(a, sympy.Equality) and isinstance(b, sympy.Equality):
        da, db = a.lhs - a.rhs, b.lhs - b.rhs
        return expr_equal(da, db) or expr_equal(da, -db)
    if isinstance(a, sympy.Rel) or isinstance(b, sympy.Rel):
        if not (isinstance(a, sympy.Rel) and isinstance(b, sympy.Rel)):
            return False
        op_a, lo_a, hi_a = _relation_parts(a)
        op_b, lo_b, hi_b = _relation_parts(b)
        return op_a == op_b and objects_equal(lo_a, lo_b) and objects_equal(hi_a, hi_b)
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        if a.has(sympy.oo, -sympy.oo) or b.has(sympy.oo, -sympy.oo):
            return a == b
        return expr_equal(a, b)
    return a == b


def _scalar_equal(p: str, g: str) -> bool:
    if match_key(p) == match_key(g):
        return True
    if _BASE_NUMERAL.search(p) or _BASE_NUMERAL.search(g):
        return False
    if _WORD.match(g) or _WORD.match(p):
        return match_key(p).lower() == match_key(g).lower()
    # MATH asks for fractions in lowest terms; an unreduced one is only right if written identically.
    if _has_unreduced_fraction(p) and not _has_unreduced_fraction(g):
        return False
    a, b = parse_answer(p), parse_answer(g)
    if a is None or b is None:
        return False
    try:
        return objects_equal(a, b)
    except (UnsafeExpression, RecursionError):
        return False
    except Exception:  # noqa: BLE001 - SymPy internals raising on odd objects mean "not provably equal"
        return False


def _structured_equal(p: str, g: str) -> bool:
    if match_key(p) == match_key(g):
        return True
    g_matrix = _as_matrix(g)
    if g_matrix is not None:
        p_matrix = _as_matrix(p)
        if p_matrix is None or [len(r) for r in p_matrix] != [len(r) for r in g_matrix]:
            return False
        return all(
            _scalar_equal(clean_answer(x), clean_answer(y))
            for pr, gr in zip(p_matrix, g_matrix)
            for x, y in zip(pr, gr)
        )
    g_union = _split_top_level(g, "\\cup")
    if len(g_union) > 1:
        p_union = _split_top_level(p, "\\cup")
        return _unordered_match(p_union, g_union, _structured_equal)
    g_bracketed = _as_bracketed(g)
    p_bracketed = _as_bracketed(p)
    if g_bracketed is not None or p_bracketed is not None:
        if g_bracketed is None or p_bracketed is None:
            return False
        (po, pitems, pc), (go, gitems, gc) = p_bracketed, g_bracketed
        return (
            (po, pc) == (go, gc)
            and len(pitems) == len(gitems)
            and all(_structured_equal(clean_answer(x), clean_answer(y)) for x, y in zip(pitems, gitems))
        )
    g_items, p_items = _as_list(g), _as_list(p)
    if len(g_items) > 1 or len(p_items) > 1:
        return _unordered_match(p_items, g_items, _structured_equal)
    return _scalar_equal(p, g)


def _percent_equal(p: str, g: str, scale: sympy.Rational) -> bool:
    a, b = parse_answer(p), parse_answer(g)
    if not isinstance(a, sympy.Expr) or not isinstance(b, sympy.Expr):
        return False
    return expr_equal(a, b * scale)


def answers_match(pred: str | None, ground_truth: str) -> bool:
    """True when an extracted answer equals the ground truth under the rule-based grader."""
    if pred is None:
        return False
    pred, ground_truth = str(pred), str(ground_truth)
    if not pred.strip():
        return False
    if is_choice_ground_truth(ground_truth):
        return choice_letter_of(pred) == choice_letter_of(ground_truth)
    p, g = clean_answer(pred), clean_answer(ground_truth)
    if not p:
        return False
    if _structured_equal(p, g):
        return True
    # "62.5%" vs "0.625": accept the other reading of a percentage, in either direction.
    if had_percent(ground_truth) and not had_percent(pred):
        return _percent_equal(p, g, sympy.Rational(1, 100))
    if had_percent(pred) and not had_percent(ground_truth):
        return _percent_equal(g, p, sympy.Rational(1, 100))
    return False
