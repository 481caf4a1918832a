"""Answer extraction from model responses: think-block splitting, last ``\\boxed{}``, answer lines.

Every function here is a linear scan over the text (``rfind`` plus one brace-matching pass), with no
regular expression that can backtrack, so a 1 MB response or 10,000 nested braces costs milliseconds.
Nothing is evaluated: the output is always a plain string for the normaliser and the safe parser.
"""

from __future__ import annotations

import re

from deepscaler.rewards.math_utils.input_guard import note_rejection

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Longest answer we hand on; longer "answers" are degenerate generations, not math.
MAX_ANSWER_CHARS = 2000

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_CHOICE_LETTERS = "ABCDEFGHIJ"
# How many malformed boxes (unclosed / empty command) we skip before giving up.
_MAX_BOX_CANDIDATES = 64


def split_after_think(text: str) -> str | None:
    """Text between the first ``</think>`` and the next one (``text.split('</think>')[1]``), or None.

    This is the LUFFY/deepscaler convention: the solution section is the part after the first closing
    tag, and anything after a second closing tag is dropped.
    """
    first = text.find(THINK_CLOSE)
    if first < 0:
        return None
    start = first + len(THINK_CLOSE)
    second = text.find(THINK_CLOSE, start)
    return text[start:] if second < 0 else text[start:second]


def _match_braces(text: str, open_idx: int, limit: int = MAX_ANSWER_CHARS + 2) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx`` within ``limit`` chars, else None.

    Escaped ``\\{`` / ``\\}`` are skipped. The limit keeps a response made of thousands of unclosed
    boxes linear: each candidate box costs at most ``limit`` steps.
    """
    depth = 0
    i = open_idx
    n = min(len(text), open_idx + limit)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "{}":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _boxed_at(text: str, idx: int, command: str) -> str | None:
    """Content of the box command starting at ``idx``: ``\\boxed{...}`` or the TeX form ``\\boxed 5``."""
    j = idx + len(command)
    n = len(text)
    # A longer command name (e.g. \boxedfoo) is not a box.
    if j < n and text[j].isalpha():
        return None
    k = j
    while k < n and text[k] == " ":
        k += 1
    if k < n and text[k] == "{":
        close = _match_braces(text, k)
        if close is None:
            if n - k > MAX_ANSWER_CHARS + 2:
                note_rejection(f"boxed answer longer than {MAX_ANSWER_CHARS} characters")
            return None
        return text[k + 1 : close]
    if k > j and k < n:
        # "\boxed 5$" - the argument runs to the next delimiter.
        end = k
        stop = min(n, k + MAX_ANSWER_CHARS)
        while end < stop and text[end] not in "$\n ":
            end += 1
        return text[k:end] or None
    return None


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces matched, else None.

    Searching backwards means a response that boxes a draft value and then a final value yields the
    final one; an unclosed last box falls back to the previous complete one.
    """
    # Walk candidate positions from the end; an unclosed box costs one bounded brace scan.
    search_end = len(text)
    for _ in range(_MAX_BOX_CANDIDATES):
        best = -1
        best_cmd = ""
        for command in _BOX_COMMANDS:
            pos = text.rfind(command, 0, search_end)
            if pos > best:
                best, best_cmd = pos, command
        if best < 0:
            return None
        content = _boxed_at(text, best, best_cmd)
        if content is not None:
            content = content.strip()
            return content[:MAX_ANSWER_CHARS] if len(content) > MAX_ANSWER_CHARS else content
        search_end = best
    return None


def strip_outer_dollars(text: str) -> str:
    """``'$x$'`` -> ``'x'``; also removes ``\\(...\\)`` and ``\\[...\\]`` wrappers."""
    s = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*:?\s*([^\n]{1,300})", re.IGNORECASE)


def last_answer_statement(text: str) -> str | None:
    """The text after the last "answer is"/"answer:" phrase on its line (used when nothing is boxed).

    The scan is limited to the last 4,000 characters: the final answer sits at the end of a response
    and the regex then runs on bounded input.
    """
    tail = text[-4000:]
    matches = list(_ANSWER_LINE.finditer(tail))
    if not matches:
        return None
    ans = matches[-1].group(1).strip()
    ans = ans.rstrip(" .")
    ans = strip_outer_dollars(ans)
    return ans or None


def extract_final_answer(text: str) -> str | None:
    """Last boxed answer, else the last "answer is ..." statement, else None."""
    boxed = last_boxed_content(text)
    if boxed is not None:
        return boxed
    return last_answer_statement(text)


_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")


def choice_letter_of(answer: str) -> str | None:
    """The option letter an answer names: ``'C'``, ``'(C)'``, ``'\\text{(C)}'``, ``'C) 42'`` -> ``'C'``."""
    s = strip_outer_dollars(answer)
    for _ in range(3):
        s2 = _TEXT_WRAPPER.sub(r"\1", s)
        if s2 == s:
            break
        s = s2
    s = s.strip().strip("*").strip()
    if s.lower().startswith("option "):
        s = s[7:].strip()
    if s.startswith("(") and len(s) >= 3 and s[2] == ")":
        s = s[1] + s[3:]
    if not s or s[0] not in _CHOICE_LETTERS:
        return None
    if len(s) == 1:
        return s
    # "C) text", "C. text", "C: text", "C text" name option C; "Cat" or "C_1" do not.
    if s[1] in ").: ":
        return s[0]
    return None


def is_choice_ground_truth(ground_truth: str) -> bool:
    """True when the ground truth is a lone option letter A-J (ARC-c, GPQA, MATH's ``\\text{(C)}``)."""
    s = strip_outer_dollars(str(ground_truth))
    letter = choice_letter_of(s)
    if letter is None:
        return False
    compact = re.sub(r"[\s$(){}]|\\text|\\textbf|\\mathrm", "", s)
    return compact == letter


# The keyword is case-insensitive, the letter is not: "the answer is a bit long" names no option.
_ANSWER_LETTER = re.compile(r"(?i:answer)\s*(?:(?i:is)|:)?\s*:?\s*\(?\$?\s*(?:\\text\{)?\(?([A-J])\b")


def extract_choice_letter(text: str) -> str | None:
    """The option letter a response commits to: last boxed answer first, then the last ``ANSWER: X``.

    GPQA's prompt asks for a final ``ANSWER: $LETTER`` line; ARC-style answers usually box the letter.
    """
    boxed = last_boxed_content(text)
    if boxed is not None:
        letter = choice_letter_of(boxed)
        if letter is not None:
            return letter
    tail = text[-4000:]
    matches = list(_ANSWER_LETTER.finditer(tail))
    if matches:
        return matches[-1].group(1).upper()
    return None
