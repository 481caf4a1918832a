"""``algorithm.method=relift`` (arXiv 2506.07527, METHODS_SPEC §2, TheRoadQaQ/ReLIFT ``relift/verl/verl/relift/``):
on-policy GRPO, plus an interleaved SFT stage with its own optimizer on the questions RL cannot solve.

RL steps are plain GRPO: no off-policy slot (``rollout.n_prefix=0``), verl's policy loss (``vanilla``; the launch
script makes it theirs: unclipped, sum / L). After each RL update, :class:`ReliftStage` puts every question whose
group has no success (all rows score the fail value of ``data.reward_impl_version``) with its demonstration
(``data.target_key``) at the front of the hard buffer; when the buffer holds ``algorithm.relift.sft_data_size``
rows, the newest that many become one SFT stage on the actor workers (``sft_update_actor``,
luffy_pool/workers/interleaved_sft.py: their own AdamW, lr ``sft_lr``, the ``relift_sft`` loss) and leave it.

Fixed here (the authors' code): a step with no hard question while the buffer is empty crashed theirs
(``len(None)``); neither the buffer nor the SFT optimizer was saved. Here the buffer goes into the checkpoint's
``data.pt`` (``register_state``) and the SFT optimizer's moments into ``actor/optim_sft/`` (DCP, resharded like
the RL optimizer's), both restored by ``resume_mode=auto``. Order of the hard questions: first appearance in the
updated batch, which our row balancing may have reordered (theirs: after their balancing, a different one).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

import numpy as np
import torch

from luffy_pool.methods.base import Method, register_method

logger = logging.getLogger(__name__)

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids", "tgt_input_ids")  # one buffer row: a prompt + its demo


class ReliftStage:
    """The driver half of ReLIFT: the hard-question buffer and the SFT trigger (``Method.stage``)."""

    def __init__(self, trainer):
        from deepscaler.rewards import fail_success_values
        from luffy_pool.algorithm.family.relift import HardBuffer

        s = trainer.sections
        self.knobs = k = s.algorithm.relift
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
            trainer.wg.init_sft_optimizer(asdict(self.sft_config(s)))
        if trainer.checkpointer is not None:  # before fit's resume restores it
            trainer.checkpointer.register_state("relift", self)

    @property
    def enabled(self) -> bool:
        return int(self.knobs.sft_data_size) != -1  # their RL-only baseline (train_rl.sh) sets -1

    @staticmethod
    def sft_config(sections):
        """The workers' SFT stage: ``algorithm.relift`` plus the actor's betas and weight decay (as theirs)."""
        from luffy_pool.workers.interleaved_sft import InterleavedSftConfig

        k, optim = sections.algorithm.relift, sections.workers.actor.optim
        return InterleavedSftConfig(
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
    def before_rollout(self, batch) -> None:
        """Keep the step's prompts and demonstrations (the rollout moves the targets into its slots)."""
        b = batch.batch
        if "tgt_input_ids" not in b.keys():
            raise ValueError("algorithm.method=relift needs each prompt's demonstration (data.target_key) in the batch")
        index = batch.non_tensor_batch["index"]
        self._step_prompts = {_key(index[i]): {k: b[k][i].clone() for k in PROMPT_KEYS} for i in range(len(index))}

    def after_update(self, batch, timing: dict) -> dict:
        """Buffer this step's hard questions; run the SFT stage when the buffer is full. Metrics ``relift/*``."""
        from luffy_pool.algorithm.family.relift import hard_question_uids

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
        from luffy_pool.algorithm.family.relift import demonstration_batch
        from verl.protocol import DataProto
        from verl.trainer.ppo.metric_utils import reduce_metrics
        from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

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
        world = self.trainer.world_size
        if self.trainer.sections.trainer.balance_batch:  # theirs balances the SFT batch across ranks too
            seqlens = tensors["attention_mask"].sum(-1).tolist()
            parts = get_seqlen_balanced_partitions(seqlens, k_partitions=world, equal_size=True)
            data.reorder(torch.tensor([i for p in parts for i in p]))
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
        requires={f"{A}.policy_loss": "vanilla"},
        replaces={f"{A}.use_off_policy_loss": False, f"{R}.n_prefix": 0},
        needs_demonstration=True,
        knobs="relift",
        stage=ReliftStage,
    )
)
