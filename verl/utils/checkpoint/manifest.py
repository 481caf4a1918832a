"""Integrity of a published checkpoint: ``manifest.json`` (every file, its size and sha256) and its check.

The trainer writes the manifest into the ``.tmp_global_step_<N>`` directory after every rank and the
driver have written their files and before the rename publishes it; resume verifies it before loading
anything. ``verify_step_dir`` returns the first problem as one line naming the file and the checkpoint
(a truncated shard, a missing file, a changed checksum), or None when the checkpoint is intact.
Checkpoints written before manifests existed (``data.pt`` version 1) get a structural check instead
(driver state, actor metadata, model/optimizer DCP metadata, one extra-state file per saved rank) and
one warning per process; a checkpoint written by a version that always writes a manifest (``data.pt``
version >= 2) but has none is refused, since a deleted manifest would otherwise skip the integrity
check. A manifest entry that points outside its checkpoint (``../../etc/hostname``, an absolute path,
a symlink out) is refused without touching the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Optional

from verl.utils.checkpoint import layout

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# data.pt versions from which every save also wrote a manifest (version 1 predates manifests).
MANIFEST_SINCE_DATA_VERSION = 2
_CHUNK = 8 * 2**20

logger = logging.getLogger(__name__)
_warned_old = False


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _files_under(root: str) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel != MANIFEST_FILE:
                out.append(rel)
    return sorted(out)


def hash_share(root: str, rank: int, world_size: int) -> dict:
    """``{relative path: {size, sha256}}`` of this rank's share of the files under ``root`` (largest files
    dealt round-robin), so W ranks hash a checkpoint W times faster than the driver alone."""
    files = sorted(_files_under(root), key=lambda rel: (-os.path.getsize(os.path.join(root, rel)), rel))
    return {
        rel: {"size": os.path.getsize(os.path.join(root, rel)), "sha256": sha256_file(os.path.join(root, rel))}
        for rel in files[rank::world_size]
    }


def write_manifest(
    step_dir: str, removed: tuple[str, ...] = (), known: Optional[dict] = None, checksums: bool = True
) -> dict:
    """Record every file under ``step_dir`` (size, sha256); ``removed`` lists sub-dirs deliberately dropped
    (shards pruned by ``max_optim_to_keep``), so verification can say why they are absent. ``known``:
    entries already hashed (by the workers, paths relative to ``step_dir``); kept when the size still matches.
    ``checksums=False`` records sizes only (``sha256`` null; verification then checks sizes)."""
    known = known or {}
    files = {}
    for rel in _files_under(step_dir):
        size = os.path.getsize(os.path.join(step_dir, rel))
        entry = known.get(rel)
        if entry is not None and int(entry["size"]) == size:
            files[rel] = entry
        else:
            files[rel] = {"size": size, "sha256": sha256_file(os.path.join(step_dir, rel)) if checksums else None}
    manifest = {"version": MANIFEST_VERSION, "files": files, "removed": sorted(removed)}
    layout.write_file_atomic(os.path.join(step_dir, MANIFEST_FILE), json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(step_dir: str) -> Optional[dict]:
    path = os.path.join(step_dir, MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        try:
            manifest = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{path}: has no 'files' table")
    return manifest


def drop_from_manifest(step_dir: str, removed_dirs: list[str]) -> None:
    """Update the manifest after ``removed_dirs`` (absolute paths inside ``step_dir``) were deleted."""
    manifest = read_manifest(step_dir)
    if manifest is None:
        return
    rels = [os.path.relpath(d, step_dir) for d in removed_dirs]
    manifest["files"] = {
        f: v for f, v in manifest["files"].items() if not any(f == r or f.startswith(r + os.sep) for r in rels)
    }
    manifest["removed"] = sorted(set(manifest.get("removed", [])) | set(rels))
    layout.write_file_atomic(os.path.join(step_dir, MANIFEST_FILE), json.dumps(manifest, indent=1) + "\n")


def data_state_version(step_dir: str) -> Optional[int]:
    """``version`` of the step's ``data.pt`` (safe load), or None when it is missing or unreadable."""
    from verl.utils.checkpoint.safe_io import load_state

    try:
        state = load_state(os.path.join(step_dir, layout.DATA_FILE))
        return int(state.get("version", 1)) if isinstance(state, dict) else None
    except Exception:  # noqa: BLE001 - reported by the structural check or the loader, naming the file
        return None


def missing_manifest_problem(step_dir: str) -> Optional[str]:
    """A refusal when ``step_dir`` has no manifest although its writer always wrote one."""
    version = data_state_version(step_dir)
    if version is not None and version >= MANIFEST_SINCE_DATA_VERSION:
        return (
            f"{os.path.join(step_dir, MANIFEST_FILE)} is missing, but {layout.DATA_FILE} (version {version}) "
            f"was written by a version that always writes one: its files cannot be verified (deleted "
            f"manifest?); `python -m verl.utils.checkpoint.upgrade --rehash {step_dir}` re-creates it if you "
            f"trust the files"
        )
    return None


def _warn_old_once(step_dir: str) -> None:
    global _warned_old
    if not _warned_old:
        _warned_old = True
        logger.warning(
            "%s has no %s (written before manifests): only its structure is checked; "
            "`python -m verl.utils.checkpoint.upgrade <run dir>` adds one",
            step_dir,
            MANIFEST_FILE,
        )


def entry_path(step_dir: str, rel: str) -> Optional[str]:
    """The file a manifest entry names, or None when it lies outside ``step_dir`` (never stat'ed then)."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        return None
    root = os.path.realpath(step_dir)
    path = os.path.realpath(os.path.join(root, rel))
    return path if path.startswith(root + os.sep) else None


def _structure_problem(step_dir: str, need_model: bool, need_optim: bool) -> Optional[str]:
    """Checks of a checkpoint without a manifest (written before manifests existed)."""
    data = os.path.join(step_dir, layout.DATA_FILE)
    if not os.path.isfile(data):
        return f"{data} is missing"
    actor = os.path.join(step_dir, layout.ACTOR_DIR)
    meta_path = os.path.join(actor, layout.META_FILE)
    if not os.path.isfile(meta_path):
        return f"{meta_path} is missing"
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        world_size, contents = int(meta["world_size"]), list(meta.get("contents", []))
    except (ValueError, KeyError, TypeError) as exc:
        return f"{meta_path} is unreadable ({type(exc).__name__}: {exc})"
    for sub, needed in ((layout.MODEL_DIR, need_model), (layout.OPTIM_DIR, need_optim and "optimizer" in contents)):
        if needed and not os.path.isfile(os.path.join(actor, sub, ".metadata")):
            return f"{os.path.join(actor, sub, '.metadata')} is missing"
    if "extra" in contents:
        for rank in range(world_size):
            path = os.path.join(actor, layout.extra_state_file(world_size, rank))
            if not os.path.isfile(path):
                return f"{path} is missing"
    return None


def verify_step_dir(
    step_dir: str, checksums: bool = True, need_model: bool = True, need_optim: bool = True
) -> Optional[str]:
    """None when ``step_dir`` is intact, else one line naming the bad file of this checkpoint."""
    try:
        manifest = read_manifest(step_dir)
    except ValueError as exc:
        return str(exc)
    if manifest is None:
        problem = _structure_problem(step_dir, need_model, need_optim) or missing_manifest_problem(step_dir)
        if problem is None:
            _warn_old_once(step_dir)
        return problem
    for rel in manifest["files"]:
        if entry_path(step_dir, rel) is None:
            return (
                f"{os.path.join(step_dir, MANIFEST_FILE)}: entry {rel!r} points outside the checkpoint "
                f"(refused, not read)"
            )
    removed = manifest.get("removed", [])
    for sub, needed in ((layout.MODEL_DIR, need_model), (layout.OPTIM_DIR, need_optim)):
        rel = os.path.join(layout.ACTOR_DIR, sub)
        if needed and rel in removed:
            return f"{os.path.join(step_dir, rel)} was pruned by trainer.max_optim_to_keep (no {sub} shards to resume)"
    for rel, info in sorted(manifest["files"].items()):
        path = os.path.join(step_dir, rel)
        if not os.path.isfile(path):
            return f"{path} is missing (listed in {MANIFEST_FILE})"
        size = os.path.getsize(path)
        if size != int(info["size"]):
            return f"{path} has {size} bytes, {MANIFEST_FILE} says {info['size']} (truncated or replaced)"
    if checksums:
        for rel, info in sorted(manifest["files"].items()):
            path = os.path.join(step_dir, rel)
            if info.get("sha256") and sha256_file(path) != info["sha256"]:
                return f"{path}: sha256 differs from {MANIFEST_FILE} (corrupted or replaced)"
    return None
