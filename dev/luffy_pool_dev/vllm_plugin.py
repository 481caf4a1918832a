"""vLLM general plugin of the development package (entry point ``vllm.general_plugins`` in dev/setup.py).

vLLM calls ``register`` once in each process that builds an engine, from the first engine's arguments check
(``EngineArgs.__post_init__``, vllm/plugins/__init__.py ``load_general_plugins``), before it builds anything. With
``LUFFY_DEV_SPEEDUPS=1`` (tests/run.sh, tests/conftest.py, exp_scripts/rehearse.sh) on a CPU platform, the engines of
that process start and decode with less CPU:

- vLLM's compiled helpers run eager (cpu_eager.py): no inductor compile on the first TP forward, ~5 CPU-s per rank;
- the model class is inspected in this process (cpu_model_inspect.py): no second interpreter per rank on a cold
  model-info cache, 9.5-11 CPU-s each;
- a TP group without vLLM's shared-memory kernels reduces over a socket mesh (cpu_tp_sockets.py) instead of gloo:
  ~0.03 against ~1.1 ms of CPU per call, about six calls per decoded token;
- each engine is built over a frozen heap with the collector paused (startup_gc.py build_engines_without_gc).

Otherwise it does nothing: GPU engines and the product's own runs are vLLM's as it ships.
"""

from __future__ import annotations

import os

from luffy_pool_dev import SPEEDUPS_ENV


def speedups_enabled() -> bool:
    return os.environ.get(SPEEDUPS_ENV, "").strip() == "1"


def register() -> list[str]:
    """Apply the CPU speed-ups when they are switched on and the platform is a CPU; returns what was applied."""
    if not speedups_enabled():
        return []
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    from luffy_pool_dev.cpu_eager import run_compiled_helpers_eager
    from luffy_pool_dev.cpu_model_inspect import inspect_models_in_process
    from luffy_pool_dev.cpu_tp_sockets import mesh_tp_groups
    from luffy_pool_dev.startup_gc import build_engines_without_gc

    applied = [f"eager {name}" for name in run_compiled_helpers_eager()]
    if inspect_models_in_process():
        applied.append("in-process model inspection")
    if mesh_tp_groups():
        applied.append("TP socket mesh")
    if build_engines_without_gc():
        applied.append("engine builds without gc")
    return applied
