"""``algorithm.method=srft`` (arXiv 2506.19767, METHODS_SPEC §4, the HPT authors' implementation): one loss of
entropy-weighted SFT on the demonstration (``0.5·e^{−H}``), LUFFY's shaped off-policy term on it, and
sign-weighted on-policy terms (``0.1·e^{H}`` on correct rollouts, −1 on the others).

Slot plan and advantage: LUFFY's (one full demonstration row per group, Dr.GRPO over the whole group). The driver
adds ``row_scores`` (each row's sequence score) so the loss finds the correct rows (score exactly 1, as theirs).
"""

from __future__ import annotations

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hpt import FULL_DEMO_ROW

A = "actor_rollout_ref.actor"


def row_scores(batch, sections) -> dict:
    """``batch.batch["row_scores"]``: the sequence score of each row; metric ``srft/correct_fraction``."""
    scores = batch.batch["token_level_scores"].sum(-1)
    batch.batch["row_scores"] = scores
    return {"srft/correct_fraction": float((scores == 1.0).float().mean())}


SRFT = register_method(
    Method(
        name="srft",
        mechanism="entropy-weighted SFT + shaped off-policy PG on the demo + sign-weighted on-policy PG",
        requires={f"{A}.policy_loss": "srft", f"{A}.off_policy_reshape": "p_div_p_0.1", **FULL_DEMO_ROW},
        replaces={f"{A}.use_off_policy_loss": False},
        needs_demonstration=True,
        knobs="srft",
        before_update=row_scores,
    )
)
