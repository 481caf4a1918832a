"""Fixtures shared by the worker and rollout tests: a stand-in for vllm.LLM's sleep/wake calls."""

from __future__ import annotations

import pytest


class EngineRecorder:
    """Stands in for vllm.LLM where only the sleep/wake calls matter."""

    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


@pytest.fixture
def engine_recorder():
    """The recorder class (tests subclass it to add the engine methods they need)."""
    return EngineRecorder
