"""Each family launch script (exp_scripts/train_<method>.sh) against its authors' released training script, key by key.

The tables below hold the authors' values for what the keys mean in common (reward, validation sampling, lengths,
gradient-skip bounds, learning rate and its schedule, batch sizes, epochs and steps), each with its source:
repository, commit, file and line, read from the authors' repositories at the commits the scripts name. The test
composes each script's config through its own command line (``luffy_pool.run.recipe.read_recipe``, as the rehearsal
does) and compares. A value that deliberately differs (a setting this project does not have, a hardware-bound
value, a grader it does not ship) states the composed value (``ours``) and a phrase the script's comments must
carry (``why``), so every difference is said where the script is read. A setting with no key here (``key=None``)
only needs that comment. The record types and the tables of RL-PLUS, QuestA, AMPO, SDPO and SDFT are in
tests/helpers/authors_settings.py.

Not in the tables (not found, so not guessed): CHORD's learning rate and trainer settings (Trinity-RFT's
examples/mix_chord/mix_chord.yaml names examples/mix_chord/train_chord.yaml for them, a file the stored copy of the
repository does not hold) and CHORD's reward (Trinity's math_boxed_workflow); Prefix-RFT's settings beyond the three
its paper states (no code was released); QuestA's stage-2 hint ratio 0.25 (only the name partial_50_25_grpo.yaml and
the README's `--ratio ratio` say it) and whether AReaL's first update runs at lr 0 (transformers' warm-up of
int(0.001 x total steps) steps: it does from 1,000 steps on, and the total depends on the data set, not released);
TRL's learning rate and batch sizes (transformers' TrainingArguments defaults, not in the TRL wheel); SDPO/SDFT
teacher_sync_steps and SDFT's teacher_prompt_template (no key here). SDPO and SDFT follow the TRL 1.16.0 wheel
(``pip download trl==1.16.0``): their source is the package, no commit.
"""

from __future__ import annotations

import functools
import math
import os
import re

import pytest

from luffy_pool.run.recipe import read_recipe
from tests.helpers.authors_settings import AMPO, QUESTA, RL_PLUS, SAME, SDFT, SDPO, A, F, R, _at

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

LUFFY_REPO = ("ElliottYan/LUFFY", "01f4ae066249e6965ce0d5512ccdf99a12895c74")
HPT_REPO = ("TsinghuaC3I/Unify-Post-Training", "ae332f5fa4dc8b4c3d3cd77ebc9cff3a3abab2d0")
RELIFT_REPO = ("TheRoadQaQ/ReLIFT", "eb95454f45eb84bf8f8efa3728f4839548426f5f")
UFT_REPO = ("liumy2010/UFT", "ad3c8ec7d258d4e4cf3f359dd75925d0f127a520")
TRINITY_REPO = ("modelscope/Trinity-RFT", "041433056e9067e35a42a3943ecbaf89bef24518")
PREFIX_RFT_PAPER = ("arXiv 2507.01679", None)  # no public code: the paper


# ---------------------------------------------------------------------- ExGRPO: ElliottYan/LUFFY ExGRPO/
ex = _at(LUFFY_REPO, "ExGRPO/exp_scripts/run_exgrpo.sh")
ex_yaml = _at(LUFFY_REPO, "ExGRPO/exgrpo/verl/verl/mix_src/config/mix_ppo_trainer.yaml")
EXGRPO = [
    ex(29, "algorithm.exgrpo.traj_metric", "ent"),
    ex(30, "algorithm.exgrpo.traj_select", "argmin"),
    ex(31, "algorithm.exgrpo.sample_range", "all"),
    ex(32, "algorithm.exgrpo.bucket_weighting", "normal"),
    ex(33, "algorithm.exgrpo.experience_ratio", 0.5),
    ex(34, "algorithm.exgrpo.start_solved_ratio", 0.35),
    ex(35, "algorithm.exgrpo.is_correct", True),
    ex(36, "algorithm.exgrpo.lbound", 0),
    ex(37, "algorithm.exgrpo.rbound", 7),
    ex(40, "data.train_batch_size", 128),
    ex(41, "data.val_batch_size", 512),
    ex(42, "data.max_prompt_length", 1024),
    ex(43, "data.max_response_length", 8192),
    ex(45, A + "optim.lr", 1e-6),
    ex(47, A + "ppo_mini_batch_size", 64),
    ex(48, A + "ppo_micro_batch_size", 64),
    ex(49, A + "use_dynamic_bsz", True),
    ex(50, A + "ppo_max_token_len_per_gpu", 32768),
    ex(51, A + "kl_loss_coef", 0.0),
    ex(60, R + "temperature", 1.0),
    ex(61, R + "val_temperature", 0.6),
    ex(63, R + "n", 8),
    ex(64, R + "n_val", 1),
    ex(66, R + "max_prefix_len", 8192),
    ex(68, A + "entropy_coeff", 0.001),
    ex(74, "trainer.val_before_train", False),
    ex(77, "trainer.save_freq", 50),
    ex(78, "trainer.test_freq", 10),
    ex(79, A + "use_kl_loss", False),
    # their n_prefix=1 only takes effect for replayed questions (mix_vllm_rollout_exp.py); ours: the preset's 0
    ex(83, R + "n_prefix", 1, ours=0, why="n_prefix=1 of train.sh becomes 0"),
    ex(90, A + "off_policy_reshape", "p_div_p_0.1"),
    ex(92, "algorithm.grpo_use_std", False),
    ex(93, A + "loss_remove_token_mean", True),
    ex(94, A + "loss_remove_clip", True),
    ex(95, "data.reward_impl_version", 3),
    ex(99, A + "skip_grad_bound", 500),
    ex(100, "trainer.total_training_steps", 701),
    ex_yaml(38, A + "grad_clip", 1.0),
    ex_yaml(39, A + "clip_ratio", 0.2),
    ex_yaml(40, A + "clip_upper_bound", 1.0),
    ex_yaml(50, A + "optim.lr_warmup_steps_ratio", 0.0),
    ex_yaml(52, A + "optim.warmup_style", "constant"),
    ex_yaml(210, "trainer.total_epochs", 30),
    # lr_lambda(step) = min(1, step / max(1, warmup)): 0 at the first update
    _at(LUFFY_REPO, "ExGRPO/exgrpo/verl/verl/utils/torch_functional.py")(
        "441-442", A + "optim.zero_lr_first_step", True
    ),
    # the counter is raised, then compared with the total: total - 1 updates
    _at(LUFFY_REPO, "ExGRPO/exgrpo/verl/verl/mix_src/mix_trainer_experience.py")(
        "543-545", "trainer.stop_one_step_early", True
    ),
]

# ---------------------------------------------------------------------- HPT and SRFT: TsinghuaC3I/Unify-Post-Training
hpt_yaml = _at(HPT_REPO, "hpt/verl/verl/mix_src/config/mix_ppo_trainer.yaml")
HPT_CODE = [  # their trainer's defaults and schedule, shared by train.sh and train_srft.sh
    hpt_yaml(38, A + "grad_clip", 1.0),
    hpt_yaml(50, A + "optim.lr_warmup_steps_ratio", 0.0),
    hpt_yaml(52, A + "optim.warmup_style", "constant"),
    hpt_yaml(216, "trainer.total_epochs", 30),
    _at(HPT_REPO, "hpt/verl/verl/utils/torch_functional.py")("428-429", A + "optim.zero_lr_first_step", True),
    _at(HPT_REPO, "hpt/verl/verl/mix_src/mix_trainer.py")("1263-1265", "trainer.stop_one_step_early", True),
    # their MIX rollout validates at top_p 1.0 (and val_temperature), whatever val_top_p says; ours always does
    _at(HPT_REPO, "hpt/verl/verl/mix_src/mix_vllm_rollout.py")("235-245", None, 1.0, why="val_top_p=0.95"),
]
# reward_impl_version 6: their copy of the Dr. GRPO grader (hpt/verl/verl/mix_src/main_mix_ppo.py lines 51-53,
# entropy_math/__init__.py compute_score); ours has 0-4: version 4 (no think format) with the any-grader
REWARD_6 = dict(ours=4, why="reward_impl_version=6")
GRADER_6 = _at(HPT_REPO, "hpt/verl/verl/mix_src/main_mix_ppo.py")(
    "51-53", "reward.grader", "entropy_math.compute_score", ours="any", why="reward.grader=any"
)
hpt = _at(HPT_REPO, "exp_scripts/train.sh")
HPT = HPT_CODE + [
    hpt(25, "algorithm.hpt.switch_gate", 0),
    hpt(28, A + "sft_loss_coef", 1.0),
    hpt(30, A + "skip_grad_bound", 80),  # their max_grad_norm: a step skip above it, not a clip
    hpt(32, A + "optim.lr", 5e-6),
    hpt(48, "data.train_batch_size", 128),
    hpt(49, "data.val_batch_size", 512),
    hpt(50, "data.max_prompt_length", 1024),
    hpt(51, "data.max_response_length", 8192),
    hpt(55, A + "ppo_mini_batch_size", 64),
    hpt(56, A + "ppo_micro_batch_size", 64),
    hpt(57, A + "use_dynamic_bsz", True),
    hpt(58, A + "ppo_max_token_len_per_gpu", 32768),
    hpt(59, A + "kl_loss_coef", 0.0),
    hpt(69, R + "temperature", 1.0),
    hpt(71, R + "n", 8),
    # the verify rollouts: ours share the group with the demonstration slot
    hpt(72, R + "n - " + R + "n_prefix", 8, ours=7, why="n_verify=8"),
    hpt(73, R + "val_temperature", 0.6),
    hpt(75, R + "n_val", 8),
    hpt(77, R + "max_prefix_len", 8192),
    hpt(79, A + "entropy_coeff", 0.001),
    hpt(84, "trainer.val_before_train", True),
    hpt(87, "trainer.save_freq", 50),
    hpt(88, "trainer.test_freq", 10),
    hpt(94, A + "use_kl_loss", False),
    hpt(98, R + "n_prefix", 1),
    hpt(99, R + "min_prefix_ratio", 1.0),
    hpt(100, R + "max_prefix_ratio", 1.0),
    hpt(107, "algorithm.grpo_use_std", False),
    hpt(108, A + "loss_remove_token_mean", True),
    hpt(109, A + "loss_remove_clip", True),
    hpt(110, "data.reward_impl_version", 6, **REWARD_6),
    GRADER_6,
    hpt(114, "trainer.total_training_steps", 500),
]
srft = _at(HPT_REPO, "exp_scripts/train_srft.sh")
SRFT = HPT_CODE + [
    srft(29, A + "optim.lr", 1e-6),
    srft(46, "data.train_batch_size", 128),
    srft(47, "data.val_batch_size", 512),
    srft(48, "data.max_prompt_length", 1024),
    srft(49, "data.max_response_length", 8192),
    srft(53, A + "ppo_mini_batch_size", 64),
    srft(54, A + "ppo_micro_batch_size", 64),
    srft(55, A + "use_dynamic_bsz", True),
    srft(56, A + "ppo_max_token_len_per_gpu", 32768),
    srft(57, A + "kl_loss_coef", 0.0),
    srft(66, R + "temperature", 1.0),
    srft(68, R + "n", 8),
    srft(70, R + "val_temperature", 0.6),
    srft(72, R + "n_val", 8),
    srft(74, R + "max_prefix_len", 8192),
    srft(76, A + "entropy_coeff", 0.001),
    srft(81, "trainer.val_before_train", True),
    srft(84, "trainer.save_freq", 50),
    srft(85, "trainer.test_freq", 10),
    srft(90, A + "use_kl_loss", False),
    srft(94, R + "n_prefix", 1),
    srft(95, R + "min_prefix_ratio", 1.0),
    srft(96, R + "max_prefix_ratio", 1.0),
    srft(100, A + "off_policy_reshape", "p_div_p_0.1"),
    srft(102, "algorithm.grpo_use_std", False),
    srft(103, A + "loss_remove_token_mean", True),
    srft(104, A + "loss_remove_clip", True),
    srft(105, "data.reward_impl_version", 6, **REWARD_6),
    GRADER_6,
    srft(109, "trainer.total_training_steps", 500),
]

# ---------------------------------------------------------------------- ReLIFT: TheRoadQaQ/ReLIFT
rl = _at(RELIFT_REPO, "examples/math-7b/train.sh")
rl_yaml = _at(RELIFT_REPO, "relift/verl/verl/relift/config/relift_trainer.yaml")
RELIFT = [
    rl(17, "algorithm.relift.sft_epochs", 1),
    rl(18, "algorithm.relift.sft_data_size", 128),
    rl(19, "algorithm.relift.sft_mini_batch_size", 128),
    rl(20, "algorithm.relift.sft_micro_batch_size", 4),
    rl(21, "algorithm.relift.sft_entropy_coeff", 0.001),
    rl(22, "algorithm.relift.sft_lr", 1e-6),
    rl(26, "data.train_batch_size", 128),
    rl(27, "data.val_batch_size", 512),
    rl(28, "data.max_prompt_length", 1024),
    rl(29, "data.max_response_length", 8192),
    rl(30, R + "max_prefix_len", 8192),  # their data.max_target_len: the demonstration's width
    rl(32, A + "grad_clip", 0.7),
    rl(34, A + "ppo_mini_batch_size", 64),
    rl(35, A + "ppo_micro_batch_size", 64),
    rl(36, A + "use_dynamic_bsz", True),
    rl(37, A + "optim.lr", 1e-6),
    rl(38, A + "ppo_max_token_len_per_gpu", 32768),
    rl(39, A + "kl_loss_coef", 0.0),
    rl(44, F + "grad_offload", True, ours=False, why="grad_offload=True"),
    rl(45, F + "optimizer_offload", True),
    rl(51, R + "temperature", 1.0),
    rl(52, R + "val_temperature", 0.6),
    rl(54, R + "n", 8),
    rl(55, R + "n_val", 1),
    rl(58, A + "entropy_coeff", 0.001),
    rl(63, "trainer.val_before_train", False),
    rl(66, "trainer.save_freq", -1, ours=50, why="save_freq=-1"),
    rl(67, "trainer.test_freq", 10),
    rl(68, A + "use_kl_loss", False),
    rl(70, "algorithm.grpo_use_std", False),
    rl(71, A + "loss_remove_token_mean", True),
    rl(72, A + "loss_remove_clip", True),
    rl(73, "data.reward_impl_version", 3),
    rl(78, "trainer.total_epochs", 3),
    rl_yaml(41, A + "optim.lr_warmup_steps_ratio", 0.0),
    rl_yaml(43, A + "optim.warmup_style", "constant"),
    rl_yaml(74, "algorithm.relift.sft_grad_clip", 1.0),
    _at(RELIFT_REPO, "relift/verl/verl/utils/torch_functional.py")("428-429", A + "optim.zero_lr_first_step", True),
    _at(RELIFT_REPO, "relift/verl/verl/relift/trainer.py")("563-565", "trainer.stop_one_step_early", True),
]

# ---------------------------------------------------------------------- UFT: liumy2010/UFT (run.py -> scripts/train.sh)
uft_run = _at(UFT_REPO, "run.py")
uft_sh = _at(UFT_REPO, "scripts/train.sh")
uft_yaml = _at(UFT_REPO, "verl/trainer/config/ppo_trainer.yaml")
uft_vllm = _at(UFT_REPO, "verl/workers/rollout/vllm_rollout/vllm_rollout.py")  # validation: do_sample=False
UFT = [
    uft_run(9, "trainer.total_training_steps", 500),
    uft_run(10, "algorithm.uft.total_training_steps_hint", 300),
    uft_run(15, "algorithm.uft.hint_sft_coef", 0.001),
    uft_run(17, R + "n", 4),
    uft_run(24, A + "use_kl_loss", True),
    uft_run(26, "trainer.seed", 0),
    uft_run(36, "algorithm.uft.lower_prob", 0.05),
    uft_run(37, "algorithm.uft.upper_prob", 0.95),
    uft_run(43, A + "ppo_mini_batch_size", 64),  # run.py's value with more than one GPU (lines 55-57: 1 GPU)
    uft_run(44, A + "ppo_micro_batch_size", 4),
    uft_run(53, "data.max_prompt_length", 1024),
    # the hint is in the response here (in the prompt there): response 2048 with hints up to 1024 tokens
    uft_run(54, "data.max_response_length", 1024, ours=2048, why="max_response_length 2048"),
    uft_sh(4, "data.train_batch_size", 256),
    uft_sh(10, A + "optim.lr", 1e-6),
    uft_sh(27, "trainer.val_before_train", True),
    uft_sh(31, "trainer.save_freq", 100),
    uft_sh(32, "trainer.test_freq", 25),
    uft_yaml(25, A + "use_dynamic_bsz", False),
    uft_yaml(27, A + "grad_clip", 1.0),
    uft_yaml(28, A + "clip_ratio", 0.2),
    uft_yaml(29, A + "entropy_coeff", 0.001),
    uft_yaml(31, A + "kl_loss_coef", 0.001),
    uft_yaml(32, A + "kl_loss_type", "low_var_kl"),
    uft_yaml(38, A + "optim.lr_warmup_steps_ratio", 0.0),
    uft_yaml(40, A + "optim.warmup_style", "constant"),
    uft_yaml(63, R + "temperature", 1.0),
    uft_yaml(65, R + "top_p", 1.0),
    # their math reward gives 0.1 to a parsed wrong answer; here LUFFY's data and binary reward
    uft_yaml(149, None, 0.1, why="format_score"),
    uft_vllm(169, R + "val_temperature", 0.0),
    uft_vllm(170, R + "n_val", 1),
    _at(UFT_REPO, "verl/utils/dataset/rl_dataset.py")(138, "algorithm.uft.max_segments", 5),
    _at(UFT_REPO, "verl/utils/torch_functional.py")("448-449", A + "optim.zero_lr_first_step", True),
    # compared with the total before the counter is raised: all total steps train
    _at(UFT_REPO, "verl/trainer/ppo/ray_trainer.py")("712-721", "trainer.stop_one_step_early", False),
]

# ---------------------------------------------------------------------- CHORD: Trinity-RFT examples/mix_chord
chord = _at(TRINITY_REPO, "examples/mix_chord/mix_chord.yaml")
CHORD = [
    chord(6, R + "n", 8),  # repeat_times
    chord(8, A + "kl_loss_coef", 0.0),
    # expert rows: 20 % of each batch from an SFT set there, one demonstration slot of each group of 8 here
    chord(10, R + "n_prefix / " + R + "n", 0.2, ours=0.125, why="20 % of each batch"),
    # the CHORD-phi values of lines 12-16's comments (the lines' own values are a third setting)
    chord(12, "algorithm.chord.mu_warmup_steps", 0),
    chord(13, "algorithm.chord.mu_decay_steps", 0),
    chord(14, "algorithm.chord.mu_peak", 0.1),
    chord(15, "algorithm.chord.mu_valley", 0.1),
    chord(16, "algorithm.chord.enable_phi_function", True),
    chord(17, A + "clip_ratio", 0.2),
    chord(18, "algorithm.chord.use_token_level_loss_in_sft", True),
    chord(19, A + "use_dynamic_bsz", True),
    chord(20, A + "ppo_mini_batch_size * " + R + "n", 320),  # experiences: 40 prompts x 8
    chord(21, A + "ppo_micro_batch_size_per_gpu", 4),
    chord(27, "data.max_response_length", 10240),
    chord(28, "data.max_prompt_length + data.max_response_length", 11264),  # max_model_len
    chord(33, "trainer.total_epochs", 25),
    chord(34, "data.train_batch_size", 40),
    chord(46, R + "temperature", 1.0),
    chord(50, None, "no eval taskset", why="eval_tasksets: []"),
    chord(67, "trainer.test_freq", 10),  # eval_interval
    chord(84, "trainer.save_freq", 50),  # save_interval
]

# ---------------------------------------------------------------------- Prefix-RFT: the paper (no code released)
paper = _at(PREFIX_RFT_PAPER, "method: prefix sampling with a cosine-decay scheduler, entropy-based clipping")
PREFIX_RFT = [
    paper("", "algorithm.prefix_rft.ratio_start", 0.95),
    paper("", "algorithm.prefix_rft.ratio_end", 0.05),
    paper("", "algorithm.prefix_rft.prefix_entropy_top_frac", 0.2),
    paper("", "algorithm.grpo_use_std", False),  # Dr. GRPO: no std in the advantage
    paper("", A + "loss_remove_token_mean", True),  # Dr. GRPO: a constant, not the token count, divides
]

TABLES = {
    "exgrpo": EXGRPO,
    "relift": RELIFT,
    "hpt": HPT,
    "srft": SRFT,
    "chord": CHORD,
    "uft": UFT,
    "prefix_rft": PREFIX_RFT,
    "rl_plus": RL_PLUS,
    "questa": QUESTA,
    "ampo": AMPO,
    "sdpo": SDPO,
    "sdft": SDFT,
}
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


def _script(method: str) -> str:
    return os.path.join(REPO, "exp_scripts", f"train_{method}.sh")


@functools.lru_cache(maxsize=None)
def _recipe(method: str):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "EXP_NAME", "MODEL_OVERRIDES")}
    return read_recipe(_script(method), dict(env, MODEL_PATH="org/model"))


def _ours(method: str, key: str):
    """The composed value of ``key``, or of ``a <op> b``."""
    recipe = _recipe(method)
    match = re.fullmatch(r"(\S+) ([-+*/]) (\S+)", key)
    if match is None and key.startswith(f"algorithm.{method}."):  # a knob: the script's value over its default
        from luffy_pool.methods import select_method

        return getattr(select_method(recipe.composed_cached).knobs, key.rsplit(".", 1)[1], SAME)
    if match is None:
        return recipe.get(key, default=SAME)
    left, right = recipe.get(match.group(1)), recipe.get(match.group(3))
    return _OPS[match.group(2)](left, right)


def _equal(got, expected) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool) or isinstance(expected, str):
        return got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(float(got), float(expected), rel_tol=1e-12, abs_tol=0.0)
    return got == expected


def _comments(method: str) -> str:
    with open(_script(method)) as f:
        return "\n".join(line for line in f.read().splitlines() if line.lstrip().startswith("#"))


@pytest.mark.parametrize("method", sorted(TABLES))
def test_script_composes_the_authors_values_or_the_stated_difference(method):
    wrong = []
    for s in TABLES[method]:
        if s.key is None:
            continue
        expected = s.authors if s.ours is SAME else s.ours
        got = _ours(method, s.key)
        if not _equal(got, expected):
            where = f"{s.source.repo} {s.source.path}:{s.source.line}"
            wrong.append(f"{s.key} = {got!r}, expected {expected!r} (authors: {s.authors!r}, {where})")
    assert not wrong, f"exp_scripts/train_{method}.sh:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize("method", sorted(TABLES))
def test_every_difference_is_said_in_the_scripts_comments(method):
    comments = _comments(method)
    differences = [s for s in TABLES[method] if s.key is None or s.ours is not SAME]
    for s in differences:
        assert s.why, f"{method}: {s.key} differs from the authors' {s.authors!r} without a reason"
        assert s.why in comments, f"exp_scripts/train_{method}.sh says nothing of {s.why!r} ({s.source})"
    if method != "prefix_rft":
        assert "test_authors_settings.py" in comments  # the script points to this table


@pytest.mark.parametrize("method", sorted(TABLES))
def test_every_value_names_its_source(method):
    for s in TABLES[method]:
        src = s.source
        if method == "prefix_rft":  # the paper, no repository
            assert src.repo.startswith("arXiv ") and src.commit is None and src.path, s
            continue
        if src.repo.startswith("pypi:"):  # a released package: its version, named by the script
            name, version = src.repo[len("pypi:") :].split("==")
            assert src.commit is None and src.path.startswith(f"{name}/") and re.fullmatch(r"\d+(-\d+)?", src.line)
            assert f"{name.upper()} {version}" in _comments(method), (method, src.repo)
            continue
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", src.repo) and re.fullmatch(r"[0-9a-f]{40}", src.commit), s
        assert src.path and re.fullmatch(r"\d+(-\d+)?", src.line), s
        # the commit is the one the script names (its first 8 characters)
        assert src.commit[:8] in _comments(method), (method, src.commit)


def test_prefix_rft_script_says_its_authors_released_no_code_and_cites_the_paper():
    comments = _comments("prefix_rft")
    assert "released no code" in comments and "arXiv 2507.01679" in comments
    assert {s.key for s in PREFIX_RFT} >= {
        "algorithm.prefix_rft.ratio_start",
        "algorithm.prefix_rft.ratio_end",
        "algorithm.prefix_rft.prefix_entropy_top_frac",
    }
