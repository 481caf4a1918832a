"""Step-time benchmark: our trainer vs TRL's GRPOTrainer vs a minimal single-process loop, on this CPU.

Same tiny model (built by ``luffy_pool.tiny`` and SFT-warmed so it can stop by itself), same work per
step (8 prompts x 8 samples, up to 64 new tokens, one optimizer update), same grader. Each contender
runs sequentially in its own subprocess (threads, Ray and imports cannot interfere; ``--jobs 2`` overlaps
them, for a smoke run of the plumbing only): ours through Ray
+ FSDP2 + the chosen rollout at each ``--ranks`` value, TRL and the floor at each ``--baseline-threads``
value; both the fixed-length case (every completion exactly 64 tokens) and the natural-stop case.
Prints median seconds/step after warm-up, tokens/s, foreign CPU load, our phase breakdown and verl's
``perf/throughput``; the last line is ``ours/TRL=<x.xx> ours/floor=<y.yy>`` for the fixed-length
case, using our best rank count against TRL's and the floor's best thread count. Results and logs go
to ``--out`` (default outputs/bench_step/).

    .venv/bin/pip install -r requirements-bench.txt      # TRL, for this benchmark only
    .venv/bin/python exp_scripts/bench_step.py [--rollout hf,vllm] [--warmup 2 --steps 8] [--wait-quiet 120]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from bench.common import CASES, CONTENDERS, BenchSpec  # noqa: E402
from bench.report import print_report  # noqa: E402

BASE_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "WANDB_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _choice_list(choices):
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{bad or text!r}: choose from {','.join(choices)}")
        return values

    return parse


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rollout",
        type=_choice_list(("vllm", "hf")),
        default=["hf", "vllm"],
        help="our rollout engine(s), comma-separated (default hf,vllm: the HF engine with the lean "
        "static-KV loop, and vLLM's CPU build)",
    )
    p.add_argument(
        "--rollout-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="weights dtype of our rollout engine (default float32, as TRL and the floor run)",
    )
    p.add_argument("--ranks", type=_int_list, default=[2, 1], help="FSDP rank counts of ours (default 2,1)")
    p.add_argument(
        "--baseline-threads",
        type=_int_list,
        default=[2, 1],
        help="torch threads of TRL and the floor, one run each (default 2,1; 2 = torch's default here)",
    )
    p.add_argument("--contenders", type=_choice_list(CONTENDERS), default=list(CONTENDERS))
    p.add_argument("--cases", type=_choice_list(CASES), default=list(CASES))
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per contender (>= 1)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per contender")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every contender this many times, one round after another; the headline is the median "
        "of the rounds' ratios (the machine's speed drifts between runs minutes apart)",
    )
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-6, help="small, so the policy (and lengths) barely move")
    p.add_argument(
        "--sft-steps",
        type=int,
        default=20,
        help="SFT steps of the natural case's model (20: completions of ~20-30 tokens, a few run to the cap)",
    )
    p.add_argument(
        "--ours-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra override for our trainer (repeatable; e.g. to try an optimisation)",
    )
    p.add_argument("--reward-workers", type=int, default=1, help="grader processes of ours")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        help="before each contender, wait up to this many seconds for the machine to go quiet",
    )
    p.add_argument("--quiet-threshold", type=float, default=0.5, help="busy cores counted as quiet")
    p.add_argument("--child-timeout", type=float, default=1800.0)
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="contender runs at once (default 1). More is for smoke runs that check the plumbing: "
        "overlapping runs share the cores, so their timings are not comparable",
    )
    p.add_argument("--out", default=os.path.join(REPO, "outputs", "bench_step"))
    p.add_argument("--child", choices=("prepare",) + CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.warmup < 1:
        p.error("--warmup must be >= 1: a step's time runs from the previous step's end")
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    if "trl" in args.contenders and args.child is None:
        try:
            import trl  # noqa: F401
        except ImportError:
            p.error(
                "the TRL contender needs trl: .venv/bin/pip install -r requirements-bench.txt "
                "(or leave it out with --contenders ours,floor)"
            )
    return args


def child_main(args: argparse.Namespace) -> None:
    """Run one role in this process (the orchestrator starts every role as its own subprocess)."""
    if args.child == "prepare":
        from bench.prepare import prepare

        spec = json.loads(open(args.spec).read())
        prepare(result_path=args.result, **spec)
        return
    spec = BenchSpec.from_json(open(args.spec).read())
    if args.child == "ours":
        from bench.ours import run
    elif args.child == "trl":
        from bench.trl_contender import run
    else:
        from bench.floor import run
    run(spec, args.result)


def child_env(contender: str, threads: int) -> dict:
    env = dict(os.environ, **BASE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    # Ours: 1 thread in the driver; Ray gives each worker OMP_NUM_THREADS=1 (launcher.WORKER_ENV).
    n = "1" if contender == "ours" else str(threads)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = n
    return env


def run_child(
    role: str, spec_text: str, tag: str, out_dir: str, work_dir: str, threads: int, timeout: float
) -> tuple[dict | None, str]:
    """Start ``bench_step.py --child role``; returns (result JSON or None, log path)."""
    spec_path = os.path.join(work_dir, f"{tag}.spec.json")
    result_path = os.path.join(work_dir, f"{tag}.result.json")
    log_path = os.path.join(out_dir, "logs", f"{tag}.log")
    with open(spec_path, "w") as f:
        f.write(spec_text)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", role, "--spec", spec_path, "--result", result_path]
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                cmd, cwd=REPO, env=child_env(role, threads), stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            )
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0 or not os.path.exists(result_path):
        with open(log_path) as f:
            tail = f.read()[-3000:]
        print(f"!! {tag} failed (exit {rc}); log {log_path}; last lines:\n{tail}", flush=True)
        return None, log_path
    with open(result_path) as f:
        return json.load(f), log_path


def contender_plan(args) -> list[tuple[str, int, int]]:
    """``(contender, ranks, threads, rollout engine or None)`` of every run per case, in run order."""
    plan = []
    if "ours" in args.contenders:
        plan += [("ours", r, 1, engine) for engine in args.rollout for r in args.ranks]
    for name in ("trl", "floor"):
        if name in args.contenders:
            plan += [(name, 1, t, None) for t in args.baseline_threads]
    return plan


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    from bench.cpu_load import wait_for_quiet

    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="bench_step_")
    t_start = time.perf_counter()
    print(
        f"bench_step: work dir {work_dir}, results {args.out}; rollout of ours: {','.join(args.rollout)}; "
        f"{args.prompts} prompts x {args.samples} samples, <= {args.max_new_tokens} new tokens, "
        f"{args.warmup} warm-up + {args.steps} timed steps per contender"
        + (f"; extra overrides of ours: {' '.join(args.ours_override)}" if args.ours_override else ""),
        flush=True,
    )
    prep_spec = {
        "work_dir": work_dir,
        "sft_steps": args.sft_steps,
        "prompts": args.prompts,
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
    }
    prep, _ = run_child("prepare", json.dumps(prep_spec), "prepare", args.out, work_dir, 1, args.child_timeout)
    if prep is None:
        return 1
    lengths = prep["natural_lengths"]
    print(
        f"models: fixed case = random tiny Qwen2 (left alone, it stops early in {lengths['fixed']['natural_stop_rate']:.0%} "
        f"of rows, mean {lengths['fixed']['natural_mean_len']:.1f} tokens); natural case = the same model SFT-warmed "
        f"{prep['sft_steps']} steps (loss {prep['sft_loss_first']:.2f} -> {prep['sft_loss_last']:.2f}; completions "
        f"mean {lengths['natural']['natural_mean_len']:.1f} tokens, max {lengths['natural']['natural_max_len']}, "
        f"stop rate {lengths['natural']['natural_stop_rate']:.0%}); prompts <= {prep['max_prompt_tokens']} tokens",
        flush=True,
    )
    tasks = []
    for round_index, case in ((k, c) for k in range(args.rounds) for c in args.cases):
        for contender, ranks, threads, engine in contender_plan(args):
            spec = BenchSpec(
                contender=contender,
                case=case,
                model_dir=prep["model_dirs"][case],
                task_dir=prep["task_dir"],
                work_dir=work_dir,
                prompts=args.prompts,
                samples=args.samples,
                max_new_tokens=args.max_new_tokens,
                max_prompt_length=prep["max_prompt_tokens"],
                warmup=args.warmup,
                steps=args.steps,
                lr=args.lr,
                threads=threads,
                ranks=ranks,
                rollout=engine or args.rollout[0],
                rollout_dtype=args.rollout_dtype,
                reward_workers=args.reward_workers,
                ours_overrides=args.ours_override,
            )
            tag = f"{case}_{spec.label}".replace("[", "_").replace("]", "").replace(",", "_")
            if args.rounds > 1:
                tag += f"_round{round_index + 1}"
            tasks.append((round_index, case, contender, threads, spec, tag))

    def run_task(task) -> dict:
        round_index, case, contender, threads, spec, tag = task
        if args.jobs > 1:  # the other runs keep the machine busy: nothing to wait for or to report
            waited, busy = 0.0, float("nan")
        else:
            waited, busy = (
                wait_for_quiet(args.wait_quiet, args.quiet_threshold) if args.wait_quiet > 0 else wait_for_quiet(0.0)
            )
        print(
            f"-> {case} {spec.label}"
            + (f" round {round_index + 1}/{args.rounds}" if args.rounds > 1 else "")
            + f": machine busy {busy:.2f} cores before start (waited {waited:.0f} s)",
            flush=True,
        )
        t0 = time.perf_counter()
        result, log_path = run_child(contender, spec.to_json(), tag, args.out, work_dir, threads, args.child_timeout)
        return {
            "case": case,
            "contender": contender,
            "label": spec.label,
            "round": round_index,
            "busy_before": busy,
            "threads_env": child_env(contender, threads)["OMP_NUM_THREADS"],
            "log": log_path,
            "result": result,
            "child_wall_s": time.perf_counter() - t0,
        }

    if args.jobs > 1:
        print(f"--jobs {args.jobs}: contender runs overlap; their timings are not comparable (a smoke run)", flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            runs = list(pool.map(run_task, tasks))  # in plan order
    else:
        runs = [run_task(task) for task in tasks]
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(
            {
                "args": {k: v for k, v in vars(args).items() if not k.startswith("child")},
                "prepare": prep,
                "runs": runs,
                "total_s": time.perf_counter() - t_start,
            },
            f,
            indent=1,
        )
    print(f"(total {time.perf_counter() - t_start:.0f} s; raw results in {os.path.join(args.out, 'results.json')})")
    ok = print_report(runs, args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
