"""One GPU smoke run per rollout engine (``exp_scripts/gpu_smoke.py``): the real worker and trainer step in this
process, the weight checks after the last push, and (``--recipe``) the checks that the built worker and engine run
the recipe's switches."""

from __future__ import annotations

import gc
import json
import time

from exp_scripts.gpu_smoke_setup import compose, overrides, recipe_overrides


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
