"""Validation of the trainer config: keys, value types, enum values, combinations and batch divisibility.

It runs twice: on the command-line overrides before Hydra composes them (an unknown key is reported with
the closest valid key instead of Hydra's struct error) and on the composed config before any worker
starts. Every problem is one line that names the key. The key set, types, allowed values, bounds and refusals
come from the declarations in luffy_pool/config/sections.py; the defaults from luffy_pool/config/mix_ppo_trainer.yaml.
The rules between keys (``combinations``, ``_late_failures``, ``batch_sizes``) are code here.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Iterator, Optional

from omegaconf import DictConfig

from luffy_pool.config.sections import ConfigSections
from verl.utils import config_schema
from verl.trainer.ppo.loss_inputs import registered_loss_keys
from verl.utils.batch_sizes import (
    BatchSizeError,
    normalize_actor_batch_sizes,
    optimizer_steps_per_training_step,
    rows_per_rank,
)
from verl.utils.config_section import Declaration, declarations, refused_groups, value_errors
from verl.utils.parallel_check import parallel_config_errors

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))  # the YAML files sit next to this module
BASE_CONFIG_NAME = "mix_ppo_trainer"

_A = "actor_rollout_ref.actor"
_R = "actor_rollout_ref.rollout"
_REF = "actor_rollout_ref.ref"

# No model has this many positions; the model-specific limit is checked at pre-flight (check_model_context).
MAX_RESPONSE_LENGTH = 1 << 20


@functools.lru_cache(maxsize=1)
def declared() -> dict[str, Declaration]:
    """Dotted key -> its declaration, for every key of luffy_pool/config_sections.ConfigSections."""
    return {d.key: d for d in declarations(ConfigSections)}


def optional_keys() -> list[str]:
    """Keys absent from the YAML that may be added with `+` (LUFFY reads them with a default)."""
    return [k for k, d in declared().items() if d.optional]


def open_dict_keys() -> tuple[str, ...]:
    """Dict keys whose sub-keys are free-form (added with `+`)."""
    return tuple(k for k, d in declared().items() if d.open_dict)


class ConfigError(config_schema.SchemaConfigError):
    """One or more config problems; ``errors`` holds one line per problem."""


def _walk(node: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted path, value) of a nested dict, dict nodes included, depth first."""
    return config_schema.walk(node, prefix, sections=True, open_keys=open_dict_keys())


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict[str, Any]:
    """Dotted key -> YAML default for every key of mix_ppo_trainer.yaml (dict nodes included)."""
    return dict(_walk(config_schema.load_yaml_tree(os.path.join(CONFIG_DIR, f"{BASE_CONFIG_NAME}.yaml"), resolve=True)))


def schema_leaf_keys() -> list[str]:
    """Dotted keys of the YAML's values (not groups), as declared; open dicts count as values."""
    return [k for k, d in declared().items() if not d.optional]


@functools.lru_cache(maxsize=1)
def _groups() -> frozenset[str]:
    """Dotted groups of the declared keys (``actor_rollout_ref.actor``, ...)."""
    return frozenset(k.rsplit(".", i)[0] for k in declared() for i in range(1, k.count(".") + 1))


def expected_types(key: str) -> tuple[type, ...]:
    """Accepted Python types of a key's value (bool, int, float, str, list, dict, NoneType)."""
    return declared()[key].types


def _under_open_dict(key: str) -> bool:
    return any(key.startswith(k + ".") for k in open_dict_keys())


def suggest_key(key: str) -> Optional[str]:
    """The closest valid key: same last segment in another section first, then the whole dotted path,
    then the last segment alone."""
    return config_schema.suggest_key(key, list(declared()), leaf_cutoff=0.75)


def unknown_key_message(key: str, plus: bool = False) -> str:
    """One line for a key the schema does not have, naming the closest valid key."""
    for group, why in refused_groups(ConfigSections).items():
        if key.startswith(group + ".") and classify_key(key) is None:
            return f"Unknown config key '{key}': {why}"
    msg = config_schema.unknown_key_message(key, suggest_key(key))
    if plus:
        msg += f" ('+' only adds {', '.join(optional_keys())} and {open_dict_keys()[0]}.<field>)"
    return msg


def classify_key(key: str) -> Optional[str]:
    """'schema', 'optional' (+-addable), 'open' (inside an open dict) or None (unknown)."""
    d = declared().get(key)
    if d is not None:
        return "optional" if d.optional else "schema"
    if key in _groups():
        return "schema"
    if _under_open_dict(key):
        return "open"
    if key.startswith(f"{_A}.") and key[len(_A) + 1:] in registered_loss_keys():
        return "loss"  # a knob a registered loss declares (register_policy_loss(name, config=...)); its dataclass types it
    return None


def prepare_overrides(overrides: list[str]) -> list[str]:
    """Check command-line overrides against the schema and return them normalised for Hydra.

    Unknown keys raise ConfigError (all of them, one line each, with the closest key). Accepted forms are
    rewritten so Hydra never refuses them: `+key` / `++key` of a YAML key become `key` (LUFFY scripts
    `+`-add keys that our YAML now declares), optional and open-dict keys become `++key`. Hydra's own
    keys (`hydra.*`, `hydra/...`) pass through untouched.
    """
    import yaml

    libs = [yaml.safe_load(o.split("=", 1)[1]) for o in overrides if o.lstrip("+").startswith(f"{_EXTERNAL_LIB}=")]
    problem = next(filter(None, map(import_loss_modules, libs)), None)
    if problem:
        raise ConfigError([problem])
    return config_schema.prepare_overrides(overrides, classify=classify_key, unknown_message=unknown_key_message,
                                           error_cls=ConfigError)


_EXTERNAL_LIB = "actor_rollout_ref.model.external_lib"


def import_loss_modules(external_lib) -> Optional[str]:
    """Import ``model.external_lib`` before keys are checked: a loss it registers declares its knobs on import
    (``registered_loss_keys``). Returns the import problem as one line, None when it imported."""
    from verl.utils.import_utils import import_external_libs

    try:
        import_external_libs(external_lib)
    except ImportError as err:
        return str(err)
    return None


class _Checker:
    """Collects one-line errors while the rules read the resolved config by dotted key."""

    def __init__(self, values: dict[str, Any]):
        self.values = values
        self.errors: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def fail(self, msg: str) -> None:
        self.errors.append(msg)

    def structure(self) -> None:
        """Unknown keys, missing keys, required values and types."""
        for key, value in self.values.items():
            kind = classify_key(key)
            if kind is None:
                self.fail(unknown_key_message(key))
            elif key in declared():
                problem = config_schema.value_error(key, value, expected_types(key))
                if problem:
                    self.fail(problem)
        for key in schema_leaf_keys():
            if key not in self.values:
                self.fail(f"Missing config key '{key}' (it is in {BASE_CONFIG_NAME}.yaml)")

    def values_and_ranges(self) -> None:
        """Each key against its declaration: LUFFY-inert keys at their default, refused values, choices, bounds."""
        schema = schema_defaults()
        for key, d in declared().items():
            if key in self.values:
                for line in value_errors(d, self.values[key], schema.get(key)):
                    self.fail(line)

    def finite_numbers(self) -> None:
        """No number of the config may be NaN or infinite (``rollout.temperature=inf`` once passed the
        range check and failed 71 s later in three vLLM workers)."""
        for key, value in self.values.items():
            if isinstance(value, float) and not math.isfinite(value):
                self.fail(f"'{key}'={value!r} must be a finite number")

    def combinations(self) -> None:
        get = self.get
        for msg in parallel_config_errors(get):  # Ulysses SP and HSDP layout (verl/utils/parallel_check.py)
            self.fail(msg)
        from verl.trainer.ppo.rollout_corr import config_errors as rollout_corr_errors  # torch: imported when run

        for msg in rollout_corr_errors(get):  # algorithm.rollout_correction needs rollout.calculate_log_probs
            self.fail(msg)
        if get(f"{_A}.use_sft_multitask_loss"):
            if get(f"{_A}.use_off_policy_loss"):
                self.fail(f"'{_A}.use_sft_multitask_loss'=True cannot be combined with '{_A}.use_off_policy_loss'=True")
            if get("algorithm.adv_estimator") != "grpo_split":
                self.fail(f"'{_A}.use_sft_multitask_loss'=True needs 'algorithm.adv_estimator'=grpo_split "
                          f"(on-policy advantages without the off-policy rows), got {get('algorithm.adv_estimator')!r}")
        if get(f"{_A}.policy_loss") != "auto" and (get(f"{_A}.use_off_policy_loss") or get(f"{_A}.use_sft_multitask_loss")):
            self.fail(f"'{_A}.policy_loss'={get(f'{_A}.policy_loss')!r} conflicts with LUFFY's loss switches "
                      "(use_off_policy_loss / use_sft_multitask_loss); set policy_loss=auto or turn the switches off")
        if get(f"{_A}.use_sft_prefix_reward") and get(f"{_R}.n_prefix") != -1:
            self.fail(f"'{_A}.use_sft_prefix_reward'=True needs '{_R}.n_prefix'=-1, got {get(f'{_R}.n_prefix')}")
        if get(f"{_A}.use_off_policy_probs") and not get(f"{_A}.use_off_policy_loss"):
            self.fail(f"'{_A}.use_off_policy_probs'=True needs '{_A}.use_off_policy_loss'=True (the behaviour "
                      "probabilities only enter the off-policy loss)")
        if get("data.self_replay.enable") and not (get(f"{_A}.use_off_policy_loss") and get(f"{_A}.use_off_policy_probs")):
            self.fail(f"'data.self_replay.enable'=True needs '{_A}.use_off_policy_loss'=True and "
                      f"'{_A}.use_off_policy_probs'=True (replayed traces are weighted by their behaviour log-probs)")
        if get(f"{_A}.use_adaptive_temperature_fixed") and not get(f"{_A}.use_adaptive_temperature"):
            self.fail(f"'{_A}.use_adaptive_temperature_fixed'=True needs '{_A}.use_adaptive_temperature'=True")
        use_ref = get(f"{_REF}.use_ref")
        if get(f"{_A}.use_kl_loss") and not use_ref:
            self.fail(f"'{_A}.use_kl_loss'=True needs '{_REF}.use_ref'=True (the KL is to the reference policy; "
                      f"LUFFY's actor fails reading ref_log_prob); add {_A}.use_kl_loss=False to train without one")
        # kl_ctrl.kl_coef > 0 without a reference is accepted, as in LUFFY: there is no ref_log_prob, so the
        # KL-in-reward term is absent (beta = 0, critic/kl_coeff logs 0; verl/trainer/ppo/kl.apply_kl_penalty).
        if get("algorithm.kl_ctrl.type") == "adaptive" and not get("algorithm.kl_ctrl.horizon", 0) > 0:
            self.fail("'algorithm.kl_ctrl.horizon' must be > 0 with algorithm.kl_ctrl.type=adaptive")
        n, n_prefix = get(f"{_R}.n"), get(f"{_R}.n_prefix")
        if n_prefix != -1 and not 0 <= n_prefix <= n:
            self.fail(f"'{_R}.n_prefix'={n_prefix} must be -1 (all slots) or in [0, rollout.n={n}]")
        if get(f"{_R}.prefix_strategy") == "linear" and not get(f"{_R}.prefix_share_across_samples"):
            self.fail(f"'{_R}.prefix_strategy'=linear needs '{_R}.prefix_share_across_samples'=True (as in LUFFY: "
                      "one shared ratio per step); use prefix_strategy=random or add "
                      f"{_R}.prefix_share_across_samples=True")
        if get(f"{_R}.min_prefix_ratio") > get(f"{_R}.max_prefix_ratio"):
            self.fail(f"'{_R}.min_prefix_ratio'={get(f'{_R}.min_prefix_ratio')} exceeds "
                      f"'{_R}.max_prefix_ratio'={get(f'{_R}.max_prefix_ratio')}")
        for rollout_key, data_key in (("prompt_length", "max_prompt_length"), ("response_length", "max_response_length")):
            if get(f"{_R}.{rollout_key}") != get(f"data.{data_key}"):
                self.fail(f"'{_R}.{rollout_key}'={get(f'{_R}.{rollout_key}')} must equal 'data.{data_key}'="
                          f"{get(f'data.{data_key}')} (leave it as the ${{data.{data_key}}} interpolation)")
        self._late_failures()
        mode = get("trainer.resume_mode")
        if mode not in ("auto", "disable", "resume_path") and "global_step_" not in mode:
            self.fail(f"'trainer.resume_mode'={mode!r} must be auto, disable, resume_path or a .../global_step_N path")
        if mode == "resume_path" and not get("trainer.resume_from_path"):
            self.fail("'trainer.resume_mode'=resume_path needs 'trainer.resume_from_path'")

    def _late_failures(self) -> None:
        """Values that used to fail only in a worker or at the first rollout (docs/DESIGN.md §3, "Weak")."""
        get = self.get
        n = get(f"{_R}.n")
        if get("data.self_replay.enable") and get("data.self_replay.slots") > n:
            self.fail(f"'data.self_replay.slots'={get('data.self_replay.slots')} exceeds '{_R}.n'={n} "
                      "(a group has only n rows to replace)")
        orm = "reward.orm"
        if get(f"{orm}.enable"):
            missing = [k for k in ("base_url", "model") if not get(f"{orm}.{k}")]
            if missing:
                self.fail(f"'{orm}.enable'=True needs {' and '.join(f'{orm}.{k}' for k in missing)} "
                          "(the judge's OpenAI-compatible endpoint and model name)")
        longest = (get("data.max_prompt_length") or 0) + (get("data.max_response_length") or 0)
        budgets = ((f"{_A}.ppo_max_token_len_per_gpu", f"{_A}.use_dynamic_bsz", True),
                   (f"{_R}.log_prob_max_token_len_per_gpu", f"{_R}.log_prob_use_dynamic_bsz", True),
                   (f"{_REF}.log_prob_max_token_len_per_gpu", f"{_REF}.log_prob_use_dynamic_bsz", get(f"{_REF}.use_ref")))
        sp = get(f"{_A}.ulysses_sequence_parallel_size", 1) or 1
        for key, switch, enabled in budgets:
            budget = get(key)
            # A micro-batch holds at least one whole sequence; an SP rank holds 1/sp of it (dp_actor).
            if enabled and get(switch) and isinstance(budget, int) and budget * sp < longest:
                self.fail(f"'{key}'={budget} is below one sequence: data.max_prompt_length + data.max_response_length"
                          f" = {longest} tokens{f' (/ Ulysses SP {sp})' if sp > 1 else ''}; raise it or set {switch}=False")
        if get("data.max_response_length", 0) > MAX_RESPONSE_LENGTH:
            self.fail(f"'data.max_response_length'={get('data.max_response_length')} is beyond any model context "
                      f"(> {MAX_RESPONSE_LENGTH} tokens)")

    def batch_sizes(self) -> None:
        get = self.get
        world = get("trainer.nnodes") * get("trainer.n_gpus_per_node")
        n, sp = get(f"{_R}.n"), get(f"{_A}.ulysses_sequence_parallel_size", 1)
        actor = {k[len(_A) + 1:]: v for k, v in self.values.items() if k.startswith(_A + ".")}
        try:
            rows_per_rank(get("data.train_batch_size"), n, world)
            sizes = normalize_actor_batch_sizes(actor, n, world, sp)
            optimizer_steps_per_training_step(get("data.train_batch_size"), n, world,
                                              sizes["ppo_mini_batch_size_per_rank"], get(f"{_A}.ppo_epochs"), sp)
        except BatchSizeError as exc:
            self.fail(str(exc))
        for section, enabled in ((_R, True), (_REF, get(f"{_REF}.use_ref"))):
            micro = get(f"{section}.log_prob_micro_batch_size")
            if enabled and not get(f"{section}.log_prob_use_dynamic_bsz"):
                if micro is None or micro < world // sp:
                    self.fail(f"'{section}.log_prob_micro_batch_size'={micro} must be >= the {world // sp} "
                              "data-parallel ranks (or enable log_prob_use_dynamic_bsz)")
        tp = get(f"{_R}.tensor_model_parallel_size")
        if get(f"{_R}.name") == "vllm" and world % tp:
            self.fail(f"'{_R}.tensor_model_parallel_size'={tp} must divide the world size {world} "
                      "(trainer.nnodes * trainer.n_gpus_per_node)")


def _flatten(cfg: DictConfig) -> dict[str, Any]:
    """Dotted key -> resolved value; interpolation failures become ConfigError lines naming the key."""
    return dict(_walk(config_schema.resolved_tree(cfg, ConfigError)))


def validate_config(cfg: DictConfig) -> list[str]:
    """All problems of a composed config, one line each naming the key (empty list = valid)."""
    checker = _Checker(_flatten(cfg))
    problem = import_loss_modules(checker.get(_EXTERNAL_LIB))
    if problem:
        return [problem]
    checker.structure()
    if checker.errors:  # the value rules below assume every key is present with its type
        return checker.errors
    checker.finite_numbers()
    checker.values_and_ranges()
    checker.combinations()
    checker.batch_sizes()
    return checker.errors


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError listing every problem of the composed config."""
    errors = validate_config(cfg)
    if errors:
        raise ConfigError(errors)
