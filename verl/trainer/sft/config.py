"""Config of the SFT trainer: composition with Hydra and validation against verl/trainer/config/sft_trainer.yaml.

Command-line overrides are checked before Hydra sees them, so an unknown key fails with the closest
valid key named (difflib) instead of Hydra's struct error; a composed or hand-built config is checked
again (keys, enum values, ranges) before any process group or model is created. Every problem is one
line naming its key.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from omegaconf import DictConfig

from verl.utils import config_schema
from verl.utils.config_schema import NONE_TYPE as _NONE

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")
CONFIG_NAME = "sft_trainer"

ENUMS = {
    "data.truncation": ("error", "left", "right"),
    "model.attn_implementation": ("auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3"),
    "model.fsdp_config.param_dtype": ("auto", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32"),
    "model.fsdp_config.reduce_dtype": ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32"),
    "optim.warmup_style": ("cosine", "constant"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.logger": ("console", "jsonl", "wandb", "tensorboard"),
}
# Types of keys whose YAML default (null or ???) does not say it.
EXPLICIT_TYPES = {
    "data.train_files": (str, list),
    "data.val_files": (str, list, _NONE),
    "model.path": (str,),
    "trainer.total_training_steps": (int, _NONE),
    "trainer.logger": (list, str),
    "optim.betas": (list,),
}
POSITIVE_INTS = ("data.max_length", "data.train_batch_size", "data.micro_batch_size_per_gpu",
                 "model.loss_chunk_tokens", "trainer.total_epochs", "trainer.total_training_steps")
MINUS_ONE_OR_POSITIVE = ("trainer.save_freq", "trainer.test_freq")


class ConfigError(config_schema.SchemaConfigError):
    """Invalid SFT config; ``errors`` holds one line per problem."""


def _walk(node: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf; lists and empty dicts are leaves."""
    return config_schema.walk(node, prefix)


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict[str, Any]:
    """Dotted key -> YAML default (unresolved) of every config leaf (Hydra's own nodes excluded)."""
    return dict(_walk(config_schema.load_yaml_tree(os.path.join(CONFIG_DIR, f"{CONFIG_NAME}.yaml"), resolve=False)))


def suggest_key(key: str) -> Optional[str]:
    """The valid key closest to ``key``: same last component first, then the whole dotted name."""
    return config_schema.suggest_key(key, list(schema_defaults()), leaf_cutoff=0.6)


def unknown_key_message(key: str) -> str:
    return config_schema.unknown_key_message(key, suggest_key(key))


def check_override_keys(overrides: Iterable[str]) -> list[str]:
    """Validate ``key=value`` overrides against the YAML; returns them with ``+``/``++`` on known keys removed.

    Hydra's own keys (``hydra.*``) pass through. Raises ConfigError listing every unknown key.
    """
    schema = schema_defaults()
    # Deletions and package overrides go to Hydra as written; validate_sft_config then reports what they did.
    return config_schema.prepare_overrides(
        overrides, classify=lambda key: "schema" if key in schema else None,
        unknown_message=lambda key, plus: unknown_key_message(key), error_cls=ConfigError,
        allow_delete_and_package=True)


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


_type_ok = config_schema.type_ok


def expected_types(key: str) -> tuple[type, ...]:
    return config_schema.expected_types(key, schema_defaults(), EXPLICIT_TYPES)


def to_plain_dict(config: Union[DictConfig, dict]) -> dict:
    """Resolved plain container of a config (Hydra's own node dropped); errors name the bad key."""
    return config_schema.resolved_tree(config, ConfigError)


def validate_sft_config(config: Union[DictConfig, dict]) -> list[str]:
    """Every problem of a config, one line each naming the key (empty = valid)."""
    values = dict(_walk(to_plain_dict(config)))
    schema = schema_defaults()
    errors = [unknown_key_message(k) for k in values if k not in schema]
    errors += [f"Missing config key '{k}' (it is in {CONFIG_NAME}.yaml)" for k in schema if k not in values]
    for key, value in values.items():
        if key not in schema:
            continue
        problem = config_schema.value_error(key, value, expected_types(key))
        if problem:
            errors.append(problem)
    if errors:
        return errors
    for key, choices in ENUMS.items():
        for value in values[key] if isinstance(values[key], list) else [values[key]]:
            problem = config_schema.enum_error(key, value, choices)
            if problem:
                errors.append(problem)
    for key in POSITIVE_INTS:
        if values[key] is not None and values[key] < 1:
            errors.append(f"'{key}'={values[key]!r} must be >= 1")
    for key in MINUS_ONE_OR_POSITIVE:
        if values[key] != -1 and values[key] < 1:
            errors.append(f"'{key}'={values[key]!r} must be -1 (off) or >= 1")
    if not values["optim.lr"] > 0:
        errors.append(f"'optim.lr'={values['optim.lr']!r} must be > 0")
    if not values["optim.clip_grad"] > 0:
        errors.append(f"'optim.clip_grad'={values['optim.clip_grad']!r} must be > 0")
    if values["optim.weight_decay"] < 0:
        errors.append(f"'optim.weight_decay'={values['optim.weight_decay']!r} must be >= 0")
    for key in ("optim.warmup_steps_ratio", "optim.min_lr_ratio"):
        if not 0.0 <= values[key] <= 1.0:
            errors.append(f"'{key}'={values[key]!r} must be in [0, 1]")
    betas = values["optim.betas"]
    if not (len(betas) == 2 and all(_type_ok(b, (float,)) and 0 <= b < 1 for b in betas)):
        errors.append(f"'optim.betas' must be two numbers in [0, 1), got {betas!r}")
    for key in ("data.train_files", "data.val_files"):
        files = values[key]
        if isinstance(files, list) and (not files or not all(isinstance(f, str) for f in files)):
            errors.append(f"'{key}' must be a path or a non-empty list of paths, got {files!r}")
    return errors


def check_sft_config(config: Union[DictConfig, dict]) -> None:
    errors = validate_sft_config(config)
    if errors:
        raise ConfigError(errors)


def batch_plan(train_batch_size: int, micro_batch_size_per_gpu: int, world_size: int) -> tuple[int, int]:
    """(rows per rank, micro-batches per rank) of one optimizer step; ConfigError when they do not divide."""
    if train_batch_size % world_size:
        raise ConfigError([f"'data.train_batch_size'={train_batch_size} must be divisible by the world size {world_size}"])
    per_rank = train_batch_size // world_size
    if per_rank % micro_batch_size_per_gpu:
        raise ConfigError([f"'data.micro_batch_size_per_gpu'={micro_batch_size_per_gpu} must divide the "
                           f"{per_rank} rows per rank (data.train_batch_size={train_batch_size} / {world_size} ranks)"])
    return per_rank, per_rank // micro_batch_size_per_gpu
