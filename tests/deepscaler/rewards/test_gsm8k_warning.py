"""openai/gsm8k rows answered in \\boxed{} without '####': one warning per process naming the fix."""

import logging

from deepscaler.rewards import compute_score
from deepscaler.rewards.gsm8k_warning import reset_gsm8k_warning


def test_boxed_gsm8k_answer_warns_once_and_names_the_version_that_grades_boxes(caplog):
    reset_gsm8k_warning()
    boxed = "<think>\nadd them\n</think>\nThe answer is \\boxed{72}."
    with caplog.at_level(logging.WARNING, logger="deepscaler.rewards.gsm8k_warning"):
        assert compute_score("openai/gsm8k", boxed, "72") == 0.0  # verl's strict scorer, as in LUFFY
        assert compute_score("openai/gsm8k", boxed, "72") == 0.0
        assert compute_score("openai/gsm8k", "so #### 72", "72") == 1.0
    warnings = [r.getMessage() for r in caplog.records if "openai/gsm8k" in r.getMessage()]
    assert len(warnings) == 1
    assert "reward_impl_version=3" in warnings[0] and "####" in warnings[0]
    assert compute_score("gsm8k", boxed, "72") == 1.0  # the advice works


def test_hash_answers_and_other_sources_do_not_warn(caplog):
    reset_gsm8k_warning()
    with caplog.at_level(logging.WARNING, logger="deepscaler.rewards.gsm8k_warning"):
        compute_score("openai/gsm8k", "\\boxed{1} and then #### 72", "72")
        compute_score("gsm8k", "\\boxed{72}", "72", reward_impl_version=4)
    assert not [r for r in caplog.records if "openai/gsm8k" in r.getMessage()]
    reset_gsm8k_warning()
