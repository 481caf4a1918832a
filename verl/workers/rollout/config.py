"""The rollout engine's config: the engine's reading of the typed ``actor_rollout_ref.rollout`` section.

Shared by the vLLM and the HF rollout, and free of engine imports. It is built from a ``RolloutSection``
(verl/workers/config_sections.py) and holds no defaults, types or checks of its own: the key declarations give
each key's type and bounds, the worker YAML (verl/trainer/config/ppo_worker.yaml) its default, and the config
checker refuses a bad value before a run starts. An engine built on its own (benchmarks, engine tests, eval)
takes a section composed from the same YAML (``verl.workers.worker_config.rollout_section``). What is added here
is how the engines spell two values (``dtype``, ``load_format``) and the engine's context length; the value
lists (verl/workers/rollout/engine_values.py, re-exported here) are the ones the key declarations take their
choices from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verl.workers.config_sections import RolloutSection
from verl.workers.rollout.engine_values import (  # noqa: F401  (the value lists, re-exported)
    DTYPE_CANON,
    DTYPES,
    HF_DECODERS,
    LOAD_FORMATS,
    LOGPROBS_MODES,
    WEIGHT_TRANSPORTS,
)


@dataclasses.dataclass(frozen=True)
class RolloutEngineConfig:
    """The rollout section as the engines read it: every key's value is the section's (``config.seed`` reads
    ``section.seed``), except ``dtype`` and ``load_format``, in the engines' spelling."""

    section: RolloutSection

    def __getattr__(self, name: str):
        # Only called for names that are not fields or properties: the section's keys.
        if name.startswith("__") or name == "section":
            raise AttributeError(name)
        return getattr(self.section, name)

    @property
    def dtype(self) -> str:
        return DTYPE_CANON.get(self.section.dtype, self.section.dtype)

    @property
    def load_format(self) -> str:
        return LOAD_FORMATS[self.section.load_format]

    @property
    def engine_max_model_len(self) -> int:
        return self.section.max_model_len or (self.section.prompt_length + self.section.response_length)


def engine_config(section: Any) -> RolloutEngineConfig:
    """The engine config of a ``RolloutSection`` (a run's worker builds the section once; an engine on its own
    composes it, ``verl.workers.worker_config.rollout_section``)."""
    if isinstance(section, RolloutEngineConfig):
        return section
    if not isinstance(section, RolloutSection):
        raise TypeError(
            f"a rollout engine takes the typed actor_rollout_ref.rollout section (RolloutSection; "
            f"verl.workers.worker_config.rollout_section builds one), got {type(section).__name__}"
        )
    return RolloutEngineConfig(section)
