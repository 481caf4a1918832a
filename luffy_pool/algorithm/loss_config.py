"""Which registered policy loss a run uses, and the config section it reads.

Every policy loss in ``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY`` is ``fn(inputs, cfg) -> (loss,
metrics)`` (verl/trainer/ppo/loss_inputs.py): ``inputs`` holds this micro-batch's tensors, ``cfg`` is read
by attribute. A loss registered with ``config=<dataclass>`` gets that dataclass built from the
``actor_rollout_ref.actor`` group; any other gets the actor's ``LossSection``. Adding a loss is one function
with ``@register_policy_loss("name")`` (``config=<dataclass>`` for knobs of its own) and ``actor.policy_loss=name``.
"""
from __future__ import annotations

from luffy_pool.config.sections import LossSection
from verl.trainer.ppo.core_algos import get_policy_loss_config, get_policy_loss_fn
from verl.utils.config_section import build_section


def policy_loss_name(loss: LossSection) -> str:
    """``actor.policy_loss``, or with ``auto`` the loss LUFFY's switches select: ``luffy_token``
    (use_off_policy_loss), ``sft_multitask`` (use_sft_multitask_loss), else ``vanilla`` (PPO clip)."""
    name = loss.policy_loss or "auto"
    if name != "auto":
        return str(name)
    if loss.use_off_policy_loss:
        return "luffy_token"
    if loss.use_sft_multitask_loss:
        return "sft_multitask"
    return "vanilla"


def policy_loss_section(actor_cfg, name: str, loss_section: LossSection | None = None):
    """The ``cfg`` the loss ``name`` is called with: its registered knob dataclass built from the actor group,
    else the actor's ``LossSection`` (``loss_section`` when the caller has built it already). An unknown name
    raises ValueError naming the registered ones."""
    get_policy_loss_fn(name)
    knobs = get_policy_loss_config(name)
    if knobs is None:
        return loss_section if loss_section is not None else LossSection.from_actor_config(actor_cfg)
    return build_section(knobs, actor_cfg, "actor_rollout_ref.actor")
