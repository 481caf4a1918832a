"""The worker with HSDP + Ulysses SP + optimizer offload on 4 gloo ranks computes what the plain layout does.

Each rank gets its chunk of one batch, as ``Dispatch.DP_COMPUTE_PROTO`` would hand it; the worker methods are
called directly (no Ray). Layout A: FSDP over 4 ranks, SP=1 (dp=4). Layout B: fsdp_size=2 (HSDP), SP=2
(dp=2), optimizer_offload=True (a no-op on CPU; the path runs). One micro-batch = one row in both, so the
same rows average into the same gradient; old log-probs before and after one update must agree.
"""

import pytest
import torch
from transformers import Qwen2ForCausalLM  # noqa: F401  (imported once, before forking)

from tests.helpers.distributed_testing import run_gloo_ranks

WORLD = 4
JOB_TIMEOUT_S = 300


def _batch(vocab: int):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(7)
    rows, prompt, response = 16, 10, 7
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    for r in range(rows):
        attn[r, : r % 4] = 0  # left-padded prompts
        attn[r, prompt + response - (r % 3) :] = 0  # right-padded responses
    ids[attn == 0] = 0
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:],
            "advantages": torch.randn(rows, response, generator=g),
        }
    )


def _job(rank, world, port, cfg_yaml):
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    import verl.utils.ulysses as ulysses

    calls = []
    all_to_all = ulysses._all_to_all
    ulysses._all_to_all = lambda *a, **k: calls.append(1) or all_to_all(*a, **k)  # proves the SP path ran
    from verl.workers.config_sections import WorkerSections

    cfg = OmegaConf.create(cfg_yaml)
    worker = ActorRolloutRefWorker(
        WorkerSections.from_config(cfg.actor_rollout_ref), role="actor", device="cpu", total_training_steps=1
    )
    worker.init_model()
    chunk = _batch(worker.actor_module.config.vocab_size).chunk(world)[rank]
    before = worker.compute_log_prob(chunk).batch["old_log_probs"]
    chunk.batch["old_log_probs"] = before
    metrics = worker.update_actor(chunk).meta_info["metrics"]
    after = worker.compute_log_prob(chunk).batch["old_log_probs"]
    dist.destroy_process_group()
    return {
        "before": before,
        "after": after,
        "grad_norm": metrics["actor/grad_norm"],
        "mesh": tuple(worker.device_mesh.shape),
        "sp_group": worker.ulysses_group is not None,
        "offload_active": worker.optimizer_offload.active,
        "all_to_all_calls": len(calls),
    }


def _run(cfg):
    from omegaconf import OmegaConf

    return run_gloo_ranks(_job, WORLD, OmegaConf.to_container(cfg, resolve=True), timeout_s=JOB_TIMEOUT_S)


@pytest.mark.slow  # 4 forked gloo ranks, each building the worker
def test_hsdp_sp2_offload_worker_matches_the_plain_layout(
    tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config
):
    from luffy_pool.config.check import validate_config

    base = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path)) + [
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.attn_implementation=sdpa",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.use_off_policy_loss=False",
    ]
    plain = compose_config(base)
    parallel = compose_config(
        base
        + [
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        ]
    )
    assert validate_config(plain) == [] and validate_config(parallel) == []
    a = _run(plain)
    b = _run(parallel)
    for ra, rb in zip(a, b):
        assert ra["mesh"] == (4,) and rb["mesh"] == (2, 2)
        assert not ra["sp_group"] and rb["sp_group"]
        assert ra["all_to_all_calls"] == 0 and rb["all_to_all_calls"] > 0
        assert not rb["offload_active"]  # CPU run: the state already lives in host memory
        assert (ra["before"] - rb["before"]).abs().max() < 1e-5
        assert (ra["after"] - ra["before"]).abs().max() > 1e-4  # the update moved the policy
        assert (ra["after"] - rb["after"]).abs().max() < 1e-5
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], abs=1e-5)
