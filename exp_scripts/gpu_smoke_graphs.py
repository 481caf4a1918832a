"""vLLM decode speed with CUDA graphs against eager (``exp_scripts/gpu_smoke.py``), each engine in its own
process, and the sleep -> in-place reload -> wake-up cycle the trainer runs with graphs captured."""

from __future__ import annotations

import json
import os
import sys
import time

GRAPHS_ON_CPU = (
    "CUDA graphs are a GPU feature: vLLM-CPU captures none (vllm/platforms/cpu.py empties "
    "cudagraph_capture_sizes) and this project builds CPU engines eager "
    "(verl/workers/rollout/vllm_rollout/config.py); no eager/graphs ratio on cpu"
)


def _decode_rate(model_dir: str, eager: bool, prompts: int, max_tokens: int) -> dict:
    """One engine in this process: decode tokens/s on fixed prompts (greedy, no EOS stop); with graphs, also the
    sleep(level=2) -> wake_up(weights) -> in-place reload -> wake_up(kv_cache) cycle the trainer runs, after which
    the same prompts must give the same tokens (graphs that kept stale addresses would not)."""
    import torch
    from vllm import LLM, SamplingParams

    # no prefix caching: every timed call prefills the same batch, so the calls compute the same shapes
    llm = LLM(
        model=model_dir,
        dtype="bfloat16",
        enforce_eager=eager,
        enable_sleep_mode=not eager,
        seed=0,
        gpu_memory_utilization=0.3,
        max_model_len=max_tokens + 64,
        enable_prefix_caching=False,
        disable_log_stats=True,
    )
    batch = [{"prompt_token_ids": [(7 * i + j) % 500 + 10 for j in range(16)]} for i in range(prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    def run():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = llm.generate(batch, params, use_tqdm=False)
        torch.cuda.synchronize()
        return [list(o.outputs[0].token_ids) for o in out], time.perf_counter() - t0

    run()  # warm-up: first-call kernels
    tokens, seconds = run()  # 16 prompt tokens per row: the time is decode's
    result = {
        "enforce_eager": eager,
        "sequences": prompts,
        "decode_tokens_per_s": round(prompts * max_tokens / seconds, 1),
    }
    if not eager:
        llm.sleep(level=2)
        llm.wake_up(tags=["weights"])
        llm.collective_rpc("reload_weights")  # vLLM's in-place layer-wise reload, from the checkpoint on disk
        llm.wake_up(tags=["kv_cache"])
        result["same_tokens_after_sleep_and_reload"] = run()[0] == tokens
    return result


def graphs_vs_eager(model_dir: str, device: str, prompts: int = 8, max_tokens: int = 256) -> dict:
    """Decode tokens/s of vLLM eager vs CUDA graphs on the same prompts, each engine in its own process (one vLLM
    cuMem allocator per process); on cpu only the reason there is no ratio."""
    if device != "cuda":
        print(f"[gpu_smoke] {GRAPHS_ON_CPU}", flush=True)
        return {"ok": True, "skipped": GRAPHS_ON_CPU}
    import subprocess

    runs = []
    for eager in (True, False):
        here = os.path.dirname(os.path.abspath(__file__))
        code = (
            f"import json, sys; sys.path.insert(0, {here!r}); import gpu_smoke_graphs; print('GRAPHS ' + "
            f"json.dumps(gpu_smoke_graphs._decode_rate({model_dir!r}, {eager}, {prompts}, {max_tokens})))"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("GRAPHS ")]
        if proc.returncode != 0 or not line:
            return {"ok": False, "error": f"enforce_eager={eager} engine failed: {proc.stderr[-2000:]}"}
        runs.append(json.loads(line[-1][len("GRAPHS ") :]))
    ratio = runs[1]["decode_tokens_per_s"] / runs[0]["decode_tokens_per_s"]
    same = runs[1]["same_tokens_after_sleep_and_reload"]
    print(
        f"[gpu_smoke] vLLM decode tokens/s, {prompts} sequences x {max_tokens} tokens: eager "
        f"{runs[0]['decode_tokens_per_s']}, CUDA graphs {runs[1]['decode_tokens_per_s']}, "
        f"graphs/eager = {ratio:.2f}; same tokens after sleep(2) + in-place reload: {same}",
        flush=True,
    )
    return {"ok": same, "eager": runs[0], "graphs": runs[1], "graphs_over_eager": round(ratio, 3)}
