"""The report of reproduce_tiny.py: the results table (markdown + JSON) and the training-dynamics plots.

Training numbers come from each run's ``metrics.jsonl`` (the jsonl tracker); "final" values are the mean
over the last few logged steps, because one step of 8 prompts is noisy. Plots follow the paper's
figures: on-policy reward, policy entropy and the probability the policy gives off-policy tokens over
training steps, one line per method (plus on-policy response length).
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping, Optional, Sequence

from verl.utils.plot_metrics import label_step_axes, moving_average, save_png, series

ON_REWARD = "on_off_metrics/on_score"
ENTROPY = "actor/entropy_loss"
OFF_PROB = "actor/off_policy_prob"
ON_LENGTH = "on_off_metrics/on_response_length_mean"
OFF_RATIO = "on_off_metrics/off_on_example_ratio"

# (file name, title, y label, metric key)
PANELS = (
    ("on_policy_reward", "On-policy training reward", "mean score of on-policy samples", ON_REWARD),
    ("entropy", "Policy entropy", "entropy (nats/token)", ENTROPY),
    ("off_policy_prob", "Probability of off-policy tokens", "mean p(token) under the policy", OFF_PROB),
    ("on_policy_response_length", "On-policy response length", "tokens", ON_LENGTH),
)


def final_value(records: Mapping[int, Mapping], key: str, last: int = 5) -> Optional[float]:
    """Mean of ``key`` over the last ``last`` steps that logged it as a finite number; None if none did."""
    _, values = series(dict(records), key)
    return sum(values[-last:]) / len(values[-last:]) if values else None


def has_off_policy_rows(records: Mapping[int, Mapping]) -> bool:
    """True when some step mixed off-policy rows into its groups (on-policy runs log a 0 ratio)."""
    return any((rec.get(OFF_RATIO) or 0) > 0 for rec in records.values())


def plot_dynamics(runs: Mapping[str, Mapping[int, Mapping]], out_dir: str, smooth: int = 5) -> list[str]:
    """One PNG per panel with a line per run that logged its metric, plus ``overview.png``; returns the paths.

    ``off_policy_prob`` is drawn only for runs that had off-policy rows (elsewhere the metric is 0 by
    definition). Lines are trailing means over ``smooth`` steps, the raw values are drawn faintly.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    colors = {name: f"C{i}" for i, name in enumerate(runs)}

    def draw(ax, title: str, ylabel: str, key: str) -> bool:
        drawn = False
        for name, records in runs.items():
            if key == OFF_PROB and not has_off_policy_rows(records):
                continue
            steps, values = series(dict(records), key)
            if not steps:
                continue
            ax.plot(steps, values, color=colors[name], alpha=0.25, linewidth=0.8)
            ax.plot(steps, moving_average(values, smooth), color=colors[name], label=name, linewidth=1.6)
            drawn = True
        label_step_axes(ax, title, ylabel, legend=drawn)
        return drawn

    written = []
    for file_name, title, ylabel, key in PANELS:
        fig, ax = plt.subplots(figsize=(6, 4))
        if draw(ax, title, ylabel, key):
            written.append(save_png(fig, os.path.join(out_dir, f"{file_name}.png")))
        else:
            plt.close(fig)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (_, title, ylabel, key) in zip(axes.flat, PANELS):
        draw(ax, title, ylabel, key)
    written.append(save_png(fig, os.path.join(out_dir, "overview.png")))
    return written


def _fmt(value: Optional[float], digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.{digits}f}"


TABLE_COLUMNS = (
    "method",
    "held-out pass@1 (greedy)",
    "held-out avg@k (T=0.6)",
    "final on-policy train reward",
    "final entropy",
    "on-policy response length",
    "held-out response length",
    "wall time (s)",
)


def table_row(row: Mapping) -> list[str]:
    """One markdown row from a result record (see ``reproduce_tiny.method_result``)."""
    if row.get("error"):
        return [row["label"], f"failed: {row['error']}"] + [""] * (len(TABLE_COLUMNS) - 2)
    ev = row.get("eval") or {}
    greedy, sampled = ev.get("greedy"), ev.get("sampled")
    sampled_cell = "—" if not sampled else f"{sampled['accuracy']:.3f} (avg@{sampled['k']})"
    return [
        row["label"],
        _fmt(greedy["accuracy"] if greedy else None),
        sampled_cell,
        _fmt(row.get("train_reward")),
        _fmt(row.get("entropy")),
        _fmt(row.get("on_policy_response_length"), 1),
        _fmt(greedy["mean_response_tokens"] if greedy else None, 1),
        _fmt(row.get("wall_s"), 0),
    ]


def markdown_table(rows: Sequence[Mapping]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in rows]
    return "\n".join(lines)


def write_results(
    out_dir: str,
    rows: Sequence[Mapping],
    settings: Mapping,
    probe: Optional[Mapping],
    plots: Sequence[str],
    notes: Sequence[str] = (),
) -> str:
    """Write ``results.md`` and ``results.json`` into ``out_dir``; returns the markdown path."""
    md = [
        "# Tiny reproduction of LUFFY's comparison (CPU)",
        "",
        "Every method starts from the same randomly initialised tiny model and trains on the same synthetic "
        "task for the same number of steps with the same batch, learning rate and seeds "
        "(`exp_scripts/reproduce_tiny.py`). Held-out accuracy is measured after training with "
        "`eval_scripts/generate_vllm.py` (math-verify after `</think>`, the training reward's grader).",
        "",
        markdown_table(rows),
        "",
        "Columns: *final* = mean over the last 5 logged steps. On-policy train reward = mean score of the "
        "samples the policy generated itself (off-policy rows excluded). Wall time = training process "
        "including start-up (SFT then RL: both stages); evaluation not included. "
        "SFT has no on-policy samples during training.",
        "",
    ]
    if probe:
        md += [
            "## Untrained model on the task",
            "",
            f"On-policy success of the randomly initialised model: {probe['correct']} correct of {probe['samples']} "
            f"samples ({probe['rows']} training prompts x {probe['n']}, T={probe['temperature']}); "
            f"finish reasons {probe['finish_reasons']}.",
            "",
        ]
    md += ["## Settings", "", "```", json.dumps(dict(settings), indent=1, default=str), "```", ""]
    if notes:
        md += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    md += ["## Files", ""] + [f"- plot: `{p}`" for p in plots]
    md += [f"- {r['label']}: metrics `{r['metrics_file']}`" for r in rows if r.get("metrics_file")]
    path = os.path.join(out_dir, "results.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(
            {"settings": dict(settings), "probe": probe, "methods": list(rows), "plots": list(plots)},
            f,
            indent=1,
            default=str,
        )
    return path
