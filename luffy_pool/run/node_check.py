"""Pre-flight of a multi-node run: every node must see the same checkpoint and model folder.

Without a shared filesystem the driver would write the checkpoint manifest for its own node's files while
each node's ranks write and hash their own, and a model folder copied by hand may differ between nodes.
After Ray is up and before any worker loads anything, the driver writes a marker with a fresh token into
the checkpoint folder and fingerprints the model folder (config.json bytes, names and sizes of the weight
and tokenizer files); one task per Ray node, pinned to it, reads both back. A node that cannot see the
marker or sees another model folder fails the run in one line naming that node. A hub id is not checked:
each node resolves it in its own cache (verl/utils/model_source.py).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Callable, Optional

MARKER_PREFIX = ".luffy_node_check_"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt")


def folder_fingerprint(path: str) -> Optional[str]:
    """A hash of config.json's bytes and the names and sizes of the folder's model files; None if absent."""
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return None
    h = hashlib.sha256()
    with open(config, "rb") as f:
        h.update(f.read())
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.endswith(_WEIGHT_SUFFIXES) and os.path.isfile(full):
            h.update(f"{name}:{os.path.getsize(full)};".encode())
    return h.hexdigest()


def read_on_node(checks: list[tuple[str, str, str, str]]) -> dict:
    """Run on one node: for each (key, kind, path, expected) report what this node sees.
    ``kind`` is ``marker`` (the file holds the token) or ``model`` (the folder's fingerprint)."""
    import socket

    import ray

    seen = {}
    for key, kind, path, expected in checks:
        if kind == "marker":
            try:
                with open(path) as f:
                    seen[key] = "ok" if f.read() == expected else "the marker holds another token"
            except OSError:
                seen[key] = f"cannot see {path}"
        else:
            got = folder_fingerprint(path) if os.path.isdir(path) else None
            seen[key] = (
                "ok"
                if got == expected
                else (f"cannot see {path}" if got is None else f"sees a different model folder at {path}")
            )
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "host": socket.gethostname(),
        "ip": ray.util.get_node_ip_address(),
        "seen": seen,
    }


def _alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def check_folders_on_every_node(
    checkpoint_dir: Optional[str],
    model_path: Optional[str],
    reader: Callable[[list], dict] = read_on_node,
    timeout_s: float = 300.0,
) -> list[str]:
    """One line per node that cannot see a folder (empty when every node sees both, or Ray has one node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from verl.utils.model_source import is_local_path

    nodes = _alive_nodes()
    if len(nodes) < 2:
        return []
    checks, marker = [], None
    if checkpoint_dir:
        root = os.path.abspath(str(checkpoint_dir))
        os.makedirs(root, exist_ok=True)
        token = uuid.uuid4().hex
        marker = os.path.join(root, MARKER_PREFIX + token)
        with open(marker, "w") as f:
            f.write(token)
        checks.append(("trainer.default_local_dir", "marker", marker, token))
    if model_path and is_local_path(str(model_path)):
        path = os.path.abspath(os.path.expanduser(str(model_path)))
        checks.append(("actor_rollout_ref.model.path", "model", path, folder_fingerprint(path) or ""))
    if not checks:
        return []
    task = ray.remote(num_cpus=0)(reader)
    try:
        refs = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(checks)
            for n in nodes
        ]
        reports = ray.get(refs, timeout=timeout_s)
    finally:
        if marker is not None and os.path.exists(marker):
            os.remove(marker)
    problems = []
    for report in reports:
        for key, what in report["seen"].items():
            if what != "ok":
                problems.append(
                    f"{key}: node {report['ip']} ({report['host']}, Ray node {report['node_id'][:12]}) "
                    f"{what}; every node of a multi-node run must see the same folder (a shared "
                    f"filesystem)"
                )
    return problems


def check_shared_folders(config) -> None:
    """Raise ``PreflightError`` when a node of the Ray cluster cannot see the run's checkpoint or model folder."""
    from luffy_pool.run.preflight import PreflightError

    problems = check_folders_on_every_node(config.trainer.default_local_dir, config.actor_rollout_ref.model.path)
    if problems:
        raise PreflightError(problems)
