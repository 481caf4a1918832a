"""Fixtures of the actor tests: batches of GRPO-style groups whose rows repeat one left-padded prompt."""

import pytest
import torch


def _grouped_prompt_batch(vocab, groups, n, prompt, resp, response_tokens, seed=0):
    """``groups`` x ``n`` rows of ``prompt + resp`` token ids drawn from [3, vocab) with ``seed``. The ``n`` rows
    of group ``gi`` repeat one prompt left-padded by ``2 * gi`` tokens; row ``j`` of a group has
    ``response_tokens(j)`` response tokens, then right padding. Padding holds id 0.
    -> (ids, attention mask, position ids)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (groups * n, prompt + resp), generator=g)
    mask = torch.ones_like(ids)
    for gi in range(groups):
        for j in range(n):
            r = gi * n + j
            ids[r, :prompt] = ids[gi * n, :prompt]
            mask[r, : 2 * gi] = 0
            mask[r, prompt + response_tokens(j) :] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.fixture(scope="session")
def grouped_prompt_batch():
    """The builder ``grouped_prompt_batch(vocab, groups, n, prompt, resp, response_tokens, seed=0)``."""
    return _grouped_prompt_batch
