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
    model_type: str = ""  # HF model_type ("qwen2", "qwen3_moe", ...): the layout search's tp plan families
    qkv_bias: bool = True  # Qwen2 always; Llama/Qwen3 per ``attention_bias``
    qk_norm: bool = False  # Qwen3: an RMSNorm of head_dim on q and on k
    mlp_bias: bool = False
    # MoE (Qwen3-MoE / Qwen2-MoE field names): experts per MoE layer, routed per token, their width, the
    # shared expert's width, and how many of the layers are MoE layers (the others are dense MLPs).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layers: int = 0

    def _attn_params(self) -> int:
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        bias = (q + 2 * kv) if self.qkv_bias else 0
        return h * q + 2 * h * kv + q * h + bias + (2 * hd if self.qk_norm else 0)

    def _dense_mlp_params(self, width: int) -> int:
        return 3 * self.hidden_size * width + ((2 * width + self.hidden_size) if self.mlp_bias else 0)

    def _moe_mlp_params(self) -> int:
        h = self.hidden_size
        shared = self.shared_expert_intermediate_size
        experts = self.num_experts * self._dense_mlp_params(self.moe_intermediate_size)
        return experts + h * self.num_experts + ((self._dense_mlp_params(shared) + h) if shared else 0)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (the largest: an MoE layer holds every expert): attention (q/k/v
        biases as the architecture has them, Qwen3's q/k norms), the MLP or the experts + router, two norms."""
        mlp = self._moe_mlp_params() if self.moe_layers else self._dense_mlp_params(self.intermediate_size)
        return self._attn_params() + mlp + 2 * self.hidden_size

    @property
    def embed_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """All parameters; a tied head shares the embedding (no separate lm_head weight)."""
        head = 0 if self.tie_word_embeddings else self.embed_params
        dense_layers = self.num_hidden_layers - self.moe_layers
        body = (
            self.num_hidden_layers * (self._attn_params() + 2 * self.hidden_size)
            + dense_layers * self._dense_mlp_params(self.intermediate_size)
            + self.moe_layers * self._moe_mlp_params()
        )
        return body + self.embed_params + head + self.hidden_size

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (MoE: only its routed experts; dense models: ``params``)."""
        idle = self.num_experts - self.num_experts_per_tok
        return self.params - self.moe_layers * idle * self._dense_mlp_params(self.moe_intermediate_size)

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
        layers = int(cfg["num_hidden_layers"])
        model_type = str(cfg.get("model_type", ""))
        return ModelShape(
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 0),
            source=source,
            model_type=model_type,
            **_architecture(cfg, model_type, layers),
        )
    except KeyError as exc:
        raise ValueError(f"{source}: model config has no {exc.args[0]!r} field") from None


def _architecture(cfg: dict, model_type: str, layers: int) -> dict:
    """Biases, q/k norms and MoE sizes of an HF config (none without a model_type: Qwen2's, the defaults)."""
    if not model_type:
        return {}
    out = {
        "qkv_bias": model_type.startswith("qwen2") or bool(cfg.get("attention_bias", False)),
        "qk_norm": model_type.startswith("qwen3"),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
    }
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    if experts:
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense = set(cfg.get("mlp_only_layers") or [])
        out.update(
            num_experts=experts,
            num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
            moe_layers=sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0),
        )
    return out


# FALLBACK only, for hub ids not in the HF cache (an offline laptop): values as in each model's published
# config.json. A model folder or a cached config always wins; the plan names the source it used.
_QWEN25_MATH_7B = dict(
    model_type="qwen2",
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)
_LLAMA31_8B = dict(
    model_type="llama",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
)
_QWEN3_8B = dict(
    model_type="qwen3",
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=False,
)
KNOWN_SHAPES: dict[str, dict] = {
    # LUFFY's model: Qwen2.5-Math-7B with rope_theta raised for 16k positions.
    "Elliott/Qwen2.5-Math-7B-16k-think": dict(_QWEN25_MATH_7B, max_position_embeddings=16384),
    "Qwen/Qwen2.5-Math-7B": dict(_QWEN25_MATH_7B, max_position_embeddings=4096),
    "Qwen/Qwen2.5-7B-Instruct": dict(_QWEN25_MATH_7B, max_position_embeddings=32768),
    "Qwen/Qwen2.5-Math-1.5B": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA31_8B,
    # the models of exp_scripts/overrides/ (tests/data/model_configs has their config.json files)
    "meta-llama/Llama-3.1-8B": _LLAMA31_8B,
    "Qwen/Qwen3-8B": dict(_QWEN3_8B, max_position_embeddings=40960),
    "Qwen/Qwen3-8B-Base": dict(_QWEN3_8B, max_position_embeddings=32768),
    # the large-model recipes (train_32b.sh, train_moe.sh) and the 72B row of docs/memory.md's table; their
    # config.json files and sources: tests/data/model_configs/README.md
    "Qwen/Qwen2.5-32B": dict(
        model_type="qwen2",
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    "Qwen/Qwen2.5-72B-Instruct": dict(
        model_type="qwen2",
        hidden_size=8192,
        intermediate_size=29568,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
    ),
    "Qwen/Qwen3-30B-A3B-Base": dict(
        model_type="qwen3_moe",
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
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
    raise FileNotFoundError(
        f"actor_rollout_ref.model.path={name}: no local config.json, not in the HF cache and not in "
        f"the fallback table ({', '.join(sorted(KNOWN_SHAPES))}); pass --model-config PATH"
    )
