"""``algorithm.method=prefix_rft`` (arXiv 2507.01679, METHODS_SPEC §7; no public code, see
luffy_pool/algorithm/family/prefix_rft.py for what is inferred): each group's ``rollout.n_prefix`` prefix slots
(LUFFY's key; ``-1``: every slot) start with the first ``⌊r·len⌋`` tokens of the prompt's demonstration
(``data.target_key`` ++ EOS) and the policy continues them, the other slots are plain rollouts. The prefix fraction
``r`` follows the cosine schedule of ``algorithm.prefix_rft`` (0.95 -> 0.05 over the run), the same for every
prefix slot of a step; LUFFY's ``min/max_prefix_ratio`` and ``prefix_strategy`` are not read.

Loss ``prefix_rft``: Dr.GRPO's PPO clip over the continuation and the top-entropy prefix tokens. Advantage:
``grpo`` over the whole group (hybrid rows are group members, as the paper's single RL objective); Dr.GRPO's
no-std and sum / L aggregation are the launch script's (``grpo_use_std=False``, ``loss_remove_token_mean=True``).
State: the step only (the trainer's ``global_steps``, restored on resume); the sampler has no RNG.
"""

from __future__ import annotations

import numpy as np

from luffy_pool.methods.base import Method, register_method

A = "actor_rollout_ref.actor"


class PrefixRftSampler:
    """Prefix ratios ``[B, n]``: the step's cosine-scheduled fraction on the first ``n_prefix`` slots of each
    prompt (all ``n`` when ``n_prefix = −1``), 0 on the others."""

    KIND = "prefix_rft"

    def __init__(self, n: int, n_prefix: int, cfg):
        self.n, self.cfg = n, cfg
        self.n_prefix = n if n_prefix == -1 else n_prefix

    @classmethod
    def from_sections(cls, sections, *, seed: int, total_steps: int, tokenizer=None) -> "PrefixRftSampler":
        from luffy_pool.algorithm.family.prefix_rft import PrefixRftConfig, decay_steps_of

        knobs, rollout = sections.algorithm.prefix_rft, sections.workers.rollout
        cfg = PrefixRftConfig(
            ratio_start=knobs.ratio_start,
            ratio_end=knobs.ratio_end,
            decay_steps=decay_steps_of(knobs.decay_steps, total_steps),
            prefix_entropy_top_frac=knobs.prefix_entropy_top_frac,
        )
        return cls(rollout.n, rollout.n_prefix, cfg)

    def ratio(self, global_step: int) -> float:
        from luffy_pool.algorithm.family.prefix_rft import prefix_ratio

        if global_step < 1:
            raise ValueError(f"global_step counts training steps from 1, got {global_step}")
        return prefix_ratio(global_step - 1, self.cfg)

    def draw_batch(self, batch, global_step: int) -> tuple[np.ndarray, dict]:
        r = self.ratio(global_step)
        ratios = np.zeros((len(batch), self.n), dtype=np.float64)
        ratios[:, : self.n_prefix] = r
        return ratios, {"prefix_rft/prefix_ratio": r}

    def state_dict(self) -> dict:
        return {"kind": self.KIND}

    def load_state_dict(self, state) -> None:
        if state.get("kind") != self.KIND:
            kind = state.get("kind", "LUFFY PrefixRatioSampler")
            raise ValueError(
                f"the checkpoint's prefix-ratio sampler is {kind!r}, "
                f"not algorithm.method=prefix_rft's; resume it with the method it was trained with"
            )


PREFIX_RFT = register_method(
    Method(
        name="prefix_rft",
        mechanism="demonstration prefix (cosine 0.95 -> 0.05) + on-policy continuation, "
        "Dr.GRPO with only the top-20% entropy prefix tokens trained",
        requires={f"{A}.policy_loss": "prefix_rft", "algorithm.adv_estimator": "grpo"},
        replaces={f"{A}.use_off_policy_loss": False},
        needs_demonstration=True,
        knobs="prefix_rft",
        ratio_sampler=PrefixRftSampler.from_sections,
    )
)
