"""The protocol's summary for reproduce_tiny.py: per-method scores with intervals, the three claims' verdicts,
``results.md`` / ``results.json`` and the held-out bar plot.

Inputs are the learning-rate grid (validation score per method and lr, seed ``grid_seed``) and the final
runs (fresh seeds at each method's chosen lr), each with its per-problem held-out scores in and out of
distribution (``reproduce.stats``). The claims are LUFFY's (docs/METHOD.md §6): (1) from a weak start LUFFY
learns where on-policy RL does not; (2) LUFFY beats SFT out of distribution and keeps exploring; (3) policy
shaping matters. Each is a paired difference with its 95 % interval and a verdict; nothing here depends on
which way the numbers fall.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping, Optional, Sequence

from reproduce.stats import difference, fmt_interval, interval, score_matrix, verdict

SPLITS = ("id", "ood")
METRICS = ("greedy", "avg")  # greedy pass@1, avg@k at T=0.6
# Two-sided 95 % Student-t quantiles by degrees of freedom (seed-level comparisons have few seeds).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_std(values: Sequence[Optional[float]]) -> dict:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
    return {"mean": m, "std": sd, "n": len(vals)}


def seed_difference(a: Sequence[float], b: Sequence[float]) -> Optional[dict]:
    """Difference of two seed-level means (unpaired) with a 95 % t interval on min(n_a, n_b) − 1 degrees of freedom."""
    sa, sb = mean_std(a), mean_std(b)
    if not sa["n"] or not sb["n"] or sa["std"] is None or sb["std"] is None:
        return None
    d = sa["mean"] - sb["mean"]
    se = math.sqrt(sa["std"] ** 2 / sa["n"] + sb["std"] ** 2 / sb["n"])
    t = T95.get(min(sa["n"], sb["n"]) - 1, 1.96)
    return {
        "mean": d,
        "lo": d - t * se,
        "hi": d + t * se,
        "se": se,
        "effect_over_noise": d / se if se > 0 else (math.inf if d else 0.0),
    }


def method_summary(label: str, runs: Sequence[Mapping], grid: Optional[Mapping]) -> dict:
    """Scores over a method's final runs (``runs``: the ones without an error) and its grid."""
    ok = [r for r in runs if not r.get("error")]
    out = {
        "label": label,
        "chosen_lr": runs[0]["lr"] if runs else None,
        "seeds": [r["seed"] for r in ok],
        "failed": [r["seed"] for r in runs if r.get("error")],
        "grid": grid,
        "per_seed": [],
        "id": {},
        "ood": {},
    }
    for r in ok:
        s = r.get("summary") or {}
        out["per_seed"].append(
            {
                "seed": r["seed"],
                "final_on_policy_reward": s.get("reward_end"),
                "reward_start": s.get("reward_start"),
                "reward_change": s.get("reward_change"),
                "entropy_end": s.get("entropy_end"),
                "cpu_s": r.get("cpu_s"),
                **{f"{sp}_{m}": r["scores"][sp][m]["mean"] for sp in SPLITS for m in METRICS if r["scores"][sp].get(m)},
            }
        )
    for sp in SPLITS:
        for m in METRICS:
            per = [r["scores"][sp][m]["per_problem"] for r in ok if r["scores"][sp].get(m)]
            if per and len(per) == len(ok):
                out[sp][m] = interval(score_matrix(per))
    for key in ("final_on_policy_reward", "reward_start", "reward_change", "entropy_end", "cpu_s"):
        out[key] = mean_std([p[key] for p in out["per_seed"]])
    return out


def _matrix(runs: Sequence[Mapping], split: str, metric: str) -> Optional[list]:
    ok = sorted((r for r in runs if not r.get("error")), key=lambda r: r["seed"])
    per = [r["scores"][split][metric]["per_problem"] for r in ok if r["scores"][split].get(metric)]
    return score_matrix(per) if per and len(per) == len(ok) else None


def paired(runs: Mapping[str, Sequence[Mapping]], a: str, b: str, split: str, metric: str) -> Optional[dict]:
    """``a − b`` on one split and metric, paired by seed and problem over the seeds both finished; None when either
    is missing."""
    if a not in runs or b not in runs:
        return None
    common = {r["seed"] for r in runs[a] if not r.get("error")} & {r["seed"] for r in runs[b] if not r.get("error")}
    xa = _matrix([r for r in runs[a] if r["seed"] in common], split, metric) if common else None
    xb = _matrix([r for r in runs[b] if r["seed"] in common], split, metric) if common else None
    if xa is None or xb is None or len(xa) != len(xb):
        return None
    d = difference(xa, xb)
    d["verdict"] = verdict(d)
    return d


def versus_start(
    runs: Mapping[str, Sequence[Mapping]], name: str, start_scores: Optional[Mapping], split: str, metric: str
) -> Optional[dict]:
    """``name − start model`` (the start's one score per problem stands against every seed), paired by problem."""
    if name not in runs or not start_scores or metric not in start_scores.get(split, {}):
        return None
    xa = _matrix(runs[name], split, metric)
    if xa is None:
        return None
    row = [start_scores[split][metric]["per_problem"][p] for p in sorted(start_scores[split][metric]["per_problem"])]
    d = difference(xa, [row] * len(xa))
    d["verdict"] = verdict(d)
    return d


def claims(
    runs: Mapping[str, Sequence[Mapping]],
    methods: Mapping[str, dict],
    probe: Mapping,
    start_scores: Optional[Mapping] = None,
) -> dict:
    """The three claims (module docstring): each part a paired difference with its interval and verdict;
    ``start_scores`` (the start model's per-problem scores) adds LUFFY − start model."""

    def ent(name):
        return [p["entropy_end"] for p in methods[name]["per_seed"]] if name in methods else []

    entropy = seed_difference(ent("luffy"), ent("on_policy"))
    if entropy:
        entropy["verdict"] = verdict(entropy)
    return {
        "1_weak_start": {
            "start_pass_rate": probe["accuracy"],
            "weak_start": probe["accuracy"] < 0.05,
            "luffy_minus_on_policy_id_avg": paired(runs, "luffy", "on_policy", "id", "avg"),
            "luffy_minus_on_policy_id_greedy": paired(runs, "luffy", "on_policy", "id", "greedy"),
            "luffy_minus_start_id_avg": versus_start(runs, "luffy", start_scores, "id", "avg"),
            "on_policy_minus_start_id_avg": versus_start(runs, "on_policy", start_scores, "id", "avg"),
            "on_policy_reward_change": methods.get("on_policy", {}).get("reward_change"),
            "luffy_reward_change": methods.get("luffy", {}).get("reward_change"),
        },
        "2_ood_vs_sft": {
            "luffy_minus_sft_ood_avg": paired(runs, "luffy", "sft", "ood", "avg"),
            "luffy_minus_sft_ood_greedy": paired(runs, "luffy", "sft", "ood", "greedy"),
            "luffy_minus_on_policy_final_entropy": entropy,
        },
        "3_shaping": {
            "luffy_minus_no_shaping_id_avg": paired(runs, "luffy", "luffy_no_shaping", "id", "avg"),
            "luffy_minus_no_shaping_ood_avg": paired(runs, "luffy", "luffy_no_shaping", "ood", "avg"),
        },
    }


def family_claims(
    runs: Mapping[str, Sequence[Mapping]], labels: Mapping[str, str], start_scores: Optional[Mapping] = None
) -> dict:
    """Per method of ``labels`` other than on-policy GRPO and SFT (LUFFY and its family): the question LUFFY's first
    claim asks of each, paired as the claims are: method − on-policy GRPO and method − start model on the held-out
    in-distribution avg@k, and method − SFT out of distribution."""
    return {
        name: {
            "label": label,
            "minus_on_policy_id_avg": paired(runs, name, "on_policy", "id", "avg"),
            "minus_start_id_avg": versus_start(runs, name, start_scores, "id", "avg"),
            "minus_sft_ood_avg": paired(runs, name, "sft", "ood", "avg"),
        }
        for name, label in labels.items()
        if name not in ("on_policy", "sft") and name in runs
    }


def family_markdown(f: Mapping, k: int) -> list[str]:
    """One bullet per method of ``family_claims``."""
    return [
        f"- **{v['label']}**: ID avg@{k} − on-policy GRPO {_diff_text(v['minus_on_policy_id_avg'])}; − start model "
        f"{_diff_text(v['minus_start_id_avg'])}; OOD avg@{k} − SFT {_diff_text(v['minus_sft_ood_avg'])}."
        for v in f.values()
    ]


def _diff_text(d: Optional[Mapping]) -> str:
    if not d:
        return "not measured (a method of the comparison was not run)"
    power = (
        f"; detectable at 80 % power: ±{d['min_detectable_80']:.3f}" if d.get("min_detectable_80") is not None else ""
    )
    return (
        f"**{d['verdict']}**: {d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}], effect/noise "
        f"{d['effect_over_noise']:+.1f}{power}"
    )


def _ms(s: Optional[Mapping], digits: int = 3) -> str:
    if not s or s.get("mean") is None:
        return "—"
    return f"{s['mean']:.{digits}f}" + (f" ± {s['std']:.{digits}f}" if s.get("std") is not None else "")


def claims_markdown(c: Mapping, k: int) -> list[str]:
    one, two, three = c["1_weak_start"], c["2_ood_vs_sft"], c["3_shaping"]
    return [
        f"1. **From a weak start, LUFFY learns where on-policy RL cannot find rewards.** Start model's on-policy pass "
        f"rate {one['start_pass_rate']:.3f} ({'under' if one['weak_start'] else 'NOT under'} 5 %). Held-out "
        f"in-distribution avg@{k}, LUFFY − on-policy GRPO: {_diff_text(one['luffy_minus_on_policy_id_avg'])}; greedy "
        f"pass@1: {_diff_text(one['luffy_minus_on_policy_id_greedy'])}. Against the start model (ID avg@{k}): LUFFY − "
        f"start {_diff_text(one.get('luffy_minus_start_id_avg'))}; on-policy GRPO − start "
        f"{_diff_text(one.get('on_policy_minus_start_id_avg'))}. On-policy reward change over training "
        f"(last − first window, mean ± std over seeds): on-policy GRPO {_ms(one['on_policy_reward_change'])}, LUFFY "
        f"{_ms(one['luffy_reward_change'])}.",
        f"2. **LUFFY beats SFT out of distribution and keeps exploring.** OOD avg@{k}, LUFFY − SFT: "
        f"{_diff_text(two['luffy_minus_sft_ood_avg'])}; greedy: {_diff_text(two['luffy_minus_sft_ood_greedy'])}. "
        f"Final policy entropy, LUFFY − on-policy GRPO (t interval over seeds): "
        f"{_diff_text(two['luffy_minus_on_policy_final_entropy'])}.",
        f"3. **Policy shaping matters.** LUFFY − LUFFY w/o shaping, in-distribution avg@{k}: "
        f"{_diff_text(three['luffy_minus_no_shaping_id_avg'])}; OOD avg@{k}: "
        f"{_diff_text(three['luffy_minus_no_shaping_ood_avg'])}.",
    ]


MAIN_COLUMNS = (
    "method",
    "lr (chosen)",
    "seeds",
    "ID pass@1 greedy [95 % CI]",
    "ID avg@k [95 % CI]",
    "OOD pass@1 greedy [95 % CI]",
    "OOD avg@k [95 % CI]",
    "on-policy reward first → last window",
    "final entropy",
    "CPU s / run",
)


def main_table(methods: Mapping[str, dict], start: Optional[Mapping] = None) -> str:
    lines = ["| " + " | ".join(MAIN_COLUMNS) + " |", "|" + "---|" * len(MAIN_COLUMNS)]
    if start:
        lines.append(
            "| "
            + " | ".join(
                [start["label"], "—", "—"]
                + [fmt_interval(start.get(sp, {}).get(m)) for sp in SPLITS for m in METRICS]
                + ["—", "—", "—"]
            )
            + " |"
        )
    for m in methods.values():
        seeds = ",".join(map(str, m["seeds"])) + (f" ({len(m['failed'])} failed)" if m["failed"] else "")
        reward = (
            "—"
            if m["reward_start"]["mean"] is None
            else f"{_ms(m['reward_start'])} → {_ms(m['final_on_policy_reward'])}"
        )
        lines.append(
            "| "
            + " | ".join(
                [m["label"], f"{m['chosen_lr']:g}", seeds]
                + [fmt_interval(m[sp].get(mt)) for sp in SPLITS for mt in METRICS]
                + [reward, _ms(m["entropy_end"]), _ms(m["cpu_s"], 0)]
            )
            + " |"
        )
    return "\n".join(lines)


def grid_table(grids: Mapping[str, Mapping]) -> str:
    lrs = sorted({lr for g in grids.values() for lr in g["scores"]})
    lines = ["| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | chosen |", "|" + "---|" * (len(lrs) + 2)]
    for g in grids.values():
        cells = []
        for lr in lrs:
            s = g["scores"].get(lr, "n/a")
            cell = "—" if s is None else (s if isinstance(s, str) else f"{s:.3f}")
            cells.append(f"**{cell}**" if lr == g["chosen"] and len(g["scores"]) > 1 else cell)
        chosen = "—" if g.get("chosen") is None else f"{g['chosen']:g}"  # every grid run failed or is missing
        lines.append(f"| {g['label']} | " + " | ".join(cells) + f" | {chosen} |")
    return "\n".join(lines)


def grid_edge_notes(grids: Mapping[str, Mapping]) -> list[str]:
    """One line per method whose chosen lr is the smallest or largest value of a grid of several."""
    notes = []
    for g in grids.values():
        lrs = sorted(lr for lr in g["scores"])
        if len(lrs) > 1 and g.get("chosen") in (lrs[0], lrs[-1]):
            side = "largest" if g["chosen"] == lrs[-1] else "smallest"
            notes.append(
                f"- {g['label']}: the chosen lr {g['chosen']:g} is the {side} value of the grid; a wider grid "
                "might score higher."
            )
    return notes


def plot_held_out(methods: Mapping[str, dict], start: Optional[Mapping], out_dir: str, k: int) -> Optional[str]:
    """``held_out.png``: in- and out-of-distribution avg@k per method (bars, 95 % interval) and greedy pass@1 (dots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from verl.utils.plot_metrics import save_png

    entries = ([("start", start)] if start else []) + [(m["label"], m) for m in methods.values()]
    if not entries:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    for ax, sp, title in zip(axes, SPLITS, ("in distribution (held-out test)", "out of distribution")):
        for i, (label, m) in enumerate(entries):
            avg, greedy = m.get(sp, {}).get("avg"), m.get(sp, {}).get("greedy")
            if avg:
                ax.bar(
                    i,
                    avg["mean"],
                    color=f"C{i}",
                    alpha=0.7,
                    yerr=[[avg["mean"] - avg["lo"]], [avg["hi"] - avg["mean"]]],
                    capsize=4,
                )
            if greedy:
                ax.errorbar(
                    i + 0.25,
                    greedy["mean"],
                    yerr=[[greedy["mean"] - greedy["lo"]], [greedy["hi"] - greedy["mean"]]],
                    fmt="o",
                    color="k",
                    markersize=4,
                    capsize=3,
                )
        ax.set_xticks(range(len(entries)), [e[0] for e in entries], rotation=20, ha="right", fontsize=8)
        ax.set_title(f"Held-out accuracy, {title}", fontsize=10)
        ax.set_ylabel(f"bars: avg@{k} (T=0.6); dots: greedy pass@1")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, os.path.join(out_dir, "held_out.png"))


def write_results(out: str, md_sections: Sequence[str], record: Mapping) -> str:
    """``results.md`` (the sections, joined) and ``results.json`` (``record``); returns the markdown path."""
    path = os.path.join(out, "results.md")
    with open(path, "w") as f:
        f.write("\n".join(md_sections) + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)
    return path
