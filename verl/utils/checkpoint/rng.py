"""Capture and restore every random number generator a training process uses.

Saved per rank with the checkpoint (torch CPU, CUDA when present, numpy's global state, Python's
``random``), so code that draws from the global generators continues the same streams after resume.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    return {
        "cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    missing = [k for k in ("cpu", "numpy", "python") if k not in state]
    if missing:
        raise ValueError(f"RNG state is missing {missing} (keys present: {sorted(state)})")
    torch.set_rng_state(state["cpu"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:  # a different device count per process: keep this process's device stream aligned at least
            torch.cuda.set_rng_state(cuda_states[0])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
