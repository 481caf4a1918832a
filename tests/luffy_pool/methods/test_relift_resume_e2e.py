"""End to end: ReLIFT's state (the driver's hard-question buffer and the workers' SFT optimizer) survives SIGKILL.

Two driver chains at once (tests/luffy_pool/run/test_resume_e2e.py's ``Driver``: one process tree with its own Ray
each, 2 FSDP ranks, the tiny model and task, 4 prompts per step, checkpoints every 2 steps): the uninterrupted
3-step run, and the same run SIGKILLed inside step 3 (after its marker, while it sleeps) then resumed with
``resume_mode=auto`` from step 2. The buffer holds 2 demonstrations per SFT stage, so at the step-2 checkpoint
the SFT optimizer has stepped and the buffer is not empty (asserted); the resumed steps must log the same ReLIFT
metrics and end with the same weights as the uninterrupted run.
"""
from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from luffy_pool.run.checkpointing import read_data_order
from verl.utils.checkpoint import layout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "run"))
import test_resume_e2e as resume_e2e  # noqa: E402 -- its Driver (kill -9 on a marker, Ray processes included)

pytestmark = pytest.mark.e2e

STEPS = 3
RELIFT = ["algorithm.method=relift", "algorithm.relift.sft_data_size=2", "algorithm.relift.sft_mini_batch_size=2",
          "algorithm.relift.sft_micro_batch_size=1",
          # an SFT lr large enough that a fresh SFT optimizer after the resume would change the weights by far more
          # than the comparison's 1e-6 (the authors' 1e-6 would not)
          "algorithm.relift.sft_lr=1e-3", "trainer.save_freq=2", "trainer.test_freq=-1"]


def _config(compose_config, luffy_overrides, model_dir, task_dir, out_dir, path) -> str:
    from omegaconf import OmegaConf

    keys = {o.split("=", 1)[0] for o in RELIFT}
    base = [o for o in luffy_overrides(model_dir, task_dir, out_dir, steps=STEPS) if o.split("=", 1)[0] not in keys]
    OmegaConf.save(compose_config(base + RELIFT), path)
    return str(path)


def _metrics(run_dir) -> dict[int, dict]:
    """The last logged metrics of each step (a resumed run logs its steps again)."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    return {r["step"]: r for r in rows}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory, compose_config, luffy_overrides):
    from luffy_pool.tiny import write_task_parquets

    root = tmp_path_factory.mktemp("relift_resume")
    task = str(root / "task")
    write_task_parquets(task, n_train=8, n_test=4, level=2, seed=0)
    ref_cfg, run_cfg = (_config(compose_config, luffy_overrides, tiny_model_dir, task, str(root / name),
                                root / f"{name}.yaml") for name in ("ref", "run"))

    def reference():
        resume_e2e.Driver(ref_cfg, str(root / "ref_result"), str(root / "ref.log")).finish()

    def interrupted():
        first = resume_e2e.Driver(run_cfg, str(root / "run_result1"), str(root / "run1.log"), hang_in_step=3)
        first.wait_for("STEP_START 3")  # step 2's checkpoint is published before step 3 starts
        first.kill()
        resume_e2e.Driver(run_cfg, str(root / "run_result2"), str(root / "run2.log")).finish()

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(reference), pool.submit(interrupted)]:
            future.result()
    return root


def test_the_step_2_checkpoint_holds_a_used_sft_optimizer_and_a_non_empty_buffer(runs):
    step_dir = runs / "run" / "global_step_2"
    data = torch.load(step_dir / layout.DATA_FILE, weights_only=True)
    assert len(data["extras"]["relift"]["buffer"]["rows"]) > 0
    assert (step_dir / layout.ACTOR_DIR / layout.extra_optim_dir("sft") / ".metadata").is_file()
    meta = json.load(open(step_dir / layout.ACTOR_DIR / layout.META_FILE))
    assert meta["extra_optimizers"] == {"sft": True}
    files = json.load(open(step_dir / "manifest.json"))["files"]  # hashed and verified on resume like the rest
    assert any(rel.startswith(os.path.join(layout.ACTOR_DIR, layout.extra_optim_dir("sft"))) for rel in files)
    assert [m["relift/sft_rows"] for s, m in sorted(_metrics(runs / "ref").items()) if s <= 2].count(2) >= 1


def test_resumed_steps_equal_the_uninterrupted_run(runs):
    assert "RESUMED_AT 2" in open(runs / "run2.log").read()
    assert read_data_order(str(runs / "run")) == read_data_order(str(runs / "ref"))
    ref, run = _metrics(runs / "ref"), _metrics(runs / "run")
    for step in (3,):
        for key in ("relift/hard_questions", "relift/buffer_size", "relift/sft_rows", "actor/sft_loss",
                    "actor/sft_grad_norm", "actor/pg_loss", "actor/entropy_loss"):
            assert (key in run[step]) == (key in ref[step]), (step, key)
            if key in ref[step]:
                assert run[step][key] == pytest.approx(ref[step][key], abs=1e-6), (step, key)
    assert ref[3]["relift/sft_rows"], "an SFT stage must run after the resume"
    diff = resume_e2e._max_diff(resume_e2e._hf_weights(runs / "ref_result" / "final_hf"),
                                resume_e2e._hf_weights(runs / "run_result2" / "final_hf"))
    assert diff <= 1e-6
