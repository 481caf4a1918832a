"""The actor's passes under pipeline parallelism (``DataParallelPPOActor`` with a ``PipelineModel``,
verl/utils/pipeline_parallel.py), and the full weights the stages hold, for the rollout push and the HF export.

Log-probs: the forward-only schedule over the rank's rows in pipeline micro-batches of the pass's micro-batch size
(at least pp of them), outputs broadcast from the last stage to every pp rank.

Update of one mini-batch, the same loss and gradients as the one-rank run whatever the loss (token-mean, seq-mean, a
method's own aggregation): (1) the forward-only schedule gives every pp rank the per-token log-probs and entropy of
the mini-batch; (2) every pp rank runs the actor's own loss (``_micro_batch_loss``: the registered policy loss and
the regularisers) on each of the update's micro-batches exactly as the one-rank loop does, on leaf copies of those
outputs, and back-propagates ``loss / gradient_accumulation`` into them: the loss gradients with respect to the
per-token outputs, and the step's metrics; (3) the training schedule back-propagates the linear surrogate
``sum(g_lp * log_probs + g_ent * entropy)`` (the row index of each pipeline micro-batch is its ``target``, so the
loss function finds its rows; ``scale_grads=False``), whose parameter gradients equal the loss's by the chain rule.
This costs one more forward per mini-batch than feeding the loss into the schedule directly, and in exchange the
pipeline micro-batches need not be the loss's micro-batches: the schedules want at least pp equal ones, the
update's may be one (micro = mini) or of varying rows (``use_dynamic_bsz``). The schedule's metadata pass calls the
surrogate on dummy outputs too; it has no side effects.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.distributed as dist

from verl.workers.sharding_manager import FSDPShardingManager

MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def pipeline_log_probs(actor, data, calculate_entropy: bool):
    """``compute_log_prob`` of ``data`` through the stages: (log-probs, entropy or None) ``[rows, R]`` on the CPU."""
    meta = data.meta_info
    batch = {k: data.batch[k] for k in MODEL_KEYS}
    rows, width = batch["input_ids"].shape
    if meta.get("use_dynamic_bsz"):  # the token budget in padded rows (every row of the pass has this width)
        per_chunk = max(1, int(meta.get("max_token_len") or 0) // width)
    else:
        per_chunk = int(meta.get("micro_batch_size") or rows)
    pipe = actor.pipeline
    packed = actor.use_remove_padding  # varlen attention only (DataParallelPPOActor.__init__)
    log_probs, entropy = pipe.forward(batch, pipe.n_chunks(rows, per_chunk), meta["temperature"], packed)
    return log_probs.cpu(), (entropy.cpu() if calculate_entropy else None)


def pipeline_mini_batch(
    actor, micro_batches: list, temperature: float, grad_accum: float, step_metrics, global_steps, update_state
) -> None:
    """Accumulate one mini-batch's gradients (``micro_batches``: the update's, as the one-rank loop gets them) into
    the stages' parameters and its metrics into ``step_metrics``."""
    if getattr(actor, "router_recorder", None) is not None:
        raise RuntimeError(  # pre-flight refuses it (pipeline_parallel.section_errors)
            "the MoE router's auxiliary loss is not collected through pipeline stages; set "
            "'actor_rollout_ref.actor.pipeline_model_parallel_size'=1 for an MoE model"
        )

    def micro_loss(mb, log_prob, entropy):
        loss, metrics, response_mask = actor._micro_batch_loss(mb, log_prob, entropy, global_steps, update_state)
        step_metrics.add_micro_batch(metrics, response_mask, mb.get("prefix_mask"))
        return loss / grad_accum

    pipeline_loss_backward(actor, micro_batches, temperature, micro_loss)


def pipeline_loss_backward(actor, micro_batches: list, temperature: float, micro_loss) -> None:
    """Accumulate into the stages' parameters the gradients of ``sum(micro_loss(mb, log_prob, entropy))`` over
    ``micro_batches`` (``micro_loss``: the scalar to back-propagate for one micro-batch on the device, from its
    per-token log-probs and entropy at ``temperature``): steps (1)-(3) of the module docstring. The update and
    ReLIFT's interleaved SFT stage (luffy_pool/workers/interleaved_sft.py) run their losses through it."""
    pipe = actor.pipeline
    batch = {k: torch.cat([mb[k] for mb in micro_batches]) for k in MODEL_KEYS}
    sizes = [mb["input_ids"].size(0) for mb in micro_batches]
    n_chunks = pipe.n_chunks(sum(sizes), max(sizes))
    packed = actor.use_remove_padding
    log_probs, entropy = pipe.forward(batch, n_chunks, temperature, packed)
    grad_lp, grad_ent = torch.zeros_like(log_probs), torch.zeros_like(entropy)
    start = 0
    for mb, size in zip(micro_batches, sizes):
        mb = {k: v.to(actor.device) for k, v in mb.items()}
        rows = slice(start, start + size)
        lp = log_probs[rows].clone().requires_grad_(True)
        ent = entropy[rows].clone().requires_grad_(True)
        micro_loss(mb, lp, ent).backward()
        for grad, leaf in ((grad_lp, lp), (grad_ent, ent)):
            if leaf.grad is not None:  # None: the loss did not use it (no regulariser token)
                grad[rows] = leaf.grad
        start += size
    pipe.backward(batch, n_chunks, temperature, grad_lp, grad_ent, packed)


def _owner_stage(name: str, n_layers: int, n_stages: int) -> int:
    """The stage holding parameter ``name`` of the unsplit model (original FQN)."""
    parts = name.split(".")
    if "layers" in parts:
        layer = int(parts[parts.index("layers") + 1])
        return layer // (n_layers // n_stages)
    return 0 if "embed_tokens" in parts else n_stages - 1


class PipelineFullWeights:
    """The full weights of every stage, on every rank, in the unsplit model's order (``named_tensors``): the owning
    pp rank gathers each tensor over its dp/tp shards, then broadcasts it over the pp group, so each rank's rollout
    engine receives all layers and rank 0 can write the HF export. Every rank must iterate."""

    def __init__(self, pipe, full_model: torch.nn.Module):
        """``full_model``: the unsplit model (meta is enough) for the names, shapes and dtypes."""
        cfg = full_model.config
        self.pipe = pipe
        self.config = cfg
        self._entries = [
            (name, tuple(t.shape), t.dtype, _owner_stage(name, cfg.num_hidden_layers, pipe.n_stages) % pipe.pp)
            for name, t in full_model.state_dict(keep_vars=True).items()
        ]

    def train(self, mode: bool = True):
        self.pipe.module.train(mode)
        return self

    def named_tensors(self, dtype=None):
        """``(HF name, full tensor on the device)`` of every parameter, cast to ``dtype`` (None: as trained) on the
        owner before the broadcast."""
        from verl.utils.fsdp_utils import _full_tensor, to_torch_dtype

        pipe, dtype = self.pipe, to_torch_dtype(dtype)
        own = pipe.module.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, shape, own_dtype, owner in self._entries:
                if owner == pipe.pp_rank:
                    tensor = _full_tensor(own[name].detach(), dtype).to(pipe.device).contiguous()
                else:
                    tensor = torch.empty(shape, dtype=dtype or own_dtype, device=pipe.device)
                dist.broadcast(tensor, src=dist.get_global_rank(pipe.pp_group, owner), group=pipe.pp_group)
                yield name, tensor

    def full_state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """Every tensor on the CPU on rank 0, ``{}`` on the others (``gather_full_state_dict``'s contract: the HF
        export's input)."""
        keep = dist.get_rank() == 0
        state = OrderedDict()
        for name, tensor in self.named_tensors():
            if keep:
                state[name] = tensor.cpu()
        return state


class PipelineShardingManager(FSDPShardingManager):
    """``FSDPShardingManager`` whose ``module`` is a ``PipelineFullWeights``: the push streams every stage's tensors
    (dense models: no MoE renaming)."""

    def _weight_buckets(self):
        from verl.utils.fsdp_utils import iter_buckets

        return iter_buckets(self.module.named_tensors(self.sync_dtype), self.bucket_bytes)
