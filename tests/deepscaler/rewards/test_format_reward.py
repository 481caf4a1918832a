"""Format reward: think-block structure check and its combination with correctness."""

import pytest

from deepscaler.rewards import FormatRewardConfig, think_format_ok


@pytest.mark.parametrize(
    "text,ok",
    [
        ("<think>\nwork\n</think>\n\\boxed{1}<|im_end|>", True),
        ("<think>\nwork\n</think>\n<|im_end|>", False),  # nothing after the think block
        ("<think>\n\n</think>\nanswer", False),  # empty thought
        ("<think>\nwork</think>\nanswer", False),  # LUFFY's regex needs "\n</think>"
        ("<think>\na\n</think>\nb<think>\nc\n</think>\nd", False),  # two blocks
        ("answer first <think>\nwork\n</think>\nx", False),  # must start with <think>
        ("<think>\nwork\n</think>", False),
    ],
)
def test_think_format_ok(text, ok):
    assert think_format_ok(text) is ok


def test_multiply_mode_scales_by_one_minus_weight_on_bad_format():
    cfg = FormatRewardConfig(enable=True, weight=1.0, mode="multiply")
    assert cfg.combine(1.0, True) == 1.0 and cfg.combine(1.0, False) == 0.0
    half = FormatRewardConfig(enable=True, weight=0.5, mode="multiply")
    assert half.combine(1.0, False) == 0.5 and half.combine(-0.5, True) == -0.5


def test_add_mode_adds_weight_when_format_is_ok():
    cfg = FormatRewardConfig(enable=True, weight=0.2, mode="add")
    assert cfg.combine(1.0, True) == pytest.approx(1.2)
    assert cfg.combine(0.0, False) == 0.0


def test_disabled_format_reward_leaves_scores_alone():
    assert FormatRewardConfig().combine(0.7, False) == 0.7


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(enable=True, weight=0.0), "weight"),
        (dict(enable=True, weight=1.0, mode="max"), "mode"),
        (dict(enable=True, weight=2.0, mode="multiply"), "weight"),
    ],
)
def test_bad_format_reward_config_names_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FormatRewardConfig(**kwargs)
