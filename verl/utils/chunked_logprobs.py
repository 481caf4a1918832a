"""Token log-probs and entropy straight from hidden states, the LM head applied in token chunks.

The actor needs, for each response token, ``log softmax(h W^T / τ)[label]`` and the entropy of that
distribution. Computing the logits for a whole micro-batch at once costs ``[tokens, V]`` fp32 (with
V = 151936 that is 0.6 MB per token, ~10 GB for a 16k-token micro-batch) plus as much again in
backward. Here the head runs on ``chunk_size`` tokens at a time: forward keeps only the per-token
results; backward recomputes each chunk's logits (one extra ``[chunk, H] x [H, V]`` matmul) and folds
the gradient straight into ``dH`` and ``dW``, so peak memory is a few ``[chunk, V]`` fp32 buffers
however many tokens the micro-batch holds.

Numerics follow the dense path of ``dp_actor`` exactly: the matmul runs in the hidden states' dtype
(bf16 under mixed precision), the logits are cast to fp32, then divided by the temperature; the
gradient of the logits is cast back to that dtype before the two matmuls of the head's backward.
``dW`` is accumulated over chunks in fp32 and rounded once.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["chunked_logprobs_entropy", "dense_logprobs_entropy"]


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], temperature: float
) -> torch.Tensor:
    """fp32 logits of one chunk, exactly as ``lm_head(h).float() / temperature``."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        logits.div_(temperature)  # a fresh buffer (never called under autograd): no second [n, V] copy
    return logits


def _chunk_forward(logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool):
    """(log p[label], entropy or None, logsumexp) of fp32 logits ``[n, V]``."""
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:  # H = lse - sum(p z): two [n, V] buffers at most (logits, p*z)
        entropy = lse - torch.softmax(logits, dim=-1).mul_(logits).sum(dim=-1)
    return logp, entropy, lse


def _check(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_size: int) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [T, H] and weight [V, H]; got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must be [T] = {tuple(hidden.shape[:1])}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


class _ChunkedHead(torch.autograd.Function):
    """Forward: per-token (log p, entropy) chunk by chunk. Backward: logits recomputed per chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        for s in range(0, n, chunk_size):
            logits = _chunk_logits(hidden[s : s + chunk_size], weight, bias, temperature)
            lp, ent, chunk_lse = _chunk_forward(logits, labels[s : s + chunk_size], with_entropy)
            logp[s : s + chunk_size] = lp
            lse[s : s + chunk_size] = chunk_lse
            if ent is not None:
                entropy[s : s + chunk_size] = ent
            del logits
        if not with_entropy:
            entropy.zero_()
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n = hidden.shape[0]
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        use_entropy = ctx.with_entropy and grad_entropy is not None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        # One chunk: dW is one matmul, as in the dense path. Several half-precision chunks: sum in fp32.
        accumulate_fp32 = n > chunk_size and weight.dtype != torch.float32
        grad_w = None
        for s in range(0, n, chunk_size):
            h, g_lp = hidden[s : s + chunk_size], grad_logp[s : s + chunk_size].unsqueeze(-1)
            log_p = _chunk_logits(h, weight, bias, temperature).sub_(lse[s : s + chunk_size].unsqueeze(-1))
            probs = torch.exp(log_p)
            # d log p[label]/dz = onehot - p;  dH/dz = -p (log p + H):  dz = onehot*g_lp - p (g_lp + g_H (log p + H))
            if use_entropy:
                coeff = log_p.add_(entropy[s : s + chunk_size].unsqueeze(-1))
                coeff.mul_(grad_entropy[s : s + chunk_size].unsqueeze(-1)).add_(g_lp)
                grad_z = probs.mul_(coeff).neg_()
                del coeff  # the log_p buffer: free it before dW's [V, H] is allocated
            else:
                grad_z = probs.mul_(-g_lp)
            del log_p, probs  # grad_z is the one [chunk, V] buffer left
            grad_z.scatter_add_(-1, labels[s : s + chunk_size].unsqueeze(-1), g_lp)
            if temperature != 1.0:
                grad_z.div_(temperature)
            grad_z = grad_z.to(hidden.dtype)
            if need_h:
                grad_h[s : s + chunk_size] = grad_z @ weight
            if need_w:
                if grad_w is None:
                    grad_w = grad_z.t() @ h
                    grad_w = grad_w.float() if accumulate_fp32 else grad_w
                elif accumulate_fp32:
                    grad_w.add_(grad_z.t() @ h)
                else:
                    grad_w.addmm_(grad_z.t(), h)
            if need_b:
                grad_b.add_(grad_z.sum(0, dtype=torch.float32))
            del grad_z
        if need_w:
            grad_w = torch.zeros_like(weight) if grad_w is None else grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_logprobs_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log p(labels), entropy)`` per token, fp32 ``[T]``, of the LM head ``hidden @ weight.T + bias``.

    Args:
        hidden: ``[T, H]`` final hidden states of the tokens whose next token is scored.
        weight: ``[V, H]`` output embedding (``lm_head.weight``); ``bias`` ``[V]`` if the head has one.
        labels: ``[T]`` token ids scored at each position.
        temperature: logits are divided by it (after the fp32 cast), as in the rollout.
        chunk_size: tokens per chunk; peak memory is a few ``[chunk_size, V]`` fp32 buffers.
        with_entropy: also return the entropy (None otherwise).

    Gradients reach ``hidden``, ``weight`` and ``bias`` through a backward that recomputes each chunk's
    logits; without grad the chunks are simply evaluated and dropped.
    """
    _check(hidden, weight, labels, chunk_size)
    temperature = float(temperature)
    needs_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if needs_grad:
        logp, entropy = _ChunkedHead.apply(hidden, weight, bias, labels, temperature, chunk_size, with_entropy)
        return logp, (entropy if with_entropy else None)
    logps, ents = [], []
    for s in range(0, hidden.shape[0], chunk_size):
        logits = _chunk_logits(hidden[s : s + chunk_size], weight, bias, temperature)
        lp, ent, _ = _chunk_forward(logits, labels[s : s + chunk_size], with_entropy)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty.clone() if with_entropy else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def dense_logprobs_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Reference: the same quantities through one ``[T, V]`` logits tensor and autograd (tests, benchmarks)."""
    from verl.utils.torch_functional import logprobs_and_entropy_from_logits, logprobs_from_logits

    logits = _chunk_logits(hidden, weight, bias, float(temperature))
    if with_entropy:
        return logprobs_and_entropy_from_logits(logits, labels)
    return logprobs_from_logits(logits, labels), None
