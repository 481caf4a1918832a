"""Cases of ``exp_scripts/probe_bad_input.py`` for real models' tokens, stop rules and sizes (registered on import).

What a first run on a model other than the tiny one meets: Llama-3.x defines no pad token, Qwen3 stops on two ids,
a launch script's default model may be too short for the script's lengths, and vLLM's TP may not split the heads.
Each case builds the tiny model with the real model's tokens from tests/data/model_configs where it needs one.
"""

from __future__ import annotations

import os
import shutil

from exp_scripts.probe_bad_input import Context, Outcome, expect_accepted, expect_refusal
from exp_scripts.probe_bad_input_cases import case

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "tests", "data", "model_configs")


def _tiny_with_real_tokens(ctx: Context, name: str) -> str:
    from luffy_pool.tiny.model import TinyModelSpec, build_tiny_model_like

    return build_tiny_model_like(
        ctx.tmp(name.split("--")[-1]), os.path.join(CONFIGS, name + ".json"), TinyModelSpec(num_hidden_layers=1)
    )


@case("llama_without_pad_token", "Tokens", "a Llama-3.1 tokenizer (no pad token) builds the RL dataset", timeout_s=120)
def _(ctx: Context) -> Outcome:
    import pandas as pd

    from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget
    from verl.utils.tokenizer import hf_tokenizer

    folder = _tiny_with_real_tokens(ctx, "meta-llama--Llama-3.1-8B")

    def build():
        tok = hf_tokenizer(folder)
        if tok.pad_token != "<|finetune_right_pad_id|>":
            return f"pad token {tok.pad_token!r}"
        rows = pd.read_parquet(os.path.join(ctx.task_dir, "train.parquet")).head(4)
        path = os.path.join(ctx.tmp("llama_data"), "train.parquet")
        rows.to_parquet(path)
        ds = RLHFDatasetWithTarget(path, tok, max_prompt_length=128, max_target_length=128)
        return None if int(ds[0]["input_ids"][0]) == tok.pad_token_id else "prompt not left-padded with the pad id"

    return expect_accepted(build)


@case(
    "qwen3_second_stop_id",
    "Tokens",
    "a Qwen3 response ending on <|endoftext|> (its second stop id) is masked there",
    timeout_s=120,
)
def _(ctx: Context) -> Outcome:
    import numpy as np
    import torch

    from luffy_pool.rollout.slot_plan import assemble_responses, build_slot_plan
    from verl.utils.tokenizer import hf_tokenizer, stop_token_ids

    folder = _tiny_with_real_tokens(ctx, "Qwen--Qwen3-8B")
    tok = hf_tokenizer(folder)
    stops = stop_token_ids(tok, folder)
    second = tok.convert_tokens_to_ids("<|endoftext|>")
    plan = build_slot_plan(
        torch.tensor([[5, 6]]),
        torch.tensor([[1, 1]]),
        None,
        np.zeros((1, 1)),
        tok.pad_token_id,
        tok.eos_token_id,
        8,
        n=1,
        stop_token_ids=stops,
    )
    mask = assemble_responses(plan, [[7, 8, second]]).tensors["response_mask"][0].tolist()
    if second not in stops:
        return Outcome("bad", f"stop ids {stops} miss <|endoftext|>")
    return Outcome("good", f"mask {mask}") if mask == [1, 1, 1, 0, 0, 0, 0, 0] else Outcome("bad", f"mask {mask}")


def _script_config_problems(ctx: Context, script: str, config_name: str, *extra: str) -> list[str]:
    from luffy_pool.memory_plan.launch_script import script_config_problems

    folder = ctx.tmp(config_name.split("--")[-1])
    shutil.copyfile(os.path.join(CONFIGS, config_name + ".json"), os.path.join(folder, "config.json"))
    env = dict(os.environ, MODEL_PATH=folder)
    return script_config_problems(os.path.join(REPO, "exp_scripts", script), extra, env)


def _raise(problems: list[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))


@case(
    "script_too_long_for_model",
    "Lengths",
    "train_exgrpo.sh's 1024 + 8192 tokens on Qwen2.5-Math-7B (4,096 positions)",
    timeout_s=120,
)
def _(ctx: Context) -> Outcome:
    return expect_refusal(
        lambda: _raise(_script_config_problems(ctx, "train_exgrpo.sh", "Qwen--Qwen2.5-Math-7B")),
        "max_position_embeddings",
        "data.max_response_length",
    )


@case("vllm_tp_heads", "Lengths", "vLLM TP 8 on Qwen2.5-Math-7B's 28 heads", timeout_s=120)
def _(ctx: Context) -> Outcome:
    tp8 = "actor_rollout_ref.rollout.tensor_model_parallel_size=8"
    return expect_refusal(
        lambda: _raise(_script_config_problems(ctx, "train.sh", "Elliott--Qwen2.5-Math-7B-16k-think", tp8)),
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "num_attention_heads",
    )


@case("same_failure_after_restart", "Restart", "a worker that dies at the same step after its restart ends the run")
def _(ctx: Context) -> Outcome:
    from luffy_pool.run.recovery import Failure, RestartPolicy

    policy = RestartPolicy(max_restarts=3)
    dead = Failure("worker_died", True, "rank 2 exited with SIGKILL")
    first, again = policy.decide(dead, 7), policy.decide(dead, 7)
    if not first.restart:
        return Outcome("bad", "the first failure was not restarted")
    if again.restart:
        return Outcome("bad", "the same failure at the same step was restarted again (replays from the checkpoint)")
    return (
        Outcome("good", again.reason[:150])
        if "again after the restart" in again.reason
        else Outcome("weak", again.reason[:150])
    )


@case("split_pool_capacity", "Restart", "a restart of split engines waits for the rollout pool too")
def _(ctx: Context) -> Outcome:
    from luffy_pool.run.recovery import can_host

    nodes = [{"Alive": True, "Resources": {"GPU": 8.0, "CPU": 64.0}}]
    bundle = {"GPU": 1.0}
    if not can_host(nodes, [8], bundle):
        return Outcome("bad", "8 GPUs cannot host an 8-rank actor")
    if can_host(nodes, [8], bundle, rollout_groups=[8]):
        return Outcome("bad", "one 8-GPU node was taken as room for the actor and an 8-GPU rollout pool")
    return Outcome("good", "one node of 8 GPUs: actor 8 fits, actor 8 + rollout pool 8 does not")


def _plan_output(script: str, env: dict) -> tuple[int, str]:
    import contextlib
    import io

    from luffy_pool.memory_plan.__main__ import main as plan_main

    out = io.StringIO()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = plan_main([os.path.join(REPO, "exp_scripts", script), "--gpu-memory", "80"])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rc, out.getvalue()


@case(
    "plan_counts_vllm_communicator",
    "Memory",
    "train.sh's memory plan at 80 GB counts vLLM's own TP communicator",
    timeout_s=120,
)
def _(ctx: Context) -> Outcome:
    rc, text = _plan_output("train.sh", {})
    line = next((ln.strip() for ln in text.splitlines() if "vLLM's TP communicator" in ln), "")
    if rc != 0:
        return Outcome("bad", f"plan exit {rc}: {text.strip().splitlines()[-1][:120]}")
    return Outcome("good", line[:150]) if line else Outcome("bad", "no line for vLLM's TP communicator")


@case(
    "qwen3_overrides_fit",
    "Memory",
    "MODEL_OVERRIDES=Qwen3-8B: train.sh's plan fits 80 GB, KV demand under 1.2x",
    timeout_s=120,
)
def _(ctx: Context) -> Outcome:
    rc, text = _plan_output("train.sh", {"MODEL_PATH": "Qwen/Qwen3-8B", "MODEL_OVERRIDES": "Qwen3-8B"})
    demand = [ln.strip() for ln in text.splitlines() if "KV demand" in ln]
    return Outcome("good", (demand or ["fits"])[0][:150]) if rc == 0 else Outcome("bad", text.strip()[-150:])


@case("exgrpo_pool_cap", "Memory", "ExGRPO's pool keeps at most max_trajectories_per_question per question")
def _(ctx: Context) -> Outcome:
    from luffy_pool.config.compose import compose_config

    cfg = compose_config(
        [
            "actor_rollout_ref.model.path=/m",
            "data.train_files=/t.parquet",
            "data.val_files=null",
            "algorithm.method=exgrpo",
        ],
        "tiny_cpu_luffy",
    )
    cap = cfg.algorithm.exgrpo.max_trajectories_per_question
    return Outcome("good", f"cap {cap} per question") if cap and cap > 0 else Outcome("bad", f"cap {cap}")


@case("fork_server_gpu_ranks", "Fork", "the fork server does not fork ranks that ask for GPUs")
def _(ctx: Context) -> Outcome:
    from luffy_pool_dev.worker_zygote import gpu_refusal

    why = gpu_refusal(1, "MIXActorRolloutRefWorker")
    if gpu_refusal(0, "cpu ranks"):
        return Outcome("bad", "CPU ranks refused")
    return Outcome("good", why[:150]) if why else Outcome("bad", "GPU ranks would be forked")
