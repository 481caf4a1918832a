"""The few lines exp_scripts/quickstart.sh prints after training: what ran, how long, whether it learned, where things are.

    python exp_scripts/quickstart_summary.py --run-dir outputs/quickstart/checkpoints [--wall-s S] [--cpu-s S] [--window 10]

Reads ``<run-dir>/metrics.jsonl`` (the jsonl tracker), draws the training curves into ``<run-dir>/plots``
(``verl.utils.plot_metrics``) and prints: steps, wall / CPU time, the on-policy reward over the first vs
the last ``--window`` steps, the first vs last validation score, and the paths of the metrics file, the
plots and the best checkpoint (``best/actor``, written when validation improves).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

ON_REWARD = "on_off_metrics/on_score"
VAL = "val/avg_score"


def summarize(records: dict, window: int) -> dict:
    """Steps, on-policy reward first/last ``window`` steps (means) and first/last validation score."""
    from verl.utils.plot_metrics import series

    _, reward = series(records, ON_REWARD)
    val_steps, val = series(records, VAL)
    train_steps = [s for s, r in records.items() if ON_REWARD in r]

    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    return {
        "steps": max(train_steps) if train_steps else 0,
        "reward_first": mean(reward[:window]),
        "reward_last": mean(reward[-window:]),
        "val_first": val[0] if val else None,
        "val_last": val[-1] if val else None,
        "val_steps": (val_steps[0], val_steps[-1]) if val else None,
    }


def _f(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.3f}"


def summary_lines(
    s: dict, window: int, run_dir: str, plots: Sequence[str], wall_s: Optional[float], cpu_s: Optional[float]
) -> list[str]:
    best = os.path.join(run_dir, "best", "actor")
    t = (f"{wall_s:.0f} s wall" if wall_s is not None else "") + (f", {cpu_s:.0f} CPU s" if cpu_s is not None else "")
    val = (
        "no validation logged"
        if s["val_steps"] is None
        else (f"{_f(s['val_first'])} (step {s['val_steps'][0]}) -> {_f(s['val_last'])} (step {s['val_steps'][1]})")
    )
    return [
        "",
        "=== quickstart summary ===",
        f"steps: {s['steps']}" + (f"; time: {t}" if t else ""),
        f"on-policy reward (mean score of the policy's own samples): first {window} steps {_f(s['reward_first'])}"
        f" -> last {window} steps {_f(s['reward_last'])}",
        f"validation score (val/avg_score): {val}",
        f"metrics: {os.path.join(run_dir, 'metrics.jsonl')}",
        f"plots: {os.path.dirname(plots[0]) if plots else 'none drawn'}",
        f"best checkpoint: {best if os.path.isdir(best) else 'none (no validation improved on the first)'}",
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python exp_scripts/quickstart_summary.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", required=True, help="the trainer's default_local_dir")
    ap.add_argument("--window", type=int, default=10, help="steps averaged at the start and the end")
    ap.add_argument("--wall-s", type=float, default=None, help="training wall seconds (printed)")
    ap.add_argument("--cpu-s", type=float, default=None, help="training CPU seconds (printed)")
    args = ap.parse_args(argv)
    from verl.utils.tracking import read_metrics_jsonl

    metrics = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.exists(metrics):
        print(f"quickstart summary: no {metrics} (was trainer.logger overridden without jsonl?)")
        return 1
    records = read_metrics_jsonl(metrics)
    plots: list[str] = []
    try:
        from verl.utils.plot_metrics import plot_runs

        plots = list(plot_runs({"quickstart": records}, os.path.join(args.run_dir, "plots"), smooth=5))
    except (ImportError, OSError, ValueError) as exc:  # the summary still prints without matplotlib
        print(f"quickstart summary: no plots ({exc})")
    print(
        "\n".join(
            summary_lines(summarize(records, args.window), args.window, args.run_dir, plots, args.wall_s, args.cpu_s)
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
