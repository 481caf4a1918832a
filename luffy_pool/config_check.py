"""Validation of the trainer config: keys, value types, enum values, combinations and batch divisibility.

It runs twice: on the command-line overrides before Hydra composes them (an unknown key is reported with
the closest valid key instead of Hydra's struct error) and on the composed config before any worker
starts. Every problem is one line that names the key. The schema is luffy_pool/config/mix_ppo_trainer.yaml.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Iterator, Optional

from omegaconf import DictConfig

from luffy_pool.config_refusals import (INERT_KEYS, NOT_SHIPPED_SECTIONS, REJECTED_WHEN_FALSE, REJECTED_WHEN_TRUE,
                                        UNSUPPORTED_VALUES)
from verl.utils import config_schema
from verl.trainer.ppo.loss_inputs import registered_loss_keys
from verl.utils.batch_sizes import (
    BatchSizeError,
    normalize_actor_batch_sizes,
    optimizer_steps_per_training_step,
    rows_per_rank,
)
from verl.utils.config_schema import NONE_TYPE as _NONE
from verl.utils.parallel_check import parallel_config_errors
from verl.utils.tracking import SUPPORTED_BACKENDS

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
BASE_CONFIG_NAME = "mix_ppo_trainer"

_A = "actor_rollout_ref.actor"
_R = "actor_rollout_ref.rollout"
_REF = "actor_rollout_ref.ref"

# Keys absent from the YAML that may be added with `+` (LUFFY reads them with a default).
OPTIONAL_KEYS = {"trainer.val_before_train": (bool,), "trainer.val_only": (bool,)}
# Dict keys whose sub-keys are free-form (added with `+`).
OPEN_DICT_KEYS = ("actor_rollout_ref.model.override_config",)
# Types of keys whose YAML default (null, ??? or an alternative form) does not say their type.
EXPLICIT_TYPES = {
    "data.tokenizer": (str, _NONE),
    "data.train_files": (str, list),
    "data.val_files": (str, list, _NONE),
    "data.off_policy_files": (list, str),
    "data.val_max_rows": (int, _NONE),
    "actor_rollout_ref.model.path": (str,),
    "actor_rollout_ref.model.external_lib": (str, _NONE),
    f"{_A}.ppo_micro_batch_size": (int, _NONE),
    f"{_A}.ppo_micro_batch_size_per_gpu": (int, _NONE),
    f"{_A}.optim.min_lr_ratio": (float, _NONE),
    f"{_R}.log_prob_micro_batch_size": (int, _NONE),
    f"{_REF}.log_prob_micro_batch_size": (int, _NONE),
    "reward.orm.base_url": (str, _NONE),
    "reward.orm.model": (str, _NONE),
    "reward.orm.cache_path": (str, _NONE),
    "trainer.total_training_steps": (int, _NONE),
    "trainer.logger": (list, str),
    "trainer.default_hdfs_dir": (str, _NONE),
    "trainer.resume_from_path": (str, bool, _NONE),
    "trainer.max_actor_ckpt_to_keep": (int, _NONE),
    "trainer.rollout_data_dir": (str, _NONE),
    "ray_init.address": (str, _NONE),
    "ray_init.num_cpus": (int, _NONE),
    "ray_init.max_direct_call_object_size": (int, _NONE),
}

KL_ESTIMATORS = ("kl", "abs", "mse", "low_var_kl")
DTYPES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32")
# Valid values per key; list-valued keys are checked element by element.
ENUMS = {
    "algorithm.adv_estimator": ("grpo", "grpo_split", "reinforce", "reinforce_plus_plus"),
    "algorithm.kl_penalty": KL_ESTIMATORS,
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "actor_rollout_ref.model.attn_implementation": ("auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3"),
    f"{_A}.strategy": ("fsdp", "fsdp2"),
    f"{_A}.kl_loss_type": KL_ESTIMATORS,
    f"{_A}.off_policy_loss_impl": ("token",),
    f"{_A}.off_policy_reshape": (
        "no_reshape", "logp", "p_logp", "square_root", "pow", "p_div_p_0.1", "p_div_p_0.3", "p_div_p_0.5"),
    f"{_A}.on_policy_reshape": ("no_reshape", "logp", "p_logp", "square_root", "pow", "p_div_p_0.1", "p_div_p_0.5"),
    f"{_A}.optim.warmup_style": ("constant", "cosine"),
    f"{_A}.optim.step_impl": ("auto", "fused", "foreach", "for_loop"),
    f"{_A}.on_nonfinite": ("skip", "stop"),
    f"{_A}.recompute_old_log_prob": ("always", "auto"),
    f"{_A}.checkpoint.contents": ("model", "optimizer", "extra"),
    f"{_A}.fsdp_config.param_dtype": ("auto",) + DTYPES,
    f"{_A}.fsdp_config.reduce_dtype": DTYPES,
    f"{_R}.name": ("vllm", "hf"),
    f"{_R}.dtype": ("auto",) + DTYPES,
    f"{_R}.load_format": ("dummy_dtensor", "dummy", "dtensor", "auto", "hf", "safetensors"),
    f"{_R}.prefix_strategy": ("random", "fixed", "linear", "linear_max", "reverse_linear"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.bundle_resources": ("auto", "gpu", "cpu"),
    "trainer.cpu_bind": ("auto", "none"),
    "trainer.memory_plan": ("warn", "error", "off"),  # issue 23: luffy_pool.memory_plan at start
    "trainer.logger": SUPPORTED_BACKENDS,
    "data.self_replay.eviction": ("oldest", "random"),
    "data.self_replay.selection": ("latest", "random"),
}
ENUMS["data.truncate_off_policy"] = ("cut", "drop")  # issue 18: over-long off-policy traces
ENUMS["reward.orm.on_failure"] = ("raise", "warn")  # issue 18: a dead judge
ENUMS["data.sample_target_mode"] = ("redraw", "fixed")  # issue 24 (E3): LUFFY redraws on every read
POSITIVE_INTS = (
    "data.train_batch_size", "data.val_batch_size", "data.max_prompt_length", "data.max_response_length",
    "data.val_max_rows", f"{_A}.ppo_mini_batch_size", f"{_A}.ppo_epochs", f"{_A}.ppo_max_token_len_per_gpu",
    f"{_R}.n", f"{_R}.n_val", f"{_R}.max_prefix_len", f"{_R}.tensor_model_parallel_size", f"{_R}.max_num_batched_tokens",
    f"{_R}.max_num_seqs", f"{_R}.hf_micro_batch_size", f"{_R}.log_prob_max_token_len_per_gpu", f"{_R}.prefix_steps",
    f"{_R}.cpu_kv_cache_bytes", f"{_R}.weight_sync_bucket_mb", f"{_REF}.log_prob_max_token_len_per_gpu",
    "reward.num_workers", "trainer.total_epochs", "trainer.total_training_steps", "trainer.nnodes",
    "trainer.n_gpus_per_node", "trainer.max_optim_to_keep", "ray_init.num_cpus", "ray_init.max_direct_call_object_size",
    "data.self_replay.capacity", "data.self_replay.max_per_prompt", "data.self_replay.slots",
)
POSITIVE_INTS += ("trainer.max_actor_ckpt_to_keep",)  # issue 18: checkpoint retention
POSITIVE_INTS += ("actor_rollout_ref.nccl_timeout",)  # issue 22: process-group timeout (seconds)
UNIT_INTERVAL = (
    "reward.orm.max_failure_rate",  # issue 18
    "data.sample_target_ratio", f"{_R}.min_prefix_ratio", f"{_R}.max_prefix_ratio", f"{_R}.prefix_linear_max_ratio",
    f"{_A}.optim.lr_warmup_steps_ratio", f"{_A}.optim.min_lr_ratio",
)
OPEN_UNIT_INTERVAL = (f"{_R}.gpu_memory_utilization", f"{_R}.top_p")
POSITIVE_NUMBERS = (
    f"{_R}.temperature", f"{_A}.clip_ratio", f"{_A}.grad_clip", "reward.timeout_s", "reward.grade_budget_s", "reward.orm.timeout_s",
    "reward.orm.requests_per_second",
)
NON_NEGATIVE_NUMBERS = (
    f"{_A}.optim.lr", f"{_A}.optim.weight_decay", f"{_A}.entropy_coeff", f"{_A}.kl_loss_coef", f"{_A}.sft_loss_coef",
    f"{_A}.ppo_kl_loss_coef", f"{_A}.alpha_lr", "algorithm.kl_ctrl.kl_coef", f"{_R}.val_temperature",
    "trainer.critic_warmup", "data.dataloader_num_workers", "reward.orm.max_retries", "trainer.val_generations_to_log",
    "actor_rollout_ref.model.logprob_chunk_size",
)
# -1 switches these off; otherwise they must be positive.
MINUS_ONE_OR_POSITIVE = (
    f"{_A}.off_policy_max_clip", f"{_A}.off_policy_min_clip", f"{_A}.all_max_clip", f"{_A}.adaptive_temperature_clip",
    f"{_A}.fsdp_config.fsdp_size", "trainer.save_freq", "trainer.test_freq",
)


# No model has this many positions; the model-specific limit is checked at pre-flight (check_model_context).
MAX_RESPONSE_LENGTH = 1 << 20


class ConfigError(config_schema.SchemaConfigError):
    """One or more config problems; ``errors`` holds one line per problem."""


def _walk(node: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted path, value) of a nested dict, dict nodes included, depth first."""
    return config_schema.walk(node, prefix, sections=True, open_keys=OPEN_DICT_KEYS)


@functools.lru_cache(maxsize=1)
def schema_defaults() -> dict[str, Any]:
    """Dotted key -> YAML default for every key of mix_ppo_trainer.yaml (dict nodes included)."""
    return dict(_walk(config_schema.load_yaml_tree(os.path.join(CONFIG_DIR, f"{BASE_CONFIG_NAME}.yaml"), resolve=True)))


def schema_leaf_keys() -> list[str]:
    """Dotted keys of the YAML's values (not sections); open dicts count as values."""
    return [k for k, v in schema_defaults().items() if not isinstance(v, dict) or k in OPEN_DICT_KEYS]


def expected_types(key: str) -> tuple[type, ...]:
    """Accepted Python types of a key's value (bool, int, float, str, list, dict, NoneType)."""
    if key in OPTIONAL_KEYS:
        return OPTIONAL_KEYS[key]
    return config_schema.expected_types(key, schema_defaults(), EXPLICIT_TYPES)


def _under_open_dict(key: str) -> bool:
    return any(key.startswith(k + ".") for k in OPEN_DICT_KEYS)


def suggest_key(key: str) -> Optional[str]:
    """The closest valid key: same last segment in another section first, then the whole dotted path,
    then the last segment alone."""
    return config_schema.suggest_key(key, schema_leaf_keys() + list(OPTIONAL_KEYS), leaf_cutoff=0.75)


def unknown_key_message(key: str, plus: bool = False) -> str:
    """One line for a key the schema does not have, naming the closest valid key."""
    section = key.split(".", 1)[0]
    if section in NOT_SHIPPED_SECTIONS and key not in schema_defaults():
        return f"Unknown config key '{key}': {NOT_SHIPPED_SECTIONS[section]}"
    msg = config_schema.unknown_key_message(key, suggest_key(key))
    if plus:
        msg += f" ('+' only adds {', '.join(OPTIONAL_KEYS)} and {OPEN_DICT_KEYS[0]}.<field>)"
    return msg


def classify_key(key: str) -> Optional[str]:
    """'schema', 'optional' (+-addable), 'open' (inside an open dict) or None (unknown)."""
    if key in schema_defaults():
        return "schema"
    if key in OPTIONAL_KEYS:
        return "optional"
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


_type_ok = config_schema.type_ok


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
        schema = schema_defaults()
        for key, value in self.values.items():
            kind = classify_key(key)
            if kind is None:
                self.fail(unknown_key_message(key))
            elif kind == "optional" or (kind == "schema" and not isinstance(schema[key], dict)):
                problem = config_schema.value_error(key, value, expected_types(key))
                if problem:
                    self.fail(problem)
        for key in schema_leaf_keys():
            if key not in self.values and not any(key.startswith(p + ".") for p in OPEN_DICT_KEYS):
                self.fail(f"Missing config key '{key}' (it is in {BASE_CONFIG_NAME}.yaml)")

    def values_and_ranges(self) -> None:
        schema = schema_defaults()
        for key, why in INERT_KEYS.items():
            if self.get(key) != schema[key]:
                self.fail(f"'{key}'={self.get(key)!r} is not supported ({why}); only {schema[key]!r} is accepted")
        for key, why in REJECTED_WHEN_TRUE.items():
            if self.get(key) is True:
                self.fail(f"'{key}'=True is not supported: {why}")
        for key, why in REJECTED_WHEN_FALSE.items():
            if self.get(key) is False:
                self.fail(f"'{key}'=False is not supported: {why}")
        for key, choices in ENUMS.items():
            for value in self.get(key) if isinstance(self.get(key), list) else [self.get(key)]:
                if (key, value) in UNSUPPORTED_VALUES:
                    self.fail(f"'{key}'={value!r} is not supported: {UNSUPPORTED_VALUES[(key, value)]}")
                elif value not in choices:
                    self.fail(config_schema.enum_error(key, value, choices))
        self._range(POSITIVE_INTS, lambda v: v >= 1, "must be >= 1")
        self._range(UNIT_INTERVAL, lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]")
        self._range(OPEN_UNIT_INTERVAL, lambda v: 0.0 < v <= 1.0, "must be in (0, 1]")
        self._range(POSITIVE_NUMBERS, lambda v: v > 0, "must be > 0")
        self._range(NON_NEGATIVE_NUMBERS, lambda v: v >= 0, "must be >= 0")
        self._range(MINUS_ONE_OR_POSITIVE, lambda v: v == -1 or v > 0, "must be -1 (off) or > 0")
        self._range((f"{_R}.top_k",), lambda v: v >= -1, "must be -1 (off), 0 (off, hf) or > 0")
        self._range(("data.self_replay.max_age",), lambda v: v >= -1, "must be -1 (no limit) or >= 0")
        self._range((f"{_R}.sleep_level",), lambda v: v in (1, 2), "must be 1 or 2 (vLLM sleep levels)")  # issue 22
        betas = self.get(f"{_A}.optim.betas")
        if not (isinstance(betas, list) and len(betas) == 2 and all(_type_ok(b, (float,)) and 0 <= b < 1 for b in betas)):
            self.fail(f"'{_A}.optim.betas' must be two numbers in [0, 1), got {betas!r}")

    def _range(self, keys: tuple[str, ...], ok, what: str) -> None:
        for key in keys:
            value = self.get(key)
            if value is not None and not ok(value):
                self.fail(f"'{key}'={value!r} {what}")

    def finite_numbers(self) -> None:
        """No number of the config may be NaN or infinite (issue 25: ``rollout.temperature=inf`` passed the
        range check and failed 71 s later in three vLLM workers)."""
        for key, value in self.values.items():
            if isinstance(value, float) and not math.isfinite(value):
                self.fail(f"'{key}'={value!r} must be a finite number")

    def combinations(self) -> None:
        get = self.get
        for msg in parallel_config_errors(get):  # Ulysses SP and HSDP layout (verl/utils/parallel_check.py)
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
        """Values that used to fail only in a worker or at the first rollout (issue 25, review G "Weak")."""
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
