"""Training-dynamics plots from ``metrics.jsonl``: ``python -m verl.utils.plot_metrics``.

Draws the curves LUFFY's paper uses to show training dynamics: on-/off-policy reward, policy entropy,
response length, the actor's probability of off-policy tokens, and validation scores, one PNG per
panel plus ``overview.png`` with all of them. Several runs (e.g. LUFFY vs on-policy RL) can be
overlaid by passing several files.

    python -m verl.utils.plot_metrics checkpoints/p/e/metrics.jsonl [other/metrics.jsonl] --out plots [--smooth 5]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Optional

from verl.utils.tracking import read_metrics_jsonl


@dataclass(frozen=True)
class Panel:
    name: str  # also the PNG file name
    title: str
    ylabel: str
    keys: tuple[str, ...]  # exact metric keys; a key ending in "/" matches every key with that prefix


PANELS = (
    Panel(
        "reward",
        "Training reward",
        "mean score",
        ("critic/score/mean", "on_off_metrics/on_score", "on_off_metrics/off_score"),
    ),
    Panel("entropy", "Policy entropy", "entropy (nats/token)", ("actor/entropy_loss",)),
    Panel(
        "response_length",
        "Response length",
        "tokens",
        ("response_length/mean", "on_off_metrics/on_response_length_mean", "on_off_metrics/off_response_length_mean"),
    ),
    Panel(
        "off_policy_prob",
        "Probability of off-policy tokens",
        "mean p",
        ("actor/off_policy_prob", "actor/on_policy_prob"),
    ),
    Panel("validation", "Validation", "score", ("val/",)),
)

LABELS = {
    "critic/score/mean": "all",
    "on_off_metrics/on_score": "on-policy",
    "on_off_metrics/off_score": "off-policy",
    "actor/entropy_loss": "entropy",
    "response_length/mean": "all",
    "on_off_metrics/on_response_length_mean": "on-policy",
    "on_off_metrics/off_response_length_mean": "off-policy",
    "actor/off_policy_prob": "off-policy tokens",
    "actor/on_policy_prob": "on-policy tokens (old)",
}


def _finite_number(v) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None


def series(records: dict[int, dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping steps where it is absent or not a finite number."""
    steps, values = [], []
    for step, rec in records.items():
        value = _finite_number(rec.get(key))
        if value is not None:
            steps.append(step)
            values.append(value)
    return steps, values


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` points (shorter at the start); window 1 = unchanged."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def panel_keys(panel: Panel, available: set[str]) -> list[str]:
    keys: list[str] = []
    for key in panel.keys:
        if key.endswith("/"):
            keys.extend(sorted(k for k in available if k.startswith(key)))
        elif key in available:
            keys.append(key)
    return keys


def _label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    return key.split("/", 1)[1] if key.startswith("val/") else key


def plot_runs(runs: dict[str, dict[int, dict]], out_dir: str, smooth: int = 1) -> list[str]:
    """Write one PNG per panel with data plus ``overview.png``; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    available = {
        k
        for records in runs.values()
        for rec in records.values()
        for k in rec
        if _finite_number(rec.get(k)) is not None
    }
    panels = [(p, panel_keys(p, available)) for p in PANELS]
    panels = [(p, keys) for p, keys in panels if keys]
    if not panels:
        wanted = sorted({k for p in PANELS for k in p.keys})
        raise ValueError(f"none of the plotted metrics are in the file(s); expected some of {wanted}")
    os.makedirs(out_dir, exist_ok=True)
    multi = len(runs) > 1

    def draw(ax, panel: Panel, keys: list[str]) -> None:
        for run_name, records in runs.items():
            for key in keys:
                steps, values = series(records, key)
                if not steps:
                    continue
                label = f"{run_name}: {_label(key)}" if multi else _label(key)
                marker = "o" if panel.name == "validation" or len(steps) < 20 else None
                ax.plot(
                    steps,
                    moving_average(values, 1 if panel.name == "validation" else smooth),
                    label=label,
                    marker=marker,
                    markersize=3,
                )
        label_step_axes(ax, panel.title, panel.ylabel)

    written = []
    for panel, keys in panels:
        fig, ax = plt.subplots(figsize=(6, 4))
        draw(ax, panel, keys)
        written.append(save_png(fig, os.path.join(out_dir, f"{panel.name}.png")))
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (panel, keys) in zip(axes.flat, panels):
        draw(ax, panel, keys)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    written.append(save_png(fig, os.path.join(out_dir, "overview.png")))
    return written


def label_step_axes(ax, title: str, ylabel: str, legend: bool = True) -> None:
    """The look of every metric panel: title, "training step" on x, ``ylabel``, a light grid, a small legend."""
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7)


def save_png(fig, path: str) -> str:
    """Lay out, write ``path`` (100 dpi), close the figure; returns ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _run_names(paths: list[str], labels: Optional[list[str]]) -> list[str]:
    if labels:
        if len(labels) != len(paths):
            raise ValueError(f"--labels has {len(labels)} names for {len(paths)} files")
        return labels
    names = [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in paths]
    return names if len(set(names)) == len(names) else [f"{n} ({i})" for i, n in enumerate(names)]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl.utils.plot_metrics", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="metrics.jsonl file(s) written by trainer.logger=[...,jsonl]")
    parser.add_argument("--out", required=True, help="output folder for the PNGs")
    parser.add_argument("--smooth", type=int, default=1, help="trailing moving-average window in steps (1 = raw)")
    parser.add_argument("--labels", nargs="*", default=None, help="one legend name per file (default: folder names)")
    args = parser.parse_args(argv)
    for path in args.files:
        if not os.path.exists(path):
            parser.error(f"{path} does not exist")
    runs = {name: read_metrics_jsonl(path) for name, path in zip(_run_names(args.files, args.labels), args.files)}
    for path in plot_runs(runs, args.out, smooth=args.smooth):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
