"""Checkpoint methods of the actor worker, callable from the driver on every rank.

Mixed into ``ActorRolloutRefWorker``; it reads the worker's ``actor_module`` (FSDP2 HF model),
``actor_optimizer``, ``lr_scheduler``, ``tokenizer`` and, when present, the actor's adaptive entropy
coefficient and non-finite-step counter, and its ``extra_optimizers`` (name -> (optimizer, offload): a method's
second optimizer, e.g. ReLIFT's SFT AdamW) and ``extra_checkpoint_states`` (name -> object with
``state_dict``/``load_state_dict`` saved in the extra file, e.g. the reference weights an EMA teacher moves), and delegates the I/O to ``FSDPCheckpointManager``. All
three methods are collectives: the group calls them on every rank (``Dispatch.ONE_TO_ALL``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager


class AttributeState:
    """``state_dict``/``load_state_dict`` for one plain attribute (e.g. a counter) of an object."""

    def __init__(self, owner: Any, name: str):
        self.owner = owner
        self.name = name

    def state_dict(self) -> dict:
        return {"value": getattr(self.owner, self.name)}

    def load_state_dict(self, state: dict) -> None:
        setattr(self.owner, self.name, state["value"])


class ModuleShardsState:
    """``state_dict``/``load_state_dict`` of this rank's parameter shards of a module that no optimizer owns (the
    reference model an EMA teacher moves): plain tensors in the rank's extra-state file; a resume on another
    layout (rank count or shard shapes) is refused naming both."""

    def __init__(self, module: Any, what: str):
        self.module = module
        self.what = what

    def _shards(self) -> list:
        return [p.to_local() if hasattr(p, "to_local") else p for p in self.module.parameters()]

    def state_dict(self) -> dict:
        import torch

        with torch.no_grad():
            return {"shards": [t.detach().cpu().clone() for t in self._shards()]}

    def load_state_dict(self, state: dict) -> None:
        import torch

        saved, shards = state["shards"], self._shards()
        shapes = [tuple(t.shape) for t in shards]
        if [tuple(t.shape) for t in saved] != shapes:
            raise ValueError(
                f"the checkpoint's {self.what} shards ({len(saved)} tensors) do not match this rank's layout "
                f"({len(shards)} tensors): resume it on the rank count and sharding it was saved with"
            )
        with torch.no_grad():
            for t, s in zip(shards, saved):
                t.copy_(s.to(device=t.device, dtype=t.dtype))


class CheckpointMixin:
    """Adds ``save_checkpoint`` / ``load_checkpoint`` / ``save_hf_model`` to an actor worker."""

    def _actor_checkpoint_manager(self) -> FSDPCheckpointManager:
        manager = getattr(self, "_checkpoint_manager", None)
        if manager is not None:
            return manager
        if getattr(self, "actor_module", None) is None or getattr(self, "actor_optimizer", None) is None:
            raise RuntimeError(
                f"checkpointing needs an actor (role {getattr(self, 'role', '?')!r} has no trained "
                f"model here); call init_model first"
            )
        extras: dict[str, Any] = {}
        actor = getattr(self, "actor", None)
        adaptive = getattr(actor, "adaptive_entropy", None)
        if adaptive is not None and hasattr(adaptive, "state_dict"):
            extras["adaptive_entropy"] = adaptive
        if actor is not None and hasattr(actor, "nonfinite_skips"):
            extras["nonfinite_skips"] = AttributeState(actor, "nonfinite_skips")
        extras.update(getattr(self, "extra_checkpoint_states", {}))
        contents = tuple(self.sections.actor.checkpoint.contents)  # actor.checkpoint.contents
        extra_optimizers = {name: opt for name, (opt, _offload) in getattr(self, "extra_optimizers", {}).items()}
        manager = FSDPCheckpointManager(
            self.actor_module,
            self.actor_optimizer,
            getattr(self, "lr_scheduler", None),
            tokenizer=getattr(self, "tokenizer", None),
            extra_states=extras,
            contents=contents,
            extra_optimizers=extra_optimizers,
        )
        self._checkpoint_manager = manager
        return manager

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self,
        local_path: str,
        global_step: Optional[int] = None,
        max_ckpt_to_keep: Optional[int] = None,
        save_hf: bool = False,
        compute_hashes: bool = False,
    ) -> dict:
        """Write this rank's share of the actor checkpoint into ``local_path``; returns seconds and bytes
        (and, with ``compute_hashes``, this rank's share of the manifest's sha256 entries)."""
        with self._optimizer_on_compute_device():
            return self._actor_checkpoint_manager().save_checkpoint(
                local_path,
                global_step=global_step,
                max_ckpt_to_keep=max_ckpt_to_keep,
                save_hf=save_hf,
                compute_hashes=compute_hashes,
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, load_optimizer: bool = True) -> dict:
        """Restore the actor from ``local_path`` (DCP reshards when the world size differs)."""
        with self._optimizer_on_compute_device():
            return self._actor_checkpoint_manager().load_checkpoint(local_path, load_optimizer=load_optimizer)

    def _optimizer_on_compute_device(self):
        """DCP reads and writes the optimizer state where training keeps it; offloaded state (optimizer_offload)
        comes back for the call and leaves again after it."""
        offloads = [getattr(self, "optimizer_offload", None)]
        offloads += [offload for _opt, offload in getattr(self, "extra_optimizers", {}).values()]
        stack = contextlib.ExitStack()
        for offload in offloads:
            if offload is not None:
                stack.enter_context(offload.on_compute_device())
        return stack

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_hf_model(self, path: str) -> str:
        """Gather the full weights and write an HF folder (weights, config, tokenizer) at ``path``."""
        return self._actor_checkpoint_manager().save_hf_model(path)
