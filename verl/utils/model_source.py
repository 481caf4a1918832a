"""A model given as a local folder or a hub id, resolved to a local folder before any rank reads shards.

``actor_rollout_ref.model.path`` (used by the actor, the reference and, unless ``data.tokenizer`` is set,
the tokenizer) may be a hub id such as ``Elliott/Qwen2.5-Math-7B-16k-think``. The meta-device loader
(verl/utils/meta_init.py) reads safetensors byte ranges from a folder, so each worker first turns the id
into the snapshot folder of the local HuggingFace cache (``models--org--name/snapshots/<rev>``, found
through ``refs/<revision>``) with huggingface_hub's own resolution:

- ``HF_HUB_OFFLINE=1``: the cache only (no network); a missing snapshot is one error naming the id, the
  cache folder and the variables that move it;
- online: ``snapshot_download``, under a file lock in the cache, so the ranks of one node download once:
  the first one fetches the files, the others wait on the lock and then find every file present (the hub
  only answers their metadata requests). Each node has its own cache, so each node downloads once.
"""

from __future__ import annotations

import os
from typing import Optional

CACHE_ENV_VARS = "HF_HUB_CACHE (or HF_HOME, whose hub/ subfolder is the cache)"
_TRUE = ("1", "true", "yes", "on")


def is_local_path(name: str) -> bool:
    """A folder (or a path-like name) rather than a hub id ``org/name``."""
    return os.path.exists(os.path.expanduser(name)) or name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def hub_cache_dir() -> str:
    """The hub cache folder as huggingface_hub resolves it now (HF_HUB_CACHE, else HF_HOME/hub, else default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def unresolved_message(name: str, why: str) -> str:
    """One line naming the id, the cache folder looked in and the variables that move that folder."""
    folder = os.path.join(hub_cache_dir(), "models--" + name.replace("/", "--"))
    return (
        f"{name}: {why}; looked for the hub cache entry {folder} (set {CACHE_ENV_VARS} to use another cache, "
        f"or pass a local model folder)"
    )


def cached_snapshot(name: str, revision: Optional[str] = None) -> Optional[str]:
    """The snapshot folder of ``name`` in the cache, or None; never touches the network."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, revision=revision, cache_dir=hub_cache_dir(), local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or not a valid repo id): the caller reports it
        return None


def resolve_model_dir(name: str, revision: Optional[str] = None) -> str:
    """A local folder for ``name``: the folder itself, or the hub id's cache snapshot (downloaded when
    online and missing, once per node). Raises FileNotFoundError with ``unresolved_message``."""
    if is_local_path(name):
        return os.path.abspath(os.path.expanduser(name))
    from filelock import FileLock
    from huggingface_hub import snapshot_download

    cache = hub_cache_dir()
    if hub_offline():
        snap = cached_snapshot(name, revision)
        if snap is None:
            raise FileNotFoundError(unresolved_message(name, "not in the HuggingFace cache and HF_HUB_OFFLINE is set"))
        return snap
    lock_dir = os.path.join(cache, ".locks", "luffy_pool")
    os.makedirs(lock_dir, exist_ok=True)
    with FileLock(os.path.join(lock_dir, name.replace("/", "--") + ".lock")):
        try:
            return snapshot_download(name, revision=revision, cache_dir=cache)
        except Exception as exc:  # noqa: BLE001 - network / auth / unknown repo: one line for the user
            snap = cached_snapshot(name, revision)
            if snap is not None:
                return snap
            raise FileNotFoundError(
                unresolved_message(
                    name, f"cannot download it ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                )
            ) from exc
