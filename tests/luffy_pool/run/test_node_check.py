"""Two-node pre-flight (docs/DESIGN.md §2 item 11) on a 2-node ``ray.cluster_utils.Cluster`` (in a child process, so the
session's Ray is untouched): the driver's marker in the checkpoint folder and the model folder's
fingerprint are read back by one task pinned to each node. Both nodes of this machine share its disk, so
the pass case is real; a node without the shared disk is simulated by a reader that runs the real
``read_on_node`` with the paths moved under a folder that node does not have (the node carries a
``no_shared_fs`` resource), and the failure must name that node."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from luffy_pool.run.node_check import folder_fingerprint

pytestmark = pytest.mark.e2e
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

CHILD = r'''
import json, os, sys
import ray
from ray.cluster_utils import Cluster
from luffy_pool.run.node_check import check_folders_on_every_node, read_on_node, MARKER_PREFIX

ckpt, model = sys.argv[1], sys.argv[2]
node = {"num_cpus": 1, "object_store_memory": 96 << 20}
cluster = Cluster(initialize_head=True, head_node_args=dict(node, include_dashboard=False))
try:
    cluster.add_node(**node, resources={"no_shared_fs": 1})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()

    def unshared_reader(checks):
        me = ray.get_runtime_context().get_node_id()
        res = [n for n in ray.nodes() if n["NodeID"] == me][0]["Resources"]
        if res.get("no_shared_fs"):  # this node's disk lacks the driver's folders
            checks = [(k, kind, "/nonexistent_node_disk" + p, exp) for k, kind, p, exp in checks]
        return read_on_node(checks)

    lone = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("no_shared_fs")][0]
    shared = check_folders_on_every_node(ckpt, model)
    unshared = check_folders_on_every_node(ckpt, model, reader=unshared_reader)
    hub = check_folders_on_every_node(None, "org/some-hub-model")
    left = [f for f in os.listdir(ckpt) if f.startswith(MARKER_PREFIX)]
    print("RESULT " + json.dumps({"shared": shared, "unshared": unshared, "hub": hub, "left": left,
                                  "lone_ip": lone["NodeManagerAddress"], "lone_id": lone["NodeID"]}), flush=True)
finally:
    ray.shutdown()
    cluster.shutdown()
'''


def test_folder_fingerprint_tells_model_folders_apart(tiny_model_dir, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    assert folder_fingerprint(str(copy)) == folder_fingerprint(tiny_model_dir)
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("}", ', "x": 1}', 1))
    assert folder_fingerprint(str(copy)) != folder_fingerprint(tiny_model_dir)
    assert folder_fingerprint(str(tmp_path / "absent")) is None


def test_two_nodes_pass_on_a_shared_disk_and_a_node_without_it_is_named(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ckpt), tiny_model_dir],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    r = json.loads(lines[-1][len("RESULT ") :])
    assert r["shared"] == [] and r["hub"] == [] and r["left"] == []  # marker removed after the check
    assert len(r["unshared"]) == 2, r["unshared"]
    ckpt_line, model_line = r["unshared"]
    for line in r["unshared"]:
        assert f"node {r['lone_ip']}" in line and r["lone_id"][:12] in line and "shared filesystem" in line
    assert ckpt_line.startswith("trainer.default_local_dir: ") and "cannot see /nonexistent_node_disk" in ckpt_line
    assert model_line.startswith("actor_rollout_ref.model.path: ") and "cannot see" in model_line
