"""End to end: an ExGRPO run (``algorithm.method=exgrpo``) killed with SIGKILL resumes from its checkpoint into the
same steps as the uninterrupted run from that checkpoint: the same prompts and replayed questions per step, the same
pool metrics and the same weights.

The random tiny model solves nothing, so its own warm-up would never end and nothing would enter the pool. Each
driver therefore starts (before ``fit``, so before any resume) with the pool as if a warm-up had ended and
collected: the mixed phase, and every train question holding its teacher trace, recorded at log(0.5) per token,
in bucket 1, 2 or 3 (every second question also holds another question's trace, so the entropy forward picks
between two). A resume replaces that start with the checkpoint's state. 8 train prompts, 4 per step, n = 4
(``rbound=3`` = n − 1): each step replays 2 bucket-sampled questions (their replayed row graded correct, the 3 fresh
ones failing: bucket 1) and keeps the first 2 drawn prompts; the pool's RNGs decide which questions.

Timeline (one driver chain; ``resume_hooks``: a run configured for 5 steps writes its weights when step 5 begins,
then waits): the first driver trains steps 1-4 uninterrupted (the reference; checkpoints 2 and 4) and is SIGKILLed
inside step 5; the second resumes from its step-2 checkpoint (``resume_mode`` names it: ``auto`` would take step 4),
trains 3 and 4 again and stops at the same point.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys

import pytest
import torch

from luffy_pool.run.checkpointing import read_data_order
from verl.utils.checkpoint import layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the drivers import this module by name too
from resume_hooks import DUMP_DIR, dump_and_hang_in_last_step  # noqa: E402
from test_resume_e2e import Driver, _config, _hf_weights, _max_diff  # noqa: E402

pytestmark = pytest.mark.e2e

STEPS = 4  # compared; the runs are configured for one more step, inside which they stop (resume_hooks)
PREPARE = "test_exgrpo_resume_e2e:seed_pool_then_stop_in_the_last_step"


def seed_pool(trainer) -> None:
    """The mixed phase with every train question's teacher trace in the pool (module docstring)."""
    from luffy_pool.replay.experience import Trajectory, question_key

    pool = next(h for h in trainer.hooks if h.name == "exgrpo").pool  # the method's hook holds the pool
    ds = trainer.train_dataloader.dataset
    traces = [ds.target_token_ids(item, ds._records[item]["target"]) for item in range(len(ds))]
    for item, qid in enumerate(ds.prompt_ids):
        uid = question_key(qid)
        pool.pool[uid] = [Trajectory(traces[item], [math.log(0.5)] * (len(traces[item]) + 1))]
        if item % 2 == 0:
            other = traces[(item + 1) % len(traces)]
            pool.pool[uid].append(Trajectory(other, [math.log(0.5)] * (len(other) + 1)))
        pool.buckets.update_bucket(uid, 1 + item % 3)
    pool.mixed = True


def seed_pool_then_stop_in_the_last_step(trainer) -> None:
    seed_pool(trainer)
    dump_and_hang_in_last_step(trainer)


def _metrics(path) -> dict[int, dict]:
    return {m["step"]: m for m in (json.loads(line) for line in open(path) if line.strip())}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory, compose_config, luffy_overrides):
    from luffy_pool.tiny import write_task_parquets

    root = tmp_path_factory.mktemp("exgrpo_resume")
    task = str(root / "task")
    write_task_parquets(task, n_train=8, n_test=4, level=2, seed=0)
    # rbound = n - 1 with the tiny run's n = 4 (the authors' 7 is for n = 8)
    from tests.helpers.method_presets import preset_overrides  # here: the driver subprocess imports this module

    extra = ["algorithm.method=exgrpo", *preset_overrides("exgrpo"), "algorithm.exgrpo.rbound=3"]
    extra += [f"trainer.total_training_steps={STEPS + 1}"]
    mk = lambda name, more=(): _config(
        compose_config,
        luffy_overrides,
        tiny_model_dir,
        task,  # noqa: E731
        str(root / "run"),
        root / f"{name}.yaml",
        [*extra, *more],
    )
    first_cfg, resume_cfg = mk("run"), mk("resume", [f"trainer.resume_mode={root / 'run' / 'global_step_2'}"])
    first = Driver(first_cfg, str(root / "run_result1"), str(root / "run1.log"), prepare=PREPARE)
    first.wait_for(f"DUMPED {STEPS}")  # steps 1-4 trained (checkpoints 2 and 4 published), step 5 begun
    first.kill()
    # the uninterrupted steps as the first driver left them (the resumed driver appends to these files)
    shutil.copy(root / "run" / "metrics.jsonl", root / "ref_metrics.jsonl")
    (root / "ref_order.json").write_text(json.dumps(read_data_order(str(root / "run"))))
    second = Driver(resume_cfg, str(root / "run_result2"), str(root / "run2.log"), prepare=PREPARE)
    second.wait_for(f"DUMPED {STEPS}")
    second.kill()
    return root


def test_exgrpo_kill_and_resume_matches_the_uninterrupted_run(runs):
    assert "RESUMED_AT 2" in open(runs / "run2.log").read()
    data = torch.load(runs / "run" / "global_step_2" / layout.DATA_FILE, weights_only=True)
    hooks = data["hooks"]  # the step's hooks' state, one path (luffy_pool/trainer/mix_trainer.py state_dict)
    state = hooks["state"]["exgrpo"]
    assert hooks["method"] == "exgrpo" and state["mixed"] and len(state["pool"]["uids"]) == 8
    assert state["pool"]["token_ids"].dtype == torch.int32  # the flat version-2 pool (replay/experience.py)
    ref, run = _metrics(runs / "ref_metrics.jsonl"), _metrics(runs / "run" / "metrics.jsonl")
    assert sorted(ref) == sorted(run) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        m = ref[step]
        assert m["exgrpo/replayed_questions"] == 2 and m["rollout/full_trace_slots"] == 2, (step, m)
        assert m["exgrpo/mixed"] == 1.0 and math.isfinite(m["actor/off_ratio_mean"]) and m["actor/off_ratio_mean"] > 0
    assert sum(ref[s]["exgrpo/metric_forward_rows"] for s in ref) > 0, "the entropy forward must have chosen"
    ref_order = {int(k): v for k, v in json.loads((runs / "ref_order.json").read_text()).items()}
    assert sorted(ref_order) == list(range(1, STEPS + 1))
    assert read_data_order(str(runs / "run")) == ref_order
    keys = [k for k in ref[3] if k.startswith("exgrpo/") or k in ("actor/pg_loss", "actor/off_ratio_mean")]
    for step in (3, 4):
        assert {k: run[step][k] for k in keys} == pytest.approx({k: ref[step][k] for k in keys}, rel=1e-6, abs=1e-7)
    ref_w, run_w = _hf_weights(runs / "run_result1" / DUMP_DIR), _hf_weights(runs / "run_result2" / DUMP_DIR)
    assert _max_diff(ref_w, run_w) <= 1e-6
