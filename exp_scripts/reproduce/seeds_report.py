"""Across-seed summary of reproduce_tiny.py: the table (mean and spread per method) and mean curves with bands.

Every number is computed the same way for every method from its runs' ``metrics.jsonl`` and evaluations:
the on-policy reward is the mean score of the rows the policy generated itself (``replay/generated_on_score``
where self-replay rewrote rows after generation, else ``on_off_metrics/on_score``: the same quantity),
"start" / "end" are its means over the first / last ``window`` steps, and the change is end − start.
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np

from verl.utils.plot_metrics import label_step_axes, moving_average, save_png, series

ON_REWARD = "on_off_metrics/on_score"
GENERATED_ON_REWARD = "replay/generated_on_score"
ENTROPY = "actor/entropy_loss"
HELD_OUT = "val/avg_score"

CURVES = (  # (file name, title, y label, metric)
    ("reward", "On-policy training reward", "mean score of the policy's own samples", "reward"),
    ("held_out_accuracy", "Held-out accuracy (in-training validation)", "val/avg_score", HELD_OUT),
    ("entropy", "Policy entropy", "entropy (nats/token)", ENTROPY),
)


def reward_series(records: Mapping[int, Mapping]) -> tuple[list[int], list[float]]:
    """Per-step on-policy reward of the rows as generated (see the module docstring)."""
    key = GENERATED_ON_REWARD if any(GENERATED_ON_REWARD in r for r in records.values()) else ON_REWARD
    return series(dict(records), key)


def metric_series(records: Mapping[int, Mapping], metric: str) -> tuple[list[int], list[float]]:
    return reward_series(records) if metric == "reward" else series(dict(records), metric)


def window_mean(values: Sequence[float], window: int, last: bool) -> Optional[float]:
    part = list(values[-window:] if last else values[:window])
    return float(np.mean(part)) if part else None


def run_summary(records: Mapping[int, Mapping], window: int) -> dict:
    """Start / end / change of the on-policy reward, final entropy and the last held-out validation of one run."""
    _, reward = reward_series(records)
    _, entropy = series(dict(records), ENTROPY)
    _, held = series(dict(records), HELD_OUT)
    start, end = window_mean(reward, window, last=False), window_mean(reward, window, last=True)
    return {
        "reward_start": start,
        "reward_end": end,
        "reward_change": None if start is None or end is None else end - start,
        "entropy_end": window_mean(entropy, window, last=True),
        "held_out_val_first": held[0] if held else None,
        "held_out_val_last": held[-1] if held else None,
    }


def mean_spread(values: Sequence[Optional[float]]) -> tuple[Optional[float], Optional[float], int]:
    """(mean, sample std, count) over the finite values; std None below two values."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return None, None, 0
    return float(np.mean(vals)), (float(np.std(vals, ddof=1)) if len(vals) > 1 else None), len(vals)


def _cell(values: Sequence[Optional[float]], digits: int = 3) -> str:
    mean, std, count = mean_spread(values)
    if mean is None:
        return "—"
    text = f"{mean:.{digits}f}"
    if std is not None:
        text += f" ± {std:.{digits}f}"
    vals = [v for v in values if v is not None]
    if count > 1:
        text += f" [{min(vals):.{digits}f}, {max(vals):.{digits}f}]"
    return text


COLUMNS = (
    "method",
    "seeds",
    "held-out pass@1 greedy (final)",
    "held-out val start → last",
    "on-policy reward start",
    "on-policy reward end",
    "reward change",
    "final entropy",
    "CPU s / run",
)


def aggregate_table(runs: Mapping[str, Sequence[Mapping]]) -> str:
    """Markdown table: one row per method label, cells ``mean ± std [min, max]`` over its seeds."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for label, rows in runs.items():
        ok = [r for r in rows if not r.get("error")]
        failed = len(rows) - len(ok)
        g = [r["eval"]["greedy"]["accuracy"] if r.get("eval") else None for r in ok]
        s = [r.get("summary") or {} for r in ok]
        val = f"{_cell([x.get('held_out_val_first') for x in s])} → {_cell([x.get('held_out_val_last') for x in s])}"
        lines.append(
            "| "
            + " | ".join(
                [
                    label,
                    f"{len(ok)}" + (f" ({failed} failed)" if failed else ""),
                    _cell(g),
                    val,
                    _cell([x.get("reward_start") for x in s]),
                    _cell([x.get("reward_end") for x in s]),
                    _cell([x.get("reward_change") for x in s]),
                    _cell([x.get("entropy_end") for x in s]),
                    _cell([r.get("cpu_s") for r in ok], 0),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def plot_seed_curves(runs: Mapping[str, Sequence[Mapping[int, Mapping]]], out_dir: str, smooth: int = 5) -> list[str]:
    """One PNG per curve: per method the mean over seeds (trailing mean over ``smooth`` steps) and a min–max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []
    for file_name, title, ylabel, metric in CURVES:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        drawn = False
        for i, (label, seed_records) in enumerate(runs.items()):
            per_seed = [dict(zip(*metric_series(rec, metric))) for rec in seed_records]
            steps = sorted(set.intersection(*(set(p) for p in per_seed))) if per_seed else []
            if not steps:
                continue
            values = np.array([[p[s] for s in steps] for p in per_seed])
            if metric != HELD_OUT and smooth > 1:  # held-out points are sparse: no smoothing
                values = np.array([moving_average(list(v), smooth) for v in values])
            mean = values.mean(0)
            ax.plot(
                steps,
                mean,
                color=f"C{i}",
                label=f"{label} (n={len(per_seed)})",
                linewidth=1.6,
                marker="o" if metric == HELD_OUT else None,
                markersize=3,
            )
            ax.fill_between(steps, values.min(0), values.max(0), color=f"C{i}", alpha=0.15)
            drawn = True
        label_step_axes(ax, title, ylabel, legend=drawn)
        if drawn:
            written.append(save_png(fig, os.path.join(out_dir, f"{file_name}.png")))
        else:
            plt.close(fig)
    return written
