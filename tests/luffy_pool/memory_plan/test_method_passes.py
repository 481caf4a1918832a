"""A method's extra actor forward in the memory plan: ExGRPO's trajectory metric (luffy_pool/methods/exgrpo.py) is
one more pass through the old-log-prob path, with its micro-batches, so it is planned like that pass."""

from __future__ import annotations

import os

from luffy_pool import memory_plan as mp
from luffy_pool.config.compose import compose_config
from luffy_pool.memory_plan.launch_script import script_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TRAIN, TRAIN_EXGRPO = (os.path.join(ROOT, "exp_scripts", s) for s in ("train.sh", "train_exgrpo.sh"))
METRIC_PHASE = "log-prob: ExGRPO trajectory ent (actor)"


def _plan(script, *extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "EXP_NAME")}
    return mp.plan_for_config(compose_config(script_overrides(script, list(extra), env=env)), mp.parse_gpu_memory("80"))


def test_exgrpo_plans_its_trajectory_metric_forward_like_the_old_log_prob_pass():
    plan = _plan(TRAIN_EXGRPO)
    metric, old = plan.phase(METRIC_PHASE), plan.phase("log-prob: old (actor)")
    assert [(ln.what, ln.bytes) for ln in metric.lines] == [(ln.what, ln.bytes) for ln in old.lines]
    assert not any("ExGRPO" in p.name for p in _plan(TRAIN).phases)
    assert not any("ExGRPO" in p.name for p in _plan(TRAIN_EXGRPO, "algorithm.exgrpo.traj_metric=random").phases)
