"""math-verify behind the input guards: ``guarded_parse`` and ``guarded_verify`` for any thread.

math-verify extracts candidate answers from a response with its regexes and hands each one to
latex2sympy (LaTeX) or SymPy's ``parse_expr`` (plain digits-and-operators text), rightmost first,
until one parses. We keep that extraction as it is (it defines LUFFY's reward) and put our guard in
front of the two parsers: on first use the names ``latex2sympy`` and ``parse_expr`` inside
``math_verify.parser`` are replaced by wrappers that check the grading deadline and
``input_guard.check_expression`` before calling the original, and raise ``UnparseableInput`` (a
``ValueError``, which math-verify treats as "this candidate does not parse") otherwise. The wrappers
hold no state of their own: limits and deadline come from the calling thread, so concurrent graders
with different limits do not interfere. Other math-verify users in the process get the same guard
with the process-wide default limits, which only turns would-be hangs into parse failures.

Every parsed result is then checked as a tree (``safe_parse.check_complexity``) before ``verify``
evaluates anything. Math-verify's own timeouts stay off (``parsing_timeout=None``,
``timeout_seconds=None``): its SIGALRM timer raises in threads (docs/CPU_STACK.md §6).
"""

from __future__ import annotations

import functools
import logging
import re
import threading

import sympy

from deepscaler.rewards.math_utils.deadline import check_deadline
from deepscaler.rewards.math_utils.extract import last_boxed_content
from deepscaler.rewards.math_utils.input_guard import active_limits, check_expression, check_text, note_rejection
from deepscaler.rewards.math_utils.input_guard import UnparseableInput
from deepscaler.rewards.math_utils.safe_parse import UnsafeExpression, check_complexity

_install_lock = threading.Lock()
_installed = False


def _guarded(parser_fn):
    def guarded(text, *args, **kwargs):
        check_deadline()
        reason = check_expression(str(text))
        if reason is not None:
            note_rejection(reason)
            raise UnparseableInput(reason)
        return parser_fn(text, *args, **kwargs)

    guarded.__wrapped__ = parser_fn
    guarded.__name__ = getattr(parser_fn, "__name__", "guarded")
    return guarded


def install_guards() -> None:
    """Put the guard in front of math-verify's parsers (idempotent, thread-safe)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        import latex2sympy2_extended  # noqa: F401 - imported here, outside any grading deadline
        import math_verify  # noqa: F401
        import math_verify.parser as mv_parser

        # math-verify warns once per process that timeouts are disabled; that is intended here.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        for name in ("latex2sympy", "parse_expr"):
            current = getattr(mv_parser, name)
            if not hasattr(current, "__wrapped__"):
                setattr(mv_parser, name, _guarded(current))
        _installed = True


def tree_ok(value) -> bool:
    """True when a parsed value may be evaluated (strings always may: they are compared as strings)."""
    if not isinstance(value, (sympy.Basic, sympy.MatrixBase)):
        return True
    try:
        check_complexity(value)
    except (UnsafeExpression, RecursionError) as exc:
        note_rejection(f"parsed tree: {exc}")
        return False
    except Exception:  # noqa: BLE001 - SymPy raising while inspecting an odd tree: do not evaluate it
        note_rejection("parsed tree could not be inspected")
        return False
    return True


# The characters of math-verify's plain-expression regex (digits, spaces, + - * × / ^ ( ) ÷ and dots).
# That regex backtracks quadratically inside one long run of them ("1+1+...+1}" of 16,000 characters
# took 2.3 s, in C); any run longer than the cap keeps only its last ``cap`` characters.
_EXPR_RUN = r"[\d.\s+\-*×/^()÷]{%d,}"


@functools.lru_cache(maxsize=8)
def _expression_run(cap: int) -> re.Pattern:
    return re.compile(_EXPR_RUN % (cap + 1))


def _shorten_expression_runs(text: str, cap: int) -> str:
    return _expression_run(cap).sub(lambda m: m.group(0)[-cap:], text)


def guarded_parse(text: str, **parse_kwargs) -> list:
    """``math_verify.parse`` of ``text`` (its tail of ``max_text_chars``, plus the last box) behind the guards.

    ``parse_kwargs`` go to ``parse`` (extraction configs and modes, as LUFFY's OAT grader sets them);
    its timer stays off. Returns [] when nothing parses or a result fails the tree check (a guard
    rejection is recorded).
    """
    from math_verify import parse

    install_guards()
    limits = active_limits()
    if len(text) > limits.max_text_chars:
        tail = text[-limits.max_text_chars :]
        if "\\boxed" not in tail and "\\fbox" not in tail:
            # math-verify would pick the last box wherever it is; keep that choice (a linear scan).
            boxed = last_boxed_content(text)
            if boxed is not None:
                tail = "$\\boxed{" + boxed + "}$\n" + tail
        text = tail
    text = _shorten_expression_runs(text, limits.max_chars // 4)
    reason = check_text(text, limits)
    if reason is not None:
        note_rejection(reason)
        return []
    check_deadline()
    result = parse(text, **{**parse_kwargs, "parsing_timeout": None})
    if not all(tree_ok(value) for value in result):
        return []
    return result


def guarded_verify(gold: list, pred: list) -> bool:
    """``math_verify.verify`` of two guarded parses (math-verify's timers off)."""
    from math_verify import verify

    check_deadline()
    return bool(verify(gold, pred, timeout_seconds=None))
