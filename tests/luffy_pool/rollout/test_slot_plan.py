"""Slot plan and response assembly (docs/METHOD.md §1.2 items 1-9, §8 item 1), with a fake counting engine."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from luffy_pool.rollout.slot_plan import (
    SLOT_FULL,
    SLOT_ON,
    SLOT_PARTIAL,
    MixRolloutPlanner,
    assemble_responses,
    build_slot_plan,
)
from luffy_pool.config.compose import rollout_section
from verl.workers.rollout.base import BaseRollout, GenerationOutput, SamplingSpec

PAD, EOS = 0, 2
T_, F_ = True, False


def scripted_continuation(prompt: list[int], max_tokens: int, eos: int = EOS) -> list[int]:
    """Deterministic 'model': a stream seeded by the prompt, ending at the first EOS or max_tokens."""
    rng = random.Random(hash(tuple(prompt)))
    out = []
    while len(out) < max_tokens:
        token = rng.choice([eos] + list(range(20, 30)))
        out.append(token)
        if token == eos:
            break
    return out


class CountingEngine(BaseRollout):
    """Records every request; replies with ``scripted_continuation`` (or a fixed reply)."""

    def __init__(self, reply=None, eos=EOS):
        self.calls: list[tuple[list[list[int]], list[int], SamplingSpec]] = []
        self.reply = reply
        self.eos = eos

    def generate_token_ids(self, prompt_token_ids, max_tokens, sampling):
        self.calls.append(([list(p) for p in prompt_token_ids], list(max_tokens), sampling))
        if self.reply is not None:
            ids = [list(self.reply) for _ in prompt_token_ids]
        else:
            ids = [scripted_continuation(p, m, self.eos) for p, m in zip(prompt_token_ids, max_tokens)]
        return GenerationOutput(token_ids=ids, logprobs=[[-0.5] * len(i) for i in ids])

    def update_weights(self, named_tensors):
        pass


def _prompt_batch():
    # One prompt [5, 6, 7] left-padded to P = 5.
    return torch.tensor([[PAD, PAD, 5, 6, 7]]), torch.tensor([[0, 0, 1, 1, 1]])


TARGET = [11, 12, 13, 14]
TGT = torch.tensor([TARGET + [PAD, PAD]])  # right-padded to T = 6


def per_slot(tgt: torch.Tensor, n: int) -> torch.Tensor:
    """Per-prompt targets [B, T] as the per-slot traces [B, n, T] the plan takes (what
    ``OffPolicyPool.slot_traces`` returns without extra files)."""
    return tgt.unsqueeze(1).expand(-1, n, -1)


# ----------------------------------------------------------------------------------------------------
# docs/METHOD.md §8 item 1
# ----------------------------------------------------------------------------------------------------
def test_full_trace_slot_is_target_plus_eos_and_skips_engine():
    prompts, mask = _prompt_batch()
    ratios = np.array([[1.0] + [0.0] * 7])
    engine = CountingEngine(reply=[21, 22, EOS])
    planner = MixRolloutPlanner(
        engine, rollout_section(n=8, response_length=8, n_val=1), pad_token_id=PAD, eos_token_id=EOS
    )
    out = planner.generate(prompts, mask, per_slot(TGT, 8), ratios).tensors

    assert out["responses"][0].tolist() == [11, 12, 13, 14, EOS, PAD, PAD, PAD]
    assert out["prefix_mask"][0].tolist() == [T_] * 5 + [F_] * 3
    assert not out["prefix_mask"][1:].any()
    for k in range(1, 8):
        assert out["responses"][k].tolist() == [21, 22, EOS, PAD, PAD, PAD, PAD, PAD]
    # The engine saw the 7 on-policy slots only, as plain prompts with the full budget L.
    assert len(engine.calls) == 1
    requests, max_tokens, _ = engine.calls[0]
    assert requests == [[5, 6, 7]] * 7 and max_tokens == [8] * 7
    assert out["response_mask"][0].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert out["attention_mask"][0].tolist() == [0, 0, 1, 1, 1] + [1, 1, 1, 1, 1, 0, 0, 0]
    assert out["position_ids"][0].tolist() == [0, 0, 0, 1, 2] + list(range(3, 11))
    assert out["input_ids"][0].tolist() == [PAD, PAD, 5, 6, 7, 11, 12, 13, 14, EOS, PAD, PAD, PAD]
    assert out["prompts"].tolist() == [[PAD, PAD, 5, 6, 7]] * 8
    assert out["tgt_input_ids"].tolist() == [TARGET + [PAD, PAD]] * 8


def test_ratio_zero_everywhere_marks_no_prefix_token():
    prompts, mask = _prompt_batch()
    engine = CountingEngine(reply=[21, EOS])
    planner = MixRolloutPlanner(
        engine, rollout_section(n=8, response_length=8, n_val=1), pad_token_id=PAD, eos_token_id=EOS
    )
    batch = planner.generate(prompts, mask, per_slot(TGT, 8), np.zeros((1, 8)))
    assert not batch.tensors["prefix_mask"].any()
    assert batch.meta_info["num_engine_requests"] == 8 and batch.meta_info["num_on_policy_slots"] == 8


def test_half_ratio_prefix_is_floor_of_half_target_plus_eos():
    prompts, mask = _prompt_batch()
    plan = build_slot_plan(prompts, mask, per_slot(TGT, 2), np.array([[0.5, 0.0]]), PAD, EOS, response_length=8)
    assert plan.prefixes[0] == [11, 12]  # floor(0.5 * (4 + 1)) = 2
    assert plan.kinds == [SLOT_PARTIAL, SLOT_ON]
    assert plan.engine_prompts() == [[5, 6, 7, 11, 12], [5, 6, 7]]
    assert plan.engine_max_tokens == [6, 8]  # L - len(prefix)
    out = assemble_responses(plan, [[23, 24, EOS], [25, EOS]]).tensors
    assert out["responses"][0].tolist() == [11, 12, 23, 24, EOS, PAD, PAD, PAD]
    assert out["prefix_mask"][0].tolist() == [T_, T_] + [F_] * 6
    assert out["responses"][1].tolist() == [25, EOS] + [PAD] * 6


# ----------------------------------------------------------------------------------------------------
# Slot kinds, truncation, counts
# ----------------------------------------------------------------------------------------------------
def test_empty_target_gets_no_eos_and_stays_on_policy():
    prompts, mask = _prompt_batch()
    plan = build_slot_plan(prompts, mask, torch.full((1, 1, 4), PAD), np.array([[1.0]]), PAD, EOS, response_length=4)
    assert plan.traces == [[]] and plan.kinds == [SLOT_ON] and plan.engine_slots == [0]


def test_full_trace_longer_than_l_is_truncated_without_eos():
    prompts, mask = _prompt_batch()
    tgt = torch.tensor([list(range(40, 50))])
    engine = CountingEngine()
    planner = MixRolloutPlanner(
        engine, rollout_section(n=1, response_length=6, n_val=1), pad_token_id=PAD, eos_token_id=EOS
    )
    out = planner.generate(prompts, mask, per_slot(tgt, 1), np.array([[1.0]])).tensors
    assert out["responses"][0].tolist() == [40, 41, 42, 43, 44, 45]
    assert out["prefix_mask"][0].all() and out["response_mask"][0].tolist() == [1] * 6
    assert engine.calls == []  # nothing to generate: no engine call at all


def test_partial_prefix_filling_l_never_reaches_the_engine():
    prompts, mask = _prompt_batch()
    tgt = torch.tensor([list(range(40, 50))])  # trace = 10 tokens + EOS
    plan = build_slot_plan(prompts, mask, per_slot(tgt, 2), np.array([[0.7, 0.3]]), PAD, EOS, response_length=6)
    assert plan.kinds == [SLOT_PARTIAL, SLOT_PARTIAL]
    assert [len(p) for p in plan.prefixes] == [7, 3]  # floor(0.7*11), floor(0.3*11)
    assert plan.engine_slots == [1] and plan.engine_max_tokens == [3]
    out = assemble_responses(plan, [[30, 31, 32]]).tensors
    assert out["responses"].tolist() == [[40, 41, 42, 43, 44, 45], [40, 41, 42, 30, 31, 32]]
    assert out["prefix_mask"].tolist() == [[T_] * 6, [T_] * 3 + [F_] * 3]


def test_engine_output_longer_than_budget_is_cut_at_l():
    prompts, mask = _prompt_batch()
    plan = build_slot_plan(prompts, mask, None, None, PAD, EOS, response_length=3, n=1)
    batch = assemble_responses(plan, [[21, 22, 23, 24, 25]])
    assert batch.tensors["responses"].tolist() == [[21, 22, 23]]
    assert batch.meta_info["num_engine_tokens"] == 5


def test_meta_info_counts_slot_kinds_and_engine_tokens():
    prompts = torch.tensor([[PAD, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    tgt = torch.tensor([[11, 12, 13], [14, PAD, PAD]])
    ratios = np.array([[1.0, 0.5, 0.0], [1.0, 0.0, 0.0]])
    engine = CountingEngine(reply=[21, EOS])
    planner = MixRolloutPlanner(
        engine, rollout_section(n=3, response_length=8, n_val=1), pad_token_id=PAD, eos_token_id=EOS
    )
    batch = planner.generate(prompts, mask, per_slot(tgt, 3), ratios)
    assert batch.meta_info == {
        "prefix_ratios": [1.0, 0.5, 0.0, 1.0, 0.0, 0.0],
        "num_engine_requests": 4,
        "num_engine_tokens": 8,
        "num_full_slots": 2,
        "num_partial_slots": 1,
        "num_on_policy_slots": 3,
    }
    assert engine.calls[0][0] == [[5, 6, 11, 12], [5, 6], [7, 8, 9], [7, 8, 9]]
    # Interleaved order: slot k belongs to prompt k // n.
    assert batch.tensors["responses"][3].tolist()[:3] == [14, EOS, PAD]


def test_per_slot_traces_from_the_pool_are_used_slot_by_slot():
    prompts, mask = _prompt_batch()
    tgt = torch.tensor([[[11, 12, PAD], [31, 32, 33]]])  # [B=1, n=2, T=3]
    plan = build_slot_plan(prompts, mask, tgt, np.array([[1.0, 1.0]]), PAD, EOS, response_length=5)
    assert plan.traces == [[11, 12, EOS], [31, 32, 33, EOS]]
    assert plan.kinds == [SLOT_FULL, SLOT_FULL] and plan.engine_slots == []
    assert plan.tgt_input_ids.tolist() == [[11, 12, PAD], [31, 32, 33]]


def test_behaviour_log_probs_on_prefix_tokens_only_nan_elsewhere():
    prompts, mask = _prompt_batch()
    lp = [[math.log(0.5), float("nan"), math.log(0.25), math.log(0.1), math.log(0.9)]]  # trace ++ EOS
    nan = float("nan")
    per_slot_lp = per_slot(torch.tensor([lp[0] + [nan, nan]]), 3)  # [B, n, T + 1]
    plan = build_slot_plan(
        prompts,
        mask,
        per_slot(TGT, 3),
        np.array([[1.0, 0.5, 0.0]]),
        PAD,
        EOS,
        response_length=6,
        behaviour_log_probs=per_slot_lp,
    )
    out = assemble_responses(plan, [[21, EOS], [22, EOS]]).tensors
    lp_t = torch.tensor(lp[0], dtype=torch.float32)
    torch.testing.assert_close(out["behaviour_log_probs"][0], torch.cat([lp_t, torch.tensor([nan])]), equal_nan=True)
    torch.testing.assert_close(
        out["behaviour_log_probs"][1], torch.tensor([lp_t[0].item()] + [nan] * 5), equal_nan=True
    )
    assert torch.isnan(out["behaviour_log_probs"][2]).all()


def test_per_slot_logprobs_are_used_slot_by_slot():
    prompts, mask = _prompt_batch()
    tgt = torch.tensor([[[11, PAD], [31, 32]]])
    lp = torch.tensor([[[math.log(0.5), math.log(0.2), float("nan")], [math.log(0.25), math.log(0.1), math.log(0.9)]]])
    plan = build_slot_plan(
        prompts, mask, tgt, np.array([[1.0, 1.0]]), PAD, EOS, response_length=4, behaviour_log_probs=lp
    )
    lps = assemble_responses(plan, []).tensors["behaviour_log_probs"]
    torch.testing.assert_close(lps.exp().nan_to_num(1.0), torch.tensor([[0.5, 0.2, 1.0, 1.0], [0.25, 0.1, 0.9, 1.0]]))


def test_behaviour_log_probs_absent_without_slot_behaviour_log_probs_and_rollout_logprobs_placed_after_prefix():
    prompts, mask = _prompt_batch()
    plan = build_slot_plan(prompts, mask, per_slot(TGT, 1), np.array([[0.5]]), PAD, EOS, response_length=6)
    out = assemble_responses(plan, [[21, EOS]], engine_logprobs=[[-0.3, -0.4]]).tensors
    assert "behaviour_log_probs" not in out
    torch.testing.assert_close(out["rollout_log_probs"][0], torch.tensor([0.0, 0.0, -0.3, -0.4, 0.0, 0.0]))


def test_validation_repeats_n_val_without_prefix_at_val_temperature():
    prompts, mask = _prompt_batch()
    engine = CountingEngine(reply=[21, EOS])
    planner = MixRolloutPlanner(
        engine,
        rollout_section(n=8, response_length=4, temperature=1.0, top_p=0.9, top_k=5, n_val=2, val_temperature=0.6),
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    batch = planner.generate_validation(prompts, mask)
    requests, max_tokens, sampling = engine.calls[0]
    assert requests == [[5, 6, 7]] * 2 and max_tokens == [4, 4]
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.6, 1.0, -1)
    assert batch.tensors["responses"].shape == (2, 4) and not batch.tensors["prefix_mask"].any()
    assert "tgt_input_ids" not in batch.tensors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ratios": np.array([[1.5]])}, r"\[0, 1\]"),
        ({"ratios": np.zeros((2, 1))}, r"ratios must be \[B=1, n\]"),
        ({"tgt": torch.zeros(1, 2, 3, dtype=torch.long)}, r"tgt_input_ids must be per-slot traces \[B=1, n=1, T\]"),
        (
            {"tgt": TGT},
            r"tgt_input_ids must be per-slot traces \[B=1, n=1, T\] \(OffPolicyPool.slot_traces\), got \(1, 6\)",
        ),
        (
            {"behaviour_log_probs": torch.zeros(1, 7)},
            r"behaviour_log_probs must be a tensor \[B=1, n=1, T\+1=7\] .*got \(1, 7\)",
        ),
        (
            {"behaviour_log_probs": torch.zeros(1, 1, 5)},
            r"behaviour_log_probs must be a tensor \[B=1, n=1, T\+1=7\] .*got \(1, 1, 5\)",
        ),
        ({"behaviour_log_probs": [[[0.0] * 7]]}, r"behaviour_log_probs must be a tensor .*got list"),
    ],
)
def test_bad_plan_inputs_raise_clear_errors(kwargs, message):
    prompts, mask = _prompt_batch()
    with pytest.raises(ValueError, match=message):
        build_slot_plan(
            prompts,
            mask,
            kwargs.get("tgt", per_slot(TGT, 1)),
            kwargs.get("ratios", np.array([[1.0]])),
            PAD,
            EOS,
            4,
            behaviour_log_probs=kwargs.get("behaviour_log_probs"),
        )


def test_engine_returning_wrong_number_of_sequences_is_an_error():
    prompts, mask = _prompt_batch()
    plan = build_slot_plan(prompts, mask, None, None, PAD, EOS, 4, n=2)
    with pytest.raises(ValueError, match="2 requests"):
        assemble_responses(plan, [[1]])


def test_training_rollout_rejects_per_prompt_targets_with_the_expected_shape():
    """One shape from the pool to the rollout: [B, T] targets must go through OffPolicyPool.slot_traces first."""
    prompts, mask = _prompt_batch()
    engine = CountingEngine()
    planner = MixRolloutPlanner(
        engine, rollout_section(n=4, response_length=4, n_val=1), pad_token_id=PAD, eos_token_id=EOS
    )
    with pytest.raises(ValueError) as err:
        planner.generate(prompts, mask, TGT, np.array([[1.0, 0.0, 0.0, 0.0]]))
    assert (
        str(err.value) == "tgt_input_ids must be per-slot traces [B=1, n=4, T] (OffPolicyPool.slot_traces), got (1, 6)"
    )
    assert engine.calls == []


def test_training_rollout_requires_driver_ratios():
    prompts, mask = _prompt_batch()
    planner = MixRolloutPlanner(
        CountingEngine(), rollout_section(n=2, response_length=4, n_val=1), pad_token_id=PAD, eos_token_id=EOS
    )
    with pytest.raises(ValueError, match="drawn on the driver"):
        planner.generate(prompts, mask, TGT, None)


# ----------------------------------------------------------------------------------------------------
# Equivalence with LUFFY's own path (everything through the engine, max_tokens = L)
# ----------------------------------------------------------------------------------------------------
def luffy_reference(prompts, tgt, ratios, pad, eos, length):
    """LUFFY's mix_vllm_rollout (docs/METHOD.md §1.2) with ``scripted_continuation`` as vLLM."""
    batch_size, n = ratios.shape
    rows, prefix_lens = [], []
    for k in range(batch_size * n):
        prompt = prompts[k // n].tolist()
        prompt = prompt[next(i for i, t in enumerate(prompt) if t != pad) :]
        target = tgt[k // n].tolist()
        last = max((i for i, t in enumerate(target) if t != pad), default=-1)
        target = target[: last + 1]
        target = target + [eos] if target else target
        prefix = target[: int(len(target) * float(ratios.reshape(-1)[k]))]
        generated = scripted_continuation(prompt + prefix, length, eos)
        while generated and generated[-1] == pad:  # LUFFY strips right pads of the vLLM output
            generated.pop()
        rows.append((prefix + generated)[:length])
        prefix_lens.append(min(len(prefix), length))
    responses = torch.full((len(rows), length), pad, dtype=torch.long)
    prefix_mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for k, row in enumerate(rows):
        responses[k, : len(row)] = torch.tensor(row, dtype=torch.long)
        prefix_mask[k, : prefix_lens[k]] = True
    is_eos = (responses == eos).long()
    mask = ((torch.cumsum(is_eos, 1) - is_eos) == 0).long()
    return responses, mask, prefix_mask


@pytest.mark.parametrize("pad, eos", [(0, 2), (2, 2)])  # pad == eos as in the Qwen-Math tokenizer
def test_plan_matches_luffy_after_masking(pad, eos):
    gen = torch.Generator().manual_seed(0)
    batch_size, n, length, width = 4, 4, 12, 9
    prompts = torch.randint(20, 30, (batch_size, 6), generator=gen)
    prompts[:, :2] = pad
    mask = (prompts != pad).long()
    tgt = torch.randint(40, 50, (batch_size, width), generator=gen)
    tgt[0, 5:] = pad  # short target
    tgt[1, :] = pad  # empty target
    ratios = np.array([[1.0, 0.5, 0.0, 0.9], [1.0, 0.3, 0.0, 0.0], [1.0, 0.0, 0.95, 0.2], [0.7, 1.0, 0.0, 0.0]])

    engine = CountingEngine(eos=eos)
    planner = MixRolloutPlanner(
        engine, rollout_section(n=n, response_length=length, n_val=1), pad_token_id=pad, eos_token_id=eos
    )
    ours = planner.generate(prompts, mask, per_slot(tgt, n), ratios).tensors
    ref_responses, ref_mask, ref_prefix_mask = luffy_reference(prompts, tgt, ratios, pad, eos, length)

    assert torch.equal(ours["prefix_mask"], ref_prefix_mask)
    assert torch.equal(ours["response_mask"], ref_mask)
    assert torch.equal(ours["responses"] * ours["response_mask"], ref_responses * ref_mask)
    full = [k for k, r in enumerate(ratios.reshape(-1)) if r == 1.0 and k // n != 1]
    for k in range(batch_size * n):
        if k not in full:  # non-full slots are identical even beyond the mask
            assert torch.equal(ours["responses"][k], ref_responses[k])
    # LUFFY's full slots do carry junk after the trace's EOS; only the mask makes them equal.
    assert any(not torch.equal(ours["responses"][k], ref_responses[k]) for k in full)
    sent = len(engine.calls[0][0])
    assert sent == batch_size * n - len(full)


# ----------------------------------------------------------------------------------------------------
# Data path end to end: dataset -> driver ratios -> pool -> plan, with the tiny tokenizer
# ----------------------------------------------------------------------------------------------------
def test_dataset_batch_through_sampler_pool_and_planner(tiny_model_dir, tiny_task_dir):
    import os

    from transformers import AutoTokenizer

    from luffy_pool.rollout.off_policy_pool import OffPolicyPool, PrefixRatioSampler
    from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget, collate_fn

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ds = RLHFDatasetWithTarget(
        os.path.join(tiny_task_dir, "train.parquet"), tok, max_prompt_length=256, max_target_length=160
    )
    batch = collate_fn([ds[i] for i in range(2)])
    sampler = PrefixRatioSampler(rollout_section(n=4, n_prefix=1, min_prefix_ratio=1.0, max_prefix_ratio=1.0), seed=0)
    ratios = sampler.draw(2, global_step=1)
    traces = OffPolicyPool(tokenizer=tok).slot_traces(batch["index"], batch["tgt_input_ids"], ratios, global_step=1)
    engine = CountingEngine(reply=[tok.eos_token_id], eos=tok.eos_token_id)
    planner = MixRolloutPlanner(
        engine,
        rollout_section(n=4, response_length=200, n_val=1),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    out = planner.generate(
        batch["input_ids"],
        batch["attention_mask"],
        traces.tgt_input_ids,
        ratios,
        prompt_position_ids=batch["position_ids"],
    ).tensors

    content = ds.dataframe.iloc[0]["target"][0]["content"]
    valid = out["responses"][0][out["response_mask"][0].bool()]
    assert tok.decode(valid) == content[len("<think>\n") :] + "<|im_end|>"
    assert out["prefix_mask"][0].sum() == len(valid) and not out["prefix_mask"][1:4].any()
    assert len(engine.calls[0][0]) == 6  # 3 on-policy slots per prompt
