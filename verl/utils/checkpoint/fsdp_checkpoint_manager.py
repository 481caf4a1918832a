"""Save and load one rank's share of an FSDP2 actor: sharded weights and optimizer via DCP, plus extras.

Weights and AdamW moments go through ``torch.distributed.checkpoint`` with FQN keys, so a checkpoint
written by W ranks loads on any other number of ranks (DCP reshards DTensors on load). The lr
scheduler, the RNG states and stateful actor extras (the adaptive entropy coefficient, counters) go in
a small per-rank ``extra_state_world_size_<W>_rank_<r>.pt`` of plain data. Loading never unpickles
arbitrary objects (``safe_io``: weights_only files, a restricted DCP metadata reader). Every rank calls
every method (they are collectives); only rank 0 writes ``huggingface/`` and ``checkpoint_meta.json``.

Loading is in two phases so that a failure on one rank never leaves another waiting in a collective:
first every rank checks, on its own, everything it will read (the metadata, its extra-state file, the
parameter names and shapes of the checkpoint against the model) and the ranks exchange their verdicts
(``all_gather_object``); if any rank refused, every rank raises the same one-line error naming that
rank, before any state is changed. Only then do the DCP loads (collectives that agree by themselves)
run. A checkpoint of another model (layers, hidden size, vocabulary) is refused naming both.
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
from verl.utils.checkpoint.safe_io import dcp_load, load_dcp_metadata, load_state, save_state

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


class CheckpointLoadError(RuntimeError):
    """A rank cannot load the checkpoint; raised on every rank with the same one-line message."""


def _agree_on_failure(local_path: str, exc: Optional[BaseException]) -> None:
    """Every rank learns every rank's verdict; any refusal raises on all ranks (no rank is left waiting).
    Without a process group, or in a group of one rank (no one to tell), the rank's own exception is raised as it
    is."""
    if not _dist_ready() or dist.get_world_size() == 1:
        if exc is not None:
            raise exc
        return
    error = None if exc is None else _error_line(exc)
    verdicts: list = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, error)
    bad = [(rank, e) for rank, e in enumerate(verdicts) if e is not None]
    if bad:
        rank, first = bad[0]
        more = f" (and {len(bad) - 1} other rank(s))" if len(bad) > 1 else ""
        raise CheckpointLoadError(f"cannot load {local_path}: rank {rank}: {first}{more}")


def _error_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def model_shape_summary(shapes: Mapping[str, tuple]) -> str:
    """``"2 layers, hidden 64, vocab 328"`` from parameter names and shapes (HF decoder naming)."""
    import re

    layers = {int(m.group(1)) for k in shapes for m in [re.search(r"(?:^|\.)layers\.(\d+)\.", k)] if m}
    embed = next((tuple(v) for k, v in shapes.items() if k.endswith("embed_tokens.weight")), None)
    parts = [f"{len(layers)} layer{'s' if len(layers) != 1 else ''}"] if layers else []
    if embed is not None and len(embed) == 2:
        parts += [f"hidden {embed[1]}", f"vocab {embed[0]}"]
    parts.append(f"{len(shapes)} tensors")
    return ", ".join(parts)


def check_model_matches(
    checkpoint_shapes: Mapping[str, tuple], model_shapes: Mapping[str, tuple], checkpoint_dir: str, model_name: str
) -> None:
    """Raise one line naming both when the checkpoint's parameter names or shapes differ from the model's.

    DCP loads only the keys the model asks for, so a checkpoint with more layers would load silently."""
    missing = sorted(set(model_shapes) - set(checkpoint_shapes))
    unexpected = sorted(set(checkpoint_shapes) - set(model_shapes))
    resized = sorted(
        k for k in set(model_shapes) & set(checkpoint_shapes) if tuple(model_shapes[k]) != tuple(checkpoint_shapes[k])
    )
    if not (missing or unexpected or resized):
        return
    if resized:
        key = resized[0]
        detail = f"{key} is {list(checkpoint_shapes[key])} in the checkpoint, {list(model_shapes[key])} in the model"
    elif unexpected:
        detail = f"{len(unexpected)} checkpoint tensor(s) the model lacks, e.g. {unexpected[0]}"
    else:
        detail = f"{len(missing)} model tensor(s) the checkpoint lacks, e.g. {missing[0]}"
    raise ValueError(
        f"checkpoint {checkpoint_dir} ({model_shape_summary(checkpoint_shapes)}) does not match the "
        f"model {model_name} ({model_shape_summary(model_shapes)}): {detail}"
    )


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
        extra_optimizers: name -> a second optimizer over the same model (ReLIFT's SFT AdamW), saved with
            ``optimizer`` under ``optim_<name>/`` by DCP (resharded like the first) once it has state; an optimizer
            that never stepped is recorded as unused in the metadata and comes back fresh (DCP would initialise
            its state with a zero step, which changes its first real step's bias correction).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Optional[torch.optim.Optimizer] = None,
        lr_scheduler=None,
        tokenizer=None,
        extra_states: Optional[Mapping[str, Any]] = None,
        contents: Iterable[str] = VALID_CONTENTS,
        extra_optimizers: Optional[Mapping[str, torch.optim.Optimizer]] = None,
    ):
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
        self.extra_optimizers = dict(extra_optimizers or {})
        self.contents = contents
        self.saved_paths: list[str] = []

    @property
    def rank(self) -> int:
        return dist.get_rank() if _dist_ready() else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if _dist_ready() else 1

    # ------------------------------------------------------------------ save
    def save_checkpoint(
        self,
        local_path: str,
        global_step: Optional[int] = None,
        max_ckpt_to_keep: Optional[int] = None,
        save_hf: bool = False,
        compute_hashes: bool = False,
    ) -> dict:
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
                dcp.save(
                    get_optimizer_state_dict(self.model, self.optimizer),
                    storage_writer=self._writer(layout.OPTIM_DIR, local_path),
                )
                for name, used in self._extra_optimizers_used().items():
                    if used:  # every rank stepped it together, so every rank agrees
                        dcp.save(
                            get_optimizer_state_dict(self.model, self.extra_optimizers[name]),
                            storage_writer=self._writer(layout.extra_optim_dir(name), local_path),
                        )
        if "extra" in self.contents:
            path = os.path.join(local_path, layout.extra_state_file(self.world_size, self.rank))
            save_state(path, self._extra_state())  # plain data only: resume loads it with weights_only
        if save_hf:
            self._write_hf(os.path.join(local_path, layout.HF_DIR), with_weights=True)
        elif self.rank == 0:
            self._write_hf(os.path.join(local_path, layout.HF_DIR), with_weights=False)
        if self.rank == 0:
            meta = {
                "format_version": FORMAT_VERSION,
                "global_step": global_step,
                "world_size": self.world_size,
                "contents": list(self.contents),
                "hf_weights": bool(save_hf),
                "torch_version": torch.__version__,
            }
            if self.extra_optimizers and "optimizer" in self.contents:
                meta["extra_optimizers"] = self._extra_optimizers_used()
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
        return {
            "seconds": seconds,
            "bytes": layout.dir_size_bytes(local_path) if self.rank == 0 else 0,
            "rank": self.rank,
            "files": files,
        }

    def _extra_optimizers_used(self) -> dict[str, bool]:
        return {name: bool(opt.state) for name, opt in self.extra_optimizers.items()}

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
            from verl.utils.pipeline_parallel import pipeline_of

            pipe = pipeline_of(self.model)  # pipeline stages: each rank holds a part (pipeline_actor.py)
            state = gather_full_state_dict(self.model) if pipe is None else pipe.full_weights.full_state_dict()
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
        """Restore what ``save_checkpoint`` wrote, resharding when the world size changed.

        Raises ``CheckpointLoadError`` on every rank, with nothing changed, when any rank refuses its part.
        """
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        local_path = os.path.abspath(local_path)
        load_model = "model" in self.contents
        load_optim = load_optimizer and "optimizer" in self.contents
        # Every rank builds these (no collective inside for FSDP2's sharded state dicts) before anything can fail.
        model_state = get_model_state_dict(self.model) if load_model else None
        meta, extra, failure = {}, None, None
        try:
            meta = self.read_meta(local_path)
            extra = self._check_before_load(local_path, meta, model_state, load_optim)
        except Exception as exc:  # noqa: BLE001 - agreed on by all ranks below, then raised everywhere
            failure = exc
        _agree_on_failure(local_path, failure)
        if load_model:
            with _quiet_single_process_dcp():
                dcp_load(model_state, os.path.join(local_path, layout.MODEL_DIR))
            set_model_state_dict(self.model, model_state)
        if load_optim:
            optim_state = get_optimizer_state_dict(self.model, self.optimizer)
            with _quiet_single_process_dcp():
                dcp_load(optim_state, os.path.join(local_path, layout.OPTIM_DIR))
            set_optimizer_state_dict(self.model, self.optimizer, optim_state)
            saved_used = meta.get("extra_optimizers", {})
            for name, opt in self.extra_optimizers.items():
                if not saved_used[name]:  # never stepped when saved: fresh, as an uninterrupted run has it
                    opt.state.clear()
                    continue
                extra_state = get_optimizer_state_dict(self.model, opt)
                with _quiet_single_process_dcp():
                    dcp_load(extra_state, os.path.join(local_path, layout.extra_optim_dir(name)))
                set_optimizer_state_dict(self.model, opt, extra_state)
        try:
            if extra is not None:
                self._apply_extra(*extra)
        except Exception as exc:  # noqa: BLE001 - as above: agreed on by all ranks before they go on
            failure = exc
        _agree_on_failure(local_path, failure)
        return meta

    def _check_before_load(
        self, local_path: str, meta: dict, model_state: Optional[dict], load_optim: bool
    ) -> Optional[tuple]:
        """Everything this rank reads, checked without a collective; returns the extra state to apply."""
        saved_contents = meta.get("contents", [])
        if model_state is not None:
            if not layout.has_sharded_model(local_path):
                raise FileNotFoundError(
                    f"{local_path} has no sharded model ({layout.MODEL_DIR}/); it may have been pruned by "
                    f"trainer.max_optim_to_keep (only config/tokenizer/extra state remain)"
                )
            model_dir = os.path.join(local_path, layout.MODEL_DIR)
            saved = load_dcp_metadata(os.path.join(model_dir, ".metadata")).state_dict_metadata
            checkpoint_shapes = {k: tuple(v.size) for k, v in saved.items() if hasattr(v, "size")}
            model_shapes = {k: tuple(v.shape) for k, v in model_state.items() if torch.is_tensor(v)}
            # a pipeline stage's model holds a part of the parameters: it checks the unsplit model's
            # (verl/utils/pipeline_parallel.py); DCP then loads the part
            model_shapes = getattr(self.model, "full_state_shapes", None) or model_shapes
            config = getattr(self.model, "config", None)
            name = getattr(config, "_name_or_path", "") or type(self.model).__name__
            check_model_matches(checkpoint_shapes, model_shapes, local_path, name)
        if load_optim:
            if "optimizer" not in saved_contents or not os.path.isdir(os.path.join(local_path, layout.OPTIM_DIR)):
                raise FileNotFoundError(
                    f"{local_path} has no optimizer state ({layout.OPTIM_DIR}/); saved contents were {saved_contents}"
                )
            load_dcp_metadata(os.path.join(local_path, layout.OPTIM_DIR, ".metadata"))
            saved_used = meta.get("extra_optimizers", {})
            for name in self.extra_optimizers:
                if name not in saved_used:
                    raise KeyError(
                        f"{local_path} has no state of the {name!r} optimizer (saved: {sorted(saved_used)}); "
                        f"was the checkpoint written by a run of another algorithm.method?"
                    )
                sub = layout.extra_optim_dir(name)
                if saved_used[name] and not os.path.isdir(os.path.join(local_path, sub)):
                    raise FileNotFoundError(
                        f"{local_path} has no {sub}/ although its metadata says the {name!r} optimizer was saved"
                    )
                if saved_used[name]:
                    load_dcp_metadata(os.path.join(local_path, sub, ".metadata"))
        if "extra" in self.contents and "extra" in saved_contents:
            return self._read_extra(local_path, int(meta["world_size"]))
        return None

    @staticmethod
    def read_meta(local_path: str) -> dict:
        path = os.path.join(local_path, layout.META_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: {local_path} is not an actor checkpoint written by this code")
        with open(path) as f:
            return json.load(f)

    def _read_extra(self, local_path: str, saved_world_size: int) -> tuple[str, dict]:
        # Same world size: each rank gets its own RNG streams back. Otherwise the scheduler state is the
        # same on every rank, but per-rank RNG streams cannot be mapped; ranks beyond the old count reuse 0's.
        source_rank = self.rank if self.rank < saved_world_size else 0
        if saved_world_size != self.world_size and self.rank == 0:
            logger.warning(
                "resuming a %d-rank checkpoint on %d ranks: weights and optimizer are resharded; "
                "per-rank RNG streams are not reproduced exactly",
                saved_world_size,
                self.world_size,
            )
        path = os.path.join(local_path, layout.extra_state_file(saved_world_size, source_rank))
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found (checkpoint written by {saved_world_size} ranks)")
        extra = load_state(path)  # tensors and plain data only; a planted pickle is refused naming the file
        if not isinstance(extra, dict) or "rng" not in extra:
            raise ValueError(f"{path} is not an extra-state file (no rng state)")
        if self.lr_scheduler is not None and "lr_scheduler" not in extra:
            raise KeyError(f"{path} has no lr_scheduler state")
        saved_extras = extra.get("extras", {})
        for name in self.extra_states:
            if name not in saved_extras:
                raise KeyError(
                    f"{path} has no extra state {name!r} (saved: {sorted(saved_extras)}); was the "
                    f"checkpoint written with a different actor config?"
                )
        return path, extra

    def _apply_extra(self, path: str, extra: dict) -> None:
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        restore_rng_state(extra["rng"])
        saved_extras = extra.get("extras", {})
        for name, obj in self.extra_states.items():
            obj.load_state_dict(saved_extras[name])
