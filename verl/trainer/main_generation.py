"""Generate responses from a model folder over a parquet of chat prompts (verl's ``main_generation``).

This module is also the generation library of ``eval_scripts/generate_vllm.py``: prompt rendering
(LUFFY's templates), the vLLM engine (GPU, or its CPU build with fp32 / eager / a bounded KV cache) and
an HF ``generate`` fallback, both returning ``n`` completions per prompt. The CLI reads ``--data_path``,
samples ``--n_samples`` responses per row and writes the input rows plus a ``responses`` list column to
``--output_path`` (.parquet or .jsonl). verl-style ``data.path=...`` overrides are accepted too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Optional, Sequence

from verl.utils.data_format import (
    DataFormatError,
    add_bool_arg,
    check_chat,
    read_records,
    run_cli,
    user_text,
    write_records,
)

# ------------------------------------------------------------------------------------------ templates
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
PRIME_ZERO_PREFIX = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>. User: "
)


def _chatml(system: str, user: str) -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


# LUFFY eval templates (docs/METHOD.md §4.4). ``own`` uses the model's chat template on the (system-stripped)
# messages; the others rebuild the prompt from the user's question alone, as LUFFY does.
TEMPLATES = {
    "own": None,
    "qwen": lambda q: _chatml(QWEN_MATH_SYSTEM, q),
    "simplerl": lambda q: _chatml(
        "You are a helpful assistant.", q + "\nPlease reason step by step, and put your final answer within\\boxed{}."
    ),
    "prime": lambda q: (
        PRIME_ZERO_PREFIX + q + "\n\nPresent the answer in LaTex format: \\boxed{Your answer}. Assistant:"
    ),
    "no": lambda q: q,
}


def prepare_messages(messages: Sequence[dict], remove_system: bool, system_prompt: Optional[str] = None) -> list[dict]:
    """Drop the system turn (LUFFY's eval default) and/or put ``system_prompt`` in its place."""
    msgs = [dict(m) for m in messages]
    if remove_system or system_prompt:
        msgs = [m for m in msgs if m["role"] != "system"]
    if system_prompt:
        msgs = [{"role": "system", "content": system_prompt}] + msgs
    if not msgs:
        raise ValueError("no message left after removing the system prompt")
    return msgs


def render_prompt(messages: Sequence[dict], template: str, tokenizer=None) -> str:
    """The text the engine continues: the chat template's generation prompt, or a LUFFY template."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; valid: {', '.join(TEMPLATES)}")
    if template == "own":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("template 'own' needs a tokenizer with a chat template; use --template no or qwen")
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return TEMPLATES[template](user_text(messages))


# -------------------------------------------------------------------------------------------- engines
@dataclasses.dataclass
class SamplingArgs:
    """Sampling for one generation pass (LUFFY eval defaults: T=0.6, top_p=1, 8192 new tokens)."""

    n: int = 1
    temperature: float = 0.6
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_tokens: int = 8192
    # Return the behaviour log-prob of every generated token (the sampling distribution: after temperature /
    # top-k / top-p; at temperature 0 the model's own distribution).
    logprobs: bool = False


@dataclasses.dataclass
class Completion:
    text: str  # decoded without special tokens (vLLM's default), so EOS text is not included
    token_ids: list[int]  # generated ids, EOS included when emitted
    finish_reason: str  # "stop" (EOS), "length" (max_tokens) or "prompt_too_long" (not generated)
    logprobs: Optional[list[float]] = None  # one per token_ids entry when SamplingArgs.logprobs

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def vllm_engine_kwargs(
    model_path: str,
    dtype: str = "auto",
    seed: int = 0,
    gpu_count: int = 0,
    tensor_parallel_size: Optional[int] = None,
    max_model_len: Optional[int] = None,
    kv_cache_gb: Optional[float] = None,
    gpu_memory_utilization: float = 0.85,
) -> dict:
    """``vllm.LLM`` arguments. GPU (``gpu_count > 0``): tensor parallel over all visible GPUs unless told,
    LUFFY's 0.85 memory share. CPU build: fp32 (bf16 diverges from HF), eager, and an explicit KV cache
    (without one vLLM-CPU reserves 90 % of RAM), 0.25 GiB unless told (docs/CPU_STACK.md §7.1)."""
    kwargs = dict(model=model_path, seed=seed, dtype=dtype)
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    if gpu_count > 0:
        kwargs.update(
            tensor_parallel_size=tensor_parallel_size or gpu_count, gpu_memory_utilization=gpu_memory_utilization
        )
        if kv_cache_gb:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
    else:
        kwargs.update(enforce_eager=True, kv_cache_memory_bytes=int((kv_cache_gb or 0.25) * 2**30))
        if dtype == "auto":
            kwargs["dtype"] = "float32"
    return kwargs


class VLLMGenerator:
    """``vllm.LLM`` in this process (on CPU, the in-process engine: ~3 s start instead of ~30 s)."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        seed: int = 0,
        tensor_parallel_size: Optional[int] = None,
        max_model_len: Optional[int] = None,
        kv_cache_gb: Optional[float] = None,
        gpu_memory_utilization: float = 0.85,
    ):
        import torch

        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not gpu_count:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        # processed_logprobs: --logprobs returns the distribution actually sampled (after temperature), as the rollout.
        self.llm = LLM(
            **vllm_engine_kwargs(
                model_path,
                dtype,
                seed,
                gpu_count,
                tensor_parallel_size,
                max_model_len,
                kv_cache_gb,
                gpu_memory_utilization,
            ),
            logprobs_mode="processed_logprobs",
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingArgs) -> list[list[Completion]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_tokens,
            logprobs=0 if sampling.logprobs else None,
        )
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=True)

        def lps(o):
            if not sampling.logprobs:
                return None
            return [float(step[tok].logprob) for step, tok in zip(o.logprobs, o.token_ids)]

        return [
            [Completion(o.text, list(o.token_ids), o.finish_reason or "length", lps(o)) for o in out.outputs]
            for out in outs
        ]


class HFGenerator:
    """The trainer's HF rollout engine (``HFRollout``: the lean KV-cache decoder for Llama-family models, the
    generic ``model(...)`` loop otherwise) over a plain HF folder, on GPU when present.

    ``batch_size`` prompts (their ``n`` samples each) per decode batch. One sampling generator seeded with
    ``seed`` per ``generate`` call. Measured on the tiny CPU model (500 prompts x 4 at T=0.6): 4.2 CPU s, against
    11-12 CPU s for transformers ``generate`` at any batch size (``verl/workers/rollout/kv_decoder.py``).
    """

    def __init__(self, model_path: str, dtype: str = "auto", seed: int = 0, batch_size: int = 16):
        import torch

        from verl.utils.tokenizer import hf_tokenizer, stop_token_ids
        from verl.workers.rollout.hf_rollout import HFRollout
        from verl.workers.worker_config import rollout_section

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.tokenizer = hf_tokenizer(model_path)
        # The workers' rollout section (the defaults of verl/trainer/config/ppo_worker.yaml) with this generator's
        # dtype and batch.
        self.section = rollout_section(dtype=dtype, hf_micro_batch_size=batch_size)
        self.engine = HFRollout(model_path, self.section, device=self.device)
        self.model = self.engine.model
        self.seed, self.batch_size = seed, batch_size
        self.eos_ids = set(stop_token_ids(self.tokenizer, model_path))  # what the engine stops on
        self.max_model_len = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingArgs) -> list[list[Completion]]:
        from verl.workers.rollout.base import SamplingSpec
        from verl.workers.rollout.config import engine_config

        n = sampling.n
        rows = [ids for ids in prompt_ids for _ in range(n)]
        # Like vLLM: generation stops at the end of the model's context.
        caps = [max(1, min(sampling.max_tokens, self.max_model_len - len(ids))) for ids in rows]
        spec = SamplingSpec(
            temperature=max(0.0, float(sampling.temperature)),
            top_p=float(sampling.top_p),
            top_k=int(sampling.top_k) if sampling.top_k > 0 else -1,
            seed=self.seed,
            return_logprobs=bool(sampling.logprobs),
        )
        # ``batch_size`` counts prompts; the engine's micro-batch counts rows (a prompt's n samples share a prefill).
        self.engine.config = engine_config(
            dataclasses.replace(self.section, hf_micro_batch_size=max(1, self.batch_size * n))
        )
        out = self.engine.generate_token_ids(rows, caps, spec)
        lps = out.logprobs
        return [
            [
                self._completion(out.token_ids[r], lps[r].tolist() if lps is not None else None)
                for r in range(i * n, (i + 1) * n)
            ]
            for i in range(len(prompt_ids))
        ]

    def _completion(self, ids: list[int], logprobs: Optional[list[float]] = None) -> Completion:
        ids = list(ids)
        stop = next((k for k, t in enumerate(ids) if t in self.eos_ids), None)
        if stop is not None:
            ids = ids[: stop + 1]
            reason = "stop"
        else:
            reason = "length"
        lps = [float(v) for v in logprobs[: len(ids)]] if logprobs is not None else None
        return Completion(self.tokenizer.decode(ids, skip_special_tokens=True), ids, reason, lps)


BACKENDS = ("vllm", "hf")


def load_generator(backend: str, model_path: str, dtype: str = "auto", seed: int = 0, **engine_kwargs):
    """``vllm`` -> VLLMGenerator (tensor_parallel_size, max_model_len, kv_cache_gb, gpu_memory_utilization);
    ``hf`` -> HFGenerator (batch_size). Other keyword arguments are ignored by the backend that has no use for them."""
    if not os.path.isdir(model_path):
        raise FileNotFoundError(f"model folder not found: {model_path}")
    if backend == "vllm":
        keys = ("tensor_parallel_size", "max_model_len", "kv_cache_gb", "gpu_memory_utilization")
        return VLLMGenerator(
            model_path, dtype=dtype, seed=seed, **{k: v for k, v in engine_kwargs.items() if k in keys}
        )
    if backend == "hf":
        return HFGenerator(model_path, dtype=dtype, seed=seed, batch_size=engine_kwargs.get("batch_size") or 16)
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def generate_completions(
    generator, prompts: Sequence[str], sampling: SamplingArgs, overlong_prompts: str = "error"
) -> list[list[Completion]]:
    """``n`` completions per prompt text. A prompt that leaves no room to generate in the model's context
    is an error naming it (``overlong_prompts='error'``) or yields empty ``prompt_too_long`` completions
    (``'skip'``; graded wrong, and counted by the caller)."""
    if overlong_prompts not in ("error", "skip"):
        raise ValueError(f"overlong_prompts must be 'error' or 'skip', got {overlong_prompts!r}")
    tok = generator.tokenizer
    prompt_ids = [list(ids) for ids in tok(list(prompts), add_special_tokens=False)["input_ids"]]
    fits = [len(ids) < generator.max_model_len for ids in prompt_ids]
    if not all(fits) and overlong_prompts == "error":
        bad = [i for i, ok in enumerate(fits) if not ok]
        raise ValueError(
            f"{len(bad)} prompt(s) do not fit the model context of {generator.max_model_len} tokens "
            f"(first: prompt {bad[0]}, {len(prompt_ids[bad[0]])} tokens); raise --max_model_len or "
            "pass --overlong_prompts skip"
        )
    keep = [i for i, ok in enumerate(fits) if ok]
    generated = generator.generate([prompt_ids[i] for i in keep], sampling) if keep else []
    out: list[list[Completion]] = [[Completion("", [], "prompt_too_long")] * sampling.n for _ in prompts]
    for i, comps in zip(keep, generated):
        out[i] = comps
    return out


# ------------------------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m verl.trainer.main_generation",
        description="Sample responses from a model folder (HF save_pretrained / exported checkpoint) over a "
        "parquet of chat prompts; writes the rows plus a 'responses' list column.",
    )
    ap.add_argument("--model_path", "--model.path", dest="model_path", required=True, help="model folder")
    ap.add_argument("--data_path", "--data.path", dest="data_path", required=True, help="input .parquet/.jsonl")
    ap.add_argument(
        "--output_path", "--data.output_path", dest="output_path", required=True, help="output .parquet or .jsonl"
    )
    ap.add_argument("--prompt_key", "--data.prompt_key", dest="prompt_key", default="prompt")
    ap.add_argument("--n_samples", "--data.n_samples", dest="n_samples", type=int, default=1)
    ap.add_argument(
        "--batch_size",
        "--data.batch_size",
        dest="batch_size",
        type=int,
        default=256,
        help="prompts per engine call (the HF backend sub-batches further)",
    )
    ap.add_argument("--max_rows", type=int, default=None, help="only the first N rows")
    ap.add_argument("--temperature", "--rollout.temperature", dest="temperature", type=float, default=1.0)
    ap.add_argument("--top_p", "--rollout.top_p", dest="top_p", type=float, default=1.0)
    ap.add_argument("--top_k", "--rollout.top_k", dest="top_k", type=int, default=-1)
    ap.add_argument("--max_tokens", "--rollout.response_length", dest="max_tokens", type=int, default=512)
    ap.add_argument("--template", choices=list(TEMPLATES), default="own")
    add_bool_arg(ap, "--remove_system", default=False, help="drop the system turn before templating")
    ap.add_argument("--system_prompt", default=None, help="system message to use instead of the row's")
    ap.add_argument("--backend", choices=BACKENDS, default="vllm")
    ap.add_argument(
        "--tensor_parallel_size",
        "--rollout.tensor_model_parallel_size",
        dest="tensor_parallel_size",
        type=int,
        default=None,
        help="GPUs per engine (default: all visible)",
    )
    ap.add_argument("--dtype", default="auto", help="auto = bf16 on GPU, fp32 on CPU")
    ap.add_argument("--max_model_len", type=int, default=None)
    ap.add_argument("--kv_cache_gb", type=float, default=None, help="KV cache size (CPU default 0.25 GiB)")
    ap.add_argument("--hf_batch_size", type=int, default=16)
    ap.add_argument("--overlong_prompts", choices=("error", "skip"), default="error")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def hydra_style_to_flags(argv: Sequence[str]) -> list[str]:
    """``data.path=x`` (verl's Hydra overrides) -> ``--data.path=x``; everything else is left alone."""
    return [f"--{a}" if "=" in a and not a.startswith("-") and "." in a.split("=", 1)[0] else a for a in argv]


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_parser().parse_args(hydra_style_to_flags(sys.argv[1:] if argv is None else argv))
    records = read_records(args.data_path, args.max_rows)
    if not records:
        raise DataFormatError(args.data_path, "no rows")
    messages = []
    for i, rec in enumerate(records):
        if args.prompt_key not in rec:
            raise DataFormatError(
                args.data_path, f"missing column (columns present: {', '.join(sorted(rec))})", i, args.prompt_key
            )
        chat = check_chat(rec[args.prompt_key], args.data_path, i, args.prompt_key)
        messages.append(prepare_messages(chat, args.remove_system, args.system_prompt))
    generator = load_generator(
        args.backend,
        args.model_path,
        dtype=args.dtype,
        seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        kv_cache_gb=args.kv_cache_gb,
        batch_size=args.hf_batch_size,
    )
    prompts = [render_prompt(m, args.template, generator.tokenizer) for m in messages]
    sampling = SamplingArgs(
        n=args.n_samples, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens
    )
    t0 = time.time()
    completions: list[list[Completion]] = []
    for start in range(0, len(prompts), args.batch_size):
        completions += generate_completions(
            generator, prompts[start : start + args.batch_size], sampling, args.overlong_prompts
        )
    for rec, comps in zip(records, completions):
        rec["responses"] = [c.text for c in comps]
    write_records(records, args.output_path)
    n_tokens = sum(c.num_tokens for comps in completions for c in comps)
    print(
        f"wrote {len(records)} rows x {args.n_samples} responses to {args.output_path} "
        f"({n_tokens} tokens in {time.time() - t0:.1f} s)"
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
