"""LUFFY's module path ``verl.mix_src.mix_core_alg``: its mixed-policy algorithm functions under LUFFY's names and
arguments, as aliases of ``luffy_pool.algorithm.mix_core_alg``'s thin wrappers over the registered ``fn(inputs, cfg)``
estimator and losses (same math; the losses return LUFFY's dict of ``pg_loss`` and metrics, ``off_pg_clipfrac``
included)."""
from luffy_pool.algorithm.mix_core_alg import (  # noqa: F401
    AdaptiveEntropyCoeff,
    compute_grpo_outcome_advantage_split,
    compute_sft_multitask_loss,
    compute_sft_pure_loss,
    compute_token_on_off_policy_loss,
)

__all__ = ["compute_grpo_outcome_advantage_split", "compute_sft_pure_loss", "compute_token_on_off_policy_loss"]
