"""Smoke check of the GPU path on one device, in minutes: the first thing to run on a new GPU machine.

Builds a random-init model with Qwen2.5-1.5B's shapes (``--small``: a tiny one) and the synthetic task,
then runs LUFFY training steps through the real worker (``MIXActorRolloutRefWorker``: FSDP2 over a
1-rank NCCL group, gradient checkpointing, bf16 compute, the shared-prompt forward) and the real trainer
step (``MIXRayPPOTrainer.train_step``: rollout with one full off-policy trace per group, reward,
old log-probs, mixed advantage, update) with each rollout engine: the HF engine, then vLLM when it is
installed. Ray is not needed: the trainer talks to the worker in this process. Asserts that the
weights changed, that the engine's weights equal the actor's after the sync, that the sync travels in
the parameter dtype, and that a CUDA run really uses NCCL and the GPU; prints peak memory, tokens/s and
the sync time, and a last line ``GPU_SMOKE {json}``. Exit code 0 = all checks passed. Two numeric checks run
inside the steps (exp_scripts/gpu_smoke_checks.py): packed (remove padding, and the chunked scoring head) vs padded
log-probs on one micro-batch, and the engine-vs-actor gap right after each weight push (mean log-prob difference
and k3 KL over the engine's sampled tokens: ~1e-3 in bf16, O(1) after a broken push). ``--split`` adds a run on
split engines (hybrid_engine=False, one_step_off) through the launcher and Ray: 1 actor + 1 engine rank (2 GPUs,
or CPU processes). Each check prints a PASS/FAIL line, then a summary line.

    python exp_scripts/gpu_smoke.py                       # one GPU (< 7 min on an H200)
    python exp_scripts/gpu_smoke.py --device cpu --small  # CI (tests/exp_scripts/test_gpu_smoke.py)
    python exp_scripts/gpu_smoke.py --device cpu --small --rollout hf --split off  # the numeric checks, ~20 s
    python exp_scripts/gpu_smoke.py --recipe exp_scripts/train.sh  # the recipe's switches on one GPU

``--recipe SCRIPT`` reads a launch script through its own command line (luffy_pool/run/recipe.py, shared with
the CPU rehearsal) and runs its switches at these shapes: gradient checkpointing, remove padding, dynamic
batch sizes with its token budgets (scaled by its prompt length over this run's), the reference with its
offload setting (the reference is switched on to exercise it: LUFFY's train.sh offloads a reference that
use_ref=False leaves unused), its parameter dtype (bf16 on cuda), its log-prob chunk and its engine (vLLM) with the recipe's rollout keys
(gpu_memory_utilization, enforce_eager, sleep_level, free_cache_engine, prefix caching; max_num_batched_tokens and
max_num_seqs scaled), checked against the built engine's own config. SP and TP need more than one rank (this smoke
is one process): when the machine has the GPUs for the recipe's SP x TP (sp_tp_ranks), the recipe then runs 2 steps
through ``exp_scripts/rehearse.sh --device cuda`` on that many GPUs (NCCL, its SP and vLLM TP groups, the weight
sync between them; tiny model and lengths); with fewer GPUs that is printed and skipped.

Needs torch, transformers, tensordict, omegaconf, hydra-core (+ vllm for the vLLM part).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

SHAPES = {
    # Qwen2.5-1.5B (config.json of the release)
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # head_dim 32: vLLM-CPU has no attention kernel for 16
    "small": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=2048,
        rope_theta=1e4,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--small", action="store_true", help="tiny shapes and lengths (CI on CPU)")
    p.add_argument(
        "--rollout",
        choices=("auto", "hf", "vllm"),
        default="auto",
        help="auto: the HF engine, then vLLM when importable",
    )
    p.add_argument("--steps", type=int, default=2, help="LUFFY steps per engine")
    p.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    p.add_argument("--recipe", default=None, help="a launch script (exp_scripts/train.sh): run its switches")
    p.add_argument(
        "--split",
        choices=("auto", "on", "off"),
        default="auto",
        help="a run on split engines through Ray; auto: where 1 actor + 1 engine rank fit (CPU, 2 GPUs), "
        "not with --recipe",
    )
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_rank_env() -> None:
    """The environment a worker group gives rank 0 of 1 (the worker reads it in ``__new__``)."""
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }.items():
        os.environ.setdefault(k, v)


def build_model(out_dir: str, small: bool, device: str) -> str:
    """A random-init Qwen2 with the chosen shapes and the synthetic task's tokenizer, saved as an HF folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from luffy_pool.tiny import build_tokenizer

    tok = build_tokenizer(out_dir)
    shape = SHAPES["small" if small else "qwen2.5-1.5b"]
    cfg = Qwen2Config(
        **shape, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    model.save_pretrained(out_dir, safe_serialization=True)
    del model
    return out_dir


def overrides(model_dir: str, task_dir: str, out_dir: str, device: str, small: bool, rollout: str, steps: int) -> list:
    prompt, response, batch = (96, 48, 4) if small else (256, 512, 16)
    return [
        f"data.train_files={task_dir}/train.parquet",
        "data.val_files=null",
        f"data.train_batch_size={batch}",
        f"data.max_prompt_length={prompt}",
        f"data.max_response_length={response}",
        "data.reward_impl_version=3",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.optim.lr=1e-3" if small else "actor_rollout_ref.actor.optim.lr=1e-5",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        "actor_rollout_ref.actor.ppo_micro_batch_size=2",
        "actor_rollout_ref.actor.use_off_policy_loss=True",
        "actor_rollout_ref.actor.off_policy_reshape=p_div_p_0.1",
        "actor_rollout_ref.actor.loss_remove_token_mean=True",
        "actor_rollout_ref.actor.loss_remove_clip=True",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.n=4",
        f"actor_rollout_ref.rollout.dtype={'bfloat16' if device == 'cuda' else 'float32'}",
        f"actor_rollout_ref.rollout.max_prefix_len={response}",
        "actor_rollout_ref.rollout.n_prefix=1",
        "actor_rollout_ref.rollout.min_prefix_ratio=1.0",
        "actor_rollout_ref.rollout.max_prefix_ratio=1.0",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.calculate_log_probs=True",  # the engine's log-probs: the engine-vs-actor check
        "actor_rollout_ref.ref.use_ref=False",
        "actor_rollout_ref.actor.use_kl_loss=False",  # LUFFY train.sh: no ref
        "algorithm.adv_estimator=grpo",
        "algorithm.grpo_use_std=False",
        "algorithm.kl_ctrl.kl_coef=0.0",
        "reward.num_workers=1",
        f"trainer.device={device}",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.logger=['console']",
        f"trainer.default_local_dir={out_dir}",
        "trainer.balance_batch=False",
    ]


def recipe_overrides(script: str, small: bool) -> tuple[list, dict]:
    """Overrides that turn on a launch script's switches at this run's shapes, and the switches read."""
    from luffy_pool.run.recipe import read_recipe

    recipe = read_recipe(script, dict(os.environ, MODEL_PATH="recipe/model"))
    sw = recipe.switches()
    prompt = 96 if small else 256
    factor = max(1, int(recipe.get("data.max_prompt_length")) // prompt)  # one factor for every token budget
    a, r, m = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."
    out = [
        f"{m}enable_gradient_checkpointing={sw['gradient_checkpointing']}",
        f"{m}use_remove_padding={sw['remove_padding']}",
        f"{a}use_dynamic_bsz={sw['dynamic_bsz']}",
        f"{a}ppo_max_token_len_per_gpu={max(1, sw['ppo_max_token_len_per_gpu'] // factor)}",
        f"{r}log_prob_max_token_len_per_gpu={max(1, sw['log_prob_max_token_len_per_gpu'] // factor)}",
        f"{m}logprob_chunk_size={max(1, sw['logprob_chunk_size'] // factor)}",
        "actor_rollout_ref.ref.use_ref=True",
        f"actor_rollout_ref.ref.fsdp_config.param_offload={sw['ref_param_offload']}",
        f"{a}fsdp_config.param_dtype={sw['param_dtype']}",
    ]
    roll = rollout_keys(recipe, factor, prompt + (48 if small else 512))
    out += [f"{r}{k}={v}" for k, v in roll.items()]
    return out, dict(sw, token_factor=factor, script=script, rollout_keys=roll)


def rollout_keys(recipe, factor: int, max_len: int) -> dict:
    """The recipe's rollout keys, carried (REVIEW H8): its memory share, eager/graphs, sleep level, cache
    release and prefix caching as written; its token budgets scaled by the run's one factor (never below one
    full sequence of this run, which vLLM needs without chunked prefill; rows at most the budget, as vLLM asks).
    TP stays 1 here: this smoke is one process on one device (``main`` prints the recipe's TP)."""
    r = "actor_rollout_ref.rollout."
    batched = max(max_len, int(recipe.get(r + "max_num_batched_tokens")) // factor)
    return {
        "gpu_memory_utilization": float(recipe.get(r + "gpu_memory_utilization")),
        "enforce_eager": bool(recipe.get(r + "enforce_eager")),
        "free_cache_engine": bool(recipe.get(r + "free_cache_engine")),
        "sleep_level": int(recipe.get(r + "sleep_level")),
        "enable_prefix_caching": bool(recipe.get(r + "enable_prefix_caching")),
        "max_num_batched_tokens": batched,
        "max_num_seqs": min(int(recipe.get(r + "max_num_seqs")), batched),
    }


def compose(overrides_list: list):
    from luffy_pool.config.check import check_config
    from luffy_pool.config.compose import compose_config

    config = compose_config(overrides_list)
    check_config(config)
    return config


class InProcessGroup:
    """The trainer's worker group for one rank in this process (a 1-rank DP_COMPUTE_PROTO is the identity)."""

    world_size = 1

    def __init__(self, worker) -> None:
        self.worker = worker

    def __getattr__(self, name):
        from verl.single_controller.base.decorator import Dispatch, get_registered_method

        attr = getattr(self.worker, name)
        spec = get_registered_method(getattr(type(self.worker), name, None))
        if spec is None or spec.dispatch_mode not in (Dispatch.ONE_TO_ALL, Dispatch.ALL_TO_ALL):
            return attr

        def one_answer_per_rank(*args, **kwargs):  # what a Ray group of one rank returns
            return [attr(*args, **kwargs)]

        return one_answer_per_rank


def full_actor_params(worker) -> dict:
    """HF-named full parameters of the actor (gathered FSDP2 shards), on CPU."""
    from verl.utils.fsdp_utils import iter_full_params

    return {k: v.detach().float().cpu() for k, v in iter_full_params(worker.actor_module, None)}


def engine_matches_actor(worker, rollout: str, sync_dtype) -> tuple[bool, str]:
    """After a sync: the engine holds the actor's weights as pushed (rounded to the sync dtype, then to the
    engine's): every tensor for HF; for vLLM the ones it keeps unfused and unpacked (embeddings, norms)."""
    import torch

    actor = {k: v.to(sync_dtype) for k, v in full_actor_params(worker).items()}
    if rollout == "hf":
        engine = {k: v.detach().cpu() for k, v in worker.rollout.model.state_dict().items()}
        names = [k for k in actor if k in engine]
        bad = [
            k
            for k in names
            if not torch.allclose(engine[k].double(), actor[k].to(engine[k].dtype).double(), atol=1e-6, rtol=1e-5)
        ]
        return (not bad and len(names) == len(actor)), f"{len(names)} tensors compared, mismatched: {bad[:3]}"
    names = [k for k in actor if k.endswith("norm.weight") or k.endswith("embed_tokens.weight")]
    sums = worker.rollout.llm.collective_rpc("weight_sums", args=(names,))[0]
    ref = {k: float(actor[k].double().sum()) for k in names}
    bad = [k for k in names if k not in sums or abs(sums[k] - ref[k]) > 1e-4 * (1 + abs(ref[k]))]
    return (not bad and bool(names)), f"{len(names)} tensors compared, mismatched: {bad[:3]}"


def run_engine(rollout: str, args, model_dir: str, task_dir: str, out_dir: str) -> dict:
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from luffy_pool.run.launcher import build_dataloader
    from luffy_pool.workers.mix_fsdp_worker import MIXActorRolloutRefWorker
    from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer
    from verl.workers.reward_manager import RewardManager

    extra, switches = recipe_overrides(args.recipe, args.small) if args.recipe else ([], None)
    config = compose(overrides(model_dir, task_dir, out_dir, args.device, args.small, rollout, args.steps) + extra)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    from luffy_pool.config.sections import ConfigSections

    sections = ConfigSections.from_config(config)
    loader, _, _, collate = build_dataloader(sections, tokenizer)
    cuda = args.device == "cuda"
    plan_gb = None
    if cuda:  # the memory plan of this config, printed as a run prints it; per phase next to the peak
        from luffy_pool.memory_plan import check_run

        plan = check_run(sections, "cuda")
        plan_gb = {p.name: round(p.total / 2**30, 2) for p in plan.phases} if plan is not None else None
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    from luffy_pool.run.launcher import policy_loss_knobs

    role = "actor_rollout_ref" if sections.workers.ref.use_ref else "actor_rollout"
    # the worker's arguments as the launcher builds them (launcher.build_worker_group)
    worker = MIXActorRolloutRefWorker(
        sections.workers,
        role=role,
        device=args.device,
        total_training_steps=args.steps,
        policy_loss_knobs=policy_loss_knobs(config, sections),
    )
    worker.init_model()
    init_s = time.perf_counter() - t0
    pushed_dtypes: set = set()
    push = worker.rollout.update_weights

    def recording_push(named):
        named = list(named)
        pushed_dtypes.update(str(t.dtype) for _, t in named)
        return push(named)

    worker.rollout.update_weights = recording_push
    reward_fn = RewardManager.from_config(config.reward, config.data.reward_impl_version, tokenizer)
    trainer = MIXRayPPOTrainer(
        config, tokenizer, InProcessGroup(worker), reward_fn, reward_fn, loader, collate_fn=collate, sections=sections
    )
    from exp_scripts.gpu_smoke_checks import StepWatch

    watch = StepWatch(trainer, worker._param_dtype(config.actor_rollout_ref.actor.fsdp_config), actor=worker.actor)
    checks, steps = {}, []
    try:
        before = worker.actor_weight_fingerprint()
        batches = iter(loader)
        for step in range(1, args.steps + 1):
            trainer.global_steps = step
            timing: dict = {}
            t_step = time.perf_counter()
            metrics = trainer.train_step(next(batches), timing).metrics
            step_s = time.perf_counter() - t_step
            gen_tokens = float(metrics.get("rollout/engine_tokens", 0))
            steps.append(
                {
                    "step": step,
                    "step_s": round(step_s, 3),
                    "gen_s": round(timing.get("gen", 0.0), 3),
                    "update_s": round(timing.get("update_actor", 0.0), 3),
                    "engine_tokens_per_s": round(gen_tokens / max(timing.get("gen", 1e-9), 1e-9), 1),
                    "weight_sync_s": round(float(metrics.get("timing_s/weight_sync", float("nan"))), 3),
                    "pg_loss": float(metrics.get("actor/pg_loss", float("nan"))),
                    "kl_to_ref": float(metrics.get("critic/kl", float("nan"))),
                }
            )  # the reference ran
            print(f"[gpu_smoke] {rollout} step {step}: {json.dumps(steps[-1])}", flush=True)
        after = worker.actor_weight_fingerprint()
        param_dtype = worker._param_dtype(config.actor_rollout_ref.actor.fsdp_config)
        worker.update_weights()  # one more push of the trained weights, then compare
        with worker.sharding_manager:
            same, detail = engine_matches_actor(worker, rollout, param_dtype)
        checks = {
            "weights_changed": abs(after - before) > 1e-12 * max(1.0, abs(before)),
            "engine_equals_actor": same,
            "sync_in_param_dtype": pushed_dtypes == {str(param_dtype)},
            "gradient_checkpointing": bool(worker.actor_module.is_gradient_checkpointing),
            "backend": dist.get_backend() == ("nccl" if cuda else "gloo"),
            "device": next(worker.actor_module.parameters()).device.type == args.device,
        }
        if switches is not None:
            checks.update(recipe_checks(worker, switches, args.device))
            checks.update(engine_rollout_checks(worker, switches["rollout_keys"], args.device))
        numeric = watch.checks()
        checks.update({k: ok for k, (ok, _) in numeric.items()})
        result = {
            "engine": rollout,
            "recipe": switches,
            "init_s": round(init_s, 2),
            "steps": steps,
            "checks": checks,
            "details": {k: d for k, (_, d) in numeric.items()},
            "numeric": watch.summary(),
            "engine_check": detail,
            "sync_dtypes": sorted(pushed_dtypes),
            "param_dtype": str(param_dtype),
            "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else round(_peak_rss_gb(), 2),
            "memory_plan_gb": plan_gb,
        }
    finally:
        reward_fn.close()
        if hasattr(worker.rollout, "shutdown"):
            worker.rollout.shutdown()
        del trainer, worker
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return result


def engine_rollout_checks(worker, keys: dict, device: str) -> dict:
    """The built vLLM engine runs the recipe's rollout keys (read back from vLLM's own config). On CPU the engine
    is always eager and sizes its KV cache in bytes, so only the scheduler's budgets are compared there."""
    llm = getattr(worker.rollout, "llm", None)
    if llm is None:  # the HF engine has none of these keys
        return {}
    vc = llm.llm_engine.vllm_config
    seen = {
        "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": vc.scheduler_config.max_num_seqs,
        "sleep_level": worker.rollout.config.sleep_level,
        "enable_prefix_caching": bool(vc.cache_config.enable_prefix_caching),
    }
    if device == "cuda":
        seen.update(
            gpu_memory_utilization=vc.cache_config.gpu_memory_utilization,
            enforce_eager=bool(vc.model_config.enforce_eager),
        )
    return {"recipe_rollout_keys": all(seen[k] == keys[k] for k in seen)}


def recipe_checks(worker, switches: dict, device: str) -> dict:
    """The worker really runs the recipe's switches (read back from the built worker, not the config)."""
    import torch

    actor, s = worker.actor, worker.sections
    ref_params = list(worker.ref_module.parameters())
    offloaded = all(p.device.type == "cpu" for p in ref_params)
    want_dtype = torch.bfloat16 if (switches["param_dtype"] == "auto" and device == "cuda") else None
    return {
        # packing needs flash-attn's varlen kernels: on cuda the recipe's switch must act; on CPU (sdpa) the
        # actor keeps padded rows by design (dp_actor._has_varlen_attention)
        "recipe_remove_padding": bool(actor.use_remove_padding)
        == (switches["remove_padding"] and (device == "cuda" or actor._has_varlen_attention(worker.actor_module))),
        "recipe_dynamic_bsz": bool(s.actor.use_dynamic_bsz) == switches["dynamic_bsz"],
        # FSDP2's CPU offload keeps the reference's shards in host memory between passes (on a CPU run: trivially)
        "recipe_ref_offload": offloaded if switches["ref_param_offload"] else True,
        "recipe_param_dtype": want_dtype is None or worker._param_dtype(s.actor.fsdp_config) == want_dtype,
    }


def _peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


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
            f"import json, sys; sys.path.insert(0, {here!r}); import gpu_smoke; print('GRAPHS ' + "
            f"json.dumps(gpu_smoke._decode_rate({model_dir!r}, {eager}, {prompts}, {max_tokens})))"
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


def engines(choice: str) -> list:
    if choice != "auto":
        return [choice]
    try:
        import vllm  # noqa: F401
    except ImportError:
        return ["hf"]
    return ["hf", "vllm"]


def sp_tp_ranks(sp: int, tp: int, gpus: int) -> int:
    """GPUs for the recipe's SP x TP rehearsal (two DP groups when the machine has them, as the CPU rehearsal
    runs), 0 when there is no parallel layout to check or too few GPUs to hold it."""
    from math import lcm

    from luffy_pool.run.recipe import rehearsal_world

    need = lcm(sp, tp)
    if need == 1 or gpus < need:
        return 0
    return min(rehearsal_world(sp, tp, 4), gpus // need * need)


def run_sp_tp(script: str, sp: int, tp: int, gpus: int, work: str) -> dict:
    """The recipe rehearsed on ``sp_tp_ranks`` GPUs: {"ranks", "rc", "steps"}; {"skipped": why} without them."""
    import re
    import subprocess

    ranks = sp_tp_ranks(sp, tp, gpus)
    if not ranks:
        from math import lcm

        why = "no SP/TP in the recipe" if sp * tp == 1 else f"SP {sp} x TP {tp} needs {lcm(sp, tp)} GPUs, {gpus} seen"
        print(f"[gpu_smoke] SP/TP rehearsal skipped: {why}", flush=True)
        return {"skipped": why}
    cmd = [
        "bash",
        os.path.join(ROOT, "exp_scripts", "rehearse.sh"),
        script,
        "--device",
        "cuda",
        "--ranks",
        str(ranks),
        "--work",
        work,
    ]
    print(f"[gpu_smoke] SP {sp} x TP {tp} on {ranks} GPUs: {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    steps = sorted({int(m) for m in re.findall(r"^step:(\d+) - ", proc.stdout, re.M)})
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], flush=True)
    return {"ranks": ranks, "rc": proc.returncode, "steps": steps}


def split_run(args, engine: str, model_dir: str, task_dir: str, out_dir: str) -> dict:
    """The split-engine run (``gpu_smoke_checks.run_split``) with engine ``engine``, or {"skipped": why}."""
    import torch

    from exp_scripts.gpu_smoke_checks import SPLIT_OVERRIDES, run_split, split_skip_reason

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    why = split_skip_reason(args.split, args.device, gpus, args.recipe)
    if why is not None:
        print(f"[gpu_smoke] split engines skipped: {why}", flush=True)
        return {"skipped": why}
    base = overrides(model_dir, task_dir, out_dir, args.device, args.small, engine, args.steps)
    config = compose(base + SPLIT_OVERRIDES)
    result = run_split(config, "bfloat16" if args.device == "cuda" else "float32")
    return dict(result, engine=engine)


def print_verdicts(results: list, graphs, sp_tp, split: dict) -> None:
    """One ``PASS``/``FAIL`` line per check, then one summary line."""
    lines = []
    for r in results:
        lines += [(f"{r['engine']}/{k}", v, r.get("details", {}).get(k, "")) for k, v in r["checks"].items()]
    if graphs is not None:
        lines.append(("vllm/graphs_sleep_reload", graphs["ok"], graphs.get("skipped") or graphs.get("error", "")))
    if sp_tp is not None and "skipped" not in sp_tp:
        lines.append(("sp_tp_rehearsal", sp_tp["rc"] == 0 and sp_tp["steps"] == [1, 2], json.dumps(sp_tp)))
    if "skipped" not in split:
        lines += [(f"split/{split['engine']}/{k}", v, split["details"].get(k, "")) for k, v in split["checks"].items()]
    for name, ok, detail in lines:
        print(f"[gpu_smoke] {'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
    failed = [name for name, ok, _ in lines if not ok]
    skipped = ["split"] if "skipped" in split else []
    skipped += ["sp_tp_rehearsal"] if sp_tp is not None and "skipped" in sp_tp else []
    print(
        f"[gpu_smoke] SUMMARY: {len(lines) - len(failed)}/{len(lines)} checks passed"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + (f"; skipped: {', '.join(skipped)}" if skipped else ""),
        flush=True,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    single_rank_env()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("[gpu_smoke] --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    t_all = time.perf_counter()
    work = args.out or tempfile.mkdtemp(prefix="gpu_smoke_")
    model_dir = build_model(os.path.join(work, "model"), args.small, args.device)
    from luffy_pool.tiny import write_task_parquets

    task_dir = os.path.join(work, "task")
    write_task_parquets(task_dir, n_train=64, n_test=8, level=2, seed=0)
    print(
        f"[gpu_smoke] model ({'small' if args.small else 'Qwen2.5-1.5B shapes'}) built in "
        f"{time.perf_counter() - t_all:.1f} s at {model_dir}",
        flush=True,
    )
    chosen = engines(args.rollout)
    if args.recipe:
        from luffy_pool.run.recipe import read_recipe

        recipe = read_recipe(args.recipe, dict(os.environ, MODEL_PATH="recipe/model"))
        chosen = [recipe.get("actor_rollout_ref.rollout.name")] if args.rollout == "auto" else chosen
        print(
            f"[gpu_smoke] recipe {args.recipe}: {json.dumps(recipe.switches())}; one device runs SP 1 / TP 1 "
            f"(the recipe's SP {recipe.sp} x TP {recipe.tp}: bash exp_scripts/rehearse.sh {args.recipe})",
            flush=True,
        )
    results = [run_engine(e, args, model_dir, task_dir, os.path.join(work, e)) for e in chosen]
    graphs = graphs_vs_eager(model_dir, args.device) if "vllm" in chosen else None
    sp_tp = None
    if args.recipe and args.device == "cuda":
        sp_tp = run_sp_tp(args.recipe, recipe.sp, recipe.tp, torch.cuda.device_count(), os.path.join(work, "sp_tp"))
    split = split_run(args, chosen[-1], model_dir, task_dir, os.path.join(work, "split"))
    ok = (
        all(all(r["checks"].values()) for r in results)
        and (graphs is None or graphs["ok"])
        and (sp_tp is None or "skipped" in sp_tp or (sp_tp["rc"] == 0 and sp_tp["steps"] == [1, 2]))
        and ("skipped" in split or all(split["checks"].values()))
    )
    summary = {
        "ok": ok,
        "device": args.device,
        "small": args.small,
        "recipe": args.recipe,
        "total_s": round(time.perf_counter() - t_all, 1),
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "results": results,
        "graphs": graphs,
        "sp_tp": sp_tp,
        "split": split,
    }
    print_verdicts(results, graphs, sp_tp, split)
    for r in results:
        failed = [k for k, v in r["checks"].items() if not v]
        if r.get("memory_plan_gb"):
            print(
                f"[gpu_smoke] {r['engine']}: memory plan per phase (GiB) {r['memory_plan_gb']}; "
                f"torch.cuda.max_memory_allocated {r['peak_memory_gb']} GiB",
                flush=True,
            )
        print(
            f"[gpu_smoke] {r['engine']}: peak memory {r['peak_memory_gb']} GB, "
            f"engine tokens/s {[s['engine_tokens_per_s'] for s in r['steps']]}, "
            f"weight sync s {[s['weight_sync_s'] for s in r['steps']]}, "
            f"{'all checks passed' if not failed else 'FAILED: ' + ', '.join(failed)} ({r['engine_check']})",
            flush=True,
        )
    print("GPU_SMOKE " + json.dumps(summary), flush=True)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
