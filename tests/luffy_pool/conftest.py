"""Fixtures of the luffy_pool end-to-end tests: train a composed config and see the actor's weights move."""

from __future__ import annotations

import pytest


def _fit_with_fingerprints(config):
    """Build the trainer, fit it, close it -> (trainer, actor fingerprint before, last metrics, after)."""
    from luffy_pool.run.launcher import build_trainer

    trainer, close = build_trainer(config)
    try:
        before = trainer.wg.actor_weight_fingerprint()
        last = trainer.fit()
        after = trainer.wg.actor_weight_fingerprint()
    finally:
        close()
    return trainer, before, last, after


@pytest.fixture(scope="session")
def fit_with_fingerprints():
    """``fit_with_fingerprints(config)`` -> ``(trainer, before, last, after)``: one fit of ``config`` in this
    process's Ray session, with the actor weight fingerprints (one per rank) before and after it."""
    return _fit_with_fingerprints
