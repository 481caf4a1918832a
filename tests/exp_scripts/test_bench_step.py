"""exp_scripts/bench_step.py: CPU accounting, the floor's GRPO maths, summaries, the report's last line,
the trainer/TRL configs it builds, and one tiny end-to-end run of every contender (slow)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
if EXP not in sys.path:
    sys.path.insert(0, EXP)

from bench import cpu_load  # noqa: E402
from bench.common import BenchSpec, headline_line, summarize  # noqa: E402
from bench.report import best_run, phase_breakdown, print_report  # noqa: E402

HEADLINE = re.compile(r"^ours/TRL=(\d+\.\d\d|n/a) ours/floor=(\d+\.\d\d|n/a)$")


def _spec(**kw) -> BenchSpec:
    base = dict(contender="ours", case="fixed", model_dir="/m", task_dir="/t", work_dir="/w")
    base.update(kw)
    return BenchSpec(**base)


# ------------------------------------------------------------------------------ CPU accounting
def test_machine_busy_ticks_sum_user_nice_system_irq_softirq_steal():
    text = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n"
    assert cpu_load.parse_machine_busy_ticks(text) == 100 + 5 + 50 + 3 + 2 + 1


def test_machine_busy_ticks_without_cpu_line_is_an_error():
    with pytest.raises(ValueError, match="cpu"):
        cpu_load.parse_machine_busy_ticks("intr 1 2 3\n")


def test_proc_pid_stat_handles_parentheses_and_spaces_in_the_command_name():
    # fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
    line = "123 (my (odd) proc) S 45 1 1 0 -1 0 0 0 0 0 7 3 2 1 20 0 1 0"
    assert cpu_load.parse_proc_pid_stat(line) == (123, 45, 7 + 3 + 2 + 1)


def test_tree_ticks_counts_the_root_and_all_descendants_only():
    rows = [(1, 0, 5), (10, 1, 3), (11, 10, 4), (13, 11, 6), (12, 1, 100)]
    assert cpu_load.tree_ticks(rows, 10) == 3 + 4 + 6
    assert cpu_load.tree_ticks(rows, 99) == 0


def test_cores_between_splits_machine_load_into_ours_and_foreign():
    a = cpu_load.CpuSample(wall_s=0.0, machine_busy_ticks=0, own_tree_ticks=0)
    b = cpu_load.CpuSample(wall_s=2.0, machine_busy_ticks=300, own_tree_ticks=100)
    got = cpu_load.cores_between(a, b, ticks_per_s=100)
    assert got == {"foreign_cores": pytest.approx(1.0), "own_cores": pytest.approx(0.5)}


def test_cores_between_clamps_tick_rounding_below_zero_and_reports_nan_without_samples():
    a = cpu_load.CpuSample(0.0, 0, 0)
    b = cpu_load.CpuSample(1.0, 100, 101)
    assert cpu_load.cores_between(a, b, ticks_per_s=100)["foreign_cores"] == 0.0
    assert math.isnan(cpu_load.cores_between(cpu_load.CpuSample(0.0, None, None), b)["foreign_cores"])


# ------------------------------------------------------------------------------ floor maths
def test_group_advantages_are_normalised_per_group_with_unbiased_std():
    import torch

    from bench.floor import group_advantages

    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]), group_size=4)
    # group 1: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; group 2: std 0 -> 0.
    expected = [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, 0.0, 0.0, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)


def test_completion_mask_keeps_tokens_up_to_and_including_the_first_eos():
    import torch

    from bench.floor import completion_mask

    mask = completion_mask(torch.tensor([[5, 2, 7, 2], [5, 5, 5, 5], [2, 9, 9, 9]]), eos_id=2)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_clipped_token_loss_at_ratio_one_is_minus_mean_token_advantage_and_gives_policy_gradient():
    import torch

    from bench.floor import clipped_token_loss

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    loss = clipped_token_loss(logp, torch.tensor([1.0, 2.0]), torch.tensor([[1, 1], [1, 0]]))
    # ratio = 1 everywhere: -(1 + 1 + 2) / 3 masked tokens
    assert loss.item() == pytest.approx(-4.0 / 3.0)
    loss.backward()
    # d/dlogp of -ratio * A / 3 at ratio 1 is -A / 3 on kept tokens, 0 on the masked one
    assert logp.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, -2 / 3, 0.0])


# ------------------------------------------------------------------------------ summaries and report
def _result(walls, tokens, warmup=1, label="x", metrics=None):
    steps = [
        {"wall_s": w, "gen_tokens": t, "foreign_cores": 0.1, "own_cores": 1.0, "warmup": i < warmup}
        for i, (w, t) in enumerate(zip(walls, tokens))
    ]
    for s, m in zip(steps, metrics or []):
        s["metrics"], s["rollout_workers"] = m, []
    return {"label": label, "steps": steps, "startup_s": 1.0, "torch_threads": 1}


def test_summarize_uses_timed_steps_only():
    s = summarize(_result([10.0, 1.0, 3.0, 2.0], [999, 100, 300, 200]))
    assert s["median_s"] == 2.0 and s["min_s"] == 1.0 and s["max_s"] == 3.0
    assert s["tokens_per_s"] == pytest.approx(600 / 6.0)
    assert s["gen_tokens_per_step"] == pytest.approx(200.0)
    assert s["timed_steps"] == 3


def test_headline_line_formats_two_decimals_and_na():
    assert headline_line(0.456, 1.234) == "ours/TRL=0.46 ours/floor=1.23"
    assert headline_line(None, 2.0) == "ours/TRL=n/a ours/floor=2.00"


def test_phase_breakdown_reports_the_unattributed_rest_of_the_step():
    metrics = {
        "timing_s/step": 1.0,
        "timing_s/gen": 0.5,
        "timing_s/reward": 0.1,
        "timing_s/old_log_prob": 0.1,
        "timing_s/adv": 0.0,
        "timing_s/update_actor": 0.2,
        "timing_s/update_actor_worker": 0.15,
    }
    out = phase_breakdown(_result([2.0, 1.05], [1, 1], metrics=[metrics, metrics]))
    assert out["timing_s/gen"] == 0.5
    assert out["other (step - phases)"] == pytest.approx(0.1)
    assert out["outside timing_s/step (driver logging, metrics)"] == pytest.approx(0.05)
    assert out["update outside the worker call (driver, Ray)"] == pytest.approx(0.05)


def _run(case, contender, label, walls):
    return {
        "case": case,
        "contender": contender,
        "label": label,
        "threads_env": "1",
        "log": "l",
        "result": None
        if walls is None
        else _result(walls, [64] * len(walls), label=label, metrics=[{"timing_s/step": w} for w in walls]),
    }


def test_report_ends_with_the_fixed_case_headline_against_each_contenders_best_setting(capsys):
    runs = [
        _run("fixed", "ours", "ours[hf,2rank]", [9, 0.8, 0.8]),
        _run("fixed", "ours", "ours[hf,1rank]", [9, 1.0, 1.0]),
        _run("fixed", "trl", "trl[2thr]", [9, 2.0, 2.0]),
        _run("fixed", "trl", "trl[1thr]", [9, 1.6, 1.6]),
        _run("fixed", "floor", "floor[1thr]", [9, 0.4, 0.4]),
        _run("natural", "ours", "ours[hf,2rank]", [9, 5, 5]),
    ]
    assert best_run(runs, "fixed", "trl")["label"] == "trl[1thr]"
    assert print_report(runs, None) is True
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "ours/TRL=0.50 ours/floor=2.00"


def test_report_marks_a_failed_contender_and_returns_false(capsys):
    runs = [_run("fixed", "ours", "ours[hf,2rank]", [9, 0.8]), _run("fixed", "trl", "trl[1thr]", None)]
    assert print_report(runs, None) is False
    out = capsys.readouterr().out
    assert "trl[1thr]" in out and "FAILED" in out
    assert out.strip().splitlines()[-1] == "ours/TRL=n/a ours/floor=n/a"


# ------------------------------------------------------------------------------ configs of the contenders
@pytest.mark.parametrize("case", ["fixed", "natural"])
def test_our_overrides_compose_to_one_on_policy_update_of_8x8_rows(case):
    from bench.ours import compose, trainer_overrides

    cfg = compose(trainer_overrides(_spec(case=case, rollout="hf", ranks=2)))
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.data.train_batch_size == 8 and r.n == 8 and a.ppo_mini_batch_size == 8
    assert cfg.data.max_response_length == 64 and r.min_prefix_ratio == 0.0 and r.max_prefix_ratio == 0.0
    assert r.ignore_eos is (case == "fixed") and r.name == "hf" and r.dtype == "float32"
    assert cfg.trainer.n_gpus_per_node == 2 and cfg.trainer.test_freq == -1 and cfg.trainer.save_freq == -1
    assert cfg.trainer.total_training_steps == 10 and cfg.actor_rollout_ref.ref.use_ref is False


def test_trl_config_consumes_8x8_completions_per_optimizer_step_and_pins_length_only_when_fixed():
    pytest.importorskip("trl", reason="trl is a benchmark-only extra (requirements-bench.txt)")
    from trl import GRPOConfig

    from bench.trl_contender import trl_config_kwargs

    fixed = GRPOConfig(**trl_config_kwargs(_spec(contender="trl"), "/tmp/unused_trl_out"))
    assert fixed.per_device_train_batch_size * fixed.gradient_accumulation_steps == 64
    assert fixed.num_generations == 8 and fixed.max_completion_length == 64 and fixed.beta == 0.0
    assert fixed.generation_kwargs == {"min_new_tokens": 64} and not fixed.use_vllm and not fixed.bf16
    natural = trl_config_kwargs(_spec(contender="trl", case="natural"), "/tmp/unused_trl_out")
    assert "generation_kwargs" not in natural


def test_jobs_default_to_one_run_at_a_time_and_zero_is_refused():
    import bench_step

    assert bench_step.parse_args(["--contenders", "ours,floor"]).jobs == 1
    with pytest.raises(SystemExit):
        bench_step.parse_args(["--contenders", "ours,floor", "--jobs", "0"])


def test_spec_rejects_unknown_contender_and_zero_warmup():
    with pytest.raises(ValueError, match="contender"):
        _spec(contender="deepspeed")
    with pytest.raises(ValueError, match="warmup"):
        _spec(warmup=0)


# ------------------------------------------------------------------------------ end to end (tiny)
def _trl_installed() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.e2e
def test_benchmark_runs_every_contender_and_ends_with_the_headline(tmp_path):
    contenders = "ours,trl,floor" if _trl_installed() else "ours,floor"
    if contenders == "ours,floor":
        print("trl not installed (pip install -r requirements-bench.txt): TRL contender left out of this smoke run")
    cmd = [
        sys.executable,
        os.path.join(EXP, "bench_step.py"),
        "--rollout",
        "hf",
        "--ranks",
        "2",
        "--baseline-threads",
        "1",
        "--contenders",
        contenders,
        "--warmup",
        "1",
        "--steps",
        "1",
        "--prompts",
        "2",
        "--samples",
        "2",
        "--max-new-tokens",
        "8",
        "--sft-steps",
        "3",
        "--out",
        str(tmp_path),
        "--jobs",
        "2",
    ]  # two runs at once: this smoke run checks the plumbing, not the timings
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert HEADLINE.match(lines[-1]), lines[-1]
    if "trl" in contenders:
        assert not lines[-1].startswith("ours/TRL=n/a")
    for label in ["ours[hf,2rank]", "floor[1thr]"] + (["trl[1thr]"] if "trl" in contenders else []):
        assert sum(line.startswith(label) for line in lines) == 2, label  # one row per case
    assert any("timing_s/gen" in line for line in lines) and any("perf/throughput" in line for line in lines)
    results = json.load(open(tmp_path / "results.json"))
    assert {(r["case"], r["contender"]) for r in results["runs"]} >= {("fixed", "ours"), ("natural", "floor")}
    for run in results["runs"]:
        assert [s["warmup"] for s in run["result"]["steps"]] == [True, False]


def test_step_recorder_charges_its_own_scan_to_no_step(monkeypatch):
    import time

    real_sample = cpu_load.sample

    def slow_sample(root_pid=None):  # a /proc scan that takes 400 ms
        time.sleep(0.4)
        return real_sample(root_pid)

    monkeypatch.setattr(cpu_load, "sample", slow_sample)
    recorder = cpu_load.StepRecorder()
    for _ in range(2):
        time.sleep(0.02)  # the "step"
        step = recorder.mark(tag="x")
        # a step charged with the scan would measure >= 0.42 s; a busy machine may stretch the 20 ms sleep itself
        assert 0.015 < step["wall_s"] < 0.3 and step["tag"] == "x"
    assert len(recorder.steps) == 2


def test_rounds_compare_within_each_round_and_the_headline_is_their_median(capsys):
    # Round 1 ran on a fast machine, round 2 on one twice as slow, round 3 in between: pooling all runs would
    # pair round 1's ours (0.4) with round 3's TRL (0.7); per-round ratios are 0.5, 0.5 and 0.6 -> median 0.5.
    runs = []
    for k, (ours, trl, floor) in enumerate([(0.4, 0.8, 0.5), (0.8, 1.6, 1.0), (0.42, 0.7, 0.6)]):
        for contender, label, wall in (
            ("ours", "ours[hf,2rank]", ours),
            ("trl", "trl[2thr]", trl),
            ("floor", "floor[2thr]", floor),
        ):
            run = _run("fixed", contender, label, [9, wall, wall])
            run["round"] = k
            runs.append(run)
    assert print_report(runs, None) is True
    out = capsys.readouterr().out
    assert "fixed round 1: ours/TRL=0.50 ours/floor=0.80" in out and "fixed round 3: ours/TRL=0.60" in out
    assert "ours[hf,2rank] r2" in out  # table rows say which round they are
    assert out.strip().splitlines()[-1] == "ours/TRL=0.50 ours/floor=0.80"
