"""The judge's circuit breaker: with ``on_failure=warn`` a dead or hung endpoint costs one failing step, then
the steps skip it (cost back near normal) until a single probe call finds it answering again.

Endpoints are local only: a closed port and a server on 127.0.0.1 that accepts and never answers.
"""

import logging
import socket
import threading
import time
import types

import httpx
import openai
import pytest

from deepscaler.rewards.orm import CIRCUIT_OPEN, OrmConfig, OrmJudge

TRIPLES = [(f"problem {i}", "1", f"answer {i}") for i in range(8)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hung_endpoint():
    """Accepts connections and never replies; closed (with its connections) at the end of the test."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


def _judge(port: int, monkeypatch) -> OrmJudge:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return OrmJudge(
        OrmConfig(
            enable=True,
            base_url=f"http://127.0.0.1:{port}/v1",
            model="judge",
            timeout_s=0.5,
            max_retries=1,
            requests_per_second=100.0,
            on_failure="warn",
            max_failure_rate=0.5,
        )
    )


def _step(judge):
    start = time.monotonic()
    results = judge.judge_many(TRIPLES)
    judge.check_failures(results)  # warn mode: logs, never raises
    return results, time.monotonic() - start


@pytest.mark.parametrize("kind", ["dead", "hung"])
def test_warn_mode_stops_calling_a_failing_endpoint_after_the_breaker_opens(kind, hung_endpoint, monkeypatch, caplog):
    port = _closed_port() if kind == "dead" else hung_endpoint
    judge = _judge(port, monkeypatch)
    caplog.set_level(logging.WARNING, logger="deepscaler.rewards.orm")
    first, first_s = _step(judge)
    assert all(r.verdict is None for r in first) and judge.breaker_open
    costs, skipped_steps = [], 0
    for _ in range(6):
        results, seconds = _step(judge)
        costs.append(seconds)
        skipped_steps += all(r.error == CIRCUIT_OPEN for r in results)
        assert all(r.verdict is None for r in results)
    # Steps 2-7: 1 skip, probe, 2 skips, probe, 1 of 4 skips: 4 steps make no call at all.
    assert skipped_steps == 4
    assert sum(costs) < first_s  # six steps with the breaker cost less than the one that opened it
    assert sorted(costs)[:4] == pytest.approx([0, 0, 0, 0], abs=0.05)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "circuit open" in messages and f"127.0.0.1:{port}" in messages


class SwitchableCompletions:
    """A judge endpoint that is down until ``up`` is set."""

    def __init__(self):
        self.up = False
        self.calls = 0

    def create(self, **kwargs):
        self.calls += 1
        if not self.up:
            raise openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))
        message = types.SimpleNamespace(content="[[YES]]")
        return types.SimpleNamespace(choices=[types.SimpleNamespace(message=message)])


def test_one_probe_call_closes_the_breaker_when_the_judge_answers_again(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)  # no backoff waits in this test
    completions = SwitchableCompletions()
    client = types.SimpleNamespace(chat=types.SimpleNamespace(completions=completions))
    judge = OrmJudge(
        OrmConfig(
            enable=True,
            base_url="https://k3y-0123456789@judge.example/v1",
            model="judge",
            max_retries=2,
            requests_per_second=1000.0,
            on_failure="warn",
        ),
        client=client,
    )
    judge.judge_many(TRIPLES)
    assert judge.breaker_open and "k3y-0123456789" not in repr(judge) and "***@judge.example" in judge.endpoint
    calls = completions.calls
    assert all(r.error == CIRCUIT_OPEN for r in judge.judge_many(TRIPLES)) and completions.calls == calls
    judge.judge_many(TRIPLES)  # probe: still down -> one call, open again for 2 steps
    assert completions.calls == calls + 1 and judge.breaker_open
    completions.up = True
    judge.judge_many(TRIPLES), judge.judge_many(TRIPLES)
    assert completions.calls == calls + 1
    results = judge.judge_many(TRIPLES)  # probe answers: closed, the whole step is judged
    assert [r.verdict for r in results] == [True] * len(TRIPLES) and not judge.breaker_open
