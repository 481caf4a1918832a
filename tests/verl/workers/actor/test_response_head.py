"""Scoring only the response tokens (chunked LM head) gives the dense path's log-probs, entropy and
gradients in the actor's three forwards (padded, packed, shared prompt), fp32 and bf16, also under FSDP2."""

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers.distributed_testing import run_gloo_ranks
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.actor.response_head import response_logprobs, scoring_head, supports_scoring_head


def _model(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")


def _batch(build, vocab, groups=3, n=3, prompt=9, resp=7, seed=0):
    """Groups of rows sharing a left-padded prompt (``build``: the ``grouped_prompt_batch`` fixture); response j
    of a group has 1 + 2 j tokens, the last row's none."""
    ids, mask, _ = build(vocab, groups, n, prompt, resp, lambda j: 1 + 2 * j, seed)
    mask[-1, prompt:] = 0  # an empty response
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, prompt:]}


def _actor(model, chunk, packed=False, shared=False):
    actor = DataParallelPPOActor(OmegaConf.create({}), model, shared_prompt_forward=shared, logprob_chunk_size=chunk)
    actor.use_remove_padding = packed  # sdpa turns packing off; force it to pin the packed path's numerics
    return actor


def _forward_and_grads(model, actor, b, temperature):
    model.zero_grad()
    ent, lp = actor._forward_micro_batch(b, temperature, calculate_entropy=True)
    mask = b["attention_mask"][:, -b["responses"].size(1) :].bool()
    g = torch.Generator().manual_seed(3)
    weights = torch.randn(lp.shape, generator=g)
    ((lp * weights)[mask].sum() + (ent * weights.flip(0))[mask].sum()).backward()
    return lp.detach(), ent.detach(), mask, {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("packed,shared", [(False, False), (True, False), (False, True)])
def test_values_and_gradients_equal_the_dense_path_fp32(tiny_model_dir, grouped_prompt_batch, packed, shared):
    model = _model(tiny_model_dir)
    b = _batch(grouped_prompt_batch, model.config.vocab_size)
    lp, ent, mask, grads = _forward_and_grads(model, _actor(model, 5, packed, shared), b, 0.7)
    lp_d, ent_d, _, grads_d = _forward_and_grads(model, _actor(model, 0, packed, shared), b, 0.7)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == lp_d.shape
    assert torch.allclose(lp[mask], lp_d[mask], atol=1e-5)
    assert torch.allclose(ent[mask], ent_d[mask], atol=1e-5)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    for k in grads:
        assert torch.allclose(grads[k], grads_d[k], atol=1e-5, rtol=1e-4), k


def test_values_and_gradients_match_the_dense_path_bf16(tiny_model_dir, grouped_prompt_batch):
    model = _model(tiny_model_dir, torch.bfloat16)
    b = _batch(grouped_prompt_batch, model.config.vocab_size)
    lp, ent, mask, grads = _forward_and_grads(model, _actor(model, 4), b, 1.0)
    lp_d, ent_d, _, grads_d = _forward_and_grads(model, _actor(model, 0), b, 1.0)
    # Same bf16 forward and fp32 softmax: the values agree to fp32 rounding of the reductions.
    assert torch.allclose(lp[mask], lp_d[mask], atol=1e-4) and torch.allclose(ent[mask], ent_d[mask], atol=1e-4)
    for k in grads:  # bf16 gradients: the head's dW is summed over chunks in fp32, the dense one in one matmul
        scale = grads_d[k].float().abs().max() + 1e-6
        assert (grads[k].float() - grads_d[k].float()).abs().max() <= 2e-2 * scale, k


def test_compute_log_prob_uses_the_head_only_above_one_chunk(tiny_model_dir, grouped_prompt_batch, monkeypatch):
    """Micro-batches whose full logits fit in one chunk keep the dense path; larger ones never build them."""
    from verl.protocol import DataProto
    from verl.workers.actor import dp_actor

    model = _model(tiny_model_dir)
    b = _batch(grouped_prompt_batch, model.config.vocab_size)
    calls = []
    real = dp_actor.response_logprobs
    monkeypatch.setattr(dp_actor, "response_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    data = DataProto.from_dict(
        tensors=b, meta_info={"temperature": 1.0, "micro_batch_size": 3, "use_dynamic_bsz": False}
    )
    width = b["input_ids"].shape[1]
    lp_dense, _ = _actor(model, 3 * width).compute_log_prob(data)
    assert calls == []
    lp, _ = _actor(model, 3 * width - 1).compute_log_prob(data)
    assert len(calls) == 3
    mask = b["attention_mask"][:, -7:].bool()
    assert torch.allclose(lp[mask], lp_dense[mask], atol=1e-5)


def test_head_is_restored_and_unsupported_heads_stay_dense(tiny_model_dir, grouped_prompt_batch):
    model = _model(tiny_model_dir)
    b = _batch(grouped_prompt_batch, model.config.vocab_size)
    with pytest.raises(RuntimeError, match="boom"):
        with scoring_head(
            model,
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long),
            temperature=1.0,
            chunk_size=4,
            with_entropy=False,
        ):
            assert "forward" in model.lm_head.__dict__
            raise RuntimeError("boom")
    assert "forward" not in model.lm_head.__dict__
    assert model(input_ids=b["input_ids"][:1]).logits.shape[-1] == model.config.vocab_size
    assert supports_scoring_head(model)
    model.config.final_logit_softcapping = 30.0  # a head followed by a transformation: dense path
    assert not supports_scoring_head(model) and _actor(model, 8).logprob_chunk_size == 0


def test_packed_path_rejects_a_response_after_padding(tiny_model_dir, grouped_prompt_batch):
    model = _model(tiny_model_dir)
    b = _batch(grouped_prompt_batch, model.config.vocab_size, groups=1, n=2)
    b["attention_mask"][0, :9] = 0  # prompt entirely padding
    with pytest.raises(ValueError, match="follows a padding position"):
        response_logprobs(
            model,
            b["input_ids"],
            b["attention_mask"],
            b["position_ids"],
            b["responses"],
            temperature=1.0,
            chunk_size=4,
            with_entropy=False,
            packed=True,
        )


def _fsdp_rank(rank, world, port, model_dir, build):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from verl.utils.fsdp_utils import apply_fsdp2

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = _model(model_dir)
        b = _batch(build, model.config.vocab_size, groups=2, n=3)
        b = {k: v[rank * 3 : rank * 3 + 3] for k, v in b.items()}
        apply_fsdp2(model, init_device_mesh("cpu", (world,)))
        grads = []
        for chunk, shared in ((0, False), (4, False), (4, True)):
            for _ in range(2):  # a second step must see no state left behind by the swapped head
                model.zero_grad()
                actor = _actor(model, chunk, shared=shared)
                ent, lp = actor._forward_micro_batch(b, 1.0, calculate_entropy=True)
                mask = b["attention_mask"][:, -7:].bool()
                (lp[mask].sum() + 0.1 * ent[mask].sum()).backward()
            grads.append({k: p.grad.full_tensor().clone() for k, p in model.named_parameters()})
        return max(float((g[k] - grads[0][k]).abs().max()) for g in grads[1:] for k in g)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_gradients_equal_the_dense_path(tiny_model_dir, grouped_prompt_batch):
    """The head's weight is an FSDP2 root parameter: it must be gathered for the swapped head and its
    gradient reduced exactly as for the dense head."""
    diffs = dict(enumerate(run_gloo_ranks(_fsdp_rank, 2, tiny_model_dir, grouped_prompt_batch, timeout_s=240)))
    assert max(diffs.values()) < 1e-5, diffs
