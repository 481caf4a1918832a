"""One-time upgrade of checkpoints written before safe state files and manifests.

``python -m verl.utils.checkpoint.upgrade <run dir | global_step_N dir> ...`` rewrites each step's
``data.pt`` and ``extra_state_*.pt`` as plain data (numpy RNG arrays become tagged lists) and writes its
``manifest.json``. Old checkpoints resume without it (their numpy arrays are the one pickled type the
safe loader admits); after it, they load with plain ``weights_only`` and get the integrity check.
A file holding any other pickled object is refused, as on resume, and nothing is rewritten.

A step that already has a manifest is verified first (sizes and sha256): the tool never re-blesses a
corrupted checkpoint. A manifest that does not verify, or one missing from a checkpoint whose writer
always wrote one, is an error unless ``--rehash`` says explicitly to record the files as they are now.
"""

from __future__ import annotations

import argparse
import glob
import os
import pickle
import sys
from typing import Optional, Sequence

from verl.utils.checkpoint import layout, manifest
from verl.utils.checkpoint.safe_io import load_state, save_state


def step_dirs_of(path: str) -> list[str]:
    if layout.parse_step_dir(path) is not None:
        return [os.path.abspath(path)]
    found = [p for _, p in layout.list_step_dirs(path)]
    if not found:
        raise FileNotFoundError(f"{path}: no {layout.STEP_DIR_PREFIX}<N> directory")
    return found


class ManifestMismatchError(ValueError):
    """The step's manifest does not verify (or is missing where it must exist) and ``rehash`` was not given."""


def upgrade_step_dir(step_dir: str, rehash: bool = False) -> list[str]:
    """Rewrite the state files of one step directory and write its manifest; returns the rewritten files.

    Refuses (``ManifestMismatchError``, nothing rewritten) a step whose existing manifest does not verify
    or whose manifest was deleted, unless ``rehash``."""
    if not rehash:
        try:
            existing = manifest.read_manifest(step_dir)
        except ValueError as exc:
            existing, problem = None, str(exc)
        else:
            problem = (
                manifest.verify_step_dir(step_dir, need_model=False, need_optim=False)
                if existing is not None
                else manifest.missing_manifest_problem(step_dir)
            )
        if problem is not None:
            raise ManifestMismatchError(
                f"{step_dir}: {problem}; not upgraded (pass --rehash to record the files "
                f"as they are now, only if you trust them)"
            )
    state_files = [os.path.join(step_dir, layout.DATA_FILE)]
    state_files += sorted(glob.glob(os.path.join(step_dir, layout.ACTOR_DIR, "extra_state_world_size_*_rank_*.pt")))
    states = {path: load_state(path) for path in state_files if os.path.isfile(path)}  # all checked before any write
    for path, state in states.items():
        tmp = f"{path}.upgrade.{os.getpid()}"
        save_state(tmp, state)
        os.replace(tmp, path)
    removed = [
        os.path.join(layout.ACTOR_DIR, sub)
        for sub in (layout.MODEL_DIR, layout.OPTIM_DIR)
        if not os.path.isdir(os.path.join(step_dir, layout.ACTOR_DIR, sub))
    ]
    manifest.write_manifest(step_dir, removed=tuple(removed))
    return list(states)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m verl.utils.checkpoint.upgrade",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("paths", nargs="+", help="run directories (default_local_dir) or global_step_N directories")
    ap.add_argument(
        "--rehash",
        action="store_true",
        help="write the manifest from the files as they are now even when the existing one does not "
        "verify or was deleted (only for files you trust)",
    )
    args = ap.parse_args(argv)
    for path in args.paths:
        for step_dir in step_dirs_of(path):
            files = upgrade_step_dir(step_dir, rehash=args.rehash)
            print(f"{step_dir}: rewrote {len(files)} state file(s), wrote {manifest.MANIFEST_FILE}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError, pickle.UnpicklingError) as exc:  # UnsafeCheckpointError is an UnpicklingError
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
