"""Stop signals in the SFT trainer: the step in progress finishes, its HF folder is written, exit 128 + signal.

In-process (one rank, the signal sent to this process during a step): SIGTERM -> SystemExit(143) and
global_step_<N>/huggingface of that step, loadable; SIGINT -> 130; ``trainer.save_on_signal=False`` stops
without a folder; a second signal aborts at once without saving, while a duplicate of the first arriving
within milliseconds (Slurm signals every process, torchrun forwards once more) counts once.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from verl.trainer.fsdp_sft_trainer import FSDPSFTTrainer, SFTStop, run_sft
from verl.trainer.sft.config import compose_sft_config
from verl.utils.signals import AbortedBySignal


def _overrides(model, task, out, steps=6, extra=()):
    return [
        f"model.path={model}",
        f"data.train_files={task}/train.parquet",
        "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=4",
        f"trainer.total_training_steps={steps}",
        "trainer.device=cpu",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[jsonl]",
        "trainer.progress_bar=False",
        *extra,
    ]


@pytest.fixture
def signal_at_step(monkeypatch):
    """Send ``sigs`` to this process in the middle of step ``at`` (after its forward/backward began)."""

    def arm(at: int, sigs):
        original = FSDPSFTTrainer.train_step
        calls = {"n": 0}

        def step(self, rows):
            calls["n"] += 1
            if calls["n"] == at:
                for sig in sigs:
                    os.kill(os.getpid(), sig)
            return original(self, rows)

        monkeypatch.setattr(FSDPSFTTrainer, "train_step", step)
        return calls

    return arm


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"])
def test_a_stop_signal_saves_the_step_in_progress_and_exits_128_plus_signal(
    tiny_model_dir, tiny_task_dir, tmp_path, signal_at_step, sig, code
):
    from transformers import AutoModelForCausalLM

    calls = signal_at_step(3, [sig])
    before = signal.getsignal(sig)
    with pytest.raises(SystemExit) as exc:
        run_sft(compose_sft_config(_overrides(tiny_model_dir, tiny_task_dir, tmp_path / "run")))
    assert exc.value.code == code and calls["n"] == 3  # step 3 finished, no step 4
    assert signal.getsignal(sig) is before  # handlers restored
    saved = sorted(os.listdir(tmp_path / "run"))
    assert "global_step_3" in saved and "final" not in saved and not any(s.startswith("global_step_4") for s in saved)
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "run" / "global_step_3" / "huggingface", dtype=torch.float32
    )
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    # trained weights (three AdamW steps), not a copy of the base model
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), base.parameters()))


def test_save_on_signal_false_stops_without_a_folder(tiny_model_dir, tiny_task_dir, tmp_path, signal_at_step):
    signal_at_step(2, [signal.SIGTERM])
    with pytest.raises(SystemExit) as exc:
        run_sft(
            compose_sft_config(
                _overrides(tiny_model_dir, tiny_task_dir, tmp_path / "run", extra=["trainer.save_on_signal=False"])
            )
        )
    assert exc.value.code == 143
    assert not any(s.startswith(("global_step_", "final")) for s in os.listdir(tmp_path / "run"))


def test_a_second_signal_aborts_without_saving(tiny_model_dir, tiny_task_dir, tmp_path, signal_at_step, monkeypatch):
    monkeypatch.setattr(SFTStop, "DUPLICATE_S", 0.0)
    signal_at_step(2, [signal.SIGTERM, signal.SIGTERM])
    with pytest.raises(AbortedBySignal) as exc:
        run_sft(compose_sft_config(_overrides(tiny_model_dir, tiny_task_dir, tmp_path / "run")))
    assert exc.value.code == 143
    assert not any(s.startswith(("global_step_", "final")) for s in os.listdir(tmp_path / "run"))


def test_a_duplicate_of_the_first_signal_counts_once():
    stop = SFTStop()
    stop._handle(signal.SIGTERM, None)
    stop._handle(signal.SIGTERM, None)  # within DUPLICATE_S: the same request
    assert stop.signum == signal.SIGTERM
    stop._first_at -= SFTStop.DUPLICATE_S + 1
    with pytest.raises(AbortedBySignal):
        stop._handle(signal.SIGTERM, None)
    other = SFTStop()
    other._handle(signal.SIGTERM, None)
    with pytest.raises(AbortedBySignal):  # a different signal is never a duplicate
        other._handle(signal.SIGINT, None)
