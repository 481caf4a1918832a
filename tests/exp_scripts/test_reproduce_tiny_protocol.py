"""reproduce_tiny.py's protocol (issue #27): the 95 % intervals (hand-computed values), the learning-rate choice,
the OOD split (disjoint, outside the training lengths), the claims' verdicts and the results.json schema."""

from __future__ import annotations

import json
import math
import os
import sys

import pandas as pd
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
if EXP not in sys.path:
    sys.path.insert(0, EXP)

from reproduce import summary as S  # noqa: E402
from reproduce.stats import choose_lr, difference, interval, problem_scores, score_matrix, verdict  # noqa: E402


# ------------------------------------------------------------------------------ intervals
def test_interval_of_two_seeds_and_four_problems_by_hand():
    # seed means 0.5, 0.75 -> var 0.03125, /2 = 0.015625; problem means 1, .5, 1, 0 -> var 0.6875/3, /4 = 0.0572917
    iv = interval([[1, 0, 1, 0], [1, 1, 1, 0]])
    se = math.sqrt(0.015625 + 0.6875 / 12)
    assert iv["mean"] == pytest.approx(0.625) and iv["se"] == pytest.approx(se)
    assert iv["lo"] == pytest.approx(0.625 - 1.959964 * se, abs=1e-6)
    assert iv["hi"] == 1.0  # 0.625 + 0.529 is clipped to a score's range
    assert (iv["seeds"], iv["problems"]) == (2, 4)


def test_interval_of_one_seed_is_the_problem_interval():
    iv = interval([[0.5, 0.25, 0.0, 0.25]])  # avg@4 fractions; mean 0.25, var (0.0625+0+0.0625+0)/3
    se = math.sqrt((0.0625 + 0.0625) / 3 / 4)
    assert iv["mean"] == pytest.approx(0.25) and iv["se"] == pytest.approx(se)
    assert (iv["lo"], iv["hi"]) == pytest.approx((0.25 - 1.959964 * se, 0.25 + 1.959964 * se), abs=1e-6)


def test_interval_rejects_ragged_or_empty_input():
    with pytest.raises(ValueError, match="same problems"):
        interval([[1, 0], [1]])
    with pytest.raises(ValueError, match="at least one"):
        interval([])


def test_difference_is_paired_by_seed_and_problem_and_gets_a_verdict():
    a = [[1, 1, 1, 0], [1, 1, 0, 1]]
    b = [[0, 1, 0, 0], [0, 0, 0, 1]]
    d = difference(a, b)  # d = [[1,0,1,0],[1,1,0,0]]: seed means .5, .5 (var 0); problem means 1, .5, .5, 0
    se = math.sqrt(0 + (0.25 + 0 + 0 + 0.25) / 3 / 4)
    assert d["mean"] == pytest.approx(0.5) and d["se"] == pytest.approx(se)
    assert d["effect_over_noise"] == pytest.approx(0.5 / se)
    assert verdict(d) == "holds"  # 0.5 - 1.96 * 0.204 > 0
    assert verdict(difference(b, a)) == "does not hold"
    assert verdict({"lo": -0.1, "hi": 0.2}) == "inconclusive"


def test_problem_scores_average_the_samples_of_each_row(tmp_path):
    path = tmp_path / "out.jsonl"
    recs = [
        {"row": 0, "correct": True},
        {"row": 0, "correct": False},
        {"row": 1, "correct": False},
        {"row": 1, "correct": False},
        {"row": 2, "correct": True},
        {"row": 2, "correct": True},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert problem_scores(str(path)) == {0: 0.5, 1: 0.0, 2: 1.0}
    assert score_matrix([{0: 1.0, 1: 0.0}, {1: 0.5, 0: 0.5}]) == [[1.0, 0.0], [0.5, 0.5]]
    with pytest.raises(ValueError, match="different problems"):
        score_matrix([{0: 1.0}, {1: 1.0}])


# ------------------------------------------------------------------------------ learning-rate choice
def test_choose_lr_takes_the_best_validation_score():
    assert choose_lr({1e-4: 0.10, 3e-4: 0.25, 1e-3: 0.05}) == 3e-4


def test_choose_lr_breaks_ties_towards_the_smaller_lr_and_skips_failed_runs():
    assert choose_lr({1e-3: 0.2, 1e-4: 0.2, 3e-4: 0.1}) == 1e-4
    assert choose_lr({1e-4: None, 3e-4: 0.0, 1e-3: float("nan")}) == 3e-4
    with pytest.raises(ValueError, match="no learning rate"):
        choose_lr({1e-4: None})


def test_lr_grids_give_every_method_the_grid_of_its_kind_unless_fixed():
    from reproduce_tiny import lr_grids

    grids = lr_grids(["sft", "luffy"], "3e-4,1e-4,1e-3,1e-4", ["luffy=2e-4"])
    assert grids == {"sft": [1e-4, 3e-4, 1e-3], "luffy": [2e-4]}
    grids = lr_grids(["sft", "luffy", "on_policy"], "1e-4,3e-5", ["luffy=2e-4"], "3e-3,1e-3")
    assert grids == {"sft": [1e-3, 3e-3], "luffy": [2e-4], "on_policy": [3e-5, 1e-4]}
    with pytest.raises(ValueError, match="not among"):
        lr_grids(["sft"], "1e-4", ["luffy=1e-4"])
    with pytest.raises(ValueError, match="positive"):
        lr_grids(["sft"], "0,1e-4", [])


def test_quick_changes_defaults_but_explicit_flags_win():
    from reproduce_tiny import QUICK, parse_args

    quick = parse_args(["--quick"])
    assert quick.methods == QUICK["methods"] and quick.n_test == QUICK["n_test"]
    assert parse_args(["--quick", "--n-test", "7"]).n_test == 7
    full = parse_args([])
    assert full.methods == "claims" and full.n_test >= 500 and full.n_ood >= 500 and full.eval_samples >= 4
    for text in (full.lr_grid, full.sft_lr_grid):  # the protocol: at least 3 values spanning 10x
        grid = sorted(float(x) for x in text.split(","))
        assert len(grid) >= 3 and grid[-1] / grid[0] >= 10 - 1e-9  # 3e-4 / 3e-5 is 9.999... in floats


def test_no_reward_preset_changes_defaults_and_refuses_to_combine_with_quick(capsys):
    from reproduce_tiny import NO_REWARD, parse_args

    a = parse_args(["--preset", "no_reward"])
    assert (a.preset, a.methods, a.warm_steps, a.seeds, a.n_test, a.n_ood, a.steps) == (
        "no_reward",
        "family",
        100,
        "1,2,3",
        200,
        200,
        "pilot",  # the run length is the pilot's
    )
    assert a.lr_grid == NO_REWARD["lr_grid"] and a.probe_rows == 128 and a.out.endswith("reproduce_tiny_no_reward")
    assert len(a.lr_grid.split(",")) >= 3 and len(a.sft_lr_grid.split(",")) >= 3
    assert a.level == parse_args([]).level  # the task is the default command's
    assert parse_args(["--preset", "no_reward", "--warm-steps", "60", "--methods", "claims"]).warm_steps == 60
    with pytest.raises(SystemExit):
        parse_args(["--quick", "--preset", "no_reward"])
    assert "choose one" in capsys.readouterr().err


def test_no_reward_check_refuses_a_start_model_that_finds_one_percent():
    from reproduce.regime import check_no_reward

    check_no_reward({"correct": 10, "samples": 1025, "accuracy": 10 / 1025})
    with pytest.raises(ValueError, match=r"solves 11 of 1024 .*\(1\.07%\), not under 1%"):
        check_no_reward({"correct": 11, "samples": 1024, "accuracy": 11 / 1024})
    with pytest.raises(ValueError, match="not under 1%"):
        check_no_reward({"correct": 1, "samples": 100, "accuracy": 0.01})  # the bound itself is refused
    with pytest.raises(ValueError, match="no samples"):
        check_no_reward({"correct": 0, "samples": 0, "accuracy": 0.0})


def test_teacher_traces_of_the_task_solve_their_problems_and_a_wrong_one_is_counted(tmp_path):
    from luffy_pool.tiny import write_task_parquets
    from reproduce.regime import trace_pass_rate

    train = write_task_parquets(str(tmp_path), n_train=6, n_test=1)["train"]
    assert trace_pass_rate(train) == {"correct": 6, "rows": 6, "accuracy": 1.0}
    df = pd.read_parquet(train)
    df.at[0, "reward_model"] = {"ground_truth": "-1", "style": "rule"}
    df.to_parquet(train)
    assert trace_pass_rate(train)["correct"] == 5


# ------------------------------------------------------------------------------ OOD split
def test_ood_problems_are_outside_the_training_lengths_and_disjoint(tmp_path):
    from luffy_pool.tiny.arith_task import make_ood_problems, write_ood_parquet
    from luffy_pool.tiny import write_task_parquets

    paths = write_task_parquets(str(tmp_path), n_train=40, n_test=10, level=2, seed=0, n_val=12)
    assert len(pd.read_parquet(paths["val"])) == 12
    for variant in ("more_digits", "mixed_digits"):
        probs = make_ood_problems(200, variant, seed=3)
        assert len({(p.a, p.b, p.op) for p in probs}) == 200
        lengths = [(len(str(p.a)), len(str(p.b))) for p in probs]
        assert all(la != 2 or lb != 2 for la, lb in lengths), "two-digit + two-digit is the training distribution"
        if variant == "more_digits":
            assert all(max(la, lb) == 3 for la, lb in lengths)
        else:
            assert all(sorted((la, lb)) == [1, 2] for la, lb in lengths)
    ood = write_ood_parquet(
        str(tmp_path / "ood.parquet"), 30, "mixed_digits", seed=1, exclude_files=[paths["train"], paths["test"]]
    )
    questions = {r[-1]["content"] for r in pd.read_parquet(ood)["prompt"]}
    seen = {r[-1]["content"] for f in paths.values() for r in pd.read_parquet(f)["prompt"]}
    assert len(questions) == 30 and not questions & seen


def test_ood_exclusion_removes_a_problem_that_would_be_drawn():
    from luffy_pool.tiny.arith_task import make_ood_problems

    first = make_ood_problems(5, "mixed_digits", seed=9)
    again = make_ood_problems(5, "mixed_digits", seed=9, exclude=[(first[0].a, first[0].b, first[0].op)])
    assert first[0] not in again and again[:4] == first[1:]


def test_adding_a_validation_split_keeps_the_other_splits(tmp_path):
    from luffy_pool.tiny import write_task_parquets

    plain = write_task_parquets(str(tmp_path / "a"), n_train=20, n_test=5, level=2, seed=0, n_warm=8)
    more = write_task_parquets(str(tmp_path / "b"), n_train=20, n_test=5, level=2, seed=0, n_warm=8, n_val=6)
    for split in ("train", "test", "warm"):
        assert pd.read_parquet(plain[split]).equals(pd.read_parquet(more[split]))
    val = {r[-1]["content"] for r in pd.read_parquet(more["val"])["prompt"]}
    others = {r[-1]["content"] for s in ("train", "test", "warm") for r in pd.read_parquet(more[s])["prompt"]}
    assert len(val) == 6 and not val & others


# ------------------------------------------------------------------------------ summary, claims, schema
def _run(seed, id_scores, ood_scores, reward=(0.01, 0.02), entropy=0.5):
    def block(xs):
        per = dict(enumerate(xs))
        return {"per_problem": per, "mean": sum(xs) / len(xs)}

    return {
        "seed": seed,
        "lr": 1e-4,
        "cpu_s": 10.0,
        "label": "x",
        "summary": {
            "reward_start": reward[0],
            "reward_end": reward[1],
            "reward_change": reward[1] - reward[0],
            "entropy_end": entropy,
        },
        "scores": {
            "id": {"greedy": block(id_scores), "avg": block(id_scores)},
            "ood": {"greedy": block(ood_scores), "avg": block(ood_scores)},
        },
    }


def _fake_runs():
    return {
        "on_policy": [_run(s, [0, 0, 0, 1], [0, 0, 0, 0], entropy=0.3 + s / 100) for s in (1, 2, 3)],
        "luffy": [_run(s, [1, 1, 1, 0], [1, 0, 0, 0], reward=(0.02, 0.05), entropy=0.6 + s / 100) for s in (1, 2, 3)],
        "sft": [_run(s, [1, 1, 1, 1], [1, 0, 0, 0]) for s in (1, 2, 3)],
    }


def test_claims_give_verdicts_and_mark_missing_methods():
    runs = _fake_runs()
    methods = {
        n: S.method_summary(n, rs, {"scores": {1e-4: 0.1}, "chosen": 1e-4, "label": n}) for n, rs in runs.items()
    }
    start = {sp: {m: {"per_problem": dict(enumerate([1, 0, 0, 0]))} for m in ("greedy", "avg")} for sp in ("id", "ood")}
    c = S.claims(runs, methods, {"accuracy": 0.027}, start)
    assert c["1_weak_start"]["luffy_minus_start_id_avg"]["mean"] == pytest.approx(0.5)  # 0.75 - 0.25
    assert c["1_weak_start"]["on_policy_minus_start_id_avg"]["mean"] == pytest.approx(0.0)
    assert c["1_weak_start"]["weak_start"] is True
    assert c["1_weak_start"]["luffy_minus_on_policy_id_avg"]["mean"] == pytest.approx(0.5)
    assert c["2_ood_vs_sft"]["luffy_minus_sft_ood_avg"]["verdict"] == "inconclusive"  # identical OOD scores
    assert c["2_ood_vs_sft"]["luffy_minus_on_policy_final_entropy"]["verdict"] == "holds"
    assert c["3_shaping"]["luffy_minus_no_shaping_id_avg"] is None  # LUFFY w/o shaping not run
    text = "\n".join(S.claims_markdown(c, 4))
    assert "not measured" in text and "**inconclusive**" in text


def test_family_claims_pair_each_method_with_grpo_start_and_sft():
    runs = _fake_runs()
    runs["hpt"] = [_run(s, [1, 1, 0, 0], [0, 0, 0, 0]) for s in (1, 2, 3)]
    start = {sp: {m: {"per_problem": dict(enumerate([1, 0, 0, 0]))} for m in ("greedy", "avg")} for sp in ("id", "ood")}
    f = S.family_claims(runs, {"luffy": "LUFFY", "hpt": "HPT", "on_policy": "GRPO", "relift": "ReLIFT"}, start)
    assert list(f) == ["luffy", "hpt"]  # GRPO is the reference, ReLIFT was not run
    assert f["hpt"]["minus_on_policy_id_avg"]["mean"] == pytest.approx(0.25)  # 0.5 - 0.25
    assert f["hpt"]["minus_start_id_avg"]["mean"] == pytest.approx(0.25)
    assert f["hpt"]["minus_sft_ood_avg"]["mean"] == pytest.approx(-0.25)
    assert f["luffy"]["minus_on_policy_id_avg"]["mean"] == pytest.approx(0.5)
    lines = S.family_markdown(f, 4)
    assert len(lines) == 2 and lines[1].startswith("- **HPT**: ID avg@4 − on-policy GRPO **")


def test_results_json_schema(tmp_path):
    runs = _fake_runs()
    grid = {
        n: {"label": n, "lrs": [1e-4, 3e-4, 1e-3], "scores": {1e-4: 0.1, 3e-4: 0.2, 1e-3: None}, "chosen": 3e-4}
        for n in runs
    }
    methods = {n: S.method_summary(n, rs, grid[n]) for n, rs in runs.items()}
    record = {
        "methods": methods,
        "grid": grid,
        "claims": S.claims(runs, methods, {"accuracy": 0.03}),
        "cpu_s": {"total": 1.0},
    }
    S.write_results(str(tmp_path), ["# t"], record)
    back = json.loads((tmp_path / "results.json").read_text())
    luffy = back["methods"]["luffy"]
    assert luffy["chosen_lr"] == 1e-4 and luffy["seeds"] == [1, 2, 3]
    assert [p["final_on_policy_reward"] for p in luffy["per_seed"]] == [0.05, 0.05, 0.05]
    for split in ("id", "ood"):
        for metric in ("greedy", "avg"):
            assert set(luffy[split][metric]) >= {"mean", "lo", "hi", "se", "seeds", "problems"}
    assert back["grid"]["sft"]["scores"] == {"0.0001": 0.1, "0.0003": 0.2, "0.001": None}
    table = S.grid_table(grid)
    assert "**0.200**" in table and "| — |" in table
    assert S.main_table(methods).count("\n") == 1 + len(methods)
    notes = S.grid_edge_notes({"sft": dict(grid["sft"], chosen=1e-3), "luffy": grid["luffy"]})
    assert len(notes) == 1 and "1e-3" not in notes[0] and "0.001 is the largest value" in notes[0]


# ------------------------------------------------------------------------------ evaluation in one process
def test_run_evals_runs_the_missing_commands_in_one_process_and_reuses_finished_ones(tmp_path, monkeypatch):
    import subprocess

    from reproduce import evaluate as E

    started = []

    def fake_run(cmd, stdout, stderr, env, cwd, timeout):  # stands in for eval_batch.py: writes each summary
        assert cmd[1] == E.EVAL_BATCH
        calls = json.load(open(cmd[2]))
        started.append(calls)
        for call in calls:
            out = call[call.index("--output_file") + 1]
            with open(E.summary_file(out), "w") as f:
                json.dump(
                    {
                        "accuracy": 0.5,
                        "samples": 2,
                        "per_source": {},
                        "mean_response_tokens": 3.0,
                        "cpu_s": 1.5,
                        "out": out,
                    },
                    f,
                )
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(E.subprocess, "run", fake_run)
    outs = [str(tmp_path / "ev" / f"{name}.jsonl") for name in ("greedy", "sampled")]
    calls = [
        (E.eval_command("m", "in.parquet", out, n=1 + i, temperature=0.6 * i, max_tokens=8, rollout="hf"), out)
        for i, out in enumerate(outs)
    ]
    first = E.run_evals(calls, env={}, reuse=True)
    assert len(started) == 1 and len(started[0]) == 2  # both commands, one process
    assert [s["out"] for s in first] == outs and all(os.path.exists(os.path.splitext(o)[0] + ".cmd.json") for o in outs)
    # Reuse: nothing runs again; a changed command runs alone.
    assert E.run_evals(calls, env={}, reuse=True) == first and len(started) == 1
    changed = [calls[0], (calls[1][0][:-2] + ["--seed", "7"], calls[1][1])]
    E.run_evals(changed, env={}, reuse=True)
    assert len(started) == 2 and [c[c.index("--output_file") + 1] for c in started[1]] == [outs[1]]
    # Without reuse every command runs.
    E.run_evals(calls, env={}, reuse=False)
    assert len(started) == 3 and len(started[2]) == 2


def test_run_evals_names_the_log_when_the_batch_fails(tmp_path, monkeypatch):
    import subprocess

    from reproduce import evaluate as E

    monkeypatch.setattr(E.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 2))
    out = str(tmp_path / "greedy.jsonl")
    with pytest.raises(RuntimeError, match=r"exit 2\); see .*eval\.log"):
        E.run_evals(
            [(E.eval_command("m", "in.parquet", out, n=1, temperature=0, max_tokens=8), out)],
            env={},
            log_path=str(tmp_path / "eval.log"),
        )
