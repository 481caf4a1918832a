"""End to end: ``algorithm.method=<m>`` trains 2 steps on the tiny model and task with LUFFY's tiny overrides
(n=4, one full demonstration row per prompt, 2 FSDP ranks, HF rollout) and logs its own metrics, finite."""

import json
import math

import pytest

pytestmark = pytest.mark.e2e

# the metrics each method's blocks add (actor/* from its loss, hpt/* srft/* from its driver stage)
METHOD_METRICS = {
    "hpt": ("hpt/sft_group_fraction", "hpt/mean_successes", "actor/sft_loss", "actor/on_pg_loss"),
    "srft": ("srft/correct_fraction", "actor/srft/H", "actor/srft/sft_coef", "actor/srft/on_coef", "actor/off_pg_loss"),
    "chord": ("actor/mu", "actor/expert/sft_phi_loss", "actor/usual/pg_loss", "actor/loss"),
    "grpo": ("actor/pg_clipfrac", "actor/ppo_kl"),
    "prefix_rft": ("prefix_rft/prefix_ratio", "actor/prefix_rft/kept_prefix_share", "actor/pg_clipfrac"),
    "uft": ("uft/hint_probability", "uft/hint_share", "actor/uft/hint_nll", "actor/uft/pg_loss"),
    "relift": ("relift/hard_questions", "relift/buffer_size", "relift/sft_rows", "actor/pg_clipfrac"),
    # the random tiny model solves nothing, so ExGRPO stays in its on-policy warm-up here (its mixed phase and
    # pool: tests/luffy_pool/run/test_exgrpo_resume_e2e.py)
    "exgrpo": (
        "exgrpo/solved_ratio",
        "exgrpo/mixed",
        "exgrpo/pool_questions",
        "actor/on_pg_loss",
        "actor/on_pg_clipfrac",
        "actor/ppo_kl",
        "actor/on_ratio_mean",
        "actor/on_ratio_var_m",
        "actor/on_ratio_max_m",
    ),
    "rl_plus": (
        "actor/off_pg_loss",
        "actor/off_ratio_mean",
        "actor/on_pg_loss",
        "actor/rl_plus/explore_weight",
        "actor/rl_plus/behaviour_prob",
    ),
    "ampo": (
        "ampo/guided_groups",
        "ampo/guided_rows",
        "ampo/teacher_scoreB",
        "ampo/teacher_score",
        "actor/on_pg_loss",
        "actor/off_pg_loss",
        "actor/on_pg_clipfrac",
        "actor/off_ratio_mean",
    ),
    "questa": (
        "questa/hint_ratio",
        "questa/hinted_share",
        "questa/kept_groups",
        "questa/kept_tokens",
        "questa/success_rate",
        "actor/questa/pg_loss",
        "actor/pg_clipfrac",
    ),
}
METHOD_METRICS["sdpo"] = (
    "sdpo/success_group_fraction",
    "sdpo/teacher_row_fraction",
    "actor/sdpo/distill_loss",
    "actor/sdpo/teacher_rows",
)
METHOD_METRICS["sdft"] = ("sdft/teacher_row_fraction", "actor/sdft/distill_loss", "actor/sdft/teacher_rows")
# relift: a buffer of 2 demonstrations (one per rank), so the SFT stage runs within the 2 steps
METHOD_OVERRIDES = {
    # sdpo: the random tiny model solves nothing; a threshold of 0 makes every sibling a teacher demonstration
    "sdpo": ["algorithm.sdpo.success_threshold=0.0"],
    "relift": [
        "algorithm.relift.sft_data_size=2",
        "algorithm.relift.sft_mini_batch_size=2",
        "algorithm.relift.sft_micro_batch_size=1",
    ],
    # questa: the whole solution as hint at step 1 (the tiny task's are 11 characters: 0.5 gives none), 0.5 at step 2;
    # the random tiny model solves nothing, so the all-failed groups are kept (success_lb=0) for the loss to see them
    "questa": [
        "algorithm.questa.hint_ratios=[1.0,0.5]",
        "algorithm.questa.stage_starts=[0.5]",
        "algorithm.questa.success_lb=0.0",
    ],
    # ampo: the tiny task's answers are boxed
    "ampo": ["algorithm.ampo.answer_format=boxed"],
}
# the tiny LUFFY overrides give one full demonstration slot per group; grpo, relift and exgrpo replace it
# (n_prefix=0), prefix_rft's and uft's prefix slots are partial (a share < 1 of the demonstration, the hint)
# ampo: n fresh rollouts per group (its teacher rows replace failed ones after the reward)
NO_FULL_TRACE_SLOT = {"grpo", "relift", "exgrpo", "prefix_rft", "uft", "questa", "sdpo", "sdft", "ampo"}


@pytest.mark.parametrize("method", sorted(METHOD_METRICS))
def test_method_trains_two_steps(
    method, tiny_model_dir, tiny_task_dir, tmp_path, ray_session, compose_config, luffy_overrides, fit_with_fingerprints
):
    overrides = luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path), steps=2)
    overrides = [o for o in overrides if not o.startswith("trainer.test_freq")] + ["trainer.test_freq=-1"]
    if method == "uft":  # its hint segments, cut from the demonstrations by the pre-processor
        from data.prepare_uft_hints import main as prepare_hints

        prepare_hints(["--input", f"{tiny_task_dir}/train.parquet", "--output", str(tmp_path / "train_hints.parquet")])
        overrides = [o for o in overrides if not o.startswith("data.train_files")] + [
            f"data.train_files={tmp_path}/train_hints.parquet"
        ]
    if method == "ampo":  # two teachers per prompt: its own demonstration and the next row's (a wrong answer)
        from luffy_pool.methods.ampo import add_teachers
        from verl.utils.data_format import read_records, write_records

        records = add_teachers(read_records(f"{tiny_task_dir}/train.parquet"), "train.parquet")
        for i, rec in enumerate(records):
            other = records[(i + 1) % len(records)]["targets"][0]
            rec["targets"] = rec["targets"] + [dict(other, source="other", quality_score=0.5)]
        write_records(records, str(tmp_path / "train_teachers.parquet"))
        overrides = [o for o in overrides if not o.startswith("data.train_files")] + [
            f"data.train_files={tmp_path}/train_teachers.parquet"
        ]
    # the tiny LUFFY overrides set LUFFY's switches; the method's preset is stated, as its launch script does
    from luffy_pool.methods import get_method

    preset = [f"{k}={v}" for k, v in get_method(method).preset_keys().items()]
    config = compose_config(overrides + [f"algorithm.method={method}"] + preset + METHOD_OVERRIDES.get(method, []))
    trainer, before, _, after = fit_with_fingerprints(config)
    assert all(abs(a - b) > 1e-8 for a, b in zip(before, after)), "weights must change"
    assert trainer.method.name == method
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in METHOD_METRICS[method]:
            assert key in r, (method, key)
            assert math.isfinite(r[key]), (method, key, r[key])
        assert r["rollout/full_trace_slots"] == (0 if method in NO_FULL_TRACE_SLOT else 4)
    if method == "chord":  # CHORD-phi defaults: mu constant 0.1
        assert [r["actor/mu"] for r in rows] == pytest.approx([0.1, 0.1])
    if method == "prefix_rft":  # cosine over the run's 2 steps: 0.95, then half-way 0.5
        assert [r["prefix_rft/prefix_ratio"] for r in rows] == pytest.approx([0.95, 0.5])
        assert all(r["rollout/engine_tokens"] > 0 for r in rows)
    if method == "uft":  # p(t) of UFT's cosine at t = 1, 2 (T_hint = 300)
        assert [r["uft/hint_probability"] for r in rows] == pytest.approx([0.949975, 0.949901], abs=1e-6)
        assert any(r["uft/hint_share"] > 0 and r["actor/uft/hint_nll"] > 0 for r in rows)
    if method == "sdpo":  # every row has a successful sibling (threshold 0): all rows are distilled
        assert all(r["sdpo/teacher_row_fraction"] == 1.0 and r["actor/sdpo/teacher_rows"] == 1.0 for r in rows)
    if method == "hpt":
        assert all(0.0 <= r["hpt/sft_group_fraction"] <= 1.0 for r in rows)
    if method == "rl_plus":  # the mixture (3q+1)/4 and the weight (1-p)^0.5 on the demonstration tokens
        assert all(0.25 <= r["actor/rl_plus/behaviour_prob"] <= 1.0 for r in rows)
        assert all(0.0 <= r["actor/rl_plus/explore_weight"] <= 1.0 for r in rows)
    if method == "questa":  # the stage table: a hint on every prompt at step 1, none at step 2
        assert [(r["questa/hint_ratio"], r["questa/hinted_share"]) for r in rows] == [(1.0, 1.0), (0.5, 0.0)]
        assert all(r["questa/kept_groups"] == 1.0 and r["questa/kept_tokens"] > 0 for r in rows)
    if method == "ampo":  # the random tiny model solves nothing: every group gets its 2 teacher rows (n_guides)
        assert all(r["ampo/guided_groups"] == 1.0 and r["ampo/guided_rows"] > 0 for r in rows)
        assert all(0.0 <= r["ampo/teacher_scoreB"] <= 1.0 and r["actor/off_ratio_mean"] > 0 for r in rows)
        usage = trainer.state_dict()["hooks"]["state"]["ampo"]["usage"]  # saved with the checkpoint's trainer state
        assert sum(usage.values()) == sum(r["ampo/guided_rows"] for r in rows)
    if method == "relift":  # every SFT stage takes 2 rows off the buffer; its metrics come with it
        sft = [r for r in rows if r["relift/sft_rows"]]
        assert sft and all(r["relift/sft_rows"] == 2 and math.isfinite(r["actor/sft_loss"]) for r in sft)
        assert all(("actor/sft_loss" in r) == bool(r["relift/sft_rows"]) for r in rows)
        added = [r["relift/hard_questions"] for r in rows]
        assert rows[-1]["relift/buffer_size"] == sum(added) - 2 * len(sft)
    if method == "exgrpo":  # nothing solved: warm-up throughout, nothing collected, no question replayed
        assert [(r["exgrpo/mixed"], r["exgrpo/pool_questions"], r["exgrpo/replayed_questions"]) for r in rows] == [
            (0.0, 0, 0),
            (0.0, 0, 0),
        ]
