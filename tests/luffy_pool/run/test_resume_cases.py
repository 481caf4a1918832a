"""Resume cases from the anchors' trackers (REVIEW_2026-12c part J), on the real ``MIXRayPPOTrainer.fit`` loop
with the in-process scripted worker of test_checkpointing.py:

- a checkpoint at the last step of an epoch (``total_epochs=2``, no explicit step count) resumes into the
  second epoch and runs every remaining step (verl PR #5725 found one that silently ran none);
- the data sampler's position, epoch and generator come back, so the resumed run sees the same prompts;
- a larger ``trainer.total_training_steps`` on resume continues to the new total (constant lr), and is
  refused in one line when the lr schedule is sized by the total (cosine, or a warmup still running).
The world-size change is tests/verl/utils/checkpoint/test_world_size_change.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from luffy_pool.run.checkpointing import ResumeRefusedError, lr_schedule_change_problem, read_data_order
from verl.utils.checkpoint import layout
from tests.luffy_pool.run.test_checkpointing import _max_diff, base_config, make_trainer  # noqa: F401 (fixture)

ROWS, BATCH = 8, 4  # two batches per epoch


def _sampler_state(trainer) -> dict:
    return trainer.checkpointer.sampler.state_dict()


def test_checkpoint_at_an_epoch_end_resumes_into_the_next_epoch(base_config, tiny_model_dir, tmp_path):
    per_epoch = ROWS // BATCH
    epochs = dict(total_epochs=2, total_training_steps=None)
    ref, ref_worker = make_trainer(
        base_config, tiny_model_dir, tmp_path / "ref", rows=ROWS, save_freq=per_epoch, **epochs
    )
    ref.fit()
    assert ref.total_training_steps == 2 * per_epoch
    first, _ = make_trainer(
        base_config, tiny_model_dir, tmp_path / "run", rows=ROWS, save_freq=per_epoch, crash_at=per_epoch + 1, **epochs
    )
    with pytest.raises(RuntimeError, match="crash in step"):
        first.fit()
    assert layout.read_tracker(str(tmp_path / "run")) == per_epoch  # saved exactly at the end of epoch 1
    saved = torch.load(tmp_path / "run" / f"global_step_{per_epoch}" / layout.DATA_FILE, weights_only=True)
    assert saved["sampler"]["perm_index"] == ROWS and saved["sampler"]["epoch"] == 0  # the first epoch (0), used up

    resumed, worker = make_trainer(
        base_config, tiny_model_dir, tmp_path / "run", rows=ROWS, save_freq=per_epoch, **epochs
    )
    resumed.fit()
    assert sorted(resumed.ratio_log) == list(range(per_epoch + 1, 2 * per_epoch + 1))  # not zero steps
    # same prompts per step, same prefix ratios, same sampler position and generator, same weights
    assert read_data_order(str(tmp_path / "run")) == read_data_order(str(tmp_path / "ref"))
    assert all(resumed.ratio_log[s] == ref.ratio_log[s] for s in resumed.ratio_log)
    ref_state, state = _sampler_state(ref), _sampler_state(resumed)
    assert (state["epoch"], state["perm_index"]) == (ref_state["epoch"], ref_state["perm_index"]) == (1, ROWS)
    assert torch.equal(state["perm"], ref_state["perm"])
    assert torch.equal(state["generator_state"], ref_state["generator_state"])
    assert _max_diff(worker.weights(), ref_worker.weights()) <= 1e-6


def test_sampler_position_and_generator_are_restored_mid_epoch(base_config, tiny_model_dir, tmp_path):
    run, _ = make_trainer(base_config, tiny_model_dir, tmp_path, rows=12, steps=1, save_freq=1)
    run.fit()  # one batch of the first epoch consumed and saved
    saved = _sampler_state(run)
    fresh, _ = make_trainer(base_config, tiny_model_dir, tmp_path, rows=12, steps=3, save_freq=1)
    torch.manual_seed(123)
    before = _sampler_state(fresh)
    assert before["perm_index"] == 0
    assert fresh.checkpointer.maybe_resume(fresh) == 1
    after = _sampler_state(fresh)
    assert after["perm_index"] == BATCH and after["epoch"] == saved["epoch"]
    assert torch.equal(after["perm"], saved["perm"]) and torch.equal(after["generator_state"], saved["generator_state"])
    # the next batch continues the saved permutation where the first batch stopped
    assert [int(i) for i in fresh._next_batch()["index"]] == saved["perm"][BATCH : 2 * BATCH].tolist()


def test_raising_total_training_steps_on_resume_continues_to_the_new_total(base_config, tiny_model_dir, tmp_path):
    ref, ref_worker = make_trainer(base_config, tiny_model_dir, tmp_path / "ref", steps=6)
    ref.fit()
    short, _ = make_trainer(base_config, tiny_model_dir, tmp_path / "run", steps=4)
    short.fit()
    assert layout.read_tracker(str(tmp_path / "run")) == 4
    longer, worker = make_trainer(base_config, tiny_model_dir, tmp_path / "run", steps=6)
    longer.fit()  # the YAML's constant lr without warmup: the schedule does not depend on the total
    assert sorted(longer.ratio_log) == [5, 6] and layout.read_tracker(str(tmp_path / "run")) == 6
    assert read_data_order(str(tmp_path / "run")) == read_data_order(str(tmp_path / "ref"))
    assert _max_diff(worker.weights(), ref_worker.weights()) <= 1e-6


def test_raising_total_training_steps_with_a_cosine_lr_is_refused_in_one_line(base_config, tiny_model_dir, tmp_path):
    cosine = "actor_rollout_ref.actor.optim.warmup_style"
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(base_config, OmegaConf.from_dotlist([f"{cosine}=cosine"]))
    short, _ = make_trainer(cfg, tiny_model_dir, tmp_path, steps=4)
    short.fit()
    longer, _ = make_trainer(cfg, tiny_model_dir, tmp_path, steps=6)
    with pytest.raises(ResumeRefusedError) as err:  # never a silent fall back to the older global_step_2
        longer.fit()
    msg = str(err.value)
    assert "\n" not in msg and "total_training_steps=6" in msg and "had 4" in msg and "cosine" in msg
    assert longer.ratio_log == {}
    same, _ = make_trainer(cfg, tiny_model_dir, tmp_path, steps=4)
    assert same.checkpointer.maybe_resume(same) == 4  # an unchanged total resumes as before


@pytest.mark.parametrize(
    "style,ratio,step,refused",
    [
        ("constant", 0.0, 4, False),  # LUFFY's default: lr = optim.lr whatever the total
        ("constant", 0.5, 4, False),  # warmup 2 -> 3 steps, both over by step 4
        ("constant", 0.5, 2, True),  # warmup 2 -> 3 steps, still running at step 2
        ("cosine", 0.0, 4, True),
    ],
)
def test_lr_schedule_change_rule(style, ratio, step, refused):
    optim = SimpleNamespace(warmup_style=style, lr_warmup_steps_ratio=ratio)
    assert (lr_schedule_change_problem(optim, 4, 6, step) is not None) is refused
    assert (
        lr_schedule_change_problem(optim, 6, 6, step) is None
        and lr_schedule_change_problem(optim, None, 6, step) is None
    )


def test_a_refused_resume_ends_the_run_with_its_own_line(caplog):
    from luffy_pool.run.launcher import fit_and_close

    def fit():
        raise ResumeRefusedError("cannot resume step 4 with trainer.total_training_steps=6: ...")

    closed = []
    trainer = SimpleNamespace(
        fit=fit,
        global_steps=0,
        checkpointer=SimpleNamespace(last_good_checkpoint=lambda: "/run/global_step_4", refused_summary=lambda: ""),
    )
    with pytest.raises(ResumeRefusedError, match="total_training_steps=6"):
        fit_and_close(trainer, lambda: closed.append(True))
    assert closed == [True]
    assert "training failed" not in caplog.text  # not reported as a failed step with a checkpoint to resume
