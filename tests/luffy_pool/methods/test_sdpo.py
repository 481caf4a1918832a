"""SDPO (luffy_pool/methods/sdpo.py) against TRL 1.16.0, the reference it follows.

Reference values: a scratch script outside the project ran TRL 1.16.0's functions (PyPI wheel, installed with
``pip install --target``; float64) on the inputs below: ``trl/experimental/sdpo/loss_utils.py`` (= sdft's)
``compute_sampled_token_self_distillation_loss`` (lines 114-135) and ``apply_importance_sampling_clipping``
(56-65), then the aggregation of ``sdpo_trainer.py`` ``_compute_self_distillation_loss`` (lines 1252-1255), and
``SDPOTrainer._compute_policy_loss`` (lines 1145-1184) called on a stand-in trainer (epsilon 0.2, max completion
length 3). Their functions take logits; the scratch script fed two-token logits ``[ℓ, log(1 − e^ℓ)]`` whose
log-softmax at token 0 is the per-token log-prob given here. The spec's section-6 values (METHODS_SPEC_2026.md) are
checked too.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from luffy_pool.methods.loss_inputs import FamilyLossInputs
from luffy_pool.methods.sdpo import (
    SdpoKnobs,
    SiblingTeacher,
    is_clipped,
    policy_loss,
    sampled_token_loss,
    sdpo_loss,
    teacher_demo_rows,
)
from tests.helpers.float_compare import assert_float_close
from tests.helpers.sections import loss_section

D = torch.float64
# the toy: 2 rows x 3 tokens (row 0's last token is padding)
STUDENT = torch.tensor([[-0.5, -1.2, -0.1], [-2.0, -0.3, -0.7]], dtype=D)
TEACHER = torch.tensor([[-0.4, -2.0, -0.3], [-1.0, -0.2, -1.5]], dtype=D)
OLD = torch.tensor([[-0.6, -1.0, -0.1], [-2.5, -0.3, -0.2]], dtype=D)
MASK = torch.tensor([[1.0, 1, 0], [1, 1, 1]], dtype=D)
ADV = torch.tensor([0.8, -0.5], dtype=D)
# TRL: sampled-token loss then IS clip (cap 2) per token
THEIR_PER_TOKEN = [
    [0.05525854590378236, -0.7859815229548627, -0.02000000000000001],
    [3.2974425414002564, 0.030000000000000013, -0.3396571694390747],
]
# TRL's aggregation with self_distillation_mask [1, 1] and [0, 1]: (loss, logged token-mean distill loss)
THEIR_DISTILL = {
    (1.0, 1.0): (0.3152834843974268, 0.4514124789820203),
    (0.0, 1.0): (0.4979642286601969, 0.9959284573203938),
}
THEIR_POLICY = {
    "dapo": 0.037047859685432116,
    "bnpo": 0.037047859685432116,
    "grpo": -0.09738689500571523,
    "dr_grpo": 0.030873216404526765,
}


def _inputs(row_mask, log_prob=STUDENT):
    return FamilyLossInputs(
        log_prob=log_prob,
        old_log_prob=OLD,
        advantages=ADV.unsqueeze(1).expand(2, 3),
        response_mask=MASK,
        settings=loss_section(clip_ratio=0.2),
        method_batch={"teacher_log_probs": TEACHER, "teacher_mask": torch.tensor(row_mask, dtype=D)},
    )


@pytest.mark.golden
def test_sampled_token_loss_and_is_clip_match_trl():
    per_token = is_clipped(sampled_token_loss(STUDENT, TEACHER), STUDENT, OLD, 2.0)
    assert_float_close(per_token, torch.tensor(THEIR_PER_TOKEN, dtype=D))


@pytest.mark.golden
def test_spec_section_6_values():
    """Student logits [[2,1,0,-1],[0.5,0.5,0,0]], teacher [[1,2,0,-1],[0,1,0.5,-0.5]], ids [0, 1]: per-token value
    [-0.440190, 0.443412]; IS clip of [0.4, 0.3] with Δℓ [0.9, -0.1], cap 2: [0.8, 0.271451]."""
    s = torch.tensor([[2.0, 1, 0, -1], [0.5, 0.5, 0, 0]], dtype=D).log_softmax(-1)
    t = torch.tensor([[1.0, 2, 0, -1], [0, 1, 0.5, -0.5]], dtype=D).log_softmax(-1)
    ids = torch.tensor([[0], [1]])
    value = sampled_token_loss(s.gather(-1, ids).squeeze(-1), t.gather(-1, ids).squeeze(-1))
    assert value.tolist() == pytest.approx([-0.440190, 0.443412], abs=5e-7)
    clipped = is_clipped(
        torch.tensor([0.4, 0.3], dtype=D), torch.tensor([0.9, -0.1], dtype=D), torch.zeros(2, dtype=D), 2
    )
    assert clipped.tolist() == pytest.approx([0.8, 0.271451], abs=5e-7)


@pytest.mark.golden
@pytest.mark.parametrize("row_mask", sorted(THEIR_DISTILL))
def test_distillation_loss_matches_trl(row_mask):
    """w = 1: the loss is TRL's per-sequence mean over the rows (a row without a teacher counts with 0)."""
    loss, metrics = sdpo_loss(_inputs(list(row_mask)), SdpoKnobs(), step=0)
    expected, token_mean = THEIR_DISTILL[row_mask]
    assert_float_close(loss, torch.tensor(expected, dtype=D))
    assert metrics["sdpo/distill_loss"].item() == pytest.approx(token_mean, rel=1e-12)
    assert "sdpo/policy_loss" not in metrics  # their compute_loss skips the policy term at w = 1


@pytest.mark.golden
@pytest.mark.parametrize("loss_type", sorted(THEIR_POLICY))
def test_policy_loss_matches_trl(loss_type):
    got = policy_loss(STUDENT, OLD, ADV, MASK, 0.2, loss_type)
    assert_float_close(got, torch.tensor(THEIR_POLICY[loss_type], dtype=D))


@pytest.mark.golden
def test_weighted_total_and_the_gradient_is_reverse_kls():
    """(1 − w)·policy + w·distill; w = 0 is the policy term alone. The distillation term's gradient per token is
    sg[ℓ − ℓ^T]·ratio / Σmask / rows (the score form of reverse KL)."""
    knobs = SdpoKnobs(distillation_weight=0.25)
    loss, metrics = sdpo_loss(_inputs([1.0, 1.0]), knobs, step=0)
    expected = 0.75 * THEIR_POLICY["dapo"] + 0.25 * THEIR_DISTILL[(1.0, 1.0)][0]
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["sdpo/policy_loss"].item() == pytest.approx(THEIR_POLICY["dapo"], rel=1e-12)
    loss0, _ = sdpo_loss(_inputs([1.0, 1.0]), SdpoKnobs(distillation_weight=0.0), step=0)
    assert loss0.item() == pytest.approx(THEIR_POLICY["dapo"], rel=1e-12)
    lp = STUDENT.clone().requires_grad_(True)
    distill, _ = sdpo_loss(_inputs([1.0, 1.0], lp), SdpoKnobs(), step=0)
    distill.backward()
    ratio = torch.exp(STUDENT - OLD).clamp(max=2.0)
    grad = (STUDENT - TEACHER) * ratio * MASK / MASK.sum(-1, keepdim=True) / 2
    assert_float_close(lp.grad, grad)


def test_the_loss_reaches_the_actor_with_the_teacher_batch_keys():
    """method_policy_loss (the actor's path) hands the hook's batch keys to the loss; without them it refuses."""
    from luffy_pool.methods import MethodSelection
    from luffy_pool.methods.losses import method_policy_loss
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    actor = SimpleNamespace(
        policy_loss="sdpo",
        policy_loss_fn=get_policy_loss_fn("sdpo"),
        policy_loss_cfg=None,
        method_selection=MethodSelection("sdpo", SdpoKnobs(), 0.0),
        update_config=SimpleNamespace(loss=loss_section()),
        batch_sizes=SimpleNamespace(),
        extra_policy_loss=lambda out, metrics: None,
    )
    micro = {
        "old_log_probs": OLD,
        "advantages": ADV.unsqueeze(1).expand(2, 3),
        "prefix_mask": torch.zeros(2, 3, dtype=torch.bool),
        "teacher_log_probs": TEACHER,
        "teacher_mask": torch.tensor([0.0, 1.0], dtype=D),
    }
    loss, metrics = method_policy_loss(actor, micro, STUDENT, torch.zeros_like(STUDENT), MASK, 1, None)
    assert loss.item() == pytest.approx(THEIR_DISTILL[(0.0, 1.0)][0], rel=1e-12)
    assert metrics["actor/sdpo/teacher_rows"] == 0.5
    del micro["teacher_log_probs"]
    with pytest.raises(ValueError, match="teacher_log_probs"):
        method_policy_loss(actor, micro, STUDENT, torch.zeros_like(STUDENT), MASK, 1, None)


def test_teacher_demo_rows_follow_their_mining_loop():
    """Per row: the first other row of its group with score >= threshold (their SuccessfulRolloutTeacherContextBuilder
    .build, dont_reprompt_on_self_success=True); groups by uid here."""
    scores = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5]
    uids = ["a", "a", "a", "a", "b", "b", "c", "c"]
    assert teacher_demo_rows(scores, uids, 1.0) == [2, 0, 0, 0, None, None, None, 6]
    assert teacher_demo_rows(scores, uids, 1.0, skip_self=False) == [0, 0, 0, 0, None, None, 6, 6]
    assert teacher_demo_rows(scores, uids, 0.5) == [2, 0, 0, 0, None, None, 7, 6]


class _Tokenizer:
    """Chat template ``role: content`` lines + the generation prompt; ids are characters."""

    pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def decode(self, ids, skip_special_tokens):
        return "".join(chr(i) for i in ids)


def test_the_teacher_prompt_is_their_reprompt_template():
    """'{prompt}\\nCorrect solution:\\n\\n{attempt}\\n\\n\\n\\nCorrectly solve the original question.\\n' in the last
    user message (system messages kept); the attempt is the sibling's response tokens without padding."""
    hook = SiblingTeacher.__new__(SiblingTeacher)
    hook.knobs, hook.tokenizer = SdpoKnobs(), _Tokenizer()
    hook.prompts = [[{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}]]
    responses = torch.tensor([[ord("x"), ord("y"), 0], [ord("4"), ord("2"), 0]])
    attention = torch.cat([torch.ones(2, 2, dtype=torch.long), torch.tensor([[1, 1, 0], [1, 1, 0]])], dim=1)
    batch = SimpleNamespace(batch={"responses": responses, "attention_mask": attention})
    text = hook.teacher_prompt(batch, 0, 0, {"demos": [1, None]})
    assert (
        text == "<system>S<user>Q?\nCorrect solution:\n\n42\n\n\n\nCorrectly solve the original question.\n<assistant>"
    )
    assert hook.teacher_prompt(batch, 1, 0, {"demos": [1, None]}) is None


def test_ema_update_and_its_checkpoint_state():
    """update_ref_ema: ref <- (1 − r)·ref + r·actor (spec: 1.0 toward 0 three times at 0.05 -> 0.857375); the
    reference shards round-trip through the checkpoint state, and another layout is refused."""
    from luffy_pool.workers.mix_fsdp_worker import MIXActorRolloutRefWorker
    from verl.workers.checkpoint_mixin import ModuleShardsState

    worker = SimpleNamespace(
        _is_actor=True,
        _is_ref=True,
        role="actor_rollout_ref",
        ref_module=torch.nn.Linear(2, 1, bias=False, dtype=D),
        actor_module=torch.nn.Linear(2, 1, bias=False, dtype=D),
    )
    with torch.no_grad():
        worker.ref_module.weight.fill_(1.0)
        worker.actor_module.weight.fill_(0.0)
    worker._ref_ema_pairs = lambda: MIXActorRolloutRefWorker._ref_ema_pairs(worker)
    for _ in range(3):
        MIXActorRolloutRefWorker.update_ref_ema(worker, 0.05)
    assert worker.ref_module.weight.flatten().tolist() == pytest.approx([0.857375, 0.857375], rel=1e-12)
    state = ModuleShardsState(worker.ref_module, "reference").state_dict()
    other = torch.nn.Linear(2, 1, bias=False, dtype=D)
    ModuleShardsState(other, "reference").load_state_dict(state)
    assert torch.equal(other.weight, worker.ref_module.weight)
    with pytest.raises(ValueError, match="reference shards"):
        ModuleShardsState(torch.nn.Linear(3, 1, bias=False), "reference").load_state_dict(state)
    worker.ref_module = torch.nn.Linear(3, 1, bias=False)
    with pytest.raises(ValueError, match="not sharded like the actor"):
        MIXActorRolloutRefWorker.update_ref_ema(worker, 0.05)


def test_knob_defaults_are_trls_sdpo_config():
    k = SdpoKnobs()
    assert (k.distillation_weight, k.success_threshold, k.dont_reprompt_on_self_success) == (1.0, 1.0, True)
    assert (k.distillation_mode, k.is_clip, k.teacher, k.ema_rate) == ("sampled_token", 2.0, "ema", 0.05)
    assert (k.loss_type, k.max_reprompt_len, k.remove_thinking_from_demonstration) == ("dapo", 10240, False)
    assert math.isclose(k.ema_rate, 0.05)


def test_logit_modes_are_refused_at_pre_flight(compose_config, luffy_overrides, tmp_path):
    from luffy_pool.config.check import prepare_overrides, validate_config
    from luffy_pool.methods import get_method

    base = [o for o in luffy_overrides("m", "d", str(tmp_path), steps=2) if "use_off_policy" not in o]
    preset = [f"{k}={v}" for k, v in get_method("sdpo").preset_keys().items()]
    config = compose_config(prepare_overrides(base + preset + ["algorithm.sdpo.distillation_mode=topk_logits"]))
    errors = validate_config(config)
    assert any("algorithm.sdpo.distillation_mode" in e and "topk_logits" in e for e in errors), errors
    ok = compose_config(prepare_overrides(base + preset))
    assert not [e for e in validate_config(ok) if "sdpo" in e]
