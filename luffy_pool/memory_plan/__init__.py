"""Memory plan: per-rank device memory of every phase of a LUFFY step, before anything is queued or loaded.

Offline (a laptop, no GPU, no data)::

    python -m luffy_pool.memory_plan exp_scripts/train.sh --gpu-memory 80
    python -m luffy_pool.memory_plan --gpu-memory 141 -- actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B ...

At the start of a GPU run ``luffy_pool.run.launcher`` calls ``check_run(sections, device)`` before the workers
load the model: the plan from the device's real memory (``torch.cuda.mem_get_info`` in a one-shot Ray task on a
GPU: the driver opens no CUDA context) is printed once,
and ``trainer.memory_plan`` decides what a phase over the device's memory does (``error``: stop naming
the phase, its estimate and the keys that bring it under; ``warn``: say so and go on; ``off``).

Layout: ``shapes`` (config.json -> ``ModelShape``), ``estimate`` (the phases and their lines, with the
sources of each number), ``report`` (table, suggestions), ``launch_script`` (a bash launcher's Hydra
overrides), ``__main__`` (the command line).
"""

from __future__ import annotations

import logging
import re
from typing import Optional

from luffy_pool.config.check import ConfigError
from luffy_pool.memory_plan.estimate import GiB, HEADROOM_FRACTION, Plan, PlanInputs, build_plan
from luffy_pool.memory_plan.report import render, rollout_rows_per_engine, suggestions
from luffy_pool.memory_plan.shapes import KNOWN_SHAPES, ModelShape, model_shape

__all__ = [
    "Plan",
    "PlanInputs",
    "ModelShape",
    "KNOWN_SHAPES",
    "build_plan",
    "plan_for_config",
    "plan_for_sections",
    "render",
    "suggestions",
    "parse_gpu_memory",
    "device_memory_bytes",
    "check_run",
    "MemoryPlanError",
    "CARD_BYTES",
    "MODES",
]

logger = logging.getLogger(__name__)
MODES = ("warn", "error", "off")
# What torch.cuda.mem_get_info reports as total for cards sold by their GB: an 80 GB A100/H100 reports
# ~79.2 GiB (docs/DESIGN.md §2 item 8), an H200 141 GB ~140.4 GiB (143,771 MiB in nvidia-smi).
CARD_BYTES = {
    24: int(23.6 * GiB),
    40: int(39.4 * GiB),
    48: int(47.5 * GiB),
    80: int(79.2 * GiB),
    94: int(93.0 * GiB),
    141: int(140.4 * GiB),
}


class MemoryPlanError(ConfigError):
    """A phase of the plan does not fit the device (``trainer.memory_plan=error``)."""


def parse_gpu_memory(text: str) -> int:
    """``80`` (a card's GB as sold, see ``CARD_BYTES``; other numbers are GiB), ``79.2GiB`` or ``85GB``."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(GiB|GB|G)?\s*", str(text), flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"--gpu-memory {text!r}: expected a number of GB (80, 141) or e.g. 79.2GiB")
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    if unit == "gib":
        return int(value * GiB)
    if unit == "gb":
        return int(value * 1e9)
    return CARD_BYTES.get(int(value), int(value * GiB)) if value == int(value) else int(value * GiB)


def plan_for_sections(
    sections, device_bytes: Optional[int], device: str = "cuda", model_config: Optional[str] = None
) -> Plan:
    """The plan of a run's ``ConfigSections`` (model shape from ``actor_rollout_ref.model.path`` or ``model_config``)."""
    model = sections.workers.model
    shape = model_shape(str(model.path), model_config)
    if model.override_config:  # a few shape fields may be overridden at load time
        import dataclasses

        known = {f.name for f in dataclasses.fields(shape)}
        shape = dataclasses.replace(shape, **{k: v for k, v in dict(model.override_config).items() if k in known})
    return build_plan(PlanInputs.from_sections(sections, device=device), shape, device_bytes)


def plan_for_config(
    config, device_bytes: Optional[int], device: str = "cuda", model_config: Optional[str] = None
) -> Plan:
    """``plan_for_sections`` of a composed (Hydra) config, for the command line."""
    from luffy_pool.config.sections import ConfigSections

    return plan_for_sections(ConfigSections.from_config(config), device_bytes, device, model_config)


def device_memory_bytes() -> int:
    """Total memory of one GPU the workers will use, asked on a GPU of the Ray cluster: a one-shot task
    (``max_calls=1``: its process exits, and its CUDA context with it). The driver itself opens no CUDA context
    (one on GPU 0 would cost that rank ~0.5-1 GiB for the whole run). A process without Ray (gpu_smoke's
    in-process ranks, which compute on this process's GPU anyway) asks its own device."""
    import ray

    if not ray.is_initialized():
        import torch

        return int(torch.cuda.mem_get_info()[1])
    return int(ray.get(_device_total_task().remote(), timeout=600))


def _device_total_task():
    import ray

    @ray.remote(num_gpus=1, max_calls=1)
    def _total() -> int:
        import torch as t

        return int(t.cuda.mem_get_info()[1])

    return _total


def over_budget_message(plan: Plan) -> list[str]:
    """One line per phase over the device's memory, then the overrides that bring the plan under."""
    lines = [
        f"memory plan: phase '{p.name}' needs {p.total / GiB:.1f} GiB per rank, the device has "
        f"{plan.device_bytes / GiB:.1f} GiB"
        for p in plan.over(0.0)
    ]
    lines += [f"memory plan: {n}" for n in plan.notes if "refuse" in n or "raises" in n]
    fixes = suggestions(plan)
    if fixes:
        lines.append(
            "memory plan: to fit (with a 5 % margin) set "
            + " or ".join(fixes)
            + "; or trainer.memory_plan=warn to start anyway"
        )
    lines.append(layout_suggestion(plan))
    return lines


def layout_suggestion(plan: Plan) -> str:
    """The smallest actor layout (tp, pp) on the same GPUs whose plan fits with the 5 % margin, as overrides."""
    from luffy_pool.memory_plan.estimate import build_plan
    from luffy_pool.memory_plan.layout import layout_text, smallest_fitting_layout

    found = smallest_fitting_layout(plan, lambda p: not p.over(HEADROOM_FRACTION) and not p.notes, build_plan)
    i = plan.inputs
    if found is None:
        return f"memory plan: no actor (tp, pp) layout on these {i.world} GPUs fits either"
    tp, pp, trial = found
    return (
        f"memory plan: the smallest layout that fits on these {i.world} GPUs is "
        f"{layout_text(i.world, tp, pp, i.sp, trial.inputs.shard_group)} (peak {trial.peak.total / GiB:.1f} GiB): "
        f"actor_rollout_ref.actor.tensor_model_parallel_size={tp} actor_rollout_ref.actor.pipeline_model_parallel_size={pp}"
    )


def check_run(sections, device: str) -> Optional[Plan]:
    """Print the run's plan once and act on ``trainer.memory_plan`` (GPU runs only; None otherwise); ``sections``
    is the run's ``ConfigSections``."""
    mode = sections.trainer.memory_plan
    if mode == "off" or device != "cuda":
        return None
    try:
        plan = plan_for_sections(sections, device_memory_bytes(), device="cuda")
    except (FileNotFoundError, ValueError, KeyError) as exc:  # no shape for this model: a plan cannot be made
        if mode == "error":
            raise MemoryPlanError([f"memory plan: {exc} (trainer.memory_plan=warn starts without a plan)"]) from None
        logger.warning("memory plan skipped: %s", exc)
        return None
    print(
        "[luffy_pool] "
        + render(
            plan,
            f"memory plan (luffy_pool.memory_plan, trainer.memory_plan={mode})",
            rows_per_engine=rollout_rows_per_engine(sections),
        ).replace("\n", "\n[luffy_pool] "),
        flush=True,
    )
    problems = (
        over_budget_message(plan) if (plan.over(0.0) or any("refuse" in n or "raises" in n for n in plan.notes)) else []
    )
    if problems and mode == "error":
        raise MemoryPlanError(problems)
    for line in problems:
        logger.warning(line)
    if not problems and plan.over(HEADROOM_FRACTION):
        logger.warning(
            "memory plan: phase '%s' leaves less than %.0f %% of the device free",
            plan.peak.name,
            100 * HEADROOM_FRACTION,
        )
    return plan
