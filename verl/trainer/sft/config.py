"""Config of the SFT trainer: its keys declared once (the sections below), composed with Hydra and checked
against them; defaults and comments in verl/trainer/config/sft_trainer.yaml.

Command-line overrides are checked before Hydra sees them, so an unknown key fails with the closest
valid key named (difflib) instead of Hydra's struct error; a composed or hand-built config is checked
again (keys, types, allowed values, bounds: verl/utils/config_section.py) before any process group or model is
created. Every problem is one line naming its key.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, Union

from omegaconf import DictConfig

from verl.utils import config_schema
from verl.utils.config_section import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    Bound,
    Declaration,
    declarations,
    key,
    nested,
    range_errors,
    structure_errors,
    values_of,
)
from verl.workers.config_sections import ATTN_IMPLEMENTATIONS, BETAS, DTYPES, step_impls

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")
CONFIG_NAME = "sft_trainer"

_OFF_OR_AT_LEAST_ONE = Bound(lambda v: v == -1 or v >= 1, "must be -1 (off) or >= 1")
_PATHS = Bound(
    lambda v: not isinstance(v, list) or (v and all(isinstance(f, str) for f in v)),
    "must be a path or a non-empty list of paths",
    "'{key}' {message}, got {value!r}",
)


@dataclass(frozen=True)
class SFTDataSection:
    train_files: Union[str, list] = key(bounds=_PATHS)
    val_files: Union[str, list, None] = key(bounds=_PATHS)
    prompt_key: str
    response_key: str
    max_length: int = key(bounds=AT_LEAST_ONE)
    truncation: str = key(choices=("error", "left", "right"))
    train_batch_size: int = key(bounds=AT_LEAST_ONE)
    micro_batch_size_per_gpu: int = key(bounds=AT_LEAST_ONE)
    strip_think_prefix: bool = key()
    shuffle: bool = key()


@dataclass(frozen=True)
class SFTFSDPSection:
    param_dtype: str = key(choices=("auto",) + DTYPES)
    reduce_dtype: str = key(choices=DTYPES)
    param_offload: bool = key()
    reshard_after_forward: bool = key()


@dataclass(frozen=True)
class SFTModelSection:
    path: str
    trust_remote_code: bool
    enable_gradient_checkpointing: bool
    attn_implementation: str = key(choices=ATTN_IMPLEMENTATIONS)
    loss_chunk_tokens: int = key(bounds=AT_LEAST_ONE)
    fsdp_config: SFTFSDPSection = nested(SFTFSDPSection)


@dataclass(frozen=True)
class SFTOptimSection:
    lr: float = key(bounds=POSITIVE)
    betas: list = key(bounds=BETAS)
    weight_decay: float = key(bounds=NON_NEGATIVE)
    warmup_steps_ratio: float = key(bounds=UNIT)
    warmup_style: str = key(choices=("cosine", "constant"))
    min_lr_ratio: float = key(bounds=UNIT)
    clip_grad: float = key(bounds=POSITIVE)
    step_impl: str = key(choices=step_impls)


@dataclass(frozen=True)
class SFTTrainerSection:
    device: str = key(choices=("auto", "cpu", "cuda"))
    total_epochs: int = key(bounds=AT_LEAST_ONE)
    total_training_steps: Optional[int] = key(bounds=AT_LEAST_ONE)
    default_local_dir: str = key()
    save_freq: int = key(bounds=_OFF_OR_AT_LEAST_ONE)
    save_on_signal: bool = key()
    test_freq: int = key(bounds=_OFF_OR_AT_LEAST_ONE)
    logger: Union[list, str] = key(choices=values_of("verl.utils.tracking", "SUPPORTED_BACKENDS"))
    project_name: str = key()
    experiment_name: str = key()
    seed: int = key()
    progress_bar: bool = key()


@dataclass(frozen=True)
class SFTConfigSections:
    """The SFT trainer's config groups (verl/trainer/config/sft_trainer.yaml)."""

    data: SFTDataSection = nested(SFTDataSection)
    model: SFTModelSection = nested(SFTModelSection)
    optim: SFTOptimSection = nested(SFTOptimSection)
    trainer: SFTTrainerSection = nested(SFTTrainerSection)


@functools.lru_cache(maxsize=1)
def declared() -> dict[str, Declaration]:
    """Dotted key -> declaration of every SFT config key."""
    return {d.key: d for d in declarations(SFTConfigSections)}


class ConfigError(config_schema.SchemaConfigError):
    """Invalid SFT config; ``errors`` holds one line per problem."""


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict[str, Any]:
    """Dotted key -> YAML default (unresolved) of every config leaf (Hydra's own nodes excluded)."""
    return dict(
        config_schema.walk(config_schema.load_yaml_tree(os.path.join(CONFIG_DIR, f"{CONFIG_NAME}.yaml"), resolve=False))
    )


def suggest_key(key: str) -> Optional[str]:
    """The valid key closest to ``key``: same last component first, then the whole dotted name."""
    return config_schema.suggest_key(key, list(declared()), leaf_cutoff=0.6)


def unknown_key_message(key: str) -> str:
    return config_schema.unknown_key_message(key, suggest_key(key))


def check_override_keys(overrides: Iterable[str]) -> list[str]:
    """Validate ``key=value`` overrides against the YAML; returns them with ``+``/``++`` on known keys removed.

    Hydra's own keys (``hydra.*``) pass through. Raises ConfigError listing every unknown key.
    """
    # Deletions and package overrides go to Hydra as written; validate_sft_config then reports what they did.
    return config_schema.prepare_overrides(
        overrides,
        classify=lambda key: "schema" if key in declared() else None,
        unknown_message=lambda key, plus: unknown_key_message(key),
        error_cls=ConfigError,
        allow_delete_and_package=True,
    )


def compose_sft_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The YAML with ``key=value`` overrides applied by Hydra (unresolved), for in-process runs."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    prepared = check_override_keys(overrides)
    # An enclosing Hydra app (e.g. an experiment script) keeps its own state.
    backup = get_gh_backup() if GlobalHydra.instance().is_initialized() else None
    if backup is not None:
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            return compose(CONFIG_NAME, overrides=prepared)
    finally:
        if backup is not None:
            restore_gh_from_backup(backup)


def validate_sft_config(config: Union[DictConfig, dict]) -> list[str]:
    """Every problem of a config, one line each naming the key (empty = valid)."""
    values, schema = dict(config_schema.walk(config_schema.resolved_tree(config, ConfigError))), declared()
    errors = structure_errors(values, schema, schema.__contains__, unknown_key_message, f"{CONFIG_NAME}.yaml")
    return errors or range_errors(values, schema, schema_defaults())


def check_sft_config(config: Union[DictConfig, dict]) -> None:
    errors = validate_sft_config(config)
    if errors:
        raise ConfigError(errors)


def batch_plan(train_batch_size: int, micro_batch_size_per_gpu: int, world_size: int) -> tuple[int, int]:
    """(rows per rank, micro-batches per rank) of one optimizer step; ConfigError when they do not divide."""
    if train_batch_size % world_size:
        raise ConfigError(
            [f"'data.train_batch_size'={train_batch_size} must be divisible by the world size {world_size}"]
        )
    per_rank = train_batch_size // world_size
    if per_rank % micro_batch_size_per_gpu:
        raise ConfigError(
            [
                f"'data.micro_batch_size_per_gpu'={micro_batch_size_per_gpu} must divide the "
                f"{per_rank} rows per rank (data.train_batch_size={train_batch_size} / {world_size} ranks)"
            ]
        )
    return per_rank, per_rank // micro_batch_size_per_gpu
