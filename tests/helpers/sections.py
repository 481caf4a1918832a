"""Typed config for a part a test builds on its own (a rollout engine, the off-policy pool, the actor's loss): the
trainer YAML composed with the keys the test sets, as a run's launcher builds it.

An engine outside a run has no trainer pushing weights and runs on one rank, so the engine tests read the
checkpoint (``load_format=auto``) in its own dtype (``auto``: float32 on CPU), with TP 1 and the HF engine's
micro-batch at 256 rows; every other key keeps its YAML default (luffy_pool/config/compose.rollout_section).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

ENGINE_ON_ITS_OWN = {
    "load_format": "auto",
    "dtype": "auto",
    "tensor_model_parallel_size": 1,
    "hf_micro_batch_size": 256,
}


def engine_section(**values: Any):
    """``rollout_section`` with the engine-on-its-own keys above, then ``values``."""
    from luffy_pool.config.compose import rollout_section

    return rollout_section(**{**ENGINE_ON_ITS_OWN, **values})


def run_sections():
    """The ``ConfigSections`` of the YAML composed with only its required keys filled in."""
    from luffy_pool.config.compose import compose_config
    from luffy_pool.config.sections import ConfigSections

    return ConfigSections.from_config(
        compose_config(["data.train_files=x", "data.val_files=null", "actor_rollout_ref.model.path=m"])
    )


def pool_of(extra_trace_files=None, **kwargs):
    """A run's ``OffPolicyPool`` (its keys from the YAML's sections, ``OffPolicyPool.from_sections``), ``kwargs`` set."""
    from luffy_pool.rollout.off_policy_pool import OffPolicyPool

    s = run_sections()
    run = {
        "prompt_id_key": s.data.off_policy_id_key,
        "truncate": s.data.truncate_off_policy,
        "max_trace_length": s.workers.rollout.max_prefix_len,
        "seed": s.trainer.seed,
    }
    return OffPolicyPool(extra_trace_files, **{**run, **kwargs})


@functools.lru_cache(maxsize=1)
def _yaml_loss_section():
    from luffy_pool.config.compose import actor_config
    from luffy_pool.config.sections import LossSection

    return LossSection.from_actor_config(actor_config())


def loss_section(**knobs):
    """The YAML's actor loss section with ``knobs`` (actor key names) replaced; no checks, so a bad value reaches
    the loss."""
    return dataclasses.replace(_yaml_loss_section(), **knobs)
