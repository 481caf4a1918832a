"""The values the rollout keys accept, in the YAML's spelling, and how the engines spell two of them.

The key declarations (verl/workers/config_sections.py ``RolloutSection``) take their choices from here and the
engine config (verl/workers/rollout/config.py) its spellings, so neither of those modules imports the other's
side: the declarations never import the engine config.
"""

from __future__ import annotations

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
DTYPE_CANON = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
WEIGHT_TRANSPORTS = ("auto", "tensors", "bytes")
HF_DECODERS = ("auto", "kv", "generic")
