"""Names and filesystem rules of the checkpoint tree, shared by the workers, the trainer and the merger.

LUFFY's layout (docs/METHOD.md §5.7) with DCP shards in place of per-rank pickles::

    <default_local_dir>/
      latest_checkpointed_iteration.txt        # the step resume picks; written last, atomically
      global_step_<N>/
        data.pt                                # driver state: samplers, RNG, controllers
        actor/
          model/      .metadata, __<r>_0.distcp    # torch.distributed.checkpoint (reshardable)
          optim/      .metadata, __<r>_0.distcp
          optim_<name>/                        # a second optimizer's shards (ReLIFT's SFT AdamW), once it stepped
          extra_state_world_size_<W>_rank_<r>.pt   # lr scheduler, RNG states, actor extras
          huggingface/                         # config + tokenizer (+ weights with save_hf)
          checkpoint_meta.json
      best/actor/                              # full HF model of the best val/avg_score + metrics.json

A step directory is first written under a ``.tmp_`` name and renamed into place, so a directory named
``global_step_<N>`` is always complete; the tracker file is updated only after that rename.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Optional

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR_PREFIX = "global_step_"
TMP_PREFIX = ".tmp_"
TRASH_PREFIX = ".trash_"
ACTOR_DIR = "actor"
MODEL_DIR = "model"
OPTIM_DIR = "optim"
EXTRA_OPTIM_PREFIX = "optim_"  # optim_<name>: an extra optimizer's DCP shards (FSDPCheckpointManager extra_optimizers)
HF_DIR = "huggingface"
META_FILE = "checkpoint_meta.json"
DATA_FILE = "data.pt"
BEST_DIR = os.path.join("best", "actor")
BEST_METRICS_FILE = "metrics.json"

_STEP_DIR_RE = re.compile(rf"^{STEP_DIR_PREFIX}(\d+)$")


def step_dir_name(step: int) -> str:
    return f"{STEP_DIR_PREFIX}{int(step)}"


def extra_optim_dir(name: str) -> str:
    return f"{EXTRA_OPTIM_PREFIX}{name}"


def extra_state_file(world_size: int, rank: int) -> str:
    return f"extra_state_world_size_{int(world_size)}_rank_{int(rank)}.pt"


def parse_step_dir(path: str) -> Optional[int]:
    """The N of a ``global_step_<N>`` path (trailing slashes allowed), or None."""
    m = _STEP_DIR_RE.match(os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m else None


def fsync_dir(path: str) -> None:
    """Persist a directory entry (a rename or a new file) across a power loss, where the OS allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename itself is still atomic
    finally:
        os.close(fd)


def write_file_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old content or the new one, never a torn file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_tracker(root: str) -> Optional[int]:
    """The step in ``<root>/latest_checkpointed_iteration.txt``, or None when there is no tracker file."""
    path = os.path.join(root, TRACKER_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise ValueError(f"{path} should hold a step number, found {text!r}")
    return int(text)


def write_tracker(root: str, step: int) -> None:
    write_file_atomic(os.path.join(root, TRACKER_FILE), f"{int(step)}\n")


def list_step_dirs(root: str) -> list[tuple[int, str]]:
    """Published ``global_step_<N>`` directories under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        step = parse_step_dir(name)
        if step is not None and os.path.isdir(os.path.join(root, name)):
            found.append((step, os.path.join(root, name)))
    return sorted(found)


def publish_dir(tmp_dir: str, final_dir: str) -> None:
    """Rename a fully written ``tmp_dir`` to ``final_dir``, replacing an older one of the same name.

    The old directory is first renamed aside (one atomic rename each), so at no point does
    ``final_dir`` hold a mix of old and new files.
    """
    parent = os.path.dirname(os.path.abspath(final_dir))
    trash = None
    if os.path.exists(final_dir):
        trash = os.path.join(parent, f"{TRASH_PREFIX}{os.path.basename(final_dir)}.{os.getpid()}")
        os.rename(final_dir, trash)
    os.rename(tmp_dir, final_dir)
    fsync_dir(parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def remove_stale_temp_dirs(root: str) -> list[str]:
    """Delete ``.tmp_*``/``.trash_*`` leftovers of a crashed or failed save; returns what was removed.

    A leftover that cannot be removed (permissions, a read-only disk) is left in place: resume never reads
    it (only ``global_step_<N>`` names are checkpoints) and the next save of that step replaces it."""
    if not os.path.isdir(root):
        return []
    removed = []
    for name in os.listdir(root):
        if name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            path = os.path.join(root, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.remove(path)
            except OSError:
                pass
            if not os.path.lexists(path):
                removed.append(path)
    return removed


def has_sharded_model(actor_dir: str) -> bool:
    return os.path.exists(os.path.join(actor_dir, MODEL_DIR, ".metadata"))


def prune_sharded_states(root: str, keep: Optional[int], current_step: int) -> list[str]:
    """LUFFY's ``max_optim_to_keep``: drop model/optimizer shards of all but the ``keep`` newest saves.

    Only steps up to ``current_step`` count (a directory left by an abandoned, later timeline is not
    touched). Older directories keep ``data.pt``, the extra state and ``huggingface/``. ``keep`` None
    or <= 0 keeps everything. Returns the removed shard directories.
    """
    if keep is None or int(keep) <= 0:
        return []
    steps = [(s, p) for s, p in list_step_dirs(root) if s <= current_step]
    removed = []
    for _step, path in steps[: max(0, len(steps) - int(keep))]:
        actor = os.path.join(path, ACTOR_DIR)
        extra = sorted(d for d in os.listdir(actor) if d.startswith(EXTRA_OPTIM_PREFIX)) if os.path.isdir(actor) else []
        for sub in (MODEL_DIR, OPTIM_DIR, *extra):
            shard_dir = os.path.join(actor, sub)
            if os.path.isdir(shard_dir):
                shutil.rmtree(shard_dir)
                removed.append(shard_dir)
    return removed


def dir_size_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return total


def resolve_actor_dir(path: str) -> str:
    """Accept a run root (uses its tracker), a ``global_step_<N>`` dir, or its ``actor/`` dir."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, MODEL_DIR)) or os.path.exists(os.path.join(path, META_FILE)):
        return path
    if os.path.isdir(os.path.join(path, ACTOR_DIR)):
        return os.path.join(path, ACTOR_DIR)
    step = read_tracker(path) if os.path.isdir(path) else None
    if step is not None:
        return os.path.join(path, step_dir_name(step), ACTOR_DIR)
    raise FileNotFoundError(
        f"{path} is not a checkpoint: expected an actor/ dir (with {MODEL_DIR}/ and {META_FILE}), a "
        f"{STEP_DIR_PREFIX}<N> dir, or a run root with {TRACKER_FILE}"
    )
