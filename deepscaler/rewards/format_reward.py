"""Format reward: is the response a well-formed ``<think>...</think>`` block followed by an answer?

The check follows LUFFY's ``reward_with_format.format_reward`` (``^<think>\\n.*?\\n</think>``, dotall)
and adds what that regex cannot say: exactly one think block, a non-empty thought, and a non-empty
solution after it (special-token text such as ``<|im_end|>`` does not count). ``combine`` merges the
format outcome with the correctness reward as configured by ``reward.format_reward``.
"""

from __future__ import annotations

import dataclasses
import re

from deepscaler.rewards.math_utils.extract import THINK_CLOSE, THINK_OPEN

_THINK_BLOCK = re.compile(r"<think>\n(.*?)\n</think>", re.DOTALL)
_SPECIAL_TOKEN_TEXT = re.compile(r"<\|[^|<>]{1,40}\|>")
FORMAT_MODES = ("multiply", "add")


def think_format_ok(text: str) -> bool:
    """True for ``<think>\\n{thought}\\n</think>{solution}`` with one block and non-empty parts."""
    if not text.startswith(THINK_OPEN) or text.count(THINK_OPEN) != 1 or text.count(THINK_CLOSE) != 1:
        return False
    m = _THINK_BLOCK.match(text)
    if m is None or not m.group(1).strip():
        return False
    solution = _SPECIAL_TOKEN_TEXT.sub("", text[m.end() :])
    return bool(solution.strip())


@dataclasses.dataclass(frozen=True)
class FormatRewardConfig:
    """``reward.format_reward`` keys.

    enable (False): apply the format reward at all.
    weight (0.0): strength of the format term. ``add``: score + weight * ok (ok in {0, 1}).
        ``multiply``: score * ((1 - weight) + weight * ok), so weight 1.0 is LUFFY's
        ``accuracy * format`` and weight 0.5 halves the reward of a badly formatted response.
    mode ("multiply"): ``multiply`` or ``add``.
    """

    enable: bool = False
    weight: float = 0.0
    mode: str = "multiply"

    def __post_init__(self):
        if self.mode not in FORMAT_MODES:
            raise ValueError(f"reward.format_reward.mode must be one of {FORMAT_MODES}, got {self.mode!r}")
        if self.enable and self.weight == 0.0:
            raise ValueError(
                "reward.format_reward.enable=True with weight 0.0 changes nothing; set reward.format_reward.weight"
            )
        if self.mode == "multiply" and not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"reward.format_reward.weight must be in [0, 1] for mode=multiply, got {self.weight}")

    def combine(self, score: float, format_ok: bool) -> float:
        if not self.enable:
            return score
        ok = 1.0 if format_ok else 0.0
        if self.mode == "add":
            return score + self.weight * ok
        return score * ((1.0 - self.weight) + self.weight * ok)
