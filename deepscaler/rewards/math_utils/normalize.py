"""String normalisation of final answers before comparison (MATH/Hendrycks-style, extended).

``clean_answer`` rewrites an answer into a canonical LaTeX-ish string that keeps single spaces
(for the safe parser); ``match_key`` removes the spaces for literal comparison. The rules cover what
the benchmark ground truths contain: ``\\text{}``/``\\mbox{}`` units, ``^\\circ``, ``\\$``, ``\\%``,
``\\left``/``\\right``, ``\\dfrac``, ``\\frac12``, ``\\sqrt3``, thousands separators ``10,\\!080``,
short ``x =`` prefixes, plain-text math (``np.arcsin(10/13)``, ``4.5e33``, ``-1./3``, ``x**2``).
All rules are regex substitutions on bounded input (answers are capped upstream); nothing is evaluated.
"""

from __future__ import annotations

import re

from deepscaler.rewards.math_utils.extract import strip_outer_dollars

# Unit words that may trail a numeric answer in MATH / Minerva ground truths and model outputs.
# Single letters (m, s, g, L) are left out on purpose: Minerva answers such as "\\frac{37}{4} m" use
# them as variables, and dropping a variable would accept a wrong answer.
_UNIT_WORDS = (
    "degrees?|cm|centimeters?|meters?|km|kilometers?|inches|inch|feet|foot|ft|yards?|"
    "miles?|mph|square units|sq units|units?|seconds?|sec|minutes?|min|hours?|hrs?|days?|weeks?|"
    "months?|years?|dollars?|cents?|pounds?|lbs?|ounces?|oz|grams?|kg|liters?|ml|mL|people|students|"
    "points?|ways|percent|calories"
)
_TRAILING_TEXT_UNIT = re.compile(r"(?<=\S)\s*\\(?:text|mbox|mathrm)\s*\{\s*[^{}]*\}(?:\s*\^\s*\{?\d\}?)?\s*$")
_TRAILING_WORD_UNIT = re.compile(rf"(?<=[\d}}])\s+(?:{_UNIT_WORDS})(?:\s*\^\s*\{{?\d\}}?)?\s*$")
_TEXT_UNWRAP = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_SCI_NOTATION = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
_TRAILING_DOT_NUMBER = re.compile(r"(\d)\.(?!\d)")
_LEADING_DOT_NUMBER = re.compile(r"(?<![\d.])\.(\d)")
_BRACED_SUBSCRIPT_NUMBER = re.compile(r"_\{(\d+)\}")
_PLAIN_FUNCS = re.compile(
    r"(?<![\\A-Za-z])(arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc|log|ln|exp)(?=\s*\()"
)
_PLAIN_PI = re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])")
_PLAIN_INF = re.compile(r"(?<![\\A-Za-z])(?:infinity|inf)(?![A-Za-z])")
_SHORT_LHS = re.compile(r"^\s*(?:[A-Za-z](?:_\{?\w+\}?)?|\\[a-zA-Z]+|[A-Za-z]\s*\(\s*[A-Za-z]\s*\))\s*=(?!=)")
_MEMBERSHIP_LHS = re.compile(r"^\s*[A-Za-z]\s*\\in\s*")
_SPACES = re.compile(r"\s+")

_UNICODE = {
    "−": "-",
    "–": "-",
    "×": "\\times ",
    "·": "\\cdot ",
    "÷": "\\div ",
    "π": "\\pi ",
    "∞": "\\infty ",
    "√": "\\sqrt",
    "≤": "\\leq ",
    "≥": "\\geq ",
    "≠": "\\neq ",
    "∪": "\\cup ",
    "∈": "\\in ",
}
_COMMAND_ALIASES = (
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("\\cfrac", "\\frac"),
    ("\\geqslant", "\\geq"),
    ("\\leqslant", "\\leq"),
    ("\\ge ", "\\geq "),
    ("\\le ", "\\leq "),
    ("\\bmatrix", "\\pmatrix"),
    ("{bmatrix}", "{pmatrix}"),
    ("{matrix}", "{pmatrix}"),
    ("{vmatrix}", "{pmatrix}"),
    ("{Bmatrix}", "{pmatrix}"),
    ("\\displaystyle", ""),
    ("\\dots", "\\ldots"),
    ("\\cdots", "\\ldots"),
)


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac 59`` -> ``\\frac{5}{9}``, ``\\frac9{19}``, ``\\frac{270}7``."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        p = part.lstrip(" ")
        if not p:
            out += "\\frac" + part
            continue
        args = []
        rest = p
        for _ in range(2):
            rest = rest.lstrip(" ")
            if not rest:
                break
            if rest[0] == "{":
                depth, j = 0, 0
                while j < len(rest):
                    if rest[j] == "{":
                        depth += 1
                    elif rest[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    j += 1
                args.append(rest[: j + 1])
                rest = rest[j + 1 :]
            elif rest[0] == "\\":
                m = re.match(r"\\[A-Za-z]+", rest)
                args.append("{" + m.group(0) + "}" if m else rest[0])
                rest = rest[len(m.group(0)) if m else 1 :]
            else:
                args.append("{" + rest[0] + "}")
                rest = rest[1:]
        out += "\\frac" + "".join(args) + rest
    return out


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` and ``\\sqrt x`` -> ``\\sqrt{x}`` (one-character radicands)."""
    return re.sub(r"\\sqrt\s*([0-9A-Za-z])", r"\\sqrt{\1}", s)


def _fix_plain_sqrt(s: str) -> str:
    """Plain-text ``sqrt(...)`` (with matched parentheses) -> ``\\sqrt{...}``."""
    out = []
    i = 0
    pattern = re.compile(r"(?<![\\A-Za-z])sqrt\s*\(")
    while True:
        m = pattern.search(s, i)
        if not m:
            out.append(s[i:])
            break
        out.append(s[i : m.start()])
        j = m.end()
        depth = 1
        k = j
        while k < len(s) and depth:
            if s[k] == "(":
                depth += 1
            elif s[k] == ")":
                depth -= 1
            k += 1
        if depth:
            out.append(s[m.start() :])
            break
        out.append("\\sqrt{" + s[j : k - 1] + "}")
        i = k
    return "".join(out)


def _fix_simple_slash_fraction(s: str) -> str:
    """An answer that is exactly ``a/b`` with integers becomes ``\\frac{a}{b}`` (as in MATH's grader)."""
    m = re.fullmatch(r"(-?)(\d+)\s*/\s*(\d+)", s)
    if m:
        return f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    return s


def _strip_units(s: str) -> str:
    for _ in range(2):
        s2 = _TRAILING_TEXT_UNIT.sub("", s)
        s2 = _TRAILING_WORD_UNIT.sub("", s2)
        if s2 == s:
            break
        s = s2
    return s


def drop_short_lhs(s: str) -> str:
    """``x = 5`` -> ``5``; ``f(x)=2x`` -> ``2x``; ``k \\geq 2`` and ``2x+3y=6`` are left alone."""
    m = _MEMBERSHIP_LHS.match(s)
    if m:
        return s[m.end() :].strip()
    m = _SHORT_LHS.match(s)
    if m and s.count("=") == 1 and s[m.end() :].strip():
        return s[m.end() :].strip()
    return s


def clean_answer(answer: str) -> str:
    """Canonical form of one answer string (spaces kept, collapsed to one)."""
    s = strip_outer_dollars(str(answer))
    for k, v in _UNICODE.items():
        s = s.replace(k, v)
    s = s.replace("\n", " ")
    # Thousands separators written with a negative space: "10,\!080", "11,\! 111,\! 100".
    s = re.sub(r",\\!\s*", ",", s)
    for spacing in ("\\!", "\\,", "\\;", "\\:", "\\quad", "\\qquad", "~"):
        s = s.replace(spacing, " ")
    # "\ " is a TeX space, but "\\ " is a matrix row break followed by a space.
    s = re.sub(r"(?<!\\)\\ ", " ", s)
    for old, new in _COMMAND_ALIASES:
        s = s.replace(old, new)
    s = re.sub(r"\\left\s*\.|\\right\s*\.", "", s)
    s = re.sub(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])", "", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\$", "").replace("$", "")
    s = _strip_units(s.strip())
    s = s.replace("\\%", "").replace("%", "")
    # Unwrap remaining \text{...} (answers like \text{Evelyn}); nested wrappers need two passes.
    for _ in range(2):
        s = _TEXT_UNWRAP.sub(r"\1", s)
    s = s.strip().rstrip(".").strip()
    s = _strip_units(s)
    # Plain-text math written by models or found in Minerva ground truths.
    s = re.sub(r"\b(?:np|math|sympy|sp)\.", "", s)
    s = s.replace("**", "^")
    s = _SCI_NOTATION.sub(r"\1\\times 10^{\2}", s)
    s = _TRAILING_DOT_NUMBER.sub(r"\1", s)
    s = _LEADING_DOT_NUMBER.sub(r"0.\1", s)
    s = _fix_plain_sqrt(s)
    s = _PLAIN_FUNCS.sub(r"\\\1", s)
    s = _PLAIN_PI.sub(r"\\pi", s)
    s = _PLAIN_INF.sub(r"\\infty", s)
    s = _BRACED_SUBSCRIPT_NUMBER.sub(r"_\1", s)
    s = _fix_sqrt(_fix_fracs(s))
    s = _SPACES.sub(" ", s).strip()
    s = drop_short_lhs(s)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    s = _fix_simple_slash_fraction(s)
    # Redundant outer braces: "{5}" -> "5".
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _outer_pair(s, "{", "}"):
        s = s[1:-1].strip()
    return s


def _outer_pair(s: str, left: str, right: str) -> bool:
    """True when the bracket at s[0] closes at s[-1] (so the pair wraps the whole string)."""
    depth = 0
    for i, ch in enumerate(s):
        if ch == left:
            depth += 1
        elif ch == right:
            depth -= 1
            if depth == 0:
                return i == len(s) - 1
    return False


def match_key(cleaned: str) -> str:
    """Literal comparison key: the cleaned answer without spaces."""
    return cleaned.replace(" ", "")


def had_percent(answer: str) -> bool:
    return "%" in str(answer) or "percent" in str(answer).lower()
