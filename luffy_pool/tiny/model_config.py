"""Shrink a real model's ``config.json`` to a tiny one: only sizes change, every other field is kept.

A rehearsal that keeps only ``model_type`` never exercises what differs between the models LUFFY users
train: tied embeddings (Qwen2.5-Math-1.5B), Llama-3.1's ``llama3`` rope scaling, Qwen3's q/k norms,
rope_theta, attention/MLP biases, sliding-window keys, MoE routing. ``shrink_config`` copies the real
config and changes only:

- layers to ``layers``; heads to what SP and TP divide (``kv_heads`` given by the caller, ``GROUPS`` query
  heads per kv head when the real model has grouped-query attention, one when it has none); ``head_dim`` to
  ``HEAD_DIM``; hidden size to
  heads x head_dim times the real ``hidden / (heads x head_dim)`` (Qwen3-MoE's 0.5 is kept); intermediate
  size to twice the hidden size;
- the vocabulary to the tiny tokenizer's length, and the special-token ids onto its special tokens
  (``map_token_ids``);
- per-layer lists and counts (``layer_types``, ``mlp_only_layers``, ``max_window_layers``) to the new depth;
- MoE sizes (experts, active experts, expert widths) to a few small experts that still route top-k;
- the checkpoint dtype (``torch_dtype``) to bfloat16, as the published checkpoints ship.

``shrink_config`` returns the tiny config and a record of the fields it kept and the ones it shrank
(``{field: [real, tiny]}``), which the rehearsal prints.
"""

from __future__ import annotations

import json
import math
from typing import Any

HEAD_DIM = 32  # vLLM-CPU has no attention kernel for head_dim 16
# Query heads per kv head of a GQA model. The real factor (Qwen2.5-Math-7B 7, Llama-3.1-8B 4) changes no code
# path (repeat_kv and vLLM's GQA take any factor) but sets the size: 7 made the 7B's tiny model 14 heads,
# hidden 448, ~12x the weights per layer of 4 heads, and its rehearsals several times slower.
GROUPS = 2
LAYERS = 2
MOE_EXPERTS, MOE_ACTIVE = 4, 2
# Fields that name how big the model is; everything else is architecture and is copied verbatim.
SIZE_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_window_layers",
    "layer_types",
    "mlp_only_layers",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "torch_dtype",
    "dtype",
)
TOKEN_FIELDS = ("eos_token_id", "bos_token_id", "pad_token_id")
DROPPED = ("_name_or_path",)  # a path of the machine that wrote the real file


class ModelConfigError(ValueError):
    """A config.json the rehearsal cannot shrink (one line naming the file and the field)."""


def read_model_config(path: str) -> dict:
    """The JSON object of a ``config.json`` file (or of a folder's)."""
    import os

    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise ModelConfigError(f"--model-config {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"--model-config {file}: not JSON ({exc})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ModelConfigError(f"--model-config {file}: no 'model_type' field (not an HF config.json)")
    return cfg


def map_token_ids(real: dict, specials: list[int], token_map: dict | None = None) -> dict[str, Any]:
    """Real special-token ids -> tiny ids, keeping which of them are equal.

    The distinct real ids, EOS first (in list order), then BOS, then PAD, take ``specials`` in order; the
    tiny tokenizer's specials are (EOS ``<|im_end|>``, ``<|endoftext|>``, ``<|im_start|>``), so the real EOS
    is the token the tiny chat template ends a turn with and generation stops on it. A real config with
    bos == eos (Qwen base models) keeps bos == eos; Llama-3.1's distinct bos/eos stay distinct.
    With ``token_map`` (real id -> tiny id of the same special string: the tiny tokenizer carries the real
    model's specials, luffy_pool/tiny/model_tokens.py) every id maps through it instead.
    """
    if token_map is not None:
        from luffy_pool.tiny.model_tokens import map_ids

        return {f: map_ids(real[f], token_map, f"config.json {f}") for f in TOKEN_FIELDS if real.get(f) is not None}
    order: list[int] = []
    for field in TOKEN_FIELDS:
        value = real.get(field)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and v not in order:
                order.append(v)
    if len(order) > len(specials):
        raise ModelConfigError(
            f"{len(order)} distinct special-token ids {order}; the tiny tokenizer has {len(specials)}"
        )
    to_tiny = dict(zip(order, specials))
    out = {}
    for field in TOKEN_FIELDS:
        value = real.get(field)
        if isinstance(value, list):
            out[field] = [to_tiny[v] for v in value]
        elif isinstance(value, int):
            out[field] = to_tiny[value]
    return out


def _moe_sizes(real: dict, hidden: int) -> dict:
    out = {}
    for field in ("num_experts", "num_local_experts", "n_routed_experts"):
        if real.get(field):
            out[field] = min(int(real[field]), MOE_EXPERTS)
    if real.get("num_experts_per_tok"):
        out["num_experts_per_tok"] = min(int(real["num_experts_per_tok"]), MOE_ACTIVE)
    if real.get("moe_intermediate_size"):
        out["moe_intermediate_size"] = hidden // 2
    if real.get("shared_expert_intermediate_size"):
        out["shared_expert_intermediate_size"] = hidden
    return out


def shrink_config(
    real: dict,
    kv_heads: int,
    vocab_size: int,
    specials: list[int],
    layers: int = LAYERS,
    source: str = "config.json",
    token_map: dict | None = None,
) -> tuple[dict, dict]:
    """(tiny config dict, ``{"kept": [fields], "shrunk": {field: [real, tiny]}, "tokens": ...}``)."""
    try:
        real_layers = int(real["num_hidden_layers"])
        real_heads = int(real["num_attention_heads"])
        real_hidden = int(real["hidden_size"])
    except KeyError as exc:
        raise ModelConfigError(f"{source}: no {exc.args[0]!r} field") from None
    real_kv = int(real.get("num_key_value_heads") or real_heads)
    real_head_dim = int(real.get("head_dim") or real_hidden // real_heads)
    groups = 1 if real_heads == real_kv else GROUPS  # GQA kept (q > kv) at its smallest factor
    heads = kv_heads * groups
    # Qwen3-MoE's hidden (2048) is half its heads x head_dim (32 x 128): keep that ratio, the decoder must not
    # assume hidden == heads x head_dim.
    ratio = real_hidden / (real_heads * real_head_dim)
    hidden = max(HEAD_DIM, int(round(heads * HEAD_DIM * ratio / 8)) * 8)
    sizes: dict[str, Any] = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab_size,
        "torch_dtype": "bfloat16",
    }
    if "head_dim" in real:
        sizes["head_dim"] = HEAD_DIM
    elif real_head_dim != HEAD_DIM and ratio != 1:
        raise ModelConfigError(f"{source}: hidden_size {real_hidden} is not heads x head_dim and no head_dim field")
    if "num_key_value_heads" not in real and kv_heads != heads:
        sizes["num_key_value_heads"] = kv_heads  # MHA model: the tiny one needs the field to split kv heads
    if real.get("max_window_layers") is not None:
        sizes["max_window_layers"] = min(layers, math.ceil(int(real["max_window_layers"]) * layers / real_layers))
    if isinstance(real.get("layer_types"), list):
        sizes["layer_types"] = real["layer_types"][:layers]
    if isinstance(real.get("mlp_only_layers"), list):
        sizes["mlp_only_layers"] = [i for i in real["mlp_only_layers"] if i < layers]
    sizes.update(_moe_sizes(real, hidden))
    tokens = map_token_ids(real, specials, token_map)
    tiny = {k: v for k, v in real.items() if k not in DROPPED and k != "dtype"}
    tiny.update(sizes)
    tiny.update(tokens)
    shrunk = {k: [real.get(k), v] for k, v in sizes.items() if real.get(k) != v}
    kept = sorted(k for k in real if k in tiny and tiny[k] == real[k] and k not in tokens)
    return tiny, {"kept": kept, "shrunk": shrunk, "tokens": {k: [real.get(k), v] for k, v in tokens.items()}}


MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def refusal(real: dict, source: str = "config.json") -> str | None:
    """Why a training run of this architecture cannot start here (one line), or None.

    MoE: transformers 5 builds each MoE layer's experts as fused parameters (``experts.gate_up_proj``) from
    one checkpoint tensor per expert. verl/utils/moe_layout.py converts the layouts it lists (Qwen3-MoE) for the
    meta-device shard loader and the weight push; any other MoE type would fail loading in the workers.
    """
    from verl.utils.moe_layout import LAYOUTS

    experts = next((int(real[f]) for f in MOE_FIELDS if real.get(f)), 0)
    if experts and real.get("model_type") not in LAYOUTS:
        return (
            f"{source}: {real.get('model_type')} is a mixture of experts ({experts} experts): its experts are fused "
            "by transformers on load from per-expert checkpoint tensors, a layout the meta-device shard loader "
            f"(verl/utils/moe_layout.py) converts only for {', '.join(sorted(LAYOUTS))}; this MoE type is not "
            "supported yet"
        )
    return None


def describe(record: dict) -> list[str]:
    """Report lines: the real fields kept, those shrunk (real -> tiny), the special-token mapping."""
    kept = ", ".join(record["kept"])
    shrunk = ", ".join(f"{k} {a}->{b}" for k, (a, b) in record["shrunk"].items())
    tokens = ", ".join(f"{k} {a}->{b}" for k, (a, b) in record["tokens"].items())
    return [
        f"kept from the real config: {kept}",
        f"shrunk: {shrunk}",
        f"special tokens (real -> tiny): {tokens or 'none'}",
    ]
