"""Pre-flight: each bad folder, model or data file is one line naming the key, path, row and column,
found before any tokenizer, model or Ray worker is loaded."""

from __future__ import annotations

import os
import time

import pandas as pd
import pytest

from luffy_pool.config.check import ConfigError
from luffy_pool.run.preflight import PreflightError, check_model_source, check_parquet, preflight


@pytest.fixture
def config(compose_config, luffy_overrides, tiny_model_dir, tiny_task_dir, tmp_path):
    return compose_config(luffy_overrides(tiny_model_dir, tiny_task_dir, str(tmp_path / "out")))


def _set(cfg, key, value):
    from omegaconf import OmegaConf

    OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def _errors(cfg) -> list[str]:
    with pytest.raises(PreflightError) as err:
        preflight(cfg)
    assert isinstance(err.value, ConfigError)  # main_mix_ppo prints it as config errors, exit code 2
    return err.value.errors


def test_a_good_config_passes_and_creates_the_output_dir(config, tmp_path):
    preflight(config)
    assert (tmp_path / "out").is_dir() and os.listdir(tmp_path / "out") == []


def test_unwritable_output_dir(config, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    errors = _errors(_set(config, "trainer.default_local_dir", str(blocker / "ckpt")))
    assert errors == [f"trainer.default_local_dir={blocker / 'ckpt'}: not writable (Not a directory)"]


def test_unwritable_checkpoint_mirror_is_found_at_start_not_after_the_first_save(config, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    errors = _errors(_set(config, "trainer.default_hdfs_dir", str(blocker / "mirror")))
    assert errors == [f"trainer.default_hdfs_dir={blocker / 'mirror'}: not writable (Not a directory)"]
    errors = _errors(_set(config, "trainer.default_hdfs_dir", "nosuchscheme://bucket/ckpt"))
    assert len(errors) == 1 and errors[0].startswith("trainer.default_hdfs_dir=nosuchscheme://bucket/ckpt: no fsspec")
    preflight(_set(config, "trainer.default_hdfs_dir", "memory://mirror/ckpt"))  # a working backend passes
    preflight(_set(config, "trainer.default_hdfs_dir", str(tmp_path / "mirror")))
    assert (tmp_path / "mirror").is_dir()


def test_missing_model_folder_names_the_path_not_a_hub_error(config, tmp_path):
    errors = _errors(_set(config, "actor_rollout_ref.model.path", str(tmp_path / "no_model")))
    assert errors == [f"actor_rollout_ref.model.path={tmp_path / 'no_model'}: the folder does not exist"]


def test_model_folder_without_config_or_tokenizer(tmp_path, tiny_model_dir):
    (tmp_path / "weights_only").mkdir()
    (tmp_path / "weights_only" / "model.safetensors").write_bytes(b"")
    assert "has no config.json" in check_model_source(str(tmp_path / "weights_only"), "k")
    (tmp_path / "weights_only" / "config.json").write_text("{}")
    assert "has no tokenizer" in check_model_source(str(tmp_path / "weights_only"), "k")
    assert check_model_source(tiny_model_dir, "k") is None


def test_bare_hub_name_fails_at_once_when_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = check_model_source("Qwen/Qwen2.5-Math-7B", "actor_rollout_ref.model.path")
    # the id, the cache folder looked in, the variables that move it (docs/DESIGN.md §2 item 12)
    assert msg == (
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B: not a local folder and not in the HuggingFace "
        f"cache, and HF_HUB_OFFLINE is set; looked for the hub cache entry {tmp_path}/hf/hub/"
        "models--Qwen--Qwen2.5-Math-7B (set HF_HUB_CACHE (or HF_HOME, whose hub/ subfolder is the cache) "
        "to use another cache, or pass a local model folder)"
    )
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: what an offline machine sees
    t0 = time.perf_counter()
    msg = check_model_source("Qwen/Qwen2.5-Math-7B", "actor_rollout_ref.model.path")
    assert "is unreachable (offline?)" in msg and time.perf_counter() - t0 < 5


def _prompt(text):
    return [{"role": "user", "content": text}]


def _good_rows(n=2):
    return [
        {
            "data_source": "x",
            "prompt": _prompt(f"q{i}"),
            "target": [{"role": "assistant", "content": "t"}],
            "reward_model": {"ground_truth": "1"},
        }
        for i in range(n)
    ]


def test_data_file_problems_each_have_their_own_line(tmp_path):
    cases = {}
    text = tmp_path / "text.parquet"
    text.write_text("a,b\n1,2\n")
    cases["text"] = (str(text), "data.train_files: {}: not a readable parquet file")
    cases["missing"] = (str(tmp_path / "absent.parquet"), "data.train_files: {}: file not found")
    nocol = tmp_path / "nocol.parquet"
    pd.DataFrame([{k: v for k, v in r.items() if k != "target"} for r in _good_rows()]).to_parquet(nocol)
    cases["nocol"] = (str(nocol), "data.train_files: {}: missing column 'target' (columns: ")
    zero = tmp_path / "zero.parquet"
    pd.DataFrame(_good_rows()).iloc[:0].to_parquet(zero)
    cases["zero"] = (str(zero), "data.train_files: {}: the file has 0 rows")
    blank = tmp_path / "blank.parquet"
    rows = _good_rows(3)
    rows[2]["prompt"] = _prompt("  ")
    pd.DataFrame(rows).to_parquet(blank)
    cases["blank"] = (str(blank), "data.train_files: {}: row 2: column 'prompt': the prompt is empty")
    for name, (path, expected) in cases.items():
        errors = check_parquet(path, "data.train_files", ("prompt", "data_source", "reward_model", "target"), "prompt")
        assert len(errors) == 1 and errors[0].startswith(expected.format(path)), (name, errors)
        assert "\n" not in errors[0]


def test_invalid_utf8_prompt_names_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # A binary payload stored under a string type, as a broken writer would produce.
    values = pa.array([b"fine", b"\xff\xfe bad"], type=pa.binary()).view(pa.string())
    table = pa.table({"prompt": values, "data_source": ["x", "x"], "reward_model": ["1", "1"]})
    pq.write_table(table, tmp_path / "bad_utf8.parquet")
    errors = check_parquet(str(tmp_path / "bad_utf8.parquet"), "data.val_files", ("prompt",), "prompt")
    assert errors == [
        f"data.val_files: {tmp_path / 'bad_utf8.parquet'}: row 1: column 'prompt': unreadable value "
        f"(UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte)"
    ]


def test_all_problems_are_reported_together_before_anything_loads(config, tmp_path, monkeypatch):
    import transformers

    def no_load(*a, **kw):
        raise AssertionError("pre-flight must run before any tokenizer/model is loaded")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_load)
    _set(config, "actor_rollout_ref.model.path", str(tmp_path / "none"))
    _set(config, "data.val_files", str(tmp_path / "none.parquet"))
    from luffy_pool.run.launcher import build_trainer

    with pytest.raises(PreflightError) as err:
        build_trainer(config)
    assert len(err.value.errors) == 2
    assert err.value.errors[0].startswith("actor_rollout_ref.model.path=")
    assert err.value.errors[1].startswith("data.val_files: ")


def test_an_unsupported_mixture_of_experts_model_is_refused_before_ray_starts(config, tmp_path, tiny_model_dir):
    """Issue #34: Qwen3-30B-A3B (MoE) passes pre-flight (verl/utils/moe_layout.py converts its experts); an MoE type
    without such a converter is refused with the reason, in one line naming the key."""
    import json
    import shutil

    model = tmp_path / "moe"
    shutil.copytree(tiny_model_dir, model)
    real = os.path.join(os.path.dirname(__file__), "..", "..", "data", "model_configs", "Qwen--Qwen3-30B-A3B-Base.json")
    shutil.copy(real, model / "config.json")
    preflight(_set(config, "actor_rollout_ref.model.path", str(model)))
    with open(model / "config.json", "w") as f:  # the same experts under a type moe_layout.py does not list
        json.dump(dict(json.load(open(real)), model_type="qwen2_moe"), f)
    errors = _errors(config)
    assert len(errors) == 1 and errors[0].startswith(f"actor_rollout_ref.model.path={model}: ")
    assert "qwen2_moe is a mixture of experts (128 experts)" in errors[0] and "not supported" in errors[0]
