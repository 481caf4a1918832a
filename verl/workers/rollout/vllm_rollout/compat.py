"""Start-up check that the installed vLLM has the in-place reload the weight sync needs (docs/DESIGN.md §2 item 9).

``WeightSyncExtension`` runs vLLM's in-place reload once per push in its three steps (``initialize_layerwise_reload``,
the model's ``load_weights`` per bucket, ``finalize_layerwise_reload``, then the runner's ``reset_*`` calls: what the
worker's ``reload_weights(weights_iterator=...)`` does in one call), which older vLLM releases lack; without this
check such a run would build its engines, generate once and fail at the first weight push of the first step.
Checked before any engine is built, on the vLLM that is imported.

The worker forwards the call to its model runner, and vLLM 0.32 has two: ``Worker._make_model_runner``
(``vllm/v1/worker/gpu_worker.py``) builds Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``) when
``VllmConfig.use_v2_model_runner`` holds, which is the default on CUDA with Triton
(``vllm/config/vllm.py``), and the V1 runner (``vllm/v1/worker/gpu_model_runner.py``) otherwise, e.g. on
this CPU build (no Triton). Both runners are checked, so a GPU run is covered although every vLLM test
here runs V1. A runner module that does not import is not a reload problem (vLLM would fail to build it
first), except V1, which the worker module itself imports.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Optional

REQUIRED = (
    "Worker.reload_weights(weights_iterator=...) and its layer-wise steps "
    "(vllm.model_executor.model_loader.reload initialize_layerwise_reload / finalize_layerwise_reload)"
)
LAYERWISE = ("initialize_layerwise_reload", "finalize_layerwise_reload")
# (name, module, class) of each model runner the vLLM 0.32 GPU worker may build (see the docstring).
MODEL_RUNNERS = (
    ("V1", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    ("V2", "vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
)


def _runner_problem(label: str, module_name: str, class_name: str) -> Optional[str]:
    try:
        runner = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        return None if label != "V1" else f"its {label} model runner ({module_name}) cannot be imported"
    reload = getattr(runner, "reload_weights", None)
    if reload is None or "weights_iterator" not in inspect.signature(reload).parameters:
        return f"its model runner {label} ({module_name}.{class_name}) has no reload_weights(weights_iterator=...)"
    from verl.workers.rollout.vllm_rollout.worker_extension import RUNNER_RESETS

    lacking = [name for name in ("get_model",) + RUNNER_RESETS if not callable(getattr(runner, name, None))]
    if lacking:
        return f"its model runner {label} ({module_name}.{class_name}) has no {', '.join(lacking)}"
    return None


def missing_reload_api() -> Optional[str]:
    """Why the installed vLLM cannot take pushed weights, or None when it can."""
    try:
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as err:
        return f"its v1 worker cannot be imported ({err})"
    if not callable(getattr(Worker, "reload_weights", None)):
        return "vllm.v1.worker.gpu_worker.Worker has no reload_weights"
    try:
        reload_module = importlib.import_module("vllm.model_executor.model_loader.reload")
    except ImportError as err:
        return f"its layer-wise reload cannot be imported ({err})"
    lacking = [name for name in LAYERWISE if not callable(getattr(reload_module, name, None))]
    if lacking:
        return f"vllm.model_executor.model_loader.reload has no {', '.join(lacking)}"
    for label, module_name, class_name in MODEL_RUNNERS:
        problem = _runner_problem(label, module_name, class_name)
        if problem is not None:
            return problem
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
    raise RuntimeError(
        f"the installed vLLM ({version}) cannot receive trainer weights: {problem}; the weight sync "
        f"needs {REQUIRED} (vLLM 0.32.0: requirements-gpu.txt / requirements.txt)"
    )
