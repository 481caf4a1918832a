"""Which accelerator a worker process drives, decided inside that worker from what Ray made visible.

Ray gives each GPU actor its own GPU ids and, unless ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` is
set, narrows ``CUDA_VISIBLE_DEVICES`` to them: every rank of an 8-GPU node then sees exactly one device,
``cuda:0``, whatever its node-local rank. The index therefore comes from the position of Ray's id in
the process's visible list (or the id itself when nothing narrows the list), never from the node-local
rank and never from a guess on the driver. ``LOCAL_RANK`` is set to that index, because vLLM's
``external_launcher`` opens ``cuda:{LOCAL_RANK}``; the node-local rank stays in ``RAY_LOCAL_RANK``.
Outside Ray (torchrun) ``LOCAL_RANK`` already is the device index and is kept.

``plan_worker_device`` is the pure decision (unit-tested on any machine, and evaluated on CPU ranks
with fake Ray GPUs as a rehearsal of a cluster's placement); ``configure_worker_device`` applies it in
the worker.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Mapping, MutableMapping, Optional, Sequence

NOSET_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class DevicePlan:
    """``device`` ('cuda' | 'cpu'), the CUDA ``index`` this process uses (None on CPU), and the env
    values the process must carry so torch.distributed / vLLM agree with it."""

    device: str
    index: Optional[int]
    env: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def parse_visible_devices(value: Optional[str]) -> Optional[list[str]]:
    """``CUDA_VISIBLE_DEVICES`` as a list of ids; None when unset (every device of the node is visible)."""
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def ray_gpu_ids() -> list[str]:
    """The GPU ids Ray assigned to the calling actor/task ([] outside Ray or without GPUs)."""
    try:
        import ray
    except ImportError:
        return []
    if not ray.is_initialized():
        return []
    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return [str(i) for i in ids]


def choose_device_index(visible: Optional[Sequence[str]], gpu_ids: Sequence[str]) -> int:
    """CUDA index of the first GPU Ray assigned, within this process's visible device list."""
    if not gpu_ids:
        raise ValueError("no GPU id assigned to this worker")
    gpu = str(gpu_ids[0])
    if visible is None:
        return int(gpu)  # nothing narrowed the list: CUDA indices are the node's own ids
    if gpu not in visible:
        raise RuntimeError(f"Ray assigned GPU {gpu} but {VISIBLE_ENV}={','.join(visible)} does not contain it")
    return list(visible).index(gpu)


def plan_worker_device(
    requested: str,
    env: Mapping[str, str],
    gpu_ids: Sequence[str],
    cuda_available: bool,
    cuda_count: Optional[int] = None,
) -> DevicePlan:
    """Decide this worker's device from its own view (``env``, Ray's ``gpu_ids``, what torch sees).

    ``auto`` means cuda exactly when Ray assigned this worker a GPU (a GPU bundle whose worker cannot
    see CUDA is an error, not a silent CPU run), or, outside a Ray worker group, when CUDA is visible;
    ``cuda`` without Ray ids (torchrun) uses ``LOCAL_RANK``.
    """
    if requested not in DEVICES:
        raise ValueError(f"trainer.device must be one of {DEVICES}, got {requested!r}")
    ray_worker = env.get("WG_BACKEND") == "ray"  # set by RayWorkerGroup for every rank it starts
    if requested == "cpu" or (requested == "auto" and not gpu_ids and (ray_worker or not cuda_available)):
        return DevicePlan("cpu", None, {})
    if not cuda_available:
        where = f"Ray assigned GPU(s) {list(gpu_ids)}" if gpu_ids else "trainer.device=cuda"
        raise RuntimeError(
            f"{where} but torch sees no CUDA device in this worker "
            f"({VISIBLE_ENV}={env.get(VISIBLE_ENV)!r}); install a CUDA build of torch or use trainer.device=cpu"
        )
    if gpu_ids:
        index = choose_device_index(parse_visible_devices(env.get(VISIBLE_ENV)), gpu_ids)
    else:
        index = int(env.get("LOCAL_RANK", 0))
    if cuda_count is not None and not 0 <= index < cuda_count:
        raise RuntimeError(
            f"device index {index} is outside the {cuda_count} CUDA device(s) this worker sees "
            f"({VISIBLE_ENV}={env.get(VISIBLE_ENV)!r}, Ray GPU ids {list(gpu_ids)})"
        )
    return DevicePlan("cuda", index, {"LOCAL_RANK": str(index)})


def apply_device_plan(plan: DevicePlan, environ: MutableMapping[str, str]) -> None:
    """Write the plan's env (``LOCAL_RANK`` = device index on cuda) into ``environ``."""
    environ.update(plan.env)


def configure_worker_device(requested: str) -> DevicePlan:
    """Plan, apply and select this worker's device (call once, in the worker, before process groups)."""
    import torch

    available = torch.cuda.is_available()
    plan = plan_worker_device(
        requested, os.environ, ray_gpu_ids(), available, torch.cuda.device_count() if available else None
    )
    apply_device_plan(plan, os.environ)
    if plan.device == "cuda":
        torch.cuda.set_device(plan.index)
    return plan


def cluster_device(requested: str, cluster_gpus: float, world_size: int) -> str:
    """The driver's choice of worker kind from the Ray cluster's resources (not from the driver's own GPU)."""
    if requested not in DEVICES:
        raise ValueError(f"trainer.device must be one of {DEVICES}, got {requested!r}")
    if requested == "cpu":
        return "cpu"
    if requested == "cuda" and cluster_gpus < world_size:
        raise RuntimeError(
            f"trainer.device=cuda needs {world_size} GPUs (trainer.nnodes x trainer.n_gpus_per_node) but "
            f"the Ray cluster has {cluster_gpus:g}"
        )
    if requested == "cuda":
        return "cuda"
    return "cuda" if cluster_gpus >= 1 else "cpu"


DISTRIBUTED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "RAY_LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    VISIBLE_ENV,
    NOSET_ENV,
)


def describe_worker(plan: DevicePlan, env: Optional[Mapping[str, str]] = None) -> dict:
    """This process's placement as torch.distributed and vLLM's external launcher read it.

    ``cuda_plan`` is what a CUDA run would choose from the same view (the rehearsal of a GPU placement
    on CPU ranks with Ray fake GPUs); on a CUDA worker it equals ``plan``.
    """
    env = os.environ if env is None else env
    ids = ray_gpu_ids()
    node_id = node_ip = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
            node_ip = ray.util.get_node_ip_address()
    except ImportError:
        pass
    cuda_plan = (
        plan if plan.device == "cuda" else (plan_worker_device("cuda", env, ids, cuda_available=True) if ids else None)
    )
    return {
        "plan": plan.as_dict(),
        "cuda_plan": cuda_plan.as_dict() if cuda_plan else None,
        "ray_gpu_ids": ids,
        "node_id": node_id,
        "node_ip": node_ip,
        "env": {k: env.get(k) for k in DISTRIBUTED_ENV},
    }
