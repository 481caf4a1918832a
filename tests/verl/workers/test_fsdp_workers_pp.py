"""The worker with pipeline parallelism (actor and reference, pp=2 on 2 gloo ranks, 1F1B) computes what the plain
FSDP layout does, pushes every stage's weights to each rank's rollout engine, saves and restores its checkpoint,
which the plain layout resumes (DCP reshards by the original parameter names), and exports full weights.

The harness is the TP worker test's (tests/verl/workers/test_fsdp_workers_tp.py): each rank gets its chunk of one
batch as ``Dispatch.DP_COMPUTE_PROTO`` hands it. Plain: FSDP over 2 ranks (dp=2). PP: one pp group of 2 (dp=1): both
ranks hold the union of their chunks; one row per update micro-batch in both layouts, so the losses average the same
rows the same way. Tolerance: 1e-5 absolute on log-probs and the grad norm (fp32; measured below 1e-6).
"""

import pytest
from transformers import Qwen2ForCausalLM  # noqa: F401  (imported once, before forking)

import torch

from tests.helpers.distributed_testing import run_gloo_ranks
from tests.verl.workers.test_fsdp_workers_tp import _job, plain_against_layout

WORLD = 2
TOL = 1e-5
PP = "actor_rollout_ref.actor.pipeline_model_parallel_size"


@pytest.mark.slow  # 2 x 2 forked gloo ranks, each building the worker with an HF engine
def test_pp2_worker_matches_the_plain_layout(tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config):
    """pp2 against plain dp2; the stages' checkpoint resumes in the plain layout (DCP, original parameter names)."""
    fixtures = (tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config)
    plain_against_layout(fixtures, "pp", [f"{PP}=2"], [], resume_plain_from_layout=True)


def _one_rank_against_pp2(model_dir, task_dir, tmp_path, luffy_overrides, compose_config, extra: list[str]):
    """The worker at pp2 (dp=1, ``extra`` on top) against one rank holding the same 4 rows: same log-probs before and
    after the update and under the reference, same grad norm. Returns pp2's per-rank reports."""
    from omegaconf import OmegaConf

    base = luffy_overrides(model_dir, task_dir, str(tmp_path)) + [
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.attn_implementation=sdpa",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.ref.use_ref=True",
        *extra,
    ]
    one = compose_config(base + ["trainer.n_gpus_per_node=1"])
    pp = compose_config(base + ["trainer.n_gpus_per_node=2", f"{PP}=2"])
    run = lambda cfg, world, d: run_gloo_ranks(  # noqa: E731
        _job, world, OmegaConf.to_container(cfg, resolve=True), str(tmp_path / d), None, timeout_s=600
    )
    (a,) = run(one, 1, "one")
    b_reports = run(pp, 2, "pp")
    for b, rows in zip(b_reports, (slice(0, 2), slice(2, 4))):  # each rank returns its chunk's rows
        for k in ("before", "ref", "after"):
            assert (a[k][rows] - b[k]).abs().max() < TOL, k
        assert (a["after"] - a["before"]).abs().max() > 1e-4
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], abs=TOL)
    return b_reports


@pytest.mark.slow  # 1 + 2 forked gloo ranks
def test_pp2_update_of_one_dynamic_micro_batch_matches_one_rank(
    tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config
):
    """The loss's micro-batches are not the pipeline's: one dynamic micro-batch of all 4 rows (as the quickstart's
    micro = mini), which the stages run as 2 pipeline micro-batches (1F1B needs at least pp)."""
    extra = ["actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096"]
    _one_rank_against_pp2(tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config, extra)


@pytest.mark.slow  # 1 + 2 forked gloo ranks
def test_pp2_interleaved_1f1b_worker_matches_one_rank(tiny_task_dir, tmp_path, luffy_overrides, compose_config):
    """The interleaved schedule in the worker: a 4-layer tiny Qwen2, rank 0 holding stages 0 and 2 (layers 0, 2),
    rank 1 stages 1 and 3; one-row update micro-batches, 2 pipeline micro-batches."""
    from luffy_pool.tiny import build_tiny_model
    from luffy_pool.tiny.model import TinyModelSpec

    model_dir = build_tiny_model(str(tmp_path / "model4"), TinyModelSpec(num_hidden_layers=4))
    extra = [
        "actor_rollout_ref.actor.pipeline_schedule=interleaved_1f1b",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    ]
    reports = _one_rank_against_pp2(model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config, extra)
    assert [r["layers"] for r in reports] == [[0, 2], [1, 3]]  # torch's loop placement


def _sft_job(rank, world, port, cfg_yaml, knobs):
    """ReLIFT's interleaved SFT stage on the mix worker: one stage on this rank's chunk, then its log-probs."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from luffy_pool.config.sections import LuffyWorkerSections
    from luffy_pool.workers.mix_fsdp_worker import MIXActorRolloutRefWorker
    from tests.verl.workers.test_fsdp_workers_tp import _batch

    cfg = OmegaConf.create(cfg_yaml)
    sections = LuffyWorkerSections.from_config(cfg.actor_rollout_ref)
    worker = MIXActorRolloutRefWorker(sections, role="actor_rollout_ref", device="cpu", total_training_steps=2)
    worker.init_model()
    worker.init_sft_optimizer(knobs)
    chunk = _batch(worker.actor_module.config.vocab_size).chunk(world)[rank]
    before = worker.compute_log_prob(chunk).batch["old_log_probs"]
    metrics = worker.sft_update_actor(chunk).meta_info["metrics"]
    after = worker.compute_log_prob(chunk).batch["old_log_probs"]
    dist.destroy_process_group()
    # the real response tokens: the chunked head (tp's vocab-parallel one) leaves 0 at padding, a full head scores it
    real = chunk.batch["attention_mask"][:, -before.size(1) :].bool()
    return {"before": before[real], "after": after[real], "grad_norm": metrics["actor/sft_grad_norm"], "real": real}


@pytest.mark.slow  # 1 + 2 forked gloo ranks
@pytest.mark.parametrize(
    "layout", [f"{PP}=2", "actor_rollout_ref.actor.tensor_model_parallel_size=2"], ids=["pp2", "tp2"]
)
def test_relift_sft_stage_matches_one_rank(
    layout, tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config
):
    """ReLIFT's SFT stage (its own AdamW, 2 mini-batches of 2 one-row micro-batches) runs through the pp stages, and
    at tp2 sums the sequence-parallel norms' gradients over tp before its clip: the same grad norms and log-probs
    after it as one rank holding the same 4 rows."""
    from omegaconf import OmegaConf

    base = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path)) + [
        "algorithm.method=relift",
        "actor_rollout_ref.actor.use_off_policy_loss=False",  # relift's preset (luffy_pool/config/method/relift.yaml)
        "actor_rollout_ref.rollout.n_prefix=0",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.attn_implementation=sdpa",
    ]
    knobs = dict(
        lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01, grad_clip=1.0, mini_batch_size=2, micro_batch_size=1,
        epochs=1, entropy_coeff=0.01,
    )  # fmt: skip
    run = lambda cfg, world: run_gloo_ranks(  # noqa: E731
        _sft_job, world, OmegaConf.to_container(cfg, resolve=True), knobs, timeout_s=600
    )
    (a,) = run(compose_config(base + ["trainer.n_gpus_per_node=1"]), 1)
    split = run(compose_config(base + ["trainer.n_gpus_per_node=2", layout]), 2)
    ranks = {k: torch.cat([b[k] for b in split]) for k in ("before", "after")}  # rank order = row order
    for k in ("before", "after"):
        assert (a[k] - ranks[k]).abs().max() < TOL, k
    for b in split:
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5) and len(a["grad_norm"]) == 2
    assert (a["after"] - a["before"]).abs().max() > 1e-4  # the stage moved the policy
