"""Tensor parallelism of the actor (verl/utils/tensor_parallel.py, verl/utils/vocab_parallel.py): the translated plans,
the pre-flight refusals, and parity on gloo ranks with the one-rank run.

Parity: tiny random models of each supported architecture (Qwen2 with its qkv bias, Qwen3 with q_norm/k_norm and
tied embeddings, Llama; fp32, real configs shrunk), built the worker's way (meta device -> TP -> FSDP2 over the dp
dimension -> shards read from a checkpoint), scored through the actor's chunked head (the vocab-parallel path) and
the dense head; the token log-probs, entropy, loss, every gathered gradient and the clipped global grad norm must
equal an unsplit model in the same rank within 128 fp32 ulps of each tensor's largest value (relative 1.5e-5; the
CPU runs measure below 1e-6).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM  # noqa: F401  (imported before forking)

from tests.helpers.distributed_testing import run_gloo_ranks
from tests.helpers.float_compare import float_close_report
from verl.utils.parallel_check import actor_tp_heads_error
from verl.utils.tensor_parallel import SUPPORTED, plan_error, tp_layout_errors, translate_plan

ULPS = 128
ARCHS = ("qwen2", "qwen3", "llama")


def _config(arch: str):
    """A real architecture's config shrunk: 4 query heads, 2 kv heads, head_dim 16, vocab 128 (130), 2 layers."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[arch]
    cfg = cls(
        vocab_size=130 if arch == "llama" else 128,  # 130: uneven shards of the head under dp2 x tp2 (33 + 32 rows)
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=arch == "qwen3",  # Qwen3-0.6B ties its head to the embeddings
        pad_token_id=0,
        eos_token_id=1,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


@pytest.mark.parametrize("arch", ARCHS)
def test_translated_plan_covers_every_key_of_the_architectures_plan(arch):
    plan = _config(arch).base_model_tp_plan
    styles, allreduce = translate_plan(plan)
    assert set(styles) | set(allreduce) == set(plan)
    assert set(allreduce) == ({"layers.*.self_attn.q_norm", "layers.*.self_attn.k_norm"} if arch == "qwen3" else set())
    assert ("embed_tokens" in styles) == (arch == "qwen3")  # transformers splits a tied embedding


def test_a_style_without_translation_raises():
    with pytest.raises(ValueError, match=r"style 'packed_colwise' of 'layers.\*.mlp.experts.gate_up_proj'"):
        translate_plan({"layers.*.mlp.experts.gate_up_proj": "packed_colwise"})


def test_refusals_name_the_key_and_the_reason():
    key = "actor_rollout_ref.actor.tensor_model_parallel_size"
    assert tp_layout_errors({"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2}, 2) == []
    assert tp_layout_errors({"model_type": "gemma2", "num_attention_heads": 4}, 1) == []  # tp 1: anything goes
    (line,) = tp_layout_errors({"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2}, 4)
    assert line == f"'{key}'=4 must divide the model's num_key_value_heads=2 (heads are split over tp ranks)"
    assert "num_attention_heads=6" in actor_tp_heads_error(6, 6, 4)
    (line,) = tp_layout_errors({"model_type": "gemma2", "num_attention_heads": 8, "num_key_value_heads": 4}, 2)
    assert line.startswith(f"'{key}'=2: architecture 'gemma2' has no tensor-parallel plan (supported: qwen2")
    assert plan_error("mixtral", 2) is not None and plan_error("qwen3", 2) is None
    assert set(SUPPORTED) == set(ARCHS)


# ------------------------------------------------------------------------------ gloo ranks
def _micro(seed: int) -> dict:
    """Left-padded prompts, right-padded responses (as the rollout makes them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (3, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0
    attn[1, -2:] = 0
    ids[attn == 0] = 0
    ids[2, :7] = ids[1, :7]  # rows 1 and 2 share their prompt (the shared-prompt forward runs it once)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, -5:],
        "advantages": torch.randn(3, 5, generator=g),
    }


def _loss(entropy, log_probs, micro):
    mask = micro["attention_mask"][:, -log_probs.shape[1] :].float()
    return -((log_probs * micro["advantages"] + 0.01 * entropy) * mask).sum() / mask.sum()


def _reference(model_dir: str, micros: list, chunk: int, packed: bool, shared: bool):
    """Unsplit model: per micro-batch (log-probs, entropy, loss), the dp-mean gradients and their norm."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from verl.workers.actor.dp_actor import DataParallelPPOActor

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    actor = DataParallelPPOActor(OmegaConf.create({}), model, logprob_chunk_size=chunk)
    actor.use_remove_padding, actor.shared_prompt_forward = packed, shared
    outs = []
    for micro in micros:
        ent, lp = actor._forward_micro_batch(micro, 0.7, calculate_entropy=True)
        loss = _loss(ent, lp, micro)
        (loss / len(micros)).backward()  # FSDP averages over the dp ranks
        outs.append((lp.detach(), ent.detach(), loss.detach()))
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    return outs, grads, norm


def _full_weight_views(model) -> dict:
    """Every rank joins the gathers; each view maps HF names to full tensors."""
    from verl.utils.checkpoint.hf_export import gather_full_state_dict
    from verl.utils.fsdp_gather import iter_full_param_buckets
    from verl.utils.fsdp_utils import iter_full_params

    return {
        "push_packed": {n: t for bucket in iter_full_param_buckets(model, None, 1 << 16) for n, t in bucket},
        "push_each": dict(iter_full_params(model)),
        "hf_export": {n: t for n, t in gather_full_state_dict(model).items()},
    }


PATHS = ((4, False, False), (4, True, False), (4, False, True), (0, False, False))


def _parity_job(rank, world, port, model_dirs, tp):
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.utils.grad_norm import clip_grad_norm_on_device
    from verl.utils.meta_init import empty_model, materialize
    from verl.utils.tensor_parallel import allreduce_replicated_grads, apply_tensor_parallel, build_tp_mesh
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = build_tp_mesh("cpu", world, tp)
    dp, dp_rank = world // tp, mesh["dp"].get_local_rank()
    micros = [_micro(seed) for seed in range(dp)]
    report = {}
    for arch, model_dir in model_dirs.items():
        # the vocab-parallel chunked head (several chunks) on padded rows, packed rows and through the shared-prompt
        # forward, then the gathered dense head; each also with sequence-parallel norms (sp)
        for chunk, packed, shared, sp in [(*c, sp) for sp in (False, True) for c in PATHS]:
            ref_outs, ref_grads, ref_norm = _reference(model_dir, micros, chunk, packed, shared)
            model = empty_model(AutoConfig.from_pretrained(model_dir), torch.float32, "sdpa")
            model = apply_tensor_parallel(model, mesh["tp"], sequence_parallel=sp)
            model = materialize(apply_fsdp2(model, mesh["dp"]), model_dir, "cpu")
            actor = DataParallelPPOActor(OmegaConf.create({}), model, logprob_chunk_size=chunk)
            actor.use_remove_padding = packed  # the packed forward (flash-attn's path on GPU) runs on sdpa too
            actor.shared_prompt_forward = shared
            micro = micros[dp_rank]  # the ranks of a tp group score the same rows
            model.train()
            widths = []  # the residual stream's length out of each decoder layer (sp: 1/tp of it, rounded up)
            hooks = [
                layer.register_forward_hook(lambda m, a, out: widths.append(out.size(1)))
                for layer in model.model.layers
            ]
            ent, lp = actor._forward_micro_batch(micro, 0.7, calculate_entropy=True)
            loss = _loss(ent, lp, micro)
            loss.backward()
            for hook in hooks:
                hook.remove()
            allreduce_replicated_grads(model)
            grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            norm = clip_grad_norm_on_device(model.parameters(), 1e9, "cpu")
            valid = micro["attention_mask"][:, -5:].bool()
            ref_lp, ref_ent, ref_loss = ref_outs[dp_rank]
            checks = {
                "log_probs": (lp.detach()[valid], ref_lp[valid]),
                "entropy": (ent.detach()[valid], ref_ent[valid]),
                "loss": (loss.detach(), ref_loss),
                "grad_norm": (norm, ref_norm),
            }
            checks.update({f"grad {n}": (grads[n], ref_grads[n]) for n in ref_grads if n in grads})
            problems = {k: float_close_report(a, e, ULPS) for k, (a, e) in checks.items()}
            if (
                chunk == 0 and not sp
            ):  # the weights as the rollout push (packed buckets and one by one) and the HF export see them
                full = _full_weight_views(model)
                plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
                expected, required = plain.state_dict(), {n for n, _ in plain.named_parameters()}
                for view, tensors in full.items():
                    for n, t in tensors.items():
                        problems[f"{view} {n}"] = "" if torch.equal(t, expected[n]) else "differs"
                    complete = required <= set(tensors) <= set(expected) or (view == "hf_export" and rank > 0)
                    problems[f"{view} names"] = "" if complete else f"names {sorted(tensors)}"
            report[(arch, chunk, packed, shared, sp)] = {
                "problems": {k: v for k, v in problems.items() if v},
                "missing": sorted(set(ref_grads) - set(grads)),
                "chunked": actor.logprob_chunk_size,
                "widths": widths,
            }
    dist.destroy_process_group()
    return report


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    dirs = {}
    for arch in ARCHS:
        torch.manual_seed(0)
        path = tmp_path_factory.mktemp(arch)
        AutoModelForCausalLM.from_config(_config(arch)).float().save_pretrained(path)
        dirs[arch] = str(path)
    return dirs


@pytest.mark.parametrize(
    "world,tp",
    [pytest.param(2, 2, marks=pytest.mark.slow), pytest.param(4, 2, marks=pytest.mark.slow)],
    ids=["tp2", "dp2xtp2"],
)  # slow: forked gloo ranks (the quick loop keeps the one-process plan and refusal tests)
def test_tp_matches_the_one_rank_run(model_dirs, world, tp):
    reports = run_gloo_ranks(_parity_job, world, model_dirs, tp, timeout_s=600)
    for rank, report in enumerate(reports):
        for (arch, chunk, packed, shared, sp), r in report.items():
            assert r["missing"] == [], (rank, arch, r["missing"])
            assert r["problems"] == {}, (rank, arch, chunk, packed, shared, sp, r["problems"])
            assert r["chunked"] == chunk
            plain = report[(arch, chunk, packed, shared, False)]["widths"]
            assert r["widths"] == ([-(-w // tp) for w in plain] if sp else plain) and plain, (arch, chunk, sp)
