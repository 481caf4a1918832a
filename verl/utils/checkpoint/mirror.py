"""``trainer.default_hdfs_dir``: a second copy of every published checkpoint, on another disk or a remote store.

The local checkpoint stays the one resume reads; after each save the published ``global_step_<N>`` folder
and then the tracker file are copied to the mirror, so the mirror's tracker never names a step whose
folder is incomplete there. A plain path is copied with shutil (through a temporary name, then renamed);
anything with a scheme (``hdfs://``, ``s3://``, ``memory://``, ...) goes through fsspec, whose backend
package for that scheme must be installed.
"""

from __future__ import annotations

import os
import shutil

from verl.utils.checkpoint import layout


def is_url(path: str) -> bool:
    return "://" in str(path)


def mirror_checkpoint(local_root: str, step_dir: str, mirror_root: str) -> str:
    """Copy ``step_dir`` (a published ``global_step_<N>`` under ``local_root``) and the tracker file to
    ``mirror_root``; returns the mirrored step folder's path or URL."""
    name = os.path.basename(os.path.normpath(step_dir))
    tracker = os.path.join(local_root, layout.TRACKER_FILE)
    if is_url(mirror_root):
        import fsspec

        fs, root = fsspec.core.url_to_fs(str(mirror_root))
        target = f"{root.rstrip('/')}/{name}"
        if fs.exists(target):
            fs.rm(target, recursive=True)
        fs.makedirs(target, exist_ok=True)
        for dirpath, _, files in os.walk(step_dir):
            rel = os.path.relpath(dirpath, step_dir)
            sub = target if rel == "." else f"{target}/{rel.replace(os.sep, '/')}"
            fs.makedirs(sub, exist_ok=True)
            for file in files:
                fs.put_file(os.path.join(dirpath, file), f"{sub}/{file}")
        if os.path.exists(tracker):
            fs.put_file(tracker, f"{root.rstrip('/')}/{layout.TRACKER_FILE}")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        return f"{protocol}://{target.split('://', 1)[-1]}"
    root = os.path.abspath(os.path.expanduser(str(mirror_root)))
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, name)
    tmp = os.path.join(root, layout.TMP_PREFIX + name)
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    shutil.copytree(step_dir, tmp)
    layout.publish_dir(tmp, final)
    if os.path.exists(tracker):
        with open(tracker) as f:
            layout.write_file_atomic(os.path.join(root, layout.TRACKER_FILE), f.read())
    return final
