"""Token log-probs and entropy from a vocabulary-parallel LM head, chunked over tokens, without a vocab gather.

Under tensor parallelism (``verl/utils/tensor_parallel.py``) each tp rank holds rows ``[v0, v0 + V/tp)`` of the LM
head. For every chunk of tokens the rank computes its ``[chunk, V/tp]`` logits and the tp group agrees on
``log softmax`` and the entropy through two all-reduces: the max over the vocabulary, then one sum of
(exp-sum, chosen-token logit, exp-weighted logit sum). This is Megatron-LM's vocab-parallel cross-entropy
(NVIDIA/Megatron-LM ``megatron/core/tensor_parallel/cross_entropy.py``, commit 8e6e7cd) with the entropy added and
the head's matmul inside the chunk loop; NeMo-RL's ``ChunkedDistributedLogprob`` (NVIDIA-NeMo/RL
``nemo_rl/distributed/model_utils.py``, commit 8c6d533) chunks the same reduction over tokens of given logits.

Backward recomputes each chunk's local logits, as ``verl.utils.chunked_logprobs`` does, folds the logit gradient
into the local weight's gradient and into a partial hidden-state gradient, and sums the latter over the tp group
once (every tp rank holds the same, replicated hidden states). Numerics follow ``chunked_logprobs``: the matmul
runs in the hidden states' dtype, the logits are cast to fp32, then divided by the temperature.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from verl.utils.chunked_logprobs import _chunk_logits

__all__ = ["vocab_parallel_logprobs_entropy"]


def _chunk_stats(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, group, with_entropy: bool):
    """(log p[label], entropy or None, logsumexp) of the tp group's vocabulary, from this rank's ``[n, V/tp]`` fp32
    logits (a buffer of the caller's it overwrites)."""
    local_v = logits.shape[-1]
    local = labels - vocab_start
    mine = (local >= 0) & (local < local_v)
    target = logits.gather(-1, local.clamp(0, local_v - 1).unsqueeze(-1)).squeeze(-1) * mine
    zmax = logits.max(dim=-1).values
    dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=group)
    shifted = logits.sub_(zmax.unsqueeze(-1))  # in place: two [n, V/tp] buffers at most (shifted, exp)
    exp = shifted.exp()
    sum_exp = exp.sum(-1)
    sums = torch.stack([sum_exp, target, exp.mul_(shifted).sum(-1) if with_entropy else torch.zeros_like(target)])
    dist.all_reduce(sums, group=group)
    lse = zmax + sums[0].log()
    logp = sums[1] - lse
    # H = lse - sum(p z) = log s - sum(e^(z-m) (z-m)) / s with s = sum e^(z-m)
    entropy = sums[0].log() - sums[2] / sums[0] if with_entropy else None
    return logp, entropy, lse


class _VocabParallelHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy, vocab_start, group):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_zeros(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        for s in range(0, n, chunk_size):
            logits = _chunk_logits(hidden[s : s + chunk_size], weight, bias, temperature)
            lp, ent, chunk_lse = _chunk_stats(logits, labels[s : s + chunk_size], vocab_start, group, with_entropy)
            logp[s : s + chunk_size], lse[s : s + chunk_size] = lp, chunk_lse
            if ent is not None:
                entropy[s : s + chunk_size] = ent
            del logits
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.args = (temperature, chunk_size, with_entropy, vocab_start, group)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        temperature, chunk_size, with_entropy, vocab_start, group = ctx.args
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n, local_v = hidden.shape[0], weight.shape[0]
        grad_logp = torch.zeros_like(lse) if grad_logp is None else grad_logp
        use_entropy = with_entropy and grad_entropy is not None
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(local_v, dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, n, chunk_size):
            h, g_lp = hidden[s : s + chunk_size], grad_logp[s : s + chunk_size].unsqueeze(-1)
            log_p = _chunk_logits(h, weight, bias, temperature).sub_(lse[s : s + chunk_size].unsqueeze(-1))
            probs = torch.exp(log_p)
            # dz = onehot * g_lp - p (g_lp + g_H (log p + H)), the onehot only where the label is this rank's
            if use_entropy:
                coeff = log_p.add_(entropy[s : s + chunk_size].unsqueeze(-1))
                coeff.mul_(grad_entropy[s : s + chunk_size].unsqueeze(-1)).add_(g_lp)
                grad_z = probs.mul_(coeff).neg_()
            else:
                grad_z = probs.mul_(-g_lp)
            local = labels[s : s + chunk_size] - vocab_start
            mine = ((local >= 0) & (local < local_v)).unsqueeze(-1)
            grad_z.scatter_add_(-1, local.clamp(0, local_v - 1).unsqueeze(-1), g_lp * mine)
            if temperature != 1.0:
                grad_z.div_(temperature)
            grad_z = grad_z.to(hidden.dtype)
            if need_h:
                grad_h[s : s + chunk_size] = grad_z @ weight
            if need_w:
                grad_w.add_(grad_z.t() @ h)
            if need_b:
                grad_b.add_(grad_z.sum(0, dtype=torch.float32))
        if need_h:  # each rank's share of dL/dh comes from its vocabulary rows
            dist.all_reduce(grad_h, group=group)
            grad_h = grad_h.to(hidden.dtype)
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def vocab_parallel_logprobs_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_start: int,
    group,
    bias: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log p(labels), entropy)`` per token, fp32 ``[T]``, over the whole vocabulary of a head split by rows.

    Args:
        hidden: ``[T, H]`` final hidden states, the same on every rank of ``group``.
        weight: ``[V_local, H]`` this rank's rows of the head (global rows ``vocab_start ...``); ``bias`` likewise.
        labels: ``[T]`` global token ids (the same on every rank).
        group: the tensor-parallel process group holding the other rows.
        chunk_size: tokens per chunk; per-rank peak memory is a few ``[chunk_size, V_local]`` fp32 buffers.

    Every rank of ``group`` must call it with the same token count (the all-reduces are per chunk).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [T, H] and weight [V, H]; got {tuple(hidden.shape)}, {tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must be [T] = {tuple(hidden.shape[:1])}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    args = (float(temperature), int(chunk_size), bool(with_entropy), int(vocab_start), group)
    if torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        logp, entropy = _VocabParallelHead.apply(hidden, weight, bias, labels, *args)
        return logp, (entropy if with_entropy else None)
    logps, ents = [], []
    for s in range(0, hidden.shape[0], chunk_size):
        logits = _chunk_logits(hidden[s : s + chunk_size], weight, bias, args[0])
        lp, ent, _ = _chunk_stats(logits, labels[s : s + chunk_size], args[3], group, with_entropy)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty.clone() if with_entropy else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)
