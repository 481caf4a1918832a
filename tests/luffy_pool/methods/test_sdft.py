"""SDFT (luffy_pool/methods/sdft.py) against TRL 1.16.0, the reference it follows.

Reference values: a scratch script outside the project ran TRL 1.16.0's ``trl/experimental/sdft/loss_utils.py``
(PyPI wheel; float64) ``compute_sampled_token_self_distillation_loss`` (lines 114-135) and
``apply_importance_sampling_clipping`` (56-65) on the toy below (two-token logits ``[ℓ, log(1 − e^ℓ)]`` whose
log-softmax at token 0 is the per-token log-prob given here), then the aggregation of ``sdft_trainer.py``
``_compute_self_distillation_loss`` (lines 890-893: per-sequence mean, clamp 1, mean over rows). The teacher prompt
is ``DemonstrationTeacherContextBuilder`` (sdft_trainer.py 135-205) with ``SDFTConfig.teacher_prompt_template``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from luffy_pool.methods.loss_inputs import FamilyLossInputs
from luffy_pool.methods.sdft import DemonstrationTeacher, SdftKnobs, privileged_text, sdft_loss
from tests.helpers.float_compare import assert_float_close

D = torch.float64
STUDENT = torch.tensor([[-0.5, -1.2, -0.1], [-2.0, -0.3, -0.7]], dtype=D)
TEACHER = torch.tensor([[-0.4, -2.0, -0.3], [-1.0, -0.2, -1.5]], dtype=D)
OLD = torch.tensor([[-0.6, -1.0, -0.1], [-2.5, -0.3, -0.2]], dtype=D)
MASK = torch.tensor([[1.0, 1, 0], [1, 1, 1]], dtype=D)
# TRL: loss and logged token-mean distillation loss, IS clip 2 (their default) and off (distillation_is_clip=None)
THEIR_LOSS = {2.0: (0.3152834843974268, 0.4514124789820203), -1: (0.017499999999999988, 0.11200000000000002)}


def _inputs():
    return FamilyLossInputs(
        log_prob=STUDENT,
        old_log_prob=OLD,
        advantages=torch.zeros(2, 3, dtype=D),
        response_mask=MASK,
        method_batch={"teacher_log_probs": TEACHER, "teacher_mask": torch.ones(2, dtype=D)},
    )


@pytest.mark.golden
@pytest.mark.parametrize("is_clip", sorted(THEIR_LOSS))
def test_sdft_loss_matches_trl(is_clip):
    loss, metrics = sdft_loss(_inputs(), SdftKnobs(is_clip=is_clip), step=0)
    expected, token_mean = THEIR_LOSS[is_clip]
    assert_float_close(loss, torch.tensor(expected, dtype=D))
    assert metrics["sdft/distill_loss"].item() == pytest.approx(token_mean, rel=1e-12)


def test_privileged_context_as_their_builder_joins_it():
    assert privileged_text([{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]) == "a\nb"
    assert privileged_text("demo") == "demo"
    assert privileged_text(None) is None


def test_the_teacher_prompt_is_their_template():
    """'{prompt}\\n\\n{privileged_context}' in the last user message; a row without a target has no teacher."""
    tokenizer = SimpleNamespace(
        apply_chat_template=lambda messages, add_generation_prompt, tokenize: "|".join(
            f"{m['role']}:{m['content']}" for m in messages
        )
    )
    hook = DemonstrationTeacher.__new__(DemonstrationTeacher)
    hook.tokenizer = tokenizer
    hook.prompts = [[{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}]] * 2
    hook.targets = ["The answer is 4.", None]
    assert hook.teacher_prompt(None, 0, 0, {}) == "system:S|user:Q?\n\nThe answer is 4."
    assert hook.teacher_prompt(None, 0, 1, {}) is None


def test_knob_defaults_and_refusals(compose_config, luffy_overrides, tmp_path):
    """TRL SDFTConfig: teacher base, is_clip 2, EMA rate 0.05; its default topk_logits (and full_logits) are
    refused at pre-flight naming the key and the value."""
    from luffy_pool.config.check import prepare_overrides, validate_config
    from luffy_pool.methods import get_method

    k = SdftKnobs()
    assert (k.distillation_mode, k.is_clip, k.teacher, k.ema_rate) == ("sampled_token", 2.0, "base", 0.05)
    base = [o for o in luffy_overrides("m", "d", str(tmp_path), steps=2) if "use_off_policy" not in o]
    preset = [f"{k}={v}" for k, v in get_method("sdft").preset_keys().items()]
    for mode in ("topk_logits", "full_logits"):
        config = compose_config(prepare_overrides(base + preset + [f"algorithm.sdft.distillation_mode={mode}"]))
        errors = validate_config(config)
        assert any("algorithm.sdft.distillation_mode" in e and mode in e for e in errors), errors
    assert get_method("sdft").needs_demonstration
