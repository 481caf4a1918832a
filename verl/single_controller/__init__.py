"""The single controller: one driver process plans each step and drives groups of worker processes.

``base`` holds the backend-neutral parts (Worker, ``@register`` dispatch modes, WorkerGroup);
``ray`` launches the workers as Ray actors. Importing this package does not import torch.
"""

from verl.single_controller.base import (
    ClassWithInitArgs,
    Dispatch,
    Execute,
    ResourcePool,
    Worker,
    WorkerGroup,
    register,
)

__all__ = ["ClassWithInitArgs", "Dispatch", "Execute", "ResourcePool", "Worker", "WorkerGroup", "register"]
