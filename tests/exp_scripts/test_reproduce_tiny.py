"""exp_scripts/reproduce_tiny.py: the method table, the shared overrides (valid for every config), the
results table and plots, and (slow) a 1-step smoke run of two methods that checks every output exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
if EXP not in sys.path:
    sys.path.insert(0, EXP)

from reproduce.methods import (  # noqa: E402
    FAMILY,
    METHODS,
    NOT_RUN,
    RunSettings,
    needs_sft,
    parse_methods,
    rl_overrides,
    sft_overrides,
)
from reproduce.recipes import merge_overrides  # noqa: E402
from reproduce.report import final_value, has_off_policy_rows, markdown_table, plot_dynamics, table_row  # noqa: E402


def _settings(**kw) -> RunSettings:
    base = dict(
        model_dir="/m",
        train_file="/d/train.parquet",
        test_file="/d/test.parquet",
        steps=3,
        batch_size=8,
        n=8,
        response_length=48,
        max_prompt_length=128,
        lr=1e-3,
        rollout="vllm",
        ranks=2,
    )
    base.update(kw)
    return RunSettings(**base)


# ------------------------------------------------------------------------------ methods
def test_parse_methods_all_is_every_method_in_table_order():
    assert parse_methods("all") == [
        "on_policy",
        "rl_sft_loss",
        "sft",
        "sft_rl",
        "luffy_no_shaping",
        "luffy",
        "luffy_replay",
        "hpt",
        "srft",
        "chord",
        "exgrpo",
        "relift",
        "uft",
        "prefix_rft",
        "rl_plus",
        "questa",
        "sdpo",
        "sdft",
    ]


def test_parse_methods_family_is_the_family_beside_grpo_luffy_and_sft():
    assert parse_methods("family") == [
        "sft",
        "on_policy",
        "luffy",
        "hpt",
        "srft",
        "chord",
        "exgrpo",
        "relift",
        "uft",
        "prefix_rft",
        "rl_plus",
        "questa",
        "sdpo",
        "sdft",
    ]
    assert parse_methods("claims") == ["on_policy", "luffy", "luffy_no_shaping", "sft"]


def test_family_methods_run_their_own_recipe_scaled_to_the_tiny_run():
    s = _settings(batch_size=8, n=8, lr=1e-4, steps=50)
    for name in FAMILY:
        assert METHODS[name].config_name == "tiny_cpu_luffy"
        extra = METHODS[name].extra(s)
        assert f"algorithm.method={name}" in extra
        assert "actor_rollout_ref.actor.use_off_policy_loss=False" in extra  # the presets' value over tiny LUFFY's
    # CHORD's script: clip 0.2 on, token mean, std-normalised advantage, batch 40 = mini-batch 40 (one update)
    chord = METHODS["chord"].extra(s)
    for item in (
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.loss_remove_clip=False",
        "actor_rollout_ref.actor.loss_remove_token_mean=False",
        "algorithm.grpo_use_std=True",
        "algorithm.chord.mu_peak=0.1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=8",
    ):
        assert item in chord
    # UFT: n 4 of LUFFY's 8, 256 / 64 = 4 updates per step, KL loss to the reference, hint schedule 0.6 x steps
    uft = METHODS["uft"].extra(s)
    for item in (
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.ref.use_ref=True",
        "algorithm.uft.total_training_steps_hint=30",
    ):
        assert item in uft
    assert METHODS["uft"].train_split == "train_hints"
    assert {n for n, m in METHODS.items() if m.train_split != "train"} == {"uft"}
    relift = METHODS["relift"].extra(s)
    for item in (
        "actor_rollout_ref.rollout.n_prefix=0",
        "algorithm.relift.sft_data_size=8",
        "algorithm.relift.sft_mini_batch_size=8",
        "algorithm.relift.sft_micro_batch_size=4",
        "algorithm.relift.sft_lr=0.0001",
        "actor_rollout_ref.actor.grad_clip=0.7",
    ):
        assert item in relift
    # QuestA: n 16 (twice LUFFY's), one update per step, no entropy bonus
    questa = METHODS["questa"].extra(s)
    assert "actor_rollout_ref.rollout.n=16" in questa and "actor_rollout_ref.actor.entropy_coeff=0.0" in questa
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=8" in questa
    # the scale keys stay the run's: no data, lr, step or reward key comes from a recipe
    for name in FAMILY:
        keys = {item.split("=", 1)[0] for item in METHODS[name].extra(s)}
        assert not any(k.startswith(("data.", "trainer.", "reward.")) or k.endswith("optim.lr") for k in keys), name
    assert set(NOT_RUN) == {"ampo"} and "ampo" not in METHODS


def test_parse_methods_main_is_the_central_comparison():
    assert parse_methods("main") == ["on_policy", "luffy", "luffy_no_shaping", "sft", "luffy_replay"]


def test_parse_methods_keeps_the_given_order_once_each():
    assert parse_methods(" luffy,on_policy,luffy ") == ["luffy", "on_policy"]


def test_parse_methods_names_the_unknown_method():
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['grpo'\]"):
        parse_methods("luffy,grpo")


def test_sft_stage_runs_for_sft_or_sft_then_rl_only():
    assert needs_sft(["sft_rl"]) and needs_sft(["sft", "luffy"])
    assert not needs_sft(["luffy", "on_policy", "rl_sft_loss", "luffy_no_shaping"])


def test_run_settings_reject_a_zero_step_count():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        _settings(steps=0)


def test_mini_batch_is_half_the_batch_for_two_updates_per_step():
    assert _settings(batch_size=8).mini_batch_size == 4
    assert _settings(batch_size=1).mini_batch_size == 1


def test_sft_micro_batch_is_the_largest_divisor_up_to_four():
    assert [_settings(batch_size=b).sft_micro_batch_size for b in (8, 6, 3, 5, 1)] == [4, 3, 3, 1, 1]


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.kind != "sft"])
def test_shared_overrides_compose_a_valid_config_for_every_rl_method(name, compose_config):
    from luffy_pool.config.check import check_config, prepare_overrides

    s = _settings(steps=7, batch_size=6, n=4, lr=3e-4, rollout="hf")
    extra = METHODS[name].extra(s) if METHODS[name].extra else []
    overrides = merge_overrides(rl_overrides(s, "/out/x", model_dir="/sft/final") + extra)  # as runner.train_rl
    cfg = compose_config(prepare_overrides(overrides), METHODS[name].config_name)
    check_config(cfg)
    assert cfg.algorithm.method == (name if METHODS[name].extra else "luffy")
    assert cfg.trainer.total_training_steps == 7 and cfg.data.train_batch_size == 6
    assert cfg.actor_rollout_ref.actor.optim.lr == 3e-4
    # n and the mini-batch: the shared ones, or the method's recipe scaled (UFT n 2 of 4, QuestA 8; CHORD one update)
    recipe_n = {"uft": 2, "questa": 8}
    recipe_mini = {"uft": 1, "chord": 6, "questa": 6, "sdpo": 6, "sdft": 6}
    assert cfg.actor_rollout_ref.rollout.n == recipe_n.get(name, 4)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == recipe_mini.get(name, 3)
    assert cfg.actor_rollout_ref.model.path == "/sft/final"
    assert cfg.trainer.default_local_dir == "/out/x" and "jsonl" in cfg.trainer.logger
    assert cfg.trainer.test_freq == -1 and cfg.trainer.val_before_train is False


def test_sft_overrides_put_the_sft_config_on_the_same_steps_batch_and_lr():
    from verl.trainer.sft.config import CONFIG_DIR as SFT_CONFIG_DIR
    from verl.trainer.sft.config import check_sft_config

    s = _settings(steps=7, batch_size=6, lr=3e-4)
    cfg = _compose_sft([f"hydra.searchpath=[file://{SFT_CONFIG_DIR}]", *sft_overrides(s, "/out/sft")])
    check_sft_config(cfg)
    assert cfg.trainer.total_training_steps == 7 and cfg.data.train_batch_size == 6 and cfg.optim.lr == 3e-4
    assert cfg.data.micro_batch_size_per_gpu == 3 and cfg.data.max_length == 128 + 48
    assert cfg.trainer.default_local_dir == "/out/sft" and cfg.model.path == "/m"


def _compose_sft(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(REPO, "luffy_pool", "config"), version_base=None):
        return compose(config_name=METHODS["sft"].config_name, overrides=overrides)


# ------------------------------------------------------------------------------ report
RECORDS = {
    1: {"on_off_metrics/on_score": 0.0, "actor/entropy_loss": 6.0},
    2: {"on_off_metrics/on_score": 0.5, "actor/entropy_loss": 5.0},
    3: {"on_off_metrics/on_score": 1.0, "actor/entropy_loss": "nan"},
    4: {"on_off_metrics/on_score": 0.25},
}


def test_final_value_is_the_mean_of_the_last_logged_finite_steps():
    assert final_value(RECORDS, "on_off_metrics/on_score", last=2) == pytest.approx((1.0 + 0.25) / 2)
    assert final_value(RECORDS, "actor/entropy_loss", last=5) == pytest.approx(5.5)  # "nan" is skipped
    assert final_value(RECORDS, "actor/off_policy_prob") is None


def test_off_policy_rows_are_detected_from_the_example_ratio():
    assert not has_off_policy_rows({1: {"on_off_metrics/off_on_example_ratio": 0.0}})
    assert has_off_policy_rows(
        {1: {"on_off_metrics/off_on_example_ratio": 0.0}, 2: {"on_off_metrics/off_on_example_ratio": 1 / 7}}
    )


def test_table_row_formats_numbers_and_marks_missing_ones():
    row = {
        "label": "LUFFY",
        "wall_s": 312.4,
        "train_reward": 0.125,
        "entropy": None,
        "on_policy_response_length": 40.26,
        "eval": {"greedy": {"accuracy": 0.25, "mean_response_tokens": 37.5}, "sampled": {"accuracy": 0.1875, "k": 4}},
    }
    assert table_row(row) == ["LUFFY", "0.250", "0.188 (avg@4)", "0.125", "—", "40.3", "37.5", "312"]


def test_a_failed_method_shows_its_error_in_the_table():
    table = markdown_table([{"label": "SFT", "error": "exit 1; see /o/sft/train.log"}])
    assert table.splitlines()[2].startswith("| SFT | failed: exit 1; see /o/sft/train.log |")


def test_plot_dynamics_writes_a_png_per_panel_and_skips_off_policy_prob_for_on_policy_runs(tmp_path):
    luffy = {
        s: {
            "on_off_metrics/on_score": 0.1 * s,
            "actor/entropy_loss": 6 - s,
            "actor/off_policy_prob": 0.01 * s,
            "on_off_metrics/off_on_example_ratio": 1 / 7,
            "on_off_metrics/on_response_length_mean": 40.0,
        }
        for s in (1, 2, 3)
    }
    on_policy = {
        s: {
            "on_off_metrics/on_score": 0.0,
            "actor/entropy_loss": 6.0,
            "actor/off_policy_prob": 0.0,
            "on_off_metrics/off_on_example_ratio": 0.0,
        }
        for s in (1, 2, 3)
    }
    paths = plot_dynamics({"LUFFY": luffy, "On-policy GRPO": on_policy}, str(tmp_path), smooth=2)
    names = sorted(os.path.basename(p) for p in paths)
    assert names == [
        "entropy.png",
        "off_policy_prob.png",
        "on_policy_response_length.png",
        "on_policy_reward.png",
        "overview.png",
    ]
    assert all(os.path.getsize(p) > 1000 for p in paths)
    only_on_policy = plot_dynamics({"On-policy GRPO": on_policy}, str(tmp_path / "on"), smooth=2)
    assert "off_policy_prob.png" not in {os.path.basename(p) for p in only_on_policy}


def test_unknown_method_on_the_command_line_exits_with_a_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(EXP, "reproduce_tiny.py"), "--methods", "ppo", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "unknown method(s) ['ppo']" in proc.stderr
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------ smoke run (slow)
@pytest.mark.slow
@pytest.mark.e2e
def test_smoke_run_with_an_lr_grid_and_a_fresh_seed_writes_claims_table_plots_models_and_reuses_runs(tmp_path):
    out = tmp_path / "reproduce"
    env = dict(os.environ, RAY_ADDRESS="")
    # SFT searches a 2-value grid (seed 0, validation split: the grid loop is the same for every kind, and an SFT
    # run costs a quarter of an RL one); LUFFY + self-replay has a fixed lr and draws the RL curves.
    cmd = [
        sys.executable,
        os.path.join(EXP, "reproduce_tiny.py"),
        "--methods",
        "sft,luffy_replay",
        "--sft-lr-grid",
        "1e-4,3e-4",
        "--method-lr",
        "luffy_replay=1e-4",
        "--seeds",
        "1",
        "--warm-steps",
        "2",
        "--n-warm",
        "32",
        "--steps",
        "pilot",  # the pilot's one length (2 SFT steps; --pilot-move 0: any move ends it) is the run's
        "--pilot-start",
        "2",
        "--pilot-max-steps",
        "2",
        "--pilot-move",
        "0",
        "--grid-extend",
        "0",
        "--val-every",
        "1",
        "--batch-size",
        "2",
        "--n",
        "4",
        "--n-train",
        "16",
        "--n-val",
        "4",
        "--n-test",
        "4",
        "--n-ood",
        "3",
        "--eval-samples",
        "2",
        "--probe-rows",
        "2",
        "--window",
        "1",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [(m["name"], m["seed"]) for m in results["runs"]] == [("sft", 1), ("luffy_replay", 1)]
    assert results["probe"]["samples"] == 2 * 4 and results["start"]["label"].startswith("Start model (2 warm")
    assert results["probe"]["temperature"] == 1.0 and results["cpu_s"]["start_model"] > 0
    grid = results["grid"]["sft"]
    assert set(grid["scores"]) == {"0.0001", "0.0003"} and grid["chosen"] in (1e-4, 3e-4)
    assert results["grid"]["luffy_replay"]["scores"] == {"0.0001": "fixed"}
    pilot = results["settings"]["pilot"]
    assert pilot["steps"] == 2 and set(pilot["scores"]["2"]) == {"0.0001", "0.0003"}
    assert results["settings"]["steps"] == 2 and results["cpu_s"]["pilot"] > 0
    assert (out / "pilot" / "pilot.json").exists() and (out / "pilot" / "sft_2" / "lr0.0003" / "final").is_dir()
    for lr in ("0.0001", "0.0003"):
        assert (out / "grid" / "sft" / f"lr{lr}" / "eval_val" / "t0.6_n2.summary.json").exists()
    run = out / "seed1" / "luffy_replay"
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]  # validation before training, then every step
    assert "replay/size" in rows[-1]
    for method in ("sft", "luffy_replay"):
        run = out / "seed1" / method
        assert (run / "final" / "config.json").exists()
        # greedy and sampled scores of a model come from one process (reproduce/eval_batch.py)
        assert (run / "eval" / "greedy.summary.json").exists() and (run / "eval" / "t0.6_n2.summary.json").exists()
        assert (run / "eval" / "eval.log").exists()
        summary = results["methods"][method]
        for split, n in (("id", 4), ("ood", 3)):
            assert (
                summary[split]["avg"]["problems"] == n
                and 0 <= summary[split]["avg"]["lo"] <= summary[split]["avg"]["hi"] <= 1
            )
    assert all(r["cpu_s"] > 0 and r["eval_cpu_s"] > 0 for r in results["runs"])
    md = (out / "results.md").read_text()
    assert "## Claims" in md and "| LUFFY + self-replay | 0.0001 | 1 |" in md and "## Learning-rate grid" in md
    assert "## Pilot: the run length" in md and "**2 steps**" in md
    for name in ("reward", "held_out_accuracy", "entropy", "held_out"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 1000
    assert f"results: {out}/results.md" in proc.stdout
    # A second call with --reuse trains and evaluates nothing again and reports the same numbers.
    stamps = {
        p: p.stat().st_mtime
        for p in (out / "seed1" / "luffy_replay" / "metrics.jsonl", out / "seed1" / "sft" / "eval" / "greedy.jsonl")
    }
    again = subprocess.run(cmd + ["--reuse"], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert {p: p.stat().st_mtime for p in stamps} == stamps
    assert json.loads((out / "results.json").read_text())["methods"] == results["methods"]


# ------------------------------------------------------------------------------ seeds, validation, CPU time
def test_run_seed_and_validation_reach_every_rl_methods_config_the_same_way(compose_config):
    from luffy_pool.config.check import check_config, prepare_overrides

    s = _settings(seed=2, val_every=10, mini_batches=1, batch_size=8)
    for name in ("on_policy", "luffy", "luffy_replay"):
        cfg = compose_config(prepare_overrides(rl_overrides(s, "/out/x")), METHODS[name].config_name)
        check_config(cfg)
        assert (cfg.data.seed, cfg.trainer.seed, cfg.actor_rollout_ref.rollout.seed) == (49, 3, 2)
        assert cfg.trainer.test_freq == 10 and cfg.trainer.val_before_train is True
        assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8
    assert "trainer.seed=49" in sft_overrides(s, "/out/sft")


def test_seed_list_parsing():
    from reproduce_tiny import parse_seeds

    assert parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("", "0,0", "a"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def test_run_summary_uses_the_generated_on_policy_reward_when_self_replay_rewrote_rows():
    from reproduce.seeds_report import run_summary

    plain = {s: {"on_off_metrics/on_score": v, "actor/entropy_loss": 1.0} for s, v in enumerate([0, 0, 0.5, 1.0], 1)}
    replay = {s: dict(r, **{"replay/generated_on_score": r["on_off_metrics/on_score"] / 2}) for s, r in plain.items()}
    replay[4]["val/avg_score"] = 0.25
    replay[1]["val/avg_score"] = 0.0
    assert run_summary(plain, window=2) == {
        "reward_start": 0.0,
        "reward_end": 0.75,
        "reward_change": 0.75,
        "entropy_end": 1.0,
        "held_out_val_first": None,
        "held_out_val_last": None,
    }
    s = run_summary(replay, window=2)
    assert (s["reward_start"], s["reward_end"], s["held_out_val_first"], s["held_out_val_last"]) == (
        0.0,
        0.375,
        0.0,
        0.25,
    )


def test_aggregate_table_gives_mean_std_and_range_over_seeds_and_counts_failures():
    from reproduce.seeds_report import aggregate_table

    def run(g, change, cpu):
        return {
            "eval": {"greedy": {"accuracy": g}},
            "cpu_s": cpu,
            "summary": {"reward_start": 0.0, "reward_end": change, "reward_change": change, "entropy_end": None},
        }

    table = aggregate_table({"LUFFY": [run(0.25, 0.5, 60), run(0.75, 0.3, 80), {"error": "x"}]})
    row = table.splitlines()[2]
    assert row.startswith("| LUFFY | 2 (1 failed) | 0.500 ± 0.354 [0.250, 0.750] |")
    assert "0.400 ± 0.141 [0.300, 0.500]" in row and "70 ± 14 [60, 80]" in row and "| — |" in row


def test_seed_curves_are_written_as_pngs(tmp_path):
    from reproduce.seeds_report import plot_seed_curves

    recs = [
        {
            s: {
                "on_off_metrics/on_score": s / 10 + k,
                "actor/entropy_loss": 1.0,
                **({"val/avg_score": 0.1} if s % 2 else {}),
            }
            for s in range(1, 6)
        }
        for k in (0, 0.1)
    ]
    paths = plot_seed_curves({"LUFFY": recs, "On-policy GRPO": recs[:1]}, str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == ["entropy.png", "held_out_accuracy.png", "reward.png"]
    assert all(os.path.getsize(p) > 1000 for p in paths)


def test_cpu_sampler_counts_a_child_process_tree(tmp_path):
    from reproduce.cputime import run_measured

    busy = (
        "import subprocess, sys, time\n"
        "def spin(s):\n    t = time.process_time()\n    while time.process_time() - t < s: pass\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time\\nt=time.process_time()\\n"
        "while time.process_time()-t<0.6: pass'])\nspin(0.4)\np.wait()\n"
    )
    code, wall, cpu, source = run_measured(
        [sys.executable, "-c", busy], str(tmp_path / "log"), dict(os.environ), str(tmp_path), timeout_s=60
    )
    assert code == 0 and source in ("proc", "rusage")
    assert cpu >= 0.9  # parent 0.4 s + grandchild-level child 0.6 s (minus at most a sampling interval each)


# ------------------------------------------------------------------------------ start model, partial reports
def test_only_sft_then_rl_starts_from_the_sft_model(monkeypatch, tmp_path):
    from reproduce import runner

    starts = {}
    monkeypatch.setattr(
        runner,
        "train_rl",
        lambda config, s, run_dir, meter, model_dir=None, extra=(): (
            starts.__setitem__(config, model_dir) or (run_dir, 1.0, 1.0)
        ),
    )
    for name in ("on_policy", "luffy", "hpt", "sft_rl"):
        runner.train_method(name, _settings(), str(tmp_path / name), meter=None, sft_model="/sft/final")
    assert starts == {"tiny_cpu_on_policy": None, "tiny_cpu_luffy": None, "tiny_cpu_sft_rl": "/sft/final"}


def test_report_only_never_clears_an_unfinished_run_folder(tmp_path):
    from reproduce.runner import Meter, fresh_dir

    run = tmp_path / "grid" / "luffy" / "lr1e-4"
    run.mkdir(parents=True)
    (run / "train.log").write_text("step:3")  # another process is still training here
    with pytest.raises(RuntimeError, match=r"not run yet: .*lr1e-4 \(--report-only\)"):
        fresh_dir(str(run), Meter({}, None, only_finished=True), ["python", "train"])
    assert (run / "train.log").read_text() == "step:3"
    (run / "done.json").write_text(json.dumps({"cmd": ["python", "train"], "wall_s": 1.0, "cpu_s": 2.0}))
    meter = Meter({}, None, only_finished=True)
    assert fresh_dir(str(run), meter, ["python", "train"]) == str(run)
    assert meter.run(["python", "train"], str(run / "train.log"), "training") == (1.0, 2.0)


def test_a_report_with_missing_runs_says_partial_first():
    from reproduce.results_md import partial_lines

    grid = {
        "luffy": {"label": "LUFFY", "scores": {1e-4: 0.1, 3e-5: None}, "chosen": 1e-4},
        "hpt": {"label": "HPT", "scores": {1e-4: None}, "chosen": None},
    }
    runs = {"luffy": [{"label": "LUFFY", "seed": 1}, {"label": "LUFFY", "seed": 2, "error": "not run yet"}]}
    text = "\n".join(partial_lines(grid, runs))
    assert text.startswith("## PARTIAL RESULTS") and "grid LUFFY lr 3e-05, HPT lr 0.0001" in text
    assert "final runs LUFFY seed 2" in text and "no lr chosen for HPT" in text
    assert partial_lines({"luffy": dict(grid["luffy"], scores={1e-4: 0.1})}, {"luffy": runs["luffy"][:1]}) == []
    from reproduce.summary import grid_table

    assert grid_table(grid).splitlines()[-1] == "| HPT | n/a | — | — |"  # no lr chosen: its row still prints
