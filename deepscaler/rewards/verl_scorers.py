"""verl's two data-source-specific scorers that LUFFY routes by name (docs/METHOD.md §4.1).

``openai/gsm8k``: the response's last ``#### <number>`` line (commas and ``$`` removed) must equal the
ground truth exactly ("strict" mode); ``lighteval/MATH``: the last ``\\boxed{}`` must equal the ground
truth after MATH's string normalisation (no symbolic step). Both return 1.0 / 0.0.
"""

from __future__ import annotations

import re

from deepscaler.rewards.math_utils import clean_answer, last_boxed_content, match_key
from deepscaler.rewards.reward_types import ScoreResult

_GSM8K_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k_score(text: str, ground_truth) -> ScoreResult:
    matches = _GSM8K_FINAL.findall(text[-10_000:])
    if not matches:
        return ScoreResult(0.0, False, parse_failed=True)
    answer = matches[-1].replace(",", "").replace("$", "").rstrip(".")
    correct = answer == str(ground_truth).replace(",", "").strip()
    return ScoreResult(float(correct), correct, answer=answer)


def math_dataset_score(text: str, ground_truth) -> ScoreResult:
    answer = last_boxed_content(text)
    if answer is None:
        return ScoreResult(0.0, False, parse_failed=True)
    correct = match_key(clean_answer(answer)) == match_key(clean_answer(str(ground_truth)))
    return ScoreResult(float(correct), correct, answer=answer)
