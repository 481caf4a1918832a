"""LUFFY's claims at tiny scale on CPU, in one command: each method at its own best learning rate, fresh seeds,
500+ held-out problems in and out of distribution, 95 % intervals.

Builds the tiny random model and a synthetic arithmetic task (two-digit addition), warms the model with a
short SFT on a disjoint split (``--warm-steps``: the "weak start"), probes the start model's on-policy
success on training prompts, then for every method (default: on-policy GRPO, LUFFY, LUFFY without policy
shaping, SFT; configs ``luffy_pool/config/tiny_cpu_*.yaml``):

1. **learning-rate grid**: one run per value of ``--lr-grid`` with ``--grid-seed``, each scored on the
   validation split (disjoint from train, test and OOD) as avg@k at T=0.6; the best value is chosen (ties:
   the smaller lr). Only the lr varies; ``--method-lr NAME=LR`` fixes a method's lr instead (no grid);
2. **fresh seeds** (``--seeds``) at the chosen lr, each final model scored with ``eval_scripts/generate_vllm.py``
   on ``--n-test`` in-distribution and ``--n-ood`` out-of-distribution problems (``--ood-variant``), greedy
   pass@1 and avg@k at T=0.6, with 95 % intervals over seeds and problems (``reproduce/stats.py``).

Writes into ``--out``: ``results.md`` / ``results.json`` (the claims with verdicts, the table, the grid, per
run numbers, CPU seconds), ``plots/*.png`` (mean over seeds with min–max band: on-policy reward, entropy;
held-out ID/OOD bars) and ``grid/<method>/lr<lr>/``, ``seed<k>/<method>/`` with metrics, logs and models.
CPU seconds of every process tree are measured from /proc. ``--reuse`` keeps finished runs (resumable).

    .venv/bin/python exp_scripts/reproduce_tiny.py [--quick] [--out DIR] [--reuse]

``--quick`` (within 30 CPU-minutes): on-policy GRPO, LUFFY, SFT, HPT and CHORD-φ at fixed learning rates (no grid),
100 steps, 2 seeds, 200 + 100 held-out problems: claim (1) and two family members. The default command stays under
30 CPU-minutes (it prints its CPU total). Measured numbers: docs/methods.md ("Baselines and the tiny reproduction"),
docs/reproduce_tiny/results.md and docs/reproduce_tiny_quick/results.md.

``--methods family``: LUFFY's family (HPT, SRFT, CHORD-φ, ExGRPO, ReLIFT, UFT, Prefix-RFT, RL-PLUS, QuestA, SDPO,
SDFT; AMPO is not run, reproduce/methods.py ``NOT_RUN``) beside on-policy GRPO, LUFFY and SFT, each with its own
recipe's keys from ``exp_scripts/train_<method>.sh`` scaled to the tiny run (reproduce/recipes.py).

``--pilot`` / ``--steps pilot``: the run length is measured, not guessed (reproduce/pilot.py): SFT on the teacher
traces at doubling lengths (``--pilot-start``, up to ``--pilot-max-steps``) until its validation score moves by
``--pilot-move`` (5 points) from the start model's; every method then trains that long. ``--pilot`` runs only that.
A grid whose best lr is at an edge is extended by one point beyond it, up to ``--grid-extend`` times
(reproduce/grid.py). Every paired difference reports its 80 %-power detectable difference, 2.8 x its SE.

``--preset no_reward`` (a partial run: docs/reproduce_tiny_no_reward/): the regime of LUFFY's first claim, where
on-policy RL finds no reward at all. The same task with a shorter warm start (``NO_REWARD['warm_steps']`` SFT steps
instead of 160): the start model solves under 1 % of its on-policy samples on training prompts (probed on
``--probe-rows`` prompts x n; the script stops with an error when the probe reaches 1 %), while every teacher trace of
the training split solves its problem (checked and printed). Defaults: ``--methods family``, ``--steps pilot``, RL lr
grid 1e-5 / 3e-5 / 1e-4 and SFT 1e-4 / 3e-4 / 1e-3 (each extended at an edge) on 128 validation problems, fresh seeds
1, 2, 3, 200 ID + 200 OOD held-out problems; every other setting and the protocol as the default command (budget: 4
CPU-hours at a pilot length of ~100 steps; the script prints its CPU total). Flags given explicitly win.

``--report-only``: run nothing, report what is finished in ``--out`` (a run still going on elsewhere, or cut short),
marked PARTIAL with the missing runs listed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for _path in (HERE, REPO):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from reproduce.evaluate import evaluate_model  # noqa: E402
from reproduce.grid import grid_run_dir, run_grid  # noqa: E402
from reproduce.methods import FAMILY, METHODS, RunSettings, parse_methods  # noqa: E402
from reproduce.pilot import pilot_lengths, run_pilot  # noqa: E402
from reproduce.regime import NO_REWARD_MAX_PASS, check_no_reward, trace_pass_rate  # noqa: E402
from reproduce.results_md import write_report  # noqa: E402
from reproduce.runner import WARM_SFT, Meter, child_env, train_method, training_summary, warm_start  # noqa: E402
from reproduce.seeds_report import plot_seed_curves  # noqa: E402
from reproduce.task import prepare_task, split_scores  # noqa: E402
from reproduce import summary as S  # noqa: E402
from verl.utils.tracking import read_metrics_jsonl  # noqa: E402

# The probe samples the start model as on-policy GRPO first would: at the tiny configs' rollout temperature.
ROLLOUT_TEMPERATURE = 1.0
# --quick: claim (1) only, with SFT and two family members beside GRPO and LUFFY (within 30 CPU-minutes). Its budget
# goes into fewer, longer runs: no grid (every RL method at 1e-4, LUFFY's pick in the default run's grid; SFT at
# 3e-4, its pick in the no-reward grid), 100 steps instead of 50, 2 seeds, its own smaller held-out splits (200 ID +
# 100 OOD problems). HPT (SFT on the trace when a group fails, else LUFFY's RL) and CHORD-φ (a fixed SFT weight
# with the φ token weight) are the two members whose mixing of SFT into RL differs most.
QUICK = {
    "methods": "on_policy,luffy,sft,hpt,chord",
    "method_lr": ["on_policy=1e-4", "luffy=1e-4", "sft=3e-4", "hpt=1e-4", "chord=1e-4"],
    "steps": "100",
    "seeds": "1,2",
    "n_test": 200,
    "n_ood": 100,
    "n_val": 64,
    "out": os.path.join(REPO, "outputs", "reproduce_tiny_quick"),
}
# --preset no_reward: the start model finds (almost) no reward on-policy (module docstring). The run length is the
# pilot's (``reproduce/pilot.py``): the shortest that lets SFT move the validation score by 5 points. RL lr grid of 3
# points (extended at an edge), SFT's 3, 3 fresh seeds, 200 + 200 held-out problems, 128 validation problems; the
# probe takes 128 prompts (1,024 samples) so that 1 % is 10 samples.
NO_REWARD = {
    "methods": "family",
    "warm_steps": 100,
    "steps": "pilot",
    "lr_grid": "1e-5,3e-5,1e-4",
    "sft_lr_grid": "1e-4,3e-4,1e-3",
    "seeds": "1,2,3",
    "n_test": 200,
    "n_ood": 200,
    "n_val": 128,
    "probe_rows": 128,
    "out": os.path.join(REPO, "outputs", "reproduce_tiny_no_reward"),
}
PRESETS = {"quick": QUICK, "no_reward": NO_REWARD}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python exp_scripts/reproduce_tiny.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help=f"the within-30-CPU-minute preset: {QUICK}")
    ap.add_argument(
        "--preset",
        choices=("no_reward",),
        default=None,
        help=f"no_reward: the regime where on-policy RL finds no reward (start model's on-policy pass rate "
        f"< {NO_REWARD_MAX_PASS * 100:.0f}%%, checked; the family beside GRPO, LUFFY and SFT at the pilot's "
        f"length): {NO_REWARD}",
    )
    ap.add_argument("--out", default=os.path.join(REPO, "outputs", "reproduce_tiny"), help="output folder")
    ap.add_argument(
        "--methods",
        default="claims",
        help="claims (the four the paper's claims need), family (LUFFY's family beside GRPO, LUFFY and "
        f"SFT), main, all, or a comma list of {', '.join(METHODS)}",
    )
    ap.add_argument(
        "--lr-grid", default="1e-5,3e-5,1e-4", help="learning rates tried for every RL method (seed --grid-seed)"
    )
    ap.add_argument(
        "--sft-lr-grid",
        default="1e-4,3e-4,1e-3",
        help="learning rates tried for SFT (its loss is not the RL methods': the grid is centred on its own scale)",
    )
    ap.add_argument(
        "--method-lr",
        action="append",
        default=[],
        metavar="NAME=LR",
        help="fix a method's learning rate instead of searching the grid (repeatable)",
    )
    ap.add_argument("--grid-seed", type=int, default=0, help="run seed of the learning-rate grid")
    ap.add_argument("--seeds", default="1,2,3", help="fresh run seeds at the chosen learning rate")
    ap.add_argument(
        "--warm-steps",
        type=int,
        default=160,
        help="SFT steps of the warm start on the disjoint warm split (0 = start from the random model)",
    )
    ap.add_argument("--n-warm", type=int, default=2048, help="problems of the warm split (disjoint from the others)")
    ap.add_argument(
        "--steps",
        default="50",
        help="training steps of every method (SFT: optimizer steps), or 'pilot': the pilot's length (--pilot)",
    )
    ap.add_argument(
        "--pilot",
        action="store_true",
        help="run only the pilot (SFT at doubling lengths until the validation score moves by --pilot-move) and "
        "stop; --steps pilot runs it first, then the comparison at its length",
    )
    ap.add_argument("--pilot-start", type=int, default=50, help="the pilot's first length (steps), doubled")
    ap.add_argument("--pilot-max-steps", type=int, default=1600, help="the pilot's longest length (steps)")
    ap.add_argument(
        "--pilot-move", type=float, default=0.05, help="validation avg@k move from the start that ends the pilot"
    )
    ap.add_argument(
        "--grid-extend",
        type=int,
        default=2,
        help="times a method's grid is extended by one lr beyond the edge its best point sits on",
    )
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per RL step = traces per SFT step")
    ap.add_argument(
        "--mini-batches",
        type=int,
        default=2,
        help="optimizer updates per RL step (LUFFY: 2, 128 prompts in mini-batches of 64)",
    )
    ap.add_argument("--n", type=int, default=8, help="group size (LUFFY: 1 teacher trace + n-1 own samples)")
    ap.add_argument("--response-length", type=int, default=48, help="max new tokens in training (traces <= 40)")
    ap.add_argument("--eval-max-tokens", type=int, default=64, help="max new tokens in evaluation (OOD traces <= 52)")
    ap.add_argument("--max-prompt-length", type=int, default=128, help="prompt token budget")
    ap.add_argument("--level", type=int, default=2, help="task difficulty (operand digits, luffy_pool.tiny)")
    ap.add_argument("--ops", default="+", help="operators of the task, e.g. '+' or '+*'")
    ap.add_argument("--n-train", type=int, default=512, help="training problems")
    ap.add_argument("--n-val", type=int, default=256, help="validation problems (learning-rate choice)")
    ap.add_argument("--n-test", type=int, default=500, help="held-out in-distribution problems")
    ap.add_argument("--n-ood", type=int, default=500, help="held-out out-of-distribution problems")
    ap.add_argument(
        "--ood-variant", default="mixed_digits", help="OOD problems (luffy_pool.tiny.arith_task.OOD_VARIANTS)"
    )
    ap.add_argument(
        "--system-prompt",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the task's system prompt (the measured weak-start regime has it)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the tiny model and the task")
    ap.add_argument("--rollout", choices=("vllm", "hf"), default="hf", help="rollout and eval engine")
    ap.add_argument("--ranks", type=int, default=1, help="FSDP ranks of the RL runs (CPU worker processes)")
    ap.add_argument("--val-every", type=int, default=-1, help="in-training validation (val split) every K RL steps")
    ap.add_argument("--eval-samples", type=int, default=4, help="k of avg@k at T=0.6 (validation and held-out)")
    ap.add_argument("--probe-rows", type=int, default=64, help="training prompts sampled to probe the start model")
    ap.add_argument("--window", type=int, default=25, help="steps averaged for the reward at the start / end of a run")
    ap.add_argument("--smooth", type=int, default=10, help="moving-average window of the plotted curves (steps)")
    ap.add_argument(
        "--run-timeout", type=float, default=None, help="seconds before one training/eval process is stopped"
    )
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep runs and evaluations already finished in --out with the same command (resume a partial run)",
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: report the runs and evaluations already finished in --out with the same command "
        "(results.md is marked partial and lists what is missing; the same command with --reuse "
        "finishes it)",
    )
    return ap


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """``--quick`` / ``--preset NAME`` change the defaults only: flags given explicitly still win."""
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    preset = ap.parse_known_args(argv)[0]
    if preset.quick and preset.preset:
        ap.error(f"--quick and --preset {preset.preset}: choose one")
    chosen = PRESETS.get("quick" if preset.quick else preset.preset)
    if chosen is not None:
        ap.set_defaults(**{**chosen, "method_lr": list(chosen.get("method_lr", []))})  # a copy: --method-lr appends
    return ap.parse_args(argv)


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds: expected a comma list of integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: expected distinct integers, got {text!r}")
    return seeds


def parse_steps(text) -> Optional[int]:
    """``--steps``: a positive integer, or ``pilot`` (None: the pilot's length)."""
    if str(text).strip() == "pilot":
        return None
    try:
        steps = int(text)
    except ValueError:
        raise ValueError(f"--steps: expected a positive integer or 'pilot', got {text!r}") from None
    if steps < 1:
        raise ValueError(f"--steps: expected a positive integer or 'pilot', got {text!r}")
    return steps


def parse_grid(flag: str, text: str) -> list[float]:
    try:
        grid = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"{flag}: expected a comma list of numbers, got {text!r}") from None
    if not grid or min(grid) <= 0:
        raise ValueError(f"{flag}: expected positive learning rates, got {text!r}")
    return grid


def lr_grids(
    names: Sequence[str], grid_text: str, fixed: Sequence[str], sft_grid_text: Optional[str] = None
) -> dict[str, list[float]]:
    """Per method the learning rates to try: ``--lr-grid`` for RL methods, ``--sft-lr-grid`` for SFT (sorted,
    distinct), or the one ``--method-lr`` value."""
    grid = parse_grid("--lr-grid", grid_text)
    sft_grid = parse_grid("--sft-lr-grid", sft_grid_text) if sft_grid_text is not None else grid
    try:
        fixed_lr = {k.strip(): float(v) for k, v in (item.split("=", 1) for item in fixed)}
    except ValueError:
        raise ValueError(f"--method-lr: expected NAME=LR, got {list(fixed)}") from None
    unknown = sorted(set(fixed_lr) - set(names))
    if unknown:
        raise ValueError(f"--method-lr: {unknown} not among --methods {list(names)}")
    return {n: [fixed_lr[n]] if n in fixed_lr else (sft_grid if METHODS[n].kind == "sft" else grid) for n in names}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        names = parse_methods(args.methods)
        seeds = parse_seeds(args.seeds)
        grids = lr_grids(names, args.lr_grid, args.method_lr, args.sft_lr_grid)
        steps = parse_steps(args.steps)
    except ValueError as exc:
        build_parser().error(str(exc))
    names.sort(key=lambda n: METHODS[n].kind != "sft")  # SFT first: SFT then RL starts from its model
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    env = child_env()
    meter = Meter(env, args.run_timeout, reuse=args.reuse, only_finished=args.report_only)
    t_all = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[reproduce_tiny {time.perf_counter() - t_all:6.0f}s] {msg}", flush=True)

    paths = prepare_task(args, out, names)
    say(
        f"task: {args.n_train} train / {args.n_val} val / {args.n_test} test / {args.n_ood} OOD ({args.ood_variant}) in {out}/data"
    )
    start_model, start_label = paths["model"], "Random model"
    if args.warm_steps > 0:
        start_model = warm_start(paths["model"], paths["warm"], args.warm_steps, os.path.join(out, "warm_start"), meter)
        start_label = f"Start model ({args.warm_steps} warm SFT steps)"
        say(f"warm start: {args.warm_steps} SFT steps ({meter.cpu['warm_start']:.0f} CPU s)")
    eval_kw = dict(
        max_tokens=args.eval_max_tokens,
        env=env,
        rollout=args.rollout,
        timeout_s=args.run_timeout,
        reuse=args.reuse or args.report_only,
        only_finished=args.report_only,
    )
    # One process scores the start model: the on-policy probe on training prompts, then the held-out files.
    start_ev = evaluate_model(
        start_model,
        paths["eval"],
        os.path.join(out, "start_model", "eval"),
        eval_samples=args.eval_samples,
        **eval_kw,
        probe=dict(
            train_file=paths["train"],
            n=args.n,
            rows=args.probe_rows,
            max_tokens=args.response_length,
            temperature=ROLLOUT_TEMPERATURE,
        ),
    )
    probe = start_ev["probe"]
    say(
        f"start model: {probe['correct']} of {probe['samples']} on-policy samples correct: pass rate {probe['accuracy']:.3f}"
    )
    traces = trace_pass_rate(paths["train"])
    probe["traces"] = traces
    say(f"teacher traces: {traces['correct']} of {traces['rows']} training problems solved ({traces['accuracy']:.3f})")
    if args.preset == "no_reward":
        try:
            check_no_reward(probe)
        except ValueError as exc:
            print(f"reproduce_tiny: ERROR: {exc}", file=sys.stderr, flush=True)
            return 2
        say(f"no-reward regime: on-policy pass rate {probe['accuracy']:.2%} < {NO_REWARD_MAX_PASS:.0%}")
    start_scores = split_scores(start_ev, args.n_test)
    start = {
        "label": start_label,
        **{
            sp: {m: S.interval([list(v["per_problem"].values())]) for m, v in start_scores[sp].items()}
            for sp in S.SPLITS
        },
    }
    meter.cpu["start_model"] = start_ev["cpu_s"]

    def settings_for(name: str, seed: int, lr: float, n_steps: Optional[int] = None) -> RunSettings:
        return RunSettings(
            model_dir=start_model,
            train_file=paths[METHODS[name].train_split],
            test_file=paths["val"],
            steps=n_steps or steps,
            batch_size=args.batch_size,
            n=args.n,
            response_length=args.response_length,
            max_prompt_length=args.max_prompt_length,
            lr=lr,
            rollout=args.rollout,
            ranks=args.ranks,
            seed=seed,
            val_every=args.val_every,
            mini_batches=args.mini_batches,
        )

    def add_eval_cpu(ev: dict) -> None:
        meter.cpu["evaluation"] = meter.cpu.get("evaluation", 0.0) + ev.get("cpu_s", 0.0)

    def val_score(model_dir: str, eval_dir: str) -> float:
        ev = evaluate_model(
            model_dir,
            paths["val"],
            eval_dir,
            **dict(eval_kw, eval_samples=args.eval_samples, greedy=args.eval_samples <= 0),
        )
        add_eval_cpu(ev)
        return ev["sampled"]["accuracy"] if ev["sampled"] else ev["greedy"]["accuracy"]

    # 0. pilot: the run length at which SFT on the traces moves the validation score (reproduce/pilot.py)
    pilot, pilot_dir = None, os.path.join(out, "pilot")
    if steps is None and args.report_only and os.path.exists(os.path.join(pilot_dir, "pilot.json")):
        with open(os.path.join(pilot_dir, "pilot.json")) as f:  # a finished pilot: report-only reruns nothing
            pilot = json.load(f)
        steps = pilot["steps"]
    if args.pilot or steps is None:
        train_cpu = meter.cpu.get("training", 0.0)
        start_val = val_score(start_model, os.path.join(pilot_dir, "start_eval_val"))

        def score_sft(n_steps: int, lr: float) -> Optional[float]:
            run_dir = os.path.join(pilot_dir, f"sft_{n_steps}", f"lr{lr:g}")
            try:
                run = train_method("sft", settings_for("sft", args.grid_seed, lr, n_steps), run_dir, meter)
                return val_score(run["hf_dir"], os.path.join(run_dir, "eval_val"))
            except (RuntimeError, OSError, KeyError, ValueError) as exc:
                say(f"pilot: SFT {n_steps} steps lr {lr:g}: FAILED: {exc}")
                return None

        pilot = run_pilot(
            pilot_lengths(args.pilot_start, args.pilot_max_steps),
            grids.get("sft") or parse_grid("--sft-lr-grid", args.sft_lr_grid),
            start_val,
            args.pilot_move,
            score_sft,
            pilot_dir,
            say,
            args.grid_extend,
        )
        meter.cpu["pilot"] = meter.cpu.get("training", 0.0) - train_cpu  # its SFT runs, apart from the comparison's
        meter.cpu["training"] = train_cpu
        say(
            f"pilot: {pilot['steps']} steps ({'reached' if pilot['reached'] else 'NOT reached'} a "
            f"{args.pilot_move:.2f} move from the start's {start_val:.3f}); {pilot_dir}/pilot.json"
        )
        if args.pilot:
            say(
                f"pilot CPU s: {meter.cpu['pilot']:.0f} SFT training, {meter.cpu.get('evaluation', 0.0):.0f} "
                f"evaluation (and {meter.cpu.get('warm_start', 0.0) + meter.cpu['start_model']:.0f} warm start + "
                "start model)"
            )
            return 0 if pilot["steps"] else 1
        steps = pilot["steps"]
        if steps is None:
            print("reproduce_tiny: ERROR: every pilot run failed", file=sys.stderr, flush=True)
            return 2
    args.steps = steps

    # 1. learning-rate grid on the validation split, seed --grid-seed (extended at an edge: reproduce/grid.py)
    grid_rec: dict = {}
    grid_sft: dict = {}  # lr -> SFT model of the grid seed (SFT then RL's start)
    for name in names:

        def score_lr(lr: float, name: str = name) -> tuple[Optional[float], float]:
            run_dir = grid_run_dir(out, name, lr)
            try:
                sft_model = grid_sft.get(grid_rec.get("sft", {}).get("chosen"))
                run = train_method(name, settings_for(name, args.grid_seed, lr), run_dir, meter, sft_model)
                if name == "sft":
                    grid_sft[lr] = run["hf_dir"]
                score = val_score(run["hf_dir"], os.path.join(run_dir, "eval_val"))
            except (RuntimeError, OSError, KeyError, ValueError) as exc:
                say(f"grid: {name} lr {lr:g}: FAILED: {exc}")
                return None, 0.0
            say(f"grid: {name} lr {lr:g}: val avg@{args.eval_samples} {score:.3f} ({run['cpu_s']:.0f} CPU s)")
            return score, run["cpu_s"]

        grid_rec[name] = run_grid(METHODS[name].label, grids[name], score_lr, say, args.grid_extend)
        grids[name] = grid_rec[name]["lrs"]

    # 2. fresh seeds at the chosen learning rate, scored on the held-out ID and OOD problems
    runs: dict[str, list[dict]] = {n: [] for n in names if grid_rec[n]["chosen"] is not None}
    curves: dict[str, list] = {}
    for seed in seeds:
        sft_seed_model = None
        for name in runs:
            lr = grid_rec[name]["chosen"]
            run_dir = os.path.join(out, f"seed{seed}", name)
            row = {"name": name, "label": METHODS[name].label, "seed": seed, "lr": lr}
            try:
                run = train_method(name, settings_for(name, seed, lr), run_dir, meter, sft_seed_model)
                if name == "sft":
                    sft_seed_model = run["hf_dir"]
                row.update(wall_s=run["wall_s"], cpu_s=run["cpu_s"], metrics_file=run["metrics_file"])
                if run["metrics_file"]:
                    row.update(training_summary(run["metrics_file"], args.window))
                    curves.setdefault(row["label"], []).append(read_metrics_jsonl(run["metrics_file"]))
                ev = evaluate_model(
                    run["hf_dir"],
                    paths["eval"],
                    os.path.join(run_dir, "eval"),
                    **dict(eval_kw, eval_samples=args.eval_samples),
                )
                add_eval_cpu(ev)
                row["scores"] = split_scores(ev, args.n_test)
                row["eval_cpu_s"] = ev["cpu_s"]
            except (RuntimeError, OSError, KeyError, ValueError) as exc:
                row["error"] = str(exc)
                say(f"seed {seed}: {name}: FAILED: {exc}")
            else:
                sc = row["scores"]
                say(
                    f"seed {seed}: {name} (lr {lr:g}): {row['cpu_s']:.0f} CPU s; ID avg@{args.eval_samples} "
                    f"{sc['id']['avg']['mean']:.3f}, OOD {sc['ood']['avg']['mean']:.3f}"
                )
            runs[name].append(row)

    methods = {n: S.method_summary(METHODS[n].label, rs, grid_rec[n]) for n, rs in runs.items()}
    verdicts = S.claims(runs, methods, probe, start_scores)
    if any(n in FAMILY for n in runs):  # LUFFY and each family method against GRPO, the start model and SFT
        verdicts["family"] = S.family_claims(
            runs, {n: METHODS[n].label for n in runs if n == "luffy" or n in FAMILY}, start_scores
        )
    plots_dir = os.path.join(out, "plots")
    os.makedirs(plots_dir, exist_ok=True)  # no curve to plot (a partial report) still gets its bar plot
    plots = plot_seed_curves(curves, plots_dir, smooth=args.smooth) if curves else []
    bar = S.plot_held_out(methods, start, plots_dir, args.eval_samples)
    plots += [bar] if bar else []
    cpu = {k: round(v, 1) for k, v in meter.cpu.items()}
    cpu["total"] = round(sum(meter.cpu.values()), 1)
    settings = {
        **{k: v for k, v in vars(args).items() if k != "out"},
        "out": out,
        "methods": names,
        "seeds": seeds,
        "lr_grids": grids,
        "warm_start_recipe": WARM_SFT,
        "pilot": pilot,
        "seed_use": "tiny model / task: --seed; run seed s: RL data.seed=47+s, trainer.seed=1+s, "
        "rollout.seed=s; SFT trainer.seed=47+s",
    }
    md = write_report(
        out, args, settings, probe, start, grid_rec, methods, runs, verdicts, cpu, meter.cpu_source, plots, grids
    )
    say(f"done in {time.perf_counter() - t_all:.0f} s wall; CPU s: {cpu} (total {cpu['total'] / 60:.1f} CPU-min)")
    print(S.main_table(methods, start))
    print("\n".join(S.claims_markdown(verdicts, args.eval_samples)))
    if verdicts.get("family"):
        print("\n".join(S.family_markdown(verdicts["family"], args.eval_samples)))
    print(f"results: {md}")
    for path in plots:
        print(f"plot: {path}")
    return 1 if any(r.get("error") for rs in runs.values() for r in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
