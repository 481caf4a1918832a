"""verl's worker defaults (verl/trainer/config/ppo_worker.yaml, verl/workers/worker_config.py): every key documented
next to its default, composable by name from any config folder, and a standalone rollout section built from it."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from verl.workers.config_sections import RolloutSection
from verl.workers.worker_config import WORKER_CONFIG_PATH, register_worker_config, rollout_section


def test_every_key_of_the_worker_yaml_has_a_comment_line_above_it():
    text = open(WORKER_CONFIG_PATH).read()
    lines, missing, stack = text.splitlines(), [], [yaml.compose(text)]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                line = key.start_mark.line
                if not (line > 0 and lines[line - 1].lstrip().startswith("#")):
                    missing.append(f"{line + 1}: {lines[line].strip()}")
                stack.append(value)
    assert missing == []


def test_a_config_in_another_folder_composes_the_worker_yaml_by_name(tmp_path):
    from hydra import compose, initialize_config_dir

    (tmp_path / "trainer.yaml").write_text("defaults:\n  - ppo_worker\n  - _self_\ndata:\n  max_prompt_length: 64\n")
    register_worker_config()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        cfg = compose("trainer")
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6 and cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.actor_rollout_ref.rollout.prompt_length == 64  # the YAML's interpolation follows the trainer's data


def test_the_standalone_rollout_section_has_the_yaml_defaults_and_checks_what_is_set():
    section = rollout_section()
    assert type(section) is RolloutSection
    assert (section.name, section.hf_decoder, section.prompt_length, section.response_length) == (
        "vllm",
        "auto",
        512,
        512,
    )
    changed = rollout_section(dtype="float32", hf_micro_batch_size=3)
    assert dataclasses.replace(section, dtype="float32", hf_micro_batch_size=3) == changed
    with pytest.raises(ValueError, match="hf_micro_batch_size"):
        rollout_section(hf_micro_batch_size=0)
    with pytest.raises(KeyError, match="actor_rollout_ref.rollout.n_prefix is not a key of"):
        rollout_section(n_prefix=1)  # the LUFFY prefix plan is not a worker key
