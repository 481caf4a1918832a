"""Rewards for math RL: rule-based grader, math-verify, format reward, LLM judge; all model-output safe.

Public API (stable; the trainer, the reward manager and eval_scripts call these):

Training (verl style)::

    compute_score(data_source, solution_str, ground_truth, extra_info=None,
                  reward_impl_version=3, grader="math_verify") -> float
    score_response(...same...) -> ScoreResult(score, correct, parse_failed, answer)
    select_score_fn(data_source, reward_impl_version=3, grader="math_verify")
        -> fn(raw_response, ground_truth) -> ScoreResult
    fail_success_values(reward_impl_version) -> (fail, success)   # (-0.5, 1) for v1, else (0, 1)

``solution_str`` is the raw decoded response (special tokens kept). Routing (docs/METHOD.md §4.1):
``openai/gsm8k`` -> verl's strict ``####`` scorer; ``lighteval/MATH`` -> last boxed + MATH string
normalisation; any other source (e.g. ``synthetic_arith``, ``aime``, ``arc_c``) by version:
0 deepscaler rule grader on ``"<think>\\n"+response`` (1/0); 1 same with 1 / -0.5 / -1 (format error,
no boxed, no ground truth); 2 rule grader on ``"<think>\\n</think>\\n<think>\\n"+response``; 3 (LUFFY)
math-verify on the text after the first ``</think>`` of ``"<think>\\n"+response``, 0 when the tag is
missing; 4 math-verify on the raw response. ``grader`` (``math_verify`` | ``rule`` | ``any``) swaps
the equivalence check of versions 3 and 4 only. Verdicts of versions 0-3 equal LUFFY's own code's
(tests/deepscaler/rewards/test_luffy_grader_agreement.py): versions 0-2 use LUFFY's rule
(``math_utils.luffy_rule``), math-verify has no option-letter rule. The ``rule`` / ``any`` graders are
this project's lenient ones: option-letter ground truths (ARC-c, GPQA, MATH's ``\\text{(C)}``) are
graded there by the extracted letter (last ``\\boxed{C}`` or ``ANSWER: C``).

LUFFY's own names (thin aliases of the above)::

    deepscaler.rewards.math_reward.deepscaler_reward_fn(solution_str, ground_truth, enable_llm=False) -> bool
    RewardMathFn(RewardConfig(...))(RewardInput(...)) -> RewardOutput   # LUFFY's class API
    verl.mix_src.math_verify_reward.reward_fn_math_verify(solution_str, ground_truth) -> bool

Evaluation::

    grade(solution_str, ground_truth, grader="math_verify", split_think=False) -> bool

LUFFY's OAT evaluation grader (``--add_oat_evaluate``) is ``eval_scripts.oat_math_grader``, with LUFFY's verdicts.
Bounded by construction: every function above (and ``deepscaler_score``, ``math_verify_score``,
``grade_solution``, which LUFFY's aliases call) returns within ``GuardLimits().time_budget_s`` (3 s of
the grading thread's CPU time, so a busy machine never changes a verdict; a wall-clock backstop of
max(60 s, 20x) is reported as ``wall_timed_out``) for any string, in the calling thread, main or not,
without a process pool; the first call of a process warms the parsers outside the budget. Inputs are checked before any
parser sees them (``math_utils.input_guard``: length, bracket depth per kind, ``\\frac``/``\\sqrt``
nesting, exponent towers, literal digits, factorials, token count, number of boxes) and parsed trees
before anything is evaluated; whatever is beyond a limit is graded unparseable (0, ``parse_failed`` and
``unparseable`` set), and a spent budget returns ``timed_out`` (``math_utils.deadline``: a watchdog
raising a BaseException in the grading thread). Pass ``limits=GuardLimits(...)`` to any of them, or
``set_default_limits``. Math-verify's own SIGALRM timeouts stay off (they break in threads). In bulk,
``verl.workers.reward_manager.ScoringPool`` (or ``RewardManager.score_texts``) adds per-item process
timeouts as a second line: ``ScoringPool(ScorerSpec(v, grader), num_workers,
timeout_s).score([(data_source, raw_response, gt, None), ...])`` with ``v=3`` when the prompt ended in
``"<think>\n"`` (split after ``</think>``, missing tag = wrong) and ``v=4`` to grade the raw text.

Safety: model text reaches SymPy only through latex2sympy2_extended's grammar and math-verify's parser
(whose plain-expression path accepts digits and operators only); nothing is passed to ``eval``,
``exec``, ``sympify`` or ``parse_expr``; parsed trees are size-checked before evaluation.
"""

from deepscaler.rewards.format_reward import FormatRewardConfig, think_format_ok
from deepscaler.rewards.math_reward import (
    RewardMathFn,
    deepscaler_reward_fn,
    deepscaler_score,
    grade_solution_rule,
    ground_truth_list,
)
from deepscaler.rewards.math_utils import answers_match
from deepscaler.rewards.math_utils.input_guard import GuardLimits, set_default_limits
from deepscaler.rewards.math_verify_reward import GRADERS, grade_solution, math_verify_score
from deepscaler.rewards.luffy_reward_types import RewardConfig, RewardFn, RewardInput, RewardOutput, RewardType
from deepscaler.rewards.reward_types import RewardValues, ScoreResult
from deepscaler.rewards.selection import (
    REWARD_IMPL_VERSIONS,
    ScorerSpec,
    compute_score,
    fail_success_values,
    grade,
    graded_text,
    score_response,
    select_score_fn,
)

__all__ = [
    "GRADERS",
    "GuardLimits",
    "REWARD_IMPL_VERSIONS",
    "FormatRewardConfig",
    "RewardConfig",
    "RewardFn",
    "RewardInput",
    "RewardMathFn",
    "RewardOutput",
    "RewardType",
    "RewardValues",
    "ScoreResult",
    "ScorerSpec",
    "answers_match",
    "compute_score",
    "deepscaler_reward_fn",
    "deepscaler_score",
    "fail_success_values",
    "grade",
    "grade_solution",
    "grade_solution_rule",
    "graded_text",
    "ground_truth_list",
    "math_verify_score",
    "score_response",
    "select_score_fn",
    "set_default_limits",
    "think_format_ok",
]
