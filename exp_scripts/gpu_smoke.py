"""Smoke check of the GPU path on one device, in minutes: the first thing to run on a new GPU machine.

Builds a random-init model with Qwen2.5-1.5B's shapes (``--small``: a tiny one) and the synthetic task,
then runs LUFFY training steps through the real worker (``MIXActorRolloutRefWorker``: FSDP2 over a
1-rank NCCL group, gradient checkpointing, bf16 compute, the shared-prompt forward) and the real trainer
step (``MIXRayPPOTrainer.train_step``: rollout with one full off-policy trace per group, reward,
old log-probs, mixed advantage, update) with each rollout engine: the HF engine, then vLLM when it is
installed. Ray is not needed: the trainer talks to the worker in this process. Asserts that the
weights changed, that the engine's weights equal the actor's after the sync, that the sync travels in
the parameter dtype, and that a CUDA run really uses NCCL and the GPU; prints peak memory, tokens/s and
the sync time, and a last line ``GPU_SMOKE {json}``. Exit code 0 = all checks passed. Two numeric checks run
inside the steps (exp_scripts/gpu_smoke_checks.py): packed (remove padding, and the chunked scoring head) vs padded
log-probs on one micro-batch, and the engine-vs-actor gap right after each weight push (mean log-prob difference
and k3 KL over the engine's sampled tokens: ~1e-3 in bf16, O(1) after a broken push). ``--split`` adds a run on
split engines (hybrid_engine=False, one_step_off) through the launcher and Ray: 1 actor + 1 engine rank (2 GPUs,
or CPU processes). Each check prints a PASS/FAIL line, then a summary line.

    python exp_scripts/gpu_smoke.py                       # one GPU (< 7 min on an H200)
    python exp_scripts/gpu_smoke.py --device cpu --small  # CI (tests/exp_scripts/test_gpu_smoke.py)
    python exp_scripts/gpu_smoke.py --device cpu --small --rollout hf --split off  # the numeric checks, ~20 s
    python exp_scripts/gpu_smoke.py --recipe exp_scripts/train.sh  # the recipe's switches on one GPU

``--recipe SCRIPT`` reads a launch script through its own command line (luffy_pool/run/recipe.py, shared with
the CPU rehearsal) and runs its switches at these shapes: gradient checkpointing, remove padding, dynamic
batch sizes with its token budgets (scaled by its prompt length over this run's), the reference with its
offload setting (the reference is switched on to exercise it: LUFFY's train.sh offloads a reference that
use_ref=False leaves unused), its parameter dtype (bf16 on cuda), its log-prob chunk and its engine (vLLM) with the recipe's rollout keys
(gpu_memory_utilization, enforce_eager, sleep_level, free_cache_engine, prefix caching; max_num_batched_tokens and
max_num_seqs scaled), checked against the built engine's own config. SP and TP need more than one rank (this smoke
is one process): when the machine has the GPUs for the recipe's SP x TP (sp_tp_ranks), the recipe then runs 2 steps
through ``exp_scripts/rehearse.sh --device cuda`` on that many GPUs (NCCL, its SP and vLLM TP groups, the weight
sync between them; tiny model and lengths); with fewer GPUs that is printed and skipped.

The parts live beside this file: the run's set-up (gpu_smoke_setup.py), one run per engine and its checks
(gpu_smoke_engine_run.py), the numeric checks and the split run (gpu_smoke_checks.py), vLLM graphs vs eager
(gpu_smoke_graphs.py) and the SP x TP rehearsal (gpu_smoke_sp_tp.py); this file parses the flags, runs them and
prints the verdicts.

Needs torch, transformers, tensordict, omegaconf, hydra-core (+ vllm for the vLLM part).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from exp_scripts.gpu_smoke_engine_run import run_engine  # noqa: E402
from exp_scripts.gpu_smoke_graphs import graphs_vs_eager  # noqa: E402
from exp_scripts.gpu_smoke_setup import build_model, compose, overrides, single_rank_env  # noqa: E402
from exp_scripts.gpu_smoke_sp_tp import run_sp_tp  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--small", action="store_true", help="tiny shapes and lengths (CI on CPU)")
    p.add_argument(
        "--rollout",
        choices=("auto", "hf", "vllm"),
        default="auto",
        help="auto: the HF engine, then vLLM when importable",
    )
    p.add_argument("--steps", type=int, default=2, help="LUFFY steps per engine")
    p.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    p.add_argument("--recipe", default=None, help="a launch script (exp_scripts/train.sh): run its switches")
    p.add_argument(
        "--split",
        choices=("auto", "on", "off"),
        default="auto",
        help="a run on split engines through Ray; auto: where 1 actor + 1 engine rank fit (CPU, 2 GPUs), "
        "not with --recipe",
    )
    return p.parse_args(argv)


def engines(choice: str) -> list:
    if choice != "auto":
        return [choice]
    try:
        import vllm  # noqa: F401
    except ImportError:
        return ["hf"]
    return ["hf", "vllm"]


def split_run(args, engine: str, model_dir: str, task_dir: str, out_dir: str) -> dict:
    """The split-engine run (``gpu_smoke_checks.run_split``) with engine ``engine``, or {"skipped": why}."""
    import torch

    from exp_scripts.gpu_smoke_checks import SPLIT_OVERRIDES, run_split, split_skip_reason

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    why = split_skip_reason(args.split, args.device, gpus, args.recipe)
    if why is not None:
        print(f"[gpu_smoke] split engines skipped: {why}", flush=True)
        return {"skipped": why}
    base = overrides(model_dir, task_dir, out_dir, args.device, args.small, engine, args.steps)
    config = compose(base + SPLIT_OVERRIDES)
    result = run_split(config, "bfloat16" if args.device == "cuda" else "float32")
    return dict(result, engine=engine)


def print_verdicts(results: list, graphs, sp_tp, split: dict) -> None:
    """One ``PASS``/``FAIL`` line per check, then one summary line."""
    lines = []
    for r in results:
        lines += [(f"{r['engine']}/{k}", v, r.get("details", {}).get(k, "")) for k, v in r["checks"].items()]
    if graphs is not None:
        lines.append(("vllm/graphs_sleep_reload", graphs["ok"], graphs.get("skipped") or graphs.get("error", "")))
    if sp_tp is not None and "skipped" not in sp_tp:
        lines.append(("sp_tp_rehearsal", sp_tp["rc"] == 0 and sp_tp["steps"] == [1, 2], json.dumps(sp_tp)))
    if "skipped" not in split:
        lines += [(f"split/{split['engine']}/{k}", v, split["details"].get(k, "")) for k, v in split["checks"].items()]
    for name, ok, detail in lines:
        print(f"[gpu_smoke] {'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
    failed = [name for name, ok, _ in lines if not ok]
    skipped = ["split"] if "skipped" in split else []
    skipped += ["sp_tp_rehearsal"] if sp_tp is not None and "skipped" in sp_tp else []
    print(
        f"[gpu_smoke] SUMMARY: {len(lines) - len(failed)}/{len(lines)} checks passed"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + (f"; skipped: {', '.join(skipped)}" if skipped else ""),
        flush=True,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    single_rank_env()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("[gpu_smoke] --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    t_all = time.perf_counter()
    work = args.out or tempfile.mkdtemp(prefix="gpu_smoke_")
    model_dir = build_model(os.path.join(work, "model"), args.small, args.device)
    from luffy_pool.tiny import write_task_parquets

    task_dir = os.path.join(work, "task")
    write_task_parquets(task_dir, n_train=64, n_test=8, level=2, seed=0)
    print(
        f"[gpu_smoke] model ({'small' if args.small else 'Qwen2.5-1.5B shapes'}) built in "
        f"{time.perf_counter() - t_all:.1f} s at {model_dir}",
        flush=True,
    )
    chosen = engines(args.rollout)
    if args.recipe:
        from luffy_pool.run.recipe import read_recipe

        recipe = read_recipe(args.recipe, dict(os.environ, MODEL_PATH="recipe/model"))
        chosen = [recipe.get("actor_rollout_ref.rollout.name")] if args.rollout == "auto" else chosen
        print(
            f"[gpu_smoke] recipe {args.recipe}: {json.dumps(recipe.switches())}; one device runs SP 1 / TP 1 "
            f"(the recipe's SP {recipe.sp} x TP {recipe.tp}: bash exp_scripts/rehearse.sh {args.recipe})",
            flush=True,
        )
    results = [run_engine(e, args, model_dir, task_dir, os.path.join(work, e)) for e in chosen]
    graphs = graphs_vs_eager(model_dir, args.device) if "vllm" in chosen else None
    sp_tp = None
    if args.recipe and args.device == "cuda":
        sp_tp = run_sp_tp(args.recipe, recipe.sp, recipe.tp, torch.cuda.device_count(), os.path.join(work, "sp_tp"))
    split = split_run(args, chosen[-1], model_dir, task_dir, os.path.join(work, "split"))
    ok = (
        all(all(r["checks"].values()) for r in results)
        and (graphs is None or graphs["ok"])
        and (sp_tp is None or "skipped" in sp_tp or (sp_tp["rc"] == 0 and sp_tp["steps"] == [1, 2]))
        and ("skipped" in split or all(split["checks"].values()))
    )
    summary = {
        "ok": ok,
        "device": args.device,
        "small": args.small,
        "recipe": args.recipe,
        "total_s": round(time.perf_counter() - t_all, 1),
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "results": results,
        "graphs": graphs,
        "sp_tp": sp_tp,
        "split": split,
    }
    print_verdicts(results, graphs, sp_tp, split)
    for r in results:
        failed = [k for k, v in r["checks"].items() if not v]
        if r.get("memory_plan_gb"):
            print(
                f"[gpu_smoke] {r['engine']}: memory plan per phase (GiB) {r['memory_plan_gb']}; "
                f"torch.cuda.max_memory_allocated {r['peak_memory_gb']} GiB",
                flush=True,
            )
        print(
            f"[gpu_smoke] {r['engine']}: peak memory {r['peak_memory_gb']} GB, "
            f"engine tokens/s {[s['engine_tokens_per_s'] for s in r['steps']]}, "
            f"weight sync s {[s['weight_sync_s'] for s in r['steps']]}, "
            f"{'all checks passed' if not failed else 'FAILED: ' + ', '.join(failed)} ({r['engine_check']})",
            flush=True,
        )
    print("GPU_SMOKE " + json.dumps(summary), flush=True)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
