"""Config of the SFT trainer: composition with Hydra and validation against verl/trainer/config/sft_trainer.yaml.

Command-line overrides are checked before Hydra sees them, so an unknown key fails with the closest
valid key named (difflib) instead of Hydra's struct error; a composed or hand-built config is checked
again (keys, enum values, ranges) before any process group or model is created. Every problem is one
line naming its key.
"""
from __future__ import annotations

import difflib
import functools
import os
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")
CONFIG_NAME = "sft_trainer"

_NONE = type(None)
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


class ConfigError(ValueError):
    """Invalid SFT config; ``errors`` holds one line per problem."""

    def __init__(self, errors: Sequence[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


def _walk(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf; lists are leaves."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _walk(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict[str, Any]:
    """Dotted key -> YAML default (unresolved) of every config leaf (Hydra's own nodes excluded)."""
    raw = OmegaConf.to_container(OmegaConf.load(os.path.join(CONFIG_DIR, f"{CONFIG_NAME}.yaml")), resolve=False)
    raw.pop("hydra", None)
    raw.pop("defaults", None)
    return dict(_walk(raw))


def suggest_key(key: str) -> Optional[str]:
    """The valid key closest to ``key``: same last component first, then the whole dotted name."""
    candidates = list(schema_defaults())
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return max(same_leaf, key=lambda c: difflib.SequenceMatcher(None, key, c).ratio())
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    by_leaf = {c.rsplit(".", 1)[-1]: c for c in candidates}
    close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
    return by_leaf[close[0]] if close else None


def unknown_key_message(key: str) -> str:
    guess = suggest_key(key)
    return f"Unknown config key '{key}'" + (f"; did you mean '{guess}'?" if guess else "")


def check_override_keys(overrides: Iterable[str]) -> list[str]:
    """Validate ``key=value`` overrides against the YAML; returns them with ``+``/``++`` on known keys removed.

    Hydra's own keys (``hydra.*``) pass through. Raises ConfigError listing every unknown key.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    overrides = list(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError([f"Cannot parse override: {str(exc).splitlines()[0]}"]) from exc
    schema = schema_defaults()
    errors, prepared = [], []
    for ov in parsed:
        key = ov.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            prepared.append(ov.input_line)
        elif key not in schema:
            errors.append(unknown_key_message(key))
        else:
            prepared.append(ov.input_line.lstrip("+"))
    if errors:
        raise ConfigError(errors)
    return prepared


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


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    for t in types:
        if t is _NONE and value is None:
            return True
        if t is bool and isinstance(value, bool):
            return True
        if t in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if t is float or isinstance(value, int):
                return True
        if t in (str, list) and isinstance(value, t):
            return True
    return False


def expected_types(key: str) -> tuple[type, ...]:
    if key in EXPLICIT_TYPES:
        return EXPLICIT_TYPES[key]
    default = schema_defaults()[key]
    if isinstance(default, bool):
        return (bool,)
    if isinstance(default, float):
        return (float,)
    return (type(default),)


def to_plain_dict(config: Union[DictConfig, dict]) -> dict:
    """Resolved plain container of a config (Hydra's own node dropped); errors name the bad key."""
    from omegaconf.errors import OmegaConfBaseException

    cfg = config if isinstance(config, DictConfig) else OmegaConf.create(config)
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    try:
        return OmegaConf.to_container(OmegaConf.create(container), resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError([f"Cannot resolve config key '{key}': {str(exc).splitlines()[0]}"]) from exc


def validate_sft_config(config: Union[DictConfig, dict]) -> list[str]:
    """Every problem of a config, one line each naming the key (empty = valid)."""
    values = dict(_walk(to_plain_dict(config)))
    schema = schema_defaults()
    errors = [unknown_key_message(k) for k in values if k not in schema]
    errors += [f"Missing config key '{k}' (it is in {CONFIG_NAME}.yaml)" for k in schema if k not in values]
    for key, value in values.items():
        if key not in schema:
            continue
        if value == "???":
            errors.append(f"'{key}' is required (no default); pass {key}=...")
        elif not _type_ok(value, expected_types(key)):
            names = " or ".join("null" if t is _NONE else t.__name__ for t in expected_types(key))
            errors.append(f"'{key}' must be {names}, got {value!r}")
    if errors:
        return errors
    for key, choices in ENUMS.items():
        for value in values[key] if isinstance(values[key], list) else [values[key]]:
            if value not in choices:
                close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                errors.append(f"'{key}'={value!r} is not one of: {', '.join(choices)}{hint}")
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
