"""The rollout-engine interface every generation backend implements (HF ``generate``, vLLM).

Engines work on token ids, not DataProto: the slot plan (``luffy_pool.rollout.slot_plan``) decides
what each engine call sees (prompt, or prompt ++ off-policy prefix) and assembles the padded response
tensors afterwards, so the same plan runs on any backend. Weights arrive from the FSDP actor through a
sharding manager calling ``update_weights``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Iterable, Optional

import torch


@dataclasses.dataclass
class SamplingSpec:
    """Per-call sampling parameters (LUFFY's rollout keys)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = off (vLLM convention)
    seed: Optional[int] = None
    return_logprobs: bool = False
    ignore_eos: bool = False


def sampling_from_config(rcfg) -> tuple[SamplingSpec, float]:
    """The training ``SamplingSpec`` and the validation temperature of the rollout section
    (``verl.workers.config_sections.RolloutSection``, or the ``actor_rollout_ref.rollout`` group itself).

    ``do_sample=False`` makes every rollout greedy (temperature 0: argmax), training and validation alike.
    ``calculate_log_probs=True`` asks the engine for each sampled token's log-prob (the batch's
    ``rollout_log_probs``, read by algorithm.rollout_correction).
    """
    greedy = not rcfg.do_sample
    spec = SamplingSpec(
        temperature=0.0 if greedy else float(rcfg.temperature),
        top_p=float(rcfg.top_p),
        top_k=int(rcfg.top_k),
        ignore_eos=bool(rcfg.ignore_eos),
        return_logprobs=bool(rcfg.calculate_log_probs),
    )
    return spec, 0.0 if greedy else float(rcfg.val_temperature)


@dataclasses.dataclass
class GenerationOutput:
    """One engine call's result, aligned with its input list."""

    token_ids: list[list[int]]  # generated ids only (no prompt), EOS included when emitted
    # engine log-prob of each generated id (rollout correction): one 1-D float32 CPU tensor per row, so a step's
    # millions of tokens never become Python floats
    logprobs: Optional[list[torch.Tensor]] = None


class BaseRollout(abc.ABC):
    """A generation engine that owns (a copy of) the policy weights."""

    @abc.abstractmethod
    def generate_token_ids(
        self, prompt_token_ids: list[list[int]], max_tokens: list[int], sampling: SamplingSpec
    ) -> GenerationOutput:
        """Generate one continuation per prompt; ``max_tokens[i]`` caps row i (0 means: skip the row)."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full (unsharded) HF-named tensors into the engine; may be called with buckets."""

    def sleep(self) -> None:
        """Release engine memory (KV cache, weights) while training runs. No-op where unsupported."""

    def wake_up(self) -> None:
        """Re-acquire what ``sleep`` released, before generation."""

    def after_weight_update(self) -> None:
        """Called once after a full weight push (e.g. reset a prefix cache)."""
