"""Start-up check that the installed vLLM has the in-place reload the weight sync needs (review A10).

``WeightSyncExtension`` calls the worker's ``reload_weights(weights_iterator=...)``, which older vLLM
releases lack; without this check such a run would build its engines, generate once and fail at the
first weight push of the first step. Checked before any engine is built, on the vLLM that is imported.
"""
from __future__ import annotations

import inspect
from typing import Optional

REQUIRED = "Worker.reload_weights(weights_iterator=...)"


def missing_reload_api() -> Optional[str]:
    """Why the installed vLLM cannot take pushed weights, or None when it can."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as err:
        return f"its v1 worker cannot be imported ({err})"
    if not callable(getattr(Worker, "reload_weights", None)):
        return "vllm.v1.worker.gpu_worker.Worker has no reload_weights"
    runner_reload = getattr(GPUModelRunner, "reload_weights", None)
    if runner_reload is None or "weights_iterator" not in inspect.signature(runner_reload).parameters:
        return "its model runner's reload_weights takes no weights_iterator"
    return None


def check_reload_api() -> None:
    """Raise one line naming the installed vLLM version when the weight-sync API is missing."""
    problem = missing_reload_api()
    if problem is None:
        return
    try:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
    except ImportError:
        version = "not installed"
    raise RuntimeError(f"the installed vLLM ({version}) cannot receive trainer weights: {problem}; the weight sync "
                       f"needs {REQUIRED} (vLLM 0.32.0: requirements-gpu.txt / requirements.txt)")
