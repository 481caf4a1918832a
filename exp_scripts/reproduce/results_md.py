"""``results.md`` and ``results.json`` of reproduce_tiny.py: the command's description, the PARTIAL marker when runs
are missing, the no-reward regime, the claims, the family's comparison and knobs, the tables, the start model,
the OOD set, the intervals, CPU seconds, every run and the plots."""

from __future__ import annotations

import os

from reproduce import summary as S
from reproduce.grid import extension_notes
from reproduce.methods import FAMILY, NOT_RUN
from reproduce.pilot import pilot_lines
from reproduce.recipes import recipe_summary
from reproduce.regime import regime_lines


def family_knob_lines(names) -> list[str]:
    """Per family method of the run, the keys its recipe gave it (reproduce/recipes.py), and the members not run."""
    lines = [
        "Each family method runs `tiny_cpu_luffy.yaml` (LUFFY's train.sh at tiny scale) with its own recipe's keys "
        "from `exp_scripts/train_<method>.sh` on top, scaled to the tiny run (`reproduce/recipes.py`): the group size "
        "by tiny n / LUFFY's 8, the updates per step by the recipe's batch / mini-batch, ReLIFT's SFT buffer (= the "
        "batch, theirs 128 = their batch) and SFT lr (= the RL lr, theirs 1e-6 = their RL lr) and UFT's hint schedule "
        "(0.6 x steps, theirs 300 of 500) rescaled; batch, lengths, lr, steps and seeds are the run's. GRPO, LUFFY "
        "and SFT use their tiny configs (`tiny_cpu_on_policy.yaml`, `tiny_cpu_luffy.yaml`, `tiny_cpu_sft.yaml`). "
        "ExGRPO keeps its warm-up rule (on-policy until a step solves > 35 %), so in the no-reward regime it trains "
        "as on-policy GRPO for as long as that holds.",
        "",
        *[f"- **{FAMILY[n]}** {recipe_summary(n)}." for n in names if n in FAMILY],
        *[f"- not run: **{n}**: {why}." for n, why in NOT_RUN.items()],
    ]
    return lines


def command_flags(args) -> str:
    return " --quick" if args.quick else (f" --preset {args.preset}" if args.preset else "")


def partial_lines(grid_rec, runs) -> list[str]:
    """A report with runs missing (``--report-only`` while the runs go on, or failures) says so before any number."""
    grid_missing = [f"{g['label']} lr {lr:g}" for g in grid_rec.values() for lr, v in g["scores"].items() if v is None]
    seed_missing = [f"{r['label']} seed {r['seed']}" for rs in runs.values() for r in rs if r.get("error")]
    not_run = [g["label"] for n, g in grid_rec.items() if g.get("chosen") is None]
    if not (grid_missing or seed_missing or not_run):
        return []
    return [
        "## PARTIAL RESULTS",
        "",
        "Not every run of this command had finished (or succeeded) when this report was written: the verdicts below "
        "use only the finished runs, and a comparison missing a method or a seed is marked as such. Missing: "
        + "; ".join(
            filter(
                None,
                [
                    ("grid " + ", ".join(grid_missing)) if grid_missing else "",
                    ("final runs " + ", ".join(seed_missing)) if seed_missing else "",
                    ("no lr chosen for " + ", ".join(not_run)) if not_run else "",
                ],
            )
        )
        + ".",
        "",
    ]


def write_report(
    out, args, settings, probe, start, grid_rec, methods, runs, verdicts, cpu, cpu_source, plots, grids
) -> str:
    k = args.eval_samples
    per_run = [
        "| method | seed | lr | final on-policy reward | reward change | final entropy | ID greedy | ID avg@k | "
        "OOD greedy | OOD avg@k | train CPU s |",
        "|" + "---|" * 11,
    ]
    for rs in runs.values():
        for r in rs:
            if r.get("error"):
                per_run.append(f"| {r['label']} | {r['seed']} | {r['lr']:g} | failed: {r['error']} |" + " |" * 7)
                continue
            s, sc = r.get("summary") or {}, r["scores"]
            cells = [s.get("reward_end"), s.get("reward_change"), s.get("entropy_end")] + [
                sc[sp].get(m, {}).get("mean") for sp in S.SPLITS for m in S.METRICS
            ]
            per_run.append(
                f"| {r['label']} | {r['seed']} | {r['lr']:g} | "
                + " | ".join("—" if v is None else f"{v:.3f}" for v in cells)
                + f" | {r['cpu_s']:.0f} |"
            )
    md = [
        "# Tiny reproduction of LUFFY's claims (CPU)",
        "",
        f"`exp_scripts/reproduce_tiny.py{command_flags(args)}`: every method starts from the same model "
        f"({start['label']}), trains {args.steps} steps ({args.batch_size} prompts x {args.n}) at its own learning "
        f"rate, "
        + (
            "fixed by --method-lr (no grid: see the table)"
            if all(len(g) == 1 for g in grids.values())
            else f"chosen on {args.n_val} validation problems with seed {args.grid_seed}"
        )
        + "; then seeds "
        f"{', '.join(map(str, settings['seeds']))} at that lr. Held-out: {args.n_test} in-distribution problems "
        f"(two-digit addition) and {args.n_ood} out-of-distribution problems ({args.ood_variant}), greedy pass@1 "
        f"and avg@{k} at T=0.6. Intervals: 95 %, over seeds and problems (see *Intervals*).",
        "",
        *partial_lines(grid_rec, runs),
        *regime_lines(args, probe),
        *pilot_lines(settings.get("pilot"), k),
        "## Claims",
        "",
        *S.claims_markdown(verdicts, k),
        "",
        *(
            [
                "## LUFFY and its family against on-policy GRPO, the start model and SFT",
                "",
                *S.family_markdown(verdicts["family"], k),
                "",
                *family_knob_lines(runs),
                "",
            ]
            if verdicts.get("family")
            else []
        ),
        "## Results (mean over seeds [95 % interval])",
        "",
        S.main_table(methods, start),
        "",
        f"On-policy reward = mean score of the policy's own samples over the first / last {args.window} steps "
        "(mean ± std over seeds); final entropy = mean over the last window; SFT has no on-policy samples.",
        "",
        f"## Learning-rate grid (validation avg@{k}, seed {args.grid_seed}; chosen in bold)",
        "",
        S.grid_table(grid_rec),
        "",
        *extension_notes(grid_rec),
        *S.grid_edge_notes(grid_rec),
        "",
        "## Start model",
        "",
        f"On-policy success on training prompts: {probe['correct']} of {probe['samples']} samples ({probe['rows']} "
        f"prompts x {probe['n']}, T={probe['temperature']}), pass rate {probe['accuracy']:.3f}. Teacher traces: "
        f"{probe['traces']['correct']} of {probe['traces']['rows']} training problems solved.",
        "",
        "## Out-of-distribution problems",
        "",
        f"`{args.ood_variant}` (luffy_pool/tiny/arith_task.py `OOD_VARIANTS`): additions whose operand lengths never "
        "occur in training (train, warm start, validation and test are all two-digit + two-digit), solved by the same "
        "kind of step-by-step trace. The paper's OOD sets (ARC-c, GPQA-diamond, MMLU-Pro) test whether reasoning "
        "learned on math transfers to problems outside the training distribution; here the question is the same at "
        "the scale of the task: does what a method learned carry over to problems its training data never showed.",
        "",
        "## Intervals",
        "",
        "Per method x[s][p] = seed s's score on problem p (greedy: 0/1, avg@k: fraction of k "
        "samples correct). 95 % interval = mean ± 1.96·SE, SE² = var(seed means)/S + var(problem means)/P "
        "(both sources a rerun redraws; slightly conservative). Differences between methods: the same on "
        "x_a − x_b paired by problem and seed position; entropy: t interval over seeds. A claim holds when the "
        "interval of its difference lies above 0, does not hold when below 0, else inconclusive. "
        "`exp_scripts/reproduce/stats.py`.",
        "",
        f"## CPU seconds (source: {cpu_source})",
        "",
        "```",
        "\n".join(f"{key}: {v}" for key, v in cpu.items()),
        "```",
        "",
        "## Every run",
        "",
        *per_run,
        "",
        "## Files",
        "",
        *[f"- plot: `{os.path.relpath(p, out)}`" for p in plots],
    ]
    record = {
        "settings": settings,
        "probe": probe,
        "start": start,
        "grid": grid_rec,
        "methods": methods,
        "claims": verdicts,
        "cpu_s": cpu,
        "plots": [os.path.relpath(p, out) for p in plots],
        "runs": [
            {k2: v for k2, v in r.items() if k2 != "scores"}
            | {"scores": {sp: {m: v["mean"] for m, v in r["scores"][sp].items()} for sp in S.SPLITS}}
            for rs in runs.values()
            for r in rs
            if not r.get("error")
        ],
    }
    return S.write_results(out, md, record)
