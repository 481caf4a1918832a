"""The CPU engine runs eager all the way: vLLM's module-level ``torch.compile`` helpers are unwrapped on CPU.

The product's ``build_engine_kwargs`` (verl/workers/rollout/vllm_rollout/config.py) builds CPU engines with
``enforce_eager=True`` (torch.compile on CPU costs minutes of start-up for no gain at the sizes a CPU run has).
``enforce_eager`` covers the model's graph, not the small helpers vLLM decorates at import with
``@torch.compile(backend=current_platform.simple_compile_backend)``, which is ``inductor`` on CPU too. With tensor parallelism the vocabulary-parallel embedding calls one of them,
``get_masked_input_and_mask``, on every forward: its first call traces it with dynamo and compiles it with
inductor (11 compiler and ISA-probe subprocesses), measured on a TP 2 rank of the train.sh rehearsal at 3.8 s
of wall time and ~5 CPU-s per rank, once per engine. The helper is a few pointwise ops, so on CPU it runs as
plain torch. GPU engines keep vLLM's compiled helper (the vLLM plugin, vllm_plugin.py, calls this on a CPU
platform only).
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger(__name__)

# (module, function) of vLLM's compiled helpers a CPU engine of this project reaches (dense decoder models,
# tensor parallel vocabulary embedding, the sampled tokens' log-probs of rollout correction: the sampler imports
# that one by name, so its module's binding is replaced too). A helper that a vLLM release drops or stops
# compiling is skipped.
COMPILED_HELPERS = (
    ("vllm.model_executor.layers.vocab_parallel_embedding", "get_masked_input_and_mask"),
    ("vllm.v1.sample.ops.logprobs", "batched_count_greater_than"),
    ("vllm.v1.sample.sampler", "batched_count_greater_than"),
)


def run_compiled_helpers_eager() -> list[str]:
    """Replace each helper of ``COMPILED_HELPERS`` by the function it wraps; returns ``module.function`` of
    each one replaced (the callers look the helper up in its module at call time, so this holds for engines
    built after it, and for ones built before that have not run the helper)."""
    replaced = []
    for module_name, name in COMPILED_HELPERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        helper = getattr(module, name, None)
        original = getattr(helper, "_torchdynamo_orig_callable", None)
        if original is None:  # not compiled in this release (or already unwrapped)
            continue
        setattr(module, name, original)
        replaced.append(f"{module_name}.{name}")
    if replaced:
        logger.debug("CPU engine runs eager: %s", ", ".join(replaced))
    return replaced
