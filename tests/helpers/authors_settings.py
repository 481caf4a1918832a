"""The authors' values of the family launch scripts, key by key with their source (repository, commit, file, line):
the shared record types, and the tables of RL-PLUS, QuestA, AMPO, SDPO and SDFT (the older families' tables are in
tests/exp_scripts/test_authors_settings.py, which checks them all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

A, R, F = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.actor.fsdp_config."
SAME = object()  # ours equals the authors' value

RL_PLUS_REPO = ("YihongDong/RL-PLUS", "eb4aa4d4e2d7ce206056f9d7740138bfc94fad8f")
QUESTA_REPO = ("foreverlasting1202/QuestA", "3c7be00157eb249d839b1045dd96ce74efaf5c55")
AMPO_REPO = ("SII-Enigma/AMPO", "b88d365654e03b94d8316226a5a67e0f7b64048f")
TRL_WHEEL = ("pypi:trl==1.16.0", None)  # a released package: its version, no commit


@dataclass(frozen=True)
class Source:
    repo: str
    commit: Optional[str]  # None: a paper, or a released package (repo 'pypi:<name>==<version>')
    path: str  # a file of the repository, or the paper's part
    line: str  # a line or a range "a-b" ('' for a paper)


@dataclass(frozen=True)
class Setting:
    """``key``: our composed key, two keys joined by one of `` + - * / `` (a value we spell in two keys), or None
    (a setting this project has no key for). ``authors``: their value. ``ours``: the composed value where it
    deliberately differs. ``why``: text the script's comments carry for a difference."""

    key: Optional[str]
    authors: Any
    source: Source
    ours: Any = SAME
    why: str = ""


def _at(repo_commit, path):
    def setting(line, key, authors, **kw) -> Setting:
        return Setting(key, authors, Source(*repo_commit, path, str(line)), **kw)

    return setting


# ---------------------------------------------------------------------- RL-PLUS: YihongDong/RL-PLUS (LUFFY's train.sh)
rp = _at(RL_PLUS_REPO, "exp_scripts/train_RL-PLUS.sh")
rp_yaml = _at(RL_PLUS_REPO, "rl_plus/verl/verl/recipe/config/rlplus_ppo_trainer.yaml")
rp_alg = _at(RL_PLUS_REPO, "rl_plus/verl/verl/recipe/rlplus_core_alg.py")
RL_PLUS = [
    rp(30, "algorithm.adv_estimator", "grpo"),
    rp(33, "data.train_batch_size", 128),
    rp(34, "data.val_batch_size", 512),
    rp(35, "data.max_prompt_length", 1024),
    rp(36, "data.max_response_length", 8192),
    rp(38, A + "optim.lr", 1e-6),
    rp(40, A + "ppo_mini_batch_size", 64),
    rp(41, A + "ppo_micro_batch_size", 64),
    rp(42, A + "use_dynamic_bsz", True),
    rp(43, A + "ppo_max_token_len_per_gpu", 32768),
    rp(44, A + "kl_loss_coef", 0.0),
    rp(53, R + "temperature", 1.0),
    rp(54, R + "val_temperature", 0.6),
    rp(55, R + "gpu_memory_utilization", 0.8, ours=0.73, why="the memory plan"),
    rp(56, R + "n", 8),
    rp(57, R + "n_val", 1),
    rp(59, R + "max_prefix_len", 8192),
    rp(60, "algorithm.kl_ctrl.kl_coef", 0.0),
    rp(61, A + "entropy_coeff", 0.001),
    rp(63, "trainer.logger", ["console"], ours=["console", "wandb"], why="theirs: console only"),
    rp(66, "trainer.val_before_train", False),
    rp(69, "trainer.save_freq", 50),
    rp(70, "trainer.test_freq", 10),
    rp(71, A + "use_kl_loss", False),
    rp(75, R + "n_prefix", 1),
    rp(76, R + "min_prefix_ratio", 1.0),
    rp(77, R + "max_prefix_ratio", 1.0),
    rp(79, "actor_rollout_ref.ref.use_ref", False),
    rp(84, "algorithm.grpo_use_std", False),
    rp(85, A + "loss_remove_token_mean", True),
    rp(86, A + "loss_remove_clip", True),
    rp(87, "data.reward_impl_version", 3),
    rp(91, "trainer.total_epochs", 30),
    rp_yaml(38, A + "grad_clip", 1.0),
    rp_yaml(39, A + "clip_ratio", 0.2),
    rp_yaml(50, A + "optim.lr_warmup_steps_ratio", 0.0),
    rp_yaml(52, A + "optim.warmup_style", "constant"),
    rp_yaml(69, A + "off_policy_max_clip", -1),  # -1: no cap on the mixture ratio
    rp_yaml(111, R + "enforce_eager", True, ours=False, why="rollout speed"),
    # off_policy_strategy RL-PLUS: omega = (q + 1) / 2 (the expert's probability 1), weight (1 - p)^0.5
    rp_alg("136-137", "algorithm.rl_plus.mis_expert_prob", 1.0),
    rp_alg(166, "algorithm.rl_plus.explore_gamma", 0.5),
    _at(RL_PLUS_REPO, "rl_plus/verl/verl/utils/torch_functional.py")("428-429", A + "optim.zero_lr_first_step", True),
    _at(RL_PLUS_REPO, "rl_plus/verl/verl/recipe/rlplus_trainer.py")("602-604", "trainer.stop_one_step_early", True),
]

# ---------------------------------------------------------------------- QuestA: AReaL (arealite) partial_50_grpo.yaml
qa = _at(QUESTA_REPO, "AReaL/scripts/partial_50_grpo.yaml")
qa_cli = _at(QUESTA_REPO, "AReaL/arealite/api/cli_args.py")
qa_prefix = _at(QUESTA_REPO, "AReaL/datasets/add_prefix.py")
QUESTA = [
    qa(5, "trainer.n_gpus_per_node", 8),
    qa(4, "trainer.nnodes", 8, ours=1, why="pass trainer.nnodes=8"),
    qa(12, "trainer.seed", 1),
    qa(14, "trainer.total_epochs", 100),
    qa(50, None, 4, why="up to 4 versions stale"),  # max_head_offpolicyness (async_training: line 17)
    qa(21, R + "n", 16),
    qa(23, "data.max_response_length", 24000),
    qa(25, R + "temperature", 1.0),
    qa(26, "data.max_prompt_length", 4096),
    qa(28, "algorithm.questa.success_ub", 0.95),
    qa(29, "algorithm.questa.success_lb", 0.05),
    qa(58, None, "OpenMath-Nemotron-1.5B", why="pass MODEL_PATH=nvidia/OpenMath-Nemotron-1.5B"),
    qa(64, A + "ppo_max_token_len_per_gpu", 32768),
    qa(67, A + "optim.lr", 2e-5),
    qa(68, A + "optim.weight_decay", 0.05),
    qa("69-70", A + "optim.betas", [0.9, 0.95]),
    qa(71, None, 1e-5, why="theirs 1e-5: no key here"),  # Adam eps
    qa(72, A + "optim.warmup_style", "constant"),
    qa(73, A + "grad_clip", 1.0),
    qa(74, A + "optim.lr_warmup_steps_ratio", 0.001),
    qa(79, A + "clip_ratio", 0.2),
    qa(81, "algorithm.questa.reward_scale", 5.0),
    qa(82, "algorithm.questa.reward_bias", 0.0),
    qa(83, "algorithm.kl_ctrl.kl_coef", 0.0),
    qa(84, "data.train_batch_size / " + A + "ppo_mini_batch_size", 1),  # ppo_n_minibatches
    qa(87, None, 5.0, why="behaviour weight capped at 5"),
    qa(113, "data.train_batch_size", 128),
    qa(128, "trainer.save_freq", 50),
    qa(145, "trainer.test_freq", 50),
    _at(QUESTA_REPO, "AReaL/scripts/partial_50_25_grpo.yaml")(26, None, 2048, why="2,048 prompt tokens"),
    _at(QUESTA_REPO, "AReaL/scripts/partial_50_grpo.py")("72-75", None, "math_parser", why="realhf's math_parser"),
    # all total_epochs x steps_per_epoch steps train
    _at(QUESTA_REPO, "AReaL/scripts/partial_50_grpo.py")("186-190", "trainer.stop_one_step_early", False),
    qa_cli("62-63", R + "top_p", 1.0),
    qa_cli("247-248", "algorithm.questa.reward_clip", 20.0),
    _at(QUESTA_REPO, "AReaL/arealite/utils/functional.py")(87, "algorithm.questa.adv_eps", 1e-5),
    qa_prefix(34, "algorithm.questa.min_prefix_chars", 10),
    qa_prefix(37, "algorithm.questa.hint_header", "## Hint."),
    qa_prefix(41, "algorithm.questa.require_answer_in_solution", True),
]

# ---------------------------------------------------------------------- AMPO: SII-Enigma/AMPO exp_scripts/train_ampo.sh
am = _at(AMPO_REPO, "exp_scripts/train_ampo.sh")
am_worker = _at(AMPO_REPO, "ampo/verl/verl/adaptive_mix_src/mix_fsdp_worker.py")
AMPO = [
    am(25, "algorithm.ampo.n_guides", 2),
    am(26, "algorithm.ampo.max_teachers", 4),
    am(27, "algorithm.ampo.length_strategy", "short"),
    am(31, A + "off_policy_reshape", "p_div_p_0.1"),
    # 'seq' and 'token' give the same loss with loss_remove_token_mean (mix_core_alg.py 542-565); the key is unread
    am(32, A + "off_policy_loss_impl", "seq", ours="token", why="off_policy_loss_impl=seq"),
    am(33, A + "loss_remove_token_mean", True),
    am(34, A + "loss_remove_clip", False),
    am(40, "data.reward_impl_version", 5, ours=3, why="data.reward_impl_version=3"),
    am(46, "algorithm.adv_estimator", "grpo"),
    am(48, A + "clip_ratio", 0.2),
    am(51, "data.max_prompt_length", 1024),
    am(52, "data.max_response_length", 8192),
    am(59, "data.train_batch_size", 128),
    am(60, "data.val_batch_size", 512),
    am(61, R + "n", 8),
    am(62, A + "ppo_mini_batch_size", 64),
    am(65, "trainer.n_gpus_per_node", 4, ours=8, why="theirs 4 x H100"),
    am(68, R + "temperature", 1.0),
    am(69, R + "top_p", 1.0),
    am(70, R + "top_k", -1),
    am(71, R + "val_temperature", 0.6),
    am(80, A + "use_dynamic_bsz", True),
    am(81, A + "ppo_max_token_len_per_gpu", 18432, ours=32768, why="ppo_max_token_len_per_gpu 32768"),
    am(84, F + "param_offload", True, ours=False, why="param/optimizer offload"),
    am(84, F + "optimizer_offload", True, ours=False, why="param/optimizer offload"),
    am(85, R + "tensor_model_parallel_size", 2),
    am(89, "algorithm.kl_ctrl.kl_coef", 0.0),
    am(90, A + "use_kl_loss", False),
    am(91, A + "kl_loss_coef", 0.0),
    am(113, "algorithm.grpo_use_std", False),
    am(121, "algorithm.ampo.clip_ratio_c", 10.0),
    am(123, "actor_rollout_ref.model.override_config.max_position_embeddings", 32768),
    am(133, A + "optim.lr", 1e-6),
    am(134, A + "optim.lr_warmup_steps_ratio", 0.0),  # their lr_warmup_steps=0: no warm-up step
    am(135, A + "optim.weight_decay", 0.1),
    am(139, A + "entropy_coeff", 0.001),
    am(140, A + "grad_clip", 1.0),
    am(154, R + "n_val", 1),
    am(158, R + "max_prefix_len", 8192),
    am(161, R + "min_prefix_ratio", 1.0),
    am(162, R + "max_prefix_ratio", 1.0),
    am(164, "actor_rollout_ref.ref.use_ref", False),
    am(180, "algorithm.ampo.score_threshold", 0.0),  # threshold_0: reward_manager/prob.py lines 151-153
    am(186, "algorithm.ampo.format_coef", 0.1),
    am(192, "trainer.val_before_train", False),
    am(193, "trainer.test_freq", 10),
    am(194, "trainer.save_freq", 50),
    am(195, "trainer.total_epochs", 30),
    am(196, "trainer.total_training_steps", 510),
    am_worker(408, A + "optim.betas", [0.9, 0.999]),
    am_worker(414, A + "optim.warmup_style", "constant"),
    _at(AMPO_REPO, "ampo/verl/verl/trainer/config/actor/actor.yaml")(88, A + "ppo_epochs", 1),
    # verl 0.5: lr_lambda = 1.0 past the warm-up (none here): the first update at the full lr
    _at(AMPO_REPO, "ampo/verl/verl/utils/torch_functional.py")("581-584", A + "optim.zero_lr_first_step", False),
    # is_last_step = gen_steps >= total, checked after the step's update: all total steps train
    _at(AMPO_REPO, "ampo/verl/verl/adaptive_mix_src/mix_dapo_trainer.py")("749", "trainer.stop_one_step_early", False),
]

# ---------------------------------------------------------------------- SDPO and SDFT: the TRL 1.16.0 wheel
trl_sdpo = _at(TRL_WHEEL, "trl/experimental/sdpo/sdpo_config.py")
trl_sdft = _at(TRL_WHEEL, "trl/experimental/sdft/sdft_config.py")
TRL_LENGTHS = dict(why="max prompt 512 / completion 256 tokens")
SDPO = [
    trl_sdpo("286-287", "data.max_prompt_length", 512, ours=1024, **TRL_LENGTHS),
    trl_sdpo("290-291", R + "n", 8),
    trl_sdpo("302-303", "data.max_response_length", 256, ours=8192, **TRL_LENGTHS),
    # steps_per_generation = gradient_accumulation_steps: one optimizer step per generation batch
    trl_sdpo("616-618", "data.train_batch_size / " + A + "ppo_mini_batch_size", 1),
    trl_sdpo("326-327", R + "temperature", 1.0),
    trl_sdpo("330-331", R + "top_p", 1.0),
    trl_sdpo("448-449", A + "ppo_epochs", 1),  # num_iterations
    trl_sdpo("452-453", "algorithm.sdpo.loss_type", "dapo"),
    trl_sdpo("464-465", "algorithm.sdpo.dont_reprompt_on_self_success", True),
    trl_sdpo("468-469", A + "kl_loss_coef", 0.0),  # beta
    trl_sdpo("474-475", A + "clip_ratio", 0.2),  # epsilon
    trl_sdpo("496-497", "algorithm.grpo_use_std", True),  # scale_rewards="group"
    trl_sdpo("509-510", "algorithm.sdpo.distillation_mode", "sampled_token"),
    trl_sdpo("523-524", "algorithm.sdpo.is_clip", 2.0),
    trl_sdpo("533-534", "algorithm.sdpo.distillation_weight", 1.0),
    trl_sdpo("542-543", "algorithm.sdpo.teacher", "ema"),
    trl_sdpo("549-550", "algorithm.sdpo.ema_rate", 0.05),
    trl_sdpo("557-558", "algorithm.sdpo.max_reprompt_len", 10240),
    trl_sdpo("565-566", "algorithm.sdpo.success_threshold", 1.0),
    trl_sdpo("589-590", "algorithm.sdpo.remove_thinking_from_demonstration", False),
]
SDFT = [
    trl_sdft("211-212", "data.max_prompt_length", 512, ours=1024, **TRL_LENGTHS),
    trl_sdft("215-216", R + "n", 8),
    trl_sdft("227-228", "data.max_response_length", 256, ours=8192, **TRL_LENGTHS),
    trl_sdft("441-443", "data.train_batch_size / " + A + "ppo_mini_batch_size", 1),
    trl_sdft("251-252", R + "temperature", 1.0),
    trl_sdft("255-256", R + "top_p", 1.0),
    trl_sdft("372-373", A + "ppo_epochs", 1),  # num_iterations
    trl_sdft("376-377", "algorithm.sdft.teacher", "base"),
    trl_sdft("383-384", "algorithm.sdft.ema_rate", 0.05),
    # top-k logit distillation needs the teacher's logits; the reference pass returns the sampled token's log-prob
    trl_sdft(
        "398-399",
        "algorithm.sdft.distillation_mode",
        "topk_logits",
        ours="sampled_token",
        why="distillation_mode=sampled_token",
    ),
    trl_sdft("406-407", "algorithm.sdft.is_clip", 2.0),
]
