"""Ray backend of the single controller: resource pools, worker groups, colocated roles."""

from verl.single_controller.ray.base import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.ray.colocated import create_colocated_worker_cls
from verl.utils.ray_utils import WorkerGroupError

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "WorkerGroupError",
    "create_colocated_worker_cls",
]
