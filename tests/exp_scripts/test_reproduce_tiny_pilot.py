"""exp_scripts/reproduce_tiny.py's pilot (run length), edge-extended lr grid, power and per-method recipes: the pure
parts, by hand."""

from __future__ import annotations

import json
import os
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
if EXP not in sys.path:
    sys.path.insert(0, EXP)

from reproduce.grid import edge_extension, extension_notes, run_grid  # noqa: E402
from reproduce.pilot import pilot_lengths, pilot_lines, pilot_result, run_pilot  # noqa: E402
from reproduce.recipes import merge_overrides, recipe_keys, script_overrides, updates_per_step  # noqa: E402
from reproduce.stats import difference, min_detectable  # noqa: E402


# ------------------------------------------------------------------------------ pilot
def test_pilot_lengths_double_up_to_the_maximum():
    assert pilot_lengths(50, 400) == [50, 100, 200, 400]
    assert pilot_lengths(50, 300) == [50, 100, 200, 300]
    assert pilot_lengths(50, 50) == [50]
    with pytest.raises(ValueError):
        pilot_lengths(100, 50)


def test_pilot_result_takes_the_shortest_length_whose_best_lr_moves_five_points():
    scores = {50: {1e-4: 0.02, 3e-4: 0.03}, 100: {1e-4: 0.05, 3e-4: 0.061}, 200: {1e-4: 0.2, 3e-4: None}}
    res = pilot_result(0.01, scores, 0.05)
    assert res["steps"] == 100 and res["reached"] and res["best"][100] == (3e-4, 0.061)
    none = pilot_result(0.01, {50: {1e-4: 0.02}, 100: {1e-4: 0.03}}, 0.05)
    assert none["steps"] == 100 and not none["reached"]  # the longest run when none moves enough


def test_run_pilot_stops_at_the_first_length_that_moves_and_writes_its_record(tmp_path):
    calls = []

    def score(steps, lr):
        calls.append((steps, lr))
        return 0.01 + steps / 2000 * (2 if lr == 3e-4 else 1)  # 3e-4 at 50: +0.05

    res = run_pilot([25, 50, 100], [1e-4, 3e-4], 0.01, 0.05, score, str(tmp_path), lambda m: None, max_extend=0)
    assert calls == [(25, 1e-4), (25, 3e-4), (50, 1e-4), (50, 3e-4)]
    assert res["steps"] == 50 and res["reached"]
    on_disk = json.loads((tmp_path / "pilot.json").read_text())
    assert on_disk["steps"] == 50 and on_disk["best"]["50"] == {"lr": 3e-4, "score": pytest.approx(0.06)}
    text = "\n".join(pilot_lines(on_disk, 4))
    assert "**50 steps**" in text and "+5.0" in text


def test_pilot_extends_the_sft_grid_beyond_an_edge_best_lr_for_the_longer_lengths(tmp_path):
    calls = []

    def score(steps, lr):
        calls.append((steps, lr))
        return 0.01 + steps * lr  # the larger lr always moves more

    res = run_pilot([50, 100], [1e-4, 3e-4], 0.01, 0.05, score, str(tmp_path), lambda m: None, max_extend=1)
    assert calls == [(50, 1e-4), (50, 3e-4), (50, 9e-4), (100, 1e-4), (100, 3e-4), (100, 9e-4)]
    assert res["steps"] == 100 and res["best"]["100"]["lr"] == 9e-4  # 100 x 9e-4 = +0.09; 50 x 9e-4 = +0.045


# ------------------------------------------------------------------------------ grid
def test_edge_extension_goes_one_grid_step_beyond_the_edge():
    assert edge_extension([1e-5, 3e-5, 1e-4], 1e-5) == pytest.approx(1e-5 / 3)
    assert edge_extension([1e-5, 3e-5, 1e-4], 1e-4) == pytest.approx(1e-4 * 1e-4 / 3e-5)
    assert edge_extension([1e-5, 3e-5, 1e-4], 3e-5) is None
    assert edge_extension([1e-4], 1e-4) is None


def test_grid_is_extended_at_an_edge_at_most_twice_and_records_it():
    scores = {1e-5: 0.1, 3e-5: 0.2, 1e-4: 0.3, 3.33e-4: 0.4, 1.11e-3: 0.5, 3.7e-3: 0.6}
    seen = []

    def score_lr(lr):
        seen.append(lr)
        return scores[lr], 1.0

    g = run_grid("M", [1e-5, 3e-5, 1e-4], score_lr, lambda m: None, max_extend=2)
    assert seen == [1e-5, 3e-5, 1e-4, 3.33e-4, 1.11e-3] and g["extended"] == [3.33e-4, 1.11e-3]
    assert g["chosen"] == 1.11e-3 and g["cpu_s"] == 5.0 and len(g["lrs"]) == 5
    assert "grid extended by 0.000333, 0.00111" in extension_notes({"m": g})[0]
    # a peak inside the grid: no extension; a fixed lr: no grid
    inner = run_grid("M", [1e-5, 3e-5, 1e-4], lambda lr: ({3e-5: 0.3}.get(lr, 0.1), 0.0), lambda m: None)
    assert inner["chosen"] == 3e-5 and inner["extended"] == []
    assert run_grid("M", [1e-4], score_lr, lambda m: None)["scores"] == {1e-4: "fixed"}


# ------------------------------------------------------------------------------ power
def test_min_detectable_difference_is_2_8_standard_errors():
    assert min_detectable(0.01) == pytest.approx(0.028, abs=1e-4)
    d = difference([[1.0, 0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0, 1.0]])
    assert d["min_detectable_80"] == pytest.approx(2.8016 * d["se"], rel=1e-4)


# ------------------------------------------------------------------------------ recipes
def test_recipe_keys_are_the_scripts_algorithm_keys_without_the_scale_ones():
    chord = script_overrides("chord")
    assert chord["data.train_batch_size"] == "40" and chord["algorithm.chord.enable_phi_function"] == "True"
    keys = recipe_keys("chord")
    assert keys["actor_rollout_ref.actor.off_policy_reshape"] == "no_reshape"
    assert "data.train_batch_size" not in keys and "actor_rollout_ref.actor.optim.lr" not in keys
    assert "actor_rollout_ref.actor.skip_grad_bound" not in recipe_keys("hpt")  # a 7B model's gradient-norm bound
    assert recipe_keys("questa")["actor_rollout_ref.actor.optim.betas"] == "[0.9,0.95]"  # quoted in the script
    # updates per step: the script's batch / mini-batch, else train.sh's 128 / 64
    assert [updates_per_step(m) for m in ("hpt", "chord", "uft", "questa", "sdpo")] == [2, 1, 4, 1, 1]


def test_merge_overrides_keeps_one_value_per_key_the_last_in_the_first_place():
    merged = merge_overrides(["a.n=8", "b=1", "+c=2", "a.n=4", "c=3"])
    assert merged == ["a.n=4", "b=1", "c=3"]
