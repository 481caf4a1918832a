"""Rule-based math grading utilities: answer extraction, normalisation, safe parsing, equivalence.

``answers_match(pred, gt)`` compares one extracted answer with one ground truth; ``extract_final_answer``
and ``last_boxed_content`` pull the answer out of a response. See each module for the rules.
"""

from deepscaler.rewards.math_utils.equivalence import answers_match, objects_equal
from deepscaler.rewards.math_utils.extract import (
    choice_letter_of,
    extract_choice_letter,
    extract_final_answer,
    is_choice_ground_truth,
    last_answer_statement,
    last_boxed_content,
    split_after_think,
    strip_outer_dollars,
)
from deepscaler.rewards.math_utils.normalize import clean_answer, match_key
from deepscaler.rewards.math_utils.safe_parse import UnsafeExpression, check_complexity, parse_answer

__all__ = [
    "UnsafeExpression",
    "answers_match",
    "check_complexity",
    "choice_letter_of",
    "clean_answer",
    "extract_choice_letter",
    "extract_final_answer",
    "is_choice_ground_truth",
    "last_answer_statement",
    "last_boxed_content",
    "match_key",
    "objects_equal",
    "parse_answer",
    "split_after_think",
    "strip_outer_dollars",
]

# LUFFY's exports of this package (its math_utils/__init__.py), from the LUFFY-named module math_utils.utils.
from deepscaler.rewards.math_utils.utils import extract_answer, grade_answer_mathd, grade_answer_sympy  # noqa: E402

__all__ += ["extract_answer", "grade_answer_mathd", "grade_answer_sympy"]
