"""Held-out scores of reproduce_tiny.py with 95 % intervals over seeds and problems, and the claims' verdicts.

A method is scored on the same P held-out problems by each of its S seeds. ``x[s][p]`` is seed s's score
on problem p: 0/1 for greedy pass@1, the fraction of k samples correct for avg@k. The estimate is the
mean of x. Its 95 % interval is the normal one, mean ± 1.96·SE, with

    SE² = var(seed means) / S + var(problem means) / P        (sample variances, ddof=1)

i.e. both sources of noise a rerun would redraw: the seeds (training randomness) and the problems (which
500 of the task's problems were drawn). Under a two-way model (seed effect + problem effect + residual)
this counts the residual twice, so the interval is slightly conservative; with one seed the seed term is
0. Scores are clipped to [0, 1]. A difference of two methods is scored the same way on
``d[s][p] = x_a[s][p] − x_b[s][p]``, paired by problem and by seed position (seed i of each method shares
the data order), clipped to [−1, 1]; a claim holds when its interval lies above 0, does not hold when it
lies below 0, and is inconclusive otherwise. ``effect / noise`` is the difference over its SE.
"""

from __future__ import annotations

import json
import math
from typing import Mapping, Optional, Sequence

Z95 = 1.959963984540054  # two-sided 95 % normal quantile
Z80 = 0.8416212335729143  # one-sided 80 % normal quantile (power)


def min_detectable(se: float) -> float:
    """The smallest true difference a two-sided 5 % test with standard error ``se`` detects with 80 % power:
    (1.96 + 0.84)·SE = 2.8·SE."""
    return (Z95 + Z80) * se


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _sample_var(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def interval(x: Sequence[Sequence[float]], low: float = 0.0, high: float = 1.0) -> dict:
    """``{"mean", "lo", "hi", "se", "seeds", "problems"}`` of a seeds x problems score matrix (module docstring)."""
    if not x or not x[0]:
        raise ValueError("interval: need at least one seed and one problem")
    n_problems = len(x[0])
    if any(len(row) != n_problems for row in x):
        raise ValueError("interval: every seed must score the same problems")
    seed_means = [_mean(row) for row in x]
    problem_means = [_mean([row[p] for row in x]) for p in range(n_problems)]
    mean = _mean(seed_means)
    se = math.sqrt(_sample_var(seed_means) / len(x) + _sample_var(problem_means) / n_problems)
    return {
        "mean": mean,
        "lo": max(low, mean - Z95 * se),
        "hi": min(high, mean + Z95 * se),
        "se": se,
        "seeds": len(x),
        "problems": n_problems,
    }


def difference(xa: Sequence[Sequence[float]], xb: Sequence[Sequence[float]]) -> dict:
    """Interval of method a minus method b, paired by seed position and problem; adds ``effect_over_noise``."""
    if len(xa) != len(xb):
        raise ValueError(f"difference: {len(xa)} vs {len(xb)} seeds")
    d = [[a - b for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(xa, xb)]
    out = interval(d, low=-1.0, high=1.0)
    out["effect_over_noise"] = out["mean"] / out["se"] if out["se"] > 0 else (math.inf if out["mean"] else 0.0)
    out["min_detectable_80"] = min_detectable(out["se"])
    return out


def verdict(diff: Mapping) -> str:
    """``holds`` (interval above 0), ``does not hold`` (below 0) or ``inconclusive`` (contains 0)."""
    if diff["lo"] > 0:
        return "holds"
    if diff["hi"] < 0:
        return "does not hold"
    return "inconclusive"


def problem_scores(output_file: str) -> dict[int, float]:
    """Per problem (input row) the fraction of its samples graded correct, from a generate_vllm.py output file."""
    totals: dict[int, list[int]] = {}
    with open(output_file) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                t = totals.setdefault(int(rec["row"]), [0, 0])
                t[0] += bool(rec["correct"])
                t[1] += 1
    return {row: c / n for row, (c, n) in sorted(totals.items())}


def score_matrix(per_seed: Sequence[Mapping[int, float]]) -> list[list[float]]:
    """Seeds x problems from per-seed ``problem_scores``; every seed must have scored the same problems."""
    rows = sorted(per_seed[0])
    if any(sorted(p) != rows for p in per_seed):
        raise ValueError("score_matrix: the seeds scored different problems")
    return [[p[r] for r in rows] for p in per_seed]


def fmt_interval(iv: Optional[Mapping], digits: int = 3) -> str:
    """``0.123 [0.100, 0.146]``, or ``—``."""
    if not iv:
        return "—"
    return f"{iv['mean']:.{digits}f} [{iv['lo']:.{digits}f}, {iv['hi']:.{digits}f}]"


def choose_lr(scores: Mapping[float, Optional[float]]) -> float:
    """The learning rate with the highest validation score; ties go to the smaller one (the smaller move from
    the start model); a failed run (score None) is never chosen."""
    scored = {lr: s for lr, s in scores.items() if s is not None and math.isfinite(s)}
    if not scored:
        raise ValueError(f"choose_lr: no learning rate has a score ({dict(scores)})")
    best = max(scored.values())
    return min(lr for lr, s in scored.items() if s == best)
