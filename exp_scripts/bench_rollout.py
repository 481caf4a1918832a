"""Benchmark: our rollout engines against raw ``vllm.LLM.generate``, and the per-step weight-sync cost.

In one run, on the same tiny model and batch (16 prompts x n=8 x 64 tokens by default), times:
raw vLLM (``LLM.generate`` with ``SamplingParams(n=8)``, timed inside a Ray actor), our
``VLLMRollout`` called from the driver through a Ray actor (so Ray transfer and our wrapper are
included), and ``HFRollout`` the same way. Runs alternate between engines so background load hits
all of them alike; medians are reported. Then hybrid-engine steps: an HF "trainer" model is
perturbed (a stand-in for an optimizer step), pushed through ``FSDPShardingManager`` and sampled;
the sync time and its share of sync+generate are printed. A last call gives 1 row in 8
``max_tokens=0`` (full off-policy trace slots) and shows they cost the engine nothing.

    OMP_NUM_THREADS=1 .venv/bin/python exp_scripts/bench_rollout.py [--repeats 5] [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# The engine keys this benchmark sets; every other key takes the trainer YAML's default (compose.rollout_section).
# An engine on its own reads its checkpoint (load_format=auto) on one rank.
ENGINE_CONFIG = {
    "prompt_length": 256,
    "response_length": 256,
    "dtype": "float32",
    "seed": 0,
    "cpu_kv_cache_bytes": 64 * 2**20,
    "load_format": "auto",
    "tensor_model_parallel_size": 1,
    "hf_micro_batch_size": 256,
}


def _prompts(model_dir: str, n_prompts: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    chats = [
        [{"role": "user", "content": f"What is {17 * i + 3} + {29 * i + 11}? Put the answer in \\boxed{{}}."}]
        for i in range(n_prompts)
    ]
    return [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats]


def make_actor_class():
    import ray

    @ray.remote(num_cpus=1)
    class BenchActor:
        """Holds one engine; ``kind`` is 'raw' (vllm.LLM), 'vllm' (VLLMRollout) or 'hf' (HFRollout)."""

        def __init__(self, kind: str, model_dir: str):
            import torch

            torch.set_num_threads(1)
            self.kind, self.model_dir = kind, model_dir
            if kind == "raw":
                from vllm import LLM

                self.engine = LLM(
                    model=model_dir,
                    dtype="float32",
                    enforce_eager=True,
                    seed=0,
                    max_model_len=512,
                    kv_cache_memory_bytes=64 * 2**20,
                )
            elif kind == "vllm":
                from luffy_pool.config.compose import rollout_section
                from verl.workers.rollout.vllm_rollout import VLLMRollout

                self.engine = VLLMRollout(model_dir, rollout_section(**ENGINE_CONFIG))
            else:
                from luffy_pool.config.compose import rollout_section
                from verl.workers.rollout.hf_rollout import HFRollout

                self.engine = HFRollout(model_dir, rollout_section(**ENGINE_CONFIG))

        def raw_generate(self, prompts, n, max_tokens):
            """Seconds and tokens of one raw ``LLM.generate`` (timed here: engine only)."""
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            params = SamplingParams(
                n=n, max_tokens=max_tokens, temperature=1.0, logprobs=0, ignore_eos=True, detokenize=False
            )
            start = time.perf_counter()
            outs = self.engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            seconds = time.perf_counter() - start
            return seconds, sum(len(c.token_ids) for o in outs for c in o.outputs)

        def generate(self, prompts, max_tokens, seed=None):
            from verl.workers.rollout.base import SamplingSpec

            spec = SamplingSpec(temperature=1.0, return_logprobs=True, ignore_eos=True, seed=seed)
            return self.engine.generate_token_ids(prompts, max_tokens, spec)

        def hybrid_steps(self, prompts, max_tokens, steps, bucket_bytes):
            """Per step: perturb a trainer copy, sync it into the engine, generate; returns timings."""
            import torch
            from transformers import AutoModelForCausalLM

            from verl.workers.rollout.base import SamplingSpec
            from verl.workers.sharding_manager import FSDPShardingManager

            trainer = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            manager = FSDPShardingManager(trainer, self.engine, bucket_bytes=bucket_bytes)
            spec = SamplingSpec(temperature=1.0, return_logprobs=True, ignore_eos=True)
            rows = []
            for _ in range(steps):
                with torch.no_grad():
                    for p in trainer.parameters():
                        p.add_(torch.randn_like(p) * 1e-3)
                start = time.perf_counter()
                manager.sync_weights()
                with manager:
                    entered = time.perf_counter()
                    self.engine.generate_token_ids(prompts, max_tokens, spec)
                rows.append(
                    {
                        "sync_s": manager.last_sync_s,
                        "gen_s": time.perf_counter() - entered,
                        "step_s": time.perf_counter() - start,
                        "buckets": manager.last_sync_buckets,
                    }
                )
            return rows

    return BenchActor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=None, help="HF model folder (default: build the tiny model)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per sample (EOS ignored)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per engine (after one warm-up)")
    ap.add_argument("--sync-steps", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=0.5, help="sync bucket size in MiB")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.path.insert(0, REPO)
    model_dir = args.model_dir
    if model_dir is None:
        from luffy_pool.tiny import build_tiny_model

        model_dir = build_tiny_model(tempfile.mkdtemp(prefix="bench_rollout_model_"))
    prompts = _prompts(model_dir, args.prompts)
    rows = [p for p in prompts for _ in range(args.n)]  # our interface: one row per sample
    caps = [args.tokens] * len(rows)
    total = len(rows) * args.tokens

    import ray

    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 * 2**20,
        runtime_env={
            "env_vars": {
                "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        },
    )
    Actor = make_actor_class()
    actors = {kind: Actor.remote(kind, model_dir) for kind in ("raw", "vllm", "hf")}
    ray.get([a.__ray_ready__.remote() for a in actors.values()])

    def time_ours(kind):
        start = time.perf_counter()
        out = ray.get(actors[kind].generate.remote(rows, caps))
        return time.perf_counter() - start, sum(len(t) for t in out.token_ids)

    def time_raw():
        return ray.get(actors["raw"].raw_generate.remote(prompts, args.n, args.tokens))

    runners = {"raw": time_raw, "vllm": lambda: time_ours("vllm"), "hf": lambda: time_ours("hf")}
    for run in runners.values():  # warm-up: first-call kernel set-up
        run()
    seconds = {k: [] for k in runners}
    for _ in range(args.repeats):
        for kind, run in runners.items():
            s, tokens = run()
            if tokens != total:
                raise RuntimeError(f"{kind} generated {tokens} tokens, expected {total}")
            seconds[kind].append(s)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    tps = {k: total / v for k, v in median.items()}

    steps = ray.get(actors["vllm"].hybrid_steps.remote(rows, caps, args.sync_steps + 1, int(args.bucket_mb * 2**20)))[
        1:
    ]
    sync = statistics.median(r["sync_s"] for r in steps)
    gen = statistics.median(r["gen_s"] for r in steps)

    full_trace = [0 if i % args.n == 0 else args.tokens for i in range(len(rows))]  # 1 slot in n
    out = ray.get(actors["vllm"].generate.remote(rows, full_trace))
    skipped_tokens = sum(len(t) for t, c in zip(out.token_ids, full_trace) if c == 0)

    print(
        f"batch: {args.prompts} prompts x n={args.n} x {args.tokens} tokens = {total} tokens; "
        f"median of {args.repeats} runs"
    )
    print(f"{'engine':<36}{'median s':>10}{'tokens/s':>11}{'vs raw':>8}")
    names = {
        "raw": "raw vllm.LLM.generate (in actor)",
        "vllm": "VLLMRollout via Ray actor",
        "hf": "HFRollout via Ray actor",
    }
    for kind in runners:
        print(f"{names[kind]:<36}{median[kind]:>10.3f}{tps[kind]:>11.0f}{tps[kind] / tps['raw']:>8.2f}")
    print(
        f"hybrid step ({len(steps)} steps, {steps[0]['buckets']} buckets of <= {args.bucket_mb} MiB): "
        f"sync {sync * 1000:.1f} ms, generate {gen:.3f} s, sync share {sync / (sync + gen):.1%}"
    )
    print(
        f"full-trace slots (max_tokens=0): {full_trace.count(0)} of {len(rows)} rows, "
        f"engine tokens spent on them: {skipped_tokens}"
    )
    results = {
        "seconds": seconds,
        "median_s": median,
        "tokens_per_s": tps,
        "ours_over_raw": tps["vllm"] / tps["raw"],
        "hf_over_raw": tps["hf"] / tps["raw"],
        "sync_s": sync,
        "gen_s": gen,
        "sync_share": sync / (sync + gen),
        "hybrid_steps": steps,
        "full_trace_tokens": skipped_tokens,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    main()
