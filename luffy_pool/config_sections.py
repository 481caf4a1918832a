"""Typed, read-only views of config sections (``trainer``, ``data``, the actor's loss keys), built once from the
validated config.

Readers use attributes (``sections.trainer.seed``) instead of ``config.trainer.get("seed", 1)``: a misspelt
name raises AttributeError instead of silently taking a restated default (review C2). The dataclasses state
names and types only; every value, default included, comes from the composed config, i.e. from
mix_ppo_trainer.yaml (tests/luffy_pool/test_config_sections.py keeps the fields and the YAML in step). The
only defaults written here are those of the optional ``+trainer.*`` keys, which the YAML cannot hold
(config_check.OPTIONAL_KEYS).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from verl.utils.config_section import build_section, nested
from verl.workers.config_sections import WorkerSections


def _build(cls, config, name: str, section=None):
    return build_section(cls, config[name] if section is None else section, name)


@dataclass(frozen=True)
class TrainerSection:
    """``trainer.*`` (meanings: the comments next to each key in mix_ppo_trainer.yaml)."""

    device: str
    bundle_resources: str
    cpu_bind: str
    memory_plan: str  # issue 23: warn | error | off (luffy_pool.memory_plan before the workers load)
    total_epochs: int
    total_training_steps: Optional[int]
    stop_one_step_early: bool
    project_name: str
    experiment_name: str
    logger: Any
    nnodes: int
    n_gpus_per_node: int
    save_freq: int
    test_freq: int
    critic_warmup: int
    default_hdfs_dir: Optional[str]
    default_local_dir: str
    resume_mode: str
    resume_from_path: Any  # a path, or False / None for none
    max_optim_to_keep: Optional[int]
    max_actor_ckpt_to_keep: Optional[int]
    checkpoint_checksums: bool
    save_on_signal: bool
    balance_batch: bool
    seed: int
    save_hf_on_save: bool
    val_generations_to_log: int
    rollout_data_dir: Optional[str]
    rejection_sample: bool
    rejection_sample_multiplier: int
    debug: bool
    add_full_target_when_none: bool
    skip_valid_mask: bool
    acc_rebatch: bool
    skip_by_step: bool
    # Optional `+trainer.` keys (not in the YAML): LUFFY's validate-before-training and validate-only switches.
    val_before_train: bool = True
    val_only: bool = False

    @classmethod
    def from_config(cls, config) -> "TrainerSection":
        return _build(cls, config, "trainer")


@dataclass(frozen=True)
class SelfReplaySection:
    """``data.self_replay.*``: the buffer of the run's own correct rollouts (luffy_pool/replay_buffer.py)."""

    enable: bool
    capacity: int
    max_per_prompt: int
    eviction: str
    max_age: int
    selection: str
    slots: int


@dataclass(frozen=True)
class DataSection:
    """``data.*`` (meanings: the comments next to each key in mix_ppo_trainer.yaml)."""

    tokenizer: Optional[str]
    train_files: Any  # a path or a list of paths
    val_files: Any
    prompt_key: str
    target_key: str
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    val_batch_size: Optional[int]
    shuffle: bool
    seed: int
    reward_impl_version: int
    sample_target_ratio: float
    sample_target_mode: str
    filter_overlong_prompts: bool
    disable_truncation_advantage: bool
    truncate_off_policy: str
    off_policy_files: Any
    off_policy_id_key: str
    val_max_rows: Optional[int]
    dataloader_num_workers: int
    return_raw_input_ids: bool
    return_raw_chat: bool
    filter_targets: bool
    filter_accuracy: bool
    accuracy_lower_bound: float
    accuracy_upper_bound: float
    add_tgt_with_acc: bool
    add_tgt_acc_upper_bound: float
    self_replay: SelfReplaySection = nested(SelfReplaySection)

    @classmethod
    def from_config(cls, config) -> "DataSection":
        return _build(cls, config, "data")


@dataclass(frozen=True)
class KLControlSection:
    """``algorithm.kl_ctrl``: the KL-in-reward controller."""

    type: str
    kl_coef: float
    target_kl: float
    horizon: int


@dataclass(frozen=True)
class AlgorithmSection:
    """``algorithm.*``: the advantage estimator and KL-in-reward."""

    gamma: float
    lam: float
    adv_estimator: str
    grpo_use_std: bool
    kl_penalty: str
    surprisal_base: float
    kl_ctrl: KLControlSection = nested(KLControlSection)

    @classmethod
    def from_config(cls, config) -> "AlgorithmSection":
        return _build(cls, config, "algorithm")


@dataclass(frozen=True)
class DriverActorSection:
    """The ``actor_rollout_ref.actor`` keys the driver reads (which passes to schedule, the advantage's SFT
    prefix reward, the behaviour log-prob column); the workers read theirs through WorkerSections."""

    use_kl_loss: bool
    recompute_old_log_prob: str
    use_sft_prefix_reward: bool
    sft_prefix_reward_weight: float
    use_off_policy_probs: bool

    @classmethod
    def from_config(cls, config) -> "DriverActorSection":
        return _build(cls, config, "actor_rollout_ref.actor", section=config.actor_rollout_ref.actor)


@dataclass(frozen=True)
class RayInitSection:
    """``ray_init.*``: which Ray instance the driver joins or starts."""

    address: Optional[str]
    num_cpus: Optional[int]
    max_direct_call_object_size: Optional[int]

    @classmethod
    def from_config(cls, config) -> "RayInitSection":
        return _build(cls, config, "ray_init")


@dataclass(frozen=True)
class ConfigSections:
    """The typed sections of one run config; build once (``ConfigSections.from_config``) and pass around.
    ``workers`` is what every worker builds from ``actor_rollout_ref`` (model, actor, ref, rollout)."""

    trainer: TrainerSection
    data: DataSection
    algorithm: AlgorithmSection
    actor: DriverActorSection
    workers: WorkerSections
    ray_init: RayInitSection

    @classmethod
    def from_config(cls, config) -> "ConfigSections":
        return cls(trainer=TrainerSection.from_config(config), data=DataSection.from_config(config),
                   algorithm=AlgorithmSection.from_config(config), actor=DriverActorSection.from_config(config),
                   workers=WorkerSections.from_config(config.actor_rollout_ref),
                   ray_init=RayInitSection.from_config(config))


@dataclass(frozen=True)
class LossSection:
    """The ``actor_rollout_ref.actor`` keys that choose and parametrise the policy loss (luffy_pool/loss_config.py,
    mix_actor.py). A subset of the actor section: every field is an actor key of the YAML."""

    policy_loss: str
    use_off_policy_loss: bool
    use_sft_multitask_loss: bool
    use_off_policy_probs: bool
    use_ppo_kl_loss: bool
    ppo_kl_loss_coef: float
    use_adaptive_temperature: bool
    use_adaptive_temperature_fixed: bool
    alpha_lr: float
    adaptive_temperature_clip: float
    adaptive_temperature_target_entropy: float
    entropy_coeff: float
    clip_ratio: float
    clip_upper_bound: float
    loss_remove_token_mean: bool
    loss_remove_clip: bool
    off_policy_cliprange: Optional[float]
    off_policy_normalize: bool
    off_policy_max_clip: float
    off_policy_min_clip: float
    all_max_clip: float
    off_policy_loss_coef: float
    off_policy_reshape: str
    off_policy_reshape_weight: float
    off_policy_reshape_pow_exp: float
    on_policy_reshape: str
    on_policy_reshape_weight: float
    on_policy_reshape_pow_exp: float
    sft_loss_coef: float

    @classmethod
    def from_actor_config(cls, actor_cfg) -> "LossSection":
        """From the ``actor_rollout_ref.actor`` group itself (what the actor worker holds)."""
        return _build(cls, None, "actor_rollout_ref.actor", section=actor_cfg)
