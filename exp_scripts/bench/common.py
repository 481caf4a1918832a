"""What every contender of the step benchmark shares: the work spec, the prompts, the grader, results.

A contender runs in its own process, reads a ``BenchSpec`` (JSON) and writes a result JSON: one record
per training step (wall seconds, generated tokens, foreign/own CPU cores, optional phase timings). The
reward is the project's own grader (``reward_impl_version`` 3, math_verify) for every contender, so the
scoring work per step is the same everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from typing import Optional

CONTENDERS = ("ours", "trl", "floor")
CASES = ("fixed", "natural")
REWARD_IMPL_VERSION = 3


@dataclasses.dataclass
class BenchSpec:
    """The work of one contender run. ``fixed``: every completion runs exactly ``max_new_tokens``."""

    contender: str
    case: str
    model_dir: str
    task_dir: str
    work_dir: str
    prompts: int = 8
    samples: int = 8
    max_new_tokens: int = 64
    max_prompt_length: int = 96
    warmup: int = 2
    steps: int = 8
    lr: float = 1e-6
    seed: int = 0
    threads: int = 1  # torch threads of TRL / the floor (ours: 1 per Ray worker, set by Ray)
    ranks: int = 2  # FSDP ranks of ours
    rollout: str = "vllm"  # rollout engine of ours
    rollout_dtype: str = "float32"  # weights dtype of our rollout engine
    reward_workers: int = 1  # grader processes of ours
    ours_overrides: list = dataclasses.field(default_factory=list)  # extra trainer overrides (experiments)

    def __post_init__(self):
        if self.contender not in CONTENDERS:
            raise ValueError(f"contender must be one of {CONTENDERS}, got {self.contender!r}")
        if self.case not in CASES:
            raise ValueError(f"case must be one of {CASES}, got {self.case!r}")
        if self.warmup < 1:
            raise ValueError(
                f"warmup must be >= 1 (a step's time is measured from the previous step's end), got {self.warmup}"
            )
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")

    @property
    def fixed(self) -> bool:
        return self.case == "fixed"

    @property
    def label(self) -> str:
        if self.contender == "ours":
            return f"ours[{self.rollout},{self.ranks}rank]"
        return f"{self.contender}[{self.threads}thr]"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "BenchSpec":
        return cls(**json.loads(text))


def load_task_rows(task_dir: str, split: str = "train") -> list[dict]:
    """Rows of the synthetic task parquet: ``prompt`` (chat list), ``ground_truth``, ``data_source``."""
    import pandas as pd

    path = os.path.join(task_dir, f"{split}.parquet")
    frame = pd.read_parquet(path)
    rows = []
    for i, rec in enumerate(frame.to_dict("records")):
        try:
            prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in rec["prompt"]]
            rows.append(
                {
                    "prompt": prompt,
                    "ground_truth": str(rec["reward_model"]["ground_truth"]),
                    "data_source": str(rec["data_source"]),
                }
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"{path} row {i}: needs prompt (chat list), reward_model.ground_truth and data_source"
            ) from exc
    return rows


def make_grader(tokenizer):
    """The trainer's own reward manager, grading inline (0 worker processes) in the calling process."""
    from verl.workers.reward_manager import RewardManager

    return RewardManager(tokenizer, reward_impl_version=REWARD_IMPL_VERSION, num_workers=0)


def set_torch_threads(threads: int) -> int:
    import torch

    torch.set_num_threads(threads)
    return torch.get_num_threads()


def write_result(path: str, spec: BenchSpec, steps: list[dict], **info) -> None:
    """Result JSON of one contender run (all steps, warm-up included, each with ``warmup`` set)."""
    for i, step in enumerate(steps):
        step["warmup"] = i < spec.warmup
    with open(path, "w") as f:
        json.dump({"spec": dataclasses.asdict(spec), "label": spec.label, "steps": steps, **info}, f, indent=1)


def timed_steps(result: dict) -> list[dict]:
    return [s for s in result["steps"] if not s.get("warmup")]


def median(values) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else math.nan


def summarize(result: dict) -> dict:
    """Median step time, tokens/s (timed tokens / timed seconds), median foreign and own cores."""
    steps = timed_steps(result)
    wall = [s["wall_s"] for s in steps]
    tokens = [s.get("gen_tokens", math.nan) for s in steps]
    total_wall = sum(wall)
    out = {
        "median_s": median(wall),
        "min_s": min(wall) if wall else math.nan,
        "max_s": max(wall) if wall else math.nan,
        "gen_tokens_per_step": sum(tokens) / len(tokens) if tokens else math.nan,
        "tokens_per_s": sum(tokens) / total_wall if total_wall > 0 else math.nan,
        "foreign_cores": median(s.get("foreign_cores") for s in steps),
        "own_cores": median(s.get("own_cores") for s in steps),
        # CPU seconds our process tree burned per step: comparable even when contention changes CPU shares.
        "cpu_s": median(s.get("own_cores", math.nan) * s["wall_s"] for s in steps),
        "timed_steps": len(steps),
    }
    for key in ("gen_s", "reward_s"):
        out[f"median_{key}"] = median(s.get(key) for s in steps)
    return out


def ratio(numerator: float, denominator: float) -> Optional[float]:
    if denominator is None or numerator is None or math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        return None
    return numerator / denominator


def format_ratio(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def headline_line(ours_over_trl: Optional[float], ours_over_floor: Optional[float]) -> str:
    """The benchmark's last line (fixed-length case)."""
    return f"ours/TRL={format_ratio(ours_over_trl)} ours/floor={format_ratio(ours_over_floor)}"
