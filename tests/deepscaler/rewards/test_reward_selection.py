"""reward_impl_version semantics (docs/METHOD.md §4.1, §8 item 5) and data-source routing."""

import pytest

from deepscaler.rewards import compute_score, fail_success_values, grade, score_response, select_score_fn

RIGHT = "reasoning\n</think>\nSo the answer is \\boxed{204}.<|im_end|>"
WRONG = "reasoning\n</think>\nSo the answer is \\boxed{205}.<|im_end|>"
NO_CLOSE = "reasoning without a closing tag \\boxed{204}<|im_end|>"
NO_BOX = "reasoning\n</think>\nthe answer is 204<|im_end|>"


@pytest.mark.parametrize(
    "version,expected",
    [
        (0, [1.0, 0.0, 0.0, 0.0]),
        (1, [1.0, -0.5, -1.0, -1.0]),
        (2, [0.0, 0.0, 1.0, 0.0]),  # LUFFY quirk: a response with </think> is graded on its think part
        (3, [1.0, 0.0, 0.0, 1.0]),  # math-verify also reads an unboxed "answer is 204"
        (4, [1.0, 0.0, 1.0, 1.0]),  # no think requirement, no prefix
    ],
)
def test_versions_score_right_wrong_unclosed_and_unboxed_responses(version, expected):
    got = [compute_score("aime", r, "204", reward_impl_version=version) for r in (RIGHT, WRONG, NO_CLOSE, NO_BOX)]
    assert got == expected


def test_v3_missing_think_close_is_zero_not_a_penalty_and_counts_as_parse_failure():
    result = score_response("aime", NO_CLOSE, "204", reward_impl_version=3)
    assert result.score == 0.0 and result.parse_failed


def test_v3_grades_only_between_first_and_second_close_tag():
    text = "a\n</think>\n\\boxed{7}\n</think>\n\\boxed{8}"
    assert compute_score("aime", text, "7") == 1.0
    assert compute_score("aime", text, "8") == 0.0


def test_v4_does_not_prepend_think():
    # With the prefix, "x </think> \boxed{1}" has a think block; without it, v4 grades everything.
    assert compute_score("aime", "\\boxed{1}", "1", reward_impl_version=4) == 1.0
    assert compute_score("aime", "\\boxed{1}", "1", reward_impl_version=3) == 0.0


def test_fail_success_values_per_version():
    assert fail_success_values(1) == (-0.5, 1.0)
    assert all(fail_success_values(v) == (0.0, 1.0) for v in (0, 2, 3, 4))
    with pytest.raises(ValueError, match="reward_impl_version"):
        fail_success_values(7)


def test_gsm8k_and_math_sources_use_verl_scorers_whatever_the_version():
    for version in (0, 3):
        assert compute_score("openai/gsm8k", "work #### 1,234", "1234", reward_impl_version=version) == 1.0
        assert compute_score("openai/gsm8k", "work, answer 1234", "1234", reward_impl_version=version) == 0.0
        assert (
            compute_score("lighteval/MATH", "no think \\boxed{\\dfrac12}", "\\frac{1}{2}", reward_impl_version=version)
            == 1.0
        )
    # MATH's scorer is string-only: 0.5 is not \frac{1}{2} there.
    assert compute_score("lighteval/MATH", "\\boxed{0.5}", "\\frac{1}{3}") == 0.0


def test_synthetic_arith_routes_by_version_like_any_other_source():
    trace = "<think>\n12 + 30 = 42.\n</think>\nThe answer is \\boxed{42}.<|im_end|>"
    # The off-policy trace already starts with <think>; the extra prefix does not matter.
    assert compute_score("synthetic_arith", trace, "42") == 1.0
    assert compute_score("synthetic_arith", trace, "42", reward_impl_version=1) == 1.0
    assert compute_score("synthetic_arith", trace, "43", reward_impl_version=1) == -0.5


def test_multiple_choice_letters_as_luffy_grades_them():
    # LUFFY's graders have no option-letter rule (its verdicts: tests/data/luffy_grader_verdicts.jsonl.gz):
    # an unboxed ``ANSWER: A`` is a format error for versions 0/1 and wrong for math-verify (3/4) ...
    gpqa = "thinking\n</think>\nThe energies differ by 10^-4 eV.\nANSWER: A"
    assert [compute_score("gpqa", gpqa, "A", reward_impl_version=v) for v in (0, 1, 3, 4)] == [0.0, -1.0, 0.0, 0.0]
    # ... while this project's ``rule`` / ``any`` graders of versions 3/4 read the letter.
    assert [compute_score("gpqa", gpqa, "A", grader=g) for g in ("rule", "any")] == [1.0, 1.0]
    assert compute_score("gpqa", gpqa, "B", grader="any") == 0.0
    boxed = "t</think>\\boxed{\\text{C}}"
    assert [compute_score("arc_c", boxed, "C", reward_impl_version=v) for v in (0, 1, 3, 4)] == [1.0, 1.0, 1.0, 1.0]


def test_ground_truth_list_and_boxed_ground_truth():
    assert compute_score("aime", RIGHT, ["10", "204"], reward_impl_version=0) == 1.0
    assert compute_score("aime", RIGHT, ["10", "204"], reward_impl_version=3) == 1.0
    assert compute_score("aime", RIGHT, "\\boxed{204}", reward_impl_version=0) == 1.0
    assert compute_score("aime", RIGHT, [], reward_impl_version=1) == -1.0


def test_graders_for_versions_3_and_4():
    text = "t\n</think>\n\\boxed{\\frac{14}{3}}"
    for grader in ("math_verify", "rule", "any"):
        assert compute_score("math", text, "4\\frac{2}{3}", grader=grader) == 1.0
    with pytest.raises(ValueError, match="grader"):
        select_score_fn("math", 3, grader="llm")


def test_eval_grade_split_think_and_graders():
    assert grade("\\boxed{0.5}", "\\frac{1}{2}", grader="math_verify")
    assert grade("\\boxed{0.5}", "\\frac{1}{2}", grader="rule")
    assert not grade("no close \\boxed{0.5}", "\\frac{1}{2}", split_think=True)
    assert grade("t</think>The final answer is 7", "7", grader="any", split_think=True)
