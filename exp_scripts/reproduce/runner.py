"""The processes of reproduce_tiny.py: the warm start, one training run per method, their CPU and wall seconds.

Every run is its own process (the SFT trainer's CLI, or ``reproduce/run_rl.py`` for an RL method) with its
output in a log; ``Meter`` adds up CPU seconds per category and, with ``reuse``, skips a run folder whose
``done.json`` records exactly the same command (so a comparison can be run in parts and resumed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from reproduce.cputime import run_measured
from reproduce.methods import METHODS, RunSettings, rl_overrides, sft_overrides
from reproduce.recipes import merge_overrides
from reproduce.report import ENTROPY, ON_LENGTH, ON_REWARD, final_value
from reproduce.seeds_report import run_summary
from verl.utils.tracking import read_metrics_jsonl

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RUN_RL = os.path.join(HERE, "run_rl.py")
# Every child: one OpenMP thread (2-core box, docs/CPU_STACK.md §5.3), Ray without token auth or usage stats,
# vLLM's engine in-process, offline trackers.
CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
}
# The warm start: quickstart.sh's SFT recipe (sft_trainer.yaml's schedule) on the task's disjoint warm split; only the
# step count varies.
WARM_SFT = {"data.max_length": 160, "data.train_batch_size": 32, "data.micro_batch_size_per_gpu": 32, "optim.lr": 3e-3}


def child_env() -> dict:
    env = dict(os.environ)
    for key, value in CHILD_ENV.items():
        env.setdefault(key, value)
    env.pop("RAY_ADDRESS", None)  # always a private Ray instance: never attach to someone else's cluster
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


DONE_FILE = "done.json"  # in a run folder: the command that finished there, its wall and CPU seconds


class Meter:
    """Runs commands with their output in a log, adding up wall and CPU seconds per category.

    With ``reuse``, a folder whose ``done.json`` records exactly the same command is not run again: its
    recorded seconds count instead (so a comparison can be run in parts, e.g. one seed per call, and
    summarised by a last call over everything).
    """

    def __init__(
        self, env: Mapping[str, str], timeout_s: Optional[float], reuse: bool = False, only_finished: bool = False
    ):
        # only_finished (--report-only): reuse finished runs and run nothing (a partial report of a run in progress)
        self.env, self.timeout_s, self.reuse, self.only_finished = env, timeout_s, reuse or only_finished, only_finished
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.cpu_source = "proc"

    def finished(self, run_dir: str, cmd: Sequence[str]) -> Optional[dict]:
        path = os.path.join(run_dir, DONE_FILE)
        if not self.reuse or not os.path.exists(path):
            return None
        with open(path) as f:
            done = json.load(f)
        return done if done.get("cmd") == list(cmd) else None

    def run(self, cmd: Sequence[str], log_path: str, category: str) -> tuple[float, float]:
        """Run ``cmd``; returns (wall s, CPU s); raises naming the log on failure."""
        run_dir = os.path.dirname(log_path)
        done = self.finished(run_dir, cmd)
        if done is not None:
            self.cpu[category] = self.cpu.get(category, 0.0) + done["cpu_s"]
            self.wall[category] = self.wall.get(category, 0.0) + done["wall_s"]
            return done["wall_s"], done["cpu_s"]
        os.makedirs(run_dir, exist_ok=True)
        try:
            code, wall, cpu, source = run_measured(cmd, log_path, self.env, REPO, self.timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"stopped after {self.timeout_s:.0f} s (--run-timeout); see {log_path}") from None
        self.cpu[category] = self.cpu.get(category, 0.0) + cpu
        self.wall[category] = self.wall.get(category, 0.0) + wall
        if source != "proc":
            self.cpu_source = source
        if code != 0:
            raise RuntimeError(f"exit {code}; see {log_path}")
        with open(os.path.join(run_dir, DONE_FILE), "w") as f:
            json.dump({"cmd": list(cmd), "wall_s": wall, "cpu_s": cpu}, f)
        return wall, cpu


def fresh_dir(path: str, meter: Optional["Meter"] = None, cmd: Optional[Sequence[str]] = None) -> str:
    """An empty ``path`` (the jsonl tracker appends, so a rerun must not see the last run's file), unless
    ``meter`` may reuse the finished run of ``cmd`` there."""
    if meter is not None and cmd is not None and meter.finished(path, cmd) is not None:
        return path
    if meter is not None and meter.only_finished:  # never clear a folder another process may still be writing
        raise RuntimeError(f"not run yet: {path} (--report-only)")
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def sft_command(config_overrides: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "verl.trainer.fsdp_sft_trainer",
        "--config-dir",
        os.path.join(REPO, "luffy_pool", "config"),
        "--config-name",
        METHODS["sft"].config_name,
        *config_overrides,
    ]


def warm_start(model_dir: str, warm_file: str, steps: int, run_dir: str, meter: Meter) -> str:
    """SFT the random model for ``steps`` steps on the warm split (quickstart's recipe); returns the HF folder."""
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.fsdp_sft_trainer",
        f"model.path={model_dir}",
        f"data.train_files={warm_file}",
        f"trainer.total_training_steps={steps}",
        *(f"{k}={v}" for k, v in WARM_SFT.items()),
        "trainer.device=cpu",
        "trainer.logger=['jsonl']",
        f"trainer.default_local_dir={run_dir}",
        "trainer.experiment_name=warm_start",
    ]
    fresh_dir(run_dir, meter, cmd)
    meter.run(cmd, os.path.join(run_dir, "train.log"), "warm_start")
    return os.path.join(run_dir, "final")


def train_sft(settings: RunSettings, run_dir: str, meter: Meter) -> tuple[str, float, float]:
    """The SFT trainer's CLI on tiny_cpu_sft.yaml; returns (final HF folder, wall s, CPU s)."""
    cmd = sft_command(sft_overrides(settings, run_dir))
    fresh_dir(run_dir, meter, cmd)
    wall, cpu = meter.run(cmd, os.path.join(run_dir, "train.log"), "training")
    return os.path.join(run_dir, "final"), wall, cpu


def train_rl(
    config_name: str,
    settings: RunSettings,
    run_dir: str,
    meter: Meter,
    model_dir: Optional[str] = None,
    extra: Sequence[str] = (),
) -> tuple[str, float, float]:
    """One RL run through ``reproduce/run_rl.py`` (``extra``: the method's own overrides, last); returns (final HF
    folder, wall s, CPU s)."""
    hf_dir = os.path.join(run_dir, "final")
    cmd = [
        sys.executable,
        RUN_RL,
        "--config-name",
        config_name,
        "--hf-out",
        hf_dir,
        "--result",
        os.path.join(run_dir, "run_result.json"),
        *merge_overrides([*rl_overrides(settings, run_dir, model_dir), *extra]),  # the method's value wins
    ]
    fresh_dir(run_dir, meter, cmd)
    wall, cpu = meter.run(cmd, os.path.join(run_dir, "train.log"), "training")
    return hf_dir, wall, cpu


def training_summary(metrics_file: str, window: int) -> dict:
    """Final on-policy reward, entropy and response length, and the start/end summary, from a run's metrics."""
    records = read_metrics_jsonl(metrics_file)
    return {
        "train_reward": final_value(records, ON_REWARD),
        "entropy": final_value(records, ENTROPY),
        "on_policy_response_length": final_value(records, ON_LENGTH),
        "steps_logged": len(records),
        "summary": run_summary(records, window),
    }


def train_method(name: str, settings: RunSettings, run_dir: str, meter: Meter, sft_model: Optional[str] = None) -> dict:
    """Train one method into ``run_dir``; ``{"hf_dir", "wall_s", "cpu_s", "metrics_file"}`` (metrics: RL only).

    ``sft_rl`` starts its RL stage from ``sft_model`` (the SFT method's run of the same seed)."""
    method = METHODS[name]
    if method.kind == "sft":
        hf_dir, wall, cpu = train_sft(settings, run_dir, meter)
        return {"hf_dir": hf_dir, "wall_s": wall, "cpu_s": cpu, "metrics_file": None}
    if method.kind == "sft_rl" and not sft_model:
        raise RuntimeError("SFT then RL needs the SFT run of the same seed (add sft to --methods)")
    extra = method.extra(settings) if method.extra else ()
    # Only SFT-then-RL starts from the SFT model; every other RL method from the shared start (settings.model_dir).
    hf_dir, wall, cpu = train_rl(
        method.config_name, settings, run_dir, meter, sft_model if method.kind == "sft_rl" else None, extra
    )
    return {"hf_dir": hf_dir, "wall_s": wall, "cpu_s": cpu, "metrics_file": os.path.join(run_dir, "metrics.jsonl")}
