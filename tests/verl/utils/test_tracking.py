"""Tracking fans out to console and a jsonl file, masks secrets and rejects unknown backends."""
import json

import pytest

from verl.utils.tracking import Tracking, mask_secrets


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
