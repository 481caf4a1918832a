"""GPU-cluster shapes on CPU, end to end (docs/DESIGN.md §2 items 1, 3, 13).

- The full config's defaults for the actor (gradient checkpointing + shared-prompt forward, padded rows)
  run a LUFFY step (this crashed ``update_actor`` with ``'NoneType' object has no attribute 'layers'``).
- One LUFFY step on a 2-node x 2-rank ``ray.cluster_utils.Cluster`` with 2 fake GPUs per node: 4 FSDP
  ranks placed as a real 2-node run places them (GPU bundles, one node group per Ray node, joined through
  ``ray_init.address``), dynamic micro-batches agreed over the 4 ranks, and every rank's device choice
  and rendezvous checked. The ranks compute on CPU (``trainer.device=cpu``, ``trainer.bundle_resources=gpu``).
"""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_full_config_defaults_with_gradient_checkpointing(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides, fit_with_fingerprints
):
    overrides = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), rollout="hf", steps=1)
    # back to mix_ppo_trainer.yaml's own defaults for the actor forward
    overrides = [
        o
        for o in overrides
        if not o.startswith(
            ("actor_rollout_ref.model.enable_gradient_checkpointing=", "actor_rollout_ref.model.use_remove_padding=")
        )
    ]
    config = compose_config(overrides)
    assert config.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert config.actor_rollout_ref.model.shared_prompt_forward is True
    assert config.actor_rollout_ref.model.use_remove_padding is False
    _, before, last, after = fit_with_fingerprints(config)
    assert all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    assert math.isfinite(last["actor/pg_loss"]) and math.isfinite(last["actor/grad_norm"])


CHILD = r'''
import json, sys
import ray
from ray.cluster_utils import Cluster
from hydra import compose, initialize_config_dir
import luffy_pool.config.check  # puts verl's worker YAML (ppo_worker) in Hydra's config store, as every composer does

overrides, config_dir = json.loads(sys.argv[1]), sys.argv[2]
node = {"num_cpus": 3, "num_gpus": 2, "object_store_memory": 128 << 20}
cluster = Cluster(initialize_head=True, head_node_args=dict(node, include_dashboard=False))
try:
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="mix_ppo_trainer", overrides=overrides + [f"ray_init.address={cluster.address}"])
    from luffy_pool.run.launcher import build_trainer
    trainer, close = build_trainer(config)
    try:
        reports = trainer.wg.device_report()
        before = trainer.wg.actor_weight_fingerprint()
        last = trainer.fit()
        after = trainer.wg.actor_weight_fingerprint()
        pool_nodes = trainer.wg.resource_pool.node_ids()
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    finally:
        close()
    result = {"reports": reports, "before": before, "after": after, "pool_nodes": pool_nodes, "nodes": nodes,
              "last": {k: v for k, v in last.items() if isinstance(v, (int, float))}}
    print("RESULT " + json.dumps(result), flush=True)
finally:
    ray.shutdown()
    cluster.shutdown()
'''


def test_one_luffy_step_on_two_nodes_of_two_fake_gpus(tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides):
    overrides = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), rollout="hf", steps=1) + [
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=2",
        "trainer.bundle_resources=gpu",
        "trainer.test_freq=-1",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=160",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=160",
        "trainer.balance_batch=False",
    ]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    env.pop("RAY_ADDRESS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    config_dir = os.path.join(REPO_ROOT, "luffy_pool", "config")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(overrides), config_dir],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"child failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    result = json.loads(lines[-1][len("RESULT ") :])
    reports = result["reports"]
    assert [r["rank"] for r in reports] == [0, 1, 2, 3]
    # placement: ranks 0-1 on one Ray node, 2-3 on another, in the pool's node order
    assert reports[0]["node_id"] == reports[1]["node_id"] != reports[2]["node_id"] == reports[3]["node_id"]
    assert [reports[0]["node_id"], reports[2]["node_id"]] == result["pool_nodes"]
    # rendezvous: rank 0's node address for everyone
    assert {(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in reports} == {
        (result["nodes"][reports[0]["node_id"]], reports[0]["env"]["MASTER_PORT"])
    }
    for r in reports:
        assert r["plan"]["device"] == "cpu"  # trainer.device=cpu: the ranks compute on CPU
        # each rank holds one GPU of its node, sees only that one, and a CUDA run would open cuda:0
        assert len(r["ray_gpu_ids"]) == 1 and r["env"]["CUDA_VISIBLE_DEVICES"] == r["ray_gpu_ids"][0]
        assert r["cuda_plan"] == {"device": "cuda", "index": 0, "env": {"LOCAL_RANK": "0"}}
        assert r["env"]["RAY_LOCAL_RANK"] == str(r["rank"] % 2) and r["env"]["WORLD_SIZE"] == "4"
    for a, b in ((0, 1), (2, 3)):
        assert reports[a]["ray_gpu_ids"] != reports[b]["ray_gpu_ids"]  # two ranks of a node: two GPUs
    assert all(abs(x - y) > 1e-8 for x, y in zip(result["before"], result["after"])), "weights must change"
    assert math.isfinite(result["last"]["actor/pg_loss"])


@pytest.mark.vllm
def test_luffy_step_with_vllm_cpu_tensor_parallel_two_on_four_ranks(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides, capsys, fit_with_fingerprints
):
    """The issue's ``quickstart.sh trainer.n_gpus_per_node=4 ...tensor_model_parallel_size=2``: 2 vLLM-CPU engines
    of 2 ranks each (external launcher over the trainer's gloo group) roll out a LUFFY step."""
    config = compose_config(
        luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), rollout="vllm", steps=1)
        + [
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "trainer.test_freq=-1",
            "actor_rollout_ref.actor.ppo_micro_batch_size=4",
        ]
    )
    trainer, before, last, after = fit_with_fingerprints(config)
    port = trainer.wg.master_port
    assert "rollout engine layout: 2 DP group(s) x TP 2" in capsys.readouterr().out
    assert not glob.glob(f"/dev/shm/luffy{port}-*"), "the engines' shared-memory segments outlive the run"
    assert len(before) == 4 and all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    assert last["rollout/full_trace_slots"] == 4 and last["on_off_metrics/off_score"] == 1.0
    assert math.isfinite(last["actor/pg_loss"]) and last["response_length/mean"] > 0
