"""Start-up check that prompt + response fit the model's position range (docs/DESIGN.md §2 item 4).

A run whose ``data.max_prompt_length + data.max_response_length`` exceeds the model's
``max_position_embeddings`` would otherwise fail (or silently degrade) only when the engine is built or
the first long sample arrives: plain Qwen2.5-Math-7B has 4096 positions, LUFFY's 1024 + 8192 needs the
``-16k-think`` variant. The check reads only the model's config, on the driver, before Ray starts: the config
checker when the model's config.json is on disk (``ConfigSections.validate``), else the launcher's pre-flight once
the model is resolved (``check_model_context``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

LONG_CONTEXT_HINT = "Elliott/Qwen2.5-Math-7B-16k-think"


def max_positions(hf_config: Any, override_config: Optional[Mapping[str, Any]] = None) -> Optional[int]:
    """The model's position limit after ``model.override_config`` (None when the config names none)."""
    overrides = dict(override_config or {})
    value = overrides.get("max_position_embeddings", getattr(hf_config, "max_position_embeddings", None))
    return None if value is None else int(value)


def context_length_error(prompt_length: int, response_length: int, limit: Optional[int], model: str) -> Optional[str]:
    """One line naming both numbers when ``prompt_length + response_length > limit`` (else None)."""
    total = int(prompt_length) + int(response_length)
    if limit is not None and total > limit:
        return (
            f"data.max_prompt_length ({prompt_length}) + data.max_response_length ({response_length}) = {total} "
            f"exceeds max_position_embeddings ({limit}) of {model}; use a long-context model (e.g. "
            f"{LONG_CONTEXT_HINT}) or shorter lengths"
        )
    return None


def check_context_length(prompt_length: int, response_length: int, limit: Optional[int], model: str) -> None:
    """``context_length_error`` as a ValueError."""
    problem = context_length_error(prompt_length, response_length, limit, model)
    if problem:
        raise ValueError(problem)


def check_model_context(model, max_prompt_length: int, max_response_length: int) -> None:
    """``check_context_length`` for the run's ``actor_rollout_ref.model`` section (reads its HF config)."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    overrides = dict(model.override_config or {})
    check_context_length(max_prompt_length, max_response_length, max_positions(hf_config, overrides), model.path)
