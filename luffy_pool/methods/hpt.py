"""``algorithm.method=hpt`` (arXiv 2509.04419, METHODS_SPEC §3): per prompt, SFT on the demonstration when the
group's on-policy rollouts have at most ``algorithm.hpt.switch_gate`` successes, RL on the rollouts otherwise.

Slot plan: LUFFY's (``n − 1`` on-policy rollouts + one full demonstration row per group), so the verify rollouts
are the group's ``n − 1`` on-policy rows (the authors roll out ``n_verify = 8`` and then add the demo row:
``rollout.n = 9`` is their plan; exp_scripts/train_hpt.sh keeps n = 8, 7 verify rollouts). The gate
(:func:`hpt_gate`, the family's ``hpt_switch`` block) runs on the driver after the advantage and writes ``loss_row_mask``: 1 on the rows the authors keep (the demo row of a
switched group; the rollouts otherwise), 0 on the rows they drop; the ``hpt_sft`` loss masks the dropped rows
out, which equals removing them (its RL term is a sum / L, its SFT term a mean over the kept demo tokens).
The advantage is ``grpo_split`` (over the on-policy rows only, as the authors' over the 8 kept rollouts).
Differences kept visible: the entropy bonus still averages over every row of the micro-batch; the authors
pad batches to a multiple of 8, we keep every group's n rows.
"""

from __future__ import annotations

from luffy_pool.methods.base import Method, register_method

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
FULL_DEMO_ROW = {f"{R}.n_prefix": 1, f"{R}.min_prefix_ratio": 1.0, f"{R}.max_prefix_ratio": 1.0}


def hpt_gate(batch, sections) -> dict:
    """Per group (uid): ``c`` = successes among its on-policy rows; the family gate decides SFT (keep the demo
    row) or RL (keep the rollouts). Sets ``batch.batch["loss_row_mask"]``; metrics ``hpt/sft_group_fraction``
    and ``hpt/mean_successes``."""
    import numpy as np
    import torch

    from deepscaler.rewards import fail_success_values
    from luffy_pool.algorithm.family.hpt import HptConfig, hpt_switch_gate

    knobs = sections.algorithm.hpt
    cfg = HptConfig(switch_gate=knobs.switch_gate, switch_gate_off=knobs.switch_gate)
    _, success = fail_success_values(int(sections.data.reward_impl_version))
    scores = batch.batch["token_level_scores"].sum(-1)
    demo = batch.batch["prefix_mask"].bool().any(-1)
    uids = np.asarray(batch.non_tensor_batch["uid"])
    keep = torch.zeros(len(uids), dtype=torch.float32)
    switched, counts = 0, []
    for uid in dict.fromkeys(uids.tolist()):
        rows = torch.as_tensor(uids == uid)
        c = int(((scores == success) & rows & ~demo).sum())
        on_remove, _, _ = hpt_switch_gate(c, cfg)
        keep[rows & (demo if on_remove else ~demo)] = 1.0
        switched += bool(on_remove)
        counts.append(c)
    batch.batch["loss_row_mask"] = keep
    return {"hpt/sft_group_fraction": switched / max(len(counts), 1), "hpt/mean_successes": float(np.mean(counts))}


HPT = register_method(
    Method(
        name="hpt",
        mechanism="per group: SFT on the demonstration if its rollouts have <= switch_gate successes, else RL",
        requires={f"{A}.policy_loss": "hpt_sft", "algorithm.adv_estimator": "grpo_split", **FULL_DEMO_ROW},
        replaces={f"{A}.use_off_policy_loss": False},
        needs_demonstration=True,
        knobs="hpt",
        before_update=hpt_gate,
    )
)
