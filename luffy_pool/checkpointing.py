"""The trainer's checkpoints: when to save, where, how to resume, and the best-model HF folder.

``TrainerCheckpointer`` is the driver half of checkpointing (the workers write their shards through
``verl.workers.checkpoint_mixin``). A save goes to ``<default_local_dir>/.tmp_global_step_<N>``: the
workers write ``actor/``, the driver writes ``data.pt`` (data sampler, prefix-ratio sampler, KL
controller, driver RNG, last validation) and, with ``data.self_replay``, ``self_replay/``, then one rename publishes ``global_step_<N>`` and only
then does ``latest_checkpointed_iteration.txt`` move to N. A crash at any point leaves the previous
checkpoint as the one ``resume_mode=auto`` picks. Resume restores everything so step N+1 sees the
same prompts, prefix ratios and rollout seeds as an uninterrupted run (also right after an epoch's
last batch, and on a different number of ranks, where DCP reshards).
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from typing import Any, Optional

import torch

from verl.utils.checkpoint import layout
from verl.utils.checkpoint.rng import capture_rng_state, restore_rng_state

logger = logging.getLogger(__name__)

BEST_METRIC = "val/avg_score"
DATA_ORDER_FILE = "data_order.jsonl"
DATA_STATE_VERSION = 1
REPLAY_DIR = "self_replay"  # the self-replay buffer (data.self_replay): JSON index + safetensors, no pickle


class TrainerCheckpointer:
    """Driver-side checkpoint policy for ``MIXRayPPOTrainer`` (``trainer.*`` keys of the config).

    Args:
        config: the full run config; reads ``trainer.default_local_dir``, ``resume_mode``,
            ``resume_from_path``, ``max_optim_to_keep``, ``save_hf_on_save``, ``save_freq`` and
            ``data.dataloader_num_workers``.
        sampler: the training DataLoader's resumable sampler (``state_dict``/``load_state_dict``).
    """

    def __init__(self, config, sampler):
        t = config.trainer
        self.root = os.path.abspath(str(t.default_local_dir))
        self.resume_mode = str(t.get("resume_mode", "auto"))
        self.resume_from_path = t.get("resume_from_path")
        keep = t.get("max_optim_to_keep")
        self.max_optim_to_keep = int(keep) if keep is not None else None
        self.save_hf_on_save = bool(t.get("save_hf_on_save", False))
        self.sampler = sampler
        workers = int(config.get("data", {}).get("dataloader_num_workers", 0) or 0)
        save_freq = t.get("save_freq", -1)
        if workers > 0 and save_freq is not None and int(save_freq) > 0:
            # Worker processes prefetch, so the sampler's cursor runs ahead of the batches trained on
            # and a resume would silently skip prompts.
            raise ValueError(f"data.dataloader_num_workers={workers} with trainer.save_freq={save_freq}: the saved "
                             f"sampler position would be ahead of training; use dataloader_num_workers=0 to checkpoint")
        if sampler is None or not hasattr(sampler, "state_dict"):
            raise TypeError(f"TrainerCheckpointer needs the resumable training sampler, got {type(sampler).__name__}")

    # ------------------------------------------------------------------ save
    def save(self, trainer, metrics: Optional[dict] = None) -> str:
        """Checkpoint ``trainer`` at ``trainer.global_steps``; returns the published directory.

        Adds ``checkpoint/save_s`` and ``checkpoint/size_mb`` to ``metrics`` (logged with the step).
        """
        step = int(trainer.global_steps)
        t0 = time.perf_counter()
        os.makedirs(self.root, exist_ok=True)
        final = os.path.join(self.root, layout.step_dir_name(step))
        tmp = os.path.join(self.root, layout.TMP_PREFIX + layout.step_dir_name(step))
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
        trainer.wg.save_checkpoint(os.path.join(tmp, layout.ACTOR_DIR), global_step=step, max_ckpt_to_keep=None,
                                   save_hf=self.save_hf_on_save)
        self._write_data_state(os.path.join(tmp, layout.DATA_FILE), trainer, step)
        if getattr(trainer, "self_replay", None) is not None:
            trainer.self_replay.save(os.path.join(tmp, REPLAY_DIR))
        layout.publish_dir(tmp, final)
        layout.write_tracker(self.root, step)
        pruned = layout.prune_sharded_states(self.root, self.max_optim_to_keep, current_step=step)
        if pruned:
            logger.info("max_optim_to_keep=%s: removed %d shard dirs", self.max_optim_to_keep, len(pruned))
        if metrics is not None:
            metrics["checkpoint/save_s"] = time.perf_counter() - t0
            metrics["checkpoint/size_mb"] = layout.dir_size_bytes(final) / 2**20
            self.maybe_save_best(trainer, metrics)
        logger.info("saved checkpoint %s", final)
        return final

    def _write_data_state(self, path: str, trainer, step: int) -> None:
        kl_ctrl = getattr(trainer, "kl_ctrl", None)
        state = {
            "version": DATA_STATE_VERSION,
            "global_step": step,
            "total_training_steps": int(getattr(trainer, "total_training_steps", step)),
            "world_size": int(getattr(trainer, "world_size", 0)),
            "sampler": self.sampler.state_dict(),
            "ratio_sampler": trainer.ratio_sampler.state_dict(),
            "kl_coef": float(kl_ctrl.value) if kl_ctrl is not None and hasattr(kl_ctrl, "value") else None,
            "last_val_metrics": dict(getattr(trainer, "last_val_metrics", {}) or {}),
            "driver_rng": capture_rng_state(),
        }
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    # ------------------------------------------------------------------ best model
    def best_score(self) -> Optional[float]:
        path = os.path.join(self.root, layout.BEST_DIR, layout.BEST_METRICS_FILE)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return float(json.load(f)["best_avg_score"])

    def maybe_save_best(self, trainer, metrics: dict) -> bool:
        """Write ``best/actor`` (full HF model + metrics.json) when ``val/avg_score`` beats the stored best."""
        score = metrics.get(BEST_METRIC)
        if score is None or not math.isfinite(float(score)):
            return False
        best = self.best_score()
        if best is not None and float(score) <= best:
            return False
        final = os.path.join(self.root, layout.BEST_DIR)
        tmp = os.path.join(os.path.dirname(final), layout.TMP_PREFIX + os.path.basename(final))
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        trainer.wg.save_hf_model(tmp)
        record = {"best_avg_score": float(score), "global_step": int(trainer.global_steps),
                  **{k: float(v) for k, v in metrics.items() if k.startswith("val/")}}
        layout.write_file_atomic(os.path.join(tmp, layout.BEST_METRICS_FILE), json.dumps(record, indent=2) + "\n")
        layout.publish_dir(tmp, final)
        logger.info("new best %s=%.4f at step %d -> %s", BEST_METRIC, float(score), trainer.global_steps, final)
        return True

    # ------------------------------------------------------------------ resume
    def resolve_resume_dir(self) -> Optional[str]:
        """The ``global_step_<N>`` directory to resume from, or None to start fresh.

        ``auto``: the tracker's step under ``default_local_dir`` (none -> fresh); ``disable``: fresh;
        ``resume_path``: ``resume_from_path``; anything else is itself a path (a ``global_step_<N>`` dir,
        its ``actor/`` dir, or a run directory with a tracker). An explicit path that holds no
        checkpoint is an error, never a silent fresh start.
        """
        mode = self.resume_mode
        if mode == "disable":
            return None
        if mode == "auto":
            step = layout.read_tracker(self.root)
            if step is None:
                return None
            path = os.path.join(self.root, layout.step_dir_name(step))
            if not os.path.isdir(path):
                raise FileNotFoundError(f"{os.path.join(self.root, layout.TRACKER_FILE)} says step {step} but {path} "
                                        f"does not exist")
            return path
        if mode == "resume_path":
            if not self.resume_from_path:
                raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
            return self._step_dir_of(str(self.resume_from_path), "trainer.resume_from_path")
        return self._step_dir_of(mode, "trainer.resume_mode")

    def _step_dir_of(self, path: str, key: str) -> str:
        path = os.path.abspath(path)
        if os.path.basename(path) == layout.ACTOR_DIR:
            path = os.path.dirname(path)
        if layout.parse_step_dir(path) is None:
            step = layout.read_tracker(path) if os.path.isdir(path) else None
            if step is None:
                raise FileNotFoundError(f"{key}={path!r} is neither a {layout.STEP_DIR_PREFIX}<N> directory nor a run "
                                        f"directory with {layout.TRACKER_FILE} (or use auto / disable)")
            path = os.path.join(path, layout.step_dir_name(step))
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{key}: checkpoint directory {path} does not exist")
        return path

    def maybe_resume(self, trainer) -> int:
        """Restore the workers and the driver state; returns the step to continue after (0 = fresh)."""
        removed = layout.remove_stale_temp_dirs(self.root)
        if removed:
            logger.warning("removed leftovers of an interrupted save: %s", removed)
        step_dir = self.resolve_resume_dir()
        if step_dir is None:
            logger.info("no checkpoint to resume (resume_mode=%s, %s); training from step 1", self.resume_mode, self.root)
            return 0
        step = layout.parse_step_dir(step_dir)
        data_path = os.path.join(step_dir, layout.DATA_FILE)
        if not os.path.exists(data_path):
            raise FileNotFoundError(f"{data_path} not found: {step_dir} is incomplete")
        # Our own file: samplers' generator states and Python RNG tuples need full unpickling.
        data = torch.load(data_path, map_location="cpu", weights_only=False)
        if int(data["global_step"]) != step:
            raise ValueError(f"{data_path} is for step {data['global_step']}, but its directory says {step}")
        trainer.wg.load_checkpoint(os.path.join(step_dir, layout.ACTOR_DIR))
        self.sampler.load_state_dict(data["sampler"])
        trainer.ratio_sampler.load_state_dict(data["ratio_sampler"])
        kl_ctrl = getattr(trainer, "kl_ctrl", None)
        if data.get("kl_coef") is not None and kl_ctrl is not None:
            kl_ctrl.value = float(data["kl_coef"])
        trainer.last_val_metrics = dict(data.get("last_val_metrics", {}))
        restore_rng_state(data["driver_rng"])
        self._load_replay(trainer, step_dir)
        trainer._data_iter = None  # the next batch comes from the restored sampler position
        total = int(getattr(trainer, "total_training_steps", step))
        saved_ws, ws = data.get("world_size"), getattr(trainer, "world_size", None)
        logger.warning("resumed from %s (world size %s -> %s): continuing at step %d of %d%s", step_dir, saved_ws, ws,
                       step + 1, total, "; nothing left to train" if step >= total else "")
        return step

    @staticmethod
    def _load_replay(trainer, step_dir: str) -> None:
        buffer = getattr(trainer, "self_replay", None)
        if buffer is None:
            return
        path = os.path.join(step_dir, REPLAY_DIR)
        if not os.path.isdir(path):  # saved by a run without self-replay: this run starts its buffer empty
            logger.warning("%s has no %s/: data.self_replay starts with an empty buffer", step_dir, REPLAY_DIR)
            return
        buffer.load(path)

    # ------------------------------------------------------------------ reporting
    def last_good_checkpoint(self) -> Optional[str]:
        """The published checkpoint resume would use now (for the failure message), or None."""
        try:
            step = layout.read_tracker(self.root)
        except ValueError:
            return None
        return os.path.join(self.root, layout.step_dir_name(step)) if step is not None else None

    def record_data_order(self, global_step: int, prompt_indexes) -> None:
        """Append the step's prompt indexes to ``data_order.jsonl`` (an audit trail; last line per step wins)."""
        os.makedirs(self.root, exist_ok=True)
        rows = [v.item() if hasattr(v, "item") else v for v in list(prompt_indexes)]
        with open(os.path.join(self.root, DATA_ORDER_FILE), "a") as f:
            f.write(json.dumps({"step": int(global_step), "index": rows}, default=str) + "\n")


def read_data_order(root: str) -> dict[int, list[Any]]:
    """``{step: prompt indexes}`` from ``data_order.jsonl``; a step logged twice (re-run after a crash) keeps the last."""
    path = os.path.join(root, DATA_ORDER_FILE)
    order: dict[int, list[Any]] = {}
    if not os.path.exists(path):
        return order
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # a line torn by a kill mid-write; that step is re-run and re-logged
            raise ValueError(f"{path}: line {i + 1} is not JSON") from None
        order[int(rec["step"])] = rec["index"]
    return order
