"""Pre-parse guard: limits on what a grader may hand to a parser, checked on the raw string first.

Parsing is where graders lose their time: latex2sympy's ANTLR parser is super-linear in bracket depth
(cold, ``{`` nested 16 deep took 16 s here; 24 took minutes), and SymPy evaluates ``9^{9^{9^{9}}}`` or
``(10^7)!`` in C without ever returning to Python. So every string goes through ``check_expression``
before latex2sympy, math-verify's ``parse_expr`` or ``Number`` see it, and every parsed tree through
``check_tree`` (``safe_parse.check_complexity``) before anything is evaluated or compared. A string
beyond a limit is *unparseable*: the grader gives it 0 and counts it as a parse failure.

The string check is one linear pass over a bounded string (a tokenizer regex with no backtracking),
tracking: length, token count (a proxy for tree size), bracket depth per kind and overall, ``\\frac`` /
``\\sqrt`` nesting, exponent-tower height, digits per numeric literal (Unicode digits included, so
full-width or Arabic-Indic numerals count too), literal factorial arguments and ``\\boxed`` count.
Limits live in ``GuardLimits``; ``limits_scope`` makes a set of limits the active one for the calling
thread (math-verify calls our wrappers without arguments, so they read it from there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading


@dataclasses.dataclass(frozen=True)
class GuardLimits:
    """Limits of one grading call. Defaults keep every measured worst case well under 1 s on one core.

    Attributes:
        time_budget_s: CPU-time budget of one grading call, counted in the grading thread
            (``deadline.run_with_budget``; a wall-clock backstop of max(60 s, 20x) stops a call that
            waits without computing); the guards keep real work far below it, the budget is the second
            line for what they miss. CPU time, so a loaded machine never turns a verdict into a timeout.
        max_text_chars: the tail of a response math-verify reads. Its extraction regexes backtrack
            quadratically on some inputs, in C where no timer can stop them: 16,000 characters of
            ``\\[`` take ~3.5 s, of ``1+1+...1}`` 2.3 s; 100,000 of ``1 `` ~35 s. A last ``\\boxed{}``
            before the tail is put in front of it, so the boxed answer math-verify picks is unchanged.
        max_boxed: ``\\boxed``/``\\fbox`` commands allowed in that tail; more is degenerate output.
        max_chars: length of one expression handed to a parser.
        max_tokens: tokens (commands, numbers, letters, symbols) of one expression.
        max_depth: bracket depth, all kinds together (``() [] {} \\{\\} \\left\\right``).
        max_depth_per_kind: bracket depth of one kind.
        max_frac_depth / max_sqrt_depth: nesting of ``\\frac``-like / ``\\sqrt`` arguments.
        max_power_height: height of an exponent tower (``a^{b^{c}}`` and ``a^b^c`` are 3; ``x^2y^2z^2``
            is three towers of height 2).
        max_literal_digits: digits of one numeric literal.
        max_factorial_arg: largest literal ``n!``.
        max_tree_nodes: nodes of a parsed tree.
        max_numeric_exponent / max_result_digits / max_symbolic_exponent / max_factorial_value: evaluated
            sizes checked on parsed trees (``safe_parse.check_complexity``).
        max_simplify_nodes: largest difference tree handed to ``sympy.simplify`` by the rule grader.
    """

    time_budget_s: float = 3.0
    max_text_chars: int = 4_000
    max_boxed: int = 64
    max_chars: int = 2_000
    max_tokens: int = 600
    max_depth: int = 12
    max_depth_per_kind: int = 8
    max_frac_depth: int = 6
    max_sqrt_depth: int = 6
    max_power_height: int = 3
    max_literal_digits: int = 400
    max_factorial_arg: int = 2_000
    max_tree_nodes: int = 1_500
    max_numeric_exponent: int = 10_000
    max_result_digits: int = 50_000
    max_symbolic_exponent: int = 64
    max_factorial_value: int = 2_000
    max_simplify_nodes: int = 300

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GuardLimits.{field.name} must be a positive number, got {value!r}")


DEFAULT_LIMITS = GuardLimits()

_local = threading.local()
_default = [DEFAULT_LIMITS]


class UnparseableInput(ValueError):
    """The input exceeds a guard limit; it is graded as unparseable and never evaluated."""


def set_default_limits(limits: GuardLimits) -> None:
    """Process-wide limits used when no ``limits_scope`` is active in the calling thread."""
    if not isinstance(limits, GuardLimits):
        raise TypeError(f"expected GuardLimits, got {type(limits).__name__}")
    _default[0] = limits


def active_limits() -> GuardLimits:
    return getattr(_local, "limits", None) or _default[0]


@contextlib.contextmanager
def limits_scope(limits: GuardLimits | None):
    """Make ``limits`` (None: keep the current ones) active in this thread for the ``with`` body."""
    previous = getattr(_local, "limits", None)
    _local.limits = limits or previous
    try:
        yield active_limits()
    finally:
        _local.limits = previous


# One token: a command, an escaped symbol, a run of (Unicode) digits, ``**``, or any other character.
# Every alternative is a fixed-length or possessive-like single run, so matching is linear.
_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\d+|\*\*|\S", re.DOTALL)
_FRAC_COMMANDS = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac", "\\binom", "\\dbinom", "\\tbinom"})
_BOX_COMMANDS = frozenset({"\\boxed", "\\fbox"})
_OPENERS = {"(": "(", "[": "[", "{": "{", "\\{": "\\{", "\\lbrace": "\\{", "\\langle": "\\langle"}
_CLOSERS = {")": "(", "]": "[", "}": "{", "\\}": "\\{", "\\rbrace": "\\{", "\\rangle": "\\langle"}
# Tokens that end an exponent chain at the current level (``2^3 + 4^5`` is two towers of height 2).
_CHAIN_BREAKS = frozenset(
    {
        "+",
        "-",
        "=",
        ",",
        ";",
        "<",
        ">",
        "\\cdot",
        "\\times",
        "\\div",
        "/",
        "*",
        "&",
        "\\le",
        "\\leq",
        "\\ge",
        "\\geq",
        "\\neq",
        "\\pm",
        "\\mp",
        "\\quad",
        "\\\\",
    }
)


@dataclasses.dataclass
class _Frame:
    kind: str | None
    tag: str | None = None
    pending: list = dataclasses.field(default_factory=list)
    base: int = 0  # exponent-chain height inherited from enclosing exponents
    caret_run: int = 0  # carets of the chain running at this level
    after_exponent: bool = False  # an exponent just ended: a following ^ continues the chain


def check_expression(s: str, limits: GuardLimits | None = None) -> str | None:
    """Why ``s`` must not be parsed (one short reason), or None when it is within every limit."""
    limits = limits or active_limits()
    if len(s) > limits.max_chars:
        return f"expression longer than {limits.max_chars} characters"
    frames = [_Frame(None)]
    per_kind: dict[str, int] = {}
    depth = tags_frac = tags_sqrt = 0
    max_carets = limits.max_power_height - 1
    tokens = boxes = 0
    previous = ""
    left_pending = False
    for match in _TOKEN.finditer(s):
        tok = match.group(0)
        tokens += 1
        if tokens > limits.max_tokens:
            return f"more than {limits.max_tokens} tokens"
        frame = frames[-1]
        if left_pending:
            # The delimiter after \left / \right belongs to that command, not to a bracket kind.
            left_pending = False
            previous = tok
            continue
        if frame.after_exponent and tok not in ("^", "**"):
            frame.after_exponent, frame.caret_run = False, 0
        if tok[0].isdecimal():
            if len(tok) > limits.max_literal_digits:
                return f"numeric literal with more than {limits.max_literal_digits} digits"
        elif tok == "!" and previous[:1].isdecimal():
            if len(previous) > 6 or int(previous) > limits.max_factorial_arg:
                return f"factorial of a literal above {limits.max_factorial_arg}"
        if tok in _BOX_COMMANDS:
            boxes += 1
            if boxes > limits.max_boxed:
                return f"more than {limits.max_boxed} boxes"
        opener = _OPENERS.get(tok)
        if tok == "\\left":
            opener, left_pending = "\\left", True
        if opener is not None:
            tag = None
            if opener == "{" and frame.pending:
                tag = frame.pending.pop(0)
            # Brackets inside an exponent continue its chain: 2^{(3^{4})}.
            new = _Frame(opener, tag, base=frame.base + (frame.caret_run if tag == "pow" else 0))
            if tag == "frac":
                tags_frac += 1
            elif tag == "sqrt":
                tags_sqrt += 1
            frames.append(new)
            depth += 1
            per_kind[opener] = per_kind.get(opener, 0) + 1
            if depth > limits.max_depth:
                return f"brackets nested deeper than {limits.max_depth}"
            if per_kind[opener] > limits.max_depth_per_kind:
                return f"'{opener}' nested deeper than {limits.max_depth_per_kind}"
            if tags_frac > limits.max_frac_depth:
                return f"fractions nested deeper than {limits.max_frac_depth}"
            if tags_sqrt > limits.max_sqrt_depth:
                return f"roots nested deeper than {limits.max_sqrt_depth}"
            previous = tok
            continue
        closer = _CLOSERS.get(tok)
        if tok == "\\right":
            closer, left_pending = "\\left", True
        if closer is not None:
            # Pop to the matching opener; an unmatched closer is ignored (the parser will reject it).
            for k in range(len(frames) - 1, 0, -1):
                if frames[k].kind == closer:
                    matched = frames[k]
                    for popped in frames[k:]:
                        depth -= 1
                        per_kind[popped.kind] -= 1
                        tags_frac -= popped.tag == "frac"
                        tags_sqrt -= popped.tag == "sqrt"
                    del frames[k:]
                    if matched.tag == "pow":
                        frames[-1].after_exponent = True
                    break
            previous = tok
            continue
        if tok in _FRAC_COMMANDS:
            frame.pending = ["frac", "frac"]
        elif tok == "\\sqrt":
            frame.pending = ["sqrt"]
        elif tok in ("^", "**"):
            frame.caret_run += 1
            frame.after_exponent = False
            frame.pending = ["pow"]
            if frame.base + frame.caret_run > max_carets:
                return f"exponent tower higher than {limits.max_power_height}"
        elif tok in _CHAIN_BREAKS:
            frame.caret_run = 0
            frame.pending = []
        elif frame.pending and tok not in ("_", "[", "]"):
            # A one-token argument (\frac12, 2^3): consumes one pending slot without nesting.
            if frame.pending.pop(0) == "pow":
                frame.after_exponent = True
        previous = tok
    return None


def check_text(text: str, limits: GuardLimits | None = None) -> str | None:
    """Whole-response screen (C-speed string scans only): why ``text`` is not gradable, or None.

    ``text`` is the part a grader reads (already cut to ``max_text_chars``).
    """
    limits = limits or active_limits()
    boxes = text.count("\\boxed") + text.count("\\fbox")
    if boxes > limits.max_boxed:
        return f"more than {limits.max_boxed} boxes"
    return None


def note_rejection(reason: str) -> None:
    """Record that a guard refused an input in this thread (read back with ``rejections``)."""
    _local.rejections = getattr(_local, "rejections", 0) + 1
    _local.last_reason = reason


def rejections() -> tuple[int, str | None]:
    """(guard rejections so far in this thread, the last reason); compare counts before/after a call."""
    return getattr(_local, "rejections", 0), getattr(_local, "last_reason", None)
