"""``algorithm.method=relift`` (arXiv 2506.07527, TheRoadQaQ/ReLIFT): on-policy GRPO, plus an interleaved SFT
stage with its own optimizer on the demonstrations of the questions whose K rollouts all failed, taken from a
newest-first buffer once it holds ``sft_data_size`` rows. Its pure blocks first, then the method's wiring.

Blocks: mirror TheRoadQaQ/ReLIFT (commit eb95454f), ``relift/verl/verl/relift/``: ``core_algos.py``
``compute_sft_loss`` and the loss lines of ``actor.py`` ``sft_update_policy`` -> :func:`relift_sft_loss`; the
hard-question test, buffer prepend and SFT trigger inlined in ``trainer.py`` ``fit`` -> :func:`hard_question_uids`,
:class:`HardBuffer`; ``trainer.py`` ``replace_response_in_batch`` -> :func:`demonstration_batch`. Quirks kept: the
SFT loss is the plain token mean ``Σ(−ℓ)·m/Σm`` minus ``entropy_coeff`` × the token-mean entropy (a bonus), per
micro-batch (the actor divides by the accumulation steps); the buffer keeps one row per hard question, prepends
new rows and consumes the first ``sft_data_size`` (newest first), so leftovers can starve.

Wiring: RL steps are plain GRPO: no off-policy slot (``rollout.n_prefix=0``), verl's policy loss (``vanilla``; the
launch script makes it theirs: unclipped, sum / L). After each RL update, :class:`ReliftStage` puts every question
whose group has no success (all rows score the fail value of ``data.reward_impl_version``) with its demonstration
(``data.target_key``) at the front of the hard buffer; when the buffer holds ``algorithm.relift.sft_data_size``
rows, the newest that many become one SFT stage on the actor workers (``sft_update_actor``,
luffy_pool/workers/interleaved_sft.py: their own AdamW, lr ``sft_lr``, the ``relift_sft`` loss) and leave it.

Fixed here (the authors' code): their trigger evaluates ``len(buffer)`` while the buffer may be ``None`` and
crashed on a step with no hard question (here an empty buffer is an empty list); neither the buffer (a local of
their ``fit``) nor the SFT optimizer was saved. Here the buffer goes into the checkpoint's ``data.pt``
(the hooks' state) and the SFT optimizer's moments into ``actor/optim_sft/`` (DCP, resharded like the RL
optimizer's), both restored by ``resume_mode=auto``. Order of the hard questions: first appearance in the updated
batch, which our row balancing may have reordered (theirs: after their balancing, a different one).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method
from luffy_pool.methods.hooks import StepHooks
from luffy_pool.methods.loss_helpers import masked_mean_plain
from luffy_pool.methods.loss_inputs import FamilyLossInputs, require
from verl.utils.config_section import POSITIVE, Bound, key


@dataclass(frozen=True)
class ReliftSftConfig:
    """ReLIFT's SFT knobs (``examples/math-7b/train.sh`` and ``config/relift_trainer.yaml``)."""

    sft_data_size: int = 128
    entropy_coeff: float = 0.001


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


logger = logging.getLogger(__name__)

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids", "tgt_input_ids")  # one buffer row: a prompt + its demo


@dataclass(frozen=True)
class ReliftKnobs:
    """``algorithm.relift``: ReLIFT's hard-question buffer and interleaved SFT stage."""

    sft_data_size: int = key(
        bounds=Bound(lambda v: v == -1 or v > 0, "must be -1 (off) or > 0"),
        default=128,
        doc="Hard questions (no success in their group) buffered before one SFT stage trains on the newest this many (a multiple of the actor ranks); -1 = never (their RL-only baseline). Authors: 128.",
    )
    sft_mini_batch_size: int = key(
        bounds=POSITIVE,
        default=128,
        doc="Rows per SFT optimizer step (sft_data_size a multiple of it). Authors: 128 (one step per stage).",
    )
    sft_micro_batch_size: int = key(
        bounds=POSITIVE,
        default=4,
        doc="Rows per SFT forward/backward; each loss is divided by mini / micro. Authors: 4 (7B-Math), 2 (1.5B, 7B base).",
    )
    sft_epochs: int = key(bounds=POSITIVE, default=1, doc="Passes over the SFT batch per stage. Authors: 1.")
    sft_lr: float = key(
        bounds=POSITIVE,
        default=1e-06,
        doc="The SFT optimizer's learning rate (constant, no schedule). Authors: 1e-6 (optim.sft.lr).",
    )
    sft_grad_clip: float = key(
        bounds=POSITIVE,
        default=1.0,
        doc="Grad-norm clip of the SFT step (the RL step's is actor.grad_clip, 0.7 in their script). Authors: 1.0.",
    )
    sft_entropy_coeff: float = key(
        default=0.001, doc="Entropy bonus of the SFT loss: NLL - coeff * token-mean entropy. Authors: 0.001."
    )

    def validate(self) -> list[str]:
        errors = []
        if self.sft_data_size > 0 and self.sft_data_size % self.sft_mini_batch_size:  # theirs asserts both
            errors.append(
                f"'algorithm.relift.sft_data_size'={self.sft_data_size} must be a multiple of "
                f"'algorithm.relift.sft_mini_batch_size'={self.sft_mini_batch_size}"
            )
        if self.sft_mini_batch_size % self.sft_micro_batch_size:
            errors.append(
                f"'algorithm.relift.sft_mini_batch_size'={self.sft_mini_batch_size} must be a multiple of "
                f"'algorithm.relift.sft_micro_batch_size'={self.sft_micro_batch_size}"
            )
        return errors


def relift_memory(sections) -> dict:
    """The SFT stage in the memory plan (luffy_pool/memory_plan/method_extras.py): its own AdamW, and its
    micro-batch of padded prompt + demonstration rows; none when the stage is off (``sft_data_size=-1``)."""
    k = sections.knobs
    if k.sft_data_size == -1:
        return {}
    return {
        "sft_stage": {
            "name": "ReLIFT SFT stage",
            "budget_key": "algorithm.relift.sft_micro_batch_size",
            "moments": "ReLIFT SFT AdamW moments (2 x fp32)",
            "micro_rows": int(k.sft_micro_batch_size),
        }
    }


class ReliftStage(StepHooks):
    """The driver half of ReLIFT: the hard-question buffer and the SFT trigger, a hook of the step built from its
    context (luffy_pool/methods/hooks.py: ``sections``, ``wg``, ``tokenizer``, ``world_size``)."""

    name = "relift"

    def __init__(self, trainer):
        from deepscaler.rewards import fail_success_values

        s = trainer.sections
        self.knobs = k = s.knobs
        self.trainer = trainer
        self.buffer = HardBuffer(int(k.sft_data_size))
        self.fail_value, _ = fail_success_values(int(s.data.reward_impl_version))
        self._step_prompts: dict = {}  # dataset index -> this step's prompt row (before the rollout takes the target)
        if self.enabled:
            if k.sft_data_size % trainer.world_size:
                raise ValueError(
                    f"algorithm.relift.sft_data_size={k.sft_data_size} must be a multiple of the "
                    f"{trainer.world_size} actor ranks (each rank trains an equal share of the SFT batch)"
                )
            trainer.wg.init_sft_optimizer(self.sft_config(s))

    @property
    def enabled(self) -> bool:
        return int(self.knobs.sft_data_size) != -1  # their RL-only baseline (train_rl.sh) sets -1

    @staticmethod
    def sft_config(sections) -> dict:
        """The workers' SFT stage (luffy_pool/workers/interleaved_sft.py ``InterleavedSftConfig``, sent as a dict):
        ``algorithm.relift`` plus the actor's betas and weight decay (as theirs)."""
        k, optim = sections.knobs, sections.workers.actor.optim
        return dict(
            lr=float(k.sft_lr),
            betas=tuple(optim.betas),
            weight_decay=float(optim.weight_decay),
            grad_clip=float(k.sft_grad_clip),
            mini_batch_size=int(k.sft_mini_batch_size),
            micro_batch_size=int(k.sft_micro_batch_size),
            epochs=int(k.sft_epochs),
            entropy_coeff=float(k.sft_entropy_coeff),
        )

    # ------------------------------------------------------------------ the step's hooks
    def compose(self, batch):
        self.before_rollout(batch)
        return batch, {}

    def before_rollout(self, batch) -> None:
        """Keep the step's prompts and demonstrations (the rollout moves the targets into its slots)."""
        b = batch.batch
        if "tgt_input_ids" not in b.keys():
            raise ValueError("algorithm.method=relift needs each prompt's demonstration (data.target_key) in the batch")
        index = batch.non_tensor_batch["index"]
        self._step_prompts = {_key(index[i]): {k: b[k][i].clone() for k in PROMPT_KEYS} for i in range(len(index))}

    def after_update(self, batch, timing: dict) -> dict:
        """Buffer this step's hard questions; run the SFT stage when the buffer is full. Metrics ``relift/*``."""
        scores = batch.batch["token_level_scores"].sum(-1)
        uids = list(batch.non_tensor_batch["uid"])
        hard = hard_question_uids(scores, uids, fail_value=self.fail_value)
        first_row = {u: i for i, u in reversed(list(enumerate(uids)))}
        index = batch.non_tensor_batch["index"]
        self.buffer.add([self._step_prompts[_key(index[first_row[u]])] for u in hard])
        self._step_prompts = {}
        metrics = {"relift/hard_questions": len(hard), "relift/sft_rows": 0}
        if self.buffer.ready():
            t0 = time.perf_counter()
            rows = self.buffer.take()
            metrics["relift/sft_rows"] = len(rows)
            metrics.update(self._sft_stage(rows))
            timing["sft_update_actor"] = timing.get("sft_update_actor", 0.0) + time.perf_counter() - t0
        metrics["relift/buffer_size"] = len(self.buffer.rows)
        return metrics

    def _sft_stage(self, rows: list[dict]) -> dict:
        from verl.protocol import DataProto
        from verl.trainer.ppo.metric_utils import reduce_metrics
        from verl.utils.seqlen_balancing import balance_batch_rows

        tok = self.trainer.tokenizer
        stacked = {k: torch.stack([r[k] for r in rows]) for k in PROMPT_KEYS}
        tensors = demonstration_batch(
            stacked["input_ids"],
            stacked["attention_mask"],
            stacked["position_ids"],
            stacked["tgt_input_ids"],
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        data = DataProto.from_dict(tensors=tensors)
        if self.trainer.sections.trainer.balance_batch:  # theirs balances the SFT batch across ranks too
            balance_batch_rows(data, self.trainer.world_size)
        out = self.trainer.wg.sft_update_actor(data)
        return reduce_metrics(out.meta_info["metrics"])

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])


def _key(value):
    return value.item() if isinstance(value, np.generic) else value


RELIFT = register_method(
    Method(
        name="relift",
        mechanism="on-policy GRPO; questions with no success go to a buffer, trained by interleaved SFT "
        "with its own optimizer once it holds sft_data_size demonstrations",
        knobs=ReliftKnobs,
        hooks=ReliftStage,
        memory=relift_memory,
        needs_demonstration=True,
        stateful=True,
        scaled_keys=(
            "algorithm.relift.sft_data_size",
            "algorithm.relift.sft_mini_batch_size",
            "algorithm.relift.sft_micro_batch_size",
        ),
    )
)
