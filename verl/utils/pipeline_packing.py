"""The first pipeline stage's inputs, padded or packed (``use_remove_padding``), in equal pipeline micro-batches.

torch's pipelining splits every positional input along dim 0 into the schedule's micro-batches, and every
micro-batch of one step must have the same shape. Padded rows (``pad_stage_inputs``) are that already. Packed rows
(``pack_stage_inputs``, verl's remove-padding under PP) put each micro-batch's real tokens in one row, its sequences
one after another with their own position ids (transformers finds the restarts: a block-diagonal causal mask for
sdpa/eager, varlen kernels for flash-attention), padded to the longest micro-batch by one extra sequence whose
outputs no row reads. The last stage scores the responses at ``score_index``: per response token, the flat index
(in the micro-batch's ``[tokens, hidden]`` states) of the state that predicts it.
"""

from __future__ import annotations

import torch


def pad_stage_inputs(t: dict, n_chunks: int) -> list[torch.Tensor]:
    """``(input_ids, attention_mask, position_ids, responses, score_index)`` of padded rows (``t``: those four,
    rows a multiple of ``n_chunks``)."""
    ids, responses = t["input_ids"], t["responses"]
    rows, width = ids.shape
    per, resp = rows // n_chunks, responses.size(-1)
    local_row = torch.arange(rows, device=ids.device) % per
    # logits at t predict token t+1: the response's predictions sit one step to the left
    cols = torch.arange(width - resp - 1, width - 1, device=ids.device)
    score_index = local_row[:, None] * width + cols[None, :]
    return [ids, t["attention_mask"], t["position_ids"], responses, score_index]


def pack_stage_inputs(t: dict, n_chunks: int) -> list[torch.Tensor]:
    """The same five inputs packed: ``input_ids``/``position_ids`` ``[n_chunks, L]`` (one packed row per micro-batch),
    the attention mask a ``[n_chunks, 1]`` placeholder (the stages pass None to the layers), ``responses`` and
    ``score_index`` ``[rows, R]`` (a padding response token points at 0; its output is masked by the loss)."""
    ids, mask, pos, responses = t["input_ids"], t["attention_mask"].bool(), t["position_ids"], t["responses"]
    rows, width = ids.shape
    per, resp = rows // n_chunks, responses.size(-1)
    lengths = mask.view(n_chunks, per * width).sum(-1)
    longest = int(lengths.max())
    packed_ids = ids.new_zeros(n_chunks, longest)
    packed_pos = pos.new_zeros(n_chunks, longest)
    score_index = torch.empty(rows, resp, dtype=torch.long, device=ids.device)
    for c in range(n_chunks):
        sl = slice(c * per, (c + 1) * per)
        valid = mask[sl]
        n = int(lengths[c])
        packed_ids[c, :n] = ids[sl][valid]
        packed_pos[c, :n] = pos[sl][valid]
        # the filler is one more sequence (positions restart at 0), so no real token attends to it
        packed_pos[c, n:] = torch.arange(longest - n, device=ids.device)
        offset = (valid.reshape(-1).cumsum(0) - 1).view(per, width)
        scored = offset[:, width - resp - 1 : width - 1]
        score_index[sl] = torch.where(valid[:, width - resp :], scored, torch.zeros_like(scored))
    placeholder = mask.new_ones(n_chunks, 1, dtype=t["attention_mask"].dtype)
    return [packed_ids, placeholder, packed_pos, responses, score_index]
