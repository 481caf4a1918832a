"""Context check at start (docs/DESIGN.md §2 item 4): prompt + response beyond max_position_embeddings is one clear line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from verl.utils.context_length import check_context_length, max_positions


def test_limit_and_override():
    cfg = SimpleNamespace(max_position_embeddings=4096)
    assert max_positions(cfg) == 4096
    assert max_positions(cfg, {"max_position_embeddings": 16384}) == 16384
    assert max_positions(SimpleNamespace()) is None


def test_luffy_lengths_on_plain_qwen_math_fail_with_both_numbers():
    check_context_length(1024, 8192, 16384, "Elliott/Qwen2.5-Math-7B-16k-think")  # fits
    check_context_length(1024, 8192, None, "m")  # no limit in the config: nothing to check
    with pytest.raises(ValueError) as err:
        check_context_length(1024, 8192, 4096, "Qwen/Qwen2.5-Math-7B")
    msg = str(err.value)
    assert "\n" not in msg
    assert "(1024)" in msg and "(8192)" in msg and "= 9216" in msg and "max_position_embeddings (4096)" in msg
    assert "Qwen/Qwen2.5-Math-7B" in msg and "16k-think" in msg


def test_build_trainer_fails_before_ray(tiny_model_dir, tiny_task_dir, tmp_path, compose_config, luffy_overrides):
    from luffy_pool.run.launcher import build_trainer

    # the tiny model has 2048 positions
    config = compose_config(
        luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path))
        + ["data.max_prompt_length=1024", "data.max_response_length=1100"]
    )
    with pytest.raises(
        ValueError,
        match=r"\(1024\) \+ data.max_response_length \(1100\) = 2124 exceeds "
        r"max_position_embeddings \(2048\)",
    ):
        build_trainer(config)
