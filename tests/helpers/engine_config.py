"""The rollout section of an engine a test builds on its own: the trainer YAML composed with the keys the test sets.

An engine outside a run has no trainer pushing weights and runs on one rank, so the engine tests read the
checkpoint (``load_format=auto``) in its own dtype (``auto``: float32 on CPU), with TP 1 and the HF engine's
micro-batch at 256 rows; every other key keeps its YAML default (luffy_pool/config/compose.rollout_section).
"""
from __future__ import annotations

from typing import Any

ENGINE_ON_ITS_OWN = {"load_format": "auto", "dtype": "auto", "tensor_model_parallel_size": 1, "hf_micro_batch_size": 256}


def engine_section(**values: Any):
    """``rollout_section`` with the engine-on-its-own keys above, then ``values``."""
    from luffy_pool.config.compose import rollout_section

    return rollout_section(**{**ENGINE_ON_ITS_OWN, **values})
