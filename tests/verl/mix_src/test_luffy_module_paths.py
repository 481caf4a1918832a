"""LUFFY's import paths: every public name a user script of LUFFY can import from its
``verl/mix_src/*.py`` and ``deepscaler/rewards/*.py`` modules (plus its other public modules: deepscaler.globals, deepscaler.rewards.math_utils.utils, verl.utils.reward_score) imports here,
and the aliases do what LUFFY's functions do on hand-made cases.

The name lists are LUFFY's module-level ``def`` / ``class`` / constant names (github ElliottYan/LUFFY,
luffy/verl/verl/mix_src/*.py, luffy/deepscaler/...), with the imported names its own scripts take from a
module (``THOUGHT_DELIMITER_*`` from math_reward); leading-underscore helpers are left out. Names not provided
are listed in ``NOT_PROVIDED`` with the reason.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

LUFFY_PUBLIC_NAMES = {
    "verl.mix_src.main_mix_ppo": ["RewardManager", "deepscaler_reward_fn_nothink", "main", "main_task"],
    "verl.mix_src.main_ppo_new_reward": ["RewardManager", "deepscaler_reward_fn_nothink"],
    "verl.mix_src.math_verify_reward": [
        "labeling_responses",
        "RewardMathFn",
        "reward_fn_math_verify",
        "reward_fn_math_verify_no_think",
    ],
    "verl.mix_src.mix_actor": ["MIXDataParallelPPOActor"],
    "verl.mix_src.mix_core_alg": [
        "compute_sft_pure_loss",
        "compute_grpo_outcome_advantage_split",
        "compute_token_on_off_policy_loss",
    ],
    "verl.mix_src.mix_fsdp_worker": ["MIXActorRolloutRefWorker"],
    "verl.mix_src.mix_trainer": [
        "apply_kl_penalty",
        "compute_advantage",
        "MIXRayPPOTrainer",
        "compute_data_metrics_ours",
    ],
    "verl.mix_src.reward_with_format": [
        "deepscaler_reward_fn_impl1",
        "math_verify_reward_fn",
        "accuracy_reward",
        "format_reward",
    ],
    "verl.mix_src.rl_dataset_with_target": [
        "collate_fn",
        "RLHFDatasetWithTarget",
        "BufferedDataLoader",
        "ResumableRandomSampler",
    ],
    "deepscaler.rewards": ["RewardConfig", "RewardFn", "RewardInput", "RewardOutput", "RewardType"],
    "deepscaler.rewards.math_reward": [
        "ORM_USER_TEMPLATE",
        "RewardMathFn",
        "deepscaler_reward_fn",
        "THOUGHT_DELIMITER_START",
        "THOUGHT_DELIMITER_END",
    ],
    "deepscaler.rewards.reward_types": ["RewardConfig", "RewardType", "RewardInput", "RewardOutput", "RewardFn"],
    "deepscaler.rewards.math_utils": ["extract_answer", "grade_answer_sympy", "grade_answer_mathd"],
    "deepscaler.rewards.math_utils.utils": [
        "mathd_normalize_answer",
        "BAD_SUBSTRINGS",
        "BAD_REGEXES",
        "TUPLE_CHARS",
        "count_unknown_letters_in_expr",
        "should_allow_eval",
        "are_equal_under_sympy",
        "split_tuple",
        "last_boxed_only_string",
        "remove_boxed",
        "extract_boxed_answer",
        "grade_answer_sympy",
        "grade_answer_mathd",
        "extract_answer",
        "grade_answer_verl",
    ],
    "deepscaler.globals": [
        "GCP_PROJECT_ID",
        "GCP_LOCATION",
        "GEMINI_MODEL",
        "OAI_RM_MODEL",
        "THOUGHT_DELIMITER_START",
        "THOUGHT_DELIMITER_END",
    ],
    "verl.utils.reward_score": ["gsm8k", "math"],
    "verl.utils.reward_score.gsm8k": ["extract_solution", "compute_score"],
    "verl.utils.reward_score.math": [
        "compute_score",
        "is_equiv",
        "remove_boxed",
        "last_boxed_only_string",
        "fix_fracs",
        "fix_a_slash_b",
        "remove_right_units",
        "fix_sqrt",
        "strip_string",
    ],
}

NOT_PROVIDED = {
    "verl.mix_src.mix_trainer_acc_rebatch.MIXRayPPOTrainerAccRebatch": "LUFFY's accuracy-rebatching trainer is not shipped; trainer.acc_rebatch=True is refused with that reason",
    "verl.mix_src.mix_vllm_rollout.MIXvLLMRollout": "engine wiring inside LUFFY's worker, built by the worker, not by scripts; the slot plan it implemented is "
    "luffy_pool.rollout.slot_plan (build_slot_plan, assemble_responses, MixRolloutPlanner)",
    "verl.mix_src.mix_vllm_rollout.unit_test": "a GPU smoke script of LUFFY's, not an API",
    "verl.mix_src.main_ppo_new_reward.main / main_task": "LUFFY's entry point of verl's plain PPO trainer; the same run here is verl.mix_src.main_mix_ppo with "
    "exp_scripts/train_on_policy.sh's settings",
    "verl.mix_src.test": "an empty module in LUFFY",
}


@pytest.mark.parametrize("module", sorted(LUFFY_PUBLIC_NAMES))
def test_every_luffy_public_name_imports(module):
    mod = importlib.import_module(module)
    missing = [name for name in LUFFY_PUBLIC_NAMES[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lacks LUFFY's {missing}"


def test_globals_and_delimiters_are_luffys():
    import deepscaler.globals as g
    from deepscaler.rewards import math_reward
    from deepscaler.rewards.math_utils.extract import THINK_CLOSE, THINK_OPEN

    assert (g.THOUGHT_DELIMITER_START, g.THOUGHT_DELIMITER_END) == ("<think>", "</think>") == (THINK_OPEN, THINK_CLOSE)
    assert (math_reward.THOUGHT_DELIMITER_START, math_reward.THOUGHT_DELIMITER_END) == ("<think>", "</think>")
    assert (g.GEMINI_MODEL, g.OAI_RM_MODEL, g.GCP_PROJECT_ID, g.GCP_LOCATION) == (
        "gemini-1.5-pro-002",
        "gpt-4o-mini",
        None,
        None,
    )


def test_math_utils_utils_behave_as_luffys():
    from deepscaler.rewards.math_utils import utils as u

    assert u.last_boxed_only_string("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\boxed{\\frac{1}{2}}"
    assert u.last_boxed_only_string("\\fbox{3}") == "\\fbox{3}" and u.last_boxed_only_string("none") is None
    assert u.last_boxed_only_string("\\boxed{open") is None
    assert u.remove_boxed("\\boxed{x+1}") == "x+1" and u.remove_boxed("\\fbox{1}") is None
    assert u.extract_boxed_answer("so \\boxed{42}.") == "42" and u.extract_answer("no box") is None
    assert u.split_tuple("(1,000, 2)") == ["1000", "2"] and u.split_tuple("[a, b]") == ["a", "b"]
    assert u.split_tuple("5") == ["5"] and u.split_tuple("") == []
    assert u.count_unknown_letters_in_expr("\\sqrt{x}+\\frac{y}{z}") == 3
    assert u.should_allow_eval("x+y") and not u.should_allow_eval("x^{2}") and not u.should_allow_eval("2^10")
    assert not u.should_allow_eval("a+b+c")
    assert u.grade_answer_mathd("\\text{5}", "5") and not u.grade_answer_mathd("6", "5")
    assert u.grade_answer_sympy("\\frac{1}{2}", "0.5") and not u.grade_answer_sympy("1/3", "0.5")
    assert u.are_equal_under_sympy("2x+2", "2(x+1)")
    assert u.grade_answer_verl("the answer is \\boxed{\\dfrac{1}{2}}", "\\boxed{\\frac12}")
    assert not u.grade_answer_verl("no box 1/2", "1/2") and not u.grade_answer_verl("\\boxed{1}", "")


def test_reward_with_format_and_version_two_as_luffys():
    from verl.mix_src.main_mix_ppo import deepscaler_reward_fn_nothink
    from verl.mix_src.reward_with_format import (
        accuracy_reward,
        deepscaler_reward_fn_impl1,
        format_reward,
        math_verify_reward_fn,
    )

    assert deepscaler_reward_fn_impl1("<think>a</think> \\boxed{7}", "7") == 1.0
    assert deepscaler_reward_fn_impl1("<think>a</think> \\boxed{8}", "7") == -0.5
    assert deepscaler_reward_fn_impl1("no tags \\boxed{7}", "7") == -1.0
    assert format_reward(["<think>\nplan\n</think> x", "<think>plan</think>", "x <think>\na\n</think>"]) == [
        1.0,
        0.0,
        0.0,
    ]
    assert accuracy_reward(["\\boxed{\\frac{1}{2}}", "\\boxed{3}"], ["0.5", "2"]) == [1.0, 0.0]
    assert math_verify_reward_fn("<think>\nplan\n</think> \\boxed{7}", "7") == 1.0
    assert math_verify_reward_fn("<think>plan</think> \\boxed{7}", "7") == 0.0  # format factor 0
    assert deepscaler_reward_fn_nothink("\\boxed{7}", "7") is True  # graded as "<think>\n</think>\n" + text


def test_verl_reward_score_modules():
    from verl.utils.reward_score import gsm8k, math

    assert gsm8k.extract_solution("x #### 1,234") == "1234" and gsm8k.extract_solution("no mark") is None
    assert gsm8k.extract_solution("a 3 then 4", method="flexible") == "4"
    assert gsm8k.compute_score("x #### 72", "72") == 1.0 and gsm8k.compute_score("x #### 71", "72") == 0.0
    assert gsm8k.compute_score("x #### 71", "72", format_score=0.1) == 0.1 and gsm8k.compute_score("72", "72") == 0.0
    assert math.compute_score("so \\boxed{\\frac12}", "\\frac{1}{2}") == 1.0 and math.compute_score("7", "7") == 0.0
    assert math.is_equiv("\\dfrac{1}{2}", "\\frac12") and not math.is_equiv("1", "2") and math.is_equiv(None, None)
    assert math.remove_boxed("\\boxed{5}") == "5" and math.remove_boxed("\\boxed 5") == "5"
    assert math.last_boxed_only_string("a $\\boxed 5$") == "\\boxed 5" and math.fix_sqrt("\\sqrt3") == "\\sqrt{3}"
    assert math.fix_fracs("\\frac12") == "\\frac{1}{2}" and math.fix_a_slash_b("3/4") == "\\frac{3}{4}"


def test_labeling_responses_is_the_eval_default_math_verify_label():
    from verl.mix_src.math_verify_reward import labeling_responses

    assert labeling_responses(["\\boxed{\\frac{1}{2}}", "0.5", "\\boxed{3}"], "\\frac{1}{2}") == [True, True, False]


class _Tok:
    """Decodes ids as characters (1 id = 1 char), enough for the reward manager."""

    def batch_decode(self, seqs, skip_special_tokens=False):
        return ["".join(chr(i) for i in s) for s in seqs]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def _encode(texts, width):
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = torch.tensor([ord(c) for c in t])
        mask[i, : len(t)] = 1
    return ids, mask


def test_reward_manager_takes_luffys_arguments_and_returns_the_reward_tensor():
    from verl.mix_src.main_mix_ppo import RewardManager
    from verl.protocol import DataProto

    responses, resp_mask = _encode(["plan\n</think> \\boxed{7}", "plan\n</think> \\boxed{8}"], 32)
    prompts = torch.ones(2, 3, dtype=torch.long)
    data = DataProto.from_dict(
        tensors={
            "responses": responses,
            "prompts": prompts,
            "attention_mask": torch.cat([torch.ones(2, 3, dtype=torch.long), resp_mask], dim=-1),
        },
        non_tensors={
            "reward_model": np.array([{"ground_truth": "7"}] * 2, dtype=object),
            "data_source": np.array(["math"] * 2, dtype=object),
        },
    )
    manager = RewardManager(tokenizer=_Tok(), num_examine=0, reward_impl_version=3, num_workers=0)
    scores = manager(data)
    assert isinstance(scores, torch.Tensor) and scores.shape == (2, 32)
    assert scores.sum(-1).tolist() == [1.0, 0.0]
    assert scores[0, resp_mask[0].sum() - 1] == 1.0  # at the last valid token, as LUFFY's


def test_mix_trainer_dataproto_helpers():
    from verl.mix_src.mix_trainer import apply_kl_penalty, compute_advantage, compute_data_metrics_ours
    from verl.protocol import DataProto
    from verl.trainer.ppo.kl import get_kl_controller

    scores = torch.zeros(4, 2)
    scores[:, -1] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    prefix = torch.zeros(4, 2, dtype=torch.bool)
    prefix[0] = True
    data = DataProto.from_dict(
        tensors={
            "responses": torch.zeros(4, 2, dtype=torch.long),
            "attention_mask": torch.ones(4, 3, dtype=torch.long),
            "token_level_scores": scores,
            "old_log_probs": torch.zeros(4, 2),
            "prefix_mask": prefix,
        },
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )
    data, metrics = apply_kl_penalty(data, get_kl_controller({"kl_coef": 0.5}))
    assert torch.equal(data.batch["token_level_rewards"], scores) and metrics["critic/kl_coeff"] == 0.0  # no ref
    data = compute_advantage(data, "grpo", grpo_use_std=False)
    assert data.batch["advantages"][:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]  # score - group mean
    split = compute_advantage(data, "grpo_split", grpo_use_std=False)  # group a: mean of its on-policy row (0)
    assert split.batch["advantages"][:2, 0].tolist() == [1.0, 0.0]
    assert compute_data_metrics_ours(data, use_critic=False)["critic/score/mean"] == pytest.approx(0.75)


def test_buffered_dataloader_keeps_leftover_rows():
    from verl.mix_src.rl_dataset_with_target import BufferedDataLoader
    from verl.protocol import DataProto

    loader = BufferedDataLoader(torch.utils.data.DataLoader(list(range(6)), batch_size=4))
    loader.start_new_epoch()
    assert len(loader) == 2 and loader.get_next_batch().tolist() == [0, 1, 2, 3]
    loader.add_to_buffer(DataProto.from_dict(tensors={"x": torch.arange(5)}))
    assert loader.buffer_size() == 5
    assert loader.get_from_buffer(8, dp_size=2).batch["x"].tolist() == [0, 1, 2, 3]  # cut to a multiple of 2
    assert loader.buffer_size() == 1


def test_alias_modules_evaluate_no_model_text():
    """The LUFFY-named grader modules add no eval / exec / sympify / parse_expr call (LUFFY's utils used parse_expr)."""
    import ast
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[3]
    files = [
        *(repo / "verl" / "mix_src").glob("*.py"),
        *(repo / "verl" / "utils" / "reward_score").glob("*.py"),
        repo / "deepscaler" / "globals.py",
        repo / "deepscaler" / "rewards" / "math_utils" / "utils.py",
    ]
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            fn = getattr(node, "func", None) if isinstance(node, ast.Call) else None
            if isinstance(fn, ast.Name) and fn.id in {"eval", "exec", "compile", "sympify", "parse_expr", "simplify"}:
                bad.append(f"{path.name}:{node.lineno} {fn.id}()")
            if isinstance(fn, ast.Attribute) and fn.attr in {"sympify", "parse_expr", "lambdify", "simplify"}:
                bad.append(f"{path.name}:{node.lineno} .{fn.attr}()")  # re.compile is fine
    assert len(files) >= 12 and bad == []
