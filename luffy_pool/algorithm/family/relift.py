"""ReLIFT (arXiv 2506.07527): GRPO plus an interleaved SFT step on the demonstrations of the questions whose K
rollouts all failed, taken from a newest-first buffer once it holds ``sft_data_size`` rows.

Mirrors TheRoadQaQ/ReLIFT (commit eb95454f), ``relift/verl/verl/relift/``: ``core_algos.py``
``compute_sft_loss`` and the loss lines of ``actor.py`` ``sft_update_policy`` -> :func:`relift_sft_loss`;
the hard-question test, buffer prepend and SFT trigger inlined in ``trainer.py`` ``fit`` ->
:func:`hard_question_uids`, :class:`HardBuffer`; ``trainer.py`` ``replace_response_in_batch`` ->
:func:`demonstration_batch`. METHODS_SPEC §2.

Quirks kept: the SFT loss is the plain token mean ``Σ(−ℓ)·m/Σm`` minus ``entropy_coeff`` × the token-mean
entropy (a bonus), per micro-batch (the actor divides by the accumulation steps); the buffer keeps one row
per hard question, prepends new rows and consumes the first ``sft_data_size`` (newest first), so leftovers can
starve. Fixed: their trigger evaluates ``len(buffer)`` while the buffer may be ``None`` (at start, or right
after a phase consumed it exactly) and crashes on a step with no hard question; here an empty buffer is an
empty list. The buffer has a ``state_dict`` (theirs is a local of ``fit``, lost on resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from luffy_pool.algorithm.family.common import masked_mean_plain
from luffy_pool.algorithm.family.registry import FamilyLossInputs, register, require


@dataclass(frozen=True)
class ReliftSftConfig:
    """ReLIFT's SFT knobs (``examples/math-7b/train.sh`` and ``config/relift_trainer.yaml``)."""

    sft_data_size: int = 128
    entropy_coeff: float = 0.001


@register("loss", "relift_sft", config=ReliftSftConfig)
def relift_sft_loss(inputs: FamilyLossInputs, cfg) -> tuple[torch.Tensor, dict]:
    """``mean(−ℓ_t) − entropy_coeff · mean(H_t)`` over ``response_mask`` (the demonstration tokens); needs
    ``inputs.entropy``. NaN on an empty mask, as theirs."""
    entropy = require(inputs, "entropy", "relift_sft")
    sft = masked_mean_plain(-1 * inputs.log_prob, inputs.response_mask)
    entropy_loss = masked_mean_plain(entropy, inputs.response_mask)
    return sft - entropy_loss * cfg.entropy_coeff, {"sft_loss": sft.detach(), "sft_entropy_loss": entropy_loss.detach()}


def hard_question_uids(sequence_scores: torch.Tensor, uids: Sequence[Hashable], fail_value: float = 0) -> list:
    """Group ids (first-appearance order) whose every row scores ``fail_value`` (0 with binary rewards)."""
    order = list(dict.fromkeys(uids))
    hard = []
    for uid in order:
        rows = torch.tensor([u == uid for u in uids])
        if bool((sequence_scores[rows] == fail_value).all()):
            hard.append(uid)
    return hard


class HardBuffer:
    """The rows waiting for the interleaved SFT step, newest first."""

    def __init__(self, sft_data_size: int) -> None:
        self.sft_data_size = sft_data_size
        self.rows: list[Any] = []

    def add(self, new_rows: Sequence[Any]) -> None:
        """Prepend this step's hard rows (``concat([new, buffer])``)."""
        if self.sft_data_size != -1 and new_rows:
            self.rows = list(new_rows) + self.rows

    def ready(self) -> bool:
        return self.sft_data_size != -1 and len(self.rows) >= self.sft_data_size

    def take(self) -> list[Any]:
        """The first ``sft_data_size`` rows for one SFT phase; the rest stay."""
        if not self.ready():
            raise ValueError(f"buffer holds {len(self.rows)} rows, the SFT step needs {self.sft_data_size}")
        batch, self.rows = self.rows[: self.sft_data_size], self.rows[self.sft_data_size :]
        return batch

    def state_dict(self) -> dict:
        return {"sft_data_size": self.sft_data_size, "rows": list(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        if state["sft_data_size"] != self.sft_data_size:
            raise ValueError(
                f"checkpointed buffer has sft_data_size {state['sft_data_size']}, this run {self.sft_data_size}"
            )
        self.rows = list(state["rows"])


def demonstration_batch(
    prompt_ids: torch.Tensor,
    prompt_attention_mask: torch.Tensor,
    prompt_position_ids: torch.Tensor,
    tgt_input_ids: torch.Tensor,
    pad_token_id: int,
    eos_token_id: int,
) -> dict[str, torch.Tensor]:
    """The SFT rows of ReLIFT's ``replace_response_in_batch``: response := the demonstration with EOS written at
    its first pad position (over its last token when it fills the width), attention up to and including the
    first EOS, positions continuing from the prompt's last one. Prompts left-padded ``[B, P]``, demonstrations
    right-padded ``[B, T]`` -> ``input_ids / attention_mask / position_ids [B, P + T]``, ``responses [B, T]``."""
    from verl.utils.torch_functional import get_eos_mask

    responses = tgt_input_ids.clone()
    width = responses.size(1)
    lengths = (responses != pad_token_id).sum(dim=1)
    responses[torch.arange(len(responses)), torch.where(lengths < width, lengths, width - 1)] = eos_token_id
    response_mask = get_eos_mask(responses, eos_token_id, dtype=prompt_attention_mask.dtype)
    steps = torch.arange(1, width + 1, device=responses.device).expand(len(responses), width)
    return {
        "input_ids": torch.cat([prompt_ids, responses], dim=-1),
        "attention_mask": torch.cat([prompt_attention_mask, response_mask], dim=-1),
        "position_ids": torch.cat([prompt_position_ids, prompt_position_ids[:, -1:] + steps], dim=-1),
        "responses": responses,
    }
