"""The worker with tensor parallelism (actor and reference, tp=2 on 2 gloo ranks) computes what the plain FSDP
layout does, pushes full weights to its rollout engine, saves and restores its checkpoint and exports full weights.

Each rank gets its chunk of one batch, as ``Dispatch.DP_COMPUTE_PROTO`` hands it; the worker methods are called
directly (no Ray). Plain: FSDP over 2 ranks (dp=2). TP: one tp group of 2 (dp=1): both ranks train on the union of
their chunks, so one micro-batch of the plain layout's rows meets the same rows averaged the same way (one row per
micro-batch in both). Tolerance: 1e-5 absolute on log-probs and the grad norm (fp32; measured below 1e-6).
"""

import pytest
import torch
from transformers import Qwen2ForCausalLM  # noqa: F401  (imported once, before forking)

from tests.helpers.distributed_testing import run_gloo_ranks

WORLD = 2
TOL = 1e-5


def _batch(vocab: int, rows: int = 4):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(7)
    prompt, response = 10, 7
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    for r in range(rows):
        attn[r, : r % 3] = 0  # left-padded prompts
        attn[r, prompt + response - (r % 2) :] = 0  # right-padded responses
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


def _job(rank, world, port, cfg_yaml, ckpt_dir, resume_from):
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from verl.workers.config_sections import WorkerSections
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = OmegaConf.create(cfg_yaml)
    worker = ActorRolloutRefWorker(
        WorkerSections.from_config(cfg.actor_rollout_ref),
        role="actor_rollout_ref",
        device="cpu",
        total_training_steps=3,
    )
    worker.init_model()
    chunk = _batch(worker.actor_module.config.vocab_size).chunk(world)[rank]
    before = worker.compute_log_prob(chunk).batch["old_log_probs"]
    ref = worker.compute_ref_log_prob(chunk).batch["ref_log_prob"]
    chunk.batch["old_log_probs"], chunk.batch["ref_log_prob"] = before, ref
    metrics = worker.update_actor(chunk).meta_info["metrics"]
    after = worker.compute_log_prob(chunk).batch["old_log_probs"]
    worker.update_weights()  # the engine gets full weights (every rank joins the gathers)
    engine = {n: t.detach().clone() for n, t in worker.rollout.model.state_dict().items()}
    worker.save_checkpoint(f"{ckpt_dir}/step1", global_step=1)
    worker.save_hf_model(f"{ckpt_dir}/hf")
    worker.update_actor(chunk)  # moves the policy again; the restore must undo it
    worker.load_checkpoint(f"{ckpt_dir}/step1")
    restored = worker.compute_log_prob(chunk).batch["old_log_probs"]
    other = None
    if resume_from is not None:  # another layout's checkpoint: resharded by DCP, or refused in one line
        try:
            worker.load_checkpoint(resume_from)
            other = worker.compute_log_prob(chunk).batch["old_log_probs"]
        except Exception as exc:  # noqa: BLE001  (the test reads the line)
            other = f"{type(exc).__name__}: {exc}"
    dist.destroy_process_group()
    return {
        "before": before,
        "ref": ref,
        "after": after,
        "restored": restored,
        "other": other,
        "grad_norm": metrics["actor/grad_norm"],
        "engine": engine,
        "tp_mesh": None if worker.tp_mesh is None else tuple(worker.tp_mesh.shape),
        # the decoder layers this rank's actor holds (pipeline stages prune the others)
        "layers": sorted({int(n.split(".")[2]) for n in worker.actor_module.state_dict() if ".layers." in n}),
    }


TP = "actor_rollout_ref.actor.tensor_model_parallel_size"
PP = "actor_rollout_ref.actor.pipeline_model_parallel_size"


@pytest.mark.parametrize(
    "overrides,line",
    [
        (
            [f"{PP}=2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
            f"'{PP}'=2 with 'actor_rollout_ref.actor.ulysses_sequence_parallel_size'=2: pipeline parallel x Ulysses "
            "SP is not supported; set one of them to 1",
        ),
        (
            [f"{PP}=2", f"{TP}=2"],
            f"'{PP}'=2 x '{TP}'=2 must divide the world size 2 (trainer.nnodes * trainer.n_gpus_per_node)",
        ),
        (  # the tiny model has 2 decoder layers; the interleaved schedule runs 2 stages per rank
            [f"{PP}=2", "actor_rollout_ref.actor.pipeline_schedule=interleaved_1f1b"],
            f"'{PP}'=2 with 'actor_rollout_ref.actor.pipeline_schedule'=interleaved_1f1b: 4 stages must divide the "
            "model's num_hidden_layers=2",
        ),
        (
            [f"{TP}=2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
            f"'{TP}'=2 with 'actor_rollout_ref.actor.ulysses_sequence_parallel_size'=2: tensor parallel x Ulysses SP is "
            "not supported; set one of them to 1",
        ),
        (
            [f"{TP}=2", "actor_rollout_ref.ref.tensor_model_parallel_size=1"],
            f"'actor_rollout_ref.ref.tensor_model_parallel_size'=1 must be null or equal '{TP}'=2 (actor and "
            "reference share one worker and its (dp, tp) mesh)",
        ),
        (
            [f"{TP}=2", "actor_rollout_ref.actor.fsdp_config.fsdp_size=1"],
            f"'{TP}'=2 with 'actor_rollout_ref.actor.fsdp_config.fsdp_size'=1: tensor parallel shards over every dp "
            "rank (HSDP is not combined with it); keep fsdp_size=-1",
        ),
        ([f"{TP}=4"], f"'{TP}'=4 must divide the model's num_key_value_heads=2 (heads are split over tp ranks)"),
    ],
    ids=["pp_x_sp", "pp_x_tp_world", "pp_layers", "tp_x_sp", "ref_tp", "tp_x_hsdp", "kv_heads"],
)
def test_preflight_refuses_in_one_line_naming_the_keys(
    overrides, line, tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config
):
    from luffy_pool.config.check import validate_config

    base = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path)) + ["trainer.n_gpus_per_node=2"]
    assert validate_config(compose_config(base + [f"{TP}=2"])) == []
    errors = validate_config(compose_config(base + overrides))
    assert any(e.startswith(line) for e in errors), errors


def test_tp_must_divide_the_world_size():
    from verl.utils.tensor_parallel import build_tp_mesh

    with pytest.raises(ValueError, match=rf"^'{TP}'=4 must divide the world size 6$"):
        build_tp_mesh("cpu", 6, 4)


def plain_against_layout(fixtures, name: str, layout: list[str], extra: list[str], resume_plain_from_layout: bool):
    """2 worker ranks in the plain dp2 layout and in ``layout`` (tp2 or pp2): log-probs before/after one update and
    under the reference, the grad norm, the engine's weights and the HF export agree within TOL; each restores its own
    checkpoint exactly, and DCP reshards one layout's checkpoint into the other (``resume_plain_from_layout``: the
    layout's into plain, else plain's into the layout). Returns the two layouts' per-rank reports."""
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from luffy_pool.config.check import validate_config

    tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config = fixtures
    base = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path)) + [
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.attn_implementation=sdpa",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.use_off_policy_loss=False",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.ref.use_ref=True",
        *extra,
    ]
    plain, other = compose_config(base), compose_config(base + layout)
    assert validate_config(plain) == [] and validate_config(other) == []
    run = lambda cfg, d, resume: run_gloo_ranks(  # noqa: E731
        _job, WORLD, OmegaConf.to_container(cfg, resolve=True), str(tmp_path / d), resume, timeout_s=600
    )
    if resume_plain_from_layout:
        b = run(other, name, None)
        a = run(plain, "plain", str(tmp_path / name / "step1"))
    else:
        a = run(plain, "plain", None)
        b = run(other, name, str(tmp_path / "plain" / "step1"))
    for ra, rb in zip(a, b):
        for k in ("before", "ref", "after"):
            assert (ra[k] - rb[k]).abs().max() < TOL, k
        assert (ra["after"] - ra["before"]).abs().max() > 1e-4  # the update moved the policy
        assert torch.equal(rb["restored"], rb["after"])  # same layout: exact restore
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], abs=TOL)
        assert set(ra["engine"]) == set(rb["engine"])  # each rank's engine got every layer
        for n, t in rb["engine"].items():
            assert (t - ra["engine"][n]).abs().max() < TOL, n
        resumed, saved = (ra, rb) if resume_plain_from_layout else (rb, ra)
        assert not isinstance(resumed["other"], str), resumed["other"]  # DCP reshards the other layout's checkpoint
        assert (resumed["other"] - saved["after"]).abs().max() < TOL
    hf_a, hf_b = (
        load_file(str(tmp_path / "plain/hf/model.safetensors")),
        load_file(str(tmp_path / name / "hf/model.safetensors")),
    )
    assert set(hf_a) == set(hf_b)
    for n, t in hf_b.items():
        assert t.shape == hf_a[n].shape and (t - hf_a[n]).abs().max() < TOL, n
    return a, b


@pytest.mark.slow  # 2 x 2 forked gloo ranks, each building the worker with an HF engine
def test_tp2_worker_matches_the_plain_layout(tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config):
    fixtures = (tiny_model_dir, tiny_task_dir, tmp_path, luffy_overrides, compose_config)
    a, b = plain_against_layout(
        fixtures, "tp", [f"{TP}=2"], ["actor_rollout_ref.model.logprob_chunk_size=8"], resume_plain_from_layout=False
    )
    assert all(ra["tp_mesh"] is None and rb["tp_mesh"] == (2,) for ra, rb in zip(a, b))
