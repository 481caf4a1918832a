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

from dataclasses import MISSING, dataclass, fields
from typing import Any, Optional


def _build(cls, config, name: str, section=None):
    from omegaconf import OmegaConf

    section = config[name] if section is None else section
    present = set(section.keys())
    values = {}
    for f in fields(cls):
        if f.name in present:
            # A required key left unset (``???``, e.g. data.train_files in a driver-only test config) stays
            # ``???``: config_check refuses it before a run, and reading it eagerly here must not raise.
            values[f.name] = "???" if OmegaConf.is_missing(section, f.name) else section[f.name]
        elif f.default is MISSING:
            raise KeyError(f"{name}.{f.name} is missing from the config (compose it from "
                           f"luffy_pool/config/mix_ppo_trainer.yaml, which gives every key its default)")
    return cls(**values)


@dataclass(frozen=True)
class TrainerSection:
    """``trainer.*`` (meanings: the comments next to each key in mix_ppo_trainer.yaml)."""

    device: str
    bundle_resources: str
    cpu_bind: str
    total_epochs: int
    total_training_steps: Optional[int]
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
    filter_overlong_prompts: bool
    disable_truncation_advantage: bool
    truncate_off_policy: str
    off_policy_files: Any
    off_policy_id_key: str
    self_replay: Any  # the data.self_replay group, read by SelfReplayBuffer.from_config
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

    @classmethod
    def from_config(cls, config) -> "DataSection":
        return _build(cls, config, "data")


@dataclass(frozen=True)
class ConfigSections:
    """The typed sections of one run config; build once (``ConfigSections.from_config``) and pass around."""

    trainer: TrainerSection
    data: DataSection

    @classmethod
    def from_config(cls, config) -> "ConfigSections":
        return cls(trainer=TrainerSection.from_config(config), data=DataSection.from_config(config))


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
