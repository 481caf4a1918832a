"""The driver's host memory that grows with the run: a method's pool of stored trajectories (declared by the
method, ``Method.memory``: luffy_pool/methods/).

A stored trajectory is int32 token ids and float32 recorded log-probs: ``8 x (tokens + 1)`` bytes plus 280 bytes of
Python and numpy headers (``TRAJECTORY_OVERHEAD_BYTES``), and the checkpoint's ``data.pt`` holds the same arrays
(flat, without the headers). The method declares how many trajectories a group may add per step and the cap per
question; the bound below is those maxima over ``trainer.total_training_steps``, every one at full length. A run's
real pool is smaller (exp_scripts/ has a benchmark that fills one as a 701-step run does and measures it).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

GiB = 2**30
# sys.getsizeof on CPython 3.11 / numpy: the Trajectory object (48, two slots) + two array headers (112 each) + its
# pointer in the question's list (8)
TRAJECTORY_OVERHEAD_BYTES = 280


@dataclasses.dataclass(frozen=True)
class ReplayPoolInputs:
    """What bounds a method's trajectory pool: groups per step, trajectories a group may add, the cap per question
    (0: none), steps (0: unknown), tokens per trajectory; its name and the key that bounds it."""

    groups_per_step: int
    per_group: int
    cap: int
    steps: int
    max_tokens: int
    label: str = "trajectory pool"
    cap_key: str = ""

    @classmethod
    def from_declaration(cls, sections, pool: dict) -> "ReplayPoolInputs":
        """``pool``: the method's declaration (``label``, ``cap_key``, ``cap``, ``per_group``)."""
        return cls(
            groups_per_step=int(sections.data.train_batch_size),
            per_group=max(0, int(pool["per_group"])),
            cap=int(pool["cap"]),
            steps=int(sections.trainer.total_training_steps or 0),
            max_tokens=int(sections.data.max_response_length),
            label=str(pool["label"]),
            cap_key=str(pool["cap_key"]),
        )

    @property
    def trajectory_bytes(self) -> int:
        return 8 * (self.max_tokens + 1) + TRAJECTORY_OVERHEAD_BYTES

    @property
    def step_bytes(self) -> int:
        return self.groups_per_step * self.per_group * self.trajectory_bytes


def replay_pool_line(p: Optional[ReplayPoolInputs]) -> Optional[tuple[str, int, str]]:
    """(what, bytes, key) of the pool's bound after the run's steps (per step when the step count is unknown)."""
    if p is None:
        return None
    cap = f"{p.cap} per question" if p.cap else "no cap"
    per = (
        f"{p.groups_per_step} groups x {p.per_group} trajectories x {p.max_tokens:,} tokens x 8 B per step, "
        f"{cap}; full-length bound, data.pt holds the same"
    )
    if p.steps:
        return f"{p.label} after {p.steps} steps ({per})", p.steps * p.step_bytes, p.cap_key
    return f"{p.label} per step ({per}; trainer.total_training_steps unset)", p.step_bytes, p.cap_key
