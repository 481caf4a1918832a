"""Benchmark: graded responses/s of the reward process pool vs a single process.

Builds MATH-500-style responses from the ``math`` rows of valid.parquet (the real ground truths):
correct boxed answers, equivalent forms (decimal for fractions, reordered sums, ``x =`` prefixes,
``\\dfrac``), near misses (off-by-one, sign flips, wrong fraction) and responses with no box, each
inside a ``<think>...</think>`` reasoning block with some filler text. Then grades them with the
trainer's scorer (LUFFY's version 3 by default) inline in one process and through ``ScoringPool``.

    .venv/bin/python exp_scripts/bench_reward.py --n 2000 --workers 2 [--grader rule] [--version 3]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time

DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "data", "benchmarks", "valid.parquet")

FILLER = (
    "We set up the problem carefully, check the constraints, and simplify step by step. "
    "Substituting back confirms the intermediate values. "
) * 6


def _variants(gt: str, rng: random.Random) -> list[tuple[str, str]]:
    """(kind, boxed answer) candidates for one ground truth."""
    out = [("correct", gt)]
    m = re.fullmatch(r"\\frac\{(\d+)\}\{(\d+)\}", gt)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        out += [
            ("equivalent", f"{a}/{b}"),
            ("equivalent", f"\\dfrac{{{a}}}{{{b}}}"),
            ("near_miss", f"\\frac{{{a + 1}}}{{{b}}}"),
        ]
    if re.fullmatch(r"-?\d+", gt):
        n = int(gt)
        out += [
            ("equivalent", f"{n}.0"),
            ("equivalent", f"x = {n}"),
            ("near_miss", str(n + rng.choice([-1, 1]))),
            ("near_miss", str(-n) if n else "1"),
        ]
    if "+" in gt and "=" not in gt and "," not in gt:
        left, _, right = gt.partition("+")
        if left.strip() and right.strip():
            out.append(("equivalent", f"{right.strip()} + {left.strip()}"))
    out.append(("near_miss", gt + "+1"))
    return out


def build_responses(parquet: str, n: int, seed: int = 0) -> list[tuple[str, str, str, None]]:
    import pandas as pd

    df = pd.read_parquet(parquet)
    math_rows = df[df["data_source"] == "math"]
    if math_rows.empty:
        raise ValueError(f"{parquet}: no rows with data_source == 'math'")
    gts = [r["ground_truth"] for r in math_rows["reward_model"]]
    rng = random.Random(seed)
    items = []
    while len(items) < n:
        gt = rng.choice(gts)
        kind, answer = rng.choice(_variants(gt, rng))
        if rng.random() < 0.05:
            solution = f"The result is {answer}."  # no box
        else:
            solution = f"Therefore the answer is $\\boxed{{{answer}}}$."
        response = f"{FILLER}\n</think>\n\n{solution}<|im_end|>"
        items.append(("math", response, gt, None))
    return items


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a live process from /proc (Linux); NaN elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--version", type=int, default=3, help="data.reward_impl_version")
    parser.add_argument("--grader", default="math_verify", choices=["math_verify", "rule", "any"])
    parser.add_argument("--start-method", default="forkserver")
    args = parser.parse_args()

    from deepscaler.rewards import ScorerSpec
    from verl.workers.reward_manager import ScoringPool

    items = build_responses(args.data, args.n)
    spec = ScorerSpec(args.version, args.grader)
    print(
        f"{len(items)} responses, reward_impl_version={args.version}, grader={args.grader}, "
        f"os.cpu_count()={os.cpu_count()}, load average={os.getloadavg()[0]:.2f}"
    )

    with ScoringPool(spec, num_workers=0) as single:
        spec.warm_up()
        t0, c0 = time.perf_counter(), time.process_time()
        single_results, single_stats = single.score(items)
        single_s, single_cpu = time.perf_counter() - t0, time.process_time() - c0

    with ScoringPool(spec, num_workers=args.workers, timeout_s=args.timeout_s, start_method=args.start_method) as pool:
        pool.wait_ready()
        pids = pool.worker_pids()
        worker_cpu0 = sum(cpu_seconds(p) for p in pids)
        t0, c0 = time.perf_counter(), time.process_time()
        pool_results, pool_stats = pool.score(items)
        pool_s = time.perf_counter() - t0
        parent_cpu = time.process_time() - c0
        pool_cpu = sum(cpu_seconds(p) for p in pids) - worker_cpu0 + parent_cpu

    agree = sum(a.score == b.score for a, b in zip(single_results, pool_results))
    mean = sum(r.score for r in single_results) / len(items)
    print(f"single process : {len(items) / single_s:8.1f} responses/s ({single_s:.2f} s)")
    print(
        f"pool ({args.workers} workers): {len(items) / pool_s:8.1f} responses/s ({pool_s:.2f} s), "
        f"timeouts={pool_stats.timeout_count}, errors={pool_stats.error_count}"
    )
    print(f"speed-up       : {single_s / pool_s:8.2f}x")
    # CPU time per response is immune to other tenants' load: it shows the pool's overhead, and
    # workers x (single CPU / pool CPU) is the speed-up an otherwise idle machine would give.
    print(
        f"CPU ms/response: single {1000 * single_cpu / len(items):.2f}, pool {1000 * pool_cpu / len(items):.2f} "
        f"(parent {1000 * parent_cpu / len(items):.2f}); idle-machine bound "
        f"{args.workers * single_cpu / pool_cpu:.2f}x"
    )
    print(
        f"mean score {mean:.3f}; single/pool agree on {agree}/{len(items)}; "
        f"parse failures {single_stats.parse_fail_count}"
    )


if __name__ == "__main__":
    main()
