"""LUFFY's hybrid-engine worker: the FSDP actor plus dual-pool generation.

``generate_sequences`` receives this rank's prompts with their off-policy traces and the prefix
ratios the driver drew and, on the weights the driver's ``update_weights`` call just pushed, runs the slot
plan (``mix_vllm_rollout``): full-trace slots are built without the engine, partial prefixes are
continued by it, on-policy slots are plain generation. ``generate_validation`` is its own call: plain
samples at ``val_temperature``. ``init_sft_optimizer`` / ``sft_update_actor``: ReLIFT's interleaved SFT stage
with its own optimizer (luffy_pool/workers/interleaved_sft.py), built when the driver's method asks for it.
``init_ref_ema`` / ``update_ref_ema``: the reference model as an exponential moving average of the actor (a
self-distillation teacher), its weights saved and loaded with the actor's checkpoint from ``init_ref_ema`` on.
"""

from __future__ import annotations

import time

import torch

from luffy_pool.config.sections import LuffyWorkerSections
from luffy_pool.workers.mix_actor import MIXDataParallelPPOActor
from luffy_pool.rollout.slot_plan import MixRolloutPlanner
from verl.protocol import DataProto, PerPart
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.fsdp_workers import ActorRolloutRefWorker
from verl.workers.sharding_manager.fsdp_sharding_manager import HOLD_WEIGHTS_KEY
from verl.workers.rollout.tp_group import TPGeneration


class MIXActorRolloutRefWorker(ActorRolloutRefWorker):
    actor_cls = MIXDataParallelPPOActor
    sections_cls = LuffyWorkerSections

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        if self._is_actor:  # the method and its frozen knobs, once (luffy_pool/methods/losses.py)
            from luffy_pool.methods.base import MethodSelection

            self.actor.set_method(getattr(self.sections, "method", None) or MethodSelection("luffy"))
        if self._is_rollout:
            self.planner = MixRolloutPlanner(
                self.rollout,
                self.sections.rollout,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
                stop_token_ids=self.stop_token_ids,
            )
            # Ranks of one vLLM TP group generate the same prompts with the same seed (docs/DESIGN.md §2 item 2).
            self.tp_generation = TPGeneration.create(
                self.rank, self.world_size, self.rollout_tp_size, timeout_s=self.sections.nccl_timeout
            )
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_sft_optimizer(self, knobs: dict) -> bool:
        """Build the interleaved SFT stage's own AdamW (``knobs``: an ``InterleavedSftConfig`` as a dict); it is
        saved and loaded with the checkpoint from now on (call before any resume)."""
        from luffy_pool.workers.interleaved_sft import OPTIMIZER_NAME, InterleavedSftConfig, build_sft_optimizer
        from verl.utils.offload import OptimizerOffload

        if not self._is_actor:
            raise RuntimeError(f"init_sft_optimizer called on a worker with role {self.role!r} (no actor)")
        self.sft_config = InterleavedSftConfig(**knobs)
        self.sft_optimizer = build_sft_optimizer(
            self.actor_module, self.sft_config, self.sections.actor.optim.step_impl
        )
        # offloaded between SFT stages like the RL optimizer (fsdp_config.optimizer_offload)
        self.sft_optimizer_offload = OptimizerOffload(
            self.sft_optimizer,
            self.optimizer_offload.compute_device,
            enabled=bool(self.sections.actor.fsdp_config.optimizer_offload),
        )
        self.extra_optimizers = {OPTIMIZER_NAME: (self.sft_optimizer, self.sft_optimizer_offload)}
        self._checkpoint_manager = None  # rebuilt with the new optimizer on the next save / load
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_ref_ema(self) -> bool:
        """Make the reference weights state: checked to shard like the actor's, then saved and loaded with the
        actor's checkpoint (call before any resume)."""
        from verl.workers.checkpoint_mixin import ModuleShardsState

        self._ref_ema_pairs()
        self.extra_checkpoint_states = {"ref_weights": ModuleShardsState(self.ref_module, "reference (EMA) weights")}
        self._checkpoint_manager = None  # rebuilt with the new state on the next save / load
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_ref_ema(self, rate: float) -> bool:
        """``ref ← (1 − rate)·ref + rate·actor``, parameter by parameter on this rank's shards (buffers unchanged)."""
        with torch.no_grad():
            for ref, act in self._ref_ema_pairs():
                ref.mul_(1.0 - rate).add_(act.to(device=ref.device, dtype=ref.dtype), alpha=rate)
        return True

    def _ref_ema_pairs(self) -> list:
        if not (self._is_actor and self._is_ref):
            raise RuntimeError(f"an EMA reference needs the actor and the reference on one worker (role {self.role!r})")

        def local(p):
            return p.to_local() if hasattr(p, "to_local") else p

        ref = dict(self.ref_module.named_parameters())
        act = dict(self.actor_module.named_parameters())
        if ref.keys() != act.keys() or any(local(ref[k]).shape != local(act[k]).shape for k in ref):
            raise ValueError(
                "the reference model is not sharded like the actor (actor_rollout_ref.ref.fsdp_config vs "
                "actor.fsdp_config): an EMA reference moves shard by shard"
            )
        return [(local(ref[k]), local(act[k])) for k in ref]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def sft_update_actor(self, data: DataProto) -> DataProto:
        """One interleaved SFT stage on this rank's demonstration rows; returns its metric lists."""
        from luffy_pool.workers.interleaved_sft import sft_update
        from verl.utils.ulysses import gather_data_in_group

        if getattr(self, "sft_optimizer", None) is None:
            raise RuntimeError("sft_update_actor before init_sft_optimizer (the driver builds it at start)")
        t0 = time.perf_counter()
        data = gather_data_in_group(data, self.row_group)
        with self.sft_optimizer_offload.on_compute_device():
            metrics = sft_update(self.actor, self.sft_optimizer, data, self.sft_config)
        metrics["timing_s/sft_update_worker"] = [time.perf_counter() - t0]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Roll out this rank's training prompts with their per-slot traces (``tgt_input_ids [B_rank, n, T]``,
        optional ``behaviour_log_probs [B_rank, n, T + 1]``) and prefix ratios; returns B_rank·n rows."""
        return self._generate(prompts, validate=False)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def generate_sequences_async(self, prompts: DataProto) -> DataProto:
        """``generate_sequences`` answered as a future: the split engines' call, so the driver can launch batch N+1
        and train on batch N meanwhile (``trainer.rollout_pipeline=one_step_off``)."""
        return self._generate(prompts, validate=False)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_validation(self, prompts: DataProto) -> DataProto:
        """Validation rollout of this rank's prompts: n_val plain samples each at val_temperature (B_rank·n_val rows)."""
        return self._generate(prompts, validate=True)

    def _generate(self, prompts: DataProto, validate: bool) -> DataProto:
        b = prompts.batch
        t0 = time.perf_counter()
        # A per-step, per-rank seed (not a stream consumed across steps) so a resumed run samples
        # exactly what an uninterrupted one would have.
        step = int(prompts.meta_info.get("global_steps", 0))
        self.planner.sampling.seed = (
            int(self.sections.rollout.seed) + 100_003 * step + self.tp_generation.layout.dp_rank
        )

        def generate(b):
            if validate:
                return self.planner.generate_validation(
                    b["input_ids"], b["attention_mask"], prompt_position_ids=b["position_ids"]
                )
            return self.planner.generate(
                b["input_ids"],
                b["attention_mask"],
                b.get("tgt_input_ids"),
                b["prefix_ratios"],
                prompt_position_ids=b["position_ids"],
                behaviour_log_probs=b.get("behaviour_log_probs"),
            )

        # wakes the engine (refused without a push since the last generation); the driver's validation holds it
        # awake with its weights between chunks (HOLD_WEIGHTS_KEY), so one push serves the whole validation
        hold = validate and bool(prompts.meta_info.get(HOLD_WEIGHTS_KEY, False))
        with self.sharding_manager.hold(hold):
            tensors, meta = self.tp_generation.run({k: b[k] for k in b.keys()}, generate)

        meta.pop("prefix_ratios", None)  # the driver already holds the ratios it drew
        meta["timing_s/generate_worker"] = time.perf_counter() - t0
        return DataProto.from_dict(tensors=tensors, meta_info={"rollout_stats": PerPart([meta])})
