"""Benchmark: the engine's sampled-token log-probs of one training step, as per-token Python objects vs one tensor
per request (``verl/workers/rollout/vllm_rollout/vllm_rollout.py`` ``sampled_logprobs``).

One process, the same synthetic step for both (``--tokens`` generated tokens over ``--rows`` completions, log-probs
drawn once): vLLM's own containers (``vllm/logprobs.py``) are filled token by token as its output processor does
(``append_logprobs_for_next_position``), then read into the batch's ``rollout_log_probs [rows, length]``.

- before: ``SamplingParams(logprobs=0)``: a ``{token: Logprob}`` dict per token; read back with one dict lookup per
  token into a list of Python floats per row, converted again per float when the slots are assembled.
- after: ``flat_logprobs=True``: four flat lists per request; read back as one tensor per row, copied into the
  batch by slice.

Prints each phase's median seconds and the ratio before / after (the engine-side fill and our read-back apart and
together). vLLM's detokenisation and scheduling are not part of either.

    .venv/bin/python exp_scripts/bench_logprobs.py [--tokens 2000000] [--rows 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time


def synthetic_step(tokens: int, rows: int, seed: int = 0):
    """``rows`` completions of about ``tokens / rows`` tokens each: (token ids, log-probs) per row."""
    import torch

    g = torch.Generator().manual_seed(seed)
    per_row = max(1, tokens // rows)
    ids = torch.randint(3, 150_000, (rows, per_row), generator=g).tolist()
    lps = (-torch.rand(rows, per_row, generator=g) * 5).tolist()
    return ids, lps


def fill_containers(ids, lps, flat: bool):
    """vLLM's per-request containers, filled one position at a time as its output processor does (the sampled token
    only: ``logprobs=0``)."""
    from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs

    out = []
    for row_ids, row_lps in zip(ids, lps):
        container = create_sample_logprobs(flat)
        for tok, lp in zip(row_ids, row_lps):
            append_logprobs_for_next_position(container, [tok], [lp], (None,), 1, 0)
        out.append(container)
    return out


def read_before(containers, ids, length: int):
    """The previous read-back: a float per token from each position's dict, then float() again per token when the
    slot plan assembled ``rollout_log_probs``, and a tensor built from each row's list."""
    import torch

    rows = [[step[tok].logprob for step, tok in zip(c, row_ids)] for c, row_ids in zip(containers, ids)]
    out = torch.zeros((len(rows), length), dtype=torch.float32)
    for k, row in enumerate(rows):
        values = [float(v) for v in row][:length]
        if values:
            out[k, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return out


def read_after(containers, ids, length: int):
    """The current read-back: one tensor per row (``sampled_logprobs``), copied into the batch by slice."""
    import torch

    from verl.workers.rollout.vllm_rollout.vllm_rollout import sampled_logprobs

    rows = [sampled_logprobs(c, row_ids) for c, row_ids in zip(containers, ids)]
    out = torch.zeros((len(rows), length), dtype=torch.float32)
    for k, values in enumerate(rows):
        values = values[:length]
        out[k, : len(values)] = values
    return out


def _median_seconds(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bench_logprobs(tokens: int = 2_000_000, rows: int = 1024, repeats: int = 3) -> dict:
    """Median seconds of each phase before and after, and the ratios; raises if the two read-backs differ."""
    import torch
    import vllm.logprobs  # noqa: F401 -- imported before the clocks start

    import verl.workers.rollout.vllm_rollout.vllm_rollout  # noqa: F401

    ids, lps = synthetic_step(tokens, rows)
    length = len(ids[0])
    # each representation is dropped before the other is built, so neither pays for the other's objects in the
    # garbage collector's scans
    fill_before, dicts = _median_seconds(lambda: fill_containers(ids, lps, flat=False), repeats)
    read_b, before = _median_seconds(lambda d=dicts: read_before(d, ids, length), repeats)
    del dicts
    gc.collect()
    fill_after, flats = _median_seconds(lambda: fill_containers(ids, lps, flat=True), repeats)
    read_a, after = _median_seconds(lambda: read_after(flats, ids, length), repeats)
    if not torch.equal(before, after):
        raise AssertionError("the two read-backs give different rollout_log_probs")
    return {
        "tokens": rows * length,
        "rows": rows,
        "repeats": repeats,
        "engine_fill_s": {"before": fill_before, "after": fill_after},
        "read_back_s": {"before": read_b, "after": read_a},
        "ratio_engine_fill": fill_before / fill_after,
        "ratio_read_back": read_b / read_a,
        "ratio_total": (fill_before + read_b) / (fill_after + read_a),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2_000_000, help="generated tokens of the step (default 2,000,000)")
    ap.add_argument("--rows", type=int, default=1024, help="completions of the step (default 1024)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per phase; medians reported (default 3)")
    args = ap.parse_args(argv)
    result = bench_logprobs(args.tokens, args.rows, args.repeats)
    for phase in ("engine_fill_s", "read_back_s"):
        print(f"{phase}: before {result[phase]['before']:.3f} s, after {result[phase]['after']:.3f} s")
    print(
        f"ratio before/after: read-back {result['ratio_read_back']:.1f}x, engine fill "
        f"{result['ratio_engine_fill']:.2f}x, both {result['ratio_total']:.2f}x ({result['tokens']:,} tokens)"
    )
    print("BENCH_LOGPROBS " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
