"""LUFFY's comparison at tiny scale on CPU, in one command: every method, same model, data, budget and seeds.

Builds the tiny random model and a synthetic arithmetic task (two-digit addition by default), optionally
warms the model with a short SFT on a disjoint split (``--warm-steps``: the "weak start"; 0 = the random
model), probes the start model's on-policy success on training prompts (as on-policy GRPO first sees
them), then trains each method from that same start, once per seed (``--seeds``), each run in its own
process: by default the main comparison on-policy GRPO, LUFFY, LUFFY without policy shaping, SFT and LUFFY
+ self-replay (``--methods all`` adds RL w/ SFT loss and SFT then RL; configs
``luffy_pool/config/tiny_cpu_*.yaml``). Every method gets the same steps, batch, learning rate, data and
seeds; nothing depends on a method's result. Each final model is scored on the held-out split with
``eval_scripts/generate_vllm.py`` (greedy pass@1, plus avg@k at T=0.6 with ``--eval-samples``); RL runs
also validate on it every ``--val-every`` steps (the held-out curve). CPU seconds of every process tree
are measured from /proc (the machine may be shared; wall time is reported too). Writes into ``--out``:
``results.md`` / ``results.json`` (per-method table over seeds: mean ± std [min, max], and per run),
``plots/*.png`` (mean over seeds with min–max band: on-policy reward, held-out accuracy, entropy; plus
the per-run dynamics of the first seed) and ``seed<k>/<method>/`` with metrics, logs and models.

    .venv/bin/python exp_scripts/reproduce_tiny.py [--warm-steps 160] [--seeds 0,1,2] [--methods main] [--out DIR]

Measured with the defaults (160 warm steps: start pass rate 3.7 %; 150 steps, lr 1e-4, 3 seeds; reward over the
first / last 50 steps, mean ± std over seeds): on-policy GRPO 0.015 -> 0.010 (change -0.004 ± 0.008, flat to
falling), LUFFY 0.022 -> 0.027 (+0.004 ± 0.003, up on every seed), LUFFY w/o shaping +0.008 ± 0.004, LUFFY +
self-replay +0.005 ± 0.005; held-out greedy pass@1 0.021 / 0.057 / 0.021 / 0.052, SFT 0.130. CPU on a quiet machine:
883 s in total (25 warm start + 10 start-model probe + 785 training + 63 evaluation). Under heavy sharing the same
command measured 1070 s, because contention inflates CPU seconds.
"""
from __future__ import annotations

import argparse
import json
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

from reproduce.cputime import run_measured  # noqa: E402
from reproduce.evaluate import evaluate_model, probe_on_policy_success  # noqa: E402
from reproduce.methods import METHODS, RunSettings, needs_sft, parse_methods, rl_overrides, sft_overrides  # noqa: E402
from reproduce.report import ENTROPY, ON_LENGTH, ON_REWARD, final_value, markdown_table, plot_dynamics  # noqa: E402
from reproduce.seeds_report import aggregate_table, plot_seed_curves, run_summary  # noqa: E402
from verl.utils.tracking import read_metrics_jsonl  # noqa: E402

# Every child: one OpenMP thread (2-core box, docs/CPU_STACK.md §5.3), Ray without token auth or usage stats,
# vLLM's engine in-process, offline trackers.
CHILD_ENV = {"OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
             "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
RUN_RL = os.path.join(HERE, "reproduce", "run_rl.py")
# The warm start: quickstart.sh's SFT recipe (sft_trainer.yaml's schedule) on the task's disjoint warm split; only the
# step count varies.
WARM_SFT = {"data.max_length": 160, "data.train_batch_size": 32, "data.micro_batch_size_per_gpu": 32, "optim.lr": 3e-3}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python exp_scripts/reproduce_tiny.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "outputs", "reproduce_tiny"), help="output folder")
    ap.add_argument("--methods", default="main", help=f"main, all, or a comma list of {', '.join(METHODS)}")
    ap.add_argument("--seeds", default="0,1,2", help="comma list of run seeds; every method runs once per seed")
    ap.add_argument("--warm-steps", type=int, default=160,
                    help="SFT steps of the warm start on the disjoint warm split (0 = start from the random model)")
    ap.add_argument("--n-warm", type=int, default=2048, help="problems of the warm split (disjoint from train/test)")
    ap.add_argument("--steps", type=int, default=150, help="training steps of every method (SFT: optimizer steps)")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per RL step = traces per SFT step")
    ap.add_argument("--mini-batches", type=int, default=1, help="optimizer updates per RL step (LUFFY: 2)")
    ap.add_argument("--n", type=int, default=8, help="group size (LUFFY: 1 teacher trace + n-1 own samples)")
    ap.add_argument("--response-length", type=int, default=48, help="max new tokens (traces are <= 40 at level 2)")
    ap.add_argument("--max-prompt-length", type=int, default=128, help="prompt token budget")
    ap.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate of every method")
    ap.add_argument("--level", type=int, default=2, help="task difficulty (operand digits, luffy_pool.tiny)")
    ap.add_argument("--ops", default="+", help="operators of the task, e.g. '+' or '+*'")
    ap.add_argument("--n-train", type=int, default=512, help="training problems")
    ap.add_argument("--n-test", type=int, default=64, help="held-out problems")
    ap.add_argument("--system-prompt", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the task's system prompt (the measured weak-start regime has it; --no-system-prompt: "
                         "shorter sequences)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tiny model and the task")
    ap.add_argument("--rollout", choices=("vllm", "hf"), default="hf", help="rollout and eval engine")
    ap.add_argument("--ranks", type=int, default=1, help="FSDP ranks of the RL runs (CPU worker processes)")
    ap.add_argument("--val-every", type=int, default=50, help="held-out validation every K RL steps (-1: none)")
    ap.add_argument("--eval-samples", type=int, default=0, help="k of the held-out avg@k at T=0.6 (0 = greedy only)")
    ap.add_argument("--probe-rows", type=int, default=64, help="training prompts sampled to probe the start model")
    ap.add_argument("--window", type=int, default=50, help="steps averaged for the reward at the start / end of a run")
    ap.add_argument("--smooth", type=int, default=20, help="moving-average window of the plotted curves (steps)")
    ap.add_argument("--run-timeout", type=float, default=None, help="seconds before one training/eval process is stopped")
    ap.add_argument("--reuse", action="store_true",
                    help="keep runs and evaluations already finished in --out with the same command (run a comparison in "
                         "parts, e.g. --seeds 0 then --seeds 1, then summarise all of it with the full --seeds)")
    return ap


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds: expected a comma list of integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: expected distinct integers, got {text!r}")
    return seeds


def child_env() -> dict:
    env = dict(os.environ)
    for key, value in CHILD_ENV.items():
        env.setdefault(key, value)
    env.pop("RAY_ADDRESS", None)  # always a private Ray instance: never attach to someone else's cluster
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def prepare_task(args, out: str) -> tuple[str, str, str, Optional[str]]:
    """Build the tiny model and write the parquets; returns (model_dir, train_file, test_file, warm_file)."""
    from luffy_pool.tiny import build_tiny_model, write_task_parquets
    from luffy_pool.tiny.arith_task import SYSTEM_PROMPT
    from luffy_pool.tiny.model import TinyModelSpec

    model_dir = build_tiny_model(os.path.join(out, "model"), TinyModelSpec(seed=args.seed))
    paths = write_task_parquets(os.path.join(out, "data"), n_train=args.n_train, n_test=args.n_test, level=args.level,
                                ops=tuple(args.ops), seed=args.seed,
                                system_prompt=SYSTEM_PROMPT if args.system_prompt else None,
                                n_warm=args.n_warm if args.warm_steps > 0 else 0)
    return model_dir, paths["train"], paths["test"], paths.get("warm")


DONE_FILE = "done.json"  # in a run folder: the command that finished there, its wall and CPU seconds


class Meter:
    """Runs commands with their output in a log, adding up wall and CPU seconds per category.

    With ``reuse``, a folder whose ``done.json`` records exactly the same command is not run again: its
    recorded seconds count instead (so a comparison can be run in parts, e.g. one seed per call, and
    summarised by a last call over everything).
    """

    def __init__(self, env: Mapping[str, str], timeout_s: Optional[float], reuse: bool = False):
        self.env, self.timeout_s, self.reuse = env, timeout_s, reuse
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.cpu_source = "proc"

    def finished(self, run_dir: str, cmd: Sequence[str]) -> Optional[dict]:
        path = os.path.join(run_dir, DONE_FILE)
        if not self.reuse or not os.path.exists(path):
            return None
        with open(path) as f:
            done = json.load(f)
        return done if done.get("cmd") == list(cmd) else None

    def run(self, cmd: Sequence[str], log_path: str, category: str) -> tuple[float, float]:
        """Run ``cmd``; returns (wall s, CPU s); raises naming the log on failure."""
        run_dir = os.path.dirname(log_path)
        done = self.finished(run_dir, cmd)
        if done is not None:
            self.cpu[category] = self.cpu.get(category, 0.0) + done["cpu_s"]
            self.wall[category] = self.wall.get(category, 0.0) + done["wall_s"]
            return done["wall_s"], done["cpu_s"]
        os.makedirs(run_dir, exist_ok=True)
        try:
            code, wall, cpu, source = run_measured(cmd, log_path, self.env, REPO, self.timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"stopped after {self.timeout_s:.0f} s (--run-timeout); see {log_path}") from None
        self.cpu[category] = self.cpu.get(category, 0.0) + cpu
        self.wall[category] = self.wall.get(category, 0.0) + wall
        if source != "proc":
            self.cpu_source = source
        if code != 0:
            raise RuntimeError(f"exit {code}; see {log_path}")
        with open(os.path.join(run_dir, DONE_FILE), "w") as f:
            json.dump({"cmd": list(cmd), "wall_s": wall, "cpu_s": cpu}, f)
        return wall, cpu


def fresh_dir(path: str, meter: Optional["Meter"] = None, cmd: Optional[Sequence[str]] = None) -> str:
    """An empty ``path`` (the jsonl tracker appends, so a rerun must not see the last run's file), unless
    ``meter`` may reuse the finished run of ``cmd`` there."""
    if meter is not None and cmd is not None and meter.finished(path, cmd) is not None:
        return path
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def sft_command(config_overrides: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", "--config-dir", os.path.join(REPO, "luffy_pool", "config"),
            "--config-name", METHODS["sft"].config_name, *config_overrides]


def warm_start(model_dir: str, warm_file: str, steps: int, run_dir: str, meter: Meter) -> str:
    """SFT the random model for ``steps`` steps on the warm split (quickstart's recipe); returns the HF folder."""
    cmd = [sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", f"model.path={model_dir}",
           f"data.train_files={warm_file}", f"trainer.total_training_steps={steps}",
           *(f"{k}={v}" for k, v in WARM_SFT.items()), "trainer.device=cpu", "trainer.logger=['jsonl']",
           f"trainer.default_local_dir={run_dir}", "trainer.experiment_name=warm_start"]
    fresh_dir(run_dir, meter, cmd)
    meter.run(cmd, os.path.join(run_dir, "train.log"), "warm_start")
    return os.path.join(run_dir, "final")


def train_sft(settings: RunSettings, run_dir: str, meter: Meter) -> tuple[str, float, float]:
    """The SFT trainer's CLI on tiny_cpu_sft.yaml; returns (final HF folder, wall s, CPU s)."""
    cmd = sft_command(sft_overrides(settings, run_dir))
    fresh_dir(run_dir, meter, cmd)
    wall, cpu = meter.run(cmd, os.path.join(run_dir, "train.log"), "training")
    return os.path.join(run_dir, "final"), wall, cpu


def train_rl(config_name: str, settings: RunSettings, run_dir: str, meter: Meter,
             model_dir: Optional[str] = None) -> tuple[str, float, float]:
    """One RL run through ``reproduce/run_rl.py``; returns (final HF folder, wall s, CPU s)."""
    hf_dir = os.path.join(run_dir, "final")
    cmd = [sys.executable, RUN_RL, "--config-name", config_name, "--hf-out", hf_dir,
           "--result", os.path.join(run_dir, "run_result.json"), *rl_overrides(settings, run_dir, model_dir)]
    fresh_dir(run_dir, meter, cmd)
    wall, cpu = meter.run(cmd, os.path.join(run_dir, "train.log"), "training")
    return hf_dir, wall, cpu


def training_summary(metrics_file: str, window: int) -> dict:
    """Final on-policy reward, entropy and response length, and the start/end summary, from a run's metrics."""
    records = read_metrics_jsonl(metrics_file)
    return {"train_reward": final_value(records, ON_REWARD), "entropy": final_value(records, ENTROPY),
            "on_policy_response_length": final_value(records, ON_LENGTH), "steps_logged": len(records),
            "summary": run_summary(records, window)}


def run_method(name: str, settings: RunSettings, seed_dir: str, meter: Meter, sft_stage: dict, eval_kw: dict,
               window: int) -> tuple[dict, Optional[dict]]:
    """Train and evaluate one method for one seed; returns (result row, metrics records or None)."""
    method = METHODS[name]
    run_dir = os.path.join(seed_dir, name)
    row = {"name": name, "label": method.label, "seed": settings.seed,
           "config": f"luffy_pool/config/{method.config_name}.yaml"}
    records = None
    try:
        if method.kind == "sft":
            if sft_stage.get("error"):
                raise RuntimeError(sft_stage["error"])
            hf_dir, wall, cpu = sft_stage["model"], sft_stage["wall"], sft_stage["cpu"]
            metrics_file = os.path.join(seed_dir, "sft", "metrics.jsonl")
        elif method.kind == "sft_rl":
            if sft_stage.get("error"):
                raise RuntimeError(f"SFT stage: {sft_stage['error']}")
            hf_dir, rl_wall, rl_cpu = train_rl(method.config_name, settings, run_dir, meter, sft_stage["model"])
            wall, cpu = sft_stage["wall"] + rl_wall, sft_stage["cpu"] + rl_cpu
            metrics_file = os.path.join(run_dir, "metrics.jsonl")
        else:
            hf_dir, wall, cpu = train_rl(method.config_name, settings, run_dir, meter)
            metrics_file = os.path.join(run_dir, "metrics.jsonl")
        row.update(wall_s=wall, cpu_s=cpu, metrics_file=metrics_file)
        if method.kind != "sft":
            row.update(training_summary(metrics_file, window))
            records = read_metrics_jsonl(metrics_file)
        row["eval"] = evaluate_model(hf_dir, settings.test_file, os.path.join(run_dir, "eval"), **eval_kw)
        meter.cpu["evaluation"] = meter.cpu.get("evaluation", 0.0) + row["eval"].get("cpu_s", 0.0)
    except (RuntimeError, OSError, KeyError, ValueError) as exc:
        row["error"] = str(exc)
    return row, records


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        names = parse_methods(args.methods)
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        build_parser().error(str(exc))
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = child_env()
    meter = Meter(env, args.run_timeout, reuse=args.reuse)
    t_all = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[reproduce_tiny {time.perf_counter() - t_all:6.0f}s] {msg}", flush=True)

    model_dir, train_file, test_file, warm_file = prepare_task(args, out)
    say(f"task: level {args.level} '{args.ops}', {args.n_train} train / {args.n_test} held-out problems in {out}/data")
    start_model, start_label = model_dir, "Random model"
    if args.warm_steps > 0:
        start_model = warm_start(model_dir, warm_file, args.warm_steps, os.path.join(out, "warm_start"), meter)
        start_label = f"Start model ({args.warm_steps} warm SFT steps)"
        say(f"warm start: {args.warm_steps} SFT steps on {args.n_warm} disjoint problems ({meter.cpu['warm_start']:.0f} CPU s)")

    eval_kw = dict(max_tokens=args.response_length, env=env, rollout=args.rollout, timeout_s=args.run_timeout,
                   reuse=args.reuse)
    probe = probe_on_policy_success(start_model, train_file, os.path.join(out, "start_model", "eval"), n=args.n,
                                    rows=args.probe_rows, **eval_kw)
    say(f"start model: {probe['correct']} correct of {probe['samples']} samples on training prompts (T=1.0): "
        f"pass rate {probe['accuracy']:.3f}")
    start_row = {"name": "start", "label": start_label, "wall_s": None, "train_reward": probe["accuracy"],
                 "eval": evaluate_model(start_model, test_file, os.path.join(out, "start_model", "eval"),
                                        eval_samples=args.eval_samples, **eval_kw)}
    meter.cpu["start_model"] = probe["cpu_s"] + start_row["eval"]["cpu_s"]  # the probe and its held-out score count too

    rows: list[dict] = []
    by_label: dict[str, list[dict]] = {}
    curves: dict[str, list[dict]] = {}
    first_seed_runs: dict = {}
    for seed in seeds:
        settings = RunSettings(model_dir=start_model, train_file=train_file, test_file=test_file, steps=args.steps,
                               batch_size=args.batch_size, n=args.n, response_length=args.response_length,
                               max_prompt_length=args.max_prompt_length, lr=args.lr, rollout=args.rollout,
                               ranks=args.ranks, seed=seed, val_every=args.val_every, mini_batches=args.mini_batches)
        seed_dir = os.path.join(out, f"seed{seed}")
        sft_stage: dict = {}
        if needs_sft(names):
            say(f"seed {seed}: SFT {args.steps} steps")
            try:
                sft_stage["model"], sft_stage["wall"], sft_stage["cpu"] = train_sft(settings, os.path.join(seed_dir, "sft"), meter)
            except RuntimeError as exc:
                sft_stage["error"] = str(exc)
                say(f"seed {seed}: SFT failed: {exc}")
        for name in names:
            if METHODS[name].kind != "sft":
                say(f"seed {seed}: {name}: RL {args.steps} steps")
            row, records = run_method(name, settings, seed_dir, meter, sft_stage,
                                      dict(eval_kw, eval_samples=args.eval_samples), args.window)
            rows.append(row)
            by_label.setdefault(row["label"], []).append(row)
            if records is not None:
                curves.setdefault(row["label"], []).append(records)
                if seed == seeds[0]:
                    first_seed_runs[row["label"]] = records
            if row.get("error"):
                say(f"seed {seed}: {name}: FAILED: {row['error']}")
            else:
                s = row.get("summary") or {}
                change = s.get("reward_change")
                say(f"seed {seed}: {name}: {row['cpu_s']:.0f} CPU s, {row['wall_s']:.0f} s wall; held-out greedy "
                    f"{row['eval']['greedy']['accuracy']:.3f}" + (f"; on-policy reward change {change:+.3f}"
                                                                 if change is not None else ""))

    plots = plot_seed_curves(curves, os.path.join(out, "plots"), smooth=args.smooth) if curves else []
    if first_seed_runs:
        plots += plot_dynamics(first_seed_runs, os.path.join(out, "plots", f"seed{seeds[0]}"), smooth=args.smooth)
    settings_record = {**{k: v for k, v in vars(args).items() if k != "out"}, "out": out, "methods": names,
                       "seeds": seeds, "mini_batch_size": settings.mini_batch_size,
                       "sft_micro_batch_size": settings.sft_micro_batch_size,
                       "seed_use": "tiny model / task: --seed; per run seed s: RL data.seed=47+s, trainer.seed=1+s, "
                                   "rollout.seed=s; SFT trainer.seed=47+s",
                       "warm_start_recipe": WARM_SFT}
    cpu = {k: round(v, 1) for k, v in meter.cpu.items()}
    cpu["total"] = round(sum(meter.cpu.values()), 1)
    md_path = write_report(out, start_row, rows, by_label, probe, plots, settings_record, cpu, meter.cpu_source, args)
    say(f"done in {time.perf_counter() - t_all:.0f} s wall; CPU s: {cpu}")
    print(aggregate_table(by_label))
    print(f"results: {md_path}")
    for path in plots:
        print(f"plot: {path}")
    return 1 if any(r.get("error") for r in rows) else 0


def write_report(out, start_row, rows, by_label, probe, plots, settings, cpu, cpu_source, args) -> str:
    """``results.md`` (summary table over seeds, per-run table, start model, settings) and ``results.json``."""

    md = ["# Tiny reproduction of LUFFY's comparison (CPU)", "",
          f"Every method starts from the same model ({start_row['label']}) and trains on the same synthetic task for "
          f"{args.steps} steps with the same batch, learning rate, data and seeds ({', '.join(map(str, settings['seeds']))}); "
          "`exp_scripts/reproduce_tiny.py`. Cells: mean ± sample std [min, max] over seeds.", "",
          aggregate_table(by_label), "",
          f"On-policy reward = mean score of the samples the policy generated itself, over the first / last "
          f"{args.window} steps; held-out val = in-training validation (every {args.val_every} steps, T=val_temperature); "
          "held-out pass@1 = the final model with `eval_scripts/generate_vllm.py`, greedy. CPU s = all processes of "
          f"a training run (source: {cpu_source}); SFT has no on-policy samples.", "",
          "## Start model", "",
          f"On-policy success on training prompts: {probe['correct']} correct of {probe['samples']} samples "
          f"({probe['rows']} prompts x {probe['n']}, T={probe['temperature']}), pass rate {probe['accuracy']:.3f}; "
          f"held-out greedy pass@1 {start_row['eval']['greedy']['accuracy']:.3f}.", "",
          "## CPU seconds", "", "```", json.dumps(cpu, indent=1), "```", "",
          "## Every run", "", markdown_table([start_row] + [dict(r, label=f"{r['label']} (seed {r['seed']})") for r in rows]),
          "", "## Settings", "", "```", json.dumps(settings, indent=1, default=str), "```", "", "## Files", ""]
    md += [f"- plot: `{p}`" for p in plots]
    path = os.path.join(out, "results.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"settings": settings, "probe": probe, "start": start_row, "methods": rows, "cpu_s": cpu,
                   "plots": list(plots)}, f, indent=1, default=str)
    return path


if __name__ == "__main__":
    sys.exit(main())
