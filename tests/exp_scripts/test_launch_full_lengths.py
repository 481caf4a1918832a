"""Every launch script's composed config against its default model's published config, at the script's own lengths.

The rehearsal shrinks lengths and models, so it cannot see a script whose default model is too short for its
prompt + response (train_exgrpo.sh once defaulted to Qwen/Qwen2.5-Math-7B, 4,096 positions, with 1024 + 8192
tokens) or whose heads vLLM's TP cannot split. Here each script's default model (MODEL_PATH unset) is looked up in
tests/data/model_configs, its unshrunk config.json is put in a folder the script is pointed at, and the composed
config goes through the checks a launch runs before any worker starts (``validate_config``: positions, Ulysses SP
and vLLM TP against the heads, batch and token budgets). The special ids of the published tokenizer files must lie
in the model's vocabulary.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from luffy_pool.memory_plan.launch_script import script_config_problems
from luffy_pool.run.recipe import RecipeError, discover_launch_scripts, read_recipe

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIGS = os.path.join(REPO, "tests", "data", "model_configs")
SCRIPTS = [s for s in discover_launch_scripts(os.path.join(REPO, "exp_scripts"))]
# scripts whose default model is no hub model: train_sft_rl.sh trains train_sft.sh's output (a local folder)
NO_HUB_DEFAULT = {"train_sft_rl.sh"}


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "MODEL_PATH"}
    env.update(extra)
    return env


def _default_model(script):
    try:
        recipe = read_recipe(script, _env())
    except RecipeError:
        return None, None
    return recipe, str(recipe.model_path)


def _config_file(config_name):
    """The stored config.json of a model: the matrix's, or config_only/ (large models without their token files)."""
    for name in (config_name, os.path.join("config_only", config_name)):
        if os.path.isfile(os.path.join(CONFIGS, name + ".json")):
            return os.path.join(CONFIGS, name + ".json")
    return None


def _problems(script, config_name, tmp_path, *extra):
    folder = tmp_path / config_name
    folder.mkdir()
    shutil.copyfile(_config_file(config_name), folder / "config.json")
    return script_config_problems(script, extra, _env(MODEL_PATH=str(folder)))


RL = []
for _s in SCRIPTS:
    _recipe, _model = _default_model(_s)
    if _recipe is None or _recipe.kind == "rl":
        RL.append((_s, _model))


def test_every_rl_script_has_its_default_models_config_or_is_known_to_have_none():
    missing = {os.path.basename(s) for s, m in RL if m is None or _config_file(m.replace("/", "--")) is None}
    assert missing == NO_HUB_DEFAULT
    assert len(RL) >= 12


@pytest.mark.parametrize(
    "script, model",
    [(s, m) for s, m in RL if os.path.basename(s) not in NO_HUB_DEFAULT],
    ids=[os.path.basename(s) for s, _ in RL if os.path.basename(s) not in NO_HUB_DEFAULT],
)
def test_script_fits_its_default_model_at_full_lengths(script, model, tmp_path):
    assert _problems(script, model.replace("/", "--"), tmp_path) == []


def test_a_script_too_long_for_its_model_is_refused_naming_the_lengths(tmp_path):
    problems = _problems(os.path.join(REPO, "exp_scripts", "train_exgrpo.sh"), "Qwen--Qwen2.5-Math-7B", tmp_path)
    assert len(problems) == 1 and "max_position_embeddings" in problems[0] and "4096" in problems[0], problems


def test_heads_that_vllm_tp_cannot_split_are_refused_naming_the_key(tmp_path):
    # Qwen2.5-Math-7B: 28 query heads, 4 kv heads; TP 8 splits neither
    problems = _problems(
        os.path.join(REPO, "exp_scripts", "train.sh"),
        "Elliott--Qwen2.5-Math-7B-16k-think",
        tmp_path,
        "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
    )
    assert any(
        "'actor_rollout_ref.rollout.tensor_model_parallel_size'=8 must divide the model's num_attention_heads=28" in p
        for p in problems
    ), problems


@pytest.mark.parametrize(
    "name",
    sorted(n[: -len(".tokenizer_config.json")] for n in os.listdir(CONFIGS) if n.endswith(".tokenizer_config.json")),
)
def test_published_special_ids_lie_in_the_models_vocabulary(name):
    with open(os.path.join(CONFIGS, name + ".json")) as f:
        vocab = json.load(f)["vocab_size"]
    with open(os.path.join(CONFIGS, name + ".tokenizer_config.json"), encoding="utf-8") as f:
        ids = [int(i) for i in json.load(f)["added_tokens_decoder"]]
    with open(os.path.join(CONFIGS, name + ".generation_config.json")) as f:
        gen = json.load(f)
    stops = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    assert max(ids) < vocab and set(stops) <= set(ids), (name, ids, stops, vocab)
