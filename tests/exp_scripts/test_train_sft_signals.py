"""SIGTERM / SIGINT to ``bash exp_scripts/train_sft.sh``'s own process, with the real trainer on 2 gloo ranks.

The script execs ``verl.trainer.sft.launch`` (torchrun), which forwards the signal to every rank: the step in
progress finishes, its HF folder is written, every rank exits, and the script's exit code is 143 (130 for
SIGINT), not torchrun's 1. The run asks for far more steps than it gets to, so the saved step is the one
running when the signal came: the last step the log shows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STEP_LINE = re.compile(r"step:(\d+) - ")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"])
def test_signal_to_train_sft_sh_saves_the_step_in_progress_and_exits_128_plus_signal(
    tiny_model_dir, tiny_task_dir, tmp_path, sig, code
):
    from transformers import AutoModelForCausalLM

    out_dir = tmp_path / "out"
    env = dict(
        os.environ,
        MODEL_PATH=tiny_model_dir,
        TRAIN_FILES=f"{tiny_task_dir}/train.parquet",
        NPROC_PER_NODE="2",
        TRAIN_BATCH_SIZE="4",
        MICRO_BATCH_SIZE="2",
        MAX_LENGTH="256",
        OUT_DIR=str(out_dir),
        LOGGER="['console']",
        PYTHON=sys.executable,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
    )
    overrides = [
        "trainer.device=cpu",
        "model.fsdp_config.param_dtype=fp32",
        "model.attn_implementation=sdpa",
        "trainer.total_training_steps=500",
        "trainer.progress_bar=False",
        f"hydra.run.dir={tmp_path}/hydra",
    ]
    log_path = tmp_path / "train_sft.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            ["bash", "exp_scripts/train_sft.sh", *overrides],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 400
        while proc.poll() is None and time.monotonic() < deadline and not STEP_LINE.search(log_path.read_text()):
            time.sleep(0.5)
        assert proc.poll() is None, (
            f"train_sft.sh ended before step 1 (rc={proc.returncode}):\n" + log_path.read_text()[-4000:]
        )
        ranks = [
            int(p)
            for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        ]
        os.kill(proc.pid, sig)  # the script's own process only (exec: torchrun's agent)
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = log_path.read_text()
    assert rc == code, log[-4000:]
    steps = [int(s) for s in STEP_LINE.findall(log)]
    saved = sorted(d for d in os.listdir(out_dir) if d.startswith("global_step_"))
    assert saved == [f"global_step_{steps[-1]}"] and steps[-1] < 500, (saved, steps, log[-3000:])
    assert not (out_dir / "final").exists()
    assert f"SFT stopped by signal {int(sig)} ({sig.name}) after step {steps[-1]}/500" in log, log[-3000:]
    assert "Traceback" not in log, log[-4000:]
    model = AutoModelForCausalLM.from_pretrained(out_dir / saved[0] / "huggingface")
    assert model.config.model_type and sum(p.numel() for p in model.parameters()) > 0
    assert len(ranks) == 2 and not any(_alive(p) for p in ranks), "every rank exits with the script"
