"""A simulated 2-node Ray cluster (``ray.cluster_utils.Cluster``, 1 CPU per node): a resource pool
with ``process_on_nodes=[1, 1]`` must put rank 0 and rank 1 on different nodes.

The cluster is its own Ray instance, so the check runs in a child process and never touches the
session's Ray (the ``ray_session`` fixture) of this pytest process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

CHILD = r'''
import json
import ray
from ray.cluster_utils import Cluster
from verl.single_controller.base import Dispatch, Worker, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup


class NodeReporter(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        return {"rank": self.rank, "local_rank": self.local_rank, "local_world_size": self.local_world_size,
                "node_id": self.get_node_id()}


node_args = {"num_cpus": 1, "object_store_memory": 96 * 1024 * 1024}
cluster = Cluster(initialize_head=True, head_node_args=dict(node_args, include_dashboard=False))
try:
    cluster.add_node(**node_args)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    pool = RayResourcePool([1, 1], use_gpu=False, placement_timeout_s=120)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(NodeReporter), startup_timeout_s=120)
    result = {"workers": group.where(), "pool_nodes": pool.node_ids(),
              "cluster_nodes": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])}
    group.shutdown()
    pool.release()
    print("RESULT " + json.dumps(result), flush=True)
finally:
    ray.shutdown()
    cluster.shutdown()
'''


@pytest.mark.slow
def test_pool_of_two_nodes_places_one_rank_per_node():
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1][len("RESULT ") :])
    workers = result["workers"]
    assert [w["rank"] for w in workers] == [0, 1]
    assert [w["local_rank"] for w in workers] == [0, 0] and [w["local_world_size"] for w in workers] == [1, 1]
    assert workers[0]["node_id"] != workers[1]["node_id"]
    assert sorted(w["node_id"] for w in workers) == result["cluster_nodes"]
    assert [w["node_id"] for w in workers] == result["pool_nodes"]
