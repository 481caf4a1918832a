"""The data-parallel actor on a plain (unsharded) tiny model: log-probs, packing, update semantics."""

import pytest
import torch
from luffy_pool.config.compose import actor_config

from verl.protocol import DataProto
from verl.workers.actor.dp_actor import DataParallelPPOActor, NonFiniteLossError

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden


def _model(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _batch(vocab, rows=4, prompt=5, resp=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (rows, prompt + resp), generator=g)
    attn = torch.ones(rows, prompt + resp, dtype=torch.long)
    attn[0, :2] = 0  # left padding
    attn[1, -2:] = 0  # response ends early
    attn[3, 0] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attn, "position_ids": pos, "responses": input_ids[:, prompt:]}


def _cfg(**kw):
    base = dict(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size=2,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=64,
        ppo_epochs=1,
        clip_ratio=0.2,
        clip_upper_bound=1.0,
        entropy_coeff=0.0,
        grad_clip=1e9,
        loss_remove_token_mean=False,
        loss_remove_clip=True,
        use_kl_loss=False,
    )
    base.update(kw)
    return actor_config(**base)  # every other key at its YAML default


def _direct_log_probs(model, b):
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    L = b["responses"].size(1)
    return torch.log_softmax(out[:, -L - 1 : -1].float(), -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("remove_padding,dynamic", [(False, False), (True, False), (False, True), (True, True)])
def test_log_probs_match_direct_forward(tiny_model_dir, remove_padding, dynamic):
    model = _model(tiny_model_dir)
    b = _batch(model.config.vocab_size)
    actor = DataParallelPPOActor(_cfg(), model, use_remove_padding=remove_padding)
    assert not actor.use_remove_padding, "sdpa has no varlen kernel: packing is turned off"
    actor.use_remove_padding = remove_padding  # force the packed path to pin its numerics anyway
    data = DataProto.from_dict(
        tensors=b,
        meta_info={"temperature": 1.0, "micro_batch_size": 3, "use_dynamic_bsz": dynamic, "max_token_len": 20},
    )
    lp, ent = actor.compute_log_prob(data, calculate_entropy=True)
    ref = _direct_log_probs(model, b)
    mask = b["attention_mask"][:, -6:].bool()
    assert torch.allclose(lp[mask], ref[mask], atol=1e-5)
    assert ent.shape == lp.shape and (ent[mask] > 0).all()


def test_update_equals_manual_sgd_with_grad_accumulation(tiny_model_dir):
    """Two micro-batches of 2 rows, grad_accum = 4/2 = 2: the step equals SGD on the mean of the two
    micro-batch token-mean losses (verl/LUFFY semantics, docs/METHOD.md §1.9)."""
    model = _model(tiny_model_dir)
    ref_model = _model(tiny_model_dir)
    b = _batch(model.config.vocab_size)
    with torch.no_grad():
        old = _direct_log_probs(model, b)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1).expand(-1, 6).contiguous()
    lr = 0.1
    actor = DataParallelPPOActor(_cfg(), model, torch.optim.SGD(model.parameters(), lr=lr))
    data = DataProto.from_dict(tensors={**b, "old_log_probs": old, "advantages": adv}, meta_info={"temperature": 1.0})
    metrics = actor.update_policy(data)
    # one optimizer step: one grad norm, and one pg_loss, the loss that step minimised (below)
    assert len(metrics["actor/grad_norm"]) == 1 and len(metrics["actor/pg_loss"]) == 1

    mask = b["attention_mask"][:, -6:].float()
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        sub = {k: v[rows] for k, v in b.items()}
        lp = _direct_log_probs(ref_model, sub)
        ratio = torch.exp(lp - old[rows])
        m = mask[rows]
        total = total + ((-adv[rows] * ratio) * m).sum() / m.sum() / 2
    assert metrics["actor/pg_loss"] == pytest.approx([total.item()], abs=1e-6)
    total.backward()
    with torch.no_grad():
        for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
            assert torch.allclose(p, q - lr * q.grad, atol=1e-6), n


def test_nonfinite_grad_skips_step_and_counts(tiny_model_dir):
    model = _model(tiny_model_dir)
    b = _batch(model.config.vocab_size)
    before = [p.detach().clone() for p in model.parameters()]
    old = torch.zeros(4, 6)
    adv = torch.full((4, 6), float("nan"))
    actor = DataParallelPPOActor(_cfg(), model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = DataProto.from_dict(tensors={**b, "old_log_probs": old, "advantages": adv}, meta_info={"temperature": 1.0})
    metrics = actor.update_policy(data)
    assert metrics["actor/nonfinite_skips"] == [1]
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # exact: the step left them untouched
    stop = DataParallelPPOActor(_cfg(on_nonfinite="stop"), model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(NonFiniteLossError, match="on_nonfinite=stop"):
        stop.update_policy(data)


def test_a_grad_norm_above_skip_grad_bound_skips_the_step_and_one_below_steps(tiny_model_dir):
    model = _model(tiny_model_dir)
    b = _batch(model.config.vocab_size)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1).expand(-1, 6).contiguous()
    data = DataProto.from_dict(
        tensors={**b, "old_log_probs": torch.zeros(4, 6), "advantages": adv}, meta_info={"temperature": 1.0}
    )
    before = [p.detach().clone() for p in model.parameters()]
    tight = DataParallelPPOActor(_cfg(skip_grad_bound=1e-9), model, torch.optim.SGD(model.parameters(), lr=0.1))
    metrics = tight.update_policy(data)
    assert metrics["actor/grad_bound_skips"] == [1] and metrics["actor/grad_norm"][0] > 1e-9
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # exact: no step was taken
    loose = DataParallelPPOActor(_cfg(skip_grad_bound=1e9), model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert loose.update_policy(data)["actor/grad_bound_skips"] == [0]
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert "actor/grad_bound_skips" not in DataParallelPPOActor(
        _cfg(), model, torch.optim.SGD(model.parameters(), lr=0.1)
    ).update_policy(data)


def test_skipping_old_log_prob_pass_matches_recomputed_single_mini_batch(tiny_model_dir):
    """recompute_old_log_prob=auto: with one on-policy mini-batch, old = log_prob.detach() gives the same step."""
    b = _batch(_model(tiny_model_dir).config.vocab_size)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1).expand(-1, 6).contiguous()
    results = []
    for precompute in (True, False):
        model = _model(tiny_model_dir)
        tensors = {**b, "advantages": adv}
        if precompute:
            with torch.no_grad():
                tensors["old_log_probs"] = _direct_log_probs(model, b)
        actor = DataParallelPPOActor(_cfg(ppo_micro_batch_size=4), model, torch.optim.SGD(model.parameters(), lr=0.1))
        actor.update_policy(DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}))
        results.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.allclose(a, c, atol=1e-6) for a, c in zip(*results))


class _PrefixActor(DataParallelPPOActor):
    """Loads ``prefix_mask`` as LUFFY's actor does (luffy_pool/workers/mix_actor.py)."""

    def loss_input_keys(self):
        return super().loss_input_keys() + ["prefix_mask"]


def test_unknown_old_log_probs_take_the_current_ones_as_in_a_recomputed_pass(tiny_model_dir):
    """bypass_mode's NaN old log-probs (off-policy tokens the engine did not sample): the step equals the one whose
    old log-probs there are the pass's, the others kept (here shifted by 0.3: an engine's own values). A NaN on an
    on-policy token is a fault: the step is skipped by the non-finite guard, not silently filled."""
    b = _batch(_model(tiny_model_dir).config.vocab_size)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1).expand(-1, 6).contiguous()
    unknown = torch.zeros(4, 6, dtype=torch.bool)
    unknown[0, :3] = unknown[2, :] = True
    results = []
    for nan in (True, False):
        model = _model(tiny_model_dir)
        with torch.no_grad():
            recomputed = _direct_log_probs(model, b)
        old = torch.where(unknown, float("nan") if nan else recomputed, recomputed - 0.3)
        actor = _PrefixActor(_cfg(ppo_micro_batch_size=4), model, torch.optim.SGD(model.parameters(), lr=0.1))
        actor.update_policy(
            DataProto.from_dict(
                tensors={**b, "advantages": adv, "old_log_probs": old, "prefix_mask": unknown},
                meta_info={"temperature": 1.0},
            )
        )
        results.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.allclose(a, c, atol=1e-6) for a, c in zip(*results))
    model = _model(tiny_model_dir)
    actor = _PrefixActor(_cfg(ppo_micro_batch_size=4), model, torch.optim.SGD(model.parameters(), lr=0.1))
    on_policy_nan = old.masked_fill(~unknown, float("nan"))
    metrics = actor.update_policy(
        DataProto.from_dict(
            tensors={**b, "advantages": adv, "old_log_probs": on_policy_nan, "prefix_mask": unknown},
            meta_info={"temperature": 1.0},
        )
    )
    assert metrics["actor/nonfinite_skips"] == [1]
    assert any((a - p).abs().max() > 1e-4 for a, p in zip(results[0], _model(tiny_model_dir).parameters()))


def test_missing_old_log_probs_rejected_for_several_mini_batches(tiny_model_dir):
    model = _model(tiny_model_dir)
    b = _batch(model.config.vocab_size)
    actor = DataParallelPPOActor(_cfg(ppo_mini_batch_size=2), model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = DataProto.from_dict(tensors={**b, "advantages": torch.zeros(4, 6)}, meta_info={"temperature": 1.0})
    with pytest.raises(ValueError, match="old_log_probs missing"):
        actor.update_policy(data)


# For tests/verl/workers/actor/test_dp_actor.py (uses its _model/_batch/_cfg helpers) once report_oom is in dp_actor.
def test_oom_names_the_micro_batch_token_count(tiny_model_dir, monkeypatch):
    model = _model(tiny_model_dir)
    b = _batch(model.config.vocab_size)
    actor = DataParallelPPOActor(_cfg(), model, torch.optim.SGD(model.parameters(), lr=0.1))

    def oom(*_a, **_k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(actor, "_forward_micro_batch", oom)
    data = DataProto.from_dict(
        tensors={**b, "old_log_probs": torch.zeros(4, 6), "advantages": torch.zeros(4, 6)},
        meta_info={"temperature": 1.0, "micro_batch_size": 2, "use_dynamic_bsz": False},
    )
    # first micro-batch = rows 0-1 of _batch: 9 + 9 valid tokens of 11 positions
    with pytest.raises(torch.OutOfMemoryError, match=r"update_policy: .* 2 rows x 11 positions = 18 valid tokens"):
        actor.update_policy(data)
    with pytest.raises(torch.OutOfMemoryError, match=r"compute_log_prob: .* 18 valid tokens"):
        actor.compute_log_prob(data)


def test_rollout_correction_weights_and_rejected_mask_reach_the_loss(tiny_model_dir):
    """Unit weights and an unrejected mask give today's step bit for bit; real weights and a rejection give the
    manual SGD step on sum(-A * r * w * m') / sum(m') per micro-batch (m' = the rejected mask)."""
    b = _batch(_model(tiny_model_dir).config.vocab_size)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1).expand(-1, 6).contiguous()
    mask = b["attention_mask"][:, -6:]
    with torch.no_grad():
        old = _direct_log_probs(_model(tiny_model_dir), b)

    def step(extra):
        model = _model(tiny_model_dir)
        actor = DataParallelPPOActor(_cfg(), model, torch.optim.SGD(model.parameters(), lr=0.1))
        tensors = {**b, "old_log_probs": old, "advantages": adv, **extra}
        metrics = actor.update_policy(DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}))
        return [p.detach().clone() for p in model.parameters()], metrics

    plain, plain_metrics = step({})
    unit, unit_metrics = step({"rollout_is_weights": torch.ones(4, 6), "response_mask": mask.clone()})
    # exact: weights of exactly 1.0 and the same mask change no bit (the same arithmetic otherwise)
    assert all(torch.equal(a, c) for a, c in zip(plain, unit))
    assert plain_metrics["actor/pg_loss"] == unit_metrics["actor/pg_loss"]

    weights = torch.linspace(0.5, 2.0, 24).reshape(4, 6)
    rejected = mask.clone()
    rejected[0, -1] = rejected[2, 1] = 0
    _, metrics = step({"rollout_is_weights": weights, "response_mask": rejected})
    ref_model = _model(tiny_model_dir)
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        lp = _direct_log_probs(ref_model, {k: v[rows] for k, v in b.items()})
        m = rejected[rows].float()
        total = total + ((-adv[rows] * torch.exp(lp - old[rows]) * weights[rows]) * m).sum() / m.sum() / 2
    assert metrics["actor/pg_loss"] == pytest.approx([total.item()], abs=1e-6)


def test_rollout_is_weights_are_refused_by_a_loss_that_ignores_them(tiny_model_dir, monkeypatch):
    model = _model(tiny_model_dir)
    b = _batch(model.config.vocab_size)
    actor = DataParallelPPOActor(_cfg(), model, torch.optim.SGD(model.parameters(), lr=0.1))
    monkeypatch.setattr(actor, "policy_loss", "some_new_loss")
    data = DataProto.from_dict(
        tensors={
            **b,
            "old_log_probs": torch.zeros(4, 6),
            "advantages": torch.zeros(4, 6),
            "rollout_is_weights": torch.ones(4, 6),
        },
        meta_info={"temperature": 1.0},
    )
    with pytest.raises(ValueError, match="policy loss 'some_new_loss' does not take rollout_is_weights"):
        actor.update_policy(data)
