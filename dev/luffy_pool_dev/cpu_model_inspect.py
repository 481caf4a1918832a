"""A CPU engine inspects its model class in its own process, not in a fresh interpreter.

Before vLLM builds a model it reads facts about the architecture's class (``_ModelInfo``: pooling, LoRA, PP
support, ...) through ``vllm.model_executor.models.registry._run_in_subprocess``: a new ``python -m
vllm.model_executor.models.registry`` that imports torch and vLLM again, so that the parent never initialises
CUDA. The answer is cached on disk by the model file's hash (``$VLLM_CACHE_ROOT/modelinfos``), so the cost falls
on each architecture's first engine on a machine, and on every rank that starts at once on a fresh one (CI's
case): in the first suite run on a new machine, 10 such interpreters ran at 9.5-11 CPU-s each (8 TP ranks of
concurrent rehearsals missed the cache together). A CPU engine has no CUDA to protect and has imported what the model
module needs already, so on device cpu the inspection runs in-process (same function, same cache file).
GPU engines keep vLLM's subprocess (the vLLM plugin, vllm_plugin.py, calls this on a CPU platform only).
"""

from __future__ import annotations


def _in_process(fn):
    return fn()


_in_process.luffy_in_process = True


def inspect_models_in_process() -> bool:
    """Route vLLM's model-class inspection through this process; False when this vLLM has no such hook."""
    try:
        from vllm.model_executor.models import registry
    except ImportError:
        return False
    if not callable(getattr(registry, "_run_in_subprocess", None)):
        return False
    registry._run_in_subprocess = _in_process
    return True
