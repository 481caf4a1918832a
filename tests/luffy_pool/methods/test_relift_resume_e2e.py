"""End to end: ReLIFT's state (the driver's hard-question buffer and the workers' SFT optimizer) survives SIGKILL.

One driver chain (tests/luffy_pool/run/test_resume_e2e.py's ``Driver``: one process tree with its own Ray, 2 FSDP
ranks, the tiny model and task, 4 prompts per step, checkpoints every 2 steps; tests/luffy_pool/run/resume_hooks.py:
a run configured for 4 steps writes its weights when step 4 begins, then waits). The first driver trains steps 1-3
uninterrupted (the reference) and is SIGKILLed inside step 4 (after its marker, while it sleeps); the second
resumes with ``resume_mode=auto`` from step 2, trains step 3 again and stops at the same point. The buffer holds 2
demonstrations per SFT stage, so at the step-2 checkpoint the SFT optimizer has stepped and the buffer is not empty
(asserted); the resumed step must log the same ReLIFT metrics and end with the same weights as the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

from luffy_pool.run.checkpointing import read_data_order
from verl.utils.checkpoint import layout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "run"))
import test_resume_e2e as resume_e2e  # noqa: E402 -- its Driver (kill -9 on a marker, Ray processes included)
from resume_hooks import DUMP_DIR  # noqa: E402

pytestmark = pytest.mark.e2e

STEPS = 3  # compared; the runs are configured for one more step, inside which they stop (resume_hooks)
HOOK = "resume_hooks:dump_and_hang_in_last_step"
RELIFT = [
    "algorithm.method=relift",
    "algorithm.relift.sft_data_size=2",
    "algorithm.relift.sft_mini_batch_size=2",
    "algorithm.relift.sft_micro_batch_size=1",
    # an SFT lr large enough that a fresh SFT optimizer after the resume would change the weights by far more
    # than the comparison's 1e-6 (the authors' 1e-6 would not)
    "algorithm.relift.sft_lr=1e-3",
    "trainer.save_freq=2",
    "trainer.test_freq=-1",
]


def _config(compose_config, luffy_overrides, model_dir, task_dir, out_dir, path) -> str:
    from omegaconf import OmegaConf

    keys = {o.split("=", 1)[0] for o in RELIFT}
    base = [o for o in luffy_overrides(model_dir, task_dir, out_dir, steps=STEPS + 1) if o.split("=", 1)[0] not in keys]
    from tests.helpers.method_presets import preset_overrides  # here: the driver subprocess imports this module

    OmegaConf.save(compose_config(base + preset_overrides("relift") + RELIFT), path)
    return str(path)


def _metrics(path) -> dict[int, dict]:
    """The last logged metrics of each step in a metrics.jsonl (a resumed run logs its steps again)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return {r["step"]: r for r in rows}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory, compose_config, luffy_overrides):
    from luffy_pool.tiny import write_task_parquets

    root = tmp_path_factory.mktemp("relift_resume")
    task = str(root / "task")
    write_task_parquets(task, n_train=8, n_test=4, level=2, seed=0)
    cfg = _config(compose_config, luffy_overrides, tiny_model_dir, task, str(root / "run"), root / "run.yaml")
    first = resume_e2e.Driver(cfg, str(root / "run_result1"), str(root / "run1.log"), prepare=HOOK)
    first.wait_for(f"DUMPED {STEPS}")  # steps 1-3 trained (step 2's checkpoint published), step 4 begun
    first.kill()
    # the uninterrupted steps as the first driver left them (the resumed driver appends to these files)
    shutil.copy(root / "run" / "metrics.jsonl", root / "ref_metrics.jsonl")
    (root / "ref_order.json").write_text(json.dumps(read_data_order(str(root / "run"))))
    second = resume_e2e.Driver(cfg, str(root / "run_result2"), str(root / "run2.log"), prepare=HOOK)
    second.wait_for(f"DUMPED {STEPS}")
    second.kill()
    return root


def test_the_step_2_checkpoint_holds_a_used_sft_optimizer_and_a_non_empty_buffer(runs):
    step_dir = runs / "run" / "global_step_2"
    data = torch.load(step_dir / layout.DATA_FILE, weights_only=True)
    hooks = data["hooks"]  # the step's hooks' state, one path (luffy_pool/trainer/mix_trainer.py state_dict)
    assert hooks["method"] == "relift" and len(hooks["state"]["relift"]["buffer"]["rows"]) > 0
    assert (step_dir / layout.ACTOR_DIR / layout.extra_optim_dir("sft") / ".metadata").is_file()
    meta = json.load(open(step_dir / layout.ACTOR_DIR / layout.META_FILE))
    assert meta["extra_optimizers"] == {"sft": True}
    files = json.load(open(step_dir / "manifest.json"))["files"]  # hashed and verified on resume like the rest
    assert any(rel.startswith(os.path.join(layout.ACTOR_DIR, layout.extra_optim_dir("sft"))) for rel in files)
    ref = _metrics(runs / "ref_metrics.jsonl")
    assert [m["relift/sft_rows"] for s, m in sorted(ref.items()) if s <= 2].count(2) >= 1


def test_resumed_steps_equal_the_uninterrupted_run(runs):
    assert "RESUMED_AT 2" in open(runs / "run2.log").read()
    ref_order = {int(k): v for k, v in json.loads((runs / "ref_order.json").read_text()).items()}
    assert sorted(ref_order) == list(range(1, STEPS + 1))
    assert read_data_order(str(runs / "run")) == ref_order
    ref, run = _metrics(runs / "ref_metrics.jsonl"), _metrics(runs / "run" / "metrics.jsonl")
    assert sorted(ref) == sorted(run) == list(range(1, STEPS + 1))
    for step in (3,):
        for key in (
            "relift/hard_questions",
            "relift/buffer_size",
            "relift/sft_rows",
            "actor/sft_loss",
            "actor/sft_grad_norm",
            "actor/pg_loss",
            "actor/entropy_loss",
        ):
            assert (key in run[step]) == (key in ref[step]), (step, key)
            if key in ref[step]:
                assert run[step][key] == pytest.approx(ref[step][key], abs=1e-6), (step, key)
    assert ref[3]["relift/sft_rows"], "an SFT stage must run after the resume"
    diff = resume_e2e._max_diff(
        resume_e2e._hf_weights(runs / "run_result1" / DUMP_DIR), resume_e2e._hf_weights(runs / "run_result2" / DUMP_DIR)
    )
    assert diff <= 1e-6
