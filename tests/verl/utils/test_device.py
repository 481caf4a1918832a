"""Device per rank (docs/DESIGN.md §2 item 1): the pure choice, and every rank of Ray worker groups with fake GPUs.

Ray narrows CUDA_VISIBLE_DEVICES to each actor's GPU, so the index must come from Ray's id within that
list (0), not from the node-local rank; LOCAL_RANK (what vLLM's external launcher opens) must equal it.
The Ray checks start their own Ray instance (``num_gpus=4`` on one node; a 2-node x 2-GPU
``ray.cluster_utils.Cluster``) in a child process, so the session's Ray is untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from verl.utils.device import (
    DevicePlan,
    apply_device_plan,
    choose_device_index,
    cluster_device,
    parse_visible_devices,
    plan_worker_device,
)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_parse_visible_devices():
    assert parse_visible_devices(None) is None
    assert parse_visible_devices("") == []
    assert parse_visible_devices("3, 5") == ["3", "5"]


def test_index_is_position_of_ray_id_in_visible_list():
    assert choose_device_index(["5"], ["5"]) == 0  # Ray narrowed the list: always cuda:0
    assert choose_device_index(["4", "5", "6", "7"], ["6"]) == 2  # NOSET: the node's list
    assert choose_device_index(None, ["3"]) == 3  # nothing narrowed: CUDA index = physical id
    with pytest.raises(RuntimeError, match="Ray assigned GPU 2 but CUDA_VISIBLE_DEVICES=0,1"):
        choose_device_index(["0", "1"], ["2"])


def test_local_rank_seven_on_a_node_uses_cuda_zero():
    # a multi-GPU node: node-local rank 7, Ray gave it GPU 7 and narrowed the visible list
    env = {"LOCAL_RANK": "7", "RAY_LOCAL_RANK": "7", "CUDA_VISIBLE_DEVICES": "7", "WG_BACKEND": "ray"}
    plan = plan_worker_device("auto", env, ["7"], cuda_available=True, cuda_count=1)
    assert plan == DevicePlan("cuda", 0, {"LOCAL_RANK": "0"})
    apply_device_plan(plan, env)
    assert env["LOCAL_RANK"] == "0" and env["RAY_LOCAL_RANK"] == "7"


def test_auto_and_explicit_choices():
    ray_env = {"WG_BACKEND": "ray", "LOCAL_RANK": "1"}
    # a Ray worker without a GPU bundle runs on CPU even where CUDA is visible
    assert plan_worker_device("auto", ray_env, [], cuda_available=True).device == "cpu"
    assert plan_worker_device("cpu", ray_env, ["0"], cuda_available=True) == DevicePlan("cpu", None, {})
    # outside Ray (torchrun): LOCAL_RANK is the device index
    assert plan_worker_device("auto", {"LOCAL_RANK": "3"}, [], cuda_available=True, cuda_count=8).index == 3
    assert plan_worker_device("auto", {}, [], cuda_available=False).device == "cpu"
    with pytest.raises(RuntimeError, match=r"Ray assigned GPU\(s\) \['1'\] but torch sees no CUDA device"):
        plan_worker_device("auto", ray_env, ["1"], cuda_available=False)
    with pytest.raises(RuntimeError, match="device index 3 is outside the 1 CUDA device"):
        plan_worker_device("cuda", {"LOCAL_RANK": "3"}, [], cuda_available=True, cuda_count=1)
    with pytest.raises(ValueError, match="trainer.device must be one of"):
        plan_worker_device("gpu", {}, [], cuda_available=True)


def test_cluster_device_comes_from_ray_resources_not_the_driver():
    assert cluster_device("auto", 16.0, 16) == "cuda"  # a CPU-only head of a GPU cluster still trains on GPUs
    assert cluster_device("auto", 0.0, 2) == "cpu"
    assert cluster_device("cpu", 8.0, 2) == "cpu"
    with pytest.raises(RuntimeError, match="needs 16 GPUs .* the Ray cluster has 8"):
        cluster_device("cuda", 8.0, 16)


CHILD = r'''
import json, os, sys
import ray
from verl.single_controller.base import Dispatch, Worker, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils.device import apply_device_plan, describe_worker, plan_worker_device, ray_gpu_ids


class GpuRankProbe(Worker):
    """The worker-side choice as a CUDA worker makes it (torch.cuda.set_device is the one step left out)."""

    def __init__(self):
        super().__init__()
        self.plan = plan_worker_device("cuda", os.environ, ray_gpu_ids(), cuda_available=True)
        apply_device_plan(self.plan, os.environ)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self):
        return dict(describe_worker(self.plan), rank=self.rank)


mode = sys.argv[1]
if mode == "one_node":
    ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False, object_store_memory=96 << 20)
    nodes = [4]
    cluster = None
else:
    from ray.cluster_utils import Cluster
    node_args = {"num_cpus": 2, "num_gpus": 2, "object_store_memory": 96 << 20}
    cluster = Cluster(initialize_head=True, head_node_args=dict(node_args, include_dashboard=False))
    cluster.add_node(**node_args)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    nodes = [2, 2]
try:
    pool = RayResourcePool(nodes, use_gpu=True, placement_timeout_s=120)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(GpuRankProbe), startup_timeout_s=120)
    print("RESULT " + json.dumps({"ranks": group.report(), "pool_nodes": pool.node_ids()}), flush=True)
    group.shutdown()
    pool.release()
finally:
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
'''


def _run_child(mode: str) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    env.pop("RAY_ADDRESS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def assert_gpu_placement(ranks: list, nodes: list) -> None:
    """Every rank: index within its visible list, LOCAL_RANK (vLLM's view) = index, one distinct GPU per rank
    on each node, node-local ranks kept in RAY_LOCAL_RANK, one rendezvous for all."""
    assert [r["rank"] for r in ranks] == list(range(sum(nodes)))
    start = 0
    for n in nodes:
        group = ranks[start : start + n]
        assert len({r["node_id"] for r in group}) == 1
        assert [r["env"]["RAY_LOCAL_RANK"] for r in group] == [str(i) for i in range(n)]
        assert len({tuple(r["ray_gpu_ids"]) for r in group}) == n  # no two ranks share a GPU
        start += n
    for r in ranks:
        plan, env = r["cuda_plan"], r["env"]
        visible = env["CUDA_VISIBLE_DEVICES"].split(",")
        assert visible == r["ray_gpu_ids"] and len(r["ray_gpu_ids"]) == 1
        assert plan["device"] == "cuda" and 0 <= plan["index"] < len(visible)
        assert visible[plan["index"]] == r["ray_gpu_ids"][0]
        assert env["LOCAL_RANK"] == str(plan["index"])  # vLLM's external_launcher opens cuda:{LOCAL_RANK}
        assert env["RANK"] == str(r["rank"]) and env["WORLD_SIZE"] == str(sum(nodes))
    assert len({(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in ranks}) == 1


@pytest.mark.e2e  # starts its own Ray
@pytest.mark.slow
def test_four_fake_gpus_on_one_node_every_rank_uses_its_own_cuda_zero():
    result = _run_child("one_node")
    assert_gpu_placement(result["ranks"], [4])


@pytest.mark.e2e  # starts its own Ray cluster
@pytest.mark.slow
def test_two_nodes_two_fake_gpus_each():
    result = _run_child("two_nodes")
    ranks = result["ranks"]
    assert_gpu_placement(ranks, [2, 2])
    assert ranks[0]["node_id"] != ranks[2]["node_id"]
    assert [ranks[0]["node_id"], ranks[2]["node_id"]] == result["pool_nodes"]


def test_engine_layout_and_bundle_choice(compose_config):
    from luffy_pool.config.sections import ConfigSections
    from luffy_pool.run.launcher import bundle_uses_gpu, engine_layout

    S = ConfigSections.from_config

    cfg = compose_config(
        [
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=8",
            "trainer.bundle_resources=auto",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        ]
    )
    assert engine_layout(S(cfg)) == "FSDP ranks 16 (2 node(s) x 8); rollout engine layout: 8 DP group(s) x TP 2"
    assert bundle_uses_gpu(S(cfg), "cuda") and not bundle_uses_gpu(S(cfg), "cpu")
    cfg.trainer.bundle_resources = "gpu"
    assert bundle_uses_gpu(S(cfg), "cpu")  # a CPU rehearsal of a GPU placement
    cfg.trainer.bundle_resources = "cpu"
    with pytest.raises(ValueError, match="a CUDA rank needs a GPU bundle"):
        bundle_uses_gpu(S(cfg), "cuda")
