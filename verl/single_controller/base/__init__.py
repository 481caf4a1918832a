"""Backend-neutral single-controller pieces: Worker, @register, resource pools, WorkerGroup."""

from verl.single_controller.base.decorator import Dispatch, Execute, register
from verl.single_controller.base.worker import Worker
from verl.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup

__all__ = ["ClassWithInitArgs", "Dispatch", "Execute", "ResourcePool", "Worker", "WorkerGroup", "register"]
