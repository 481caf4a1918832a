"""Save and load one rank's share of an FSDP2 actor: sharded weights and optimizer via DCP, plus extras.

Weights and AdamW moments go through ``torch.distributed.checkpoint`` with FQN keys, so a checkpoint
written by W ranks loads on any other number of ranks (DCP reshards DTensors on load). The lr
scheduler, the RNG states and stateful actor extras (the adaptive entropy coefficient, counters) go in
a small per-rank ``extra_state_world_size_<W>_rank_<r>.pt`` of plain data. Loading never unpickles
arbitrary objects (``safe_io``: weights_only files, a restricted DCP metadata reader). Every rank calls
every method (they are collectives); only rank 0 writes ``huggingface/`` and ``checkpoint_meta.json``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import torch
import torch.distributed as dist

from verl.utils.checkpoint import layout
from verl.utils.checkpoint.hf_export import gather_full_state_dict, write_hf_folder
from verl.utils.checkpoint.manifest import hash_share
from verl.utils.checkpoint.rng import capture_rng_state, restore_rng_state
from verl.utils.checkpoint.safe_io import dcp_load, load_state, save_state

logger = logging.getLogger(__name__)

VALID_CONTENTS = ("model", "optimizer", "extra")
FORMAT_VERSION = 1


def _dist_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _quiet_single_process_dcp():
    """DCP warns on every call without a process group; a single-process checkpoint is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process.*")
        yield


def _barrier() -> None:
    if _dist_ready():
        dist.barrier()


def _fsync_tree(path: str) -> None:
    """Flush every file under ``path`` so a published checkpoint survives a machine crash."""
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        layout.fsync_dir(dirpath)


class FSDPCheckpointManager:
    """Checkpoint I/O for one rank of an FSDP2 (or plain, single-process) model.

    Args:
        model: the ``fully_shard``-ed HF model (a plain module works without a process group).
        optimizer: its optimizer (None for a frozen model).
        lr_scheduler: anything with ``state_dict``/``load_state_dict`` (None to skip).
        tokenizer: written into ``huggingface/`` by rank 0.
        extra_states: name -> object with ``state_dict``/``load_state_dict`` saved in the extra file.
        contents: subset of ``model``, ``optimizer``, ``extra`` to save and load.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, lr_scheduler=None,
                 tokenizer=None, extra_states: Optional[Mapping[str, Any]] = None,
                 contents: Iterable[str] = VALID_CONTENTS):
        contents = tuple(contents)
        bad = [c for c in contents if c not in VALID_CONTENTS]
        if bad:
            raise ValueError(f"actor.checkpoint.contents has unknown entries {bad}; allowed: {list(VALID_CONTENTS)}")
        if "optimizer" in contents and optimizer is None:
            raise ValueError("actor.checkpoint.contents includes 'optimizer' but this worker has no optimizer")
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.tokenizer = tokenizer
        self.extra_states = dict(extra_states or {})
        self.contents = contents
        self.saved_paths: list[str] = []

    @property
    def rank(self) -> int:
        return dist.get_rank() if _dist_ready() else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if _dist_ready() else 1

    # ------------------------------------------------------------------ save
    def save_checkpoint(self, local_path: str, global_step: Optional[int] = None,
                        max_ckpt_to_keep: Optional[int] = None, save_hf: bool = False,
                        compute_hashes: bool = False) -> dict:
        """Write this rank's share under ``local_path`` (the ``actor/`` dir); returns timing and size,
        and with ``compute_hashes`` this rank's share of the files' sizes and sha256 (``files``).

        ``max_ckpt_to_keep`` prunes the model/optimizer shards of this manager's older saves (the
        trainer instead prunes the whole run directory after publishing, see ``layout``).
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        t0 = time.perf_counter()
        local_path = os.path.abspath(local_path)
        os.makedirs(local_path, exist_ok=True)
        _barrier()  # every rank sees the directory before DCP's writers start
        with _quiet_single_process_dcp():
            if "model" in self.contents:
                dcp.save(get_model_state_dict(self.model), storage_writer=self._writer(layout.MODEL_DIR, local_path))
            if "optimizer" in self.contents:
                dcp.save(get_optimizer_state_dict(self.model, self.optimizer),
                         storage_writer=self._writer(layout.OPTIM_DIR, local_path))
        if "extra" in self.contents:
            path = os.path.join(local_path, layout.extra_state_file(self.world_size, self.rank))
            save_state(path, self._extra_state())  # plain data only: resume loads it with weights_only
        if save_hf:
            self._write_hf(os.path.join(local_path, layout.HF_DIR), with_weights=True)
        elif self.rank == 0:
            self._write_hf(os.path.join(local_path, layout.HF_DIR), with_weights=False)
        if self.rank == 0:
            meta = {"format_version": FORMAT_VERSION, "global_step": global_step, "world_size": self.world_size,
                    "contents": list(self.contents), "hf_weights": bool(save_hf), "torch_version": torch.__version__}
            layout.write_file_atomic(os.path.join(local_path, layout.META_FILE), json.dumps(meta, indent=2) + "\n")
        _fsync_tree(local_path)  # DCP syncs its shards; torch.save and save_pretrained do not
        _barrier()
        # Every rank hashes a share of the files for the trainer's manifest (sha256 runs ~1 GB/s per process).
        files = hash_share(local_path, self.rank, self.world_size) if compute_hashes else {}
        self.saved_paths.append(local_path)
        if self.rank == 0 and max_ckpt_to_keep is not None and max_ckpt_to_keep > 0:
            for old in self.saved_paths[:-max_ckpt_to_keep]:
                for sub in (layout.MODEL_DIR, layout.OPTIM_DIR):
                    target = os.path.join(old, sub)
                    if os.path.isdir(target):
                        shutil.rmtree(target)
            self.saved_paths = self.saved_paths[-max_ckpt_to_keep:]
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "bytes": layout.dir_size_bytes(local_path) if self.rank == 0 else 0,
                "rank": self.rank, "files": files}

    def _writer(self, sub: str, local_path: str):
        import torch.distributed.checkpoint as dcp

        # One file per rank and one writer thread: many small threads only contend on a small CPU box.
        return dcp.FileSystemWriter(os.path.join(local_path, sub), single_file_per_rank=True, thread_count=1)

    def _extra_state(self) -> dict:
        extra = {"rng": capture_rng_state(), "world_size": self.world_size, "rank": self.rank}
        if self.lr_scheduler is not None:
            extra["lr_scheduler"] = self.lr_scheduler.state_dict()
        extra["extras"] = {name: obj.state_dict() for name, obj in self.extra_states.items()}
        return extra

    def _write_hf(self, hf_dir: str, with_weights: bool) -> None:
        """Rank 0 writes config + tokenizer; with weights, all ranks join the full-state-dict gather."""
        hf_config = getattr(self.model, "config", None)
        generation_config = getattr(self.model, "generation_config", None)
        if with_weights:
            state = gather_full_state_dict(self.model)
            if self.rank == 0:
                if hf_config is None:
                    raise ValueError("save_hf needs an HF model with a .config")
                write_hf_folder(hf_dir, state, hf_config, tokenizer=self.tokenizer, generation_config=generation_config)
            return
        os.makedirs(hf_dir, exist_ok=True)
        if hf_config is not None:
            hf_config.save_pretrained(hf_dir)
        if generation_config is not None:
            generation_config.save_pretrained(hf_dir)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(hf_dir)

    def save_hf_model(self, path: str) -> str:
        """Full HF folder (weights, config, tokenizer) at ``path``; all ranks call, rank 0 writes."""
        self._write_hf(os.path.abspath(path), with_weights=True)
        _barrier()
        return path

    # ------------------------------------------------------------------ load
    def load_checkpoint(self, local_path: str, load_optimizer: bool = True) -> dict:
        """Restore what ``save_checkpoint`` wrote, resharding when the world size changed."""
        from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                             set_model_state_dict, set_optimizer_state_dict)

        local_path = os.path.abspath(local_path)
        meta = self.read_meta(local_path)
        saved_contents = meta.get("contents", [])
        if "model" in self.contents:
            if not layout.has_sharded_model(local_path):
                raise FileNotFoundError(
                    f"{local_path} has no sharded model ({layout.MODEL_DIR}/); it may have been pruned by "
                    f"trainer.max_optim_to_keep (only config/tokenizer/extra state remain)")
            model_state = get_model_state_dict(self.model)
            with _quiet_single_process_dcp():
                dcp_load(model_state, os.path.join(local_path, layout.MODEL_DIR))
            set_model_state_dict(self.model, model_state)
        if load_optimizer and "optimizer" in self.contents:
            if "optimizer" not in saved_contents or not os.path.isdir(os.path.join(local_path, layout.OPTIM_DIR)):
                raise FileNotFoundError(f"{local_path} has no optimizer state ({layout.OPTIM_DIR}/); saved contents "
                                        f"were {saved_contents}")
            optim_state = get_optimizer_state_dict(self.model, self.optimizer)
            with _quiet_single_process_dcp():
                dcp_load(optim_state, os.path.join(local_path, layout.OPTIM_DIR))
            set_optimizer_state_dict(self.model, self.optimizer, optim_state)
        if "extra" in self.contents and "extra" in saved_contents:
            self._load_extra(local_path, int(meta["world_size"]))
        _barrier()
        return meta

    @staticmethod
    def read_meta(local_path: str) -> dict:
        path = os.path.join(local_path, layout.META_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: {local_path} is not an actor checkpoint written by this code")
        with open(path) as f:
            return json.load(f)

    def _load_extra(self, local_path: str, saved_world_size: int) -> None:
        # Same world size: each rank gets its own RNG streams back. Otherwise the scheduler state is the
        # same on every rank, but per-rank RNG streams cannot be mapped; ranks beyond the old count reuse 0's.
        source_rank = self.rank if self.rank < saved_world_size else 0
        if saved_world_size != self.world_size and self.rank == 0:
            logger.warning("resuming a %d-rank checkpoint on %d ranks: weights and optimizer are resharded; "
                           "per-rank RNG streams are not reproduced exactly", saved_world_size, self.world_size)
        path = os.path.join(local_path, layout.extra_state_file(saved_world_size, source_rank))
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found (checkpoint written by {saved_world_size} ranks)")
        extra = load_state(path)  # tensors and plain data only; a planted pickle is refused naming the file
        if self.lr_scheduler is not None:
            if "lr_scheduler" not in extra:
                raise KeyError(f"{path} has no lr_scheduler state")
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        restore_rng_state(extra["rng"])
        saved_extras = extra.get("extras", {})
        for name, obj in self.extra_states.items():
            if name not in saved_extras:
                raise KeyError(f"{path} has no extra state {name!r} (saved: {sorted(saved_extras)}); was the "
                               f"checkpoint written with a different actor config?")
            obj.load_state_dict(saved_extras[name])
