"""SIGTERM / SIGINT sent to a launch script's own process (bash) reach the trainer: it saves and the script exits 143.

In a container whose PID 1 is ``bash exp_scripts/train.sh`` (or under Slurm, or ``kill <pid>``) only that bash
gets the signal. A script either ``exec``s the trainer (the trainer IS the script's process) or runs it as a
child, forwards the signal and exits with the child's code (quickstart.sh, which prints a summary after it).

Unit part (quick loop, ~1 s a script): every launch script runs with the trainer replaced through the variable
the script documents for it (``PYTHON=``; quickstart.sh: ``LUFFY_VENV=``) by a stand-in that records its pid and
the signals it gets, "saves" on the first one and exits 128 + signal. e2e part: quickstart.sh with the real
trainer gets SIGTERM during a step -> that step's checkpoint is written, exit code 143, no trainer left running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from luffy_pool.run.recipe import discover_launch_scripts

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
LAUNCH_SCRIPTS = discover_launch_scripts(EXP)

# The stand-in trainer: writes {pid, argv} to $STUB_OUT/started.json, waits for TERM/INT, then takes a
# moment (a real trainer finishes its step first: the script must wait again after its trap ran), writes
# $STUB_OUT/ckpt.json with every signal it got and exits 128 + the first one.
STUB = r'''#!{python}
import json, os, signal, sys, time
out = os.environ["STUB_OUT"]
got = []
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, lambda signum, _f: got.append(signum))
if "quickstart_summary.py" in " ".join(sys.argv):
    open(os.path.join(out, "summary_ran"), "w").close()
    sys.exit(0)
with open(os.path.join(out, "started.json.tmp"), "w") as f:
    json.dump({{"pid": os.getpid(), "argv": sys.argv[1:]}}, f)
os.replace(os.path.join(out, "started.json.tmp"), os.path.join(out, "started.json"))
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(0.5)
with open(os.path.join(out, "ckpt.json"), "w") as f:
    json.dump({{"signals": got}}, f)
sys.exit(128 + got[0] if got else 3)
'''


def _stub(tmp_path, name="python"):
    path = tmp_path / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STUB.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_and_signal(cmd, env, out, sig, timeout=60):
    """Start ``cmd`` (a new session, like a container's PID 1: no terminal, nothing else in its group), wait for
    the stand-in trainer, send ``sig`` to the script's own pid only; (rc, started, ckpt, script pid, output)."""
    # SIGINT at its default in the script, as under a terminal or a container's init: a pytest-xdist worker ignores
    # SIGINT, its children inherit that, and bash can neither trap nor reset a signal ignored on entry
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    started = out / "started.json"
    try:
        deadline = time.monotonic() + timeout
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert started.exists(), f"the trainer never started (rc={proc.poll()}):\n{proc.communicate()[0][-3000:]}"
        os.kill(proc.pid, sig)
        text, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ckpt = json.loads((out / "ckpt.json").read_text()) if (out / "ckpt.json").exists() else None
    return proc.returncode, json.loads(started.read_text()), ckpt, proc.pid, text


def _env(tmp_path, **extra):
    out = tmp_path / "stub_out"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, STUB_OUT=str(out), MODEL_PATH="org/model", DATA_DIR=str(tmp_path / "data"), **extra)
    env.pop("RAY_STOP", None)
    return env, out


def test_the_shipped_launch_scripts_are_all_checked():
    names = {os.path.basename(s) for s in LAUNCH_SCRIPTS}
    assert {
        "train.sh",
        "train_16k.sh",
        "train_on_policy.sh",
        "train_rl_sft_loss.sh",
        "train_sft_rl.sh",
        "train_sft.sh",
    } <= names


@pytest.mark.parametrize("script", LAUNCH_SCRIPTS, ids=[os.path.basename(s) for s in LAUNCH_SCRIPTS])
def test_sigterm_to_a_launch_script_reaches_the_trainer_which_is_its_process(script, tmp_path):
    env, out = _env(tmp_path, PYTHON=str(_stub(tmp_path)))
    rc, started, ckpt, script_pid, text = _start_and_signal(["bash", script], env, out, signal.SIGTERM)
    # exec chain down to the trainer: the pid the signal was sent to is the trainer's own
    assert started["pid"] == script_pid, text[-2000:]
    assert "-m" in started["argv"]
    assert ckpt == {"signals": [signal.SIGTERM]}, text[-2000:]
    assert rc == 143, text[-2000:]


def _quickstart_env(tmp_path, warm_steps="0"):
    """quickstart.sh's folder with placeholders (the script builds only what is missing) and the stand-in as
    the venv's python."""
    qs = tmp_path / "qs"
    for name in ("model/config.json", "data/train.parquet", "data/test.parquet", "data/warm.parquet"):
        (qs / name).parent.mkdir(parents=True, exist_ok=True)
        (qs / name).write_text("")
    _stub(tmp_path / "venv")
    return _env(
        tmp_path,
        SKIP_SETUP="1",
        QUICKSTART_DIR=str(qs),
        LUFFY_VENV=str(tmp_path / "venv"),
        QUICKSTART_WARM_STEPS=warm_steps,
    )


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"])
def test_quickstart_forwards_the_signal_once_and_exits_with_the_trainers_code(tmp_path, sig, code):
    env, out = _quickstart_env(tmp_path)
    rc, started, ckpt, script_pid, text = _start_and_signal(["bash", "exp_scripts/quickstart.sh"], env, out, sig)
    assert started["pid"] != script_pid and started["argv"][:2] == ["-m", "luffy_pool.main_mix_ppo"]
    # exactly one signal: a second one would make the trainer abort without saving
    assert ckpt == {"signals": [sig]}, text[-2000:]
    assert rc == code, text[-2000:]
    assert not (out / "summary_ran").exists(), "no summary after a stopped run"


def test_quickstart_forwards_sigterm_during_the_warm_start_sft(tmp_path):
    env, out = _quickstart_env(tmp_path, warm_steps="5")
    rc, started, ckpt, _, text = _start_and_signal(["bash", "exp_scripts/quickstart.sh"], env, out, signal.SIGTERM)
    assert started["argv"][:2] == ["-m", "verl.trainer.fsdp_sft_trainer"]
    assert ckpt == {"signals": [signal.SIGTERM]} and rc == 143, text[-2000:]


# ---------------------------------------------------------------------- e2e: the real trainer
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_sigterm_to_quickstart_saves_the_step_and_exits_143(tmp_path, tiny_model_dir, tiny_task_dir, luffy_overrides):
    from verl.utils.checkpoint import layout

    qs = tmp_path / "qs"
    (qs / "data").mkdir(parents=True)
    os.symlink(tiny_model_dir, qs / "model")
    for name in ("train.parquet", "test.parquet"):
        os.symlink(os.path.join(tiny_task_dir, name), qs / "data" / name)
    (qs / "data" / "warm.parquet").write_text("")  # never opened: QUICKSTART_WARM_STEPS=0
    ckpt_dir = qs / "checkpoints"
    # a small run (conftest's tiny LUFFY overrides, HF rollout), no periodic save: only the signal saves. The
    # step count is far above what a run reaches before the signal: a tiny step takes ~0.2 s, so with a few
    # steps the run could finish before the signal lands on a quiet machine (seen in CI: all 6 done)
    total = 400
    overrides = luffy_overrides(str(qs / "model"), str(qs / "data"), str(ckpt_dir), rollout="hf", steps=total)
    env = dict(
        os.environ,
        SKIP_SETUP="1",
        QUICKSTART_DIR=str(qs),
        QUICKSTART_WARM_STEPS="0",
        LUFFY_VENV=os.path.dirname(os.path.dirname(sys.executable)),
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
    )
    env.pop("RAY_ADDRESS", None)
    log_path = tmp_path / "quickstart.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            ["bash", "exp_scripts/quickstart.sh", *overrides],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 700
        while proc.poll() is None and time.monotonic() < deadline and "step:1 - " not in log_path.read_text():
            time.sleep(0.2)
        assert proc.poll() is None, (
            f"quickstart ended before step 1 (rc={proc.returncode}):\n" + log_path.read_text()[-4000:]
        )
        trainer_pids = [
            int(p)
            for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        ]
        seen = max(int(m) for m in re.findall(r"^step:(\d+) - ", log_path.read_text(), re.M))
        os.kill(proc.pid, signal.SIGTERM)  # the script's own process only
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = log_path.read_text()
    assert rc == 143, log[-4000:]
    assert "received SIGTERM" in log and "Traceback" not in log, log[-4000:]
    saved = layout.read_tracker(str(ckpt_dir))
    # the step running at the signal (logs lag by a step or two), not the last one
    assert saved is not None and seen <= saved < total, (seen, log[-4000:])
    assert [s for s, _ in layout.list_step_dirs(str(ckpt_dir))] == [saved]
    assert trainer_pids and not any(
        os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        for p in trainer_pids
    ), "the trainer must have exited with the script"
