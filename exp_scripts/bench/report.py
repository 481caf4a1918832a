"""Print the step benchmark's tables, ratios and our phase breakdown; the last line is the headline.

The headline compares, on the fixed-length case, our fastest rank count with TRL's and the floor's
fastest thread count, so the ratio never flatters us by picking a baseline's bad setting. With
``--rounds N`` every contender runs once per round, rounds back to back: each round's ratio compares
runs minutes apart (the machine's speed drifts by up to 2x over tens of minutes), and the headline is
the median of the rounds' ratios.
"""

from __future__ import annotations

import math

from bench.common import headline_line, median, ratio, summarize, timed_steps

# Phases the trainer times inside ``timing_s/step``, in step order.
PHASES = ("update_weights", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor")


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _engine(run: dict):
    """Our rollout engine of a run (None when the result does not record it)."""
    return (run["result"].get("spec") or {}).get("rollout")


def best_run(runs: list[dict], case: str, contender: str):
    """The successful run of ``contender`` on ``case`` with the lowest median step time, or None."""
    done = [r for r in runs if r["case"] == case and r["contender"] == contender and r["result"] is not None]
    return min(done, key=lambda r: summarize(r["result"])["median_s"], default=None)


def rounds_of(runs: list[dict]) -> list[int]:
    return sorted({r.get("round", 0) for r in runs})


def best_medians(runs: list[dict], case: str) -> tuple[dict, dict]:
    """Each contender's best run on ``case`` (or None) and its median step time (NaN without a run)."""
    best = {c: best_run(runs, case, c) for c in ("ours", "trl", "floor")}
    return best, {c: summarize(run["result"])["median_s"] if run else math.nan for c, run in best.items()}


def case_ratios(runs: list[dict], case: str) -> tuple[float, float]:
    """(ours/TRL, ours/floor) of one case: each contender's best setting among ``runs``."""
    _, med = best_medians(runs, case)
    return ratio(med["ours"], med["trl"]), ratio(med["ours"], med["floor"])


def _median_finite(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return median(finite) if finite else math.nan


def phase_breakdown(result: dict) -> dict[str, float]:
    """Median over timed steps of each ``timing_s/*`` metric of ours, worker-side timings and the rest."""
    steps = timed_steps(result)
    keys = sorted({k for s in steps for k in s["metrics"] if k.startswith("timing_s/")})
    out = {k: median(s["metrics"].get(k) for s in steps) for k in keys}
    out["other (step - phases)"] = (
        median(
            s["metrics"].get("timing_s/step", math.nan) - sum(s["metrics"].get(f"timing_s/{p}", 0.0) for p in PHASES)
            for s in steps
        )
        if steps
        else math.nan
    )
    out["outside timing_s/step (driver logging, metrics)"] = median(
        s["wall_s"] - s["metrics"].get("timing_s/step", math.nan) for s in steps
    )
    # rollout_workers holds every rank's timings (a DataProto PerPart value); the slowest rank bounds gen.
    values = [
        max(w.get("timing_s/generate_worker", math.nan) for w in s["rollout_workers"])
        for s in steps
        if s.get("rollout_workers")
    ]
    if values:  # the weight push is its own stage (timing_s/update_weights, the slowest rank's timing_s/weight_sync)
        out["slowest rank timing_s/generate_worker (engine)"] = median(values)
    spreads = [
        max(w["timing_s/generate_worker"] for w in s["rollout_workers"])
        - min(w["timing_s/generate_worker"] for w in s["rollout_workers"])
        for s in steps
        if len(s.get("rollout_workers") or []) > 1
    ]
    if spreads:
        out["gen: slowest minus fastest rank"] = median(spreads)
    worker_gen = out.get("slowest rank timing_s/generate_worker (engine)")
    if worker_gen is not None and "timing_s/gen" in out:
        out["gen outside the slowest rank's worker call (driver, Ray)"] = out["timing_s/gen"] - worker_gen
    if "timing_s/update_actor_worker" in out and "timing_s/update_actor" in out:
        out["update outside the worker call (driver, Ray)"] = (
            out["timing_s/update_actor"] - out["timing_s/update_actor_worker"]
        )
    return out


def _label(run: dict, runs: list[dict]) -> str:
    return run["label"] + (f" r{run.get('round', 0) + 1}" if len(rounds_of(runs)) > 1 else "")


def _print_case_table(runs: list[dict], case: str) -> None:
    print(f"\n== {case} case: seconds per training step (median of timed steps) ==")
    print(
        f"{'contender':<22}{'s/step':>8}{'min':>8}{'max':>8}{'gen s':>8}{'reward s':>9}{'gen tok/step':>13}{'tok/s':>8}"
        f"{'foreign cores':>14}{'own cores':>10}{'cpu s/step':>11}{'startup s':>10}  threads"
    )
    for r in runs:
        if r["case"] != case:
            continue
        if r["result"] is None:
            print(f"{_label(r, runs):<22}  FAILED (see {r['log']})")
            continue
        s, res = summarize(r["result"]), r["result"]
        threads = (
            "1 per Ray worker + driver (OMP_NUM_THREADS=1)"
            if r["contender"] == "ours"
            else f"torch {res.get('torch_threads')} (OMP_NUM_THREADS={r['threads_env']})"
        )
        print(
            f"{_label(r, runs):<22}{_fmt(s['median_s']):>8}{_fmt(s['min_s']):>8}{_fmt(s['max_s']):>8}"
            f"{_fmt(s['median_gen_s']):>8}{_fmt(s['median_reward_s']):>9}{_fmt(s['gen_tokens_per_step'], 0):>13}{_fmt(s['tokens_per_s'], 0):>8}"
            f"{_fmt(s['foreign_cores'], 2):>14}{_fmt(s['own_cores'], 2):>10}{_fmt(s['cpu_s']):>11}{_fmt(res.get('startup_s'), 1):>10}  {threads}"
        )


def _print_ours_breakdown(runs: list[dict], case: str) -> None:
    for r in runs:
        if r["case"] != case or r["contender"] != "ours" or r["result"] is None:
            continue
        steps = timed_steps(r["result"])
        print(f"\n-- {case} {_label(r, runs)}: phase breakdown (median s over timed steps) --")
        for key, value in phase_breakdown(r["result"]).items():
            print(f"  {key:<62}{_fmt(value)}")
        throughput = median(s["metrics"].get("perf/throughput") for s in steps)
        print(f"  {'perf/throughput (verl: prompt+response tokens / s / rank)':<62}{_fmt(throughput, 1)}")
        print(
            f"  {'response_length/mean':<62}{_fmt(median(s['metrics'].get('response_length/mean') for s in steps), 1)}"
        )


def print_report(runs: list[dict], args) -> bool:
    """All tables, then the headline as the very last line; False when any contender failed."""
    cases = list(dict.fromkeys(r["case"] for r in runs))
    for case in cases:
        _print_case_table(runs, case)
    for case in cases:
        _print_ours_breakdown(runs, case)
    print("\n== ratios (best setting of each contender; < 1 means ours is faster) ==")
    headline = (None, None)
    for case in cases:
        best, med = best_medians(runs, case)
        ours, trl, floor = best["ours"], best["trl"], best["floor"]
        over_trl, over_floor = case_ratios(runs, case)
        print(
            f"{case}: ours {ours['label'] if ours else 'n/a'} {_fmt(med['ours'])} s, "
            f"TRL {trl['label'] if trl else 'n/a'} {_fmt(med['trl'])} s, "
            f"floor {floor['label'] if floor else 'n/a'} {_fmt(med['floor'])} s -> "
            f"ours/TRL={_fmt(over_trl, 2)} ours/floor={_fmt(over_floor, 2)}"
        )
        engines = sorted(
            {_engine(r) for r in runs if r["case"] == case and r["contender"] == "ours" and r["result"] is not None}
        )
        if len(engines) > 1:  # each engine's best rank count, against the same baselines
            for engine in engines:
                of_engine = [
                    r for r in runs if r["contender"] == "ours" and r["result"] is not None and _engine(r) == engine
                ]
                mine = best_run(of_engine, case, "ours")
                m = summarize(mine["result"])["median_s"]
                print(
                    f"  {case} with rollout {engine}: {mine['label']} {_fmt(m)} s -> "
                    f"ours/TRL={_fmt(ratio(m, med['trl']), 2)} ours/floor={_fmt(ratio(m, med['floor']), 2)}"
                )
        rounds = rounds_of([r for r in runs if r["case"] == case])
        if len(rounds) > 1:  # each round against itself, then the median over rounds
            per_round = [case_ratios([r for r in runs if r.get("round", 0) == k], case) for k in rounds]
            for k, (t, f) in zip(rounds, per_round):
                print(f"  {case} round {k + 1}: ours/TRL={_fmt(t, 2)} ours/floor={_fmt(f, 2)}")
            over_trl = _median_finite([t for t, _ in per_round])
            over_floor = _median_finite([f for _, f in per_round])
            print(
                f"  {case} median over {len(rounds)} rounds: ours/TRL={_fmt(over_trl, 2)} ours/floor={_fmt(over_floor, 2)}"
            )
        if case == "fixed":
            headline = (over_trl, over_floor)
    if "fixed" not in cases:
        print("(the fixed-length case was not run: the headline below is n/a)")
    print(
        "foreign cores = other processes' CPU use during the timed steps (machine busy time minus our process "
        "tree); own cores / cpu s/step = CPU our process tree used (per second / per step); anchors (docs/CPU_STACK.md §5, quiet machine, fixed length): TRL 0.93 s/step at 2 threads, "
        "1.24-1.31 at 1 thread; minimal loop 0.75 / 0.98-1.03 s."
    )
    print(headline_line(*headline), flush=True)
    return all(r["result"] is not None for r in runs)
