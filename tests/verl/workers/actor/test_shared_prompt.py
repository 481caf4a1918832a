"""Shared-prompt forward: one prompt pass per group gives the padded forward's logits and gradients."""

import torch

from tests.helpers.distributed_testing import run_gloo_ranks
from verl.workers.actor.shared_prompt import group_rows_by_prompt, shared_prompt_logits
from luffy_pool.config.compose import actor_config


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def grouped_batch(build, vocab, groups=3, n=4, prompt=10, resp=7, seed=0):
    """``groups`` x ``n`` rows (``build``: the ``grouped_prompt_batch`` fixture); each group repeats one prompt
    with 2 * (group index) pad tokens, response j of a group has 2 + j tokens."""
    return build(vocab, groups, n, prompt, resp, lambda j: 2 + j, seed)


def _response_logp(logits, ids, resp):
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -resp:, None]).squeeze(-1)


def test_group_rows_by_prompt_hand_case():
    ids = torch.tensor([[0, 5, 6, 9], [7, 5, 6, 1], [0, 5, 6, 2], [7, 5, 6, 3]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]])
    first, inverse = group_rows_by_prompt(ids, mask, prompt_width=3)
    assert inverse[0] == inverse[2] != inverse[1] == inverse[3]
    assert sorted(first.tolist()) == [0, 1]
    # Same ids, different padding: different prompts.
    mask2 = mask.clone()
    mask2[2, 0] = 1
    assert int(group_rows_by_prompt(ids, mask2, 3)[1].max()) + 1 == 3


def test_logits_and_gradients_equal_the_padded_forward(tiny_model_dir, grouped_prompt_batch):
    model = _model(tiny_model_dir)
    ids, mask, pos = grouped_batch(grouped_prompt_batch, model.config.vocab_size)
    resp = 7
    valid = mask[:, -resp:].bool()
    padded = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -resp - 1 : -1]
    (_response_logp(padded, ids, resp) * valid).sum().backward()
    ref_grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    shared = shared_prompt_logits(model, ids, mask, pos, resp)
    assert shared.shape == padded.shape
    assert torch.allclose(shared[valid], padded[valid], atol=1e-5)
    (_response_logp(shared, ids, resp) * valid).sum().backward()
    for k, p in model.named_parameters():
        assert torch.allclose(p.grad, ref_grads[k], atol=1e-5, rtol=1e-4), k


def test_no_repeated_prompt_means_no_shared_pass(tiny_model_dir, grouped_prompt_batch):
    model = _model(tiny_model_dir)
    ids, mask, pos = grouped_batch(grouped_prompt_batch, model.config.vocab_size, groups=3, n=1)
    assert shared_prompt_logits(model, ids, mask, pos, 7) is None


def test_dp_actor_log_probs_with_shared_prompts_match_direct_forward(tiny_model_dir, grouped_prompt_batch):
    from verl.protocol import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    model = _model(tiny_model_dir)
    ids, mask, pos = grouped_batch(grouped_prompt_batch, model.config.vocab_size)
    b = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, -7:]}
    cfg = actor_config(ppo_mini_batch_size=12, ppo_micro_batch_size=12, use_dynamic_bsz=False)
    actor = DataParallelPPOActor(cfg, model, shared_prompt_forward=True)
    data = DataProto.from_dict(
        tensors=b, meta_info={"temperature": 0.7, "micro_batch_size": 8, "use_dynamic_bsz": False, "max_token_len": 64}
    )
    lp, _ = actor.compute_log_prob(data)
    with torch.no_grad():
        direct = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -8:-1] / 0.7
    valid = mask[:, -7:].bool()
    assert torch.allclose(lp[valid], _response_logp(direct, ids, 7)[valid], atol=1e-5)


def test_gradient_checkpointing_update_equals_plain_forward(tiny_model_dir, grouped_prompt_batch):
    """With activation checkpointing on (the full config's default) the shared-prompt actor's update runs
    (transformers drops the cache there, so the training forward is the padded one) and gives the gradients of
    a model without checkpointing; the no-grad log-prob pass still shares the prompt."""
    from verl.protocol import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.actor.shared_prompt import checkpointing_drops_cache

    ids, mask, pos = grouped_batch(grouped_prompt_batch, _model(tiny_model_dir).config.vocab_size)
    cfg = actor_config(
        ppo_mini_batch_size=12,
        ppo_micro_batch_size=6,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=64,
        ppo_epochs=1,
        clip_ratio=0.2,
        entropy_coeff=0.01,
        grad_clip=1e9,
        use_kl_loss=False,
    )
    data = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": pos,
            "responses": ids[:, -7:],
            "advantages": torch.linspace(-1, 1, 12)[:, None].expand(12, 7).contiguous(),
            "old_log_probs": torch.zeros(12, 7),
        },
        meta_info={"temperature": 1.0},
    )
    grads = []
    for checkpointing in (True, False):
        model = _model(tiny_model_dir)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        actor = DataParallelPPOActor(cfg, model, opt, shared_prompt_forward=True)
        model.train()
        assert checkpointing_drops_cache(model) is checkpointing
        captured = {}
        orig_step = opt.step
        opt.step = lambda: captured.update({k: p.grad.clone() for k, p in model.named_parameters()}) or orig_step()
        metrics = actor.update_policy(data)
        assert all(torch.isfinite(torch.tensor(v)).all() for v in metrics["actor/pg_loss"])
        grads.append(captured)
        if checkpointing:  # the eval-mode log-prob pass keeps the shared prompt
            model.eval()
            assert not checkpointing_drops_cache(model)
            assert shared_prompt_logits(model, ids, mask, pos, 7) is not None
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-5, rtol=1e-4), k


def _fsdp_rank(rank, world, port, model_dir, build):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from verl.utils.fsdp_utils import apply_fsdp2

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = _model(model_dir)
        ids, mask, pos = grouped_batch(build, model.config.vocab_size, groups=2, n=4)
        rows = slice(rank * 4, rank * 4 + 4)  # one whole group per rank
        apply_fsdp2(model, init_device_mesh("cpu", (world,)))
        grads = []
        for shared in (False, True):
            for _ in range(2):  # a second step must not see state left behind by the two-call forward
                model.zero_grad()
                if shared:
                    logits = shared_prompt_logits(model, ids[rows], mask[rows], pos[rows], 7)
                else:
                    logits = model(
                        input_ids=ids[rows], attention_mask=mask[rows], position_ids=pos[rows], use_cache=False
                    ).logits[:, -8:-1]
                valid = mask[rows, -7:].bool()
                (_response_logp(logits, ids[rows], 7) * valid).sum().backward()
            grads.append({k: p.grad.full_tensor().clone() for k, p in model.named_parameters()})
        return max(float((grads[0][k] - grads[1][k]).abs().max()) for k in grads[0])
    finally:
        dist.destroy_process_group()


def test_two_call_forward_under_fsdp2_gives_the_padded_gradients(tiny_model_dir, grouped_prompt_batch):
    """FSDP2 sees two forwards of the root before one backward; the reduced gradients must not change."""
    diffs = dict(enumerate(run_gloo_ranks(_fsdp_rank, 2, tiny_model_dir, grouped_prompt_batch, timeout_s=240)))
    assert max(diffs.values()) < 1e-5, diffs


def test_a_log_prob_pass_can_ask_for_the_plain_forward(tiny_model_dir, grouped_prompt_batch, monkeypatch):
    """``meta_info["shared_prompt_forward"]=False`` (ExGRPO's trajectory candidates, whose prompts repeat on some ranks
    only): no shared pass for that call, the same log-probs, and the actor's setting back afterwards."""
    import verl.workers.actor.dp_actor as dp_actor
    from verl.protocol import DataProto

    model = _model(tiny_model_dir)
    ids, mask, pos = grouped_batch(grouped_prompt_batch, model.config.vocab_size)
    b = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, -7:]}
    actor = dp_actor.DataParallelPPOActor(
        actor_config(ppo_mini_batch_size=12, ppo_micro_batch_size=12, use_dynamic_bsz=False),
        model,
        shared_prompt_forward=True,
    )
    meta = {"temperature": 0.7, "micro_batch_size": 12, "use_dynamic_bsz": False, "max_token_len": 64}
    shared, _ = actor.compute_log_prob(DataProto.from_dict(tensors=b, meta_info=dict(meta)))

    def refuse(*args, **kwargs):
        raise AssertionError("the shared-prompt forward ran")

    monkeypatch.setattr(dp_actor, "shared_prompt_logits", refuse)
    plain, _ = actor.compute_log_prob(
        DataProto.from_dict(tensors=b, meta_info={**meta, "shared_prompt_forward": False})
    )
    assert actor.shared_prompt_forward is True
    valid = mask[:, -7:].bool()
    assert torch.allclose(plain[valid], shared[valid], atol=1e-5)
