"""Fallback rollout: an unsharded HF copy of the policy decoding with its own KV-cache loop.

The loop (rather than ``model.generate``) gives three things the trainer needs: per-row token caps,
a seeded ``torch.Generator``, and dropping rows from the batch as soon as they finish. Static
batching wastes 40-50% of decode work on finished rows when lengths vary (docs/CPU_STACK.md §5); here a
finished row leaves the batch and its KV cache at the next step. Rows are decoded in micro-batches
sorted by (cap, prompt length) so little padding is carried.

Two loops share that contract: the lean static-KV loop of ``kv_decoder.py`` (Llama-family layouts;
fused projections, shared-prompt prefill, a few ops per layer) and the generic one here that calls
``model(...)`` per token with a ``DynamicCache`` (any causal LM). ``rollout.hf_decoder`` picks.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from verl.workers.rollout.base import BaseRollout, GenerationOutput, SamplingSpec
from verl.workers.rollout.config import RolloutEngineConfig, engine_config

_GREEDY_EPS = 1e-5


def _resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def _as_id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) masking, as vLLM's sampler orders them."""
    scores = logits if temperature == 1.0 else logits / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p (the top one always stays).
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def inverse_cdf_sample(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One id per row drawn from ``probs [rows, vocab]`` (rows need not sum exactly to 1).

    Inverse-CDF sampling with one uniform per row: exact, seeded by ``generator``, and ~6x cheaper on
    CPU than ``torch.multinomial`` (which draws an exponential per vocabulary entry). ``right=True``
    never returns a zero-probability id: it picks the first id whose cumulative mass exceeds the draw.
    """
    cdf = probs.cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)
    ids = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return ids.clamp_(max=probs.shape[-1] - 1)


def sample_next_tokens(
    logits: torch.Tensor, sampling: SamplingSpec, generator: Optional[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one id per row; return (ids, log-prob of each id under the distribution sampled from)."""
    if sampling.temperature < _GREEDY_EPS:
        logp = torch.log_softmax(logits, dim=-1)
        ids = logits.argmax(dim=-1)
    else:
        logp = torch.log_softmax(filter_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p), -1)
        ids = inverse_cdf_sample(logp.exp(), generator)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1)


class HFRollout(BaseRollout):
    """``BaseRollout`` over a plain (unsharded) ``AutoModelForCausalLM`` inference copy.

    Log-probs are those of the sampled ids under the distribution actually sampled from: raw
    ``log_softmax(logits)`` for greedy, else ``log_softmax`` of the temperature-scaled, top-k/top-p
    masked logits (equal to ``log_softmax(logits / T)`` with LUFFY's top_p=1, top_k=-1), matching
    vLLM's ``processed_logprobs``.
    """

    def __init__(
        self,
        model_path: str,
        config: Any,
        device: str = "cpu",
        model: Optional[torch.nn.Module] = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.config: RolloutEngineConfig = engine_config(config)  # the rollout section (RolloutSection)
        self.device = torch.device(device)
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=_resolve_dtype(self.config.dtype, self.device.type), attn_implementation="sdpa"
            )
        self.model = model.to(self.device).eval()
        self.model.requires_grad_(False)
        gen_cfg = getattr(self.model, "generation_config", None)
        self.eos_ids = _as_id_set(getattr(gen_cfg, "eos_token_id", None)) or _as_id_set(self.model.config.eos_token_id)
        pad = getattr(gen_cfg, "pad_token_id", None)
        if pad is None:
            pad = self.model.config.pad_token_id
        self.pad_id = int(pad) if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)
        from verl.utils.moe_layout import model_layout, per_expert_views

        # pushed weights come under checkpoint names: fused MoE experts as per-expert views of their storage
        self._params = per_expert_views(self.model.state_dict(keep_vars=True), model_layout(self.model))
        # Names that share one storage (tied embeddings): pushing any of them updates all.
        by_storage: dict[int, list[str]] = {}
        for name, tensor in self._params.items():
            by_storage.setdefault(tensor.data_ptr(), []).append(name)
        self._aliases = {name: tuple(group) for group in by_storage.values() for name in group}
        self._names_seen: set[str] = set()
        self.weights_version = 0
        self.kv_decoder = self._pick_decoder(self.config.hf_decoder)

    def _pick_decoder(self, choice: str):
        from verl.workers.rollout.kv_decoder import KVDecoder, supports

        if choice == "generic":
            return None
        ok, why = supports(self.model)
        if not ok:
            if choice == "kv":
                raise ValueError(f"rollout.hf_decoder=kv: {why}; use hf_decoder=generic (or auto)")
            return None
        return KVDecoder(self.model)

    # ------------------------------------------------------------------------------- generation
    def generate_token_ids(
        self, prompt_token_ids: list[list[int]], max_tokens: list[int], sampling: SamplingSpec
    ) -> GenerationOutput:
        if len(prompt_token_ids) != len(max_tokens):
            raise ValueError(f"{len(prompt_token_ids)} prompts but {len(max_tokens)} max_tokens entries")
        for i, (ids, cap) in enumerate(zip(prompt_token_ids, max_tokens)):
            if cap < 0:
                raise ValueError(f"max_tokens[{i}]={cap} is negative")
            if cap > 0 and not ids:
                raise ValueError(f"prompt {i} is empty")
        token_ids: list[list[int]] = [[] for _ in prompt_token_ids]
        logprobs = [torch.zeros(0) for _ in prompt_token_ids] if sampling.return_logprobs else None
        rows = sorted(
            (i for i, cap in enumerate(max_tokens) if cap > 0),
            key=lambda i: (max_tokens[i], len(prompt_token_ids[i])),
            reverse=True,
        )
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        mb = self.config.hf_micro_batch_size
        for start in range(0, len(rows), mb):
            chunk = rows[start : start + mb]
            prompts, caps = [prompt_token_ids[i] for i in chunk], [max_tokens[i] for i in chunk]
            if self.kv_decoder is not None:
                self.kv_decoder.refresh(self.weights_version)
                eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=self.device)
                ids, lps = self.kv_decoder.decode(
                    prompts,
                    caps,
                    self.pad_id,
                    eos,
                    sampling.ignore_eos,
                    lambda logits: sample_next_tokens(logits, sampling, generator),
                )
            else:
                ids, lps = self._decode(prompts, caps, sampling, generator)
            for i, row_ids, row_lps in zip(chunk, ids, lps):
                token_ids[i] = row_ids
                if logprobs is not None:
                    logprobs[i] = torch.tensor(row_lps, dtype=torch.float32)  # GenerationOutput: a tensor per row
        return GenerationOutput(token_ids=token_ids, logprobs=logprobs)

    @torch.no_grad()
    def _decode(
        self, prompts: list[list[int]], caps: list[int], sampling: SamplingSpec, generator: Optional[torch.Generator]
    ) -> tuple[list[list[int]], list[list[float]]]:
        from transformers import DynamicCache

        batch, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for r, ids in enumerate(prompts):  # left padding keeps every row's last token in the last column
            input_ids[r, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[r, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = (
            self.model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            .logits[:, -1]
            .float()
        )
        next_pos = positions[:, -1] + 1
        active = torch.arange(batch, device=self.device)  # row of each live batch entry
        caps_left = torch.tensor(caps, device=self.device)
        eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=self.device)
        out_ids: list[list[int]] = [[] for _ in prompts]
        out_lps: list[list[float]] = [[] for _ in prompts]
        while True:
            ids, lps = sample_next_tokens(logits, sampling, generator)
            for r, tok, lp in zip(active.tolist(), ids.tolist(), lps.tolist()):
                out_ids[r].append(tok)
                out_lps[r].append(lp)
            caps_left = caps_left - 1
            done = caps_left <= 0
            if not sampling.ignore_eos and eos.numel():
                done |= torch.isin(ids, eos)
            if bool(done.all()):
                break
            if bool(done.any()):
                keep = (~done).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                active, caps_left, ids = active[keep], caps_left[keep], ids[keep]
                attention, next_pos = attention[keep], next_pos[keep]
            attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=-1)
            logits = (
                self.model(
                    input_ids=ids[:, None],
                    attention_mask=attention,
                    position_ids=next_pos[:, None],
                    past_key_values=cache,
                    use_cache=True,
                )
                .logits[:, -1]
                .float()
            )
            next_pos = next_pos + 1
        return out_ids, out_lps

    # ------------------------------------------------------------------------------ weight sync
    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            target = self._params.get(name)
            if target is None:
                raise KeyError(f"pushed weight {name!r} is not a tensor of the HF rollout model")
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"pushed weight {name!r} has shape {tuple(tensor.shape)}, "
                    f"the rollout model expects {tuple(target.shape)}"
                )
            target.data.copy_(tensor)
            self._names_seen.update(self._aliases[name])

    def after_weight_update(self) -> None:
        missing = sorted(set(self._params) - self._names_seen)
        self._names_seen = set()
        if missing:
            raise RuntimeError(f"weight sync incomplete: {len(missing)} tensors were not pushed, e.g. {missing[:5]}")
        self.weights_version += 1
