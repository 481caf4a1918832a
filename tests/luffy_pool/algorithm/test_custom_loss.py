"""A user's policy loss with a knob of its own: one dataclass, one function, the public decorator, two training steps.

The loss scales verl's PPO loss by ``i26_pg_scale``, a key the YAML does not have: it is declared by the loss's
dataclass and set with ``+actor_rollout_ref.actor.i26_pg_scale=...``. In-process: the LUFFY actor on the tiny model
makes two optimizer steps with each of two knob values. End to end: this module is ``model.external_lib``, so
the driver and every Ray worker import it (and with it the registration), and the trainer runs 2 steps.
"""

import json
from dataclasses import dataclass

import pytest
import torch

from verl.trainer.ppo.core_algos import ppo_clip_loss, register_policy_loss

# golden and parity values of float arithmetic: CI runs this module again at a non-native ATen CPU capability
pytestmark = pytest.mark.golden

A = "actor_rollout_ref.actor"
LOSS = "i26_scaled_ppo"


@dataclass(frozen=True)
class ScaledPPOKnobs:
    """The keys the loss reads: three of the YAML's actor keys and its own knob (absent from the YAML)."""

    clip_ratio: float
    loss_remove_token_mean: bool
    loss_remove_clip: bool
    i26_pg_scale: float = 1.0


@register_policy_loss(LOSS, config=ScaledPPOKnobs)
def scaled_ppo_loss(inputs, cfg):
    """``i26_pg_scale`` x verl's PPO clip loss; reports the unscaled loss next to it."""
    pg_loss, metrics = ppo_clip_loss(inputs, cfg)
    return cfg.i26_pg_scale * pg_loss, {**metrics, "unscaled_pg_loss": pg_loss.detach()}


def _config(compose_config, scale):
    return compose_config(
        [
            "data.train_files=x",
            "data.val_files=null",
            "actor_rollout_ref.model.path=m",
            f"{A}.policy_loss={LOSS}",
            f"+{A}.i26_pg_scale={scale}",
            f"{A}.ppo_mini_batch_size=4",
            f"{A}.ppo_micro_batch_size=2",
            f"{A}.optim.lr=1e-2",
            f"{A}.use_kl_loss=False",
        ]
    )


def _two_steps(tiny_model_dir, actor_group):
    """Two update_policy calls (one optimizer step each) of the LUFFY actor on a fixed tiny batch."""
    from transformers import AutoModelForCausalLM

    from luffy_pool.workers.mix_actor import MIXDataParallelPPOActor
    from verl.protocol import DataProto

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    actor = MIXDataParallelPPOActor(actor_group, model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    g = torch.Generator().manual_seed(1)
    rows, prompt, resp = 4, 5, 6
    input_ids = torch.randint(3, model.config.vocab_size, (rows, prompt + resp), generator=g)
    attn = torch.ones(rows, prompt + resp, dtype=torch.long)
    batch = {
        "input_ids": input_ids,
        "attention_mask": attn,
        "position_ids": attn.cumsum(-1) - 1,
        "responses": input_ids[:, prompt:],
        "prefix_mask": torch.zeros(rows, resp, dtype=torch.bool),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1).expand(-1, resp).contiguous(),
    }
    data = DataProto.from_dict(
        tensors=batch, meta_info={"temperature": 1.0, "micro_batch_size": 2, "use_dynamic_bsz": False}
    )
    steps = []
    for _ in range(2):
        old, _ = actor.compute_log_prob(data)
        data.batch["old_log_probs"] = old
        steps.append(actor.update_policy(data))
    return actor, steps


def test_a_registered_loss_with_its_own_knob_trains_two_steps_in_process(tiny_model_dir, compose_config):
    from luffy_pool.config.check import validate_config

    config = _config(compose_config, 0.5)
    assert not [e for e in validate_config(config) if "i26_pg_scale" in e]  # a key the loss declares is known
    actor, steps = _two_steps(tiny_model_dir, config.actor_rollout_ref.actor)
    assert actor.policy_loss_cfg == ScaledPPOKnobs(
        clip_ratio=0.2, loss_remove_token_mean=False, loss_remove_clip=False, i26_pg_scale=0.5
    )
    assert len(steps) == 2 and all(len(s["actor/grad_norm"]) == 1 for s in steps)
    for s in steps:  # the knob reaches the loss: pg_loss = 0.5 x the unscaled loss, micro-batch by micro-batch
        assert s["actor/pg_loss"] == pytest.approx([0.5 * u for u in s["actor/unscaled_pg_loss"]], rel=1e-6)
    _, full = _two_steps(tiny_model_dir, _config(compose_config, 1.0).actor_rollout_ref.actor)
    # the same first step with scale 1: the same unscaled loss, twice the logged loss and a larger gradient
    assert full[0]["actor/unscaled_pg_loss"] == pytest.approx(steps[0]["actor/unscaled_pg_loss"], rel=1e-6)
    assert full[0]["actor/pg_loss"] == pytest.approx([2 * p for p in steps[0]["actor/pg_loss"]], rel=1e-6)
    assert full[0]["actor/grad_norm"][0] > steps[0]["actor/grad_norm"][0]


@pytest.mark.e2e
def test_a_registered_loss_with_its_own_knob_trains_two_steps_end_to_end(
    tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides
):
    from luffy_pool.run.launcher import build_trainer

    overrides = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), steps=2)
    config = compose_config(
        overrides
        + [
            f"{A}.use_off_policy_loss=False",
            f"{A}.policy_loss={LOSS}",
            f"+{A}.i26_pg_scale=0.5",
            f"actor_rollout_ref.model.external_lib={__name__}",
            # one entry per micro-batch for both losses (the token-weighted step
            # logs pg_loss as the optimizer's sum), so the factor holds entry by entry
            f"{A}.metric_aggregation=micro_batch_mean",
        ]
    )
    trainer, close = build_trainer(config)
    try:
        trainer.fit()
    finally:
        close()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # the workers built the loss's section with the override and called the registered loss
        assert r["actor/pg_loss"] == pytest.approx(0.5 * r["actor/unscaled_pg_loss"], rel=1e-5)
