"""LUFFY's comparison at tiny scale on CPU, in one command: every method, same model, data, steps and seeds.

Builds the tiny random model and a synthetic arithmetic task (two-digit addition by default) on which
the untrained model never produces a correct answer (measured and reported: the probe samples training
prompts as on-policy GRPO would), then trains each method in its own process, sequentially:
on-policy GRPO, RL w/ SFT loss, SFT, SFT then RL, LUFFY without policy shaping and LUFFY (configs
``luffy_pool/config/tiny_cpu_*.yaml``). Each final model is scored on the held-out split with
``eval_scripts/generate_vllm.py`` (greedy pass@1 and avg@k at T=0.6). Writes into ``--out``:
``results.md`` / ``results.json`` (table: held-out accuracy, final on-policy train reward, entropy,
response length, wall time), ``plots/*.png`` (on-policy reward, entropy, off-policy token probability and
response length over steps, one line per method) and ``<method>/metrics.jsonl`` plus logs and models.

    .venv/bin/python exp_scripts/reproduce_tiny.py [--steps 100] [--methods all|luffy,on_policy,...] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from typing import Mapping, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for _path in (HERE, REPO):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from reproduce.evaluate import evaluate_model, probe_on_policy_success  # noqa: E402
from reproduce.methods import METHODS, RunSettings, needs_sft, parse_methods, rl_overrides, sft_overrides  # noqa: E402
from reproduce.report import (ENTROPY, ON_LENGTH, ON_REWARD, final_value, markdown_table, plot_dynamics,  # noqa: E402
                              write_results)
from verl.utils.tracking import read_metrics_jsonl  # noqa: E402

# Every child: one OpenMP thread (2-core box, CPU_STACK.md), Ray without token auth or usage stats,
# vLLM's engine in-process, offline trackers.
CHILD_ENV = {"OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
             "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
RUN_RL = os.path.join(HERE, "reproduce", "run_rl.py")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python exp_scripts/reproduce_tiny.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "outputs", "reproduce_tiny"), help="output folder")
    ap.add_argument("--methods", default="all", help=f"all, or a comma list of {', '.join(METHODS)}")
    ap.add_argument("--steps", type=int, default=100, help="training steps of every method (SFT: optimizer steps)")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per RL step = traces per SFT step")
    ap.add_argument("--n", type=int, default=8, help="group size (LUFFY: 1 teacher trace + n-1 own samples)")
    ap.add_argument("--response-length", type=int, default=48, help="max new tokens (traces are <= 40 at level 2)")
    ap.add_argument("--max-prompt-length", type=int, default=128, help="prompt token budget")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate of every method")
    ap.add_argument("--level", type=int, default=2, help="task difficulty (operand digits, luffy_pool.tiny)")
    ap.add_argument("--ops", default="+", help="operators of the task, e.g. '+' or '+*'")
    ap.add_argument("--n-train", type=int, default=512, help="training problems")
    ap.add_argument("--n-test", type=int, default=64, help="held-out problems")
    ap.add_argument("--system-prompt", action="store_true",
                    help="keep the task's system prompt (off: shorter sequences; LUFFY's eval drops it anyway)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tiny model and the task")
    ap.add_argument("--rollout", choices=("vllm", "hf"), default="vllm", help="rollout and eval engine")
    ap.add_argument("--ranks", type=int, default=2, help="FSDP ranks of the RL runs (CPU worker processes)")
    ap.add_argument("--eval-samples", type=int, default=4, help="k of the held-out avg@k at T=0.6 (0 = greedy only)")
    ap.add_argument("--probe-rows", type=int, default=64, help="training prompts sampled to probe the untrained model")
    ap.add_argument("--smooth", type=int, default=5, help="moving-average window of the plotted curves (steps)")
    ap.add_argument("--run-timeout", type=float, default=None, help="seconds before one training/eval process is stopped")
    return ap


def child_env() -> dict:
    env = dict(os.environ)
    for key, value in CHILD_ENV.items():
        env.setdefault(key, value)
    env.pop("RAY_ADDRESS", None)  # always a private Ray instance: never attach to someone else's cluster
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def prepare_task(args, out: str) -> tuple[str, str, str]:
    """Build the tiny model and write train/test parquets; returns (model_dir, train_file, test_file)."""
    from luffy_pool.tiny import build_tiny_model, write_task_parquets
    from luffy_pool.tiny.arith_task import SYSTEM_PROMPT
    from luffy_pool.tiny.model import TinyModelSpec

    model_dir = build_tiny_model(os.path.join(out, "model"), TinyModelSpec(seed=args.seed))
    paths = write_task_parquets(os.path.join(out, "data"), n_train=args.n_train, n_test=args.n_test, level=args.level,
                                ops=tuple(args.ops), seed=args.seed,
                                system_prompt=SYSTEM_PROMPT if args.system_prompt else None)
    return model_dir, paths["train"], paths["test"]


def run_logged(cmd: Sequence[str], log_path: str, env: Mapping[str, str], timeout_s: Optional[float]) -> float:
    """Run ``cmd`` with its output in ``log_path``; returns the wall time, raises naming the log on failure."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=dict(env), cwd=REPO,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"stopped after {timeout_s:.0f} s (--run-timeout); see {log_path}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}; see {log_path}")
    return time.perf_counter() - start


def fresh_dir(path: str) -> str:
    """An empty ``path`` (the jsonl tracker appends, so a rerun must not see the last run's file)."""
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def train_sft(settings: RunSettings, run_dir: str, env, timeout_s) -> tuple[str, float]:
    """The SFT trainer's CLI on tiny_cpu_sft.yaml; returns (final HF folder, wall seconds)."""
    fresh_dir(run_dir)
    cmd = [sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", "--config-dir", os.path.join(REPO, "luffy_pool", "config"),
           "--config-name", METHODS["sft"].config_name, *sft_overrides(settings, run_dir)]
    wall = run_logged(cmd, os.path.join(run_dir, "train.log"), env, timeout_s)
    return os.path.join(run_dir, "final"), wall


def train_rl(config_name: str, settings: RunSettings, run_dir: str, env, timeout_s,
             model_dir: Optional[str] = None) -> tuple[str, float]:
    """One RL run through ``reproduce/run_rl.py``; returns (final HF folder, wall seconds)."""
    fresh_dir(run_dir)
    hf_dir = os.path.join(run_dir, "final")
    cmd = [sys.executable, RUN_RL, "--config-name", config_name, "--hf-out", hf_dir,
           "--result", os.path.join(run_dir, "run_result.json"), *rl_overrides(settings, run_dir, model_dir)]
    wall = run_logged(cmd, os.path.join(run_dir, "train.log"), env, timeout_s)
    return hf_dir, wall


def training_summary(metrics_file: str) -> dict:
    """Final on-policy reward, entropy and on-policy response length from a run's metrics.jsonl."""
    records = read_metrics_jsonl(metrics_file)
    return {"train_reward": final_value(records, ON_REWARD), "entropy": final_value(records, ENTROPY),
            "on_policy_response_length": final_value(records, ON_LENGTH), "steps_logged": len(records)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        names = parse_methods(args.methods)
    except ValueError as exc:
        build_parser().error(str(exc))
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = child_env()
    t_all = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[reproduce_tiny {time.perf_counter() - t_all:6.0f}s] {msg}", flush=True)

    model_dir, train_file, test_file = prepare_task(args, out)
    settings = RunSettings(model_dir=model_dir, train_file=train_file, test_file=test_file, steps=args.steps,
                           batch_size=args.batch_size, n=args.n, response_length=args.response_length,
                           max_prompt_length=args.max_prompt_length, lr=args.lr, rollout=args.rollout, ranks=args.ranks)
    say(f"task: level {args.level} '{args.ops}', {args.n_train} train / {args.n_test} held-out problems in {out}/data")

    eval_kw = dict(max_tokens=args.response_length, env=env, rollout=args.rollout, timeout_s=args.run_timeout)
    probe = probe_on_policy_success(model_dir, train_file, os.path.join(out, "untrained", "eval"), n=args.n,
                                    rows=args.probe_rows, **eval_kw)
    say(f"untrained model: {probe['correct']} correct of {probe['samples']} samples on training prompts (T=1.0)")
    rows = [{"name": "untrained", "label": "Untrained model", "wall_s": None,
             "eval": evaluate_model(model_dir, test_file, os.path.join(out, "untrained", "eval"),
                                    eval_samples=args.eval_samples, **eval_kw),
             "train_reward": probe["accuracy"]}]

    sft_model: Optional[str] = None
    sft_wall = 0.0
    sft_error: Optional[str] = None
    if needs_sft(names):
        say(f"SFT: {args.steps} steps")
        try:
            sft_model, sft_wall = train_sft(settings, os.path.join(out, "sft"), env, args.run_timeout)
        except RuntimeError as exc:
            sft_error = str(exc)
            say(f"SFT failed: {exc}")

    runs_for_plots: dict = {}
    for name in names:
        method = METHODS[name]
        run_dir = os.path.join(out, name)
        row = {"name": name, "label": method.label, "config": f"luffy_pool/config/{method.config_name}.yaml"}
        try:
            if method.kind == "sft":
                if sft_error:
                    raise RuntimeError(sft_error)
                hf_dir, wall = sft_model, sft_wall
            elif method.kind == "sft_rl":
                if sft_error:
                    raise RuntimeError(f"SFT stage: {sft_error}")
                say(f"{name}: RL {args.steps} steps from the SFT model")
                hf_dir, rl_wall = train_rl(method.config_name, settings, run_dir, env, args.run_timeout, sft_model)
                wall = sft_wall + rl_wall
            else:
                say(f"{name}: RL {args.steps} steps")
                hf_dir, wall = train_rl(method.config_name, settings, run_dir, env, args.run_timeout)
            metrics_file = os.path.join(run_dir, "metrics.jsonl")
            row.update(wall_s=wall, metrics_file=metrics_file)
            if method.kind != "sft":
                row.update(training_summary(metrics_file))
                runs_for_plots[method.label] = read_metrics_jsonl(metrics_file)
            row["eval"] = evaluate_model(hf_dir, test_file, os.path.join(run_dir, "eval"),
                                         eval_samples=args.eval_samples, **eval_kw)
            say(f"{name}: trained in {wall:.0f} s; held-out greedy pass@1 {row['eval']['greedy']['accuracy']:.3f}")
        except (RuntimeError, OSError, KeyError, ValueError) as exc:
            row["error"] = str(exc)
            say(f"{name}: FAILED: {exc}")
        rows.append(row)

    plots = plot_dynamics(runs_for_plots, os.path.join(out, "plots"), smooth=args.smooth) if runs_for_plots else []
    settings_record = {**{k: v for k, v in vars(args).items() if k != "out"}, "out": out, "methods": names,
                       "mini_batch_size": settings.mini_batch_size, "sft_micro_batch_size": settings.sft_micro_batch_size,
                       "seeds": "tiny model / task: --seed; RL data order data.seed=47, driver trainer.seed=1, "
                                "rollout.seed=0; SFT trainer.seed=47"}
    notes = ["The untrained model's 'final on-policy train reward' is its probe success rate on training prompts."]
    if probe["correct"] > 0:
        notes.append(f"The untrained model solved {probe['correct']} probe samples: this task is NOT one where "
                     f"on-policy RL starts without signal; use a harder --level.")
    md_path = write_results(out, rows, settings_record, probe, plots, notes)
    say(f"done in {time.perf_counter() - t_all:.0f} s")
    print(markdown_table(rows))
    print(f"results: {md_path}")
    for path in plots:
        print(f"plot: {path}")
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
