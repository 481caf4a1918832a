"""The learning-rate grid of reproduce_tiny.py: one run per lr on the validation split, the best chosen, and a grid
whose best point is at an edge extended by one point in that direction (at most ``max_extend`` times), so a chosen
lr is a peak of the grid's scores rather than its boundary."""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional, Sequence

from reproduce.stats import choose_lr


def edge_extension(lrs: Sequence[float], chosen: float) -> Optional[float]:
    """The next lr beyond the edge ``chosen`` sits on, one grid step further (the ratio of the two edge points), or
    None when ``chosen`` is inside the grid or the grid has fewer than two points."""
    grid = sorted(lrs)
    if len(grid) < 2 or grid[0] < chosen < grid[-1]:
        return None
    if chosen == grid[0]:
        return grid[0] * grid[0] / grid[1]
    if chosen == grid[-1]:
        return grid[-1] * grid[-1] / grid[-2]
    return None


def run_grid(
    label: str,
    lrs: Sequence[float],
    score_lr: Callable[[float], tuple[Optional[float], float]],
    say: Callable[[str], None],
    max_extend: int = 2,
) -> dict:
    """``{"label", "lrs", "scores", "cpu_s", "chosen", "extended"}``: ``score_lr(lr)`` trains and scores one grid
    point (``(score or None on failure, CPU s)``); an edge choice adds one point beyond it, up to ``max_extend``
    times; ``extended`` lists the added points."""
    g: dict = {"label": label, "lrs": sorted(lrs), "scores": {}, "cpu_s": 0.0, "extended": []}
    if len(lrs) == 1:
        g["scores"] = {lrs[0]: "fixed"}
        g["chosen"] = lrs[0]
        return g
    todo = list(g["lrs"])
    while True:
        for lr in todo:
            score, cpu = score_lr(lr)
            g["scores"][lr] = score
            g["cpu_s"] += cpu
        try:
            g["chosen"] = choose_lr(g["scores"])
        except ValueError as exc:
            g["chosen"] = None
            say(f"grid: {label}: no lr could be chosen: {exc}")
            return g
        nxt = edge_extension(g["scores"], g["chosen"])
        if nxt is None or len(g["extended"]) >= max_extend:
            say(f"grid: {label}: chosen lr {g['chosen']:g}")
            return g
        nxt = float(f"{nxt:.3g}")
        say(f"grid: {label}: best at the edge ({g['chosen']:g}): extending the grid to {nxt:g}")
        g["extended"].append(nxt)
        g["lrs"] = sorted([*g["lrs"], nxt])
        todo = [nxt]


def grid_run_dir(out: str, name: str, lr: float) -> str:
    return os.path.join(out, "grid", name, f"lr{lr:g}")


def extension_notes(grids: Mapping[str, Mapping]) -> list[str]:
    """One line per method whose grid was extended at an edge."""
    return [
        f"- {g['label']}: best at an edge, grid extended by {', '.join(f'{lr:g}' for lr in g['extended'])}."
        for g in grids.values()
        if g.get("extended")
    ]
