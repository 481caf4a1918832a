"""TrainerCheckpointer driven by the real ``MIXRayPPOTrainer.fit`` loop with an in-process worker.

The rollout/reward/update of a step are replaced by a scripted update of a tiny HF model (one AdamW
step on token ids derived from the step's prompt indexes), so these tests pin the checkpoint policy
itself: resume continues with the same prompts, prefix ratios and weights, also across epoch
boundaries; crashes before the rename or the tracker write, or a SIGKILL mid-save, leave the previous
checkpoint as the one resume picks; retention; best model; resume_mode parsing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from luffy_pool.run.checkpointing import CheckpointUnusableError, TrainerCheckpointer, read_data_order
from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer, StepOutput
from verl.utils.checkpoint import layout
from verl.utils.dataset.sampler import ResumableRandomSampler
from verl.workers.checkpoint_mixin import CheckpointMixin
from verl.workers.config_sections import WorkerSections
from luffy_pool.config.compose import compose_config
from luffy_pool.config.sections import ConfigSections

HERE = os.path.dirname(os.path.abspath(__file__))


class SimulatedCrash(RuntimeError):
    pass


class LocalActorWorker(CheckpointMixin):
    """The worker's checkpoint-relevant state, unsharded, in this process (no Ray, no process group)."""

    def __init__(self, model_dir: str):
        from types import SimpleNamespace

        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        self.actor_module = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.actor_optimizer = torch.optim.AdamW(self.actor_module.parameters(), lr=1e-2)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.actor_optimizer, lambda s: 1.0 / (1 + 0.1 * s))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.actor = SimpleNamespace(nonfinite_skips=0, adaptive_entropy=None)
        self.rank = 0
        # what the real worker builds from actor_rollout_ref (the checkpoint reads actor.checkpoint.contents)
        self.sections = WorkerSections.from_config(
            compose_config([f"actor_rollout_ref.model.path={model_dir}"]).actor_rollout_ref
        )

    def train_on(self, indexes, step: int) -> None:
        vocab = self.actor_module.config.vocab_size
        ids = (torch.as_tensor(indexes).view(-1, 1) * 7 + torch.arange(8) * 3 + step) % (vocab - 3) + 3
        self.actor_module(input_ids=ids, labels=ids).loss.backward()
        self.actor_optimizer.step()
        self.lr_scheduler.step()
        self.actor_optimizer.zero_grad(set_to_none=True)

    def weights(self) -> dict:
        return {k: v.detach().clone() for k, v in self.actor_module.state_dict().items()}


class LocalGroup:
    """Stands in for a 1-rank RayWorkerGroup: every method returns the list of per-rank answers."""

    world_size = 1

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        method = getattr(self.worker, name)
        return lambda *a, **kw: [method(*a, **kw)]


class ScriptedTrainer(MIXRayPPOTrainer):
    """The real fit/_next_batch/_due loop; a step = draw prefix ratios + scripted actor update."""

    crash_at_step = None

    def rollout_step(self, timing):  # fit's step: draws its batch, then the scripted update
        batch_dict = self._next_batch()
        if self.global_steps == self.crash_at_step:
            raise SimulatedCrash(f"crash in step {self.global_steps}")
        indexes = [int(i) for i in batch_dict["index"]]
        ratios = self.ratio_sampler.draw(len(indexes), self.global_steps)
        self.wg.train_on(indexes, self.global_steps)
        self.checkpointer.record_data_order(self.global_steps, indexes)
        self.ratio_log[self.global_steps] = np.asarray(ratios).tolist()
        return StepOutput(
            {"training/global_step": self.global_steps, **self.val_by_step.get(self.global_steps, {})}, 1, 1
        )


def _collate(rows):
    return {"index": np.asarray(rows)}


@pytest.fixture(scope="module")
def base_config(compose_config, tmp_path_factory):
    cfg = compose_config(
        [
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.n_prefix=1",
            "actor_rollout_ref.rollout.min_prefix_ratio=0.0",
            "actor_rollout_ref.rollout.max_prefix_ratio=1.0",
            "actor_rollout_ref.rollout.prefix_strategy=random",
            "actor_rollout_ref.ref.use_ref=False",
            "actor_rollout_ref.actor.use_kl_loss=False",
            "trainer.test_freq=-1",
            "+trainer.val_before_train=False",
            "data.train_batch_size=4",
        ]
    )
    return cfg


def make_trainer(
    base_config,
    model_dir,
    out_dir,
    *,
    rows=12,
    steps=6,
    save_freq=2,
    keep=None,
    resume_mode="auto",
    crash_at=None,
    val_by_step=None,
    **trainer_keys,
):
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader

    cfg = OmegaConf.merge(
        base_config,
        {
            "trainer": {
                "default_local_dir": str(out_dir),
                "total_training_steps": steps,
                "save_freq": save_freq,
                "max_optim_to_keep": keep,
                "resume_mode": resume_mode,
                **trainer_keys,
            }
        },
    )
    sampler = ResumableRandomSampler(rows, seed=47)
    loader = DataLoader(list(range(rows)), batch_size=4, sampler=sampler, drop_last=True, collate_fn=_collate)
    worker = LocalActorWorker(model_dir)
    trainer = ScriptedTrainer(
        cfg,
        worker.tokenizer,
        LocalGroup(worker),
        None,
        None,
        loader,
        checkpointer=TrainerCheckpointer(ConfigSections.from_config(cfg), sampler),
    )
    trainer.crash_at_step = crash_at
    trainer.ratio_log = {}
    trainer.val_by_step = val_by_step or {}
    return trainer, worker


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize(
    "rows,steps,crash_at",
    [(12, 6, 5), (8, 5, 3), (10, 5, 3)],
    ids=["mid-epoch", "epoch-boundary", "epoch-boundary-with-dropped-remainder"],
)
def test_resume_after_crash_replays_same_prompts_ratios_and_weights(
    base_config, tiny_model_dir, tmp_path, rows, steps, crash_at
):
    ref, ref_worker = make_trainer(base_config, tiny_model_dir, tmp_path / "ref", rows=rows, steps=steps)
    ref.fit()
    crashed, _ = make_trainer(base_config, tiny_model_dir, tmp_path / "run", rows=rows, steps=steps, crash_at=crash_at)
    with pytest.raises(SimulatedCrash):
        crashed.fit()
    resumed, worker = make_trainer(base_config, tiny_model_dir, tmp_path / "run", rows=rows, steps=steps)
    resumed.fit()
    last_saved = (crash_at - 1) // 2 * 2
    assert resumed.global_steps == steps
    assert sorted(resumed.ratio_log) == list(range(last_saved + 1, steps + 1)), "resume must train the remaining steps"
    assert read_data_order(str(tmp_path / "run")) == read_data_order(str(tmp_path / "ref"))
    assert all(resumed.ratio_log[s] == ref.ratio_log[s] for s in resumed.ratio_log)
    assert _max_diff(worker.weights(), ref_worker.weights()) <= 1e-6
    assert worker.lr_scheduler.get_last_lr() == ref_worker.lr_scheduler.get_last_lr()
    assert layout.read_tracker(str(tmp_path / "run")) == steps


def test_resume_at_the_last_step_trains_nothing_more(base_config, tiny_model_dir, tmp_path):
    done, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=2)
    done.fit()
    again, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=2)
    again.fit()
    assert again.global_steps == 2 and again.ratio_log == {}


def fit_killed_in(trainer, monkeypatch, name, kill_if, why):
    """``trainer.fit()`` with the call ``layout.<name>(*args)`` for which ``kill_if(*args)`` raising
    SimulatedCrash instead of running; the patch is gone afterwards."""
    real = getattr(layout, name)

    def maybe_die(*args):
        if kill_if(*args):
            raise SimulatedCrash(why)
        real(*args)

    monkeypatch.setattr(layout, name, maybe_die)
    with pytest.raises(SimulatedCrash):
        trainer.fit()
    monkeypatch.undo()


def test_crash_before_rename_keeps_previous_checkpoint(base_config, tiny_model_dir, tmp_path, monkeypatch):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=4)
    fit_killed_in(
        trainer,
        monkeypatch,
        "publish_dir",
        lambda tmp, final: final.endswith(layout.step_dir_name(4)),
        "killed between temp write and rename",
    )
    assert layout.read_tracker(str(tmp_path)) == 2
    assert os.path.isdir(tmp_path / (layout.TMP_PREFIX + "global_step_4"))
    resumed, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=4)
    assert resumed.checkpointer.maybe_resume(resumed) == 2
    assert not os.path.exists(tmp_path / (layout.TMP_PREFIX + "global_step_4")), "leftover temp dir is removed"


def test_crash_before_tracker_write_resumes_previous_and_replaces_stale_dir(
    base_config, tiny_model_dir, tmp_path, monkeypatch
):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=4)
    fit_killed_in(
        trainer, monkeypatch, "write_tracker", lambda root, step: step == 4, "killed between rename and tracker write"
    )
    assert layout.read_tracker(str(tmp_path)) == 2 and os.path.isdir(tmp_path / "global_step_4")
    resumed, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=4)
    resumed.fit()
    assert sorted(resumed.ratio_log) == [3, 4] and layout.read_tracker(str(tmp_path)) == 4


def test_retention_drops_old_shards_but_keeps_driver_and_extra_state(base_config, tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6, keep=2)
    trainer.fit()
    step2 = tmp_path / "global_step_2"
    assert not (step2 / "actor" / layout.MODEL_DIR).exists() and not (step2 / "actor" / layout.OPTIM_DIR).exists()
    assert (step2 / layout.DATA_FILE).exists() and (step2 / "actor" / layout.extra_state_file(1, 0)).exists()
    assert (step2 / "actor" / layout.HF_DIR / "config.json").exists()
    for step in (4, 6):
        assert layout.has_sharded_model(str(tmp_path / f"global_step_{step}" / "actor"))
    pruned, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6, resume_mode=str(step2))
    with pytest.raises(
        CheckpointUnusableError, match="global_step_2/actor/model was pruned by trainer.max_optim_to_keep"
    ):
        pruned.checkpointer.maybe_resume(pruned)


def test_resume_mode_disable_explicit_paths_and_bad_path(base_config, tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=4)
    trainer.fit()
    for mode, expected in [
        ("disable", 0),
        (str(tmp_path / "global_step_2"), 2),
        (str(tmp_path / "global_step_2" / "actor"), 2),
        (str(tmp_path), 4),
    ]:
        t, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=4, resume_mode=mode)
        assert t.checkpointer.maybe_resume(t) == expected, mode
    t, _ = make_trainer(
        base_config,
        tiny_model_dir,
        tmp_path,
        steps=4,
        resume_mode="resume_path",
        resume_from_path=str(tmp_path / "global_step_2"),
    )
    assert t.checkpointer.maybe_resume(t) == 2
    bad, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=4, resume_mode=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="trainer.resume_mode"):
        bad.checkpointer.maybe_resume(bad)


def test_best_model_follows_val_avg_score(base_config, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    val = {2: {"val/avg_score": 0.5}, 4: {"val/avg_score": 0.4}, 6: {"val/avg_score": 0.75}}
    trainer, worker = make_trainer(base_config, tiny_model_dir, tmp_path, steps=6, val_by_step=val)
    trainer.fit()
    best = tmp_path / "best" / "actor"
    record = json.loads((best / layout.BEST_METRICS_FILE).read_text())
    assert record["best_avg_score"] == 0.75 and record["global_step"] == 6
    loaded = AutoModelForCausalLM.from_pretrained(str(best), dtype=torch.float32)
    assert _max_diff(worker.weights(), loaded.state_dict()) == 0.0
    assert trainer.checkpointer.maybe_save_best(trainer, {"val/avg_score": 0.75}) is False
    # LUFFY's key, avg_score, is accepted too (a LUFFY-style metrics dict without val/avg_score)
    assert trainer.checkpointer.maybe_save_best(trainer, {"avg_score": 0.75}) is False
    assert trainer.checkpointer.maybe_save_best(trainer, {"avg_score": 0.8}) is True
    assert json.loads((best / layout.BEST_METRICS_FILE).read_text())["best_avg_score"] == 0.8


def test_save_reports_size_and_time_in_the_step_metrics(base_config, tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=2)
    trainer.global_steps = 1
    metrics = {}
    trainer.checkpointer.save(trainer, metrics)
    assert metrics["checkpoint/size_mb"] > 0 and metrics["checkpoint/save_s"] > 0
    assert trainer.checkpointer.last_good_checkpoint() == str(tmp_path / "global_step_1")


def test_save_hf_on_save_writes_a_loadable_hf_folder_in_the_checkpoint(base_config, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer, worker = make_trainer(base_config, tiny_model_dir, tmp_path, steps=2, save_hf_on_save=True)
    trainer.fit()
    hf_dir = tmp_path / "global_step_2" / "actor" / layout.HF_DIR
    loaded = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    assert _max_diff(worker.weights(), loaded.state_dict()) == 0.0
    assert (hf_dir / "tokenizer.json").exists()


def test_data_order_log_keeps_last_record_and_tolerates_torn_tail(tmp_path):
    (tmp_path / "data_order.jsonl").write_text('{"step": 1, "index": [3]}\n{"step": 1, "index": [4]}\n{"step": 2, "ind')
    assert read_data_order(str(tmp_path)) == {1: [4]}


# ---------------------------------------------------------------------- SIGKILL during a save
def killable_run(config_path: str, model_dir: str, out_dir: str) -> None:
    """Child process: checkpoint step 2, then block inside the step-4 save after the shards are written."""
    from omegaconf import OmegaConf

    base = OmegaConf.load(config_path)
    trainer, worker = make_trainer(base, model_dir, out_dir, steps=4)
    real_save = worker.save_checkpoint

    def save_then_hang(local_path, global_step=None, **kw):
        out = real_save(local_path, global_step=global_step, **kw)
        if global_step == 4:
            print("SAVING_STEP_4", flush=True)
            time.sleep(600)
        return out

    worker.save_checkpoint = save_then_hang
    trainer.fit()


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_sigkill_while_writing_a_checkpoint_leaves_previous_one_for_resume(base_config, tiny_model_dir, tmp_path):
    from omegaconf import OmegaConf

    config_path = tmp_path / "config.yaml"
    OmegaConf.save(base_config, config_path)
    out_dir = tmp_path / "run"
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import test_checkpointing as t; "
        f"t.killable_run({str(config_path)!r}, {tiny_model_dir!r}, {str(out_dir)!r})"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE
    )
    watchdog = threading.Timer(300, proc.kill)  # a silent hang must not block the suite
    watchdog.start()
    try:
        for line in proc.stdout:
            if "SAVING_STEP_4" in line:
                break
        else:
            pytest.fail(f"child never reached the step-4 save (exit {proc.wait()})")
        watchdog.cancel()
        assert os.path.isdir(out_dir / (layout.TMP_PREFIX + "global_step_4") / "actor" / layout.MODEL_DIR)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
    assert layout.read_tracker(str(out_dir)) == 2 and not (out_dir / "global_step_4").exists()
    resumed, _ = make_trainer(base_config, tiny_model_dir, out_dir, steps=4)
    resumed.fit()
    assert sorted(resumed.ratio_log) == [3, 4] and layout.read_tracker(str(out_dir)) == 4


def test_default_hdfs_dir_mirrors_every_published_checkpoint(base_config, tiny_model_dir, tmp_path):
    mirror = tmp_path / "mirror"
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path / "run", steps=4, default_hdfs_dir=str(mirror))
    trainer.fit()
    assert sorted(p for p in os.listdir(mirror)) == ["global_step_2", "global_step_4", layout.TRACKER_FILE]
    assert layout.read_tracker(str(mirror)) == 4
    for step in (2, 4):
        local, copy = tmp_path / "run" / f"global_step_{step}", mirror / f"global_step_{step}"
        assert (copy / layout.DATA_FILE).read_bytes() == (local / layout.DATA_FILE).read_bytes()
        assert sorted(os.listdir(copy / layout.ACTOR_DIR)) == sorted(os.listdir(local / layout.ACTOR_DIR))


def test_trainer_state_dict_round_trip(base_config, tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(base_config, tiny_model_dir, tmp_path, steps=2)
    trainer.last_val_metrics = {"val/avg_score": 0.25}
    trainer.kl_ctrl.value = 0.125
    state = trainer.state_dict()
    assert set(state) == {"ratio_sampler", "kl_coef", "last_val_metrics"} and state["kl_coef"] == 0.125
    drawn = np.asarray(trainer.ratio_sampler.draw(4, 1)).tolist()
    trainer.last_val_metrics, trainer.kl_ctrl.value, trainer._data_iter = {}, 9.0, iter([])
    trainer.load_state_dict(state)
    assert np.asarray(trainer.ratio_sampler.draw(4, 1)).tolist() == drawn
    assert trainer.last_val_metrics == {"val/avg_score": 0.25} and trainer.kl_ctrl.value == 0.125
    assert trainer._data_iter is None  # the next batch comes from the (restored) sampler
