"""``rehearse.sh --model-config FILE``: the tiny model is the real config.json with only sizes shrunk, the
report lists the fields kept and shrunk, and an MoE type without an expert converter is refused in one line. train.sh's two steps on a
shrunk Llama-3.1-8B run with the other rehearsals (tests/exp_scripts/test_rehearse.py, case
``train.sh@Llama-3.1-8B``), sharing their Ray instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXP = os.path.join(REPO, "exp_scripts")
CONFIGS = os.path.join(REPO, "tests", "data", "model_configs")
LLAMA = os.path.join(CONFIGS, "meta-llama--Llama-3.1-8B.json")


def _rehearse(tmp_path, *args, timeout=600):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
        LUFFY_VENV=os.path.dirname(os.path.dirname(sys.executable)),
    )
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        ["bash", os.path.join(EXP, "rehearse.sh"), os.path.join(EXP, "train.sh"), "--work", str(tmp_path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(tmp_path),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REHEARSAL ")]
    assert lines, f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc, json.loads(lines[-1][len("REHEARSAL ") :])


def test_dry_run_shrinks_the_real_config_and_lists_kept_fields(tmp_path):
    proc, report = _rehearse(tmp_path, "--model-config", LLAMA, "--dry-run")
    assert proc.returncode == 0 and report["rc"] == 0
    m = report["model"]
    assert m["model_type"] == "llama" and m["real_config"] == LLAMA
    kept, shrunk = m["config_fields"]["kept"], m["config_fields"]["shrunk"]
    assert {"rope_scaling", "rope_theta", "tie_word_embeddings", "attention_bias", "mlp_bias", "rms_norm_eps"} <= set(
        kept
    )
    assert shrunk["num_hidden_layers"] == [32, 2] and shrunk["vocab_size"][0] == 128256
    assert m["config_fields"]["tokens"]["bos_token_id"][0] == 128000
    assert "kept from the real config: " in proc.stdout and "shrunk: num_hidden_layers 32->2" in proc.stdout
    with open(os.path.join(m["now"], "config.json")) as f:
        tiny = json.load(f)
    rope = tiny.get("rope_parameters") or tiny["rope_scaling"]
    assert rope["rope_type"] == "llama3" and rope["original_max_position_embeddings"] == 8192
    assert tiny["bos_token_id"] != tiny["eos_token_id"]  # Llama-3.1's are distinct; they stay distinct
    # its published tokens: no pad token (the loader then takes <|finetune_right_pad_id|>), its chat template, its
    # generation config's stop id
    with open(os.path.join(m["now"], "tokenizer_config.json")) as f:
        tok = json.load(f)
    assert tok.get("pad_token") is None and tok["eos_token"] == "<|end_of_text|>"
    with open(os.path.join(m["now"], "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == tiny["eos_token_id"]
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(m["now"]).apply_chat_template(
        [{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert "tokens from " in proc.stdout and "pad None" in proc.stdout
    # heads split over the recipe's TP (train.sh: vLLM TP 2)
    assert tiny["num_key_value_heads"] % report["world"]["tp"] == 0


def test_an_moe_type_without_an_expert_converter_is_refused_in_one_line(tmp_path):
    """Qwen3-MoE itself rehearses (tests/exp_scripts/test_rehearse.py, case train.sh@Qwen3-30B-A3B-Base); the same
    experts under a type verl/utils/moe_layout.py does not list are refused before anything is built."""
    other = tmp_path / "other_moe.json"
    with open(os.path.join(CONFIGS, "Qwen--Qwen3-30B-A3B-Base.json")) as f:
        other.write_text(json.dumps(dict(json.load(f), model_type="qwen2_moe")))
    proc, report = _rehearse(tmp_path, "--model-config", str(other), "--dry-run")
    assert proc.returncode == 2 and report["rc"] == 2
    refused = [line for line in proc.stdout.splitlines() if line.startswith("rehearse: refused: ")]
    assert len(refused) == 1 and "qwen2_moe is a mixture of experts (128 experts)" in refused[0]
    assert "moe_layout.py" in report["refused"]


def test_missing_model_config_is_named(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "luffy_pool.run.rehearse",
            os.path.join(EXP, "train.sh"),
            "--work",
            str(tmp_path),
            "--model-config",
            str(tmp_path / "nope.json"),
            "--dry-run",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and f"--model-config {tmp_path / 'nope.json'}: no such file" in proc.stderr
