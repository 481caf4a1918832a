"""AMPO (luffy_pool/methods/ampo.py) against the authors' code: SII-Enigma/AMPO
@ b88d365654e03b94d8316226a5a67e0f7b64048f, run outside the project (a scratch script copying out their functions,
with their verl's ``masked_mean`` ``Σ v·m / (Σ m + 1e-8)``) on the inputs below, float64:
``ampo/verl/verl/adaptive_mix_src/mix_core_alg.py`` line 305 ``compute_token_on_seq_off_policy_loss`` (config: clip
0.2/0.2, clip_ratio_c 10, ``p_div_p_0.1``, no off-policy clamps: their script's values; its token-mean variant goes
through ``ampo/verl/verl/trainer/ppo/core_algos.py`` line 703 ``agg_loss``), and core_algos.py line 261
``compute_grpo_outcome_advantage``. The comprehension score and the slot assignment are re-implemented from
``workers/reward_manager/prob.py`` ``compute_scoreB`` (line 308) and ``mix_dapo_trainer.py`` lines 1375-1620; their
values are the spec's check values (METHODS_SPEC_2026 §6) and hand computations.
"""

from __future__ import annotations

import random

import pytest
import torch

from luffy_pool.methods.ampo import (
    AmpoKnobs,
    AmpoLossConfig,
    add_teachers,
    ampo_token_loss,
    answer_format_ok,
    assign_teachers,
    check_teachers_column,
    comprehension_score,
    gt_token_positions,
    rank_teachers,
    replace_answer,
    sorted_teachers,
    teacher_problem,
)
from luffy_pool.methods.loss_inputs import FamilyLossInputs
from tests.helpers.float_compare import assert_float_close

D = torch.float64
L = 5


def _toy():
    """The scratch script's toy: 4 rows, rows 0 and 2 teacher rows (prefix on their valid tokens), A of the spec's
    group [1.0 teacher, 0.1, 1.0 teacher, 0.0]; ℓ and ℓ_old drawn from a seeded generator."""
    g = torch.Generator().manual_seed(7)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=D)
    prefix = torch.zeros(4, L, dtype=torch.bool)
    prefix[0, :4] = True
    prefix[2, :] = True
    log_prob = -torch.rand(4, L, generator=g, dtype=D) * 2.0
    old = log_prob + (torch.rand(4, L, generator=g, dtype=D) - 0.5) * 0.8
    adv = torch.tensor([0.475, -0.425, 0.475, -0.525], dtype=D).unsqueeze(-1).expand(4, L).clone()
    return FamilyLossInputs(log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask, prefix_mask=prefix)


# ---------------------------------------------------------------- the loss
@pytest.mark.golden
def test_the_loss_matches_their_compute_token_on_seq_off_policy_loss():
    loss, m = ampo_token_loss(_toy(), AmpoLossConfig())
    theirs = {  # mix_core_alg.py line 305, loss_remove_token_mean=True (Σ/L)
        "on_pg_loss": 0.4909732665845696,
        "off_pg_loss": -0.3945263907306935,
        "on_pg_clipfrac": 0.21428571413265304,
        "on_pg_clipfrac_lower": 0.0,
        "ppo_kl": 0.04839816333133715,
        "off_policy_prob": 0.6195959132585234,
        "on_policy_prob": 0.46699338351702663,
        "off_ratio_mean": 0.8305818752225127,
    }
    assert_float_close(loss, torch.tensor(-0.22508603240240585, dtype=D), what="pg_loss")
    for k, v in theirs.items():
        assert_float_close(m[k].to(D), torch.tensor(v, dtype=D), what=k)
    # their per-teacher metrics off_policy_target_{0,1}_loss average to off_pg_loss
    assert (-0.36496741535285265 + -0.4240853661085343) / 2 == pytest.approx(m["off_pg_loss"].item(), rel=1e-12)


@pytest.mark.golden
def test_the_token_mean_variant_and_the_dual_clip():
    loss, _ = ampo_token_loss(_toy(), AmpoLossConfig(loss_remove_token_mean=False))
    assert_float_close(loss, torch.tensor(-0.08038786865772504, dtype=D), what="token-mean pg_loss")
    # A = -1 on-policy: ratio e^3 is cut at c = 10 (dual clip), ratio 1 kept, ratio e^-2.95 raised to 0.8
    lp = torch.tensor([[0.0, -0.1, -3.0]], dtype=D)
    old = torch.tensor([[-3.0, -0.1, -0.05]], dtype=D)
    inputs = FamilyLossInputs(
        log_prob=lp,
        old_log_prob=old,
        advantages=torch.full((1, 3), -1.0, dtype=D),
        response_mask=torch.ones(1, 3, dtype=D),
        prefix_mask=torch.zeros(1, 3, dtype=torch.bool),
    )
    loss, m = ampo_token_loss(inputs, AmpoLossConfig())
    assert_float_close(loss, torch.tensor(3.9333333333333336, dtype=D), what="dual-clip pg_loss")  # theirs
    assert_float_close(m["on_pg_loss"].to(D), torch.tensor(3.9333333202222227, dtype=D))
    assert_float_close(m["on_pg_clipfrac_lower"].to(D), torch.tensor(0.3333333322222222, dtype=D))
    assert_float_close(m["ppo_kl"].to(D), torch.tensor(-0.01666666661111105, dtype=D))
    assert loss.item() == pytest.approx((10.0 + 1.0 + 0.8) / 3)  # by hand


def test_the_loss_without_teacher_rows_logs_zero_off_policy_terms_and_its_gradient_flows():
    inputs = _toy()
    inputs = FamilyLossInputs(
        log_prob=inputs.log_prob.clone().requires_grad_(True),
        old_log_prob=inputs.old_log_prob,
        advantages=inputs.advantages,
        response_mask=inputs.response_mask,
        prefix_mask=torch.zeros_like(inputs.prefix_mask),
    )
    loss, m = ampo_token_loss(inputs, AmpoLossConfig())
    loss.backward()
    assert m["off_pg_loss"].item() == 0.0 and m["off_ratio_mean"].item() == 0.0
    assert torch.isfinite(inputs.log_prob.grad).all() and inputs.log_prob.grad.abs().sum() > 0


# ---------------------------------------------------------------- the advantage of their script
@pytest.mark.golden
def test_the_presets_advantage_is_grpo_without_std_with_the_teacher_rows_in_the_group():
    """Their ``compute_grpo_outcome_advantage`` (core_algos.py line 261, norm_adv_by_std_in_grpo=False) on the
    spec's group [1.0 teacher, 0.1, 1.0 teacher, 0.0] and on two groups of 3."""
    from luffy_pool.methods import get_method
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.loss_inputs import AdvantageConfig, AdvantageInputs

    estimator = get_method("ampo").preset_keys()["algorithm.adv_estimator"]
    rewards = torch.zeros(4, 3, dtype=D)
    rewards[:, -1] = torch.tensor([1.0, 0.1, 1.0, 0.0], dtype=D)
    on = torch.tensor([False, True, False, True])
    adv, _ = get_adv_estimator_fn(estimator)(
        AdvantageInputs(rewards, torch.ones(4, 3, dtype=D), ["a"] * 4, on_policy_mask=on),
        AdvantageConfig(grpo_use_std=False),
    )
    assert_float_close(adv[:, 0], torch.tensor([0.475, -0.42500000000000004, 0.475, -0.525], dtype=D))
    rewards = torch.zeros(6, 3, dtype=D)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.1, 0.9, 1.0, 0.0], dtype=D)
    adv, _ = get_adv_estimator_fn(estimator)(
        AdvantageInputs(rewards, torch.ones(6, 3, dtype=D), ["g1"] * 3 + ["g2"] * 3, on_policy_mask=None),
        AdvantageConfig(grpo_use_std=False),
    )
    theirs = [0.6333333333333333, -0.3666666666666667, -0.2666666666666667, 0.2666666666666667]
    assert_float_close(adv[:4, 0], torch.tensor(theirs, dtype=D))


# ---------------------------------------------------------------- the comprehension score and the ranking
@pytest.mark.golden
def test_the_spec_teacher_scores_and_ranking():
    """METHODS_SPEC_2026 §6: GT-token log-probs -> scoreB (bf16), score; rank T1, T4, T2, T3; top-2 T1, T4."""
    teachers = [
        ([-0.1, -0.2, -0.05], 1.0, 0.890625, 0.901563),
        ([-1.5, -0.7, -0.3], 1.0, 0.486328, 0.537695),
        ([-0.4, -0.9, -2.0], 0.0, 0.404297, 0.363867),
        ([-0.01, -3.0, -0.2], 1.0, 0.621094, 0.658984),
    ]
    scores = []
    for lps, fmt, score_b, score in teachers:
        b, s = comprehension_score(torch.tensor(lps, dtype=D), fmt)
        assert b == pytest.approx(score_b, abs=5e-7) and s == pytest.approx(score, abs=5e-7)
        scores.append(s)
    order = rank_teachers(scores)
    assert order == [0, 3, 1, 2]
    assert order[: min(len(teachers), AmpoKnobs().n_guides)] == [0, 3]


def test_bf16_rounding_ties_teachers_and_the_tie_keeps_the_quality_order():
    a, b = [-0.1000, -0.1000], [-0.1010, -0.1000]  # float32 means differ, bfloat16 values are equal
    sa, sb = comprehension_score(torch.tensor(a), 1.0), comprehension_score(torch.tensor(b), 1.0)
    assert sa[0] == sb[0] and torch.exp(torch.tensor(a)).mean() != torch.exp(torch.tensor(b)).mean()
    assert rank_teachers([sa[1], sb[1]]) == [0, 1] and rank_teachers([sb[1], sa[1]]) == [0, 1]
    assert comprehension_score(torch.tensor([]), 1.0) == (0.0, pytest.approx(0.1))  # no GT token: scoreB 0
    assert comprehension_score(torch.tensor([-0.1]), 0.0, threshold=0.95)[1] == 0.0  # threshold_t


# ---------------------------------------------------------------- the slots
class _FixedSample(random.Random):
    def __init__(self, chosen):
        super().__init__(0)
        self.chosen = chosen

    def sample(self, population, k):
        return list(self.chosen)[:k]


def test_a_chosen_slot_takes_the_teacher_j_mod_len_avail_not_the_best_first():
    """mix_dapo_trainer.py lines 1576-1583: failed positions in order; the chosen j takes avail[j % len(avail)]."""
    incorrect = list(range(8))
    assert assign_teachers(incorrect, 2, _FixedSample([5, 2])) == {2: 0, 5: 1}  # 2 % 2 = 0, then the one left
    assert assign_teachers(incorrect, 2, _FixedSample([3, 6])) == {3: 1, 6: 0}  # the second best to the first slot
    assert assign_teachers(incorrect, 1, _FixedSample([4])) == {4: 0}
    # one chosen slot, two teachers available: j = 1 takes avail[1 % 2], the second best
    assert assign_teachers([0, 1], 2, _FixedSample([1])) == {1: 1}


def test_the_slot_draw_consumes_the_rng_as_theirs():
    """random.sample(incorrect, eff_k), then one random.uniform(min, max) per chosen slot (lines 1444-1446)."""
    rng, ref = random.Random(11), random.Random(11)
    slots = assign_teachers(list(range(8)), 2, rng)
    chosen = ref.sample(list(range(8)), 2)
    [ref.uniform(1.0, 1.0) for _ in chosen]
    assert sorted(slots) == sorted(chosen) and rng.getstate() == ref.getstate()
    assert sorted(slots.values()) == [0, 1]


# ---------------------------------------------------------------- the answer replaced by the ground truth
def test_the_answer_tag_rule_of_replace_answer_with_gt():
    text = "<think>\nwork\n</think>\nSo <answer>\n 41 </answer> done"
    new, span = replace_answer(text, "42")
    assert new == "<think>\nwork\n</think>\nSo <answer>\n 42 </answer>"  # leading whitespace kept, tail dropped
    assert new[span[0] : span[1]] == "42"
    assert replace_answer("x <answer>7</answer>", "8")[0] == "x <answer> 8 </answer>"  # no whitespace: one space
    assert replace_answer("no tags", "8")[1] is None
    assert replace_answer("<answer> \n", "8")[1] is None  # nothing after <answer>: invalid
    assert replace_answer("<answer> </answer>", "8")[0] == "<answer> 8 </answer>"  # theirs: '</answer>' is text
    assert replace_answer("<answer>1</answer><answer>2</answer>", "8")[1] is None
    assert answer_format_ok("a <answer>1</answer>") == 1.0 and answer_format_ok("a <answer>1") == 0.0


def test_the_boxed_rule_and_the_gt_tokens():
    new, span = replace_answer("so \\boxed{\\frac{1}{2}} end \\boxed{3}.", "4", "boxed")
    assert new == "so \\boxed{\\frac{1}{2}} end \\boxed{4}." and new[span[0] : span[1]] == "4"
    assert replace_answer("\\boxed{\\frac{1}{2}}", "0.5", "boxed")[0] == "\\boxed{0.5}"
    assert replace_answer("\\boxed{3", "4", "boxed")[1] is None
    assert answer_format_ok("\\boxed{3}", "boxed") == 1.0 and answer_format_ok("3", "boxed") == 0.0
    offsets = [(0, 3), (3, 5), (5, 9), (9, 10)]
    assert gt_token_positions(offsets, (4, 6)) == [1, 2]  # every token overlapping the GT's characters


# ---------------------------------------------------------------- the teachers column
def test_teachers_are_sorted_by_quality_and_capped():
    teachers = [
        {"content": c, "source": s, "quality_score": q} for c, s, q in (("a", "A", 1), ("b", "B", 3), ("c", "C", 2))
    ]
    assert [t["source"] for t in sorted_teachers(teachers, AmpoKnobs())] == ["B", "C", "A"]
    long_ = AmpoKnobs(length_strategy="long", max_teachers=2)
    assert [t["source"] for t in sorted_teachers(teachers, long_)] == ["A", "C"]
    assert sorted_teachers(None, AmpoKnobs()) == []


def test_a_bad_teachers_row_is_named(tmp_path):
    import pandas as pd
    from types import SimpleNamespace

    good = [{"content": "x", "source": "R1", "quality_score": 1.0}]
    path = str(tmp_path / "t.parquet")
    bad = [{"content": None, "source": "R1", "quality_score": 1.0}]
    pd.DataFrame({"prompt": ["p", "q", "r"], "targets": [good, None, bad]}).to_parquet(path)
    sections = SimpleNamespace(knobs=AmpoKnobs())
    why = check_teachers_column(path, sections)
    assert why is not None and "row 2" in why and "'targets'" in why and "content" in why
    sections = SimpleNamespace(knobs=AmpoKnobs(teachers_key="teachers"))
    assert "no column 'teachers'" in check_teachers_column(path, sections)
    assert teacher_problem("text") is not None and teacher_problem(good) is None
    assert "some teachers only" in teacher_problem(good + [{"content": "y"}])


def test_the_rehearsal_transform_makes_one_teacher_per_target_message():
    records = [{"target": [{"role": "assistant", "content": "sol"}]}, {"target": None}]
    out = add_teachers(records, "f")
    assert out[0]["targets"] == [{"content": "sol", "source": "target0", "quality_score": 1.0}]
    assert out[1]["targets"] is None and teacher_problem(out[0]["targets"]) is None


def test_the_knob_defaults_are_the_authors():
    k = AmpoKnobs()
    assert (k.n_guides, k.max_teachers, k.length_strategy, k.format_coef, k.score_threshold, k.clip_ratio_c) == (
        2,
        4,
        "short",
        0.1,
        0.0,
        10.0,
    )


# ---------------------------------------------------------------- the hook on a hand-made batch
class _RecordingActor:
    """A worker group whose actor gives every token of forward row i the log-prob −c_i, c_i = ``costs[i]``."""

    def __init__(self, costs):
        self.costs, self.data = costs, None

    def compute_log_prob(self, data):
        from verl.protocol import DataProto

        self.data = data
        rows, width = data.batch["responses"].shape
        lps = torch.stack([torch.full((width,), -self.costs[i % len(self.costs)]) for i in range(rows)])
        return DataProto.from_dict(tensors={"old_log_probs": lps})


def _group(tokenizer, n=4, P=16, L=40):
    import numpy as np

    from verl.protocol import DataProto

    prompt = tokenizer("What is 2+2?", add_special_tokens=False)["input_ids"]
    ids = torch.full((n, P + L), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, P + L), dtype=torch.long)
    ids[:, P - len(prompt) : P] = torch.tensor(prompt)
    mask[:, P - len(prompt) : P] = 1
    ids[:, P : P + 3] = 7  # a 3-token wrong answer
    mask[:, P : P + 3] = 1
    teachers = [
        {"content": "<think>\nhmm\n</think>\n\\boxed{5}", "source": "weak", "quality_score": 1.0},
        {"content": "<think>\n2+2\n</think>\n\\boxed{4}", "source": "strong", "quality_score": 0.5},
    ]
    batch = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "responses": ids[:, P:].clone(),
            "prefix_mask": torch.zeros((n, L), dtype=torch.bool),
            "token_level_scores": torch.zeros((n, L)),
        },
        non_tensors={
            "uid": np.array(["g"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": "4"}] * n, dtype=object),
            "targets": np.array([teachers] * n, dtype=object),
        },
    )
    return batch, L


def _hook(tokenizer, wg, L, **knobs):
    from types import SimpleNamespace

    from luffy_pool.methods.ampo import AmpoGuidance

    sections = SimpleNamespace(
        data=SimpleNamespace(reward_impl_version=3),
        workers=SimpleNamespace(rollout=SimpleNamespace(min_prefix_ratio=1.0, max_prefix_ratio=1.0)),
        trainer=SimpleNamespace(seed=5),
    )
    context = SimpleNamespace(
        sections=sections, wg=wg, tokenizer=tokenizer, world_size=1, response_length=L, knobs=AmpoKnobs(**knobs)
    )
    return AmpoGuidance(context)


def test_the_hook_scores_the_gt_tokens_and_writes_the_ranked_teachers(tiny_model_dir):
    from verl.utils.tokenizer import hf_tokenizer

    tok = hf_tokenizer(tiny_model_dir)
    batch, L = _group(tok)
    # the quality sort puts "weak" first; the forward makes "strong" (c = 0.1) better than "weak" (c = 2)
    wg = _RecordingActor([2.0, 0.1])
    hook = _hook(tok, wg, L, answer_format="boxed")
    metrics = hook.after_score(batch, step=1)
    # the forward: prompt ++ teacher-with-GT ++ EOS; the GT tokens decode to the ground truth
    sent = wg.data.batch["responses"]
    for row, expect in ((0, "\\boxed{4}"), (1, "\\boxed{4}")):
        text = tok.decode(sent[row][sent[row] != tok.pad_token_id].tolist())
        assert expect in text and "5" not in text.split("</think>")[-1]
    weak_b, weak = comprehension_score(torch.full((1,), -2.0), 1.0)
    strong_b, strong = comprehension_score(torch.full((1,), -0.1), 1.0)
    assert metrics["ampo/teacher_scoreB"] == pytest.approx((weak_b + strong_b) / 2)
    assert metrics["ampo/guided_rows"] == 2 and metrics["ampo/guided_groups"] == 1.0
    # the slots theirs would choose (same seed, same draws), the teacher of each by j mod len(avail)
    slots = assign_teachers(list(range(4)), 2, random.Random(5))
    ranked = ["strong", "weak"]
    t = batch.batch
    for row in range(4):
        text = tok.decode(t["responses"][row][t["attention_mask"][row, -L:].bool()].tolist())
        if row in slots:
            answer = "\\boxed{4}" if ranked[slots[row]] == "strong" else "\\boxed{5}"
            assert text.endswith(answer + tok.eos_token), text
            assert t["prefix_mask"][row].sum() == t["attention_mask"][row, -L:].sum()
            assert t["token_level_scores"][row].sum() == 1.0
        else:
            assert not t["prefix_mask"][row].any() and t["token_level_scores"][row].sum() == 0.0
    assert hook.state_dict()["usage"] == {"strong": 1, "weak": 1}


def test_the_hook_leaves_a_group_with_a_success_alone_and_resumes_its_draw(tiny_model_dir):
    from verl.utils.tokenizer import hf_tokenizer

    tok = hf_tokenizer(tiny_model_dir)
    batch, L = _group(tok)
    batch.batch["token_level_scores"][3, 2] = 1.0
    wg = _RecordingActor([1.0])
    hook = _hook(tok, wg, L)
    before = batch.batch["responses"].clone()
    assert hook.after_score(batch, step=1)["ampo/guided_rows"] == 0 and wg.data is None
    assert torch.equal(before, batch.batch["responses"])
    state = hook.state_dict()
    other = _hook(tok, wg, L)
    other.load_state_dict(state)
    assert other.rng.random() == hook.rng.random()


def test_the_memory_plan_counts_the_comprehension_forward():
    from luffy_pool.memory_plan.method_extras import method_inputs
    from types import SimpleNamespace

    sections = SimpleNamespace(algorithm=SimpleNamespace(method="ampo"), knobs=AmpoKnobs())
    assert method_inputs(sections, sp=1)["metric_pass"] == "log-prob: AMPO teacher comprehension (actor)"
