"""Lean decode loop for Llama-family causal LMs: a pre-allocated KV cache driven by the HF module's weights.

``HFRollout`` decodes through ``model(...)`` one token at a time. For the small models of CPU runs,
each such call costs far more in Python (mask building, cache bookkeeping, module dispatch) than in
arithmetic, so decoding is overhead bound. This module runs the same network as a handful of tensor
ops per layer over the HF model's own parameters:

* one fused q/k/v matmul and one fused gate/up matmul per layer (fused copies, rebuilt whenever the
  rollout's weights version changes; every other weight is used in place),
* a static KV cache ``[rows, kv_heads, prompt_width + cap, head_dim]`` written in place (left-padded
  prompts, so every row writes the same column at each step),
* shared-prompt prefill: identical prompts (the n samples of a GRPO group) are prefilled once and
  their cache rows copied, so a group of n costs one prompt forward, not n,
* finished rows leave the batch (their cache rows are dropped), as in the HF loop,
* one-token steps on 2-D activations: attention as two batched matmuls over the cache (no SDPA call,
  whose per-call set-up dominated at this size), the residual adds fused into the output matmuls
  (``addmm``), RMSNorm weights folded into the next projection (float32), ``rotate_half`` as one matmul
  by a signed permutation, queries pre-scaled through the rope tables, and
  only the bookkeeping a step needs (caps checked in Python, EOS only when it can stop a row).

Supported: decoder layers of the ``LlamaDecoderLayer`` shape (``self_attn.{q,k,v,o}_proj``, optional
``q_norm``/``k_norm`` as in Qwen3, ``mlp.{gate,up,down}_proj`` with SiLU, RMSNorms), full attention,
rotary embeddings from the model's own ``rotary_emb``. ``supports(model)`` says whether a model fits;
``HFRollout`` falls back to its generic loop otherwise.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def supports(model: torch.nn.Module) -> tuple[bool, str]:
    """(True, "") when ``model`` has the layout this decoder drives, else (False, why)."""
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return False, f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return False, f"hidden_act {cfg.hidden_act!r} (only silu)"
    # Qwen2 gates its window with use_sliding_window; Mistral has no such switch: a set sliding_window applies.
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    if window:
        return False, f"sliding-window attention (sliding_window={window})"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return False, f"layer types {sorted(set(layer_types))} (only full_attention)"
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(body, "rotary_emb"):
        return False, "no model.layers / model.rotary_emb"
    attn = body.layers[0].self_attn
    if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
        return False, "attention is not q/k/v/o projections"
    return True, ""


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _norm_eps(norm: torch.nn.Module) -> float:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm arithmetic (float32 statistics). Spelled out: ``F.rms_norm`` on CPU runs the same ops
    through a composite and cost ~2x more per call at decode sizes."""
    if x.dtype == torch.float32:
        return weight * (x * (x * x).mean(-1, keepdim=True).add_(eps).rsqrt_())
    x32 = x.float()
    x32 = x32 * (x32 * x32).mean(-1, keepdim=True).add_(eps).rsqrt_()
    return weight * x32.to(x.dtype)


class _Norm:
    """One RMSNorm, ready to apply. Folded (float32 models): its weight times ``sqrt(d)`` is multiplied into
    the next projection's input columns (``fold_into``) and only ``x * rsqrt(sum(x^2) + eps*d)`` is left,
    which is ``x * rsqrt(mean(x^2) + eps) / sqrt(d)``: 3 small ops fewer per norm than HF's spelling, same
    math. Otherwise HF's arithmetic with float32 statistics."""

    def __init__(self, norm: torch.nn.Module, fold: bool):
        self.weight, self.eps, self.fold = norm.weight, _norm_eps(norm), fold
        dim = norm.weight.shape[-1]
        self.scale = norm.weight * math.sqrt(dim)
        self.eps_d = torch.tensor(self.eps * dim, dtype=norm.weight.dtype, device=norm.weight.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fold:
            return x * (x * x).sum(-1, keepdim=True).add_(self.eps_d).rsqrt_()
        return _rms(x, self.weight, self.eps)

    def fold_into(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight [out, in]`` of the projection that reads this norm's output."""
        return weight * self.scale if self.fold else weight


def _rotation(head_dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``R`` with ``x @ R == rotate_half(x)`` (a signed permutation: the product is exact)."""
    half = head_dim // 2
    rot = torch.zeros(head_dim, head_dim, dtype=dtype, device=device)
    idx = torch.arange(half, device=device)
    rot[idx + half, idx] = -1.0  # out[:half] = -x[half:]
    rot[idx, idx + half] = 1.0  # out[half:] = x[:half]
    return rot


def _cat_bias(*linears: torch.nn.Linear) -> Optional[torch.Tensor]:
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears])


class _LayerWeights:
    """Fused projections of one decoder layer (views of nothing: concatenated copies, rebuilt per weights version)."""

    def __init__(self, layer: torch.nn.Module):
        attn, mlp = layer.self_attn, layer.mlp
        self.layer = layer
        fold = layer.input_layernorm.weight.dtype == torch.float32
        self.norm1 = _Norm(layer.input_layernorm, fold)
        self.norm2 = _Norm(layer.post_attention_layernorm, fold)
        self.qkv_w = self.norm1.fold_into(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        self.qkv_b = _cat_bias(attn.q_proj, attn.k_proj, attn.v_proj)
        self.q_out, self.kv_out = attn.q_proj.out_features, attn.k_proj.out_features
        self.gate_up_w = self.norm2.fold_into(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        self.gate_up_b = _cat_bias(mlp.gate_proj, mlp.up_proj)
        self.inter = mlp.gate_proj.out_features
        # Transposed views for addmm (residual + x @ W^T in one op); biases kept apart.
        self.o_wt, self.o_b = attn.o_proj.weight.t(), attn.o_proj.bias
        self.down_wt, self.down_b = mlp.down_proj.weight.t(), mlp.down_proj.bias
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        # Per-head norms (Qwen3) sit between projection and rope: nothing to fold them into.
        self.qk_norms = None if q_norm is None else (_Norm(q_norm, fold=False), _Norm(k_norm, fold=False))


class KVDecoder:
    """Sampling loop over a Llama-family HF model with a static KV cache (see the module docstring)."""

    def __init__(self, model: torch.nn.Module):
        ok, why = supports(model)
        if not ok:
            raise ValueError(f"KVDecoder cannot drive this model: {why}")
        self.model = model
        self.body = model.model
        cfg = model.config
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.scaling = float(self.body.layers[0].self_attn.scaling)
        self._layers: list[_LayerWeights] = []
        self._version = None

    def refresh(self, version) -> None:
        """Rebuild the fused weights when the parameters changed (``version`` differs from the last call)."""
        if version != self._version:
            with torch.no_grad():
                self._layers = [_LayerWeights(layer) for layer in self.body.layers]
                head, weight = self.model.lm_head, self.body.embed_tokens.weight
                self._final_norm = _Norm(self.body.norm, self.body.norm.weight.dtype == torch.float32)
                self._head = (self._final_norm.fold_into(head.weight), head.bias)
                self._rot = _rotation(self.head_dim, weight.dtype, weight.device)
            self._version = version

    # ------------------------------------------------------------------------------- network
    def _forward(
        self,
        ids: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: list,
        start: int,
        key_mask: torch.Tensor,
        last_only: bool,
    ) -> torch.Tensor:
        """Logits for ``ids [B, T]`` written at cache columns ``start..start+T``; keys ``< start+T`` visible
        where ``key_mask [B, start+T]`` is True, causally within the new block."""
        bsz, width = ids.shape
        end = start + width
        h = self.body.embed_tokens(ids)
        mask = key_mask[:, None, None, :end]
        if width > 1:
            causal = torch.ones(width, end, dtype=torch.bool, device=ids.device).tril(start)
            # Every query also sees its own column: a left-pad query would otherwise attend to nothing and
            # turn into NaN, which masked attention weights of 0 cannot cancel later (0 * NaN = NaN).
            own = torch.zeros_like(causal)
            own[torch.arange(width), start + torch.arange(width)] = True
            mask = (mask & causal[None, None]) | own[None, None]
        groups = self.num_heads // self.num_kv_heads
        for lw, (k_cache, v_cache) in zip(self._layers, cache):
            layer, attn = lw.layer, lw.layer.self_attn
            x = lw.norm1(h)
            qkv = F.linear(x, lw.qkv_w, lw.qkv_b)
            heads = self.num_heads + self.num_kv_heads
            qk = qkv[..., : lw.q_out + lw.kv_out].view(bsz, width, heads, self.head_dim)
            if lw.qk_norms is not None:
                q_norm, k_norm = lw.qk_norms
                qk = torch.cat([q_norm(qk[:, :, : self.num_heads]), k_norm(qk[:, :, self.num_heads :])], dim=2)
            qk = qk * cos + _rotate_half(qk) * sin  # q and k heads rotated together ([B, T, 1, D] tables)
            q = qk[:, :, : self.num_heads].transpose(1, 2)
            k = qk[:, :, self.num_heads :].transpose(1, 2)
            v = qkv[..., lw.q_out + lw.kv_out :].view(bsz, width, self.num_kv_heads, self.head_dim).transpose(1, 2)
            k_cache[:, :, start:end] = k
            v_cache[:, :, start:end] = v
            keys, values = k_cache[:, :, :end], v_cache[:, :, :end]
            if width == 1:
                # One new token: the query heads sharing a KV head act as that head's query rows, so
                # grouped-query attention needs no copy of the cache (heads h = j * groups + g use KV j).
                q = q.reshape(bsz, self.num_kv_heads, groups, self.head_dim)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
                out = out.reshape(bsz, 1, -1)
            else:
                if groups > 1:
                    keys = keys.repeat_interleave(groups, dim=1)
                    values = values.repeat_interleave(groups, dim=1)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
                out = out.transpose(1, 2).reshape(bsz, width, -1)
            h = h + attn.o_proj(out)
            x = lw.norm2(h)
            gate, up = F.linear(x, lw.gate_up_w, lw.gate_up_b).split([lw.inter, lw.inter], dim=-1)
            h = h + layer.mlp.down_proj(F.silu(gate) * up)
        if last_only:
            h = h[:, -1:]
        return F.linear(self._final_norm(h), *self._head).float()

    def _step(
        self, tok: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list, col: int, mask: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of one new token per row, written at cache column ``col``.

        ``cos``/``sin`` ``[B, H+KV, D]``, the query heads' rows already times the attention scale;
        ``caches`` per layer ``(k4, v4, k_t, v3)``: the cache as ``[B, KV, total, D]`` and as
        ``[B*KV, D, total]`` / ``[B*KV, total, D]`` views; ``mask`` the additive key mask ``[B*KV, 1, total]``.
        Query heads sharing a KV head are that head's query rows (heads ``h = j * groups + g`` use KV head
        ``j``), so grouped-query attention needs no copy of the cache.
        """
        bsz = tok.shape[0]
        heads, kv, dim = self.num_heads, self.num_kv_heads, self.head_dim
        end = col + 1
        mask = mask[:, :, :end]
        h = F.embedding(tok, self.body.embed_tokens.weight)
        for lw, (k4, v4, k_t, v3) in zip(self._layers, caches):
            x = lw.norm1(h)
            qkv = F.linear(x, lw.qkv_w, lw.qkv_b)
            qk = qkv[:, : lw.q_out + lw.kv_out].view(bsz, heads + kv, dim)
            if lw.qk_norms is not None:
                q_norm, k_norm = lw.qk_norms
                qk = torch.cat([q_norm(qk[:, :heads]), k_norm(qk[:, heads:])], dim=1)
            qk = qk * cos + torch.matmul(qk, self._rot) * sin
            k4[:, :, col] = qk[:, heads:]
            v4[:, :, col] = qkv[:, lw.q_out + lw.kv_out :].view(bsz, kv, dim)
            q = qk[:, :heads].reshape(bsz * kv, heads // kv, dim)
            probs = torch.bmm(q, k_t[:, :, :end]).add_(mask).softmax(-1)  # q arrives pre-scaled (see decode)
            out = torch.bmm(probs, v3[:, :end]).view(bsz, heads * dim)
            h = torch.addmm(h, out, lw.o_wt) if lw.o_b is None else torch.addmm(h + lw.o_b, out, lw.o_wt)
            x = lw.norm2(h)
            gate_up = F.linear(x, lw.gate_up_w, lw.gate_up_b)
            act = F.silu(gate_up[:, : lw.inter]) * gate_up[:, lw.inter :]
            h = torch.addmm(h, act, lw.down_wt) if lw.down_b is None else torch.addmm(h + lw.down_b, act, lw.down_wt)
        return F.linear(self._final_norm(h), *self._head).float()

    def _step_caches(self, cache: list, key_mask: torch.Tensor) -> tuple[list, torch.Tensor]:
        """The ``_step`` views of ``cache`` (contiguous ``[B, KV, total, D]`` pairs) and its additive mask."""
        bsz, kv, total, dim = cache[0][0].shape
        views = [(k, v, k.view(bsz * kv, total, dim).transpose(1, 2), v.view(bsz * kv, total, dim)) for k, v in cache]
        dtype = cache[0][0].dtype
        additive = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill_(
            ~key_mask, float("-inf")
        )
        return views, additive[:, None, None, :].expand(bsz, kv, 1, total).reshape(bsz * kv, 1, total)

    def _rope_table(self, length: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[length, head_dim]`` for positions ``0..length-1`` from the model's rotary module (its
        scaling variants included), computed once per decode call and indexed per step."""
        probe = torch.empty(0, dtype=dtype, device=device)
        cos, sin = self.body.rotary_emb(probe, torch.arange(length, device=device)[None])
        return cos[0].to(dtype), sin[0].to(dtype)

    @staticmethod
    def _rope(table: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor):
        """cos/sin ``[B, T, 1, head_dim]`` of ``positions [B, T]``."""
        return table[0][positions][:, :, None], table[1][positions][:, :, None]

    # ------------------------------------------------------------------------------- decode
    @torch.no_grad()
    def decode(
        self,
        prompts: list[list[int]],
        caps: list[int],
        pad_id: int,
        eos_ids: torch.Tensor,
        ignore_eos: bool,
        sample: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample up to ``caps[i] >= 1`` tokens after each prompt; ``sample(logits) -> (ids, logprobs)``."""
        if min(caps) < 1:
            raise ValueError(
                f"every cap must be >= 1 (rows with nothing to generate stay out of decode), got {min(caps)}"
            )
        device = self.body.embed_tokens.weight.device
        dtype = self.body.embed_tokens.weight.dtype
        rows, width, max_cap = len(prompts), max(len(p) for p in prompts), max(caps)
        # Shared-prompt prefill: one forward per distinct prompt.
        unique: dict[tuple, int] = {}
        row_src = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        uniq_prompts = list(unique)
        u = len(uniq_prompts)
        ids = torch.full((u, width), pad_id, dtype=torch.long)
        valid = torch.zeros((u, width), dtype=torch.bool)
        for r, p in enumerate(uniq_prompts):  # left padding: every row's last prompt token in the last column
            ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            valid[r, width - len(p) :] = True
        ids, valid = ids.to(device), valid.to(device)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        total = width + max_cap
        cache_u = [
            (
                torch.zeros(u, self.num_kv_heads, total, self.head_dim, dtype=dtype, device=device),
                torch.zeros(u, self.num_kv_heads, total, self.head_dim, dtype=dtype, device=device),
            )
            for _ in self._layers
        ]
        key_mask_u = torch.ones((u, total), dtype=torch.bool, device=device)
        key_mask_u[:, :width] = valid
        table = self._rope_table(total, dtype, device)
        cos, sin = self._rope(table, positions)
        logits_u = self._forward(ids, cos, sin, cache_u, 0, key_mask_u, last_only=True)[:, -1]
        src = torch.tensor(row_src, dtype=torch.long, device=device)
        cache = [(k.index_select(0, src), v.index_select(0, src)) for k, v in cache_u]
        key_mask = key_mask_u.index_select(0, src)
        logits = logits_u.index_select(0, src)
        # Rope rows for every step at once: row r's s-th new token sits at position last_prompt_pos + 1 + s.
        steps = torch.arange(max_cap, device=device)
        cos_all, sin_all = self._rope(table, positions[:, -1].index_select(0, src)[:, None] + 1 + steps)
        # Per head [rows, max_cap, H+KV, D], the query heads' rows times the attention scale: the rope step then
        # yields pre-scaled queries (a broadcast baddbmm with alpha cost 1.6x a bmm plus an in-place add).
        head_scale = torch.ones(self.num_heads + self.num_kv_heads, 1, dtype=dtype, device=device)
        head_scale[: self.num_heads] = self.scaling
        cos_all, sin_all = cos_all * head_scale, sin_all * head_scale
        views, mask = self._step_caches(cache, key_mask)
        check_eos = not ignore_eos and eos_ids.numel() > 0
        active = list(range(rows))
        active_t = None  # None while every row is still active, in order
        caps_t = torch.tensor(caps, device=device)
        min_cap = min(caps)
        out_ids = torch.zeros((rows, max_cap), dtype=torch.long, device=device)
        out_lps = torch.zeros((rows, max_cap), dtype=torch.float32, device=device)
        lengths = [0] * rows
        step = 0
        while True:
            tok, lp = sample(logits)
            if active_t is None:
                out_ids[:, step] = tok
                out_lps[:, step] = lp
            else:
                out_ids[active_t, step] = tok
                out_lps[active_t, step] = lp.float()
            emitted = step + 1
            done = caps_t <= emitted if emitted >= min_cap else None
            if check_eos:
                hit = tok == eos_ids if eos_ids.numel() == 1 else torch.isin(tok, eos_ids)
                done = hit if done is None else done | hit
            if done is not None and bool(done.any()):
                flags = done.tolist()
                for i, finished in enumerate(flags):
                    if finished:
                        lengths[active[i]] = emitted
                keep_idx = [i for i, finished in enumerate(flags) if not finished]
                if not keep_idx:
                    break
                keep = torch.tensor(keep_idx, dtype=torch.long, device=device)
                active = [active[i] for i in keep_idx]
                active_t = torch.tensor(active, dtype=torch.long, device=device)
                cache = [(k.index_select(0, keep), v.index_select(0, keep)) for k, v in cache]
                key_mask, caps_t, tok = key_mask[keep], caps_t[keep], tok[keep]
                cos_all, sin_all = cos_all[keep], sin_all[keep]
                min_cap = min(caps[i] for i in active)
                views, mask = self._step_caches(cache, key_mask)
            logits = self._step(tok, cos_all[:, step], sin_all[:, step], views, width + step, mask)
            step += 1
        ids_list, lps_list = out_ids.tolist(), out_lps.tolist()
        return ([row[:n] for row, n in zip(ids_list, lengths)], [row[:n] for row, n in zip(lps_list, lengths)])
