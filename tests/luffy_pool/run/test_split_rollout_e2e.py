"""Split engines end to end (``actor_rollout_ref.hybrid_engine=False``, ``trainer.rollout_pipeline=one_step_off``): the
tiny LUFFY run on 1 training rank + 1 rollout rank, 4 steps with a checkpoint every 2 and validation at steps 2 and 4.
The weights cross over the gloo weight group; each step logs its staleness and finite losses.

The same run as driver processes (test_resume_e2e's ``Driver``), in one folder: the first is SIGKILLed once step 3's
generation is in flight (after step 2's checkpoint is published: the kill waits for the marker, not a timer); the
second starts with ``trainer.resume_mode=auto``, resumes from step 2 and is sent SIGTERM at the start of step 4, with
batch 4 in flight (launched before update 3): it finishes step 4, saves it, releases Ray and exits 143. Its steps 3
and 4 and its final weights equal the uninterrupted run's (the batch after a checkpoint is generated from the
checkpoint's weights in both). The uninterrupted run trains in this process (the session's Ray) while the driver
chain runs beside it.
"""

import json
import math
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from luffy_pool.config.check import check_config
from luffy_pool.run.checkpointing import read_data_order
from verl.utils.checkpoint import layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the drivers import this module by name too
from test_resume_e2e import Driver, _hf_weights, _max_diff  # noqa: E402

pytestmark = pytest.mark.e2e

SPLIT = [
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.n_gpus_per_node=1",
    "trainer.rollout_pipeline=one_step_off",
    "trainer.save_freq=2",
]
SAME = (
    "actor/pg_loss",
    "actor/grad_norm",
    "critic/score/mean",
    "batch/on_solved",
    "rollout/staleness",
    "val/avg_score",
)
IN_FLIGHT = "GENERATING 3"


def hang_while_step_3_generates(trainer) -> None:
    """The killed driver's ``prepare``: once step 3's generation is launched (step 2's checkpoint is published by
    then), say so and wait for the SIGKILL."""
    launch = trainer.rollout.launch

    def launch_then_hang(step, timing, version):
        pending = launch(step, timing, version)
        if step == 3:
            print(IN_FLIGHT, flush=True)
            time.sleep(3600)
        return pending

    trainer.rollout.launch = launch_then_hang


def _rows(folder):
    return {r["step"]: r for r in (json.loads(line) for line in open(folder / "metrics.jsonl") if line.strip())}


def _driver_chain(root, cfg) -> dict:
    """SIGKILL with step 3 generating, then resume_mode=auto and SIGTERM at the start of step 4."""
    first = Driver(
        cfg, str(root / "result1"), str(root / "run1.log"), prepare="test_split_rollout_e2e:hang_while_step_3_generates"
    )
    first.wait_for(IN_FLIGHT)
    first.kill()
    out = {
        "tracker_at_kill": layout.read_tracker(str(root / "run")),
        "published_at_kill": [s for s, _ in layout.list_step_dirs(str(root / "run"))],
    }
    second = Driver(cfg, str(root / "result2"), str(root / "run2.log"), signal_in_step=4)
    try:
        second.wait_for("STEP_START 4")
        out["rc"], out["left_alive"] = second.stop(signal.SIGTERM)
    finally:
        if second.proc.poll() is None:
            second.kill()
    return out


@pytest.fixture(scope="module")
def runs(
    tiny_model_dir, tiny_task_dir, tmp_path_factory, ray_session, compose_config, luffy_overrides, fit_with_fingerprints
):
    from omegaconf import OmegaConf

    root = tmp_path_factory.mktemp("split_rollout")
    run_cfg = root / "run.yaml"  # the driver chain's config (resume_mode is the YAML's auto)
    OmegaConf.save(
        compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(root / "run"), steps=4) + SPLIT), run_cfg
    )
    config = compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(root / "full"), steps=4) + SPLIT)
    check_config(config)
    with ThreadPoolExecutor(1) as pool:
        chain = pool.submit(_driver_chain, root, str(run_cfg))
        trainer, before, _, after = fit_with_fingerprints(config)
        out = chain.result()
    return {"root": root, "trainer": trainer, "before": before, "after": after, **out}


def test_one_step_off_on_split_ranks_trains(runs):
    trainer = runs["trainer"]
    assert trainer.rollout_wg is not None and trainer.rollout_wg.world_size == 1 and trainer.wg.world_size == 1
    assert trainer.pipeline.pending is None  # nothing left generating after the last step
    assert all(abs(a - b) > 1e-8 for a, b in zip(runs["before"], runs["after"])), "weights must change"
    rows = _rows(runs["root"] / "full")
    assert sorted(rows) == [1, 2, 3, 4]
    # batch 1 is generated before any update, batch 2 was launched before update 1; step 2 is saved, so batch 3 is
    # generated from the saved weights (not prefetched) and batch 4 launched before update 3
    assert [rows[s]["rollout/staleness"] for s in (1, 2, 3, 4)] == [0, 1, 0, 1]
    for r in rows.values():
        losses = {k: v for k, v in r.items() if k.startswith("actor/") and "loss" in k}
        assert losses and all(math.isfinite(v) for v in losses.values()), losses
        assert r["timing_s/weight_sync"] > 0
    assert "val/avg_score" in rows[2] and "val/avg_score" in rows[4]


def test_sigkill_with_a_batch_generating_then_resume_auto_equals_the_uninterrupted_run(runs):
    from verl.model_merger import merge_checkpoint

    root = runs["root"]
    assert runs["tracker_at_kill"] == 2 and runs["published_at_kill"] == [2]
    log = open(root / "run2.log").read()
    assert "RESUMED_AT 2" in log and "STEP_START 3" in log
    full, run = _rows(root / "full"), _rows(root / "run")
    assert sorted(run) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):  # 1-2 from the killed driver, 3-4 from the resumed one
        assert {k: run[step].get(k) for k in SAME} == {k: full[step].get(k) for k in SAME}, step
    assert read_data_order(str(root / "run")) == read_data_order(str(root / "full"))
    # fp32 on both sides, same world sizes: the same weights
    merged = [
        _hf_weights(merge_checkpoint(str(root / name / "global_step_4"), str(root / f"{name}_step4_hf")))
        for name in ("full", "run")
    ]
    assert _max_diff(*merged) == 0.0


def test_sigterm_with_a_batch_in_flight_saves_the_step_releases_ray_and_exits_143(runs):
    root = runs["root"]
    assert runs["rc"] == 143, f"see {root / 'run2.log'}"
    assert layout.read_tracker(str(root / "run")) == 4
    assert [s for s, _ in layout.list_step_dirs(str(root / "run"))] == [2, 4]
    assert runs["left_alive"] == 0, "the Ray processes of the stopped driver must exit with it"
    log = open(root / "run2.log").read()
    assert "received SIGTERM" in log and "Traceback" not in log
