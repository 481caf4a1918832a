"""Optimizer-state offload between phases (``fsdp_config.optimizer_offload``).

AdamW keeps two fp32 moments per parameter: for a 7B actor sharded over 8 ranks that is ~7 GB per GPU,
idle during generation and log-prob passes. With ``optimizer_offload`` the worker keeps the state in
host memory and brings it to the accelerator only for the update (verl's load/offload_fsdp_optimizer
around ``update_actor``). Scalar ``step`` counters stay where the optimizer keeps them (host).

Parameters and their gradients leave the accelerator through FSDP2's ``CPUOffloadPolicy``
(``fsdp_config.param_offload``, ``fsdp_utils.cpu_offload_policy``): shards live in host memory and are
copied to the accelerator layer by layer for each forward/backward, and AdamW then updates them (and
keeps its state) on the host, so ``optimizer_offload`` has nothing left to move.

On a CPU run compute and offload device are the same and every move is skipped. The moves are plain
``Tensor.to`` calls on whatever device the optimizer state has, so they are tested on CPU with fake
CUDA tensors (``FakeTensorMode``), which carry a real ``.device``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional, Union

import torch

logger = logging.getLogger(__name__)

DeviceLike = Union[str, torch.device]


def same_device(tensor_device: torch.device, target: DeviceLike) -> bool:
    """``cuda:0`` is on ``cuda`` (no index = any index of that type)."""
    target = torch.device(target)
    return tensor_device.type == target.type and (target.index is None or tensor_device.index == target.index)


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[torch.Tensor, dict, str, torch.Tensor]]:
    for param, state in optimizer.state.items():
        for key, value in state.items():
            # The scalar step counter is read on the host by non-capturable AdamW; it stays put.
            if isinstance(value, torch.Tensor) and not (key == "step" and value.dim() == 0):
                yield param, state, key, value


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: Optional[DeviceLike] = None) -> int:
    """Move every state tensor (moments; DTensor shards included) to ``device``, or with None to its
    parameter's device (where the step needs it: parameters kept in host memory by param_offload keep
    their state there too); returns how many moved."""
    moved = 0
    for param, state, key, value in list(_state_tensors(optimizer)):
        target = param.device if device is None else torch.device(device)
        if not same_device(value.device, target):
            # Host -> accelerator copies may run ahead (the step queues behind them on the same stream);
            # accelerator -> host copies block, so the host never reads (checkpoint) a tensor still in flight.
            state[key] = value.to(target, non_blocking=target.type != "cpu")
            moved += 1
    return moved


def optimizer_state_devices(optimizer: torch.optim.Optimizer) -> set[torch.device]:
    """The devices the (non-step) state tensors live on; for tests and metrics."""
    return {value.device for _, _, _, value in _state_tensors(optimizer)}


class OptimizerOffload:
    """Keeps ``optimizer``'s state on ``offload_device`` except inside ``on_compute_device()``.

    Inactive (every call a no-op) when disabled or when compute and offload device are the same type
    (a CPU run).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        compute_device: DeviceLike,
        enabled: bool,
        offload_device: DeviceLike = "cpu",
    ):
        self.optimizer = optimizer
        self.compute_device = torch.device(compute_device)
        self.offload_device = torch.device(offload_device)
        self.active = bool(enabled) and optimizer is not None and self.compute_device.type != self.offload_device.type
        if enabled and not self.active:
            logger.info(
                "fsdp_config.optimizer_offload ignored: the optimizer state already lives on %s", self.offload_device
            )

    def offload(self) -> int:
        if not self.active:
            return 0
        moved = move_optimizer_state(self.optimizer, self.offload_device)
        if self.compute_device.type == "cuda":
            torch.cuda.empty_cache()
        return moved

    def load(self) -> int:
        """State back next to its parameters (on the accelerator unless param_offload keeps them on the host)."""
        return move_optimizer_state(self.optimizer) if self.active else 0

    @contextlib.contextmanager
    def on_compute_device(self):
        """State on the accelerator for the body (the update), back in host memory afterwards (also on error)."""
        self.load()
        try:
            yield
        finally:
            self.offload()
