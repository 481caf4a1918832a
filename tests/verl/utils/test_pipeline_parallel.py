"""Pipeline parallelism of the actor (verl/utils/pipeline_parallel.py): the stage split, the refusals, and parity on
gloo ranks with the one-rank run.

Parity: a tiny random Qwen3 (q/k norms, untied head; fp32, 4 layers, hidden 64, 4 query / 2 kv heads, head_dim 16,
vocab 128), built the worker's way (meta device -> prune to the rank's stages -> TP -> FSDP2 over dp per stage ->
shards read from the checkpoint by original name). Two steps of different widths (the pipeline re-infers its shapes),
each a right- and left-padded batch whose row count is not a multiple of the pipeline micro-batches (padding rows).
The last stage scores through full logits (GPipe, interleaved; under TP the head's weight gathered) and through the
actor's token-chunked head (1F1B; under TP the vocab-parallel one). "+packed": the same schedule with the rows packed
(``use_remove_padding``, verl/utils/pipeline_packing.py: one row per pipeline micro-batch, sdpa's block-diagonal mask
here, flash-attention's varlen kernels on a GPU), held to the same tolerances.
The forward-only pass's log-probs must equal the unsplit model's within 1e-6 absolute, the entropy within 1e-6 of its
largest value; the loss (computed from them) and every gradient the rank owns within relative 1e-5 of the tensor's
largest value. Measured: pp2 full logits: log-probs, entropy and loss bit-equal, gradients rel <= 2.9e-7; pp2 chunked
head and pp2 x tp2: log-probs 4.8e-7, entropy rel <= 4e-7, gradients rel <= 1.5e-6.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3ForCausalLM  # noqa: F401  (imported before forking)

from tests.helpers.distributed_testing import run_gloo_ranks
from verl.utils.pipeline_parallel import PP_KEY, SCHEDULE_KEY, pp_layout_errors, rank_stages, stage_layers

LP_TOL, REL_TOL = 1e-6, 1e-5


def test_stage_split_and_placement():
    assert [list(stage_layers(8, 4, s)) for s in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert rank_stages(1, 2, "1f1b") == [1] and rank_stages(1, 2, "interleaved_1f1b") == [1, 3]


def test_refusals_name_the_keys():
    tp = "actor_rollout_ref.actor.tensor_model_parallel_size"
    sp = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    assert pp_layout_errors(1, "1f1b", 3, sp=2, num_layers=5, tied=True) == []
    assert pp_layout_errors(2, "1f1b", 4, tp=2, num_layers=4, tied=False) == []
    assert pp_layout_errors(2, "1f1b", 6, tp=2) == [f"'{PP_KEY}'=2 x '{tp}'=2 must divide the world size 6"]
    assert pp_layout_errors(2, "gpipe", 2, sp=2) == [
        f"'{PP_KEY}'=2 with '{sp}'=2: pipeline parallel x Ulysses SP is not supported; set one of them to 1"
    ]
    assert pp_layout_errors(2, "interleaved_1f1b", 2, num_layers=6) == [
        f"'{PP_KEY}'=2 with '{SCHEDULE_KEY}'=interleaved_1f1b: 4 stages must divide the model's num_hidden_layers=6"
    ]
    (line,) = pp_layout_errors(2, "1f1b", 2, num_layers=4, tied=True)
    assert line.startswith(f"'{PP_KEY}'=2: the model ties its LM head to the input embeddings")


def _config():
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def _batch(seed: int, rows: int, width: int, response: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (rows, width), generator=g)
    attn = torch.ones_like(ids)
    for r in range(rows):
        attn[r, : r % 3] = 0  # left-padded prompts
        attn[r, width - (r % 2) * 2 :] = 0  # right-padded responses
    ids[attn == 0] = 0
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, -response:],
        "advantages": torch.randn(rows, response, generator=g),
    }


def _loss(log_probs, entropy, batch):
    mask = batch["attention_mask"][:, -log_probs.shape[1] :].float()
    return -((log_probs * batch["advantages"] + 0.01 * entropy) * mask).sum() / mask.sum()


def _reference(model_dir: str, batch: dict):
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from verl.workers.actor.dp_actor import DataParallelPPOActor

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    actor = DataParallelPPOActor(OmegaConf.create({}), model, logprob_chunk_size=0)
    model.train()
    ent, lp = actor._forward_micro_batch(batch, 0.7, calculate_entropy=True)
    loss = _loss(lp, ent, batch)
    loss.backward()
    return lp.detach(), ent.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _parity_job(rank, world, port, model_dir, pp, tp, schedules):
    import torch.distributed as dist
    from transformers import AutoConfig

    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.utils.meta_init import empty_model
    from verl.utils.pipeline_parallel import build_pipeline_model, build_pp_mesh, materialize_pipeline
    from verl.utils.tensor_parallel import allreduce_replicated_grads

    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh, _ = build_pp_mesh("cpu", world, pp, tp)
    report = {}
    for name in schedules:  # "<schedule>[+packed][+sp]": remove padding (verl/utils/pipeline_packing.py), sequence-
        schedule, *extra = name.split("+")  # parallel norms (verl/utils/sequence_parallel_norms.py)
        packed, sp = "packed" in extra, "sp" in extra
        model = empty_model(AutoConfig.from_pretrained(model_dir), torch.float32, "sdpa")
        chunk = 4 if schedule == "1f1b" else 0  # the token-chunked head (vocab-parallel under TP), else full logits
        shard = lambda m: apply_fsdp2(m, mesh["dp"])  # noqa: E731
        pipe = build_pipeline_model(model, mesh["pp"], schedule, "cpu", shard, mesh["tp"], chunk, sp)
        pipe = materialize_pipeline(pipe, model_dir, "cpu")
        pipe.module.train()
        for step, (rows, width) in enumerate(((5, 12), (3, 9))):  # new widths: the stages re-infer shapes
            batch = _batch(step, rows, width, 5)
            ref_lp, ref_ent, ref_loss, ref_grads = _reference(model_dir, batch)
            n_chunks = pipe.n_chunks(rows, 2)
            lp, ent = pipe.forward(batch, n_chunks, 0.7, packed)
            lp_leaf, ent_leaf = lp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
            loss = _loss(lp_leaf, ent_leaf, batch)
            loss.backward()
            for p in pipe.module.parameters():
                p.grad = None
            pipe.backward(batch, n_chunks, 0.7, lp_leaf.grad, ent_leaf.grad, packed)
            allreduce_replicated_grads(pipe.module)
            grads = {n: p.grad.full_tensor() for n, p in pipe.module.named_parameters()}
            valid = batch["attention_mask"][:, -5:].bool()
            worst = {
                n: float((g - ref_grads[n]).abs().max() / ref_grads[n].abs().max().clamp(min=1e-30))
                for n, g in grads.items()
            }
            report[(name, step)] = {
                "lp": float((lp - ref_lp)[valid].abs().max()),
                "ent": float((ent - ref_ent)[valid].abs().max() / ref_ent[valid].abs().max()),
                "loss": float((loss.detach() - ref_loss).abs() / ref_loss.abs()),
                "grads": worst,
                "owned": sorted(grads),
                "sequence_parallel": all(m.sequence_parallel is not None for m in pipe.stage_modules),
            }
    dist.destroy_process_group()
    return report


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3_pp")
    AutoModelForCausalLM.from_config(_config()).float().save_pretrained(path)
    return str(path)


def _check(reports, layers_of_rank):
    for rank, report in enumerate(reports):
        for (schedule, step), r in report.items():
            where = (rank, schedule, step)
            assert r["sequence_parallel"] == ("+sp" in schedule), where
            assert r["lp"] <= LP_TOL and r["ent"] <= LP_TOL and r["loss"] <= REL_TOL, (where, r)
            bad = {n: v for n, v in r["grads"].items() if not v <= REL_TOL}
            assert bad == {}, (where, bad)
            layers = {int(n.split(".")[2]) for n in r["owned"] if n.startswith("model.layers.")}
            assert layers == layers_of_rank(rank, schedule), (where, sorted(layers))


@pytest.mark.golden
def test_pp2_matches_the_one_rank_run(model_dir):
    schedules = ("gpipe", "1f1b", "interleaved_1f1b", "1f1b+packed", "interleaved_1f1b+packed")
    reports = run_gloo_ranks(_parity_job, 2, model_dir, 2, 1, schedules, timeout_s=600)
    # 1F1B / GPipe: rank 0 layers 0-1 + embedding, rank 1 layers 2-3 + norm + head; interleaved: stages (0, 2), (1, 3)
    plain = {0: {0, 1}, 1: {2, 3}}
    inter = {0: {0, 2}, 1: {1, 3}}
    _check(reports, lambda rank, s: inter[rank] if s.startswith("interleaved_1f1b") else plain[rank])
    assert "model.embed_tokens.weight" in reports[0][("1f1b", 0)]["owned"]
    assert "lm_head.weight" in reports[1][("1f1b", 0)]["owned"]


@pytest.mark.golden
@pytest.mark.slow  # 4 forked gloo ranks
def test_pp2_x_tp2_matches_the_one_rank_run(model_dir):
    schedules = ("gpipe", "1f1b", "1f1b+packed", "gpipe+sp", "1f1b+sp", "1f1b+packed+sp", "interleaved_1f1b+sp")
    reports = run_gloo_ranks(_parity_job, 4, model_dir, 2, 2, schedules, timeout_s=600)
    plain, inter = {0: {0, 1}, 1: {2, 3}}, {0: {0, 2}, 1: {1, 3}}
    _check(reports, lambda rank, s: (inter if s.startswith("interleaved") else plain)[rank // 2])
