"""Ulysses sequence parallelism: SP=2/4 gives the same log-probs, entropy, loss and gradients as SP=1 (Qwen2, GQA).

Forked gloo ranks; the reference is a plain (SP=1) forward of the same model in the same process.
"""

import pytest
import torch
from transformers import Qwen2ForCausalLM  # noqa: F401  (imported once, before forking)

from verl.utils.parallel_check import check_heads
from verl.utils.ulysses import pad_to_multiple
from tests.helpers.distributed_testing import run_gloo_ranks
from luffy_pool.config.compose import actor_config

JOB_TIMEOUT_S = 300
TOL = 1e-5


def test_heads_must_split_over_the_sp_ranks():
    check_heads(28, 4, 4)  # Qwen2.5-7B at SP=4: kv heads split
    check_heads(28, 4, 2)
    check_heads(16, 2, 8)  # fewer kv heads than ranks: each repeated 4x
    with pytest.raises(ValueError, match=r"ulysses_sequence_parallel_size'=8 must divide .*num_attention_heads=28"):
        check_heads(28, 4, 8)
    with pytest.raises(ValueError, match="num_key_value_heads=3: one must divide the other"):
        check_heads(12, 3, 2)


def test_pad_to_multiple_right_pads_along_the_sequence():
    x = torch.arange(6).view(2, 3)
    assert torch.equal(pad_to_multiple(x, 2, dim=1), torch.tensor([[0, 1, 2, 0], [3, 4, 5, 0]]))
    assert pad_to_multiple(x, 3, dim=1) is x


def _tiny_model(kv_heads: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=False,
        eos_token_id=1,
        pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg).float()


def test_installed_wrapper_is_a_pass_through_outside_a_ulysses_forward():
    from verl.workers.actor.ulysses_forward import install_ulysses_attention

    model = _tiny_model(2)
    ids = torch.randint(3, 64, (2, 9))
    before = model(input_ids=ids).logits
    install_ulysses_attention()
    install_ulysses_attention()  # idempotent
    assert torch.equal(model(input_ids=ids).logits, before)


def test_eager_attention_is_rejected_with_the_key_to_change():
    from verl.workers.actor.ulysses_forward import check_model

    model = _tiny_model(2)
    model.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="needs sdpa or flash attention .*attn_implementation"):
        check_model(model, 2)


# ------------------------------------------------------------------------------ gloo ranks
def _run_ranks(fn, world: int, *args) -> list:
    return run_gloo_ranks(fn, world, *args, timeout_s=JOB_TIMEOUT_S)


def _micro(seed: int, rows: int = 4, width: int = 13, response: int = 6) -> dict:
    """Left-padded prompts and right-padded responses; 13 positions do not divide by 2 or 4 (padding path)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (rows, width), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0
    attn[1, :1] = 0
    attn[2, -2:] = 0
    ids[attn == 0] = 0
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, -response:],
        "advantages": torch.randn(rows, response, generator=g),
        "old_log_probs": -torch.rand(rows, response, generator=g) - 2.0,
    }


def _loss(entropy, log_probs, micro):
    mask = micro["attention_mask"][:, -log_probs.shape[1] :].float()
    return -((log_probs * micro["advantages"] + 0.01 * entropy) * mask).sum() / mask.sum()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _forward_job(rank, world, port, sp):
    """Every SP group of ``sp`` ranks: padded and packed forwards + grads vs the plain forward."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from verl.protocol import DataProto
    from verl.utils.fsdp_mesh import build_ulysses_mesh
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.actor.ulysses_forward import ulysses_response_log_probs

    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = build_ulysses_mesh("cpu", world, sp).get_group("sp")
    result = {}
    for kv in (2, 1):  # GQA with kv heads == or < sp (repeated)
        micro = _micro(seed=rank // sp)  # the same rows on every rank of an SP group
        model = _tiny_model(kv)
        plain = DataParallelPPOActor(OmegaConf.create({}), model)
        ent_ref, lp_ref = plain._forward_micro_batch(micro, 0.7, calculate_entropy=True)
        _loss(ent_ref, lp_ref, micro).backward()
        grads_ref = _grads(model)
        for packed in (False, True):
            model.zero_grad()
            ent, lp = ulysses_response_log_probs(model, micro, 0.7, True, group, packed=packed)
            loss = _loss(ent, lp, micro)
            loss.backward()
            grads = _grads(model)
            for g in grads.values():  # what FSDP's average does within a group: sum over SP ranks / sp
                dist.all_reduce(g, group=group)
                g /= sp
            valid = micro["attention_mask"][:, -lp.shape[1] :].bool()
            result[(kv, packed)] = {
                "lp": (lp - lp_ref)[valid].abs().max().item(),
                "ent": (ent - ent_ref)[valid].abs().max().item(),
                "loss": abs(loss.item() - _loss(ent_ref, lp_ref, micro).item()),
                "grad": max((grads[n] - grads_ref[n]).abs().max().item() for n in grads),
                "grad_scale": max(g.abs().max().item() for g in grads_ref.values()),
            }
        # the actor's own switch: same result through _forward_micro_batch with the group
        sp_actor = DataParallelPPOActor(OmegaConf.create({}), model, ulysses_group=group)
        with torch.no_grad():
            _, lp_actor = sp_actor._forward_micro_batch(micro, 0.7, calculate_entropy=False)
        result[(kv, "actor")] = (lp_actor - lp_ref.detach())[micro["attention_mask"][:, -6:].bool()].abs().max().item()
        # dynamic batch: the per-rank token budget covers sp times the tokens (each rank holds 1/sp of them)
        data = DataProto.from_dict(tensors=micro)
        result["micro_counts"] = [
            len(a._micro_batches(data, ["attention_mask"], 1, True, 13)[0]) for a in (plain, sp_actor)
        ]
    dist.destroy_process_group()
    return result


def _checkpointing_job(rank, world, port, sp):
    """SP=``sp`` with gradient checkpointing (non-reentrant, as the worker enables it) vs SP=1 without it:
    padded and packed rows, dense and chunked LM head. The recomputation in backward must redo the
    all-to-alls and the chunked head must score only the response positions (docs/DESIGN.md §2 items 5-6)."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from verl.utils.fsdp_mesh import build_ulysses_mesh
    from verl.workers.actor import response_head as chunked_logprobs  # the name the scoring head calls
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.actor.ulysses_forward import ulysses_response_log_probs

    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = build_ulysses_mesh("cpu", world, sp).get_group("sp")
    micro = _micro(seed=rank // sp)
    model = _tiny_model(2)
    plain = DataParallelPPOActor(OmegaConf.create({}), model, logprob_chunk_size=0)
    ent_ref, lp_ref = plain._forward_micro_batch(micro, 0.7, calculate_entropy=True)
    loss_ref = _loss(ent_ref, lp_ref, micro)
    loss_ref.backward()
    grads_ref = _grads(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    result = {"checkpointing": bool(model.is_gradient_checkpointing and model.training)}
    for packed in (False, True):
        for chunk in (0, 5):  # 5 tokens per chunk: several chunks per rank, and uneven ones
            model.zero_grad()
            ent, lp = ulysses_response_log_probs(model, micro, 0.7, True, group, packed=packed, chunk_size=chunk)
            loss = _loss(ent, lp, micro)
            loss.backward()
            grads = _grads(model)
            for g in grads.values():
                dist.all_reduce(g, group=group)
                g /= sp
            valid = micro["attention_mask"][:, -lp.shape[1] :].bool()
            result[(packed, chunk)] = {
                "lp": (lp - lp_ref)[valid].abs().max().item(),
                "ent": (ent - ent_ref)[valid].abs().max().item(),
                "loss": abs(loss.item() - loss_ref.item()),
                "grad": max((grads[n] - grads_ref[n]).abs().max().item() for n in grads),
                "grad_scale": max(g.abs().max().item() for g in grads_ref.values()),
            }
    # through the actor: a micro-batch larger than logprob_chunk_size takes the chunked head under SP too
    sp_actor = DataParallelPPOActor(OmegaConf.create({}), model, ulysses_group=group, logprob_chunk_size=4)
    calls = []
    chunked = chunked_logprobs.chunked_logprobs_entropy
    chunked_logprobs.chunked_logprobs_entropy = lambda *a, **k: calls.append(1) or chunked(*a, **k)
    try:
        _, lp_actor = sp_actor._forward_micro_batch(micro, 0.7, calculate_entropy=False)
    finally:
        chunked_logprobs.chunked_logprobs_entropy = chunked
    valid = micro["attention_mask"][:, -lp_actor.shape[1] :].bool()
    result["actor_chunked"] = (len(calls), (lp_actor - lp_ref).detach()[valid].abs().max().item())
    dist.destroy_process_group()
    return result


def _update_job(rank, world, port, sp, checkpointing=False):
    """FSDP2 over all ranks, SP groups of ``sp``, one update_policy; vs one plain process updating on the union
    (``checkpointing``: the SP model recomputes its layers in backward, the reference does not)."""
    import torch.distributed as dist

    from verl.protocol import DataProto
    from verl.utils import fsdp_utils
    from verl.utils.fsdp_mesh import build_fsdp_mesh, build_ulysses_mesh
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = build_ulysses_mesh("cpu", world, sp).get_group("sp")
    dp = world // sp

    def data(seeds):
        parts = [_micro(seed=s) for s in seeds]
        tensors = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})

    def cfg(mini, micro):
        return actor_config(
            ppo_mini_batch_size=mini,
            ppo_micro_batch_size=micro,
            use_dynamic_bsz=False,
            ppo_max_token_len_per_gpu=64,
            ppo_epochs=1,
            clip_ratio=0.2,
            entropy_coeff=0.01,
            grad_clip=100.0,
            use_kl_loss=False,
        )

    model = _tiny_model(1)
    if checkpointing:  # before sharding, as the worker does
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = fsdp_utils.apply_fsdp2(
        model, build_fsdp_mesh("cpu", world, -1), fsdp_utils.mixed_precision_policy(device="cpu")
    )
    # SGD: the weight change is the gradient itself (AdamW would amplify float noise on near-zero grads).
    # dp_group = all ranks, as the worker passes it: the step's metrics are reduced over every rank's rows
    actor = DataParallelPPOActor(
        cfg(4, 4), model, torch.optim.SGD(model.parameters(), lr=0.5), ulysses_group=group, dp_group=dist.group.WORLD
    )
    metrics = actor.update_policy(data([rank // sp]))
    full = dict(fsdp_utils.iter_full_params(model))

    reference = _tiny_model(1)
    ref_actor = DataParallelPPOActor(cfg(4 * dp, 4), reference, torch.optim.SGD(reference.parameters(), lr=0.5))
    ref_metrics = ref_actor.update_policy(data(range(dp)))
    ref = reference.state_dict()
    result = {
        "weights": max((full[n] - ref[n]).abs().max().item() for n in full),
        "moved": max((ref[n] - _tiny_model(1).state_dict()[n]).abs().max().item() for n in ref),
        "pg_loss": metrics["actor/pg_loss"],
        "ref_pg_loss": ref_metrics["actor/pg_loss"],
        "entropy": metrics["actor/entropy_loss"],
        "ref_entropy": ref_metrics["actor/entropy_loss"],
        "grad_norm": metrics["actor/grad_norm"][0],
        "ref_grad_norm": ref_metrics["actor/grad_norm"][0],
    }
    dist.destroy_process_group()
    return result


def _update_checkpointing_job(rank, world, port, sp):
    return _update_job(rank, world, port, sp, checkpointing=True)


def _data_job(rank, world, port, sp):
    """The worker's data plan: an SP group computes on the union of its ranks' chunks, each rank returns its own."""
    import torch.distributed as dist

    from verl.protocol import DataProto
    from verl.utils.fsdp_mesh import build_ulysses_mesh
    from verl.utils.ulysses import gather_data_in_group, local_rows

    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = build_ulysses_mesh("cpu", world, sp).get_group("sp")
    chunk = DataProto.from_dict(tensors={"x": torch.arange(3) + 10 * rank}, meta_info={"rank": rank})
    rows = gather_data_in_group(chunk, group)
    out = DataProto.from_dict(tensors={"y": rows.batch["x"] * 2})
    result = {"rows": rows.batch["x"], "meta": rows.meta_info, "back": local_rows(out, group).batch["y"]}
    dist.destroy_process_group()
    return result


@pytest.fixture(scope="module")
def runs():
    jobs = {
        "fwd2": (_forward_job, 2, 2),
        "fwd4": (_forward_job, 4, 4),
        "upd2": (_update_job, 2, 2),
        "upd4": (_update_job, 4, 2),
        "data4": (_data_job, 4, 2),
        "ckpt2": (_checkpointing_job, 2, 2),
        "ckpt4": (_checkpointing_job, 4, 2),
        "upd4ckpt": (_update_checkpointing_job, 4, 2),
    }  # name: (job, world, sp)
    return {
        f"{name}_rank{r}": result
        for name, (job, world, sp) in jobs.items()
        for r, result in enumerate(_run_ranks(job, world, sp))
    }


@pytest.mark.slow  # forked gloo ranks
@pytest.mark.parametrize("world", [2, 4])
def test_sp_log_probs_entropy_loss_and_grads_equal_sp1(runs, world):
    """SP=2 on 2 ranks, SP=4 on 4 ranks (kv heads 2 and 1: split, and repeated); padded and packed rows."""
    for rank in range(world):
        result = runs[f"fwd{world}_rank{rank}"]
        for kv in (2, 1):
            for packed in (False, True):
                r = result[(kv, packed)]
                assert r["grad_scale"] > 1e-3  # the gradients compared are not vanishing
                assert r["lp"] < TOL and r["ent"] < TOL and r["loss"] < TOL and r["grad"] < TOL, (world, kv, packed, r)
            assert result[(kv, "actor")] < TOL
        # 4 rows of 10-13 valid tokens: a 13-token budget fits one row per rank at SP=1, 2 (SP=2) or 4 (SP=4)
        plain_count, sp_count = result["micro_counts"]
        assert plain_count == 4 and sp_count == 4 // world, result["micro_counts"]


@pytest.mark.slow  # forked gloo ranks
@pytest.mark.parametrize("world", [2, 4])
def test_sp2_with_gradient_checkpointing_equals_sp1_without(runs, world):
    """world 2: one SP=2 group; world 4: two SP=2 groups on different rows. Padded and packed rows, dense
    and chunked head: loss, log-probs, entropy and gradients within 1e-5 of the plain forward's."""
    for rank in range(world):
        result = runs[f"ckpt{world}_rank{rank}"]
        assert result["checkpointing"]
        for packed in (False, True):
            for chunk in (0, 5):
                r = result[(packed, chunk)]
                assert r["grad_scale"] > 1e-3
                assert r["lp"] < TOL and r["ent"] < TOL and r["loss"] < TOL and r["grad"] < TOL, (
                    world,
                    packed,
                    chunk,
                    r,
                )
        calls, diff = result["actor_chunked"]
        assert calls == 1 and diff < TOL, result["actor_chunked"]


@pytest.mark.slow  # forked gloo ranks
@pytest.mark.parametrize("name,world", [("upd2", 2), ("upd4", 4), ("upd4ckpt", 4)])
def test_sp2_fsdp_update_equals_a_plain_data_parallel_update(runs, name, world):
    """world 2: SP=2, dp=1; world 4: SP=2, dp=2 (SP groups share rows, dp groups differ); upd4ckpt: the
    FSDP2 SP model with gradient checkpointing, as train_16k.sh runs it."""
    for rank in range(world):
        r = runs[f"{name}_rank{rank}"]
        assert r["moved"] > 1e-3
        assert r["weights"] < TOL, r
        # the loss the optimizer saw (mean over the ranks, as FSDP averages their gradients) and the token-mean
        # entropy over all ranks' rows equal the single process's on the union of the rows
        assert r["pg_loss"] == pytest.approx(r["ref_pg_loss"], abs=TOL)
        assert r["entropy"] == pytest.approx(r["ref_entropy"], abs=TOL)
        assert r["grad_norm"] == pytest.approx(r["ref_grad_norm"], abs=TOL)


@pytest.mark.slow  # forked gloo ranks
def test_sp_group_ranks_compute_on_the_same_rows_and_return_their_own_chunk(runs):
    """4 ranks, SP=2: groups {0, 1} and {2, 3}; dp = world / sp = 2 data-parallel row sets."""
    for rank in range(4):
        r = runs[f"data4_rank{rank}"]
        first = 10 * (rank - rank % 2)
        assert r["rows"].tolist() == [first, first + 1, first + 2, first + 10, first + 11, first + 12]
        assert r["meta"] == {"rank": rank}
        assert r["back"].tolist() == [2 * (10 * rank + i) for i in range(3)]
