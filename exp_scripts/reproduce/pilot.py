"""The pilot of reproduce_tiny.py: how many steps the run needs before a method *can* move the held-out score.

SFT on the teacher traces is the cheapest method that learns from them (~11 CPU s per 50 steps), so it sets the
length: SFT runs of ``start``, 2·start, 4·start, ... steps (each at every lr of the SFT grid, seed ``--grid-seed``;
a best lr at the grid's edge adds one beyond it, up to ``--grid-extend`` times)
until the best of them moves the start model's validation avg@k (in distribution, the split the lr grid uses; the
test split stays untouched) by at least ``move`` (0.05 = 5 points). That length is the comparison's: LUFFY, GRPO and
the family then train at least that long, so that "on-policy RL learns nothing" is not just "nothing had time to
move". When no length up to ``max_steps`` reaches the move, the pilot says so and the longest length is used.
Written to ``<out>/pilot/pilot.json`` (resumable with ``--reuse``, as every run).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional

from reproduce.grid import edge_extension


def pilot_lengths(start: int, max_steps: int) -> list[int]:
    """``start``, doubling, up to ``max_steps`` (included as the last length when the doubling passes it)."""
    if start < 1 or max_steps < start:
        raise ValueError(f"pilot: need 1 <= start <= max_steps, got {start}, {max_steps}")
    out = [start]
    while out[-1] < max_steps:
        out.append(min(2 * out[-1], max_steps))
    return out


def pilot_result(start_score: float, scores: dict[int, dict[float, Optional[float]]], move: float) -> dict:
    """The shortest length whose best SFT lr moved the validation score by ``move`` from ``start_score``:
    ``{"steps", "reached", "start_score", "best": {L: (lr, score)}, "move"}``; ``steps`` is the longest length run
    when none reached it."""
    best = {}
    for length in sorted(scores):
        scored = {lr: s for lr, s in scores[length].items() if s is not None}
        if scored:
            lr = max(scored, key=lambda k: (scored[k], -k))
            best[length] = (lr, scored[lr])
    reached = [L for L, (_, s) in best.items() if s - start_score >= move - 1e-12]
    steps = min(reached) if reached else (max(best) if best else None)
    return {"steps": steps, "reached": bool(reached), "start_score": start_score, "best": best, "move": move}


def run_pilot(
    lengths: list[int],
    lrs: list[float],
    start_score: float,
    move: float,
    score_sft: Callable[[int, float], Optional[float]],
    out_dir: str,
    say: Callable[[str], None],
    max_extend: int = 2,
) -> dict:
    """Runs the lengths in order, stopping at the first that reaches ``move``; ``score_sft(steps, lr)`` trains and
    scores one SFT run (None on failure). A best lr at an edge of ``lrs`` adds one lr beyond it (up to
    ``max_extend`` in all). Writes and returns ``pilot_result`` plus every score."""
    scores: dict[int, dict[float, Optional[float]]] = {}
    res = pilot_result(start_score, scores, move)
    lrs, extended = sorted(lrs), 0
    for length in lengths:
        scores[length] = {lr: score_sft(length, lr) for lr in lrs}
        res = pilot_result(start_score, scores, move)
        # a best lr at an edge of the SFT grid: one more point beyond it (for this and the longer lengths), as the
        # comparison's grid does (reproduce/grid.py), so the length is not set by a too small or too large lr
        while length in res["best"] and extended < max_extend:
            nxt = edge_extension(lrs, res["best"][length][0])
            if nxt is None:
                break
            nxt, extended = float(f"{nxt:.3g}"), extended + 1
            say(f"pilot: SFT {length} steps: best lr at the edge of the grid, adding lr {nxt:g}")
            lrs = sorted([*lrs, nxt])
            scores[length][nxt] = score_sft(length, nxt)
            res = pilot_result(start_score, scores, move)
        lr, s = res["best"].get(length, (None, None))
        say(
            f"pilot: SFT {length} steps: best val avg {'—' if s is None else f'{s:.3f}'} (lr {lr}) vs start "
            f"{start_score:.3f}"
        )
        if res["reached"]:
            break
    res["scores"] = {str(L): {f"{lr:g}": s for lr, s in v.items()} for L, v in scores.items()}
    res["best"] = {str(L): {"lr": lr, "score": s} for L, (lr, s) in res["best"].items()}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "pilot.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


def pilot_lines(pilot: Optional[dict], k: int) -> list[str]:
    """results.md's statement of the pilot (none when the run had none)."""
    if not pilot:
        return []
    best = pilot["best"].get(str(pilot["steps"]), {})
    moved = (best.get("score") or 0.0) - pilot["start_score"]
    tried = ", ".join(
        f"{L} steps: {v['score']:.3f} (lr {v['lr']:g})" for L, v in pilot["best"].items() if v.get("score") is not None
    )
    return [
        "## Pilot: the run length",
        "",
        f"SFT on the teacher traces at doubling lengths (best lr of the SFT grid each, validation avg@{k}; start model "
        f"{pilot['start_score']:.3f}): {tried}. "
        + (
            f"**{pilot['steps']} steps** is the shortest that moves the in-distribution score by >= "
            f"{pilot['move'] * 100:.0f} points ({moved * 100:+.1f}): every method trains that long."
            if pilot["reached"]
            else f"No length moved it by {pilot['move'] * 100:.0f} points; the longest, **{pilot['steps']} steps** "
            f"({moved * 100:+.1f} points), is used: the run may still be too short for any method to move."
        ),
        "",
    ]
