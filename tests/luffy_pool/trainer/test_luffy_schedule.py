"""LUFFY's schedule quirks under exp_scripts/train.sh (docs/DESIGN.md §1 item 1): lr 0 on the first update, total - 1 updates.

The reference is LUFFY's own code path, restated from its source (github ElliottYan/LUFFY,
luffy/verl/verl/utils/torch_functional.py ``get_constant_schedule_with_warmup`` and
mix_src/mix_fsdp_worker.py ``update_actor``): a ``LambdaLR`` with factor ``min(1, s / max(1, w))``,
``w = int(lr_warmup_steps_ratio * total)``, stepped once after each ``update_actor``; and
mix_src/mix_trainer.py ``fit``: ``global_steps`` starts at 1 and the loop returns once the incremented
counter reaches ``total_training_steps``. The project side is the composed config of ``bash
exp_scripts/train.sh --cfg job`` driven through the real worker's ``_build_optimizer`` / ``update_actor``
and the real trainer's ``fit``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from luffy_pool.config.sections import ConfigSections
from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer, StepOutput
from verl.protocol import DataProto
from verl.utils.batch_sizes import normalize_actor_batch_sizes, optimizer_steps_per_training_step
from verl.workers.config_sections import WorkerSections
from verl.workers.fsdp_workers import ActorRolloutRefWorker

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LUFFY_ENV = {"MODEL_PATH": "/models/qwen", "DATA_DIR": "/data"}


@pytest.fixture(scope="module")
def train_sh_config():
    """The config a run of exp_scripts/train.sh composes (its --cfg job output)."""
    env = dict(os.environ, PYTHON=sys.executable, **LUFFY_ENV)
    proc = subprocess.run(
        ["bash", os.path.join(REPO, "exp_scripts", "train.sh"), "--cfg", "job"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return OmegaConf.create(proc.stdout)


def luffy_lr_factor(step: int, warmup: int) -> float:
    """LUFFY's verl constant schedule, from its source: min(1, step / max(1, warmup))."""
    return min(1.0, float(step) / float(max(1, warmup)))


def luffy_lrs(lr: float, warmup_ratio: float, total: int, updates: int, optim_steps: int) -> list[float]:
    """The lr of every optimizer step of LUFFY's first ``updates`` update_actor calls."""
    warmup = int(warmup_ratio * total)
    return [lr * luffy_lr_factor(u, warmup) for u in range(updates) for _ in range(optim_steps)]


def project_lrs(config, total: int, updates: int, optim_steps: int) -> tuple[list[float], list[float]]:
    """Run the real worker's optimizer build and ``update_actor`` on one parameter; returns the lr of every
    optimizer step and the parameter after each update."""
    sections = WorkerSections.from_config(config.actor_rollout_ref)
    param = torch.nn.Parameter(torch.ones(3))
    module = torch.nn.Module()
    module.w = param
    # total_training_steps: what the launcher passes each worker (launcher.build_worker_group).
    worker = SimpleNamespace(
        sections=sections,
        total_training_steps=total,
        ulysses_group=None,
        row_group=None,
        actor_module=module,
        device="cpu",
        optimizer_offload=SimpleNamespace(on_compute_device=contextlib.nullcontext),
    )
    worker._update_flops = lambda data, seconds: ActorRolloutRefWorker._update_flops(worker, data, seconds)
    worker.actor_optimizer, worker.lr_scheduler = ActorRolloutRefWorker._build_optimizer(worker, module)
    seen, weights = [], []

    def update_policy(data):  # the actor's mini-batch loop: one optimizer step per mini-batch
        for _ in range(optim_steps):
            worker.actor_optimizer.zero_grad()
            param.sum().backward()
            seen.append(worker.actor_optimizer.param_groups[0]["lr"])
            worker.actor_optimizer.step()
        return {}

    worker.actor = SimpleNamespace(update_policy=update_policy)
    for _ in range(updates):
        out = ActorRolloutRefWorker.update_actor(worker, DataProto(meta_info={}))
        assert out.meta_info["metrics"]["actor/lr"] == [seen[-1]]  # logged: the lr the update ran with
        weights.append(float(param.detach()[0]))
    return seen, weights


def _optim_steps(config) -> int:
    actor = OmegaConf.to_container(config.actor_rollout_ref.actor, resolve=True)
    n, world = config.actor_rollout_ref.rollout.n, config.trainer.nnodes * config.trainer.n_gpus_per_node
    sizes = normalize_actor_batch_sizes(actor, n, world)
    return optimizer_steps_per_training_step(
        config.data.train_batch_size, n, world, sizes["ppo_mini_batch_size_per_rank"], actor["ppo_epochs"]
    )


def test_train_sh_sets_luffys_schedule_switches(train_sh_config):
    assert train_sh_config.actor_rollout_ref.actor.optim.zero_lr_first_step is True
    assert train_sh_config.trainer.stop_one_step_early is True
    assert _optim_steps(train_sh_config) == 2  # 128 prompts x 8 / (64 x 8): two optimizer steps per update


@pytest.mark.parametrize("warmup_ratio,total", [(0.0, 500), (0.01, 500)])
def test_first_five_updates_run_at_luffys_learning_rates(train_sh_config, warmup_ratio, total):
    cfg = OmegaConf.merge(
        train_sh_config, {"actor_rollout_ref": {"actor": {"optim": {"lr_warmup_steps_ratio": warmup_ratio}}}}
    )
    steps = _optim_steps(cfg)
    lr = float(cfg.actor_rollout_ref.actor.optim.lr)
    ours, weights = project_lrs(cfg, total, updates=5, optim_steps=steps)
    expected = luffy_lrs(lr, warmup_ratio, total, updates=5, optim_steps=steps)
    assert ours == pytest.approx(expected, rel=0, abs=1e-18)
    assert ours[0] == 0.0 and weights[0] == 1.0  # the first update moves nothing (Adam's moments still advance)
    assert weights[1] < 1.0
    if warmup_ratio == 0.0:
        assert ours[steps:] == [lr] * (4 * steps)
    else:  # 5 warmup steps: 0, 1/5, 2/5, 3/5, 4/5 of lr
        assert ours[::steps] == pytest.approx([lr * k / 5 for k in range(5)])


def test_without_the_switch_the_first_update_runs_at_full_lr(train_sh_config):
    cfg = OmegaConf.merge(train_sh_config, {"actor_rollout_ref": {"actor": {"optim": {"zero_lr_first_step": False}}}})
    ours, _ = project_lrs(cfg, 500, updates=3, optim_steps=1)
    assert ours == [1e-6] * 3


class _CountingTrainer(MIXRayPPOTrainer):
    """The real ``fit`` loop with a train step that only counts (no workers)."""

    def __init__(self, config, total):  # noqa: D401 - test double: no workers, dataloader or tracker
        self.config, self.sections = config, ConfigSections.from_config(config)
        self.checkpointer, self.tracker, self.val_dataset = None, None, None
        self.global_steps, self.total_training_steps, self.world_size = 0, total, 1
        self.updates, self.pending_metrics = [], {}

    def _next_batch(self):
        return {}

    def rollout_step(self, timing):
        self.updates.append(self.global_steps)
        return StepOutput({}, 0, 0)

    rollout = SimpleNamespace(extra_ranks=0, drop_in_flight=lambda: None)


def luffy_fit_steps(total: int) -> list[int]:
    """LUFFY's fit loop, from its source: steps it runs an update for."""
    steps, global_steps = [], 1
    while True:
        steps.append(global_steps)
        global_steps += 1
        if global_steps >= total:
            return steps


@pytest.mark.parametrize("total", [1, 2, 5, 12])
def test_fit_makes_luffys_number_of_updates(train_sh_config, total):
    trainer = _CountingTrainer(train_sh_config, total)
    trainer.fit()
    assert trainer.updates == luffy_fit_steps(total)
    plain = _CountingTrainer(OmegaConf.merge(train_sh_config, {"trainer": {"stop_one_step_early": False}}), total)
    plain.fit()
    assert plain.updates == list(range(1, total + 1))
