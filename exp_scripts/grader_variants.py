"""Answer variants for the LUFFY grader-agreement set: the ways models write a final answer.

``math_variants(gt)`` / ``choice_variants(letter)`` return ``[(variant_name, raw_response), ...]``: full raw
responses (think part, ``</think>``, answer) built from a benchmark ground truth, right and wrong, in the
forms models produce (\\dfrac vs \\frac, degrees, units, ``x =``, ``\\text{}``, thousands commas, scientific
notation, int vs float, rounding, sqrt forms, reordered tuples and sets, missing or doubled ``</think>``,
unboxed, wrong by one, ...). Ground truths are dataset text; the numeric value used for rounding comes
from the project's guarded parser, never from eval.
"""

from __future__ import annotations

import re

THINK = "Let me work through the problem step by step and check the result.\n"
_INT = re.compile(r"^-?\d+$")
_DEC = re.compile(r"^-?\d+\.\d+$")
_SQRT = re.compile(r"\\sqrt\{(\d)\}")


def _respond(answer_text: str, think: str = THINK, close: str = "</think>\n") -> str:
    return f"{think}{close}{answer_text}"


def _boxed(inner: str) -> str:
    return f"The final answer is $\\boxed{{{inner}}}$."


def _top_level_items(gt: str) -> list[str] | None:
    """Items of a top-level comma list (brackets kept outside), None when ``gt`` is not a list."""
    body, opener, closer = gt, "", ""
    for left, right in (("\\left(", "\\right)"), ("(", ")"), ("[", "]"), ("\\{", "\\}")):
        if gt.startswith(left) and gt.endswith(right):
            body, opener, closer = gt[len(left) : -len(right)], left, right
            break
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i].strip())
            start = i + 1
    items.append(body[start:].strip())
    if len(items) < 2 or any(not item for item in items):
        return None
    return [opener, *items, closer]


def _numeric_value(gt: str) -> float | None:
    from deepscaler.rewards.math_utils import clean_answer, parse_answer

    try:
        expr = parse_answer(clean_answer(gt))
        if expr is None or getattr(expr, "free_symbols", {1}):
            return None
        value = complex(expr.evalf(20))
    except Exception:  # noqa: BLE001 - any parse/eval failure: no rounding variant
        return None
    return value.real if abs(value.imag) < 1e-12 else None


def math_variants(gt: str) -> list[tuple[str, str]]:
    """At least 15 raw responses for one math ground truth (more when the answer's form allows)."""
    out = [
        ("boxed", _respond(_boxed(gt))),
        ("boxed_text", _respond(_boxed(f"\\text{{{gt}}}"))),
        ("x_equals", _respond(_boxed(f"x = {gt}"))),
        ("unboxed", _respond(f"The final answer is {gt}.")),
        ("unboxed_dollars", _respond(f"Therefore the answer is ${gt}$.")),
        ("inline_paren", _respond(f"So the result is \\(\\boxed{{{gt}}}\\).")),
        ("fbox", _respond(f"The final answer is $\\fbox{{{gt}}}$.")),
        ("no_think_close", _respond(_boxed(gt), close="")),
        ("double_think_close", _respond("Wait, let me re-check.\n</think>\n" + _boxed(gt))),
        ("boxed_in_think_only", _respond("I am done.", think=THINK + _boxed(gt) + "\n")),
        ("degrees", _respond(_boxed(f"{gt}^\\circ"))),
        ("units_text", _respond(_boxed(f"{gt} \\text{{ cm}}"))),
        ("units_word", _respond(_boxed(f"{gt}\\text{{ meters}}"))),
        ("percent", _respond(_boxed(f"{gt}\\%"))),
        ("dollar_sign", _respond(_boxed(f"\\${gt}"))),
        ("wrong_then_right", _respond("First guess $\\boxed{0}$ was wrong. " + _boxed(gt))),
        ("right_then_wrong", _respond(_boxed(gt) + " Actually no: $\\boxed{123457}$.")),
        ("spaced", _respond(_boxed(" " + " ".join(gt.replace(" ", "")) + " "))),
        ("trailing_period", _respond(_boxed(gt + "."))),
        ("wrong", _respond(_boxed(_wrong(gt)))),
    ]
    if "\\frac" in gt or "\\dfrac" in gt:
        swapped = gt.replace("\\dfrac", "\\FRAC").replace("\\frac", "\\dfrac").replace("\\FRAC", "\\frac")
        out.append(("dfrac_swap", _respond(_boxed(swapped))))
        out.append(("tfrac", _respond(_boxed(gt.replace("\\dfrac", "\\frac").replace("\\frac", "\\tfrac")))))
        simple = re.fullmatch(r"(-?)\\d?frac\{(\d+)\}\{(\d+)\}", gt)
        if simple:
            sign, num, den = simple.groups()
            out.append(("slash_fraction", _respond(_boxed(f"{sign}{num}/{den}"))))
            if len(num) == len(den) == 1:
                out.append(("frac_no_braces", _respond(_boxed(f"{sign}\\frac{num}{den}"))))
            out.append(("unreduced", _respond(_boxed(f"{sign}\\frac{{{int(num) * 2}}}{{{int(den) * 2}}}"))))
    if _SQRT.search(gt):
        out.append(("sqrt_no_braces", _respond(_boxed(_SQRT.sub(r"\\sqrt\1", gt)))))
        out.append(("sqrt_power", _respond(_boxed(_SQRT.sub(r"\1^{1/2}", gt)))))
    if _INT.match(gt):
        n = int(gt)
        out.append(("float_form", _respond(_boxed(f"{n}.0"))))
        out.append(("sci_times_ten0", _respond(_boxed(f"{n}\\times10^0"))))
        out.append(("wrong_by_one", _respond(_boxed(str(n + 1)))))
        out.append(("frac_form", _respond(_boxed(f"\\frac{{{2 * n}}}{{2}}"))))
        out.append(("text_number", _respond(_boxed(f"\\text{{{n}}}"))))
        out.append(("mixed_frac_tail", _respond(_boxed(f"\\frac{{3}}{{2}}{n}"))))
        if abs(n) >= 1000:
            out.append(("thousands_commas", _respond(_boxed(f"{n:,}"))))
            out.append(("thousands_thin_space", _respond(_boxed(f"{n:,}".replace(",", "\\,")))))
        if n != 0 and n % 10 == 0:
            digits = str(abs(n)).rstrip("0")
            exp = len(str(abs(n))) - 1
            mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
            out.append(("sci_notation", _respond(_boxed(f"{'-' if n < 0 else ''}{mant} \\times 10^{{{exp}}}"))))
            out.append(("sci_e", _respond(_boxed(f"{'-' if n < 0 else ''}{mant}e{exp}"))))
    if _DEC.match(gt):
        out.append(("decimal_trailing_zero", _respond(_boxed(gt + "0"))))
        out.append(("decimal_rounded", _respond(_boxed(f"{float(gt):.1f}"))))
    value = _numeric_value(gt)
    if value is not None and not _INT.match(gt):
        out.append(("rounded_2dp", _respond(_boxed(f"{value:.2f}"))))
        out.append(("rounded_4dp", _respond(_boxed(f"{value:.4f}"))))
    items = _top_level_items(gt)
    if items is not None:
        opener, *elems, closer = items
        out.append(("reordered", _respond(_boxed(opener + ", ".join(reversed(elems)) + closer))))
        out.append(("bare_list", _respond(_boxed(", ".join(elems)))))
        out.append(("set_braces", _respond(_boxed("\\{" + ", ".join(elems) + "\\}"))))
        out.append(("labelled", _respond(_boxed(", ".join(f"{v} = {e}" for v, e in zip("abcdefgh", elems))))))
        out.append(("brackets_swapped", _respond(_boxed("[" + ", ".join(elems) + "]"))))
    return out


def _wrong(gt: str) -> str:
    if _INT.match(gt):
        return str(int(gt) + 7)
    return f"{gt} + 1"


def choice_variants(letter: str) -> list[tuple[str, str]]:
    """Raw responses for one multiple-choice ground truth letter (ARC-c, GPQA)."""
    other = "B" if letter != "B" else "C"
    return [
        ("boxed", _respond(_boxed(letter))),
        ("boxed_text", _respond(_boxed(f"\\text{{{letter}}}"))),
        ("boxed_paren", _respond(_boxed(f"({letter})"))),
        ("boxed_textbf", _respond(_boxed(f"\\textbf{{({letter})}}"))),
        ("boxed_lower", _respond(_boxed(letter.lower()))),
        ("answer_line", _respond(f"ANSWER: {letter}")),
        ("unboxed_sentence", _respond(f"The correct option is ({letter}).")),
        ("wrong_letter", _respond(_boxed(other))),
        ("no_think_close", _respond(_boxed(letter), close="")),
        ("double_think_close", _respond("Re-checking.\n</think>\n" + _boxed(letter))),
        ("wrong_then_right", _respond(f"Not $\\boxed{{{other}}}$. " + _boxed(letter))),
        ("boxed_option_text", _respond(_boxed(f"{letter}. \\text{{the first option}}"))),
    ]
