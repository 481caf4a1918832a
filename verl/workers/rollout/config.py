"""The rollout section's engine keys: LUFFY's defaults, type coercion and bad-value errors.

Shared by the vLLM and the HF rollout, and free of engine imports so the key surface is unit-tested
without starting an engine. The trainer passes its whole ``actor_rollout_ref.rollout`` section; keys
that belong to other parts (prefix strategy, ``n_val``, ...) are ignored here. The dataclass defaults serve
an engine built on its own (benchmarks, engine tests); a worker always passes the composed group, so every key
the YAML holds takes the YAML's value (tests/verl/workers/rollout/test_vllm_rollout_config.py checks this).
"""
from __future__ import annotations

import dataclasses
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
_LOGPROBS_MODES = {"processed_logprobs", "raw_logprobs"}
_TRANSPORTS = {"auto", "tensors", "bytes"}


@dataclasses.dataclass
class RolloutEngineConfig:
    """The engine-relevant subset of ``actor_rollout_ref.rollout`` with LUFFY's defaults."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    prompt_length: int = 512
    response_length: int = 512
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    enforce_eager: bool = True
    free_cache_engine: bool = True
    dtype: str = "auto"
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    seed: int = 0
    load_format: str = "auto"
    # CPU only: the KV cache is sized explicitly; without it vLLM reserves ~90% of host RAM.
    cpu_kv_cache_bytes: int = 64 * 2**20
    # Log-prob of each sampled id under the distribution actually sampled from (temperature, then
    # top-k/top-p); with LUFFY's top_p=1, top_k=-1 this equals log_softmax(logits / T), which is what
    # the actor recomputes.
    logprobs_mode: str = "processed_logprobs"
    # GPU sleep level between generations: 1 copies the weights to host memory and back, 2 drops them
    # (every wake-up follows a full weight sync that overwrites them; YAML rollout.sleep_level).
    sleep_level: int = 2
    weight_transport: str = "auto"
    # Engine rebuilds allowed per generate call when it raises (LUFFY retries after engine failures).
    max_engine_restarts: int = 1
    # HF backend: rows per decoding micro-batch (YAML key hf_micro_batch_size).
    micro_batch_size: int = 256
    # HF backend decode loop: "kv" = the lean static-KV loop over the model's weights (kv_decoder.py;
    # Llama-family layouts), "generic" = model(...) per token, "auto" = kv when the model fits.
    hf_decoder: str = "auto"
    max_model_len: Optional[int] = None

    @property
    def engine_max_model_len(self) -> int:
        return self.max_model_len or (self.prompt_length + self.response_length)


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


def parse_rollout_config(config: Optional[Mapping[str, Any]]) -> RolloutEngineConfig:
    """Read the engine keys from a dict / OmegaConf node, validate them and fill LUFFY's defaults."""
    if config is None:
        return RolloutEngineConfig()
    if not isinstance(config, Mapping):
        try:
            from omegaconf import OmegaConf

            config = OmegaConf.to_container(config, resolve=True)
        except Exception as exc:  # not an OmegaConf node either
            raise TypeError(f"rollout config must be a mapping or OmegaConf node, got {type(config)}") from exc
    if "hf_micro_batch_size" in config and config.get("micro_batch_size") is None:
        config = dict(config, micro_batch_size=config["hf_micro_batch_size"])
    kinds = {f.name: f.type for f in dataclasses.fields(RolloutEngineConfig)}
    types = {"float": float, "int": int, "bool": bool, "str": str, "Optional[int]": int}
    values = {}
    for name, kind_name in kinds.items():
        if name not in config or config[name] is None:
            continue
        values[name] = _coerce(name, config[name], types[str(kind_name)])
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
                "max_num_batched_tokens", "micro_batch_size", "cpu_kv_cache_bytes"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"rollout.{key} must be >= 1, got {getattr(cfg, key)}")
    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise ValueError(f"rollout.gpu_memory_utilization must be in (0, 1], got {cfg.gpu_memory_utilization}")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"rollout.dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
    if cfg.load_format not in LOAD_FORMATS:
        raise ValueError(f"rollout.load_format must be one of {sorted(LOAD_FORMATS)}, got {cfg.load_format!r}")
    if cfg.logprobs_mode not in _LOGPROBS_MODES:
        raise ValueError(f"rollout.logprobs_mode must be one of {sorted(_LOGPROBS_MODES)}, got {cfg.logprobs_mode!r}")
    if cfg.hf_decoder not in ("auto", "kv", "generic"):
        raise ValueError(f"rollout.hf_decoder must be auto, kv or generic, got {cfg.hf_decoder!r}")
    if cfg.sleep_level not in (1, 2):
        raise ValueError(f"rollout.sleep_level must be 1 or 2, got {cfg.sleep_level}")
    if cfg.weight_transport not in _TRANSPORTS:
        raise ValueError(f"rollout.weight_transport must be one of {sorted(_TRANSPORTS)}, got {cfg.weight_transport!r}")
    if cfg.max_engine_restarts < 0:
        raise ValueError(f"rollout.max_engine_restarts must be >= 0, got {cfg.max_engine_restarts}")
