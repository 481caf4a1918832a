"""The trainer config surface: YAML documentation, LUFFY's override list, key/value checks, batch sizes.

In-process (Hydra's compose API), so each check costs milliseconds; the command-line behaviour (exit
codes, Hydra flags, the shell scripts) is pinned by test_main_mix_ppo_cli.py.
"""

import os
import shlex

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from luffy_pool.config.check import (
    CONFIG_DIR,
    ConfigError,
    check_config,
    prepare_overrides,
    schema_defaults,
    suggest_key,
    validate_config,
)
from verl.utils.batch_sizes import (
    BatchSizeError,
    normalize_actor_batch_sizes,
    optimizer_steps_per_training_step,
    rows_per_rank,
)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"

# LUFFY's exp_scripts/train.sh override list (docs/METHOD.md §2.1), verbatim and in the script's order.
LUFFY_TRAIN_SH = r"""
    algorithm.adv_estimator=grpo data.train_files=$DATA_DIR/openr1.parquet data.val_files=$DATA_DIR/valid.parquet
    data.train_batch_size=128 data.val_batch_size=512 data.max_prompt_length=1024 data.max_response_length=8192
    actor_rollout_ref.model.path=$MODEL_PATH actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=64
    actor_rollout_ref.actor.ppo_micro_batch_size=64 actor_rollout_ref.actor.use_dynamic_bsz=True
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768 actor_rollout_ref.actor.kl_loss_coef=0.00
    actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.ulysses_sequence_parallel_size=1
    actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.grad_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.val_temperature=0.6
    actor_rollout_ref.rollout.gpu_memory_utilization=0.80 actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.n_val=1
    actor_rollout_ref.ref.fsdp_config.param_offload=True actor_rollout_ref.rollout.max_prefix_len=8192
    algorithm.kl_ctrl.kl_coef=0.000 actor_rollout_ref.actor.entropy_coeff=0.001 trainer.critic_warmup=0
    trainer.logger=['console','wandb'] trainer.project_name="$WANDB_PROJECT" trainer.experiment_name="$EXP_NAME"
    +trainer.val_before_train=False trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=50
    trainer.test_freq=10 actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.use_sft_prefix_reward=False
    actor_rollout_ref.rollout.prefix_share_across_samples=False actor_rollout_ref.rollout.prefix_strategy=random
    actor_rollout_ref.rollout.n_prefix=1 actor_rollout_ref.rollout.min_prefix_ratio=1.0
    actor_rollout_ref.rollout.max_prefix_ratio=1.0 actor_rollout_ref.rollout.prefix_reward_weight_alpha=1.0
    actor_rollout_ref.ref.use_ref=False actor_rollout_ref.actor.use_off_policy_loss=True
    actor_rollout_ref.actor.off_policy_normalize=False actor_rollout_ref.actor.off_policy_reshape="p_div_p_0.1"
    actor_rollout_ref.actor.off_policy_loss_impl=token algorithm.grpo_use_std=False
    actor_rollout_ref.actor.loss_remove_token_mean=True actor_rollout_ref.actor.loss_remove_clip=True
    data.reward_impl_version=3 trainer.max_optim_to_keep=2 data.shuffle=True trainer.default_hdfs_dir=null
    trainer.total_epochs=30
"""
LUFFY_ENV = {
    "$DATA_DIR": "/data",
    "$MODEL_PATH": "/models/qwen",
    "$WANDB_PROJECT": "luffy-math-test",
    "$EXP_NAME": "LUFFY_TEST",
}

# Every key of LUFFY's mix_ppo_trainer.yaml except the critic section and reward-model internals.
LUFFY_YAML_KEYS = {
    "data": "tokenizer train_files val_files prompt_key max_prompt_length max_response_length train_batch_size "
    "val_batch_size return_raw_input_ids return_raw_chat reward_impl_version filter_targets shuffle "
    "sample_target_ratio filter_accuracy accuracy_lower_bound accuracy_upper_bound add_tgt_with_acc "
    "add_tgt_acc_upper_bound disable_truncation_advantage",
    "actor_rollout_ref": "hybrid_engine",
    "actor_rollout_ref.model": "path external_lib override_config enable_gradient_checkpointing use_remove_padding",
    A: "strategy ppo_mini_batch_size ppo_micro_batch_size use_dynamic_bsz ppo_max_token_len_per_gpu grad_clip "
    "clip_ratio clip_upper_bound entropy_coeff use_kl_loss kl_loss_coef kl_loss_type ppo_epochs shuffle "
    "ulysses_sequence_parallel_size use_sft_prefix_reward use_sft_reward use_off_policy_loss off_policy_loss_impl "
    "off_policy_cliprange off_policy_normalize use_off_policy_probs use_off_policy_clip off_policy_max_clip "
    "off_policy_min_clip off_policy_reshape off_policy_reshape_weight off_policy_reshape_pow_exp on_policy_reshape "
    "on_policy_reshape_weight on_policy_reshape_pow_exp sft_prefix_reward_weight all_max_clip use_ppo_kl_loss "
    "ppo_kl_loss_coef use_adaptive_temperature use_adaptive_temperature_fixed adaptive_temperature_clip "
    "adaptive_temperature_target_entropy alpha_lr debug use_target_lst loss_remove_token_mean loss_remove_clip",
    f"{A}.optim": "lr lr_warmup_steps_ratio min_lr_ratio warmup_style total_training_steps",
    f"{A}.fsdp_config": "param_offload grad_offload optimizer_offload fsdp_size wrap_policy.min_num_params",
    "actor_rollout_ref.ref": "log_prob_micro_batch_size log_prob_use_dynamic_bsz log_prob_max_token_len_per_gpu "
    "ulysses_sequence_parallel_size use_ref fsdp_config.param_offload "
    "fsdp_config.wrap_policy.min_num_params",
    R: "name temperature val_temperature top_k top_p prompt_length response_length dtype gpu_memory_utilization "
    "ignore_eos enforce_eager free_cache_engine load_format tensor_model_parallel_size max_num_batched_tokens "
    "max_num_seqs log_prob_micro_batch_size log_prob_use_dynamic_bsz log_prob_max_token_len_per_gpu "
    "enable_chunked_prefill do_sample n n_val prefix_strategy prefix_steps prefix_linear_max_ratio "
    "prefix_linear_max_var max_prefix_len min_prefix_ratio max_prefix_ratio prefix_reward_strategy "
    "prefix_reward_weight_alpha prefix_reward_weight_beta prefix_share_across_samples n_prefix",
    "reward_model": "enable",
    "algorithm": "gamma lam adv_estimator kl_penalty grpo_use_std surprisal_base kl_ctrl.type kl_ctrl.kl_coef",
    "trainer": "rejection_sample rejection_sample_multiplier total_epochs total_training_steps project_name "
    "experiment_name logger nnodes n_gpus_per_node save_freq max_optim_to_keep resume_mode "
    "resume_from_path test_freq critic_warmup default_hdfs_dir default_local_dir debug "
    "add_full_target_when_none skip_valid_mask acc_rebatch skip_by_step",
}


def luffy_overrides() -> list[str]:
    """LUFFY's train.sh list (docs/METHOD.md §2.1) as the shell hands it to Python (variables expanded, quotes removed)."""
    text = LUFFY_TRAIN_SH
    for var, value in LUFFY_ENV.items():
        text = text.replace(var, value)
    return shlex.split(text)


def train_sh_overrides() -> list[str]:
    """The override list of exp_scripts/train.sh, expanded the way bash does."""
    text = open(os.path.join(REPO, "exp_scripts", "train.sh")).read()
    body = text.split("-m verl.mix_src.main_mix_ppo", 1)[1].split('"${LUFFY_TRAINER[@]}"', 1)[0].replace("\\\n", " ")
    for var, value in LUFFY_ENV.items():
        body = body.replace(var, value)
    return shlex.split(body)


def parsed(overrides: list[str]) -> list[tuple[str, str, object]]:
    return [
        (o.get_key_element(), o.key_or_group, o.value()) for o in OverridesParser.create().parse_overrides(overrides)
    ]


def composed(overrides=(), config_name="mix_ppo_trainer"):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name, overrides=prepare_overrides(list(overrides)))


def minimal(*extra):
    return ["data.train_files=/d/t.parquet", "data.val_files=/d/v.parquet", "actor_rollout_ref.model.path=/m", *extra]


@pytest.fixture(scope="module")
def luffy_config():
    return composed(luffy_overrides())


# ---------------------------------------------------------------------------------------------- YAML
@pytest.mark.parametrize("name", ["mix_ppo_trainer.yaml", "tiny_cpu_luffy.yaml"])
def test_every_yaml_key_has_a_comment_line_above_it(name):
    path = os.path.join(CONFIG_DIR, name)
    lines = open(path).read().splitlines()
    missing, stack = [], [yaml.compose(open(path).read())]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                line = key.start_mark.line
                if not (line > 0 and lines[line - 1].lstrip().startswith("#")):
                    missing.append(f"{name}:{line + 1}: {lines[line].strip()}")
                stack.append(value)
    assert not missing, "keys without a comment line above them:\n" + "\n".join(missing)


def test_yaml_has_every_key_of_luffys_yaml():
    keys = set(schema_defaults())
    absent = [
        f"{section}.{leaf}"
        for section, leaves in LUFFY_YAML_KEYS.items()
        for leaf in leaves.split()
        if f"{section}.{leaf}" not in keys
    ]
    assert not absent


def test_val_before_train_is_not_in_the_yaml_so_plus_works():
    assert "trainer.val_before_train" not in schema_defaults()
    assert "val_before_train" in open(os.path.join(CONFIG_DIR, "mix_ppo_trainer.yaml")).read()


# ------------------------------------------------------------------------------ LUFFY's override list
def test_train_sh_passes_luffys_override_list_verbatim():
    # Only difference allowed: the logger list is quoted in our script (same parsed value).
    assert parsed(train_sh_overrides()) == parsed(luffy_overrides())


def test_luffy_overrides_compose_and_validate(luffy_config):
    cfg = luffy_config
    assert validate_config(cfg) == []
    assert cfg.trainer.val_before_train is False
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.actor_rollout_ref.actor.off_policy_reshape == "p_div_p_0.1"
    assert cfg.algorithm.kl_ctrl.kl_coef == 0.0 and cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.data.train_files == "/data/openr1.parquet" and cfg.trainer.default_hdfs_dir is None
    assert (cfg.actor_rollout_ref.rollout.n, cfg.actor_rollout_ref.rollout.n_prefix) == (8, 1)
    assert cfg.actor_rollout_ref.rollout.response_length == 8192  # interpolation follows data.max_response_length


def test_tiny_cpu_config_validates_with_two_ranks():
    cfg = composed(["trainer.total_training_steps=3"], config_name="tiny_cpu_luffy")
    assert validate_config(cfg) == []
    assert (cfg.trainer.device, cfg.trainer.n_gpus_per_node, cfg.actor_rollout_ref.rollout.n) == ("cpu", 2, 8)
    sizes = normalize_actor_batch_sizes(cfg.actor_rollout_ref.actor, 8, 2)
    assert (sizes["ppo_mini_batch_size_per_rank"], sizes["gradient_accumulation"]) == (
        64,
        1,
    )  # 16 prompts x 8 / 2 ranks
    assert optimizer_steps_per_training_step(8, 8, 2, 16) == 2


# ------------------------------------------------------------------------------- command-line keys
def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError) as err:
        prepare_overrides(["actor_rollout_ref.actor.ppo_mini_batchsize=4"])
    assert str(err.value) == (
        "Unknown config key 'actor_rollout_ref.actor.ppo_mini_batchsize'; "
        "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'?"
    )


def test_every_bad_key_is_reported_on_its_own_line():
    with pytest.raises(ConfigError) as err:
        prepare_overrides(
            [
                "trainer.n_gpu_per_node=2",
                "+trainer.val_before_trian=False",
                "~trainer.seed",
                "critic.ppo_micro_batch_size=4",
            ]
        )
    lines = err.value.errors
    assert lines[0] == "Unknown config key 'trainer.n_gpu_per_node'; did you mean 'trainer.n_gpus_per_node'?"
    assert lines[1].startswith(
        "Unknown config key 'trainer.val_before_trian'; did you mean 'trainer.val_before_train'?"
    )
    assert "'+' only adds" in lines[1]
    assert lines[2] == "Deleting config keys is not supported: '~trainer.seed'"
    assert "critic (value model) is not shipped" in lines[3]


def test_plus_forms_are_normalised_for_hydra():
    assert prepare_overrides(
        [
            "+trainer.val_before_train=False",
            "trainer.val_before_train=True",
            f"+{A}.use_sft_multitask_loss=False",
            "++trainer.seed=3",
            "+actor_rollout_ref.model.override_config.rope_theta=1e4",
            "hydra.run.dir=/tmp/x",
            "trainer.total_training_steps=1,2",
        ]
    ) == [
        "++trainer.val_before_train=False",
        "++trainer.val_before_train=True",
        f"{A}.use_sft_multitask_loss=False",
        "trainer.seed=3",
        "++actor_rollout_ref.model.override_config.rope_theta=1e4",
        "hydra.run.dir=/tmp/x",
        "trainer.total_training_steps=1,2",
    ]


def test_suggestion_falls_back_to_the_last_segment():
    assert suggest_key("trainer.ppo_mini_batch_size") == f"{A}.ppo_mini_batch_size"


# -------------------------------------------------------------------------------- composed values
@pytest.mark.parametrize(
    "override, expected",
    [
        (
            f"{A}.off_policy_reshape=p_div_p_01",
            f"'{A}.off_policy_reshape'='p_div_p_01' is not one of: no_reshape, logp, p_logp, square_root, pow, "
            "p_div_p_0.1, p_div_p_0.3, p_div_p_0.5 (did you mean 'p_div_p_0.1'?)",
        ),
        ("algorithm.adv_estimator=gae", "'algorithm.adv_estimator'='gae' is not supported: needs a critic"),
        (f"{A}.off_policy_loss_impl=seq", f"'{A}.off_policy_loss_impl'='seq' is not supported"),
        (f"{R}.prefix_strategy=linearr", f"'{R}.prefix_strategy'='linearr' is not one of: random, fixed, linear"),
        (f"{A}.optim.warmup_style=linear", f"'{A}.optim.warmup_style'='linear' is not one of: constant, cosine"),
        (f"{A}.kl_loss_type=k3", f"'{A}.kl_loss_type'='k3' is not one of: kl, abs, mse, low_var_kl"),
        ("algorithm.kl_penalty=full", "'algorithm.kl_penalty'='full' is not one of: kl, abs, mse, low_var_kl"),
        (f"{R}.name=sglang", f"'{R}.name'='sglang' is not one of: vllm, hf"),
        ("trainer.device=tpu", "'trainer.device'='tpu' is not one of: auto, cpu, cuda"),
        (f"{A}.strategy=megatron", f"'{A}.strategy'='megatron' is not one of: fsdp, fsdp2"),
        ("trainer.logger=[console,mlflw]", "'trainer.logger'='mlflw' is not one of: console"),
        (f"{A}.fsdp_config.grad_offload=True", f"'{A}.fsdp_config.grad_offload'=True is not supported"),
        (
            f"{A}.ulysses_sequence_parallel_size=2 actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
            "'actor_rollout_ref.ref.ulysses_sequence_parallel_size'=1 must equal",
        ),
        (
            f"{A}.ulysses_sequence_parallel_size=2 actor_rollout_ref.model.attn_implementation=eager",
            f"'{A}.ulysses_sequence_parallel_size'=2 needs sdpa or flash attention",
        ),
        (f"{A}.ulysses_sequence_parallel_size=3", f"{A}.ulysses_sequence_parallel_size=3 must divide the world size 8"),
        (f"{A}.fsdp_config.fsdp_size=3", f"'{A}.fsdp_config.fsdp_size'=3 must divide the world size 8"),
        (f"{A}.tensor_model_parallel_size=3", f"'{A}.tensor_model_parallel_size'=3 must divide the world size 8"),
        ("reward_model.enable=True", "'reward_model.enable'=True is not supported"),
        (
            "actor_rollout_ref.hybrid_engine=False",
            "'actor_rollout_ref.hybrid_engine'=False needs 'actor_rollout_ref.rollout.n_gpus_per_node' >= 1",
        ),
        (
            "trainer.rollout_pipeline=one_step_off",
            "'trainer.rollout_pipeline'=one_step_off needs 'actor_rollout_ref.hybrid_engine'=False",
        ),
        (
            "trainer.rollout_pipeline=one_step_off actor_rollout_ref.hybrid_engine=False "
            "actor_rollout_ref.rollout.n_gpus_per_node=4 trainer.n_gpus_per_node=4 algorithm.method=relift "
            # relift's preset (luffy_pool/config/method/relift.yaml), stated: LUFFY's values would be refused first
            "actor_rollout_ref.actor.use_off_policy_loss=False actor_rollout_ref.rollout.n_prefix=0",
            "'algorithm.method'=relift keeps state between its steps (experience pool or SFT buffer)",
        ),
        (
            "actor_rollout_ref.rollout.n_gpus_per_node=2",
            "'actor_rollout_ref.rollout.n_gpus_per_node'=2 / "
            "'actor_rollout_ref.rollout.nnodes'=1 place the rollout engines",
        ),
        ("trainer.acc_rebatch=True", "'trainer.acc_rebatch'=True is not supported (LUFFY's accuracy-rebatching"),
        (f"{R}.prefix_reward_strategy=none", f"'{R}.prefix_reward_strategy'='none' is not supported (the key is inert"),
        ("trainer.nnodes=1.5", "'trainer.nnodes' must be int, got 1.5"),
        (
            "actor_rollout_ref.model.logprob_chunk_size=-1",
            "'actor_rollout_ref.model.logprob_chunk_size'=-1 must be >= 0",
        ),
        (f"{A}.use_kl_loss=yes", f"'{A}.use_kl_loss' must be bool, got 'yes'"),
        (f"{R}.top_p=0", f"'{R}.top_p'=0 must be in (0, 1]"),
        (f"{R}.n_prefix=9", f"'{R}.n_prefix'=9 must be -1 (all slots) or in [0, rollout.n=8]"),
        (f"{R}.min_prefix_ratio=0.9", f"'{R}.min_prefix_ratio'=0.9 exceeds '{R}.max_prefix_ratio'=0.5"),
        (f"{R}.response_length=100", f"'{R}.response_length'=100 must equal 'data.max_response_length'=8192"),
        (
            f"{A}.use_sft_multitask_loss=True algorithm.adv_estimator=grpo_split",
            f"'{A}.use_sft_multitask_loss'=True cannot be combined with '{A}.use_off_policy_loss'=True",
        ),
        (
            f"{A}.use_sft_multitask_loss=True {A}.use_off_policy_loss=False",
            f"'{A}.use_sft_multitask_loss'=True needs 'algorithm.adv_estimator'=grpo_split",
        ),
        (f"{A}.use_sft_prefix_reward=True", f"'{A}.use_sft_prefix_reward'=True needs '{R}.n_prefix'=-1, got 1"),
        (f"{A}.use_kl_loss=True", f"'{A}.use_kl_loss'=True needs 'actor_rollout_ref.ref.use_ref'=True"),
        (f"{R}.prefix_strategy=linear", f"'{R}.prefix_strategy'=linear needs '{R}.prefix_share_across_samples'=True"),
        ("trainer.resume_mode=latest", "'trainer.resume_mode'='latest' must be auto, disable, resume_path"),
        ("trainer.max_restarts=-1", "'trainer.max_restarts'=-1 must be >= 0"),
        ("trainer.restart_wait_s=1.5", "'trainer.restart_wait_s' must be int, got 1.5"),
        ("data.val_files=???", "'data.val_files' is required"),
    ],
)
def test_bad_value_is_one_line_naming_the_key(luffy_config, override, expected):
    cfg = luffy_config.copy()
    cfg.actor_rollout_ref.rollout.max_prefix_ratio = 0.5 if "min_prefix_ratio" in override else 1.0
    for ov in OverridesParser.create().parse_overrides(override.split()):
        OmegaConf.update(cfg, ov.key_or_group, ov.value(), merge=False)
    errors = validate_config(cfg)
    assert len(errors) == 1 and errors[0].startswith(expected), errors


@pytest.mark.parametrize(
    "override",
    [
        f"{A}.ulysses_sequence_parallel_size=2",
        f"{A}.ulysses_sequence_parallel_size=4",
        f"{A}.fsdp_config.fsdp_size=4",
        f"{A}.fsdp_config.fsdp_size=8",
    ],
)
def test_ulysses_sp_and_hsdp_layouts_are_accepted(luffy_config, override):
    cfg = luffy_config.copy()
    for ov in OverridesParser.create().parse_overrides([override]):
        OmegaConf.update(cfg, ov.key_or_group, ov.value(), merge=False)
    assert validate_config(cfg) == []


def test_sp_that_does_not_split_the_local_models_heads_is_named(luffy_config, tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 28, "num_key_value_heads": 4}))
    cfg = luffy_config.copy()
    OmegaConf.update(cfg, "actor_rollout_ref.model.path", str(tmp_path), merge=False)
    OmegaConf.update(cfg, f"{A}.ulysses_sequence_parallel_size", 4, merge=False)
    assert validate_config(cfg) == []  # Qwen2.5-7B's 28 heads / 4 kv heads split over 4 ranks
    OmegaConf.update(cfg, f"{A}.ulysses_sequence_parallel_size", 8, merge=False)
    errors = validate_config(cfg)
    assert len(errors) == 1 and "must divide the model's num_attention_heads=28" in errors[0], errors
    assert str(tmp_path) in errors[0]


@pytest.mark.parametrize(
    "changes, expected",
    [
        (
            {"data.train_batch_size": 100, "trainer.n_gpus_per_node": 3, f"{R}.tensor_model_parallel_size": 1},
            "data.train_batch_size * actor_rollout_ref.rollout.n = 100*8 = 800 rows do not split evenly over world size 3",
        ),
        (
            {"trainer.nnodes": 2, f"{A}.ppo_mini_batch_size": 1, f"{A}.ppo_micro_batch_size": 1},
            f"{A}.ppo_mini_batch_size * actor_rollout_ref.rollout.n = 1*8 = 8 rows do not split evenly over 16",
        ),
        (
            {f"{A}.ppo_mini_batch_size": 3, f"{A}.ppo_micro_batch_size": 3},
            "data.train_batch_size=128 is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size: 128 rows per "
            "rank do not split into mini-batches of 3 rows",
        ),
        ({f"{A}.ppo_micro_batch_size": 48}, f"{A}.ppo_micro_batch_size gives 48 rows per rank, which does not divide"),
        (
            {f"{A}.ppo_mini_batch_size": 96, f"{A}.ppo_micro_batch_size": 32},
            "data.train_batch_size=128 is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size",
        ),
        (
            {
                "trainer.n_gpus_per_node": 3,
                "data.train_batch_size": 96,
                f"{A}.ppo_mini_batch_size": 96,
                f"{A}.ppo_micro_batch_size": 96,
            },
            f"'{R}.tensor_model_parallel_size'=2 must divide the world size 3",
        ),
    ],
)
def test_batch_divisibility_errors_name_the_keys(luffy_config, changes, expected):
    cfg = luffy_config.copy()
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    errors = validate_config(cfg)
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_unknown_key_in_a_composed_config_is_reported(luffy_config):
    cfg = luffy_config.copy()
    OmegaConf.set_struct(cfg, False)
    cfg.trainer.totl_epochs = 3
    assert validate_config(cfg) == ["Unknown config key 'trainer.totl_epochs'; did you mean 'trainer.total_epochs'?"]


def test_check_config_raises_with_every_error(luffy_config):
    cfg = luffy_config.copy()
    cfg.trainer.device, cfg.reward_model.enable = "gpu", True
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert len(err.value.errors) == 2 and str(err.value).count("\n") == 1


# ------------------------------------------------------------------------------------- batch sizes
def test_luffy_batch_sizes_normalise_to_64_rows_per_rank_and_two_optimizer_steps():
    actor = {"ppo_mini_batch_size": 64, "ppo_micro_batch_size": 64, "ppo_micro_batch_size_per_gpu": None}
    sizes = normalize_actor_batch_sizes(actor, rollout_n=8, world_size=8, log_prob_micro_batch_size=128)
    assert sizes == {
        "ppo_mini_batch_size_per_rank": 64,
        "ppo_micro_batch_size_per_rank": 64,
        "gradient_accumulation": 1,
        "log_prob_micro_batch_size_per_rank": 128,
    }
    assert rows_per_rank(128, 8, 8) == 128
    assert optimizer_steps_per_training_step(128, 8, 8, sizes["ppo_mini_batch_size_per_rank"]) == 2
    assert optimizer_steps_per_training_step(128, 8, 8, 64, ppo_epochs=3) == 6


def test_micro_batch_size_per_gpu_is_already_rows_per_rank():
    actor = {"ppo_mini_batch_size": 64, "ppo_micro_batch_size": 64, "ppo_micro_batch_size_per_gpu": 16}
    sizes = normalize_actor_batch_sizes(actor, rollout_n=8, world_size=8)
    assert (sizes["ppo_micro_batch_size_per_rank"], sizes["gradient_accumulation"]) == (16, 4)
    assert sizes["log_prob_micro_batch_size_per_rank"] is None


def test_normalisation_divides_by_data_parallel_ranks_not_world_size():
    actor = {"ppo_mini_batch_size": 64, "ppo_micro_batch_size": 16}
    sizes = normalize_actor_batch_sizes(actor, rollout_n=8, world_size=8, sp_size=2)
    assert sizes["ppo_mini_batch_size_per_rank"] == 128 and sizes["gradient_accumulation"] == 4


def test_log_prob_micro_batch_is_floored_per_rank_then_times_n():
    actor = {"ppo_mini_batch_size": 8, "ppo_micro_batch_size": 8}
    sizes = normalize_actor_batch_sizes(actor, rollout_n=8, world_size=8, log_prob_micro_batch_size=12)
    assert sizes["log_prob_micro_batch_size_per_rank"] == (12 // 8) * 8
    with pytest.raises(BatchSizeError, match="smaller than the 8 data-parallel ranks"):
        normalize_actor_batch_sizes(actor, rollout_n=8, world_size=8, log_prob_micro_batch_size=4)


def test_missing_micro_batch_size_names_both_keys():
    with pytest.raises(BatchSizeError, match="ppo_micro_batch_size \\(prompts\\) or .*ppo_micro_batch_size_per_gpu"):
        normalize_actor_batch_sizes({"ppo_mini_batch_size": 8, "ppo_micro_batch_size": None}, 8, 8)


def test_cpu_speed_keys_are_checked_by_name(luffy_config):
    cfg = luffy_config.copy()
    OmegaConf.update(cfg, "trainer.cpu_bind", "maybe", merge=False)
    OmegaConf.update(cfg, "actor_rollout_ref.actor.optim.step_impl", "fast", merge=False)
    OmegaConf.update(cfg, "ray_init.max_direct_call_object_size", 0, merge=False)
    errors = validate_config(cfg)
    assert len(errors) == 3, errors
    for key in ("trainer.cpu_bind", "actor_rollout_ref.actor.optim.step_impl", "ray_init.max_direct_call_object_size"):
        assert any(key in e for e in errors), (key, errors)
    ok = luffy_config.copy()
    OmegaConf.update(ok, "ray_init.max_direct_call_object_size", 2000000, merge=False)
    OmegaConf.update(ok, "actor_rollout_ref.actor.optim.step_impl", "foreach", merge=False)
    assert validate_config(ok) == []
