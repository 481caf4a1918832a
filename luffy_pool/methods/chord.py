"""``algorithm.method=chord`` (arXiv 2508.11408, METHODS_SPEC §5, Trinity-RFT's ``mix_chord``): the loss
``(1 − μ(t))·L_GRPO + μ(t)·L_SFT`` with a step-scheduled μ and per-token φ(p) = p(1 − p) SFT weights.

Mapping: the expert rows are the groups' full demonstration rows (LUFFY's slot plan, one per group, so the
expert share is ``1/n``: 1/8 with n = 8, Trinity's example uses 0.2 of the batch from a separate SFT set). The
advantage is ``grpo_split``, so the GRPO groups hold the on-policy rows only, as Trinity's. The step ``t`` the
schedule reads is the trainer's ``global_steps − 1`` (0 on the first update, so CHORD-μ starts at its peak),
sent with the knobs in the update's ``meta_info`` (luffy_pool/methods/losses.py).
"""

from __future__ import annotations

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hpt import FULL_DEMO_ROW

A = "actor_rollout_ref.actor"

CHORD = register_method(
    Method(
        name="chord",
        mechanism="(1 − μ(t))·GRPO + μ(t)·φ-weighted SFT on expert rows, μ cosine-decayed",
        requires={f"{A}.policy_loss": "chord", "algorithm.adv_estimator": "grpo_split", **FULL_DEMO_ROW},
        replaces={f"{A}.use_off_policy_loss": False},
        needs_demonstration=True,
        knobs="chord",
    )
)
