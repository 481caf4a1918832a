"""LUFFY's rule grader (deepscaler ``grade_answer_mathd`` OR ``grade_answer_sympy``), rewritten safely.

Verdicts follow LUFFY's code (tests/deepscaler/rewards/test_luffy_grader_agreement.py compares them on
thousands of answers), with one change of means, not of result: where LUFFY hands the normalised answer
to SymPy's ``parse_expr`` (Python ``eval`` of model text), this module reads it with ``parse_plain``, a
small parser that builds SymPy objects from numbers, names and ``+ - * / ^ ! ( )`` itself, with the
same implicit multiplication and name splitting as ``parse_expr``'s transformations, and nothing else
(no attribute access, no calls other than a fixed list of SymPy functions). Trees are size-checked
(``safe_parse.check_complexity``) before ``simplify``, and the caller's deadline applies.

- ``luffy_boxed_answer(text)``: the last ``\\boxed`` (else ``\\fbox``) group, then LUFFY's unboxing,
  which only accepts ``\\boxed{...}``: an ``\\fbox`` answer, or ``\\boxed 5``, is no answer.
- ``luffy_answers_match(given, ground_truth, oat=False)``: mathd normalised strings equal, or the
  sympy rule: equal normalised strings, else tuples of equal length with the same brackets whose
  items are equal (unreduced fractions must match as written, an integer only matches an integer
  written as one, otherwise ``simplify(gt - given) == 0``).
"""

from __future__ import annotations

import re

import sympy

from deepscaler.rewards.math_utils.deadline import check_deadline
from deepscaler.rewards.math_utils.input_guard import check_expression, note_rejection
from deepscaler.rewards.math_utils.luffy_normalize import (
    mathd_normalize,
    str_is_int,
    strip_thousands_commas,
    sympy_normalize,
)
from deepscaler.rewards.math_utils.safe_parse import UnsafeExpression, check_complexity

_TUPLE_CHARS = "()[]"
_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_REGEXES = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_FRAC = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
MAX_PLAIN_CHARS = 400


def luffy_boxed_answer(text: str) -> str | None:
    """LUFFY's ``extract_answer``: the last boxed group's content, None when there is none."""
    if "\\boxed" not in text:
        return None
    idx = text.rfind("\\boxed")
    depth = 0
    for i in range(idx, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                group = text[idx : i + 1]
                return group[len("\\boxed{") : -1] if group.startswith("\\boxed{") else None
    return None


# --- a parser for the plain text of grade_answer_sympy (parse_expr's grammar, without eval) ------------

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[^\W\d]\w*)|(?P<op>\*\*|[-+*/()!,=.]))"
)
_FUNCTIONS = {
    "sqrt": sympy.sqrt,
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "log": sympy.log,
    "ln": sympy.log,
    "exp": sympy.exp,
    "abs": sympy.Abs,
    "asin": sympy.asin,
    "acos": sympy.acos,
    "atan": sympy.atan,
    "sinh": sympy.sinh,
    "cosh": sympy.cosh,
    "tanh": sympy.tanh,
    "factorial": sympy.factorial,
    "floor": sympy.floor,
    "ceiling": sympy.ceiling,
    "cot": sympy.cot,
    "sec": sympy.sec,
    "csc": sympy.csc,
}
_CONSTANTS = {"pi": sympy.pi, "E": sympy.E, "I": sympy.I, "oo": sympy.oo, "nan": sympy.nan, "zoo": sympy.zoo}


class _NotParsed(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise _NotParsed(f"unexpected character at {pos}")
        pos = m.end()
        kind = m.lastgroup
        value = m.group(kind)
        if (
            kind == "num"
            and len(value) > 1
            and value[0] == "0"
            and value[1].isdigit()
            and "." not in value
            and "e" not in value.lower()
        ):
            raise _NotParsed("leading zeros")  # Python rejects 023 as a literal, and so does parse_expr
        if kind == "name":
            out.extend(_split_name(value))
        else:
            out.append((kind, value))
    return out


def _split_name(name: str) -> list[tuple[str, str]]:
    """``parse_expr``'s split_symbols: an unknown multi-letter name is a product of one-letter symbols."""
    if name in _FUNCTIONS or name in _CONSTANTS or "_" in name or len(name) == 1:
        return [("name", name)]
    parts: list[tuple[str, str]] = []
    for ch in name:
        parts.append(("num", ch) if ch.isdigit() else ("name", ch))
    return parts


class _Reader:
    def __init__(self, tokens):
        self.t, self.i = tokens, 0

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else (None, None)

    def take(self, value=None):
        tok = self.peek()
        if tok[0] is None or (value is not None and tok[1] != value):
            raise _NotParsed(f"expected {value!r}")
        self.i += 1
        return tok

    def expr(self):
        value = self.term()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def _starts_atom(self):
        kind, value = self.peek()
        return kind in ("num", "name") or value == "("

    def term(self):
        value = self.unary()
        while True:
            op = self.peek()[1]
            if op in ("*", "/"):
                self.take()
                rhs = self.unary()
                value = value * rhs if op == "*" else value / rhs
            elif self._starts_atom():  # implicit multiplication: 3x, 2(x+1), 3sqrt(2)
                value = value * self.power()
            else:
                return value

    def unary(self):
        if self.peek()[1] == "-":
            self.take()
            return -self.unary()
        if self.peek()[1] == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self):
        base = self.postfix()
        if self.peek()[1] == "**":
            self.take()
            check_deadline()
            exponent = self.unary()
            check_complexity(sympy.Pow(base, exponent, evaluate=False))
            return base**exponent
        return base

    def postfix(self):
        value = self.atom()
        while self.peek()[1] == "!":
            self.take()
            check_complexity(sympy.factorial(value, evaluate=False))
            value = sympy.factorial(value)
        return value

    def atom(self):
        kind, value = self.take()
        if kind == "num":
            return sympy.Float(value) if any(c in value for c in ".eE") else sympy.Integer(int(value))
        if kind == "name":
            if value in _FUNCTIONS:
                if self.peek()[1] == "(":
                    self.take("(")
                    arg = self.expr()
                    self.take(")")
                else:  # implicit application: sqrt 2
                    arg = self.power()
                check_complexity(arg)
                return _FUNCTIONS[value](arg)
            if value in _CONSTANTS:
                return _CONSTANTS[value]
            return sympy.Symbol(value)
        if value == "(":
            inner = self.expr()
            self.take(")")
            return inner
        raise _NotParsed(f"unexpected {value!r}")


def parse_plain(text: str) -> sympy.Basic:
    """SymPy value of a plain arithmetic string (``grade_answer_sympy``'s input); raises ValueError if unreadable."""
    if len(text) > MAX_PLAIN_CHARS:
        raise _NotParsed("too long")
    reader = _Reader(_tokens(text.replace("^", "**")))
    value = reader.expr()
    if reader.peek()[0] is not None:
        raise _NotParsed("trailing input")
    return value


def _unknown_letters(expr: str) -> int:
    return len({ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()})


def _may_evaluate(expr: str) -> bool:
    if _unknown_letters(expr) > 2 or any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    return not any(pattern.search(expr) for pattern in _BAD_REGEXES)


def _equal_under_sympy(gt: str, given: str) -> bool:
    expr = f"({gt})-({given})"
    if not _may_evaluate(expr):
        return False
    try:
        diff = parse_plain(expr)
        check_complexity(diff)
        check_deadline()
        return sympy.simplify(diff) == 0
    except (UnsafeExpression, RecursionError) as exc:  # beyond the size limits: flagged, never evaluated
        note_rejection(f"parsed tree: {exc}")
        return False
    except (ValueError, TypeError, ArithmeticError, AttributeError):  # what parse_expr/SymPy raise on junk
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = strip_thousands_commas(expr)
    if not expr:
        return []
    if (
        len(expr) > 2
        and expr[0] in _TUPLE_CHARS
        and expr[-1] in _TUPLE_CHARS
        and all(ch not in expr[1:-1] for ch in _TUPLE_CHARS)
    ):
        return [item.strip() for item in expr[1:-1].split(",")]
    return [expr]


def sympy_rule_match(given: str, ground_truth: str) -> bool:
    """LUFFY's ``grade_answer_sympy``."""
    gt_norm, given_norm = sympy_normalize(ground_truth), sympy_normalize(given)
    if gt_norm is None:
        return False
    if gt_norm == given_norm:
        return True
    if not given_norm:
        return False
    gt_items, given_items = _split_tuple(gt_norm), _split_tuple(given_norm)
    if len(gt_items) > 1 and (gt_norm[0] != given_norm[0] or gt_norm[-1] != given_norm[-1]):
        return False
    if len(gt_items) != len(given_items):
        return False
    for gt_item, given_item in zip(gt_items, given_items):
        if _FRAC.search(gt_item) and _FRAC.search(given_item):
            ok = gt_item == given_item  # an unreduced fraction is only right as written
        elif str_is_int(gt_item) != str_is_int(given_item):
            ok = False  # an integer answer needs an integer, no simplification
        else:
            ok = _equal_under_sympy(gt_item, given_item)
        if not ok:
            return False
    return True


def answer_within_limits(answer: str) -> bool:
    """The project's input guard on an extracted answer; a refusal is recorded (``note_rejection``) so the
    bounded scorer flags the item unparseable. LUFFY has no such guard; beyond the limits only its
    string comparisons run (no answer in the agreement set is near them)."""
    reason = check_expression(answer)
    if reason is None:
        return True
    note_rejection(reason)
    return False


def flag_beyond_limits(answer: str) -> None:
    """Record a guard rejection when ``answer`` is beyond the project's limits (input or parsed tree), so a
    wrong answer of that kind is reported unparseable as by the other graders. Verdicts do not change."""
    from deepscaler.rewards.math_utils.normalize import clean_answer
    from deepscaler.rewards.math_utils.safe_parse import parse_answer

    if answer_within_limits(answer):
        parse_answer(clean_answer(answer))


def luffy_answers_match(given: str, ground_truth: str, oat: bool = False) -> bool:
    """``grade_answer_mathd(given, gt) or grade_answer_sympy(given, gt)`` (OAT's mathd with ``oat``).

    An answer beyond the input guard's limits is compared as a mathd-normalised string only."""
    if mathd_normalize(ground_truth, oat) == mathd_normalize(given, oat):
        return True
    if not answer_within_limits(given):
        return False
    return sympy_rule_match(given, ground_truth)
