"""The LUFFY actor's step metrics do not depend on the micro-batching (verl/utils/step_metrics.py).

One batch with off-policy rows in some micro-batches only, trained in-process on the tiny model with fixed
micro-batches of 1 and of 2 rows and with token-budget (``use_dynamic_bsz``) micro-batches: ``token_weighted``
(the default) logs the same ``actor/*`` numbers; ``micro_batch_mean`` logs LUFFY's equal-weight mean of the
per-micro-batch values, recomputed here from direct forwards.
"""

import pytest
import torch
from luffy_pool.config.compose import actor_config

from luffy_pool.algorithm.mix_core_alg import luffy_token_loss
from luffy_pool.workers.mix_actor import MIXDataParallelPPOActor
from verl.protocol import DataProto
from verl.trainer.ppo.loss_inputs import PolicyLossInputs
from verl.trainer.ppo.metric_utils import reduce_metrics

PROMPT, RESP = 5, 6
ADV = [1.0, -0.5, 0.8, -1.0, 0.3, -0.7, 1.2, -0.2]
# (micro-batch rows, use_dynamic_bsz): the three cuttings of the same mini-batches
CUTS = [(1, False), (2, False), (2, True)]


def _model(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _direct_log_probs(model, b):
    with torch.no_grad():
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    return torch.log_softmax(out[:, -RESP - 1 : -1].float(), -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def _batch(model, response_tokens):
    """8 rows; rows 0 and 6 are off-policy (prefix over their first 4 response tokens), so a 2-row micro-batch
    [2, 3] or [4, 5] has none. Rows 2, 3, 6, 7 are left-padded by 2 (9 of 11 positions: the token budget then
    groups them unlike the fixed cut). ``response_tokens[i]``: row i's valid response tokens."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, model.config.vocab_size, (8, PROMPT + RESP), generator=g)
    attn = torch.ones_like(ids)
    for r in (2, 3, 6, 7):
        attn[r, :2] = 0
    for r, n in enumerate(response_tokens):
        attn[r, PROMPT + n :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    b = {
        "input_ids": ids,
        "attention_mask": attn,
        "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, PROMPT:],
    }
    prefix = torch.zeros(8, RESP, dtype=torch.bool)
    prefix[[0, 6], :4] = True
    b["prefix_mask"] = prefix
    b["advantages"] = torch.tensor(ADV).unsqueeze(-1).expand(-1, RESP).contiguous()
    b["old_log_probs"] = _direct_log_probs(model, b) + 0.05 * torch.randn(8, RESP, generator=g)  # ratios != 1
    b["ref_log_prob"] = b["old_log_probs"] - 0.1 * torch.rand(8, RESP, generator=g)
    return b


def _cfg(mini, micro, dynamic, budget, aggregation, **kw):
    values = dict(
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size=micro,
        use_dynamic_bsz=dynamic,
        ppo_max_token_len_per_gpu=budget,
        ppo_epochs=1,
        grad_clip=1e9,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_loss_type="low_var_kl",
        use_off_policy_loss=True,
        off_policy_reshape="p_div_p_0.1",
        loss_remove_token_mean=False,
        loss_remove_clip=False,
        metric_aggregation=aggregation,
    )
    return actor_config(**{**values, **kw})


def _train(model_dir, response_tokens, mini, micro, dynamic, budget, aggregation="token_weighted", **kw):
    """One update_policy on the batch -> (the worker's metric lists, the valid tokens of each micro-batch)."""
    model = _model(model_dir)
    b = _batch(model, response_tokens)
    actor = MIXDataParallelPPOActor(
        _cfg(mini, micro, dynamic, budget, aggregation, **kw), model, torch.optim.SGD(model.parameters(), lr=0.1)
    )
    cuts = []
    original = actor._micro_batches

    def recording(data, keys, *args):
        micro_batches, rev = original(data, keys, *args)
        cuts.append([int(m["attention_mask"].sum()) for m in micro_batches])
        return micro_batches, rev

    actor._micro_batches = recording
    metrics = actor.update_policy(DataProto.from_dict(tensors=b, meta_info={"temperature": 1.0}))
    return metrics, cuts


def test_equal_response_lengths_two_mini_batches_log_the_same_metrics_for_every_cut(tiny_model_dir):
    """Every row has 6 response tokens: the optimizer sees the same loss for every cut (token mean per
    micro-batch / grad accum), so every actor/* metric, pg_loss and grad_norm included, must agree."""
    runs = {cut: _train(tiny_model_dir, [RESP] * 8, 4, cut[0], cut[1], 22) for cut in CUTS}
    # the cuts: 4 x 1 row, 2 x 2 rows in order (11+11 | 9+9 tokens); the token budget gives the same rows here
    assert [c for c in runs[(1, False)][1]] == [[11, 11, 9, 9]] * 2
    assert [c for c in runs[(2, False)][1]] == [[22, 18]] * 2
    # sdpa has no varlen kernel: the token budget counts padded positions and cuts whole rows in order (H1)
    assert [c for c in runs[(2, True)][1]] == [[22, 18]] * 2
    reference = runs[(1, False)][0]
    assert len(reference["actor/grad_norm"]) == 2 and len(reference["actor/pg_loss"]) == 2  # one per optimizer step
    keys = {k for k in reference if k.startswith("actor/")}
    assert {
        "actor/off_policy_prob",
        "actor/on_policy_prob",
        "actor/off_pg_loss",
        "actor/on_pg_loss",
        "actor/ppo_kl",
        "actor/entropy_loss",
        "actor/kl_loss",
        "actor/pg_clipfrac",
        "actor/off_ratio_mean",
    } <= keys
    for cut in CUTS[1:]:
        metrics = runs[cut][0]
        assert set(metrics) == set(reference)
        for k in keys:
            assert metrics[k] == pytest.approx(reference[k], abs=1e-5), (cut, k)
    # and the off-policy metric is a probability of the off-policy tokens only, not diluted by empty micro-batches
    assert 0 < reference["actor/off_policy_prob"][0] < 1


LUFFY_LOSS = dict(loss_remove_token_mean=True, loss_remove_clip=True, entropy_coeff=0.0, use_kl_loss=False)


def test_luffys_setting_one_micro_batch_and_token_budget_micro_batches_log_the_same(tiny_model_dir):
    """exp_scripts/train.sh: ppo_micro_batch_size = the mini-batch (grad accum 1), LUFFY's Σ L·m / width loss, so
    the optimizer sees the same loss whether the mini-batch runs as one micro-batch or as the token budget cuts
    it (no entropy term, whose weight grows with the micro-batch count, docs/METHOD.md §1.9). Every actor/*
    metric agrees; LUFFY's mean divided pg_loss by the micro-batch count and diluted off_policy_prob."""
    lengths = [6, 2, 5, 3, 6, 4, 2, 6]
    one, one_cut = _train(tiny_model_dir, lengths, 8, 8, False, 30, **LUFFY_LOSS)
    budget, budget_cut = _train(tiny_model_dir, lengths, 8, 8, True, 30, **LUFFY_LOSS)
    assert one_cut == [[66]] and budget_cut == [[18, 14, 20, 14]]  # padded budget (sdpa, H1): 4 micro-batches
    assert set(one) == set(budget)
    for k in one:
        assert budget[k] == pytest.approx(one[k], abs=1e-5), k
    luffy, _ = _train(tiny_model_dir, lengths, 8, 8, True, 30, aggregation="micro_batch_mean", **LUFFY_LOSS)
    assert sum(luffy["actor/pg_loss"]) == pytest.approx(one["actor/pg_loss"][0], abs=1e-5)  # summed, not averaged
    assert luffy["actor/grad_norm"] == pytest.approx(one["actor/grad_norm"], abs=1e-5)


def _direct_metrics(model_dir, response_tokens, rows_of_micro_batches):
    """luffy_token's metrics per micro-batch and over the whole batch, from direct forwards of the initial model."""
    model = _model(model_dir)
    b = _batch(model, response_tokens)
    lp = _direct_log_probs(model, b)
    # the loss cfg the actor builds (an actor with an optimizer: a log-prob-only one carries no loss)
    cfg = MIXDataParallelPPOActor(
        _cfg(8, 2, False, 64, "token_weighted"), model, torch.optim.SGD(model.parameters(), lr=0.0)
    ).policy_loss_cfg
    mask = b["attention_mask"][:, -RESP:].float()

    def metrics(rows):
        inputs = PolicyLossInputs(
            log_prob=lp[rows],
            old_log_prob=b["old_log_probs"][rows],
            advantages=b["advantages"][rows],
            response_mask=mask[rows],
            prefix_mask=b["prefix_mask"][rows],
        )
        loss, out = luffy_token_loss(inputs, cfg)
        return {"pg_loss": loss.item(), **{k: v.item() for k, v in out.items()}}

    return [metrics(rows) for rows in rows_of_micro_batches], metrics(list(range(8)))


def test_unequal_lengths_token_means_over_the_step_and_the_loss_the_optimizer_saw(tiny_model_dir):
    """Response lengths 6, 2, ..: the metrics are the token means over the whole batch for every cut; pg_loss is
    the sum of the micro-batch losses / grad accum (it, and the gradient, legitimately depend on the cut)."""
    lengths = [6, 2, 5, 3, 6, 4, 2, 6]
    per_micro, whole = _direct_metrics(tiny_model_dir, lengths, [[2 * j, 2 * j + 1] for j in range(4)])
    assert per_micro[1]["off_policy_prob"] == 0 and per_micro[2]["off_policy_prob"] == 0  # no off-policy token
    runs = {cut: _train(tiny_model_dir, lengths, 8, cut[0], cut[1], 30) for cut in CUTS}
    assert runs[(2, True)][1] == [[18, 14, 20, 14]]  # a budget of 30 padded positions (sdpa, H1): 4 x 2 rows
    for cut, (metrics, _) in runs.items():
        for k in (
            "off_policy_prob",
            "on_policy_prob",
            "off_pg_loss",
            "on_pg_loss",
            "ppo_kl",
            "pg_clipfrac",
            "off_ratio_mean",
        ):
            assert metrics[f"actor/{k}"] == pytest.approx([whole[k]], abs=1e-5), (cut, k)
    for k in ("entropy_loss", "kl_loss"):  # token means too: equal across cuts
        assert runs[(2, False)][0][f"actor/{k}"] == pytest.approx(runs[(1, False)][0][f"actor/{k}"], abs=1e-5)
        assert runs[(2, True)][0][f"actor/{k}"] == pytest.approx(runs[(1, False)][0][f"actor/{k}"], abs=1e-5)
    # fixed 2-row micro-batches, grad accum 8/2 = 4: the optimizer's loss is the sum of the 4 losses / 4
    assert runs[(2, False)][0]["actor/pg_loss"] == pytest.approx([sum(m["pg_loss"] for m in per_micro) / 4], abs=1e-5)


def test_micro_batch_mean_reproduces_luffys_per_micro_batch_mean(tiny_model_dir):
    """``metric_aggregation=micro_batch_mean``: one entry per micro-batch, averaged with equal weight by the
    driver; a micro-batch without off-policy tokens adds a 0 to off_policy_prob."""
    lengths = [6, 2, 5, 3, 6, 4, 2, 6]
    per_micro, whole = _direct_metrics(tiny_model_dir, lengths, [[2 * j, 2 * j + 1] for j in range(4)])
    lists, _ = _train(tiny_model_dir, lengths, 8, 2, False, 30, aggregation="micro_batch_mean")
    assert len(lists["actor/off_policy_prob"]) == 4 and len(lists["actor/grad_norm"]) == 1
    logged = reduce_metrics(lists)
    for k in ("off_policy_prob", "on_policy_prob", "off_pg_loss", "on_pg_loss", "ppo_kl", "pg_loss"):
        assert lists[f"actor/{k}"] == pytest.approx([m[k] for m in per_micro], abs=1e-5), k
        assert logged[f"actor/{k}"] == pytest.approx(sum(m[k] for m in per_micro) / 4, abs=1e-5), k
    # LUFFY's mean counts the two empty micro-batches as 0: about half the token mean here
    assert logged["actor/off_policy_prob"] < 0.75 * whole["off_policy_prob"]
    weighted, _ = _train(tiny_model_dir, lengths, 8, 2, False, 30)
    assert reduce_metrics(weighted)["actor/off_policy_prob"] == pytest.approx(whole["off_policy_prob"], abs=1e-5)
