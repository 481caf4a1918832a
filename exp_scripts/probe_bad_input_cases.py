"""The cases of ``exp_scripts/probe_bad_input.py``: bad input, faults and the new user's path (docs/DESIGN.md §3).

Each case builds its own small input in a scratch folder and calls the project the way a user reaches it (the
dataset / pool loaders the trainer uses, the config check, the eval and data-prep scripts' ``main``, a trainer
subprocess for the few that need the whole start-up). ``ref`` names the input class (docs/DESIGN.md §3). Cases for faults fixed by
other work (resume, checkpoints, signals, the judge, secrets, load) are included, so the probe reports them too.
This file holds the registry (``CASES``, ``case``) and the training-data, off-policy-file and config cases; the eval
and data-prep scripts' cases (probe_bad_input_scripts.py), the faults (probe_bad_input_faults.py) and the real
models' cases (probe_bad_input_models.py) register themselves when it loads, in that order.
"""

from __future__ import annotations

import os
from typing import Any

from exp_scripts.probe_bad_input import (
    Case,
    Context,
    Outcome,
    expect_accepted,
    expect_config_error,
    expect_refusal,
    judge_exception,
    judge_trainer,
    run_trainer,
)

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
TRACE = "<think>\n1 + 2 = 3.\n</think>\nThe answer is \\boxed{3}."
CASES: list[Case] = []


def case(cid: str, ref: str, title: str, timeout_s: float = 60.0):
    def register(fn):
        CASES.append(Case(cid, ref, title, fn, timeout_s))
        return fn

    return register


# ------------------------------------------------------------------------------------ helpers
def _row(i: int, **over) -> dict:
    row = {
        "data_source": "synthetic_arith",
        "prompt": [{"role": "user", "content": f"What is 1 + {i}?"}],
        "target": [{"role": "assistant", "content": TRACE}],
        "ability": "math",
        "reward_model": {"ground_truth": "3", "style": "rule"},
        "extra_info": {"index": i, "split": "train"},
    }
    row.update(over)
    return row


def _parquet(ctx: Context, rows: list[dict], name: str = "train.parquet") -> str:
    import pandas as pd

    path = os.path.join(ctx.tmp(name.split(".")[0]), name)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def _dataset(ctx: Context, path: str, **kw):
    from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget

    kw.setdefault("max_prompt_length", 64)
    kw.setdefault("max_target_length", 32)
    ds = RLHFDatasetWithTarget(path, ctx.tokenizer, **kw)
    for i in range(len(ds)):  # what the sampler would draw: a check that only fires here counts as late
        ds[i]
    return ds


def _late(fn):
    """Like ``expect_refusal``, but a refusal raised only when an item is drawn is weak (it ends a run late)."""

    def run(ctx: Context, *names: str) -> Outcome:
        from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget

        path, kw = fn(ctx)
        kw.setdefault("max_prompt_length", 64)
        kw.setdefault("max_target_length", 32)
        try:
            ds = RLHFDatasetWithTarget(path, ctx.tokenizer, **kw)
        except Exception as exc:  # noqa: BLE001 - refused at load: judged like any refusal
            return judge_exception(exc, names)
        outcome = expect_refusal(lambda: [ds[i] for i in range(len(ds))], *names)
        if outcome.verdict == "good":
            return Outcome("weak", "refused only when the row is drawn (late): " + outcome.seen)
        return outcome

    return run


def _n_target_tokens(ctx: Context) -> int:
    return len(ctx.tokenizer(TRACE[len("<think>\n") :], add_special_tokens=False)["input_ids"])


def _pool(ctx: Context, rows: list[dict], tokenizer: bool = True):
    from luffy_pool.rollout.off_policy_pool import OffPolicyPool

    path = _parquet(ctx, rows, "extra.parquet")
    return lambda: OffPolicyPool.from_sections(
        _sections(), path, known_prompt_ids=[0, 1], tokenizer=ctx.tokenizer if tokenizer else None
    )


def _sections():
    """The run's typed config of the shipped YAML (the off-policy pool's keys at their defaults)."""
    from luffy_pool.config.compose import compose_config
    from luffy_pool.config.sections import ConfigSections

    return ConfigSections.from_config(
        compose_config(["data.train_files=x", "data.val_files=null", "actor_rollout_ref.model.path=m"])
    )


# ------------------------------------------------------------------------------------ training data (G7, G9, Weak)
def _gt_case(cid: str, ref: str, gt: Any, token: str):
    @case(cid, ref, f"train parquet: ground truth {gt!r}")
    def _(ctx: Context) -> Outcome:
        path = _parquet(ctx, [_row(0, reward_model={"ground_truth": gt, "style": "rule"})])
        return expect_refusal(lambda: _dataset(ctx, path), "train.parquet", "row 0", token)


_gt_case("train_gt_dict", "G7", {"answer": "3"}, "ground_truth")
_gt_case("train_gt_empty", "Weak", "", "ground_truth")
_gt_case("train_gt_blank", "Weak", "   ", "ground_truth")
_gt_case("train_gt_nan_string", "extra", "nan", "ground_truth")
_gt_case("train_gt_inf_float", "extra", float("inf"), "ground_truth")
_gt_case("train_gt_list_with_empty", "extra", ["3", ""], "ground_truth")
_gt_case("train_gt_nested_list", "extra", [["3"]], "ground_truth")


def _probs_case(cid: str, ref: str, values, token: str):
    @case(cid, ref, f"train parquet: target_ds_qwen_7b_probs {values}")
    def _(ctx: Context) -> Outcome:
        n = _n_target_tokens(ctx)
        probs = values(n)
        path = _parquet(ctx, [_row(0, target_ds_qwen_7b_probs=[0.5] * (n + 1)), _row(1, target_ds_qwen_7b_probs=probs)])
        return _late(lambda c: (path, {"max_target_length": n + 2}))(ctx, "train.parquet", "row 1", token)


_probs_case("probs_nan", "G9", lambda n: [0.5, float("nan")] + [0.5] * (n - 1), "target_ds_qwen_7b_probs")
_probs_case("probs_above_one", "Weak", lambda n: [5.0] * (n + 1), "target_ds_qwen_7b_probs")
_probs_case("probs_wrong_length", "Weak", lambda n: [0.5, 0.5], "target_ds_qwen_7b_probs")
_probs_case("probs_negative", "extra", lambda n: [-0.5] * (n + 1), "target_ds_qwen_7b_probs")
_probs_case("probs_inf", "extra", lambda n: [float("inf")] * (n + 1), "target_ds_qwen_7b_probs")


@case("probs_minus_one_padding", "extra", "train parquet: LUFFY's -1 'unknown' probabilities keep working")
def _(ctx: Context) -> Outcome:
    n = _n_target_tokens(ctx)
    path = _parquet(ctx, [_row(0, target_ds_qwen_7b_probs=[0.5, -1.0] + [0.5] * (n - 1))])

    def check():
        import torch

        lp = _dataset(ctx, path, max_target_length=n + 2)[0]["behaviour_log_probs"]
        return None if bool(torch.isnan(lp[1])) and not bool(torch.isnan(lp[0])) else f"log-probs {lp[:3].tolist()}"

    return expect_accepted(check)


@case("overlong_prompt_unfiltered", "Weak", "train parquet: overlong prompt with filter_overlong_prompts=False")
def _(ctx: Context) -> Outcome:
    path = _parquet(ctx, [_row(0), _row(1, prompt=[{"role": "user", "content": "What is " + "9 + " * 60 + "1?"}])])
    return _late(lambda c: (path, {"max_prompt_length": 64, "filter_overlong_prompts": False}))(
        ctx, "train.parquet", "row 1", "max_prompt_length"
    )


@case("blank_prompt", "extra", "train parquet: a prompt whose content is blank")
def _(ctx: Context) -> Outcome:
    path = _parquet(ctx, [_row(0), _row(1, prompt=[{"role": "user", "content": "  "}])])
    return expect_refusal(lambda: _dataset(ctx, path), "train.parquet", "row 1", "prompt")


@case("prompt_is_a_string", "extra", "train parquet: prompt column holds plain strings")
def _(ctx: Context) -> Outcome:
    path = _parquet(ctx, [_row(0, prompt="What is 1 + 2?")])
    return expect_refusal(lambda: _dataset(ctx, path), "train.parquet", "row 0", "prompt")


@case("target_column_missing", "extra", "train parquet without the target column")
def _(ctx: Context) -> Outcome:
    path = _parquet(ctx, [{k: v for k, v in _row(0).items() if k != "target"}])
    return expect_refusal(lambda: _dataset(ctx, path), "train.parquet", "target")


@case("target_empty_list", "extra", "train parquet: target is an empty list")
def _(ctx: Context) -> Outcome:
    path = _parquet(ctx, [_row(0), _row(1, target=[])])
    return expect_refusal(lambda: _dataset(ctx, path), "train.parquet", "row 1", "target")


@case("data_source_not_string", "extra", "train parquet: data_source is a number")
def _(ctx: Context) -> Outcome:
    path = _parquet(ctx, [_row(0, data_source=7)])
    return expect_refusal(lambda: _dataset(ctx, path), "train.parquet", "row 0", "data_source")


@case("parquet_garbage_bytes", "extra", "train file is not a parquet file")
def _(ctx: Context) -> Outcome:
    path = os.path.join(ctx.tmp("garbage"), "train.parquet")
    open(path, "wb").write(b"not a parquet file at all\n" * 10)
    return expect_refusal(lambda: _dataset(ctx, path), "train.parquet")


@case("parquet_zero_rows", "extra", "train parquet with 0 rows")
def _(ctx: Context) -> Outcome:
    import pandas as pd

    path = os.path.join(ctx.tmp("empty"), "train.parquet")
    pd.DataFrame([_row(0)]).iloc[:0].to_parquet(path)
    return expect_refusal(lambda: _dataset(ctx, path), "train.parquet", "0 rows")


# ------------------------------------------------------------------------------------ off-policy trace files (G10-G13)
def _pool_case(cid: str, ref: str, title: str, row: dict, *names: str, tokenizer: bool = True):
    @case(cid, ref, title)
    def _(ctx: Context) -> Outcome:
        return expect_refusal(_pool(ctx, [{"index": 0, "trace": "x", **row}], tokenizer), "extra.parquet", *names)


_pool_case(
    "offpolicy_nan_logprobs",
    "G10",
    "off-policy file: NaN log-probs",
    {"token_ids": [5, 6], "logprobs": [-0.1, float("nan")]},
    "row 0",
    "logprobs",
)
_pool_case(
    "offpolicy_neg_inf_logprobs",
    "G11",
    "off-policy file: -inf log-probs",
    {"token_ids": [5, 6], "logprobs": [-0.1, float("-inf")]},
    "row 0",
    "logprobs",
)
_pool_case(
    "offpolicy_token_id_oov",
    "G12",
    "off-policy file: token id 99999 (vocabulary ~330)",
    {"token_ids": [5, 99999]},
    "row 0",
    "token_ids",
)
_pool_case(
    "offpolicy_token_id_negative",
    "G12",
    "off-policy file: negative token id",
    {"token_ids": [5, -4]},
    "row 0",
    "token_ids",
)
_pool_case(
    "offpolicy_nested_token_ids",
    "G13",
    "off-policy file: nested token ids",
    {"token_ids": [[5, 6], [7]]},
    "row 0",
    "token_ids",
)
_pool_case(
    "offpolicy_positive_logprobs",
    "extra",
    "off-policy file: probabilities in the logprobs column",
    {"token_ids": [5], "logprobs": [0.7]},
    "row 0",
    "logprobs",
)
_pool_case(
    "offpolicy_logprob_length",
    "extra",
    "off-policy file: log-prob count disagrees with the trace",
    {"token_ids": [5, 6], "logprobs": [-0.1, -0.1, -0.1, -0.1]},
    "row 0",
    "logprobs",
)
_pool_case(
    "offpolicy_empty_ids", "extra", "off-policy file: empty token id list", {"token_ids": [], "trace": ""}, "row 0"
)
_pool_case(
    "offpolicy_no_tokenizer",
    "extra",
    "off-policy file without token_ids and no tokenizer",
    {},
    "token_ids",
    tokenizer=False,
)


@case("offpolicy_missing_trace_column", "extra", "off-policy file without the trace column")
def _(ctx: Context) -> Outcome:
    from luffy_pool.rollout.off_policy_pool import OffPolicyPool

    path = _parquet(ctx, [{"index": 0, "text": "x"}], "extra.parquet")
    return expect_refusal(
        lambda: OffPolicyPool.from_sections(_sections(), path, known_prompt_ids=[0]), "extra.parquet", "trace"
    )


@case("offpolicy_garbage_file", "extra", "off-policy file is not parquet")
def _(ctx: Context) -> Outcome:
    from luffy_pool.rollout.off_policy_pool import OffPolicyPool

    path = os.path.join(ctx.tmp("garbage"), "extra.parquet")
    open(path, "wb").write(b"\x00garbage" * 50)
    return expect_refusal(lambda: OffPolicyPool.from_sections(_sections(), path, known_prompt_ids=[0]), "extra.parquet")


@case("offpolicy_null_logprobs_cell", "extra", "off-policy file: a null logprobs cell (unknown) keeps working")
def _(ctx: Context) -> Outcome:
    make = _pool(
        ctx,
        [
            {"index": 0, "trace": "x", "token_ids": [5, 6], "logprobs": None},
            {"index": 1, "trace": "y", "token_ids": [7], "logprobs": [-0.2]},
        ],
    )
    return expect_accepted(lambda: None if make().extra_traces_for(0)[0].logprobs is None else "lost the null")


# ------------------------------------------------------------------------------------ config values (G5, G6, Weak)
def _cfg_case(cid: str, ref: str, overrides: str, token: str):
    @case(cid, ref, f"config: {overrides}")
    def _(ctx: Context) -> Outcome:
        return expect_config_error(overrides.split(), token)


_cfg_case("temperature_inf", "G5", f"{R}.temperature=inf", f"{R}.temperature")
_cfg_case("temperature_nan", "G5", f"{R}.temperature=nan", f"{R}.temperature")
_cfg_case("temperature_zero", "extra", f"{R}.temperature=0", f"{R}.temperature")
_cfg_case("top_p_nan", "G5", f"{R}.top_p=nan", f"{R}.top_p")
_cfg_case("top_p_zero", "extra", f"{R}.top_p=0", f"{R}.top_p")
_cfg_case(
    "self_replay_slots_above_n",
    "Weak",
    f"data.self_replay.enable=True {A}.use_off_policy_probs=True data.self_replay.slots=9",
    "self_replay.slots",
)
_cfg_case("ppo_token_budget_10", "Weak", f"{A}.ppo_max_token_len_per_gpu=10", "ppo_max_token_len_per_gpu")
_cfg_case("logprob_token_budget_10", "Weak", f"{R}.log_prob_max_token_len_per_gpu=10", "log_prob_max_token_len_per_gpu")
_cfg_case("orm_without_url", "Weak", "reward.orm.enable=True reward.orm.model=judge", "reward.orm.base_url")
_cfg_case(
    "max_response_length_absurd",
    "Weak",
    f"data.max_response_length=100000000 {A}.use_dynamic_bsz=False",
    "data.max_response_length",
)
_cfg_case("n_prefix_above_n", "extra", f"{R}.n_prefix=9", f"{R}.n_prefix")
_cfg_case("resume_mode_typo", "extra", "trainer.resume_mode=latest", "trainer.resume_mode")
_cfg_case("clip_ratio_neg_inf", "extra", f"{A}.clip_ratio=-inf", f"{A}.clip_ratio")


@case("unknown_key_typo", "extra", "config: a misspelt key names the closest one")
def _(ctx: Context) -> Outcome:
    from luffy_pool.config.check import prepare_overrides

    return expect_refusal(lambda: prepare_overrides([f"{R}.temprature=0.7"]), f"{R}.temperature")


@case("n_gpus_64_on_this_machine", "G6", "trainer.n_gpus_per_node=64 on this machine's cores (pre-flight rule)")
def _(ctx: Context) -> Outcome:
    try:
        from luffy_pool.run.preflight import cluster_capacity_problem
    except ImportError:
        return Outcome("bad", "no cluster capacity check")
    cores = float(os.cpu_count() or 1)
    problem = cluster_capacity_problem(1, 64, False, {"CPU": max(64.0, cores)}, 1, cores)
    if 64 <= 4 * cores:
        return Outcome("n/a", f"{cores:g} cores fit 64 CPU ranks")
    return Outcome("good", problem[:150]) if problem and "64" in problem else Outcome("bad", "accepted")


@case(
    "max_response_vs_model_context", "Weak", "trainer: max_response_length beyond the model's positions", timeout_s=240
)
def _(ctx: Context) -> Outcome:
    rc, err = run_trainer(ctx, ["data.max_response_length=100000", f"{A}.use_dynamic_bsz=False"], 200)
    return judge_trainer(rc, err, "max_position_embeddings")


@case("trainer_bad_data_row", "G7", "trainer: a dict ground truth in the train parquet", timeout_s=240)
def _(ctx: Context) -> Outcome:
    import pandas as pd

    frame = pd.read_parquet(os.path.join(ctx.task_dir, "train.parquet"))
    frame.at[2, "reward_model"] = {"ground_truth": "", "style": "rule"}
    path = os.path.join(ctx.tmp("bad_train"), "train.parquet")
    frame.to_parquet(path)
    rc, err = run_trainer(ctx, [f"data.train_files={path}"], 200)
    return judge_trainer(rc, err, "row 2", "ground_truth")


@case("unwritable_hdfs_dir", "G4", "config: trainer.default_hdfs_dir that cannot be written")
def _(ctx: Context) -> Outcome:
    from luffy_pool.config.compose import compose_config
    from luffy_pool.run.preflight import preflight

    ro = ctx.tmp("readonly")
    os.chmod(ro, 0o500)
    if os.access(ro, os.W_OK):  # root writes anywhere: use a path under a file instead
        ro = os.path.join(ctx.tmp("file"), "f")
        open(ro, "w").write("x")
    cfg = compose_config(
        [
            f"actor_rollout_ref.model.path={ctx.model_dir}",
            f"data.train_files={ctx.task_dir}/train.parquet",
            "data.val_files=null",
            f"trainer.default_local_dir={ctx.tmp('out')}",
            f"trainer.default_hdfs_dir={ro}/hdfs",
        ],
        "tiny_cpu_luffy",
    )
    return expect_refusal(lambda: preflight(cfg), "default_hdfs_dir")


# The eval and data-prep scripts' cases live in probe_bad_input_scripts.py (registered on import).
from exp_scripts import probe_bad_input_scripts as _scripts  # noqa: E402,F401

# The checkpoint, signal, secret, new-user and load cases live in probe_bad_input_faults.py (registered on import).
from exp_scripts import probe_bad_input_faults as _faults  # noqa: E402,F401

# Real models' tokens, stop rules and sizes: probe_bad_input_models.py (registered on import).
from exp_scripts import probe_bad_input_models as _models  # noqa: E402,F401
