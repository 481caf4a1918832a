"""mix_ppo_trainer.yaml composes verl's worker YAML (verl/trainer/config/ppo_worker.yaml) through its Hydra defaults
list: the composed config is the one the single file gave (snapshot tests/data/mix_ppo_trainer_composed.json), each
key has its default in exactly one of the two files, and what the checker and ``describe`` read without Hydra is
what Hydra composes."""

from __future__ import annotations

import json
import os

import yaml
from omegaconf import OmegaConf

from luffy_pool.config.check import BASE_CONFIG_NAME, CONFIG_DIR, base_yaml, schema_defaults
from luffy_pool.config.compose import compose_config
from luffy_pool.config.describe import describe, yaml_docs
from verl.workers.worker_config import WORKER_CONFIG_PATH

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SNAPSHOT = os.path.join(REPO, "tests", "data", "mix_ppo_trainer_composed.json")
# algorithm.<x> groups that are not a method's knobs (a method's knob group is its own YAML's, left out)
ALGORITHM_GROUPS = ("kl_ctrl", "rollout_correction")


def _leaves(node: dict, prefix: str = "") -> dict:
    """Dotted key -> value for every leaf (an empty dict is a leaf), without the algorithm.<method> knob groups."""
    out = {}
    for k, v in node.items():
        if prefix == "algorithm." and isinstance(v, dict) and k not in ALGORITHM_GROUPS:
            continue
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _file_keys(path: str) -> set:
    """Dotted leaf keys written in one YAML file (without Hydra's ``defaults`` and ``hydra`` nodes)."""
    tree = yaml.safe_load(open(path))
    tree.pop("defaults", None)
    tree.pop("hydra", None)
    return set(_leaves(tree))


def test_the_composed_config_is_the_single_files_config():
    with open(SNAPSHOT) as f:
        before = json.load(f)["keys"]
    now = _leaves(OmegaConf.to_container(compose_config(), resolve=False))
    assert sorted(set(before) - set(now)) == [] and sorted(set(now) - set(before)) == []
    assert {k: now[k] for k in before if now[k] != before[k]} == {}


def test_every_key_has_its_default_in_one_file_and_the_worker_keys_are_verls():
    own = _file_keys(os.path.join(CONFIG_DIR, f"{BASE_CONFIG_NAME}.yaml"))
    verl = _file_keys(WORKER_CONFIG_PATH)
    assert own & verl == set()
    assert {k for k in verl if not k.startswith("actor_rollout_ref.")} == {
        "data.max_prompt_length",
        "data.max_response_length",
    }
    from verl.utils.config_section import declarations
    from verl.workers.config_sections import WorkerSections

    assert {k for k in verl if k.startswith("actor_rollout_ref.")} == {
        d.key for d in declarations(WorkerSections, "actor_rollout_ref.")
    }


def test_the_checker_reads_without_hydra_what_hydra_composes():
    assert OmegaConf.to_container(base_yaml(), resolve=False) == OmegaConf.to_container(compose_config(), resolve=False)
    composed = OmegaConf.to_container(compose_config(), resolve=True, throw_on_missing=False)
    assert schema_defaults()["actor_rollout_ref.rollout.response_length"] == composed["data"]["max_response_length"]
    assert schema_defaults()["actor_rollout_ref.actor.use_off_policy_loss"] is False


def test_a_tiny_config_composes_the_worker_yaml_through_mix_ppo_trainer():
    cfg = compose_config(["trainer.total_training_steps=3"], config_name="tiny_cpu_luffy")
    assert cfg.actor_rollout_ref.actor.optim.weight_decay == 0.01  # from verl's worker YAML
    assert cfg.actor_rollout_ref.rollout.n == 8  # tiny_cpu_luffy.yaml's own value over it


def test_describe_shows_the_doc_of_a_verl_key_and_of_a_luffy_key():
    assert "HF model id or local folder" in yaml_docs()["actor_rollout_ref.model.path"]
    assert "doc: Mixed on/off-policy token loss" in describe("actor_rollout_ref.actor.use_off_policy_loss")
    assert "doc: Max generated tokens" in describe("actor_rollout_ref.rollout.response_length")
