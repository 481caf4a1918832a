"""LLM judge client: verdict parsing, prompt slots, retries, rate limit, cache, API-key handling."""

import json
import time
import types

import httpx
import openai
import pytest

from deepscaler.rewards.orm import (
    OrmConfig,
    OrmJudge,
    RateLimiter,
    build_messages,
    is_loopback_url,
    parse_verdict,
)


@pytest.mark.parametrize(
    "reply,verdict",
    [
        ("The answers match. [[YES]]", True),
        ("[[NO]]", False),
        ("Format: [[YES]] or [[NO]]. Here they differ, so [[NO]]", False),
        ("[[ yes ]]", True),
        ("YES", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_verdict_takes_the_last_verdict_token(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_problem_and_response_go_to_their_own_slots():
    messages = build_messages("PROBLEM-TEXT", "REF-42", "RESPONSE-TEXT")
    assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
    user = messages[1]["content"]
    assert user.index("Problem:") < user.index("PROBLEM-TEXT") < user.index("Reference answer:")
    assert user.index("REF-42") < user.index("Student response:") < user.index("RESPONSE-TEXT")


class FakeCompletions:
    """Stands in for ``client.chat.completions``: raises the queued errors, then replies."""

    def __init__(self, errors, reply="[[YES]]"):
        self.errors = list(errors)
        self.reply = reply
        self.calls = []

    def create(self, **kwargs):
        self.calls.append(kwargs)
        if self.errors:
            raise self.errors.pop(0)
        message = types.SimpleNamespace(content=self.reply)
        return types.SimpleNamespace(choices=[types.SimpleNamespace(message=message)])


def fake_client(completions):
    return types.SimpleNamespace(chat=types.SimpleNamespace(completions=completions))


def _config(**kw):
    base = dict(enable=True, base_url="http://127.0.0.1:9/v1", model="judge", requests_per_second=1000.0)
    base.update(kw)
    return OrmConfig(**base)


def _timeout_error():
    return openai.APITimeoutError(request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))


def test_transient_errors_are_retried_then_the_verdict_is_returned(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    completions = FakeCompletions([_timeout_error(), _timeout_error()])
    judge = OrmJudge(_config(max_retries=3), client=fake_client(completions))
    result = judge.judge("p", "1", "r")
    assert result.verdict is True and len(completions.calls) == 3
    assert completions.calls[0]["temperature"] == 0.0 and completions.calls[0]["model"] == "judge"


def test_retries_are_bounded_and_failure_gives_no_verdict(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    completions = FakeCompletions([_timeout_error()] * 10)
    judge = OrmJudge(_config(max_retries=2), client=fake_client(completions))
    result = judge.judge("p", "1", "r")
    assert result.verdict is None and result.error.startswith("APITimeoutError: ") and len(completions.calls) == 3


def test_cache_answers_repeats_without_a_call_and_persists_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("LUFFY_TEST_JUDGE_KEY", "sk-secret-value")
    path = tmp_path / "orm_cache.jsonl"
    completions = FakeCompletions([])
    cfg = _config(cache_path=str(path), api_key_env="LUFFY_TEST_JUDGE_KEY")
    judge = OrmJudge(cfg, client=fake_client(completions))
    assert judge.judge("p", "1", "r").verdict is True
    assert judge.judge("p", "1", "r").cached
    assert len(completions.calls) == 1
    text = path.read_text()
    assert "sk-secret-value" not in text and set(json.loads(text.splitlines()[0])) == {"key", "verdict"}
    reloaded = OrmJudge(cfg, client=fake_client(FakeCompletions([])))
    assert reloaded.judge("p", "1", "r").cached
    assert "sk-secret" not in repr(reloaded)


def test_rate_limiter_spaces_requests():
    limiter = RateLimiter(20.0)
    start = time.monotonic()
    for _ in range(5):
        limiter.wait()
    assert time.monotonic() - start >= 4 / 20.0 - 0.01


def test_api_key_comes_from_the_environment_and_is_required_off_loopback(monkeypatch):
    monkeypatch.delenv("LUFFY_TEST_JUDGE_KEY", raising=False)
    remote = _config(base_url="https://judge.example.com/v1", api_key_env="LUFFY_TEST_JUDGE_KEY")
    with pytest.raises(ValueError, match="LUFFY_TEST_JUDGE_KEY"):
        OrmJudge(remote)
    local = OrmJudge(_config(api_key_env="LUFFY_TEST_JUDGE_KEY"))
    assert local._client.api_key == "EMPTY"
    monkeypatch.setenv("LUFFY_TEST_JUDGE_KEY", "sk-from-env")
    assert OrmJudge(remote)._client.api_key == "sk-from-env"
    assert is_loopback_url("http://localhost:8000/v1") and not is_loopback_url("http://10.0.0.1/v1")


def test_enabled_orm_needs_endpoint_and_model():
    with pytest.raises(ValueError, match="base_url"):
        OrmConfig(enable=True)
    with pytest.raises(ValueError, match="requests_per_second"):
        OrmConfig(requests_per_second=0)
