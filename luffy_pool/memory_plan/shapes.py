"""Model shapes for the memory plan: read from the model's ``config.json`` only (no weights, no torch).

``model_shape(path)`` accepts a local folder (or a ``config.json`` file), a hub id whose config is in the
HF cache (read offline, nothing is downloaded), or, for hub ids not cached, one of ``KNOWN_SHAPES``: a
small FALLBACK table of the models the shipped recipes name, copied from their published config.json;
the plan prints which source it used. ``--model-config FILE`` (CLI) names a config.json explicitly.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a decoder-only transformer (HF config field names)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int
    max_position_embeddings: int = 0
    source: str = ""

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (q/k/v with biases as Qwen2, o, gate/up/down, two norms)."""
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        attn = h * q + q + 2 * (h * kv + kv) + q * h
        return attn + 3 * h * self.intermediate_size + 2 * h

    @property
    def embed_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.embed_params
        return self.num_hidden_layers * self.layer_params + self.embed_params + head + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of every layer for one token on one TP shard (vLLM splits KV heads over TP, >= 1 each)."""
        heads = max(1, self.num_key_value_heads // tp)
        return 2 * self.num_hidden_layers * heads * self.head_dim * dtype_bytes


def shape_from_dict(cfg: dict, source: str) -> ModelShape:
    """The shape of an HF config dict (text config of multimodal wrappers too)."""
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return ModelShape(hidden_size=hidden, intermediate_size=int(cfg["intermediate_size"]),
                          num_hidden_layers=int(cfg["num_hidden_layers"]), num_attention_heads=heads,
                          num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                          vocab_size=int(cfg["vocab_size"]), tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                          head_dim=int(cfg.get("head_dim") or hidden // heads),
                          max_position_embeddings=int(cfg.get("max_position_embeddings") or 0), source=source)
    except KeyError as exc:
        raise ValueError(f"{source}: model config has no {exc.args[0]!r} field") from None


# FALLBACK only, for hub ids not in the HF cache (an offline laptop): values as in each model's published
# config.json. A model folder or a cached config always wins; the plan names the source it used.
_QWEN25_MATH_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
KNOWN_SHAPES: dict[str, dict] = {
    # LUFFY's model: Qwen2.5-Math-7B with rope_theta raised for 16k positions.
    "Elliott/Qwen2.5-Math-7B-16k-think": dict(_QWEN25_MATH_7B, max_position_embeddings=16384),
    "Qwen/Qwen2.5-Math-7B": dict(_QWEN25_MATH_7B, max_position_embeddings=4096),
    "Qwen/Qwen2.5-7B-Instruct": dict(_QWEN25_MATH_7B, max_position_embeddings=32768),
    "Qwen/Qwen2.5-Math-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                   tie_word_embeddings=True, max_position_embeddings=4096),
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True, max_position_embeddings=32768),
    "meta-llama/Llama-3.1-8B-Instruct": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                             tie_word_embeddings=False, max_position_embeddings=131072),
}


def _cached_config(repo_id: str, cache_dir: Optional[str] = None) -> Optional[str]:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # a laptop without huggingface_hub: the fallback table still works
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    except ValueError:  # not a valid repo id (a missing local path): not in the cache
        return None
    return found if isinstance(found, str) and os.path.isfile(found) else None


def model_shape(name: str, model_config: Optional[str] = None, cache_dir: Optional[str] = None) -> ModelShape:
    """Shape of ``name`` (folder, config.json, cached hub id or fallback table); ``model_config`` wins."""
    path = model_config or name
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if os.path.isfile(path):
        with open(path) as f:
            return shape_from_dict(json.load(f), path)
    if model_config:
        raise FileNotFoundError(f"--model-config {model_config}: no such file or folder")
    cached = _cached_config(name, cache_dir)
    if cached:
        with open(cached) as f:
            return shape_from_dict(json.load(f), f"HF cache {cached}")
    if name in KNOWN_SHAPES:
        return shape_from_dict(KNOWN_SHAPES[name], f"FALLBACK table for {name} (not in the HF cache)")
    raise FileNotFoundError(f"actor_rollout_ref.model.path={name}: no local config.json, not in the HF cache and not in "
                            f"the fallback table ({', '.join(sorted(KNOWN_SHAPES))}); pass --model-config PATH")
