"""The trainer's checkpoints: when to save, where, how to resume, and the best-model HF folder.

``TrainerCheckpointer`` is the driver half of checkpointing (the workers write their shards through
``verl.workers.checkpoint_mixin``). A save goes to ``<default_local_dir>/.tmp_global_step_<N>``: the
workers write ``actor/``, the driver writes ``data.pt`` (data sampler, prefix-ratio sampler, KL
controller, driver RNG, last validation) and, with ``data.self_replay``, ``self_replay/``, then one rename publishes ``global_step_<N>`` and only
then does ``latest_checkpointed_iteration.txt`` move to N. A crash at any point leaves the previous
checkpoint as the one ``resume_mode=auto`` picks. Resume restores everything so step N+1 sees the
same prompts, prefix ratios and rollout seeds as an uninterrupted run (also right after an epoch's
last batch, and on a different number of ranks, where DCP reshards). A larger
``trainer.total_training_steps`` on resume continues to the new total; it is refused in one line when the
actor's lr schedule is sized by the total (cosine, or a warmup still running) since the lr would jump.

Integrity and safety: ``data.pt`` holds only tensors and plain data and is read with ``weights_only``
(``safe_io``); every step directory carries a ``manifest.json`` (sizes and sha256 of all its files),
verified before resume. ``resume_mode=auto`` walks back from the tracker's step to the newest intact
checkpoint, logging which file of which checkpoint was bad. ``max_actor_ckpt_to_keep`` keeps the N
newest step directories. Objects registered with ``register_state`` (state_dict/load_state_dict of plain
data) are saved in ``data.pt`` under ``extras``.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import shutil
import time
from typing import Any, Optional

from luffy_pool.config.sections import ConfigSections
from verl.utils.checkpoint import layout, manifest
from verl.utils.checkpoint.rng import capture_rng_state, restore_rng_state
from verl.utils.checkpoint.safe_io import load_state, save_state

logger = logging.getLogger(__name__)

BEST_METRIC = "val/avg_score"
LUFFY_BEST_METRIC = "avg_score"  # LUFFY's key (mix_trainer.maybe_save_best_hf); accepted when val/avg_score is absent
DATA_ORDER_FILE = "data_order.jsonl"
DATA_STATE_VERSION = 2  # 2: plain data (weights_only), optional "extras"
REPLAY_DIR = "self_replay"  # the self-replay buffer (data.self_replay): JSON index + safetensors, no pickle


class CheckpointUnusableError(RuntimeError):
    """No checkpoint that resume may use: each tried one is named with its bad file."""


class ResumeRefusedError(ValueError):
    """The run's config cannot continue this checkpoint consistently (not a bad checkpoint: never skipped)."""


def lr_schedule_change_problem(optim, saved_total: Optional[int], total: int, step: int) -> Optional[str]:
    """None when a checkpoint of a ``saved_total``-step run resumed at ``step`` into a ``total``-step run keeps
    the lr the uninterrupted schedule gives, else the one-line refusal.

    The worker builds its scheduler from the new total and loads only the step counter, so the lr after the
    resume is the new schedule at ``step``: the same as before for a constant lr past its warmup (LUFFY's
    default), a jump for a cosine decay or a warmup whose length moves while it is still running.
    """
    if saved_total is None or int(saved_total) == int(total):
        return None
    old, new = int(saved_total), int(total)
    why = None
    if optim.warmup_style == "cosine":
        why = "actor.optim.warmup_style=cosine decays over it, so the lr would jump"
    else:
        w_old, w_new = (int(optim.lr_warmup_steps_ratio * t) for t in (old, new))
        if w_old != w_new and step < max(w_old, w_new):
            why = (
                f"actor.optim.lr_warmup_steps_ratio={optim.lr_warmup_steps_ratio} sizes the warmup by it "
                f"({w_old} -> {w_new} steps, still running at step {step})"
            )
    if why is None:
        return None
    return (
        f"cannot resume step {step} with trainer.total_training_steps={new}: the checkpoint's run had {old} and "
        f"{why}; keep {old}, or use warmup_style=constant with its warmup done"
    )


class CheckpointSaveError(OSError):
    """A save failed for lack of disk space; names the folder and what is free there."""


# Below this much free space a failed write is taken for a full disk (torch's zip writer reports ENOSPC
# as "unexpected pos ..." and Ray wraps a worker's OSError into a text).
LOW_SPACE_BYTES = 64 * 2**20
_NO_SPACE_MARKERS = ("No space left", "ENOSPC", "unexpected pos", "file write failed", "Disk quota exceeded")


def _free_bytes(path: str) -> Optional[int]:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or ".").free
    except OSError:
        return None


def is_no_space(exc: BaseException, folder: str) -> bool:
    """Whether ``exc`` (maybe a worker's error text) is a full disk under ``folder``."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    if "No space left" in text or "ENOSPC" in text or "Disk quota exceeded" in text:
        return True
    free = _free_bytes(folder)
    return any(m in text for m in _NO_SPACE_MARKERS) and free is not None and free < LOW_SPACE_BYTES


def _one_line(exc: BaseException) -> str:
    """The gist of an error for a log line (a worker error carries its remote traceback; keep the last line)."""
    if isinstance(exc, CheckpointUnusableError):
        return str(exc)
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[-1] if lines else ""
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


class TrainerCheckpointer:
    """Driver-side checkpoint policy for ``MIXRayPPOTrainer`` (``trainer.*`` keys of the config).

    Args:
        sections: the run's ``ConfigSections``; reads ``trainer.default_local_dir``, ``resume_mode``,
            ``resume_from_path``, ``max_optim_to_keep``, ``max_actor_ckpt_to_keep``, ``checkpoint_checksums``,
            ``save_hf_on_save``, ``default_hdfs_dir`` and ``actor.checkpoint.contents`` (the checker has
            refused the combinations that cannot checkpoint, ``ConfigSections.validate``).
        sampler: the training DataLoader's resumable sampler (``state_dict``/``load_state_dict``).
    """

    def __init__(self, sections: ConfigSections, sampler):
        t = sections.trainer
        self.root = os.path.abspath(str(t.default_local_dir))
        self.resume_mode = str(t.resume_mode)
        self.resume_from_path = t.resume_from_path
        keep = t.max_optim_to_keep
        self.max_optim_to_keep = int(keep) if keep is not None else None
        keep_ckpt = t.max_actor_ckpt_to_keep
        self.max_actor_ckpt_to_keep = int(keep_ckpt) if keep_ckpt is not None else None
        self.checksums = bool(t.checkpoint_checksums)
        contents = sections.workers.actor.checkpoint.contents
        self.need_optim = "optimizer" in list(contents)
        self.optim = sections.workers.actor.optim  # the lr schedule a changed total_training_steps would resize
        self.extra_states: dict[str, Any] = {}
        self.last_saved_step: Optional[int] = None  # saved or resumed from by this process
        self.refused: dict[str, str] = {}  # step dir -> why resume refused it (never reported as "last good")
        self.save_hf_on_save = bool(t.save_hf_on_save)
        self.mirror_root = t.default_hdfs_dir or None  # second copy of each checkpoint (local path or URL)
        self.sampler = sampler
        if sampler is None or not hasattr(sampler, "state_dict"):
            raise TypeError(f"TrainerCheckpointer needs the resumable training sampler, got {type(sampler).__name__}")

    def register_state(self, name: str, obj) -> None:
        """Save ``obj.state_dict()`` (tensors and plain data) with every checkpoint and restore it on resume."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise TypeError(f"checkpoint state {name!r} needs state_dict/load_state_dict, got {type(obj).__name__}")
        self.extra_states[name] = obj

    # ------------------------------------------------------------------ save
    def save(self, trainer, metrics: Optional[dict] = None) -> str:
        """Checkpoint ``trainer`` at ``trainer.global_steps``; returns the published directory.

        Adds ``checkpoint/save_s`` and ``checkpoint/size_mb`` to ``metrics`` (logged with the step).
        """
        step = int(trainer.global_steps)
        tmp = os.path.join(self.root, layout.TMP_PREFIX + layout.step_dir_name(step))
        try:
            return self._save(trainer, step, tmp, metrics)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)) or not is_no_space(exc, tmp):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a partial folder only takes the space a retry needs
            free = _free_bytes(tmp)
            free_text = f"{free / 2**20:.0f} MiB free" if free is not None else "free space unknown"
            raise CheckpointSaveError(
                errno.ENOSPC,
                f"no space left on device: saving step {step} into {tmp} failed "
                f"({free_text}; the partial folder was removed; the previous checkpoint is "
                f"untouched). Free space there or point trainer.default_local_dir elsewhere",
            ) from None

    def _save(self, trainer, step: int, tmp: str, metrics: Optional[dict]) -> str:
        t0 = time.perf_counter()
        os.makedirs(self.root, exist_ok=True)
        final = os.path.join(self.root, layout.step_dir_name(step))
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
        per_rank = trainer.wg.save_checkpoint(
            os.path.join(tmp, layout.ACTOR_DIR),
            global_step=step,
            max_ckpt_to_keep=None,
            save_hf=self.save_hf_on_save,
            compute_hashes=self.checksums,
        )
        self._write_data_state(os.path.join(tmp, layout.DATA_FILE), trainer, step)
        if getattr(trainer, "self_replay", None) is not None:  # before the manifest, so its files are listed
            trainer.self_replay.save(os.path.join(tmp, REPLAY_DIR))
        hashed = {
            os.path.join(layout.ACTOR_DIR, rel): entry
            for out in (per_rank or [])
            if isinstance(out, dict)
            for rel, entry in (out.get("files") or {}).items()
        }
        manifest.write_manifest(tmp, known=hashed, checksums=self.checksums)
        layout.publish_dir(tmp, final)
        layout.write_tracker(self.root, step)
        if self.mirror_root:  # trainer.default_hdfs_dir
            from verl.utils.checkpoint.mirror import mirror_checkpoint

            logger.info("mirrored checkpoint to %s", mirror_checkpoint(self.root, final, str(self.mirror_root)))
        self._prune(step)
        if metrics is not None:
            metrics["checkpoint/save_s"] = time.perf_counter() - t0
            metrics["checkpoint/size_mb"] = layout.dir_size_bytes(final) / 2**20
            self.maybe_save_best(trainer, metrics)
        logger.info("saved checkpoint %s", final)
        self.last_saved_step = step
        return final

    def save_if_unsaved(self, trainer) -> Optional[str]:
        """Save ``trainer.global_steps`` unless this process already saved or resumed exactly that step."""
        if int(trainer.global_steps) <= 0 or self.last_saved_step == int(trainer.global_steps):
            return None
        return self.save(trainer)

    def _write_data_state(self, path: str, trainer, step: int) -> None:
        state = {
            "version": DATA_STATE_VERSION,
            "global_step": step,
            "total_training_steps": int(getattr(trainer, "total_training_steps", step)),
            "world_size": int(getattr(trainer, "world_size", 0)),
            "sampler": self.sampler.state_dict(),
            **trainer.state_dict(),  # the trainer's own resumable state (ratio sampler, KL coefficient, ...)
            "driver_rng": capture_rng_state(),
            "extras": {name: obj.state_dict() for name, obj in self.extra_states.items()},
        }
        save_state(path, state)

    def _prune(self, step: int) -> None:
        pruned = layout.prune_sharded_states(self.root, self.max_optim_to_keep, current_step=step)
        if pruned:
            logger.info("max_optim_to_keep=%s: removed %d shard dirs", self.max_optim_to_keep, len(pruned))
            for shard_dir in pruned:  # <step>/actor/<model|optim>
                manifest.drop_from_manifest(os.path.dirname(os.path.dirname(shard_dir)), [shard_dir])
        if self.max_actor_ckpt_to_keep is not None and self.max_actor_ckpt_to_keep > 0:
            steps = [(s, p) for s, p in layout.list_step_dirs(self.root) if s <= step]
            for _s, path in steps[: max(0, len(steps) - self.max_actor_ckpt_to_keep)]:
                shutil.rmtree(path)
                logger.info("max_actor_ckpt_to_keep=%d: removed %s", self.max_actor_ckpt_to_keep, path)

    # ------------------------------------------------------------------ best model
    def best_score(self) -> Optional[float]:
        path = os.path.join(self.root, layout.BEST_DIR, layout.BEST_METRICS_FILE)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return float(json.load(f)["best_avg_score"])

    def maybe_save_best(self, trainer, metrics: dict) -> bool:
        """Write ``best/actor`` (full HF model + metrics.json) when ``val/avg_score`` (or LUFFY's ``avg_score``)
        beats the stored best."""
        score = metrics.get(BEST_METRIC, metrics.get(LUFFY_BEST_METRIC))
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
        record = {
            "best_avg_score": float(score),
            "global_step": int(trainer.global_steps),
            **{k: float(v) for k, v in metrics.items() if k.startswith("val/")},
        }
        layout.write_file_atomic(os.path.join(tmp, layout.BEST_METRICS_FILE), json.dumps(record, indent=2) + "\n")
        layout.publish_dir(tmp, final)
        logger.info("new best %s=%.4f at step %d -> %s", BEST_METRIC, float(score), trainer.global_steps, final)
        return True

    # ------------------------------------------------------------------ resume
    def resume_candidates(self) -> list[str]:
        """Step directories to try, in order; empty to start fresh.

        ``auto``: the tracker's step, then older published steps (newest first; steps after the tracker's
        belong to an abandoned timeline and are never used); no tracker -> fresh. ``disable``: fresh.
        ``resume_path``: ``resume_from_path``; anything else is itself a path (a ``global_step_<N>`` dir,
        its ``actor/`` dir, or a run directory with a tracker). An explicit path that holds no
        checkpoint is an error, never a silent fresh start.
        """
        mode = self.resume_mode
        if mode == "disable":
            return []
        if mode == "auto":
            tracker = os.path.join(self.root, layout.TRACKER_FILE)
            try:
                step = layout.read_tracker(self.root)
            except ValueError as exc:
                published = layout.list_step_dirs(self.root)
                logger.warning("%s; trying the published checkpoints from the newest", exc)
                step = published[-1][0] if published else None
            if step is None:
                return []
            path = os.path.join(self.root, layout.step_dir_name(step))
            if not os.path.isdir(path):
                logger.warning("%s says step %d but %s does not exist; trying older checkpoints", tracker, step, path)
            older = [p for s, p in reversed(layout.list_step_dirs(self.root)) if s <= step]
            if not older:
                raise CheckpointUnusableError(
                    f"{tracker} says step {step} but {path} does not exist and no older "
                    f"checkpoint is left (trainer.resume_mode=disable starts fresh)"
                )
            return older
        if mode == "resume_path":
            if not self.resume_from_path:
                raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
            return [self._step_dir_of(str(self.resume_from_path), "trainer.resume_from_path")]
        return [self._step_dir_of(mode, "trainer.resume_mode")]

    def _step_dir_of(self, path: str, key: str) -> str:
        path = os.path.abspath(path)
        if os.path.basename(path) == layout.ACTOR_DIR:
            path = os.path.dirname(path)
        if layout.parse_step_dir(path) is None:
            step = layout.read_tracker(path) if os.path.isdir(path) else None
            if step is None:
                raise FileNotFoundError(
                    f"{key}={path!r} is neither a {layout.STEP_DIR_PREFIX}<N> directory nor a run "
                    f"directory with {layout.TRACKER_FILE} (or use auto / disable)"
                )
            path = os.path.join(path, layout.step_dir_name(step))
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{key}: checkpoint directory {path} does not exist")
        return path

    def verify(self, step_dir: str, checksums: Optional[bool] = None) -> Optional[str]:
        """None when ``step_dir`` is intact and resumable, else one line naming its bad file."""
        return manifest.verify_step_dir(
            step_dir, checksums=self.checksums if checksums is None else checksums, need_optim=self.need_optim
        )

    def _read_data_state(self, step_dir: str) -> dict:
        step = layout.parse_step_dir(step_dir)
        data_path = os.path.join(step_dir, layout.DATA_FILE)
        if not os.path.exists(data_path):
            raise FileNotFoundError(f"{data_path} not found: {step_dir} is incomplete")
        data = load_state(data_path)  # weights_only: a planted pickle is refused, naming the file
        if not isinstance(data, dict) or "global_step" not in data:
            raise ValueError(f"{data_path} is not a driver state file (no global_step)")
        if int(data["global_step"]) != step:
            raise ValueError(f"{data_path} is for step {data['global_step']}, but its directory says {step}")
        return data

    def maybe_resume(self, trainer) -> int:
        """Restore the workers and the driver state; returns the step to continue after (0 = fresh).

        With ``resume_mode=auto`` a checkpoint that fails verification or loading is skipped (logged with
        its bad file) for the next older one; an explicitly named checkpoint must be intact.
        """
        removed = layout.remove_stale_temp_dirs(self.root)
        if removed:
            logger.warning("removed leftovers of an interrupted save: %s", removed)
        candidates = self.resume_candidates()
        if not candidates:
            logger.info(
                "no checkpoint to resume (resume_mode=%s, %s); training from step 1", self.resume_mode, self.root
            )
            return 0
        fallback = self.resume_mode == "auto"
        problems = []
        for step_dir in candidates:
            try:
                problem = self.verify(step_dir)
                if problem is not None:
                    raise CheckpointUnusableError(problem)
                state = self._read_data_state(step_dir)  # the checkpoint's data.pt, not config
                refused = lr_schedule_change_problem(
                    self.optim,
                    state.get("total_training_steps"),
                    int(getattr(trainer, "total_training_steps", 0)),
                    layout.parse_step_dir(step_dir),
                )
                if refused is not None:
                    raise ResumeRefusedError(refused)
                trainer.wg.load_checkpoint(os.path.join(step_dir, layout.ACTOR_DIR))
            except BaseException as exc:  # noqa: BLE001 - every failure is named and either skipped or re-raised
                if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit, ResumeRefusedError)):
                    raise  # a config that cannot continue this run is no reason to fall back to an older checkpoint
                line = _one_line(exc)
                self.refused[os.path.abspath(step_dir)] = line
                if not fallback:
                    raise CheckpointUnusableError(f"cannot resume from {step_dir}: {line}") from None
                problems.append(f"{os.path.basename(step_dir)}: {line}")
                logger.error("checkpoint %s is not usable: %s; trying the previous one", step_dir, line)
                continue
            self._apply_data_state(trainer, state, step_dir)
            step = layout.parse_step_dir(step_dir)
            self.last_saved_step = step
            total = int(getattr(trainer, "total_training_steps", step))
            saved_ws, ws = state.get("world_size"), getattr(trainer, "world_size", None)
            logger.warning(
                "resumed from %s (world size %s -> %s): continuing at step %d of %d%s",
                step_dir,
                saved_ws,
                ws,
                step + 1,
                total,
                "; nothing left to train" if step >= total else "",
            )
            return step
        raise CheckpointUnusableError(
            f"no intact checkpoint under {self.root} ({'; '.join(problems)}); move the bad "
            f"ones aside, or start fresh with trainer.resume_mode=disable"
        )

    def _apply_data_state(self, trainer, data: dict, step_dir: str) -> None:
        self.sampler.load_state_dict(data["sampler"])
        trainer.load_state_dict(data)
        restore_rng_state(data["driver_rng"])
        saved_extras = data.get("extras", {}) or {}
        for name, obj in self.extra_states.items():
            if name in saved_extras:
                obj.load_state_dict(saved_extras[name])
            else:
                logger.warning("checkpoint has no saved state %r (written before it existed); it starts empty", name)
        self._load_replay(trainer, step_dir)

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
        """The newest checkpoint resume would use now (sizes checked; for the failure message), or None."""
        try:
            step = layout.read_tracker(self.root)
        except ValueError:
            return None
        if step is None:
            return None
        for s, path in reversed(layout.list_step_dirs(self.root)):
            if os.path.abspath(path) in self.refused:
                continue  # resume refused it in this process: it is not good, whatever its sizes say
            if s <= step and self.verify(path, checksums=False) is None:
                return path
        return None

    def refused_summary(self) -> str:
        """``"; refused on resume: global_step_4 (<why>)"`` for the failure message, or ''."""
        if not self.refused:
            return ""
        return "; refused on resume: " + ", ".join(f"{os.path.basename(p)} ({why})" for p, why in self.refused.items())

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
