"""What the selected method adds to the memory plan beyond LUFFY's step, from its declaration (``Method.memory``,
luffy_pool/methods/): an extra actor forward through the old-log-prob pass, a host-side trajectory pool
(memory_plan/host.py) and an SFT stage with its own AdamW. ``inputs.py`` and ``estimate.py`` stay method-blind.

An SFT stage's AdamW adds two fp32 moments per shard, on the device when ``optimizer_offload`` is off (both
optimizers' moments in every phase), else only during its stage (then the RL moments are on the host); the stage's
forward/backward runs ``micro_rows`` padded rows of prompt + demonstration (``rollout.max_prefix_len``) per rank.
"""

from __future__ import annotations

import math

from luffy_pool.memory_plan.host import ReplayPoolInputs


def method_inputs(sections, sp: int) -> dict:
    """The ``PlanInputs`` fields the method's declaration sets: its extra forward (``metric_pass``), its host pool
    (``replay_pool``) and its SFT stage (``sft_*``)."""
    from luffy_pool.methods import get_method

    declare = get_method(sections.algorithm.method).memory
    extras = declare(sections) if declare is not None else {}
    out: dict = {"metric_pass": extras.get("extra_forward", "")}
    if extras.get("host_pool"):
        out["replay_pool"] = ReplayPoolInputs.from_declaration(sections, extras["host_pool"])
    stage = extras.get("sft_stage")
    if stage:
        width = sections.data.max_prompt_length + sections.workers.rollout.max_prefix_len
        out.update(
            sft_optimizer=True,
            sft_tokens=math.ceil(int(stage["micro_rows"]) * width / sp),
            sft_stage_name=str(stage["name"]),
            sft_budget_key=str(stage["budget_key"]),
            sft_moments=str(stage["moments"]),
        )
    return out
