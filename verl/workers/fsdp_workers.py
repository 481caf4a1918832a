"""FSDP2 worker that plays actor, rollout and reference policy in one process per device.

The driver talks to it through registered methods (``init_model`` to all ranks, everything else
``DP_COMPUTE_PROTO``: each rank gets its chunk of the batch). The actor is an HF causal LM sharded with
``fully_shard`` over all ranks of the group (gloo on CPU, NCCL on GPU), trained with AdamW and a
warmup scheduler; the rollout engine (vLLM or HF ``generate``) receives the current weights through
the sharding manager when the driver calls ``update_weights`` (before every generation). Checkpointing lives in ``verl.utils.checkpoint``.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from typing import Optional

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.batch_sizes import rank_batch_sizes
from verl.utils.device import configure_worker_device
from verl.utils.ulysses import gather_data_in_group, local_rows
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.checkpoint_mixin import CheckpointMixin
from verl.workers.config_sections import ShardingSection, WorkerSections
from verl.workers.split_weights import SplitWeightsMixin

logger = logging.getLogger(__name__)


_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: {sorted(_DTYPES)}")
    return _DTYPES[name]


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but no CUDA device is visible in this worker")
    return device


# The actor keys verl/utils/batch_sizes.py turns into rows per rank.
BATCH_SIZE_KEYS = ("ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu")
ROLLOUT_ROLES = ("rollout", "actor_rollout", "actor_rollout_ref")


class ActorRolloutRefWorker(SplitWeightsMixin, CheckpointMixin, Worker):
    """One rank of the hybrid engine. ``role`` is actor / rollout / ref / actor_rollout / actor_rollout_ref, or on
    split resources (``hybrid_engine=False``) actor / actor_ref for the training group and rollout for the engines'."""

    actor_cls = DataParallelPPOActor
    sections_cls = WorkerSections  # the typed view of actor_rollout_ref (a method's worker extends it with its keys)

    def __init__(
        self,
        sections: WorkerSections,
        role: str,
        device: str,
        total_training_steps: Optional[int] = None,
        policy_loss_knobs: Optional[dict] = None,
    ):
        """``sections``: the typed ``actor_rollout_ref`` group, built once by the launcher
        (``ConfigSections.from_config``; a worker on its own: ``WorkerSections.from_config`` of a composed config).
        ``total_training_steps``: the run's step count, the lr schedule's length (an actor role needs it).
        ``policy_loss_knobs``: the values of the selected loss's own knob dataclass, when it registered one."""
        super().__init__()
        from verl.utils.logging_setup import setup_logging

        setup_logging()  # third-party noise off in this worker's console output
        if not isinstance(sections, self.sections_cls):
            raise TypeError(
                f"{type(self).__name__} takes the typed actor_rollout_ref sections "
                f"({self.sections_cls.__name__}), got {type(sections).__name__}"
            )
        self.sections = sections
        self.total_training_steps = total_training_steps
        self.policy_loss_knobs = policy_loss_knobs
        self.role = role
        # Chosen here from what Ray made visible to this process (verl/utils/device.py), not on the driver.
        self.device_plan = configure_worker_device(device)
        self.device = self.device_plan.device
        self._is_actor = role in ("actor", "actor_ref", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ROLLOUT_ROLES
        self._is_ref = role in ("ref", "actor_ref", "actor_rollout_ref")
        # A split engine's rank (hybrid_engine=False): no actor module; weights arrive over the weight group.
        self._engine_only = self._is_rollout and not (self._is_actor or self._is_ref)
        if self.device == "cpu":
            from verl.utils.cpu_bind import ENV_VAR, bind_cpu_rank

            bind_cpu_rank(
                os.environ.get(ENV_VAR, "none"),
                int(os.environ.get("LOCAL_RANK", 0)),
                int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            )
        self._init_distributed()
        if self._engine_only:  # batch sizes count the training ranks, not the engines'
            return
        # Rows per rank (docs/METHOD.md §1.9), in their own fields: the config keys keep counting prompts. The
        # rollout's log-prob size serves the reference pass too (LUFFY's worker copies it there).
        s = self.sections
        batch_keys = {k: getattr(s.actor, k) for k in BATCH_SIZE_KEYS}
        self.batch_sizes = rank_batch_sizes(
            batch_keys,
            s.rollout.n,
            self.world_size,
            # dp = world / (sp x tp x pp): the ranks of an SP, TP or PP group train on the same rows
            s.actor.ulysses_sequence_parallel_size
            * s.actor.tensor_model_parallel_size
            * s.actor.pipeline_model_parallel_size,
            log_prob_micro_batch_size=s.rollout.log_prob_micro_batch_size,
        )

    # ------------------------------------------------------------------ setup
    def _init_distributed(self) -> None:
        if not dist.is_initialized():
            backend = "nccl" if self.device == "cuda" else "gloo"
            dist.init_process_group(
                backend=backend,
                init_method="env://",
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.sections.nccl_timeout),
            )
        self.tp_mesh = self.pp_mesh = None
        if self._engine_only:  # no FSDP module: its meshes would only constrain the engines' rank count
            self.ulysses_group, self.row_group, self.dp_group = None, None, dist.group.WORLD
            return
        from verl.utils.fsdp_mesh import build_fsdp_mesh, build_ulysses_mesh, set_group_timeout

        # fsdp_size: -1 = shard over all ranks; a divisor = HSDP (shard within groups, replicate across).
        timeout_s = self.sections.nccl_timeout  # every sub-group of the meshes too, not only the world group
        tp, pp = int(self.sections.actor.tensor_model_parallel_size), self.sections.actor.pipeline_model_parallel_size
        row_group = None
        if pp > 1:  # (pp, dp, tp) mesh: stages over pp, FSDP2 over dp, TP over tp (verl/utils/pipeline_parallel.py)
            from verl.utils.pipeline_parallel import build_pp_mesh, pp_layout_errors

            errors = pp_layout_errors(
                pp,
                self.sections.actor.pipeline_schedule,
                self.world_size,
                tp,
                int(self.sections.actor.ulysses_sequence_parallel_size),
            )
            if errors:  # the checker refuses these before a run; a worker built on its own says the same
                raise ValueError("; ".join(errors))
            mesh, row_group = build_pp_mesh(self.device, self.world_size, pp, tp)
            set_group_timeout([row_group, *(mesh.get_group(name) for name in ("pp", "dp", "tp"))], timeout_s)
            self.device_mesh, self.pp_mesh = mesh["dp"], mesh["pp"]
            self.tp_mesh = mesh["tp"] if tp > 1 else None
        elif tp > 1:  # (dp, tp) mesh: FSDP2 over dp, DTensor TP over tp (verl/utils/tensor_parallel.py)
            from verl.utils.tensor_parallel import build_tp_mesh

            mesh = build_tp_mesh(self.device, self.world_size, tp)
            set_group_timeout((mesh.get_group(name) for name in ("dp", "tp")), timeout_s)
            self.device_mesh, self.tp_mesh = mesh["dp"], mesh["tp"]
        else:
            self.device_mesh = build_fsdp_mesh(
                self.device, self.world_size, int(self.sections.actor.fsdp_config.fsdp_size), timeout_s=timeout_s
            )
        # Ulysses SP: groups of consecutive ranks share rows and split positions (verl/utils/ulysses.py).
        sp_mesh = build_ulysses_mesh(
            self.device, self.world_size, int(self.sections.actor.ulysses_sequence_parallel_size), timeout_s=timeout_s
        )
        self.ulysses_group = sp_mesh.get_group("sp") if sp_mesh is not None else None
        # The ranks that hold the same rows (an SP group, a TP group or a dp index's pp x tp ranks; SP never with
        # the others, WorkerSections.validate).
        if row_group is None:
            row_group = self.tp_mesh.get_group() if self.tp_mesh is not None else self.ulysses_group
        self.row_group = row_group
        # Dynamic micro-batch counts are agreed (max) over every rank: all of them take part in the FSDP
        # collectives, whatever the HSDP / SP layout (docs/DESIGN.md §2 item 3).
        self.dp_group = dist.group.WORLD

    def _param_dtype(self, fsdp_cfg: ShardingSection) -> torch.dtype:
        name = fsdp_cfg.param_dtype
        if name == "auto":
            return torch.bfloat16 if self.device == "cuda" else torch.float32
        return torch_dtype(name)

    def _build_module(self, fsdp_cfg: ShardingSection, trainable: bool):
        """HF model (fp32 master weights), optional grad checkpointing, FSDP2-sharded over the group, built on
        the meta device and filled shard by shard from the checkpoint (``verl.utils.meta_init``)."""
        from transformers import AutoConfig

        from verl.utils.fsdp_utils import apply_fsdp2, cpu_offload_policy, mixed_precision_policy
        from verl.utils.meta_init import empty_model, materialize

        mcfg = self.sections.model
        from verl.utils.import_utils import import_external_libs

        import_external_libs(mcfg.external_lib)  # registers a custom architecture before AutoConfig reads it
        from verl.utils.attn_impl import require_kernel, resolve_attn_implementation

        attn = resolve_attn_implementation(mcfg.attn_implementation, self.device)  # auto: sdpa without flash-attn
        require_kernel(attn)  # a flash-attn built for another torch/CUDA fails here, not after a rollout
        hf_config = AutoConfig.from_pretrained(mcfg.path, trust_remote_code=mcfg.trust_remote_code)
        for k, v in (mcfg.override_config or {}).items():
            setattr(hf_config, k, v)
        # Parameters on meta, sharded, then each rank reads only its shards (no full copy on any rank).
        module = empty_model(hf_config, torch.float32, attn, trust_remote_code=mcfg.trust_remote_code)
        if trainable and mcfg.enable_gradient_checkpointing:
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

        def shard(m):
            return apply_fsdp2(
                m,
                self.device_mesh,
                mp_policy=mixed_precision_policy(self._param_dtype(fsdp_cfg), torch_dtype(fsdp_cfg.reduce_dtype)),
                reshard_after_forward=fsdp_cfg.reshard_after_forward,
                offload_policy=cpu_offload_policy(bool(fsdp_cfg.param_offload), self.device),
                min_num_params=int(fsdp_cfg.wrap_policy.min_num_params),
            )

        if self.pp_mesh is not None:  # prune to this rank's stages, TP, FSDP2 per stage (pipeline_parallel.py)
            return self._build_pipeline(module, shard, empty_model(hf_config, torch.float32, attn))
        if self.tp_mesh is not None:  # TP first, then FSDP2 over the dp dimension (torchtitan's order)
            from verl.utils.tensor_parallel import apply_tensor_parallel

            module = apply_tensor_parallel(module, self.tp_mesh, self.sections.actor.sequence_parallel)
        return materialize(shard(module), mcfg.path, self.device)

    def _build_pipeline(self, module, shard, full_model):
        """The rank's pruned model (returned; its ``PipelineModel``: ``pipeline_of``), materialised."""
        from verl.utils.pipeline_parallel import attach_pipeline, build_pipeline_model, materialize_pipeline
        from verl.workers.actor.pipeline_actor import PipelineFullWeights

        device = torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")
        schedule = self.sections.actor.pipeline_schedule
        chunk = int(self.sections.model.logprob_chunk_size)  # the last stage's scoring head, as the actor's
        sp = self.sections.actor.sequence_parallel  # the reference follows the actor, as its tp
        pipe = build_pipeline_model(module, self.pp_mesh, schedule, device, shard, self.tp_mesh, chunk, sp)
        pipe = materialize_pipeline(pipe, self.sections.model.path, self.device)
        pipe.full_weights = PipelineFullWeights(pipe, full_model)  # the weight push and the HF export read it
        # what a checkpoint must hold (each rank loads its part): fsdp_checkpoint_manager's pre-load check
        pipe.module.full_state_shapes = {n: tuple(t.shape) for n, t in full_model.state_dict().items()}
        return attach_pipeline(pipe.module, pipe)

    def _build_optimizer(self, module):
        from verl.utils.optim import build_adamw
        from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

        ocfg = self.sections.actor.optim
        optimizer = build_adamw(
            module.parameters(),
            lr=ocfg.lr,
            betas=tuple(ocfg.betas),
            weight_decay=ocfg.weight_decay,
            step_impl=ocfg.step_impl,
        )
        if self.total_training_steps is None:
            raise ValueError(
                "the actor's lr schedule needs the run's total_training_steps (the launcher passes it to "
                "each worker; a worker built on its own passes it too)"
            )
        total = int(self.total_training_steps)
        warmup = int(ocfg.lr_warmup_steps_ratio * max(total, 0))
        zero_first = bool(ocfg.zero_lr_first_step)
        if ocfg.warmup_style == "cosine":  # else constant (the declaration allows those two)
            if total <= 0:
                raise ValueError(f"actor.optim.warmup_style=cosine needs a run of > 0 training steps, got {total}")
            scheduler = get_cosine_schedule_with_warmup(
                optimizer, warmup, total, min_lr_ratio=ocfg.min_lr_ratio or 0.0, zero_lr_first_step=zero_first
            )  # YAML: null = 0.0
        else:
            scheduler = get_constant_schedule_with_warmup(optimizer, warmup, zero_lr_first_step=zero_first)
        return optimizer, scheduler

    def _build_rollout(self):
        """Rollout engine for this rank and the sharding manager that feeds it the actor's weights."""
        from verl.workers.sharding_manager import FSDPShardingManager

        from verl.workers.sharding_manager.collective_sync import SplitRolloutManager

        rcfg = self.sections.rollout  # the engine's config is built from the section (verl/workers/rollout/config.py)
        if rcfg.name == "hf":  # else vllm (the declaration allows those two)
            from verl.workers.rollout.hf_rollout import HFRollout

            rollout = HFRollout(self.sections.model.path, rcfg, device=self.device)
        else:
            from verl.workers.rollout.vllm_rollout import VLLMRollout

            rollout = VLLMRollout(self.sections.model.path, rcfg, device=self.device)
        tp = self.rollout_tp_size
        sync = self.sections.rollout
        if self._engine_only:  # the actor's rank 0 broadcasts the weights (join_weight_group / receive_weights)
            return rollout, SplitRolloutManager(
                rollout,
                None,
                rank=self.rank,
                world_size=self.world_size,
                tp_size=tp,
                base_seed=1000 + int(sync.seed),
                device=self.device,
            )
        from verl.utils.pipeline_parallel import pipeline_of

        pipe, manager_cls = pipeline_of(self.actor_module), FSDPShardingManager
        if pipe is not None:  # stages: every layer reaches every rank's engine (pipeline_actor.py)
            from verl.workers.actor.pipeline_actor import PipelineShardingManager as manager_cls
        manager = manager_cls(
            self.actor_module if pipe is None else pipe.full_weights,
            rollout,
            bucket_bytes=int(sync.weight_sync_bucket_mb) << 20,
            rank=self.rank,
            world_size=self.world_size,
            tp_size=tp,
            # the run's parameter dtype (bf16 on GPU by default), not fp32 masters
            sync_dtype=self._param_dtype(self.sections.actor.fsdp_config),
            base_seed=1000 + int(sync.seed),
            device=self.device,
            packed_gather=bool(sync.weight_sync_packed),
        )
        return rollout, manager

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self) -> dict:
        """Push the actor's current weights into this rank's rollout engine: the step's stage before every
        generation (all ranks together: the gathers are collectives). Returns this rank's push seconds."""
        if not self._is_rollout:
            raise RuntimeError(f"update_weights called on a worker with role {self.role!r} (no rollout engine)")
        from verl.workers.sharding_manager.fsdp_sharding_manager import WEIGHT_SYNC_METRIC

        return {WEIGHT_SYNC_METRIC: self.sharding_manager.sync_weights()}

    @property
    def rollout_tp_size(self) -> int:
        """Ranks per rollout engine: vLLM's tensor parallel size (the HF engine is one rank each)."""
        return self.sections.rollout.engine_ranks

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _use_local_model_dir(self) -> None:
        """A hub id in ``model.path`` becomes this node's cache snapshot folder (downloaded once per node when
        online) before anything reads the model: the shard loader reads files (verl/utils/model_source.py)."""
        import dataclasses

        from verl.utils.model_source import resolve_model_dir

        local = resolve_model_dir(str(self.sections.model.path))
        if local != str(self.sections.model.path):  # the section says where the files are; the config is not changed
            self.sections = dataclasses.replace(
                self.sections, model=dataclasses.replace(self.sections.model, path=local)
            )

    def init_model(self):
        from verl.utils.tokenizer import hf_tokenizer, stop_token_ids

        self._use_local_model_dir()
        self.tokenizer = hf_tokenizer(self.sections.model.path)
        self.stop_token_ids = stop_token_ids(self.tokenizer, self.sections.model.path)
        from verl.utils.pipeline_parallel import pipeline_of

        s = self.sections
        use_rmpad = s.model.use_remove_padding
        share = bool(s.model.shared_prompt_forward)
        chunk = int(s.model.logprob_chunk_size)
        if self._is_actor or (self._is_rollout and not self._engine_only):
            self.actor_module = self._build_module(s.actor.fsdp_config, trainable=self._is_actor)
        if self._is_actor:
            self.actor_optimizer, self.lr_scheduler = self._build_optimizer(self.actor_module)
            from verl.utils.offload import OptimizerOffload

            # AdamW state in host memory between updates (no-op on CPU); verl/utils/offload.py.
            compute = (
                torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")
            )
            self.optimizer_offload = OptimizerOffload(
                self.actor_optimizer, compute, enabled=bool(s.actor.fsdp_config.optimizer_offload)
            )
            from verl.utils.grad_norm import grad_norm_device

            # The actor reads its keys from the section; from ``config`` only a registered loss's own knobs.
            self.actor = self.actor_cls(
                self.policy_loss_knobs,
                self.actor_module,
                self.actor_optimizer,
                use_remove_padding=use_rmpad,
                shared_prompt_forward=share,
                device=self.device,
                logprob_chunk_size=chunk,
                ulysses_group=self.ulysses_group,
                dp_group=self.dp_group,
                batch_sizes=self.batch_sizes,
                section=s.actor,
                grad_norm_device=grad_norm_device(
                    bool(s.actor.fsdp_config.param_offload),
                    self.device,
                    compute,
                    int(s.actor.tensor_model_parallel_size),
                    int(s.actor.pipeline_model_parallel_size),
                ),
                pipeline=pipeline_of(self.actor_module),
            )
        if self._is_rollout:
            self.rollout, self.sharding_manager = self._build_rollout()
        if self._is_ref:
            self.ref_module = self._build_module(s.ref.fsdp_config, trainable=False)
            self.ref_policy = DataParallelPPOActor(
                None,
                self.ref_module,
                None,
                use_remove_padding=use_rmpad,
                shared_prompt_forward=share,
                device=self.device,
                logprob_chunk_size=chunk,
                ulysses_group=self.ulysses_group,
                dp_group=self.dp_group,
                pipeline=pipeline_of(self.ref_module),
            )
        return True

    # ------------------------------------------------------------------ compute
    def _log_prob_meta(self, cfg) -> dict:
        """Micro-batching of a log-prob pass; ``cfg`` is the rollout or the reference section."""
        return {
            "micro_batch_size": self.batch_sizes.log_prob_micro_rows,
            "use_dynamic_bsz": cfg.log_prob_use_dynamic_bsz,
            "max_token_len": cfg.log_prob_max_token_len_per_gpu,
            "temperature": self.sections.rollout.temperature,
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` of every row under the current actor (LUFFY never trusts engine log-probs)."""
        data = gather_data_in_group(data, self.row_group)
        data.meta_info.update(self._log_prob_meta(self.sections.rollout))
        log_probs, entropy = self.actor.compute_log_prob(data, calculate_entropy=True)
        out = DataProto.from_dict(
            tensors={"old_log_probs": log_probs, "old_entropy": entropy},
            meta_info={"temperature": self.sections.rollout.temperature},
        )
        return local_rows(out, self.row_group)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        if not self._is_ref:
            raise RuntimeError(f"compute_ref_log_prob called on a worker with role {self.role!r} (no reference model)")
        data = gather_data_in_group(data, self.row_group)
        data.meta_info.update(self._log_prob_meta(self.sections.ref))
        log_probs, _ = self.ref_policy.compute_log_prob(data)
        return local_rows(DataProto.from_dict(tensors={"ref_log_prob": log_probs}), self.row_group)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        t0 = time.perf_counter()
        data = gather_data_in_group(data, self.row_group)
        data.meta_info.setdefault("temperature", self.sections.rollout.temperature)
        t_update = time.perf_counter()
        with self.optimizer_offload.on_compute_device():
            metrics = self.actor.update_policy(data)
        metrics.update({k: [v] for k, v in self._update_flops(data, time.perf_counter() - t_update).items()})
        # The lr this update ran with (LUFFY logs the scheduler's value after stepping, i.e. the next one's).
        lr = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        metrics["actor/lr"] = [lr]
        metrics["timing_s/update_actor_worker"] = [time.perf_counter() - t0]
        return DataProto(meta_info={"metrics": metrics})

    def _update_flops(self, data: DataProto, seconds: float) -> dict[str, float]:
        """LUFFY's ``mfu/actor`` (model FLOPs from the HF config over the measured update time, per device) and
        ``perf/actor_tflops``; see ``verl.utils.flops_counter``."""
        from verl.utils.flops_counter import FlopsCounter, current_device_peak_flops, update_flops_metrics
        from verl.utils.ulysses import group_size

        if getattr(self, "_flops_counter", None) is None:
            config = getattr(self.actor_module, "config", None)
            self._flops_counter = FlopsCounter(config, current_device_peak_flops() if self.device == "cuda" else None)
        if data.batch is None or "attention_mask" not in data.batch.keys():
            return {}
        seqlens = data.batch["attention_mask"].sum(-1).tolist()
        return update_flops_metrics(
            self._flops_counter,
            seqlens,
            seconds,
            passes=int(self.sections.actor.ppo_epochs),
            share=1.0 / group_size(self.row_group),
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def device_report(self) -> dict:
        """This rank's device choice and the env torch.distributed / vLLM read (``verl.utils.device``)."""
        from verl.utils.device import describe_worker

        return dict(describe_worker(self.device_plan), rank=self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def actor_weight_fingerprint(self) -> float:
        """Sum of squares of this rank's actor shard: a cheap check that weights changed or match."""
        total = 0.0
        with torch.no_grad():
            for p in self.actor_module.parameters():
                local = p.to_local() if hasattr(p, "to_local") else p
                total += float(local.double().pow(2).sum())
        return total
