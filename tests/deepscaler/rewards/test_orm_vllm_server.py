"""LLM judge against a real OpenAI-compatible server: vLLM's API server (CPU build) with the tiny model.

The tiny random model never writes ``[[YES]]``, so these tests pin the transport: the request reaches
the server with the configured model name and key, the reply text comes back and is parsed by the same
function the unit tests cover, a wrong key is refused without retries, and the reward manager wires
the judge into scoring. The server listens on 127.0.0.1 only.
"""

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from deepscaler.rewards.orm import OrmConfig, OrmJudge, build_messages, parse_verdict

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL_NAME = "tiny-judge"
KEY_ENV = "LUFFY_TEST_ORM_KEY"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def judge_server(tiny_model_dir, tmp_path_factory):
    port = _free_port()
    api_key = "sk-test-" + secrets.token_hex(8)
    log_path = tmp_path_factory.mktemp("vllm_server") / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        tiny_model_dir,
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--kv-cache-memory-bytes",
        str(64 * 2**20),
        "--seed",
        "0",
        "--api-key",
        api_key,
        "--disable-log-stats",
        "--uvicorn-log-level",
        "warning",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM server not healthy after 600 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(1.0)
        yield {"base_url": base + "/v1", "api_key": api_key}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _config(server, **kw):
    return OrmConfig(
        enable=True,
        base_url=server["base_url"],
        model=MODEL_NAME,
        api_key_env=KEY_ENV,
        timeout_s=120,
        max_retries=1,
        **kw,
    )


def test_request_reaches_the_server_and_the_reply_is_parsed(judge_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, judge_server["api_key"])
    judge = OrmJudge(_config(judge_server), max_tokens=8)
    # The raw round trip: the served model answers under its configured name with our prompt tokens.
    completion = judge._client.chat.completions.create(
        model=MODEL_NAME,
        messages=build_messages("What is 2 + 2?", "4", "The answer is 4."),
        temperature=0.0,
        max_tokens=8,
    )
    assert completion.model == MODEL_NAME
    assert completion.usage.prompt_tokens > 50 and 1 <= completion.usage.completion_tokens <= 8
    reply = completion.choices[0].message.content
    assert isinstance(reply, str)
    # The judge path returns the same kind of reply and parses it with parse_verdict.
    result = judge.judge("What is 2 + 2?", "4", "The answer is 4.")
    assert isinstance(result.reply, str)
    assert result.verdict is parse_verdict(result.reply)
    assert (result.error is None) == (result.verdict is not None)


def test_wrong_api_key_is_refused_without_retries(judge_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    judge = OrmJudge(_config(judge_server), max_tokens=4)
    start = time.monotonic()
    result = judge.judge("p", "1", "r")
    assert result.verdict is None and "AuthenticationError" in result.error
    assert time.monotonic() - start < 60


def test_reward_manager_consults_the_judge_for_wrong_answers(judge_server, monkeypatch, tmp_path):
    from verl.workers.reward_manager import RewardManager

    monkeypatch.setenv(KEY_ENV, judge_server["api_key"])
    orm = dict(
        enable=True,
        base_url=judge_server["base_url"],
        model=MODEL_NAME,
        api_key_env=KEY_ENV,
        timeout_s=120,
        max_retries=1,
        cache_path=str(tmp_path / "cache.jsonl"),
        on_failure="warn",
    )  # the random tiny judge may reply without a verdict: that is a failure
    with RewardManager(None, reward_impl_version=3, num_workers=0, orm=orm) as manager:
        manager.judge.max_tokens = 8
        items = [
            ("math", "x\n</think>\n\\boxed{5}", "4", {"problem": "What is 2 + 2?"}),
            ("math", "x\n</think>\n\\boxed{4}", "4", {"problem": "What is 2 + 2?"}),
        ]
        scores, metrics = manager.score_texts(items)
    assert scores[1] == 1.0  # right answers never reach the judge
    assert metrics["reward/orm_calls"] == 1.0
    assert scores[0] == metrics["reward/orm_yes"]  # 1.0 only if the judge said [[YES]]
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert judge_server["api_key"] not in written
