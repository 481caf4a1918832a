"""Accuracy metrics over graded samples: avg@k, unbiased pass@k per data source, micro and macro averages.

A *problem* is one ``(data_source, index)`` pair (``extra_info.index``; the prompt text when a row has
no index), so the replicated rows of ``valid.all.parquet`` (AIME x32) and the ``n`` samples of one row
all count as samples of the same problem. ``avg`` is the mean over all samples of a source -- LUFFY's
number, avg@32 on the replicated files -- and ``pass@k`` is the unbiased estimator
``1 - C(m-c, k) / C(m, k)`` per problem (m samples, c correct) averaged over problems.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples of which ``c`` are correct (Chen et al. 2021)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count must be in [0, n], got c={c}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_up_to(m: int) -> list[int]:
    """1, 2, 4, ... up to ``m``, plus ``m`` itself."""
    ks, k = [], 1
    while k <= m:
        ks.append(k)
        k *= 2
    if m >= 1 and ks[-1] != m:
        ks.append(m)
    return ks


def problem_key(record: Mapping) -> tuple:
    index = record.get("index")
    return ("index", index) if index is not None else ("prompt", record.get("prompt"))


def summarize(records: Iterable[Mapping]) -> dict[str, dict]:
    """Per data source (in order of first appearance): samples, problems, avg and pass@k.

    Each record needs ``data_source`` and ``correct``; ``index`` (or ``prompt``) identifies its problem.
    pass@k is reported for k = 1, 2, 4, ... up to the smallest number of samples any problem of that
    source has (and that number itself), so every problem contributes to every k.
    """
    counts: dict[str, dict[tuple, list[int]]] = {}
    for rec in records:
        per_problem = counts.setdefault(rec["data_source"], {})
        nc = per_problem.setdefault(problem_key(rec), [0, 0])
        nc[0] += 1
        nc[1] += int(bool(rec["correct"]))
    summary = {}
    for source, per_problem in counts.items():
        ns = [n for n, _ in per_problem.values()]
        total_n, total_c = sum(ns), sum(c for _, c in per_problem.values())
        m = min(ns)
        summary[source] = {
            "num_samples": total_n,
            "num_correct": total_c,
            "num_problems": len(per_problem),
            "samples_per_problem": [m, max(ns)],
            "avg": total_c / total_n,
            "pass": {
                k: sum(pass_at_k(n, c, k) for n, c in per_problem.values()) / len(per_problem) for k in ks_up_to(m)
            },
        }
    return summary


def micro_accuracy(summary: Mapping[str, Mapping]) -> float:
    """Correct samples / all samples, over every source (LUFFY's ``accuracy`` line)."""
    n = sum(s["num_samples"] for s in summary.values())
    return sum(s["num_correct"] for s in summary.values()) / n if n else 0.0


def macro_average(summary: Mapping[str, Mapping], key: str = "avg") -> float:
    """Mean over sources of one metric (LUFFY's ``avg acc`` line, each benchmark weighted equally)."""
    return sum(s[key] for s in summary.values()) / len(summary) if summary else 0.0


def avg_label(stats: Mapping) -> str:
    """``avg@32`` when every problem has 32 samples, else plain ``avg``."""
    lo, hi = stats["samples_per_problem"]
    return f"avg@{lo}" if lo == hi else "avg"


def report_lines(summary: Mapping[str, Mapping]) -> list[str]:
    """LUFFY's lines (``accuracy``, ``<data_source>: <acc>``, ``avg acc``) then a per-source metric table."""
    lines = [f"accuracy: {micro_accuracy(summary)}"]
    lines += [f"{source}: {stats['avg']}" for source, stats in summary.items()]
    lines.append(f"avg acc: {macro_average(summary)}")
    lines.append("")
    lines.append(f"{'data_source':<16} {'problems':>8} {'samples':>8} {'avg':>18} {'pass@1':>8}  pass@k")
    for source, stats in summary.items():
        passes = ", ".join(f"@{k}={v:.4f}" for k, v in stats["pass"].items())
        avg = f"{stats['avg']:.4f} ({avg_label(stats)})"
        lines.append(
            f"{source:<16} {stats['num_problems']:>8} {stats['num_samples']:>8} {avg:>18} "
            f"{stats['pass'][1]:>8.4f}  {passes}"
        )
    return lines


def summary_to_json(summary: Mapping[str, Mapping]) -> dict:
    """JSON-ready summary (pass@k keys become ``"pass@k"`` strings) with the micro and macro lines."""
    per_source = {}
    for source, stats in summary.items():
        entry = {k: v for k, v in stats.items() if k != "pass"}
        entry.update({f"pass@{k}": v for k, v in stats["pass"].items()})
        entry["avg_label"] = avg_label(stats)
        per_source[source] = entry
    return {"per_source": per_source, "accuracy": micro_accuracy(summary), "avg_acc": macro_average(summary)}
