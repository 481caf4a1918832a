"""The driver's host memory that grows with the run: ExGRPO's experience pool (``algorithm.method=exgrpo``).

The pool (luffy_pool/replay/experience.py) keeps, per question, successful trajectories as int32 token ids and
float32 recorded log-probs: ``8 x (tokens + 1)`` bytes plus 280 bytes of Python and numpy headers per trajectory
(``TRAJECTORY_OVERHEAD_BYTES``), and the checkpoint's ``data.pt`` holds the same arrays (flat, without the headers).
A step adds at most ``min(rbound, n - 1)`` trajectories per group (a group is stored when ``lbound < k <= rbound``
and ``k < n``; each of its k successes joins the pool once), of at most ``max_response_length`` tokens, for each of
the step's ``train_batch_size`` groups; ``max_trajectories_per_question`` keeps a question's newest, so a step's net
growth is also at most that cap per group. The bound below is those maxima over ``trainer.total_training_steps``:
every group stored, every success at full length. A run's real pool is smaller (fewer partially solved groups,
shorter responses); exp_scripts/bench_exgrpo_pool.py fills one the way a 701-step run does and measures it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

GiB = 2**30
# sys.getsizeof on CPython 3.11 / numpy: the Trajectory object (48, two slots) + two array headers (112 each) + its
# pointer in the question's list (8)
TRAJECTORY_OVERHEAD_BYTES = 280
_KEY = "algorithm.exgrpo.max_trajectories_per_question"


@dataclasses.dataclass(frozen=True)
class ReplayPoolInputs:
    """What bounds ExGRPO's pool: groups per step, trajectories a group may add, the cap, steps (0: unknown)."""

    groups_per_step: int
    per_group: int
    cap: int
    steps: int
    max_tokens: int

    @classmethod
    def from_sections(cls, sections) -> Optional["ReplayPoolInputs"]:
        algorithm = sections.algorithm
        if algorithm.method != "exgrpo":
            return None
        knobs, n = algorithm.exgrpo, sections.workers.rollout.n
        per_group = min(int(knobs.rbound), n - 1)
        if knobs.max_trajectories_per_question:
            per_group = min(per_group, int(knobs.max_trajectories_per_question))
        return cls(
            groups_per_step=int(sections.data.train_batch_size),
            per_group=max(0, per_group),
            cap=int(knobs.max_trajectories_per_question),
            steps=int(sections.trainer.total_training_steps or 0),
            max_tokens=int(sections.data.max_response_length),
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
        return f"ExGRPO experience pool after {p.steps} steps ({per})", p.steps * p.step_bytes, _KEY
    return f"ExGRPO experience pool per step ({per}; trainer.total_training_steps unset)", p.step_bytes, _KEY
