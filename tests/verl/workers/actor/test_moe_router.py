"""The MoE router's aux loss and load metric (verl/workers/actor/moe_router.py): a hand-checked two-expert case,
transformers' ``load_balancing_loss_func`` as the reference of the pooled Switch loss, and the actor's update
logging both on the shrunk Qwen3-30B-A3B, with ``router_aux_loss_coef`` reaching the router's gradient."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from luffy_pool.config.compose import actor_config

from tests.helpers.float_compare import assert_float_close
from verl.protocol import DataProto
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.actor.moe_router import load_balancing_loss, load_max_over_mean

CONFIG = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "data", "model_configs", "Qwen--Qwen3-30B-A3B-Base.json"
)
L3 = math.log(3.0)  # logits (ln 3, 0): router probabilities (0.75, 0.25)


def _routed(*rows):
    logits = torch.tensor(rows)
    return [(logits, logits.topk(1, dim=-1).indices)]


def test_two_experts_by_hand():
    balanced = _routed([L3, 0.0], [0.0, L3])  # f = (1/2, 1/2), P = (1/2, 1/2): 2 * (1/4 + 1/4)
    assert abs(float(load_balancing_loss(balanced, 2)) - 1.0) < 1e-6
    assert load_max_over_mean(balanced, 2) == 1.0
    skewed = _routed([L3, 0.0], [L3, 0.0])  # f = (1, 0), P = (3/4, 1/4): 2 * 3/4; counts (2, 0): max/mean 2
    assert abs(float(load_balancing_loss(skewed, 2)) - 1.5) < 1e-6
    assert load_max_over_mean(skewed, 2) == 2.0
    # padded rows: the mask drops the second token, leaving the skewed case's statistics
    mask = torch.tensor([[1, 0]])
    assert abs(float(load_balancing_loss(balanced, 2, mask)) - 1.5) < 1e-6
    assert load_max_over_mean(balanced, 2, mask) == 2.0


@pytest.mark.golden
def test_pooled_loss_equals_transformers_load_balancing_loss_func():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(12, 4, generator=g) for _ in range(3)]
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    routed = [(x, torch.softmax(x, -1).topk(2, dim=-1).indices) for x in logits]
    for m in (None, mask):
        assert_float_close(load_balancing_loss(routed, 4, m), load_balancing_loss_func(tuple(logits), 4, 2, m))


def _batch(vocab, rows=4, prompt=5, resp=6):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, prompt + resp), generator=g)
    attn = torch.ones(rows, prompt + resp, dtype=torch.long)
    attn[0, :2] = 0
    attn[1, -2:] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "responses": ids[:, prompt:]}


def _update(path, coef):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    cfg = actor_config(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size=4,
        use_dynamic_bsz=False,
        ppo_epochs=1,
        ppo_max_token_len_per_gpu=64,
        grad_clip=1e9,
        use_kl_loss=False,
        router_aux_loss_coef=coef,
    )
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=0.5), logprob_chunk_size=0)
    b = _batch(model.config.vocab_size)
    with torch.no_grad():
        aux = model(**{k: b[k] for k in ("input_ids", "attention_mask", "position_ids")}, output_router_logits=True)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(-1, 6).contiguous()
    lp = torch.zeros(4, 6)
    metrics = actor.update_policy(
        DataProto.from_dict(tensors={**b, "old_log_probs": lp, "advantages": adv}, meta_info={"temperature": 1.0})
    )
    return metrics, aux.aux_loss, model.model.layers[0].mlp.gate.weight.detach().clone()


def test_actor_logs_the_aux_loss_and_the_coefficient_reaches_the_router(tmp_path):
    from luffy_pool.tiny import TinyModelSpec, build_tiny_model

    with open(CONFIG) as f:
        path = build_tiny_model(str(tmp_path), TinyModelSpec(num_key_value_heads=2), json.load(f))
    metrics, reference, gate_off = _update(path, 0.0)
    # one micro-batch: the step's value is the pre-update forward's, over the non-padding tokens, as transformers'
    assert_float_close(torch.tensor(metrics["actor/moe_aux_loss"][0]), reference.float(), ulps=64)
    load = metrics["actor/moe_load_max_over_mean"][0]
    assert 1.0 <= load <= 2.0  # 4 experts, top-2: at most E/k
    _, _, gate_on = _update(path, 10.0)
    assert not torch.equal(gate_on, gate_off)  # the aux term's gradient moved the router
