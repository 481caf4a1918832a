"""The test harness's actor hook: what verl's ``VERL_ACTOR_RUNTIME_ENV_HOOK`` names (verl/single_controller/ray/base.py
calls it on the driver for every actor a worker group starts, and starts the actor with the runtime env it returns).

- Every rank gets Ray's ``worker_process_setup_hook`` (through the variable Ray reads it from, set per actor: it reaches
  exactly the group's processes, where a job-level hook would reach every task process of the job, and a driver that
  joins a running Ray, as the tests' shared session does, sets none): the rank imports its class with the cyclic
  collector paused (startup_gc.pause_in_ray_worker). A value the caller set is kept.
- With ``LUFFY_FORK_WORKERS=1``, a CPU rank is forked from a zygote that imported its modules once per node and
  environment (worker_zygote.py): a rank's imports are 6-14 CPU-s and the suite starts ~130 ranks. Ranks asking Ray
  for GPUs start as Ray starts them (one warning per class). A ``py_executable`` the caller set is kept.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional

from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

from luffy_pool_dev import FORK_WORKERS_ENV
from luffy_pool_dev.worker_zygote import gpu_refusal

logger = logging.getLogger(__name__)

SETUP_HOOK_ENV = WORKER_PROCESS_SETUP_HOOK_ENV_VAR  # Ray's worker reads its setup hook from this variable
STARTUP_GC_HOOK = "luffy_pool_dev.startup_gc.pause_in_ray_worker"
ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_zygote.py")
# What a rank of verl's FSDP hybrid worker imports before its first step beyond its class's module: checkpoints and
# the HF export; for a vLLM rollout role also what building the first engine imports (the loader's quantization
# check, the args check). A name a vLLM release moved is skipped by the zygote.
FSDP_WORKER_PRELOAD = ("torch.distributed.checkpoint.state_dict",)
VLLM_ROLLOUT_PRELOAD = (
    "verl.workers.rollout.vllm_rollout",
    "vllm.entrypoints.llm",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.layers.quantization.online.base",
    "vllm.entrypoints.launchers.cli_args",
)
VLLM_CPU_PRELOAD = ("vllm.v1.worker.cpu_worker",)
ROLLOUT_ROLES = ("rollout", "actor_rollout", "actor_rollout_ref")

_refusals_logged: set = set()  # worker classes whose GPU ranks were already reported


def fork_workers_enabled() -> bool:
    return os.environ.get(FORK_WORKERS_ENV, "0").strip().lower() not in ("", "0", "false", "no", "off")


def zygote_executable(modules: str) -> str:
    """``runtime_env.py_executable`` that starts a rank through the zygote preloading ``modules`` (comma-separated)."""
    return f"{sys.executable} {ZYGOTE} --preload {modules}"


def fsdp_worker_preload(
    worker_cls: type, sections: Any, role: str, device: str = "cuda", *_args: Any, **_kwargs: Any
) -> list:
    """The modules a rank of verl's ``ActorRolloutRefWorker`` (or a subclass) imports, for its constructor's arguments
    (``sections``, ``role``, ``device``): vLLM only for a vLLM rollout role, its CPU worker only on device cpu."""
    modules = [worker_cls.__module__, *FSDP_WORKER_PRELOAD]
    if role in ROLLOUT_ROLES and sections.rollout.name == "vllm":
        modules += [*VLLM_ROLLOUT_PRELOAD, *(VLLM_CPU_PRELOAD if device == "cpu" else ())]
    return modules


def preload_modules(worker_cls: type, args: tuple = (), kwargs: Optional[dict] = None) -> list:
    """What a forked rank's zygote imports: ``fsdp_worker_preload`` for verl's FSDP hybrid worker, a class's own
    classmethod ``fork_preload(*init_args, **init_kwargs)`` when it has one, else the class's module. A hint only: a
    hint that fails leaves the module alone (the rank imports what it needs either way)."""
    kwargs = kwargs or {}
    fsdp = sys.modules.get("verl.workers.fsdp_workers")  # imported wherever such a worker is started
    try:
        if fsdp is not None and issubclass(worker_cls, fsdp.ActorRolloutRefWorker):
            return fsdp_worker_preload(worker_cls, *args, **kwargs)
        preload = getattr(worker_cls, "fork_preload", None)
        if preload is not None:
            return list(preload(*args, **kwargs))
    except Exception as err:  # noqa: BLE001
        logger.warning(
            "the preload of %s failed (%r): its zygote imports %s only", worker_cls.__name__, err, worker_cls.__module__
        )
    return [worker_cls.__module__]


def actor_runtime_env(
    runtime_env: dict, *, worker_cls: type, args: tuple = (), kwargs: Optional[dict] = None, num_gpus: float = 0.0
) -> dict:
    """The runtime env an actor of ``worker_cls`` starts with (see the module docstring); ``num_gpus``: what each rank
    asks Ray for."""
    runtime_env = dict(runtime_env)
    env_vars = dict(runtime_env.get("env_vars") or {})
    env_vars.setdefault(SETUP_HOOK_ENV, STARTUP_GC_HOOK)
    runtime_env["env_vars"] = env_vars
    if fork_workers_enabled() and "py_executable" not in runtime_env:
        refusal = gpu_refusal(num_gpus, worker_cls.__name__)
        if not refusal:
            runtime_env["py_executable"] = zygote_executable(",".join(preload_modules(worker_cls, args, kwargs)))
        elif worker_cls not in _refusals_logged:
            _refusals_logged.add(worker_cls)
            logger.warning("%s", refusal)
    return runtime_env
