"""The rollout engine's config: the engine keys of the ``actor_rollout_ref.rollout`` section, coerced and checked.

Shared by the vLLM and the HF rollout, and free of engine imports so the key surface is unit-tested without
starting an engine. A run's worker builds it from its typed ``RolloutSection`` (every value from the YAML). An
engine built on its own (benchmarks, engine tests) passes a partial mapping: the missing keys take the YAML's
defaults (luffy_pool/config/mix_ppo_trainer.yaml), except the few in ``STANDALONE``, where an engine on its own
differs from a run. The dataclass has no defaults and no key the YAML cannot set; the value lists below are the
ones the key declarations (verl/workers/config_sections.py) take their choices from.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Mapping, Optional

# LUFFY's YAML spells the weight source the way verl's per-version vLLM forks did; with the
# in-place reload every push carries full HF-named tensors, so only "random init" vs "read the
# checkpoint" is left to choose.
LOAD_FORMATS = {
    "dummy_dtensor": "dummy",
    "dummy_hf": "dummy",
    "dummy_megatron": "dummy",
    "dummy": "dummy",
    "dtensor": "auto",
    "hf": "auto",
    "auto": "auto",
    "safetensors": "safetensors",
}
DTYPES = ("auto", "bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32")
_DTYPE_CANON = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
WEIGHT_TRANSPORTS = ("auto", "tensors", "bytes")
HF_DECODERS = ("auto", "kv", "generic")
# An engine on its own (no trainer pushing weights, one rank) reads its checkpoint, in the checkpoint's dtype,
# on one rank, with the HF engine's larger decoding micro-batch; every other key takes the YAML's default.
STANDALONE = {"load_format": "auto", "dtype": "auto", "tensor_model_parallel_size": 1, "hf_micro_batch_size": 256}
_YAML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "luffy_pool", "config",
                     "mix_ppo_trainer.yaml")


@dataclasses.dataclass
class RolloutEngineConfig:
    """The engine keys of ``actor_rollout_ref.rollout``, by their YAML names (documented there)."""

    temperature: float
    top_p: float
    top_k: int
    n: int
    prompt_length: int
    response_length: int
    tensor_model_parallel_size: int
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool
    free_cache_engine: bool
    dtype: str
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    seed: int
    load_format: str
    cpu_kv_cache_bytes: int  # CPU only: the KV cache is sized explicitly; without it vLLM reserves ~90% of host RAM
    logprobs_mode: str
    sleep_level: int
    weight_transport: str
    max_engine_restarts: int
    hf_micro_batch_size: int
    hf_decoder: str
    max_model_len: Optional[int]

    @property
    def engine_max_model_len(self) -> int:
        return self.max_model_len or (self.prompt_length + self.response_length)


@functools.lru_cache(maxsize=1)
def _yaml_defaults() -> dict:
    """The rollout group of the YAML, resolved (its lengths follow data.max_prompt_length / max_response_length)."""
    from verl.utils.config_schema import load_yaml_tree

    return load_yaml_tree(_YAML, resolve=True)["actor_rollout_ref"]["rollout"]


def _coerce(name: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"rollout.{name} must be a bool, got {value!r}")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ValueError(f"rollout.{name} must be an integer, got {value!r}")
        return int(value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"rollout.{name} must be a number, got {value!r}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"rollout.{name} must be a string, got {value!r}")
        return value
    return value


def parse_rollout_config(config: Any = None) -> RolloutEngineConfig:
    """The engine config of a run's ``RolloutSection`` (or its OmegaConf group), or of a partial mapping for an
    engine on its own (missing keys: the YAML's defaults and ``STANDALONE``); values coerced and checked."""
    names = [f.name for f in dataclasses.fields(RolloutEngineConfig)]
    if dataclasses.is_dataclass(config):  # the worker's typed section: every key is there
        given = {name: getattr(config, name) for name in names}
    else:
        if config is not None and not isinstance(config, Mapping):
            try:
                from omegaconf import OmegaConf

                config = OmegaConf.to_container(config, resolve=True)
            except Exception as exc:  # not an OmegaConf node either
                raise TypeError(f"rollout config must be a mapping or OmegaConf node, got {type(config)}") from exc
        config = dict(config or {})
        if "micro_batch_size" in config:  # the HF engine's own spelling of hf_micro_batch_size
            config.setdefault("hf_micro_batch_size", config.pop("micro_batch_size"))
        given = dict({k: _yaml_defaults()[k] for k in names}, **STANDALONE)
        given.update({k: v for k, v in config.items() if k in given and v is not None})
    kinds = {f.name: f.type for f in dataclasses.fields(RolloutEngineConfig)}
    types = {"float": float, "int": int, "bool": bool, "str": str, "Optional[int]": int}
    values = {name: given[name] if given[name] is None else _coerce(name, given[name], types[str(kinds[name])])
              for name in names}
    cfg = RolloutEngineConfig(**values)
    _validate(cfg)
    cfg.dtype = _DTYPE_CANON.get(cfg.dtype, cfg.dtype)
    cfg.load_format = LOAD_FORMATS[cfg.load_format]
    return cfg


def _validate(cfg: RolloutEngineConfig) -> None:
    if cfg.temperature < 0:
        raise ValueError(f"rollout.temperature must be >= 0, got {cfg.temperature}")
    if not 0 < cfg.top_p <= 1:
        raise ValueError(f"rollout.top_p must be in (0, 1], got {cfg.top_p}")
    if cfg.top_k < -1:
        raise ValueError(f"rollout.top_k must be -1 (off) or >= 0, got {cfg.top_k}")
    for key in ("n", "prompt_length", "response_length", "tensor_model_parallel_size", "max_num_seqs",
                "max_num_batched_tokens", "hf_micro_batch_size", "cpu_kv_cache_bytes"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"rollout.{key} must be >= 1, got {getattr(cfg, key)}")
    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise ValueError(f"rollout.gpu_memory_utilization must be in (0, 1], got {cfg.gpu_memory_utilization}")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"rollout.dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
    if cfg.load_format not in LOAD_FORMATS:
        raise ValueError(f"rollout.load_format must be one of {sorted(LOAD_FORMATS)}, got {cfg.load_format!r}")
    if cfg.logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"rollout.logprobs_mode must be one of {sorted(LOGPROBS_MODES)}, got {cfg.logprobs_mode!r}")
    if cfg.hf_decoder not in HF_DECODERS:
        raise ValueError(f"rollout.hf_decoder must be auto, kv or generic, got {cfg.hf_decoder!r}")
    if cfg.sleep_level not in (1, 2):
        raise ValueError(f"rollout.sleep_level must be 1 or 2, got {cfg.sleep_level}")
    if cfg.weight_transport not in WEIGHT_TRANSPORTS:
        raise ValueError(f"rollout.weight_transport must be one of {sorted(WEIGHT_TRANSPORTS)}, got {cfg.weight_transport!r}")
    if cfg.max_engine_restarts < 0:
        raise ValueError(f"rollout.max_engine_restarts must be >= 0, got {cfg.max_engine_restarts}")
