"""ReLIFT's interleaved SFT stage on one actor rank (``algorithm.method=relift``, luffy_pool/methods/relift.py).

A second AdamW over the same FSDP2 parameters, with its own lr and its own moments (the RL optimizer's state is
not touched), stepped on the demonstrations of the hard-question buffer. Mirrors TheRoadQaQ/ReLIFT
``actor.py`` ``sft_update_policy`` / ``_sft_optimizer_step`` and ``fsdp_worker.py`` ``sft_update_actor``:

- the rank's rows split into mini-batches of ``sft_mini_batch_size`` rows and micro-batches of
  ``sft_micro_batch_size``; each micro-batch loss (``relift_sft_loss``: token-mean NLL − entropy_coeff · token-mean
  entropy, forward at temperature 1.0) is divided by ``sft_mini_batch_size // sft_micro_batch_size``, as theirs
  (sizes in rows of the whole SFT batch, not per rank: with W ranks a rank's share of a mini-batch has 1/W of
  them, so the gradient is 1/W of the per-micro mean; AdamW is nearly invariant to that scale, the clip is not);
- the grad norm clipped at ``sft_grad_clip``, one optimizer step per mini-batch, no lr schedule; betas and
  weight decay are the actor's ``optim`` keys (theirs read the same optim config).

Differences kept visible: a non-finite grad norm skips the step (``actor.on_nonfinite`` as the RL step; theirs
steps on it); their SFT call also steps the RL lr scheduler, a no-op for their constant lr without warm-up, not
done here. The optimizer's state is saved with the checkpoint under ``actor/optim_sft/`` (theirs is not saved).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

SFT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
OPTIMIZER_NAME = "sft"  # its checkpoint folder is actor/optim_sft (verl/utils/checkpoint/layout.py)


@dataclass(frozen=True)
class InterleavedSftConfig:
    """What the driver sends ``init_sft_optimizer`` (from ``algorithm.relift`` and the actor's ``optim``)."""

    lr: float
    betas: tuple
    weight_decay: float
    grad_clip: float
    mini_batch_size: int
    micro_batch_size: int
    epochs: int
    entropy_coeff: float


def build_sft_optimizer(module: torch.nn.Module, cfg: InterleavedSftConfig, step_impl: str) -> torch.optim.Optimizer:
    """The SFT stage's own AdamW over ``module``'s trainable parameters (the same kernel choice as the RL one)."""
    from verl.utils.optim import build_adamw

    return build_adamw(
        module.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, step_impl=step_impl
    )


def sft_update(actor, optimizer: torch.optim.Optimizer, data, cfg: InterleavedSftConfig) -> dict[str, list]:
    """One SFT stage on this rank's rows (``data``: a DataProto with :data:`SFT_KEYS`); metric lists
    ``actor/sft_loss``, ``actor/sft_entropy_loss`` (per micro-batch), ``actor/sft_grad_norm`` (per step)."""
    from luffy_pool.methods.loss_inputs import FamilyLossInputs
    from luffy_pool.methods.relift import ReliftSftConfig, relift_sft_loss

    if cfg.mini_batch_size % cfg.micro_batch_size:
        raise ValueError(
            f"algorithm.relift.sft_mini_batch_size={cfg.mini_batch_size} must be a multiple of "
            f"sft_micro_batch_size={cfg.micro_batch_size}"
        )
    grad_accum = cfg.mini_batch_size // cfg.micro_batch_size
    loss_cfg = ReliftSftConfig(entropy_coeff=cfg.entropy_coeff)
    actor.actor_module.train()
    batch = data.batch.select(*SFT_KEYS)
    metrics: dict[str, list] = {"actor/sft_loss": [], "actor/sft_entropy_loss": [], "actor/sft_grad_norm": []}

    def micro_loss(mb, log_prob, entropy):
        mask = mb["attention_mask"][:, -mb["responses"].size(-1) :].float()
        # the entropy keeps its gradient: theirs is a bonus term of the SFT loss
        loss, out = relift_sft_loss(
            FamilyLossInputs(
                log_prob=log_prob, old_log_prob=None, advantages=None, response_mask=mask, entropy=entropy
            ),
            loss_cfg,
        )
        metrics["actor/sft_loss"].append(float(out["sft_loss"]))
        metrics["actor/sft_entropy_loss"].append(float(out["sft_entropy_loss"]))
        return loss / grad_accum

    for _epoch in range(cfg.epochs):
        for mini in batch.split(cfg.mini_batch_size):
            optimizer.zero_grad(set_to_none=True)
            micro_batches = [{k: micro[k] for k in SFT_KEYS} for micro in mini.split(cfg.micro_batch_size)]
            if actor.pipeline is not None:  # the stages run the forward and the backward (pipeline_actor.py)
                from verl.workers.actor.pipeline_actor import pipeline_loss_backward

                pipeline_loss_backward(actor, micro_batches, 1.0, micro_loss)
            for micro in micro_batches if actor.pipeline is None else ():
                mb = {k: v.to(actor.device) for k, v in micro.items()}
                entropy, log_prob = actor._forward_micro_batch(mb, temperature=1.0, calculate_entropy=True)
                micro_loss(mb, log_prob, entropy).backward()
            metrics["actor/sft_grad_norm"].append(_step(actor, optimizer, cfg.grad_clip))
    optimizer.zero_grad(set_to_none=True)
    return metrics


def _step(actor, optimizer: torch.optim.Optimizer, max_norm: float) -> float:
    """Clip to ``max_norm`` and step; a non-finite norm skips the step (or stops, ``actor.on_nonfinite``). As the RL
    step (``DataParallelPPOActor._optimizer_step``): tp-partial gradients (Qwen3's q/k norms, the sequence-parallel
    norms) summed over tp first, the norm over every pp stage."""
    from verl.utils.tensor_parallel import allreduce_replicated_grads

    allreduce_replicated_grads(actor.actor_module)
    params = list(actor.actor_module.parameters())
    if actor.grad_norm_device is not None:
        from verl.utils.grad_norm import clip_grad_norm_on_device

        pp = {} if actor.pipeline is None else {"pp_group": actor.pipeline.pp_group}
        norm = clip_grad_norm_on_device(params, max_norm, actor.grad_norm_device, **pp)
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if not math.isfinite(norm):
        if actor.update_config.on_nonfinite == "stop":
            from verl.workers.actor.dp_actor import NonFiniteLossError

            raise NonFiniteLossError(f"SFT grad norm is {norm}; stopping (actor.on_nonfinite=stop)")
        logger.warning("SFT grad norm is %s: skipping this SFT optimizer step", norm)
        optimizer.zero_grad(set_to_none=True)
        return norm
    optimizer.step()
    return norm
