"""plot_metrics: series extraction (dedup, non-finite values), smoothing, and the PNGs it writes."""

import json

import pytest

from verl.utils.plot_metrics import PANELS, main, moving_average, panel_keys, series
from verl.utils.tracking import read_metrics_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _run(n_steps=6, val_every=3):
    rows = []
    for s in range(1, n_steps + 1):
        r = {
            "step": s,
            "critic/score/mean": 0.1 * s,
            "on_off_metrics/on_score": 0.05 * s,
            "on_off_metrics/off_score": 1.0,
            "actor/entropy_loss": 2.0 - 0.1 * s,
            "response_length/mean": 10.0 + s,
            "actor/off_policy_prob": 0.2 + 0.01 * s,
        }
        if s % val_every == 0:
            r.update({"val/test_score/math": 0.3, "val/avg_score": 0.3})
        rows.append(r)
    return rows


def test_series_skips_missing_and_nonfinite_values_and_keeps_last_record_per_step(tmp_path):
    path = _write(
        tmp_path / "m.jsonl",
        [{"step": 1, "a": 1.0}, {"step": 2, "a": "nan"}, {"step": 3, "b": 2}, {"step": 1, "a": 5.0}],
    )
    records = read_metrics_jsonl(path)
    assert list(records) == [1, 2, 3]
    assert series(records, "a") == ([1], [5.0])


def test_moving_average_is_a_trailing_mean():
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([1.0, 3.0], 1) == [1.0, 3.0]


def test_validation_panel_collects_every_val_key():
    val = next(p for p in PANELS if p.name == "validation")
    assert panel_keys(val, {"val/avg_score", "val/test_score/aime", "actor/x"}) == [
        "val/avg_score",
        "val/test_score/aime",
    ]


def test_cli_writes_one_png_per_panel_and_an_overview(tmp_path, capsys):
    run = _write(tmp_path / "m.jsonl", _run())
    assert main([run, "--out", str(tmp_path / "plots"), "--smooth", "2"]) == 0
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    assert names == {
        "reward.png",
        "entropy.png",
        "response_length.png",
        "off_policy_prob.png",
        "validation.png",
        "overview.png",
    }
    for p in (tmp_path / "plots").iterdir():
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000
    assert "overview.png" in capsys.readouterr().out


def test_two_runs_overlay_and_panels_without_data_are_left_out(tmp_path):
    a = tmp_path / "luffy"
    b = tmp_path / "on_policy"
    a.mkdir()
    b.mkdir()
    no_off = [{k: v for k, v in r.items() if k != "actor/off_policy_prob"} for r in _run()]
    main([_write(a / "metrics.jsonl", no_off), _write(b / "metrics.jsonl", no_off), "--out", str(tmp_path / "p")])
    assert not (tmp_path / "p" / "off_policy_prob.png").exists()
    assert (tmp_path / "p" / "reward.png").exists()


def test_file_without_plottable_metrics_is_an_error(tmp_path):
    path = _write(tmp_path / "m.jsonl", [{"step": 1, "timing_s/step": 1.0}])
    with pytest.raises(ValueError, match="critic/score/mean"):
        main([path, "--out", str(tmp_path / "p")])
