"""Build everything a LUFFY run needs from the resolved config, then train.

``run_ppo(config)`` is what ``main_mix_ppo`` calls after validating the Hydra config: it starts (or
joins) Ray, builds the tokenizer, datasets and sampler, the FSDP worker group on a resource pool of
``nnodes x n_gpus_per_node`` ranks (GPUs on a cluster, CPU processes with gloo here), the reward
managers, the tracker and the checkpointer, and runs ``MIXRayPPOTrainer.fit``. The typed sections are built
once here (``ConfigSections.from_config``) and handed to every helper; the composed config is never changed.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from typing import Optional

import torch
from omegaconf import DictConfig, OmegaConf

from luffy_pool.config.sections import ConfigSections
from verl.utils.cpu_bind import ENV_VAR as CPU_BIND_ENV
from verl.utils.import_utils import import_external_libs

logger = logging.getLogger(__name__)

# Env every worker process gets (docs/CPU_STACK.md §5.3: thread collapse on 2 cores; §4: Ray token auth).
WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_AUTH_MODE": "disabled",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "NCCL_DEBUG": "WARN",
    # A worker's stderr is never a terminal: its "Loading weights" bars only clutter the driver's console.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    # vLLM's ~25 INFO lines per engine start-up (args, layout, KV size); its warnings stay.
    "VLLM_LOGGING_LEVEL": "WARNING",
}


def resolve_driver_device(sections: ConfigSections) -> str:
    """The workers' device kind, from the joined Ray cluster's GPUs (not from this process's CUDA:
    each worker then picks its own GPU index, ``verl.utils.device``). Call after ``init_ray``."""
    import ray

    from verl.utils.device import cluster_device

    t = sections.trainer
    return cluster_device(t.device, ray.cluster_resources().get("GPU", 0.0), int(t.nnodes) * int(t.n_gpus_per_node))


def bundle_uses_gpu(sections: ConfigSections, device: str) -> bool:
    """``trainer.bundle_resources``: whether each rank's placement bundle reserves one Ray GPU."""
    mode = sections.trainer.bundle_resources
    if mode == "cpu" and device == "cuda":
        raise ValueError("trainer.bundle_resources=cpu with trainer.device=cuda: a CUDA rank needs a GPU bundle")
    return device == "cuda" if mode == "auto" else mode == "gpu"


def engine_layout(sections: ConfigSections) -> str:
    """One line naming the FSDP world and the rollout engines' DP x TP layout."""
    t, r = sections.trainer, sections.workers.rollout
    world = int(t.nnodes) * int(t.n_gpus_per_node)
    tp = int(r.tensor_model_parallel_size)
    if sections.workers.hybrid_engine:
        return (
            f"FSDP ranks {world} ({t.nnodes} node(s) x {t.n_gpus_per_node}); rollout engine layout: "
            f"{world // max(tp, 1)} DP group(s) x TP {tp}"
        )
    engines = sections.workers.rollout_world_size
    return (
        f"FSDP ranks {world} ({t.nnodes} node(s) x {t.n_gpus_per_node}); split rollout engines on their own "
        f"{engines} rank(s) ({r.nnodes} node(s) x {r.n_gpus_per_node}): {engines // max(tp, 1)} DP group(s) x TP "
        f"{tp}; rollout_pipeline {t.rollout_pipeline}"
    )


def resolve_cpu_bind(sections: ConfigSections, device: str) -> str:
    """``trainer.cpu_bind`` for the workers: ``auto`` binds CPU ranks to their own cores, except with
    vLLM rollout, whose CPU backend binds its threads itself (VLLM_CPU_OMP_THREADS_BIND)."""
    mode = sections.trainer.cpu_bind
    rollout = sections.workers.rollout.name
    # Split engines: both groups number their local ranks from 0, so auto would pin two processes to one core.
    split = not sections.workers.hybrid_engine
    return "auto" if mode == "auto" and device == "cpu" and rollout != "vllm" and not split else "none"


ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def worker_alloc_env(device: str, environ=None) -> dict:
    """GPU workers run torch's allocator with ``expandable_segments:True`` (AdamW's lazily allocated
    state otherwise fragments the segments the KV cache wakes into; vLLM's advice, and vLLM 0.32's sleep-mode pool
    turns the flag off around itself), unless the user set ``PYTORCH_CUDA_ALLOC_CONF``: theirs is passed on."""
    if device != "cuda":
        return {}
    env = os.environ if environ is None else environ
    return {ALLOC_CONF_ENV: env.get(ALLOC_CONF_ENV) or "expandable_segments:True"}


def init_ray(sections: ConfigSections, world_size: int, device: str) -> None:
    """Join ``ray_init.address`` / ``RAY_ADDRESS`` when given, else start a private local instance."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env = {k: os.environ.get(k, v) for k, v in WORKER_ENV.items()}
    # CPU_BIND_ENV goes with the worker group (build_worker_group): the device is known only after joining.
    ray_cfg = sections.ray_init
    address = ray_cfg.address or os.environ.get("RAY_ADDRESS")
    kwargs = {"runtime_env": {"env_vars": env}, "include_dashboard": False}
    inline_bytes = ray_cfg.max_direct_call_object_size
    if address:
        if inline_bytes is not None:
            logger.warning(
                "ray_init.max_direct_call_object_size applies to a Ray instance this run starts; joining "
                "%s keeps that cluster's setting",
                address,
            )
        ray.init(address=address, **kwargs)
        return
    num_cpus = ray_cfg.num_cpus
    if num_cpus is None and device != "cuda":
        num_cpus = max(os.cpu_count() or 1, world_size)  # each CPU rank's bundle asks for one CPU
    # The instance this run starts would begin with num_cpus idle task workers (Ray's first-driver prestart): the run
    # starts actors, each in a process of its own, so those idle workers would only cost a Python start-up each.
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    if inline_bytes is not None:  # a positive int (config_check)
        kwargs["_system_config"] = {"max_direct_call_object_size": int(inline_bytes)}
    ray.init(address="local", num_cpus=num_cpus, **kwargs)


def build_dataloader(sections: ConfigSections, tokenizer):
    from torch.utils.data import DataLoader

    from luffy_pool.rollout.rl_dataset_with_target import RLHFDatasetWithTarget, collate_fn
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.dataset.sampler import build_sampler

    d = sections.data
    train = RLHFDatasetWithTarget(
        list(d.train_files) if not isinstance(d.train_files, str) else d.train_files,
        tokenizer,
        prompt_key=d.prompt_key,
        target_key=d.target_key,
        max_prompt_length=d.max_prompt_length,
        max_target_length=sections.workers.rollout.max_prefix_len,
        sample_target_ratio=d.sample_target_ratio,
        filter_overlong_prompts=d.filter_overlong_prompts,
        seed=int(d.seed),
        truncate_off_policy=d.truncate_off_policy,
        sample_target_mode=d.sample_target_mode,
    )
    # Keep num_workers=0 with the resumable sampler: worker processes would prefetch past the saved cursor.
    sampler = build_sampler(
        len(train), shuffle=d.shuffle, seed=int(d.seed), batch_size=d.train_batch_size, drop_last=True
    )
    train.use_epoch_of(sampler)  # sample_target_ratio redraws per epoch, the same after a resume
    loader = DataLoader(
        train,
        batch_size=d.train_batch_size,
        sampler=sampler,
        drop_last=True,
        collate_fn=collate_fn,
        num_workers=int(d.dataloader_num_workers),
    )
    if len(loader) == 0:
        raise ValueError(
            f"data.train_files has {len(train)} usable rows, fewer than data.train_batch_size={d.train_batch_size}"
        )
    val = None
    if d.val_files:
        val = RLHFDataset(
            list(d.val_files) if not isinstance(d.val_files, str) else d.val_files,
            tokenizer,
            prompt_key=d.prompt_key,
            max_prompt_length=d.max_prompt_length,
            filter_overlong_prompts=d.filter_overlong_prompts,
        )
        if d.val_max_rows:
            val = torch.utils.data.Subset(val, range(min(int(d.val_max_rows), len(val))))
    return loader, sampler, val, collate_fn


def build_off_policy_pool(sections: ConfigSections, tokenizer, train_dataset):
    """The pool of extra off-policy traces (``data.off_policy_files``); None when only targets are used."""
    from luffy_pool.rollout.off_policy_pool import OffPolicyPool

    d = sections.data
    files = list(d.off_policy_files or [])
    if not files:
        return None
    return OffPolicyPool.from_sections(
        sections,
        files,
        known_prompt_ids=train_dataset.prompt_ids,
        tokenizer=tokenizer,
        strip_think_prefix=train_dataset.generation_prompt_opens_think,
    )


def check_behaviour_probs_source(sections: ConfigSections, train_dataset, off_policy_pool) -> None:
    """``use_off_policy_probs`` needs behaviour probabilities from the training parquet's column or from
    ``data.off_policy_files``' log-probs; with neither, the loss would silently fall back to f(p)."""
    if not sections.actor.loss.use_off_policy_probs:
        return
    if getattr(train_dataset, "has_target_probs", False):
        return
    if off_policy_pool is not None and off_policy_pool.has_extra_logprobs:
        return
    if sections.data.self_replay.enable:  # replayed traces carry their own log-probs
        return
    key = getattr(train_dataset, "target_probs_key", "target_ds_qwen_7b_probs")
    raise ValueError(
        f"actor_rollout_ref.actor.use_off_policy_probs=True, but data.train_files have no {key!r} column "
        "and data.off_policy_files give no 'logprobs'; add one of them or set use_off_policy_probs=False"
    )


def policy_loss_knobs(config, sections: ConfigSections) -> Optional[dict]:
    """The selected policy loss's own knobs, for the workers: the values of the dataclass a registered loss declares
    (``register_policy_loss(name, config=...)``), built once here from the actor group, where a knob may be a ``+``
    key the sections do not declare; None for a loss that reads the actor's loss section."""
    from verl.trainer.ppo.core_algos import get_policy_loss_config, policy_loss_config, resolve_policy_loss

    name = resolve_policy_loss(sections.actor.loss)
    if get_policy_loss_config(name) is None:
        return None
    return dataclasses.asdict(policy_loss_config(name, config.actor_rollout_ref.actor, sections.actor.loss))


def build_worker_group(config, sections: ConfigSections, device: str, total_training_steps: int):
    """The FSDP worker group on its resource pool; each worker gets the typed ``actor_rollout_ref`` sections built
    once by ``build_trainer``, the run's step count (the lr schedule's length) and the loss's own knobs. With
    ``hybrid_engine=False`` this group trains only (role actor / actor_ref); ``build_rollout_group`` adds the engines."""
    t = sections.trainer
    use_ref = sections.workers.ref.use_ref
    if sections.workers.hybrid_engine:
        role = "actor_rollout_ref" if use_ref else "actor_rollout"
    else:
        role = "actor_ref" if use_ref else "actor"
    print(f"[luffy_pool] {engine_layout(sections)}; device {device}", flush=True)  # the run's shape, on the console
    return _start_group(
        sections,
        device,
        role,
        int(t.nnodes),
        int(t.n_gpus_per_node),
        "luffy_pool",
        "actor_rollout",
        total_training_steps=int(total_training_steps),
        policy_loss_knobs=policy_loss_knobs(config, sections),
    )


def build_rollout_group(sections: ConfigSections, device: str):
    """``hybrid_engine=False``: the rollout engines' own worker group (role rollout) on
    ``rollout.nnodes x rollout.n_gpus_per_node`` ranks."""
    r = sections.workers.rollout
    return _start_group(
        sections, device, "rollout", int(r.nnodes), int(r.n_gpus_per_node), "luffy_pool_rollout", "rollout"
    )


def connect_weight_group(actor_wg, rollout_wg) -> None:
    """Join the actor's rank 0 and every rollout rank into the weight push's broadcast group (all at once: the
    rendezvous blocks until each member arrived)."""
    from verl.utils.ray_utils import get_ranked

    host, port = actor_wg.weight_group_address()
    refs = actor_wg.join_weight_group(host, port, rollout_wg.world_size)
    refs2 = rollout_wg.join_weight_group(host, port, rollout_wg.world_size)
    get_ranked(
        list(refs) + list(refs2),
        list(range(len(refs) + len(refs2))),
        group_name="weight_group",
        method_name="join_weight_group",
    )


def _start_group(
    sections: ConfigSections,
    device: str,
    role: str,
    nnodes: int,
    per_node: int,
    pool_name: str,
    group_name: str,
    **init_kwargs,
):
    from luffy_pool.workers.mix_fsdp_worker import MIXActorRolloutRefWorker
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    import ray

    pool = RayResourcePool(
        process_on_nodes=[per_node] * nnodes,
        use_gpu=bundle_uses_gpu(sections, device),
        max_colocate_count=1,
        name_prefix=pool_name,
    )
    cls = RayClassWithInitArgs(
        ray.remote(MIXActorRolloutRefWorker), sections=sections.workers, role=role, device=device, **init_kwargs
    )
    cls.update_options(
        {"runtime_env": {"env_vars": {CPU_BIND_ENV: resolve_cpu_bind(sections, device), **worker_alloc_env(device)}}}
    )
    wg = RayWorkerGroup(pool, cls, name_prefix=group_name)
    try:
        wg.init_model()
    except BaseException:
        release_worker_group(wg, pool)
        raise
    return wg, pool


def release_worker_group(wg, pool) -> None:
    """Kill the workers and free their placement groups, so a later run in the same Ray session fits."""
    if wg is not None:
        wg.shutdown()
        from verl.workers.rollout.vllm_rollout.vllm_rollout import remove_run_cpu_shm

        port = getattr(wg, "master_port", None)
        if port is not None:  # vLLM-CPU TP segments on this node; killed workers cannot unlink them
            remove_run_cpu_shm(port)
    if pool is not None:
        pool.release()


def build_trainer(config: DictConfig, tracker=None):
    """Everything ``fit`` needs; returns ``(trainer, close)`` where ``close()`` releases pools/trackers (each once;
    ``close(keep_tracker=True)`` leaves the tracker open). ``tracker``: one to continue (a restart), not a new one."""
    from verl.utils.tokenizer import hf_tokenizer

    from luffy_pool.config.method_group import apply_method
    from luffy_pool.trainer.mix_trainer import MIXRayPPOTrainer
    from luffy_pool.run.preflight import InputError, PreflightError, check_cluster_capacity, preflight
    from verl.utils.context_length import check_model_context
    from verl.utils.logging_setup import setup_logging
    from verl.utils.tracking import Tracking
    from verl.workers.reward_manager import RewardManager

    setup_logging()
    try:  # algorithm.method sets the keys it needs (luffy_pool/methods/); a contradicting one is refused
        apply_method(config)
    except ValueError as exc:
        raise PreflightError([str(exc)]) from None
    sections = ConfigSections.from_config(config)  # the one typed view of the run, passed down from here
    preflight(config, sections)  # folders, model and data files: one line per problem before anything loads
    try:
        # before Ray starts: prompt + response must fit the model's positions
        check_model_context(sections.workers.model, sections.data.max_prompt_length, sections.data.max_response_length)
    except ValueError as exc:
        raise PreflightError([str(exc)]) from None
    world_size = (
        int(sections.trainer.nnodes) * int(sections.trainer.n_gpus_per_node) + sections.workers.rollout_world_size
    )
    import_external_libs(sections.workers.model.external_lib)  # a custom tokenizer may need it too
    tokenizer = hf_tokenizer(sections.data.tokenizer or sections.workers.model.path)
    try:  # every data file is checked as it loads: a bad row is one line naming file, row and column (rc 2)
        loader, sampler, val_dataset, collate = build_dataloader(sections, tokenizer)
        off_policy_pool = build_off_policy_pool(sections, tokenizer, loader.dataset)
        check_behaviour_probs_source(sections, loader.dataset, off_policy_pool)
    except (ValueError, FileNotFoundError) as exc:
        raise InputError([" ".join(str(exc).split())]) from None
    total = sections.trainer.total_steps(len(loader))  # the workers' lr schedule and the trainer's loop
    started_locally = not (sections.ray_init.address or os.environ.get("RAY_ADDRESS"))
    init_ray(sections, world_size, sections.trainer.device)
    if int(sections.trainer.nnodes) > 1:
        from luffy_pool.run.node_check import check_shared_folders

        check_shared_folders(config)  # each node must see the driver's checkpoint and model folder
    device = resolve_driver_device(sections)
    check_cluster_capacity(sections, bundle_uses_gpu(sections, device), started_locally)
    from luffy_pool.memory_plan import check_run as check_memory_plan

    # GPU runs: the per-rank memory plan from the device's real memory, printed once before any worker loads
    # the model; trainer.memory_plan=error stops here naming the phase and the keys to change.
    check_memory_plan(sections, device)
    reward_fn = RewardManager.from_config(config.reward, sections.data.reward_impl_version, tokenizer, device=device)
    wg = pool = rollout_wg = rollout_pool = None
    open_parts = {"reward", "workers", "tracker"}
    own_tracker = tracker is None  # a restart's build that fails leaves the run's tracker to the run

    def close(keep_tracker: bool = False):
        if "reward" in open_parts:
            open_parts.discard("reward")
            reward_fn.close()
        if "tracker" in open_parts and not keep_tracker:
            open_parts.discard("tracker")
            if tracker is not None:
                tracker.finish()
        if "workers" in open_parts:
            open_parts.discard("workers")
            release_worker_group(rollout_wg, rollout_pool)
            release_worker_group(wg, pool)

    try:
        wg, pool = build_worker_group(config, sections, device, total)
        if not sections.workers.hybrid_engine:  # the engines on their own ranks, fed over the weight group
            rollout_wg, rollout_pool = build_rollout_group(sections, device)
            connect_weight_group(wg, rollout_wg)
        if tracker is None:
            tracker = Tracking(
                config.trainer.project_name,
                config.trainer.experiment_name,
                config.trainer.logger,
                config=OmegaConf.to_container(config, resolve=True),
                log_dir=config.trainer.default_local_dir,
            )
        from luffy_pool.run.checkpointing import TrainerCheckpointer

        checkpointer = TrainerCheckpointer(sections, sampler)
        # The off-policy pool (`off_policy_pool`, built with the data above) is not `pool`, the Ray resource
        # pool that close() releases (mixing the two up once leaked the placement groups).
        trainer = MIXRayPPOTrainer(
            config,
            tokenizer,
            wg,
            reward_fn,
            reward_fn,
            loader,
            val_dataset=val_dataset,
            collate_fn=collate,
            tracker=tracker,
            checkpointer=checkpointer,
            off_policy_pool=off_policy_pool,
            sections=sections,
            total_training_steps=total,
            rollout_wg=rollout_wg,
        )
    except BaseException:
        close(keep_tracker=not own_tracker)
        raise
    return trainer, close


def run_ppo(config: DictConfig) -> dict:
    """Train LUFFY (or a baseline expressed in the same config) and return the last step's metrics."""
    original = copy.deepcopy(config)  # a restart rebuilds the run as it was handed over
    trainer, close = build_trainer(config)
    try:
        recovery = recovery_for(original, trainer.sections)
    except BaseException:
        close()
        raise
    return fit_and_close(trainer, close, recovery)


def recovery_for(config: DictConfig, sections: ConfigSections):
    """``trainer.max_restarts > 0``: the ``Recovery`` that restarts a run whose worker or node died; else None.
    Call after ``build_trainer`` (Ray joined)."""
    if int(sections.trainer.max_restarts) <= 0:
        return None
    from luffy_pool.run.recovery import Recovery

    # Ray is up (build_trainer joined it): the bundle a restart waits for is the one the pool asked for.
    return Recovery(
        config, sections, rebuild=build_trainer, use_gpu=bundle_uses_gpu(sections, resolve_driver_device(sections))
    )


def fit_and_close(trainer, close, recovery=None) -> dict:
    """``trainer.fit()``, then release Ray/trackers; stopped by SIGTERM/SIGINT -> SystemExit(128 + signal).
    With a ``recovery`` (``trainer.max_restarts``) a lost worker or node rebuilds the run and fits again."""
    try:
        while True:
            try:
                metrics = trainer.fit()
                break
            except BaseException as exc:
                restarted = recovery.restart(trainer, close, exc) if recovery is not None else None
                if restarted is not None:
                    trainer, close = restarted
                    continue
                # The exception (a worker's error names worker, rank and method) propagates: exit code != 0.
                from luffy_pool.run.checkpointing import CheckpointUnusableError, ResumeRefusedError

                from verl.utils.signals import AbortedBySignal

                if isinstance(exc, (CheckpointUnusableError, ResumeRefusedError, AbortedBySignal)):
                    raise  # its message already names every checkpoint tried / the config key / the signal, exit code
                last = trainer.checkpointer.last_good_checkpoint() if trainer.checkpointer is not None else None
                refused = trainer.checkpointer.refused_summary() if trainer.checkpointer is not None else ""
                logger.error(
                    "training failed in step %d; last good checkpoint: %s%s%s",
                    trainer.global_steps,
                    last or "none",
                    " (trainer.resume_mode=auto continues from it)" if last else "",
                    refused,
                )
                raise
    finally:
        close()
    signum = getattr(getattr(trainer, "stop", None), "signum", None)
    if signum is not None:
        from verl.utils.signals import exit_code

        logger.warning(
            "stopped by signal %d after step %d (resources released); exit code %d",
            signum,
            trainer.global_steps,
            exit_code(signum),
        )
        raise SystemExit(exit_code(signum))
    return metrics
