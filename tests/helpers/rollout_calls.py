"""The calls a trainer makes on its split rollout group, in the order the engines receive them.

``record_rollout_calls(trainer)`` wraps the group's methods: ``push`` (``receive_weights``), ``generate k`` (the k-th
``generate_sequences_async``), ``generated k`` (the driver got its rows) and ``validate`` (``generate_validation``).
The engines run calls in order, so a push issued while a generation is in flight waits for it, and so does the
actor's rank 0 in the broadcast; ``queued_behind_a_generation`` names those calls.
"""

from __future__ import annotations


class _RecordedFuture:
    def __init__(self, future, events: list, k: int) -> None:
        self._future, self._events, self._k, self._got = future, events, k, False

    def get(self, *args, **kwargs):
        out = self._future.get(*args, **kwargs)
        if not self._got:
            self._got = True
            self._events.append(f"generated {self._k}")
        return out


def record_rollout_calls(trainer) -> list:
    """Wrap ``trainer.rollout_wg``'s push / generate / validate methods; returns the event list they append to."""
    wg, events = trainer.rollout_wg, []
    receive, generate, validate = wg.receive_weights, wg.generate_sequences_async, wg.generate_validation

    def receive_weights(*args, **kwargs):
        events.append("push")
        return receive(*args, **kwargs)

    def generate_sequences_async(*args, **kwargs):
        k = 1 + sum(e.startswith("generate ") for e in events)
        events.append(f"generate {k}")
        return _RecordedFuture(generate(*args, **kwargs), events, k)

    def generate_validation(*args, **kwargs):
        events.append("validate")
        return validate(*args, **kwargs)

    wg.receive_weights, wg.generate_sequences_async = receive_weights, generate_sequences_async
    wg.generate_validation = generate_validation
    return events


def queued_behind_a_generation(events: list) -> list:
    """``(index, event)`` of every push issued while a generation was in flight, and of every validation issued
    while a generation was in flight with a push queued behind it (the push before its own generation in a launch
    comes first, so it is never one of them)."""
    in_flight, pushed_behind, out = set(), False, []
    for i, event in enumerate(events):
        kind, _, k = event.partition(" ")
        if kind == "generate":
            in_flight.add(k)
        elif kind == "generated":
            in_flight.discard(k)
            pushed_behind = pushed_behind and bool(in_flight)
        elif kind == "push" and in_flight:
            pushed_behind = True
            out.append((i, event))
        elif kind == "validate" and in_flight and pushed_behind:
            out.append((i, event))
    return out
