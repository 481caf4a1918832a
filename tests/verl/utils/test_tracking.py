"""Tracking fans out to console and a jsonl file, masks secrets and rejects unknown backends."""

import json

import pytest

from verl.utils.tracking import Tracking, mask_secrets, mask_url, masked_yaml


def test_console_and_jsonl(tmp_path, capsys):
    t = Tracking("p", "e", ["console", "jsonl"], config={"a": 1}, log_dir=str(tmp_path))
    t.log({"critic/score/mean": 0.5, "actor/pg_loss": float("nan")}, step=3)
    t.finish()
    out = capsys.readouterr().out
    assert "step:3" in out and "critic/score/mean:0.5000" in out
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().strip())
    assert rec["step"] == 3 and rec["critic/score/mean"] == 0.5 and rec["actor/pg_loss"] == "nan"


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="mlfow"):
        Tracking("p", "e", ["console", "mlfow"])


def test_secrets_are_masked():
    cfg = {"reward": {"orm": {"api_key": "sk-123", "model": "m"}}, "token_budget": None}
    assert mask_secrets(cfg) == {"reward": {"orm": {"api_key": "***", "model": "m"}}, "token_budget": None}


def test_only_secrets_are_masked(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-0123456789")
    monkeypatch.setenv("MAX_TOKENS", "12345678")  # a count named with TOKENS is not a secret
    cfg = {
        "actor": {"ppo_max_token_len_per_gpu": 16384, "ppo_micro_batch_size": 2},
        "rollout": {"max_num_batched_tokens": 8192, "max_token_budget_label": "long-text"},
        "reward": {
            "orm": {"api_key_env": "OPENAI_API_KEY", "base_url": "http://h/v1", "openaiApiKey": "sk-abcdef1234"}
        },
        "trainer": {
            "hf_token": "hf_abcdef1234",
            "client_secret": "s3cr3t-value",
            "password": "hunter22",
            "experiment_name": "tok-0123456789",
            "tags": ["tok-0123456789", "x"],
            "seed": 12345678,
            "tokenizer": "/models/qwen",
        },
    }
    out = mask_secrets(cfg)
    assert out["actor"] == cfg["actor"] and out["rollout"] == cfg["rollout"]
    assert out["reward"]["orm"] == {"api_key_env": "OPENAI_API_KEY", "base_url": "http://h/v1", "openaiApiKey": "***"}
    assert out["trainer"] == {
        "hf_token": "***",
        "client_secret": "***",
        "password": "***",
        "experiment_name": "***",
        "tags": ["***", "x"],
        "seed": 12345678,
        "tokenizer": "/models/qwen",
    }


def test_a_key_inside_a_url_is_masked_and_special_tokens_are_not(monkeypatch):
    cfg = {
        "reward": {"orm": {"base_url": "https://sk-live-0123456789@judge.example.com/v1"}},
        "other": {
            "endpoint": "https://user:pa55word@h:8000/v1?api_key=abc123def&model=m&token=t0k3n",
            "plain": "http://127.0.0.1:8000/v1",
            "with_query": "https://h/v1?model=qwen&page=2",
        },
        "data": {
            "pad_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "bos_token": "<s>",
            "think_token": "<think>",
            "hf_token": "hf_abcdef1234",
            "auth_token": "abcd-efgh-ijkl",
        },
    }
    out = mask_secrets(cfg)
    assert out["reward"]["orm"]["base_url"] == "https://***@judge.example.com/v1"
    assert out["other"] == {
        "endpoint": "https://***@h:8000/v1?api_key=***&model=m&token=***",
        "plain": "http://127.0.0.1:8000/v1",
        "with_query": "https://h/v1?model=qwen&page=2",
    }
    assert out["data"] == {
        "pad_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "bos_token": "<s>",
        "think_token": "<think>",
        "hf_token": "***",
        "auth_token": "***",
    }
    assert mask_url("error talking to https://k3y@h/v1: timeout") == "error talking to https://***@h/v1: timeout"
    from omegaconf import OmegaConf

    printed = masked_yaml(OmegaConf.create(cfg))
    assert "sk-live-0123456789" not in printed and "pa55word" not in printed and "abc123def" not in printed
    assert "<|endoftext|>" in printed and "judge.example.com" in printed


def test_jsonl_keeps_tensors_as_scalars_and_lists_and_reader_keeps_last_record(tmp_path):
    import numpy as np
    import torch

    from verl.utils.tracking import read_metrics_jsonl

    t = Tracking("p", "e", ["jsonl"], log_dir=str(tmp_path))
    t.log({"a": torch.tensor(2.5), "b": np.float32(1.5), "idx": np.array([3, 1]), "c": float("inf")}, step=1)
    t.log({"a": 9.0}, step=2)
    t.finish()
    # a resumed run appends to the same file and re-logs step 2
    t = Tracking("p", "e", ["jsonl"], log_dir=str(tmp_path))
    t.log({"a": 4.0}, step=2)
    t.finish()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "a"')  # torn by a kill
    recs = read_metrics_jsonl(str(tmp_path / "metrics.jsonl"))
    assert list(recs) == [1, 2]
    assert recs[1]["a"] == 2.5 and recs[1]["b"] == 1.5 and recs[1]["idx"] == [3, 1] and recs[1]["c"] == float("inf")
    assert recs[2]["a"] == 4.0


def test_console_skips_non_scalar_values(capsys):
    t = Tracking("p", "e", ["console"], console_all=True)
    t.log({"x": 1.0, "idx": [1, 2]}, step=1)
    assert capsys.readouterr().out.strip() == "step:1 - x:1.0000"


@pytest.mark.slow  # 3-8 s (subprocesses, worker start-ups or a full data set): full suite only
def test_wandb_offline_writes_run_under_log_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    t = Tracking("proj", "exp", ["wandb"], config={"trainer": {"seed": 1}}, log_dir=str(tmp_path))
    t.log({"critic/score/mean": 0.25, "idx": [1, 2]}, step=1)
    t.finish()
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_tensorboard_backend_writes_events_or_names_the_missing_package(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            Tracking("p", "e", ["tensorboard"], log_dir=str(tmp_path))
        return
    t = Tracking("p", "e", ["tensorboard"], log_dir=str(tmp_path))
    t.log({"critic/score/mean": 0.25}, step=1)
    t.finish()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


SAMPLES = [
    {"input": "What is 2+3?\nThink.", "output": "<think>2+3=5</think> \\boxed{5}", "score": 1.0},
    {"input": "What is 7*6?", "output": "x" * 200, "score": 0.0},
]


def test_val_generations_go_to_the_console_table_and_a_jsonl_file(tmp_path, capsys):
    t = Tracking("p", "e", ["console", "jsonl"], log_dir=str(tmp_path))
    t.log_generations(SAMPLES, step=4)
    t.finish()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "val generations at step 4:"
    assert "What is 2+3? Think." in out[2] and "1.000" in out[2] and "\\boxed{5}" in out[2]
    assert out[3].endswith("...") and len(out) == 4  # long text cut, one line per sample
    lines = [json.loads(ln) for ln in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert [(r["step"], r["sample"], r["score"]) for r in lines] == [(4, 0, 1.0), (4, 1, 0.0)]
    assert lines[0]["input"] == SAMPLES[0]["input"] and lines[1]["output"] == "x" * 200


def test_val_generations_go_to_a_wandb_table(tmp_path):
    logged = []

    class FakeRun:
        def log(self, data, step):
            logged.append((data, step))

    t = Tracking("p", "e", [], log_dir=str(tmp_path))
    t._wandb = FakeRun()
    t.log_generations(SAMPLES, step=7)
    ((data, step),) = logged
    table = data["val/generations"]
    assert step == 7 and table.columns == ["step", "input", "output", "score"]
    assert [row[3] for row in table.data] == [1.0, 0.0] and table.data[0][1] == SAMPLES[0]["input"]
