"""String normalisation of LUFFY's rule graders (deepscaler ``math_utils.utils`` and OAT's grader), rewritten.

Three normalisers, each a pure string function (nothing here parses or evaluates):

- ``mathd_normalize(answer, oat=False)``: the MATH-dataset (Hendrycks) normalisation LUFFY's
  ``grade_answer_mathd`` compares: drop ``\\text{}`` wrapping, line breaks, ``\\!``, ``\\left``/``\\right``,
  degrees, ``\\$``, a right-hand unit after ``\\text{ ``, ``\\%``; ``\\dfrac``/``\\tfrac`` -> ``\\frac``,
  ``\\frac12`` -> ``\\frac{1}{2}``, ``\\sqrt3`` -> ``\\sqrt{3}``, ``a/b`` -> ``\\frac{a}{b}``, ``0.5`` ->
  ``\\frac{1}{2}``, a short ``k =`` prefix dropped, spaces removed. ``oat=True`` adds the OAT grader's extra
  steps (matrix environments, relation macros, a trailing ``\\text{...}`` unit, a list of unit words).
  LUFFY's quirks are kept on purpose (they decide its verdicts): a string its rules cannot handle (two
  ``\\text{ `` units, a bare trailing ``\\sqrt``) comes back as it was given.
- ``sympy_normalize(expr)``: the normalisation of LUFFY's ``grade_answer_sympy``: units and words
  removed, LaTeX turned into plain text (``latex_to_text``), mixed numbers ``7 3/4`` -> ``7+3/4``,
  spaces and braces dropped, lower case, integral floats as integers.
- ``latex_to_text(s)``: LaTeX to plain text in the way LUFFY's grader uses pylatexenc's
  ``latex2text`` (``\\frac{a}{b}`` -> ``a/b`` without parentheses, ``\\sqrt{x}`` -> ``sqrt(x)``, ``\\pi`` ->
  ``pi``, ``\\times``/``\\cdot`` -> ``*``, unknown macros dropped and their arguments kept). pylatexenc is
  not a dependency of this project; this covers the macros that answers use.
"""

from __future__ import annotations

import re

_TEXT_WRAP = re.compile(r"^\\text\{(?P<text>.+?)\}$")

# OAT's unit words (from MathQA), each removed where it stands alone, plus their plurals. OAT uses them as
# regexes as they are (``.`` matches any character), and so do we.
_OAT_UNIT_WORDS = (
    "east|degree|mph|kmph|ft|m sqaure| m east|sq m|deg|mile|q .|monkey|prime|ratio|profit of rs|rd|o|gm|p . m|lb|"
    "tile|per|dm|lt|gain|ab|way|west|a .|b .|c .|d .|e .|f .|g .|h .|t|a|h|no change|men|soldier|pie|bc|excess|st|"
    "inches|noon|percent|by|gal|kmh|c|acre|rise|a . m|th|π r 2|sq|mark|l|toy|coin|sq . m|gallon|° f|profit|minw|yr|"
    "women|feet|am|pm|hr|cu cm|square|v â € ™|are|rupee|rounds|cubic|cc|mtr|s|ohm|number|kmph|day|hour|minute|min|"
    "second|man|woman|sec|cube|mt|sq inch|mp|∏ cm ³|hectare|more|sec|unit|cu . m|cm 2|rs .|rs|kg|g|month|km|m|cm|"
    "mm|apple|liter|loss|yard|pure|year|increase|decrease|d|less|Surface|litre|pi sq m|s .|metre|meter|inch"
).split("|")
OAT_UNITS = tuple(_OAT_UNIT_WORDS + [u + "s" for u in _OAT_UNIT_WORDS])
_OAT_UNIT_RES = tuple(re.compile(r"(^|\W)" + u + r"($|\W)") for u in OAT_UNITS)

# Words and units ``grade_answer_sympy`` strips (an optional plural and power follow each).
_SYMPY_UNITS = (
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
)
_SYMPY_UNIT_RES = tuple(re.compile(unit + r"(es)?(s)? *(\^[0-9]+)?") for unit in _SYMPY_UNITS)


class _Unhandled(Exception):
    """A string LUFFY's Hendrycks normaliser raises on; the caller returns its input unchanged."""


def _fix_fracs(s: str) -> str:
    pieces = s.split("\\frac")
    out = pieces[0]
    for piece in pieces[1:]:
        out += "\\frac"
        if not piece:
            raise _Unhandled("bare \\frac")
        if piece[0] == "{":
            out += piece
            continue
        if len(piece) < 2:
            return s  # too short to be a shorthand fraction: the whole string stays as it was
        a, b, rest = piece[0], piece[1], piece[2:]
        out += "{" + a + "}" + (b + rest if b == "{" else "{" + b + "}" + rest)
    return out


def _fix_a_slash_b(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if s == f"{a}/{b}" else s


def _fix_sqrt(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    pieces = s.split("\\sqrt")
    out = pieces[0]
    for piece in pieces[1:]:
        if not piece:
            raise _Unhandled("bare \\sqrt")
        out += "\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:])
    return out


def _strip_string(s: str, oat: bool) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    if oat:
        s = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", s)
        s = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", s).replace("bmatrix", "pmatrix")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    if oat:
        s = s.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    s = s.replace("\\left", "").replace("\\right", "")
    if oat:
        without_unit = re.sub(r"\\text{.*?}$", "", s).strip()
        if without_unit and without_unit != s:
            s = without_unit
        for _ in range(2):
            for pattern in _OAT_UNIT_RES:
                candidate = pattern.sub(r"\1\2", s)
                if candidate:
                    s = candidate
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise _Unhandled("two \\text{ units")
        s = parts[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def mathd_normalize(answer: str | None, oat: bool = False) -> str | None:
    """LUFFY's ``mathd_normalize_answer`` (deepscaler's, or OAT's with ``oat=True``)."""
    if answer is None:
        return None
    answer = answer.strip()
    m = _TEXT_WRAP.search(answer)
    if m is not None:
        answer = m.group("text").strip()
    try:
        return _strip_string(answer, oat)
    except (_Unhandled, IndexError):
        return answer


# --- LaTeX to plain text -----------------------------------------------------------------------------

_SYMBOLS = {
    "pi": "π",
    "infty": "∞",
    "cup": "∪",
    "cap": "∩",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "neq": "≠",
    "ne": "",
    "cdot": "·",
    "times": "×",
    "pm": "±",
    "mp": "∓",
    "circ": "∘",
    "dots": "…",
    "ldots": "…",
    "cdots": "⋯",
    "approx": "≈",
    "div": "÷",
    "to": "→",
    "emptyset": "∅",
    "varnothing": "∅",
    "mid": "|",
    "in": "∈",
    "prime": "'",
    "angle": "∠",
    "lfloor": "⌊",
    "rfloor": "⌋",
    "lceil": "⌈",
    "rceil": "⌉",
    "quad": "  ",
    "qquad": "    ",
    "triangle": "",
    "lbrace": "{",
    "rbrace": "}",
    "odot": "⊙",
    "sim": "∼",
    "alpha": "α",
    "beta": "β",
    "gamma": "γ",
    "delta": "δ",
    "epsilon": "ϵ",
    "varepsilon": "ε",
    "zeta": "ζ",
    "eta": "η",
    "theta": "θ",
    "iota": "ι",
    "kappa": "κ",
    "lambda": "λ",
    "mu": "μ",
    "nu": "ν",
    "xi": "ξ",
    "rho": "ρ",
    "sigma": "σ",
    "tau": "τ",
    "phi": "ϕ",
    "varphi": "φ",
    "chi": "χ",
    "psi": "ψ",
    "omega": "ω",
    "Gamma": "Γ",
    "Delta": "Δ",
    "Theta": "Θ",
    "Lambda": "Λ",
    "Sigma": "Σ",
    "Phi": "Φ",
    "Omega": "Ω",
    "hbar": "ħ",
    "ell": "ℓ",
    "perp": "⊥",
    "parallel": "∥",
    "cong": "≅",
    "equiv": "≡",
    "neg": "",
    "rightarrow": "→",
    "leftarrow": "←",
    "Rightarrow": "⇒",
    "sqrt": None,
    "frac": None,
}
# The function macros pylatexenc prints by name; others (\\cot, \\sec, \\gcd, \\det ...) it drops.
_NAMED_FUNCTIONS = frozenset("sin cos tan arcsin arccos arctan sinh cosh tanh log ln exp lim max min sup inf".split())
_DROPPED_WITH_ARGS = frozenset(("mbox",))
_SPACE_SYMBOLS = {
    ",": " ",
    ";": " ",
    ":": " ",
    " ": " ",
    "!": "",
    "%": "%",
    "$": "$",
    "{": "{",
    "}": "}",
    "&": "&",
    "#": "#",
    "_": "_",
    "\\": "\n",
}


class _LatexText:
    """A small recursive reader producing the text pylatexenc's ``latex2text`` gives for common macros."""

    def __init__(self, s: str):
        self.s, self.i = s, 0

    def _skip_spaces(self):
        while self.i < len(self.s) and self.s[self.i] in " \t\n":
            self.i += 1

    def _arg(self) -> str:
        """One macro argument: a ``{group}``, a macro, or one character (spaces before it skipped)."""
        self._skip_spaces()
        if self.i >= len(self.s):
            return ""
        ch = self.s[self.i]
        if ch == "{":
            self.i += 1
            return self.read(stop="}")
        if ch == "\\":
            return self._macro()
        self.i += 1
        return ch

    def _macro(self) -> str:
        self.i += 1  # the backslash
        if self.i >= len(self.s):
            return ""
        m = re.match(r"[A-Za-z]+", self.s[self.i :])
        if not m:
            ch = self.s[self.i]
            self.i += 1
            return _SPACE_SYMBOLS.get(ch, ch)
        name = m.group(0)
        self.i += len(name)
        self._skip_spaces()
        if name == "frac":
            num = self._arg()
            return num + "/" + self._arg()
        if name == "sqrt":
            if self.s.startswith("[", self.i):
                close = self.s.find("]", self.i)
                self.i = len(self.s) if close < 0 else close + 1
            return "√(" + self._arg() + ")"
        if name in ("left", "right", "displaystyle", "textstyle", "big", "Big", "bigl", "bigr"):
            return ""
        if name in _DROPPED_WITH_ARGS:
            self._arg()
            return ""
        if name in _SYMBOLS:
            return _SYMBOLS[name]
        if name in _NAMED_FUNCTIONS:
            return name
        return ""  # unknown macro: dropped; a following {group} is read as plain content

    def read(self, stop: str | None = None) -> str:
        out = []
        while self.i < len(self.s):
            ch = self.s[self.i]
            if stop is not None and ch == stop:
                self.i += 1
                break
            if ch == "\\":
                out.append(self._macro())
            elif ch == "{":
                self.i += 1
                out.append(self.read(stop="}"))
            elif ch == "}":
                self.i += 1
            elif ch == "$":
                self.i += 1
            elif ch == "~":
                out.append("\xa0")
                self.i += 1
            else:
                out.append(ch)
                self.i += 1
        return "".join(out)


def latex_to_text(s: str) -> str:
    """LaTeX to plain text the way LUFFY's ``_parse_latex`` sees it (symbols renamed for its parser)."""
    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    text = _LatexText(s).read()
    for before, after in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        text = text.replace(before, after)
    return text.strip()


# --- grade_answer_sympy's normalisation ----------------------------------------------------------------


def is_float_string(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def is_int_value(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (OverflowError, ValueError):
        return False


def strip_thousands_commas(expr: str) -> str:
    pattern = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
    while True:
        stripped = pattern.sub(r"\1\3\4", expr)
        if stripped == expr:
            return stripped
        expr = stripped


def str_is_int(s: str) -> bool:
    try:
        return is_int_value(float(strip_thousands_commas(s)))
    except ValueError:
        return False


def sympy_normalize(expr: str | None) -> str | None:
    """LUFFY's ``_normalize`` (the string both sides of ``grade_answer_sympy`` are compared as)."""
    if expr is None:
        return None
    m = _TEXT_WRAP.search(expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for pattern in _SYMPY_UNIT_RES:
        expr = pattern.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if is_float_string(expr) and is_int_value(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        expr = latex_to_text(expr)
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)  # a mixed number 7 3/4 reads as 7+3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr
