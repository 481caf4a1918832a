"""One-step-off-policy on split ranks against split sync and colocated sync.

Three ways of running the same tiny LUFFY run (``tiny_cpu_luffy``: the tiny Qwen2 on the synthetic arithmetic task,
HF rollout, CPU ranks as Ray actors), each ``--warmup`` + ``--steps`` training steps per seed:

- ``colocated``: 2 ranks that both generate and train (the hybrid engine, LUFFY's loop);
- ``split_sync``: 1 rollout rank + 1 training rank (``actor_rollout_ref.hybrid_engine=False``), no overlap;
- ``one_step_off``: the same split, batch N+1 generated while the actor trains on batch N.

Per mode it prints the mean step time over the steps after the warm-up (``timing_s/step``, per seed and the seeds'
mean), its per-phase seconds (the driver's wait for its batch, the engine's generation, the actor's update, the
weight push, the reward) and the on-policy reward (``batch/on_solved``: success rate of the on-policy rows) over the
last 10 steps; the last line is ``one_step_off/split_sync = R1; one_step_off/colocated = R2`` (ratios of mean step
times). The split pair isolates what the pipeline buys; against colocated, ranks that each do both jobs leave little to
overlap on a 2-core machine.

Usage: python exp_scripts/bench_async.py [--steps 30] [--warmup 2] [--seeds 3] [--model DIR] [--data DIR]
         [--work DIR] [--modes colocated,split_sync,one_step_off] [key=value ...]
``--model`` / ``--data`` default to the quickstart's SFT-warmed model (outputs/quickstart/warm_sft_250/final) and its
task (outputs/quickstart/data); when missing they are built as exp_scripts/quickstart.sh builds them (its inputs
only: ``QUICKSTART_PREPARE_ONLY=1``, ~1 CPU-min). A random model solves nothing, so its reward curves stay at 0 and
the lag's effect on learning is not measured: a run whose on-policy reward never leaves 0 in any mode exits 1.
Trailing key=value pairs are appended to every run (e.g. data.train_batch_size=4 for a quick check).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODES = {
    "colocated": ["trainer.n_gpus_per_node=2"],
    "split_sync": [
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "trainer.rollout_pipeline=sync",
    ],
    "one_step_off": [
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "trainer.rollout_pipeline=one_step_off",
    ],
}
REWARD_KEY = "batch/on_solved"
REWARD_WINDOW = 10
# Per-phase seconds printed per mode (means over the timed steps): the driver's wait for its batch, the engine's
# generation, the actor's update, the weight push and the driver's reward.
PHASES = (
    "timing_s/gen",
    "timing_s/generate_worker",
    "timing_s/update_actor",
    "timing_s/weight_sync",
    "timing_s/reward",
)


QUICKSTART_DIR = os.path.join(ROOT, "outputs", "quickstart")
WARM_MODEL = os.path.join(QUICKSTART_DIR, "warm_sft_250", "final")  # quickstart.sh's default QUICKSTART_WARM_STEPS


def inputs(args) -> tuple[str, str]:
    """The model and task folders: given, or the quickstart's SFT-warmed model and task (built when missing)."""
    model = args.model or WARM_MODEL
    data = args.data or os.path.join(QUICKSTART_DIR, "data")
    if not args.model and not args.data and not _ready(model, data):
        print(
            f"[bench_async] building the quickstart's SFT-warmed model into {model} "
            "(exp_scripts/quickstart.sh, QUICKSTART_PREPARE_ONLY=1)",
            flush=True,
        )
        env = dict(
            os.environ,
            QUICKSTART_PREPARE_ONLY="1",
            QUICKSTART_DIR=QUICKSTART_DIR,
            QUICKSTART_WARM_STEPS="250",
            SKIP_SETUP="1",
            LUFFY_VENV=os.path.dirname(os.path.dirname(sys.executable)),
        )
        subprocess.run(["bash", os.path.join(ROOT, "exp_scripts", "quickstart.sh")], cwd=ROOT, env=env, check=True)
    if not _ready(model, data):
        raise SystemExit(f"[bench_async] no model in {model} (config.json) or no task in {data} (train.parquet)")
    return model, data


def _ready(model: str, data: str) -> bool:
    return os.path.isfile(os.path.join(model, "config.json")) and os.path.isfile(os.path.join(data, "train.parquet"))


def never_rewarded(results: dict) -> bool:
    """True when no mode's on-policy reward left 0 at any step of any seed: the model solves nothing."""
    return all(v == 0.0 for r in results.values() for curve in r["curves"] for v in curve)


def run_mode(mode: str, seed: int, args, model: str, data: str) -> list[dict]:
    """One training run; returns its per-step metric rows (metrics.jsonl)."""
    out = os.path.join(args.work, f"{mode}_seed{seed}")
    os.makedirs(out, exist_ok=True)
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    overrides = (
        [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={data}/train.parquet",
            f"data.val_files={data}/test.parquet",
            f"trainer.total_training_steps={args.warmup + args.steps}",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.resume_mode=disable",
            "trainer.logger=['jsonl']",
            f"trainer.default_local_dir={out}",
            f"hydra.run.dir={out}/hydra",
            "+trainer.val_before_train=False",
            f"trainer.seed={seed}",
            f"data.seed={seed}",
            f"actor_rollout_ref.rollout.seed={seed}",
        ]
        + MODES[mode]
        + list(args.overrides)
    )
    cmd = [sys.executable, "-m", "luffy_pool.main_mix_ppo", "--config-name", "tiny_cpu_luffy"] + overrides
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
        WANDB_MODE="offline",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    env.pop("RAY_ADDRESS", None)  # each run starts its own local Ray: the modes do not share workers
    t0 = time.perf_counter()
    with open(os.path.join(out, "console.log"), "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"[bench_async] {mode} seed {seed} failed (rc {proc.returncode}); see {out}/console.log")
    rows = [json.loads(line) for line in open(metrics)]
    print(f"[bench_async] {mode} seed {seed}: {len(rows)} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    return rows


def summarise(rows: list[dict], warmup: int) -> tuple[float, float, list[float], dict]:
    """(mean step seconds after the warm-up, on-policy reward over the last 10 steps, the reward curve, the
    per-phase mean seconds after the warm-up)."""
    timed_rows = [r for r in rows if r["step"] > warmup]
    curve = [float(r[REWARD_KEY]) for r in rows]
    phases = {k: statistics.fmean(r.get(k, 0.0) for r in timed_rows) for k in PHASES}
    return (
        statistics.fmean(r["timing_s/step"] for r in timed_rows),
        statistics.fmean(curve[-REWARD_WINDOW:]),
        curve,
        phases,
    )


def _spread(values: list[float]) -> str:
    return f"{statistics.fmean(values):.4g}" + (f" ± {statistics.stdev(values):.2g}" if len(values) > 1 else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run, after the warm-up")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps (engine start, first push)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 1..N per mode")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--model", default=None)
    ap.add_argument("--data", default=None)
    ap.add_argument("--work", default=os.path.join(ROOT, "outputs", "bench_async"))
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds per run")
    ap.add_argument("overrides", nargs="*", help="key=value appended to every run")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        ap.error(f"--modes: unknown {unknown}; valid: {', '.join(MODES)}")
    os.makedirs(args.work, exist_ok=True)
    model, data = inputs(args)
    results: dict[str, dict[str, list]] = {m: {"step_s": [], "reward": [], "curves": [], "phases": []} for m in modes}
    for seed in range(1, args.seeds + 1):  # seeds outermost: a drift in the machine's load hits every mode alike
        for mode in modes:
            step_s, reward, curve, phases = summarise(run_mode(mode, seed, args, model, data), args.warmup)
            results[mode]["step_s"].append(step_s)
            results[mode]["reward"].append(reward)
            results[mode]["curves"].append(curve)
            results[mode]["phases"].append(phases)
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    for mode in modes:
        r = results[mode]
        print(
            f"{mode}: step {_spread(r['step_s'])} s over {args.steps} steps x {args.seeds} seed(s); "
            f"{REWARD_KEY} last {REWARD_WINDOW} steps {_spread(r['reward'])}"
        )
        print(
            "  phases, s per step: "
            + ", ".join(f"{k.split('/', 1)[1]} {statistics.fmean(p[k] for p in r['phases']):.3f}" for k in PHASES)
        )
        for seed, curve in enumerate(r["curves"], start=1):
            print(f"  seed {seed} {REWARD_KEY} curve: " + " ".join(f"{v:.2f}" for v in curve))
    mean = {m: statistics.fmean(results[m]["step_s"]) for m in modes}
    if {"one_step_off", "split_sync", "colocated"} <= set(modes):
        print(
            f"one_step_off/split_sync = {mean['one_step_off'] / mean['split_sync']:.3f}; "
            f"one_step_off/colocated = {mean['one_step_off'] / mean['colocated']:.3f}"
        )
    if never_rewarded(results):
        print(
            f"[bench_async] {REWARD_KEY} is 0 at every step of every mode: the model ({model}) solves nothing, so "
            "these runs measure speed only, not the lag's effect on learning. Use a model that solves some "
            "problems (the quickstart's SFT-warmed one: omit --model).",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
