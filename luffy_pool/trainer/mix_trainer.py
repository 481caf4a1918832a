"""LUFFY's driver loop: sample prompts, roll out both pools, reward, advantage, update, validate.

Runs on the Ray driver (the single controller). ``train_step`` is a row of named stages, each returning
its metrics: update_weights (push the actor's weights into the rollout engines) -> rollout (draw prefix
ratios, generate on-policy + off-policy slots) -> score (reward every row) -> log-probs (old, ref) -> [rollout
correction: IS weights / rejection, ``algorithm.rollout_correction``] -> advantages (KL in reward, group advantage)
-> update (balance rows across ranks, update the actor) -> step metrics. Around them the step's hooks run, each
stage one loop over the active hooks (luffy_pool/methods/hooks.py: the method's, then self-replay's). ``fit``
adds validation every ``trainer.test_freq`` steps and checkpoints every ``trainer.save_freq``. The driver
owns every decision that must agree across ranks (ratios, uids, advantages, order). With
``actor_rollout_ref.hybrid_engine=False`` the engines are a worker group of their own (``rollout_wg``) and the
rollout source (luffy_pool/trainer/rollout_source.py) makes the first two stages (``trainer.rollout_pipeline``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import NamedTuple

import numpy as np
import torch

from deepscaler.rewards import fail_success_values
from luffy_pool.config.sections import ConfigSections
from luffy_pool.algorithm.mix_advantage import compute_advantage, postprocess_batch_advantage
from luffy_pool.methods import get_method
from luffy_pool.methods.hooks import StepContext
from luffy_pool.rollout.off_policy_pool import OffPolicyPool, PrefixRatioSampler, unknown_behaviour_metrics
from luffy_pool.trainer.outputs import dump_rollouts, rollout_records
from luffy_pool.trainer.validation import score_validation
from luffy_pool.trainer.rollout_correction import IS_WEIGHTS_KEY, apply_rollout_correction, bypass_old_log_probs
from luffy_pool.trainer.rollout_correction import enabled as rollout_correction_enabled
from luffy_pool.replay.self_replay import SelfReplay
from luffy_pool.trainer.rollout_source import ColocatedRollout, SplitRollout
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import apply_kl_penalty, get_kl_controller
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_group_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reduce_metrics,
)
from verl.utils.seqlen_balancing import balance_batch_rows
from verl.utils.signals import GracefulStop, stop_on_signal

logger = logging.getLogger(__name__)

GEN_KEYS = ("input_ids", "attention_mask", "position_ids")
GENERATE_WORKER_METRIC = "timing_s/generate_worker"  # in each rank's rollout_stats
LOG_PROB_KEYS = ["responses", "input_ids", "attention_mask", "position_ids"]


@contextlib.contextmanager
def _timer(name: str, timing: dict):
    t0 = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - t0


class StepOutput(NamedTuple):
    """What ``train_step`` hands ``fit``: the step's metrics and the tokens its timing metrics divide by."""

    metrics: dict
    prompt_tokens: int
    response_tokens: int


class MIXRayPPOTrainer:
    """The LUFFY trainer. Collaborators are built by ``luffy_pool.run.launcher`` and injected here."""

    def __init__(
        self,
        config,
        tokenizer,
        actor_rollout_wg,
        reward_fn,
        val_reward_fn,
        train_dataloader,
        val_dataset=None,
        collate_fn=None,
        tracker=None,
        checkpointer=None,
        off_policy_pool=None,
        sections=None,
        total_training_steps=None,
        rollout_wg=None,
    ):
        from verl.utils.tokenizer import stop_token_ids

        self.config = config
        self.tokenizer = tokenizer
        # every id the engines stop on: a response ending on any of them is complete, not truncated
        self.stop_token_ids = stop_token_ids(tokenizer) if tokenizer is not None else None
        self.wg = actor_rollout_wg
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.train_dataloader = train_dataloader
        self.val_dataset = val_dataset
        self.collate_fn = collate_fn
        self.tracker = tracker
        self.checkpointer = checkpointer
        # Without extra trace files the pool only spreads each dataset target over its n slots; it is
        # still the one path from per-prompt targets [B, T] to the rollout's per-slot traces [B, n, T].
        self.off_policy_pool = off_policy_pool if off_policy_pool is not None else OffPolicyPool(tokenizer=tokenizer)
        # The run's typed sections and step count, from the launcher (built here when a caller starts a run itself).
        self.sections = s = sections or ConfigSections.from_config(config)
        self.rollout_wg = rollout_wg  # split engines (hybrid_engine=False): their group; None on the hybrid engine
        rcfg = s.workers.rollout
        self.n = rcfg.n
        self.response_length = s.data.max_response_length
        self.ratio_sampler = PrefixRatioSampler.from_rollout_config(rcfg, seed=int(s.trainer.seed))
        self.kl_ctrl = get_kl_controller(s.algorithm.kl_ctrl)
        self.method = get_method(s.algorithm.method)  # luffy_pool/methods/: its hooks; its loss runs in the actor
        self.use_ref = s.workers.ref.use_ref
        rc = s.algorithm.rollout_correction
        self.rollout_correction = rc if rollout_correction_enabled(rc) else None
        self.bypass_mode = bool(rc.bypass_mode)  # the engine's log-probs are the old ones: no old-log-prob pass
        self.world_size = self.wg.world_size
        self.global_steps = 0
        self.total_training_steps = (
            int(total_training_steps)
            if total_training_steps is not None
            else s.trainer.total_steps(len(self.train_dataloader))
        )
        self.self_replay = SelfReplay.from_sections(s, reward_fn=reward_fn, tokenizer=tokenizer)  # None when off
        self.hooks = self._build_hooks()
        self.rollout = (  # where each step's batch comes from (luffy_pool/trainer/rollout_source.py)
            ColocatedRollout(self, self.wg)
            if rollout_wg is None
            else SplitRollout(self, self.wg, rollout_wg, s.trainer.rollout_pipeline)
        )
        self._data_iter = None
        self.last_val_metrics: dict = {}
        self.stop = GracefulStop(enabled=False)  # fit installs the live one; stop.signum says why fit returned
        self.pending_metrics: dict = {}  # logged with the next step (a restart's trainer/restarts, steps_lost)

    def _build_hooks(self) -> list:
        """The step's hooks in stage order: the method's, then self-replay's (it sees the final slot plan)."""
        s, hooks = self.sections, []
        if self.method.hooks is not None:
            context = StepContext(
                sections=s,
                wg=self.wg,
                tokenizer=self.tokenizer,
                dataset=getattr(self.train_dataloader, "dataset", None),
                collate_fn=self.collate_fn,
                world_size=self.world_size,
                response_length=self.response_length,
                total_steps=self.total_training_steps,
                knobs=s.knobs,
            )
            hooks.append(self.method.hooks(context))
        if self.self_replay is not None:
            hooks.append(self.self_replay)
        return hooks

    # ------------------------------------------------------------------ resumable state
    def state_dict(self) -> dict:
        """The driver-side state a resume restores (the checkpointer adds the data sampler and RNGs)."""
        value = getattr(self.kl_ctrl, "value", None)
        state = {
            "ratio_sampler": self.ratio_sampler.state_dict(),
            "kl_coef": float(value) if value is not None else None,
            "last_val_metrics": dict(self.last_val_metrics or {}),
        }
        hooks = {h.name: h.state_dict() for h in self.hooks}
        hooks = {k: v for k, v in hooks.items() if v is not None}
        if hooks:  # the hooks' state, one path for all (a run without stateful hooks saves what LUFFY saves)
            state["hooks"] = {"method": self.method.name, "state": hooks}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; the next batch comes from the restored sampler position."""
        self.ratio_sampler.load_state_dict(state["ratio_sampler"])
        if state.get("kl_coef") is not None and hasattr(self.kl_ctrl, "value"):
            self.kl_ctrl.value = float(state["kl_coef"])
        self.last_val_metrics = dict(state.get("last_val_metrics") or {})
        saved = state.get("hooks") or {}
        same_method = saved.get("method") == self.method.name
        for hook in self.hooks:
            hook_state = (saved.get("state") or {}).get(hook.name) if same_method else None
            if hook_state is not None:
                hook.load_state_dict(hook_state)
            elif hook.state_dict() is not None:  # a checkpoint of another method (or of none): starts empty
                logger.warning(
                    "the checkpoint holds no %s state of algorithm.method=%s; it starts empty",
                    hook.name,
                    self.method.name,
                )
        self._data_iter = None

    # ------------------------------------------------------------------ schedule
    def last_step(self) -> int:
        """The step ``fit`` stops after: ``total_training_steps``, or with ``trainer.stop_one_step_early`` LUFFY's
        ``total - 1`` (its loop checks ``global_steps >= total`` after incrementing, at least one step runs)."""
        total = self.total_training_steps
        if self.sections.trainer.stop_one_step_early and total >= 1:
            return max(1, total - 1)
        return total

    def _next_batch(self) -> dict:
        """Next training batch; a new epoch starts when the (resumable) sampler is exhausted."""
        if self._data_iter is None:
            self._data_iter = iter(self.train_dataloader)
        try:
            return next(self._data_iter)
        except StopIteration:
            self._data_iter = iter(self.train_dataloader)
            try:
                return next(self._data_iter)
            except StopIteration:
                raise RuntimeError(
                    f"the training dataloader is empty: fewer rows than data.train_batch_size="
                    f"{self.config.data.train_batch_size}"
                ) from None

    # ------------------------------------------------------------------ main loop
    @stop_on_signal(what="the current training step")  # SIGTERM/SIGINT: finish and save the step, return
    def fit(self) -> dict:
        """Train until ``last_step()`` (or a stop signal); returns the last step's metrics."""
        from tqdm import tqdm

        if self.checkpointer is not None:
            self.global_steps = self.checkpointer.maybe_resume(self)
        if self.sections.trainer.val_only:  # LUFFY's +trainer.val_only=True: validate, then exit
            if self.val_dataset is None:
                raise ValueError("trainer.val_only=True needs data.val_files")
            metrics = self.validate()
            self._log(metrics, step=self.global_steps)
            return metrics
        if self.global_steps == 0 and self.sections.trainer.val_before_train and self.val_dataset is not None:
            self._log(self.validate(), step=0)
        last, last_step = {}, self.last_step()
        bar = tqdm(
            total=last_step, initial=self.global_steps, desc="training", unit="step", dynamic_ncols=True, disable=None
        )
        while self.global_steps < last_step and not self.stop.requested:
            self.global_steps += 1
            timing: dict[str, float] = {}
            with _timer("step", timing):
                out = self.rollout_step(timing)
                metrics = out.metrics
                self._validate_and_save(metrics, timing, is_last=self.global_steps >= last_step)
            metrics.update(compute_timing_metrics(timing, out.prompt_tokens, out.response_tokens))
            metrics.update(
                compute_throughput_metrics(
                    out.prompt_tokens + out.response_tokens, timing["step"], self.world_size + self.rollout.extra_ranks
                )
            )
            metrics.update(self.pending_metrics)
            self.pending_metrics = {}
            self._log(metrics, step=self.global_steps)
            bar.update(1)
            last = metrics
        self.rollout.drop_in_flight()  # split engines: a batch still generating is waited for and un-drawn
        if self.checkpointer is not None and self.stop.save_requested(self.sections.trainer.save_on_signal):
            self.checkpointer.save_if_unsaved(self)  # the signal came between two steps
        bar.close()
        return last

    def _validate_and_save(self, metrics: dict, timing: dict, is_last: bool) -> None:
        """After a step: validate when due (adds ``val/*`` to ``metrics``), then save when due or asked to."""
        t = self.sections.trainer
        if self._due(t.test_freq, is_last) and self.val_dataset is not None:
            with _timer("testing", timing):
                metrics.update(self.validate())
            if self.checkpointer is not None:  # LUFFY writes best/actor whenever val/avg_score improves
                self.checkpointer.maybe_save_best(self, metrics)
        if self.checkpointer is not None and (
            self._due(t.save_freq, is_last) or self.stop.save_requested(t.save_on_signal)
        ):
            self.rollout.drop_in_flight()  # the saved sampler cursor must point at the batch after this step
            with _timer("save_checkpoint", timing):
                self.checkpointer.save(self, metrics)

    def _due(self, freq, is_last: bool) -> bool:
        freq = int(freq) if freq is not None else -1
        return freq > 0 and (self.global_steps % freq == 0 or is_last)

    def _log(self, metrics: dict, step: int) -> None:
        if self.tracker is not None:
            self.tracker.log(metrics, step=step)

    # ------------------------------------------------------------------ one step
    def rollout_step(self, timing: dict) -> StepOutput:
        """One update as named stages: the rollout source's batch, then the training stages; ``timing`` collects
        the seconds per stage. The next step's batch may be launched now (one_step_off) unless a save, a stop or
        the end comes after this step (the batch after a checkpoint comes from the checkpoint's weights)."""
        step, t = self.global_steps, self.sections.trainer
        last = self.last_step()
        save_due = self.checkpointer is not None and self._due(t.save_freq, step >= last)
        prefetch = step < last and not save_due and not self.stop.requested
        batch, ratios, metrics = self.rollout.get(step, timing, prefetch=prefetch)
        return self._train_on(batch, ratios, metrics, timing)

    def train_step(self, batch_dict: dict, timing: dict) -> StepOutput:
        """One update on the hybrid engine from a given batch (``batch_dict``: collated rows), as ``rollout_step``."""
        metrics: dict = {}
        batch = self._start_batch(DataProto.from_single_dict(batch_dict), self.global_steps, metrics, timing)
        batch, ratios, metrics = self.rollout.generate(batch, self.global_steps, metrics, timing)
        return self._train_on(batch, ratios, metrics, timing)

    # ------------------------------------------------------------------ what a rollout source calls
    def draw_batch(self, step: int, metrics: dict, timing: dict) -> DataProto:
        """The next batch of the data sampler, as the hooks compose it, recorded for resume."""
        return self._start_batch(DataProto.from_single_dict(self._next_batch()), step, metrics, timing)

    def prepare_rollout(self, batch: DataProto, step: int):
        return self._prepare_rollout(batch, step)

    def merge_rollout(self, batch: DataProto, gen_out: DataProto, ratios, metrics: dict, step: int):
        return self._merge_rollout(batch, gen_out, ratios, metrics, step)

    def sampler_states(self) -> dict:
        """The data and prefix-ratio samplers' states, and the hooks' (their slot plans may draw too), before a batch
        is drawn (to un-draw it)."""
        return {
            "sampler": self.train_dataloader.sampler.state_dict(),
            "ratio_sampler": self.ratio_sampler.state_dict(),
            "hooks": {h.name: h.state_dict() for h in self.hooks},
        }

    def restore_samplers(self, states: dict) -> None:
        self.train_dataloader.sampler.load_state_dict(states["sampler"])
        self.ratio_sampler.load_state_dict(states["ratio_sampler"])
        for hook in self.hooks:
            saved = (states.get("hooks") or {}).get(hook.name)
            if saved is not None:
                hook.load_state_dict(saved)
        self._data_iter = None

    @property
    def pipeline(self):
        """The split engines' one-step-off bookkeeping (None on the hybrid engine)."""
        return getattr(self.rollout, "pipeline", None)

    def _start_batch(self, batch: DataProto, step: int, metrics: dict, timing: dict) -> DataProto:
        """The step's prompts as the hooks make them (colocated and split engines alike), recorded for resume."""
        with _timer("method_compose", timing):
            for hook in self.hooks:
                batch, stage = hook.compose(batch)
                metrics.update(stage)
        if self.checkpointer is not None:  # audit trail: a resumed run must see the same prompts per step
            self.checkpointer.record_data_order(step, batch.non_tensor_batch["index"])
        return batch

    def _train_on(self, batch: DataProto, ratios, metrics: dict, timing: dict) -> StepOutput:
        """The stages after the rollout: reward, [replay], log-probs, [rollout correction], advantages, update."""
        with _timer("reward", timing):
            metrics.update(self._score(batch))
        with _timer("replay", timing):  # e.g. self-replay fills failed groups: the log-prob pass sees them
            for hook in self.hooks:
                metrics.update(hook.after_score(batch, self.global_steps))
        batch = self._log_probs(batch, timing)
        for hook in self.hooks:  # e.g. a replay pool collects with the old log-probs
            metrics.update(hook.after_log_probs(batch, self.global_steps))
        if self.rollout_correction is not None:  # IS weights / rejection on the on-policy tokens (verl's place)
            with _timer("rollout_corr", timing):
                metrics.update(apply_rollout_correction(batch, self.rollout_correction, self.response_length))
        with _timer("adv", timing):
            batch, stage = self._advantages(batch)
        metrics.update(stage)
        update_state: dict = {}
        for hook in self.hooks:  # e.g. a per-group gate; a phase that goes with the update
            stage, state = hook.before_update(batch)
            metrics.update(stage)
            update_state.update(state)
        metrics.update(self._update(batch, timing, update_state))
        for hook in self.hooks:  # e.g. an interleaved SFT stage, a pool's retirement
            metrics.update(hook.after_update(batch, timing))
        stage, prompt_tokens, response_tokens = self._step_metrics(batch)
        metrics.update(stage)
        return StepOutput(metrics, prompt_tokens, response_tokens)

    def _update_weights(self) -> dict:
        """Push the actor's current weights into the rollout engines (the source's push); needed before each
        generation (the engines sleep after one). ``timing_s/weight_sync``: the slowest rank's push."""
        return self.rollout.push()

    def _score(self, batch: DataProto) -> dict:
        """Reward every row: ``token_level_scores`` (the score on the last response token); the reward metrics."""
        scores, reward_metrics = self.reward_fn(batch)
        batch.batch["token_level_scores"] = scores
        return reward_metrics

    def _log_probs(self, batch: DataProto, timing: dict) -> DataProto:
        """Old log-probs (the engine's under ``bypass_mode``; none when the update's first forward gives them) and
        the reference's; no metrics."""
        if self.bypass_mode:
            bypass_old_log_probs(batch, self.response_length)
        elif self._recompute_old_log_prob(len(batch)):
            with _timer("old_log_prob", timing):
                batch = batch.union(self.wg.compute_log_prob(batch.select(batch_keys=LOG_PROB_KEYS)))
        if self.use_ref:
            with _timer("ref", timing):
                batch = batch.union(self.wg.compute_ref_log_prob(batch.select(batch_keys=LOG_PROB_KEYS)))
        return batch

    def _update(self, batch: DataProto, timing: dict, update_state: dict | None = None) -> dict:
        """Dump the rollouts (``trainer.rollout_data_dir``), balance rows across ranks, update the actor."""
        metrics: dict = {}
        if self.sections.trainer.rollout_data_dir:
            dump_rollouts(
                self.sections.trainer.rollout_data_dir,
                self.global_steps,
                rollout_records(batch, self.tokenizer, self.global_steps),
            )
        if self.sections.trainer.balance_batch:
            metrics.update(self._balance_batch(batch))
        if self.sections.trainer.critic_warmup <= self.global_steps - 1:
            with _timer("update_actor", timing):
                update_batch = batch.select(batch_keys=self._update_keys(batch))
                # the update's arguments besides the rows: its step, and what the hooks send the method's loss
                update_batch.meta_info["global_steps"] = self.global_steps
                update_batch.meta_info["update_state"] = dict(update_state or {})
                update = self.wg.update_actor(update_batch)
                metrics.update(reduce_metrics(update.meta_info["metrics"]))
        return metrics

    def _step_metrics(self, batch: DataProto) -> tuple[dict, int, int]:
        """Data and group metrics of the updated batch, plus its prompt and response token counts."""
        metrics = compute_data_metrics(batch.batch, self.response_length)
        on_policy = ~batch.batch["prefix_mask"].bool().any(-1)
        fail, success = fail_success_values(int(self.sections.data.reward_impl_version))
        metrics.update(
            compute_group_metrics(
                batch.batch["token_level_scores"].sum(-1),
                batch.non_tensor_batch["uid"],
                on_policy,
                fail_value=fail,
                success_value=success,
            )
        )
        response_tokens = int(batch.batch["attention_mask"][:, -self.response_length :].sum())
        prompt_tokens = int(batch.batch["attention_mask"].sum()) - response_tokens
        metrics["training/global_step"] = self.global_steps
        return metrics, prompt_tokens, response_tokens

    def _recompute_old_log_prob(self, rows: int) -> bool:
        """False only when ``actor.recompute_old_log_prob=auto`` and the update is a single on-policy
        mini-batch per rank without a reference model: then the actor's first forward equals the pass."""
        actor = self.sections.workers.actor
        if (
            self.sections.actor.recompute_old_log_prob != "auto"
            or self.use_ref
            or self.rollout_correction is not None
            or any(h.needs_old_log_probs for h in self.hooks)
        ):
            # hooks record the old log-probs (the successes a replay pool keeps); rollout correction compares
            # them with the engine's before the update
            return True
        mini_rows_per_rank = actor.ppo_mini_batch_size * self.n // self.world_size
        return not (actor.ppo_epochs == 1 and rows // self.world_size <= mini_rows_per_rank)

    def _rollout(self, batch: DataProto) -> tuple[DataProto, np.ndarray, dict]:
        """Generate the B·n slots of this step on the actor's engines and merge them with the prompts' non-tensor
        data -> (merged batch, prefix ratios ``[B, n]``, rollout metrics)."""
        batch, gen_batch, ratios, metrics = self._prepare_rollout(batch, self.global_steps)
        return self._merge_rollout(batch, self.wg.generate_sequences(gen_batch), ratios, metrics, self.global_steps)

    def _prepare_rollout(self, batch: DataProto, step: int) -> tuple[DataProto, DataProto, np.ndarray, dict]:
        """Draw step ``step``'s prefix ratios and build the engines' input (prompts, slot traces, ratios)."""
        metrics: dict = {}
        if "tgt_truncated" in batch.batch.keys():  # traces cut to rollout.max_prefix_len (data.truncate_off_policy)
            metrics["batch/off_policy_truncated"] = int(
                batch.pop(batch_keys=["tgt_truncated"]).batch["tgt_truncated"].sum()
            )
        ratios = self.ratio_sampler.draw(len(batch), step)  # LUFFY's slot plan; a hook may replace it
        gen_batch = batch.pop(batch_keys=[k for k in GEN_KEYS if k in batch.batch.keys()])
        for hook in self.hooks:  # e.g. a prefix schedule, hints, replayed trajectories
            ratios, stage = hook.plan_slots(batch, gen_batch, ratios, step)
            metrics.update(stage)
        if "tgt_input_ids" in batch.batch.keys():
            extra_slots = self._attach_slot_traces(gen_batch, batch, ratios, step)
            if self.off_policy_pool.has_extra_traces:
                metrics["rollout/extra_trace_slots"] = extra_slots
        gen_batch.batch["prefix_ratios"] = torch.as_tensor(
            ratios, dtype=torch.float64
        )  # float32 floors len*r differently
        gen_batch.meta_info["global_steps"] = step
        return batch, gen_batch, ratios, metrics

    def _merge_rollout(
        self, batch: DataProto, gen_out: DataProto, ratios, metrics: dict, step: int
    ) -> tuple[DataProto, np.ndarray, dict]:
        """The engines' rows merged with the prompts' non-tensor data (uids of step ``step``), and the metrics."""
        bsz = len(batch)
        per_rank = gen_out.meta_info.pop("rollout_stats", None) or []
        values = [float(st[GENERATE_WORKER_METRIC]) for st in per_rank if st.get(GENERATE_WORKER_METRIC) is not None]
        if values:  # the slowest rank bounds the phase
            metrics[GENERATE_WORKER_METRIC] = max(values)
        if "tgt_input_ids" in gen_out.batch.keys():
            gen_out.pop(batch_keys=["tgt_input_ids"])  # [B·n, max_prefix_len]: not needed past the rollout
        # Deterministic uids: a resumed run must see exactly the same groups as an uninterrupted one.
        batch.non_tensor_batch["uid"] = np.array([f"step{step}-p{i}" for i in range(bsz)], dtype=object)
        batch = batch.repeat(repeat_times=self.n, interleave=True)
        batch = batch.union(gen_out)
        engine_tokens = (batch.batch["response_mask"].bool() & ~batch.batch["prefix_mask"]).sum().item()
        metrics["batch/avg_prefix_ratio"] = float(np.mean(ratios))
        metrics["rollout/engine_tokens"] = engine_tokens
        metrics["rollout/full_trace_slots"] = int((np.asarray(ratios) >= 1.0).sum())
        return batch, ratios, metrics

    def _attach_slot_traces(self, gen_batch: DataProto, batch: DataProto, ratios, step: int) -> int:
        """Move the dataset's per-prompt targets ``tgt_input_ids [B, T]`` (and their behaviour log-probs
        ``behaviour_log_probs [B, T + 1]``, NaN = unknown) out of ``batch`` and put the per-slot traces of the
        off-policy pool into ``gen_batch``: ``tgt_input_ids [B, n, T]``, ``behaviour_log_probs [B, n, T + 1]``
        (see ``SlotTraces``). Returns how many prefix slots got an extra trace."""
        keys = [k for k in ("tgt_input_ids", "behaviour_log_probs") if k in batch.batch.keys()]
        targets = batch.pop(batch_keys=keys).batch
        slot = self.off_policy_pool.slot_traces(
            list(batch.non_tensor_batch["index"]),
            targets["tgt_input_ids"],
            ratios,
            step,
            pad_token_id=self.tokenizer.pad_token_id,
            behaviour_log_probs=targets["behaviour_log_probs"] if "behaviour_log_probs" in keys else None,
        )
        gen_batch.batch["tgt_input_ids"] = slot.tgt_input_ids
        if slot.behaviour_log_probs is not None:
            gen_batch.batch["behaviour_log_probs"] = slot.behaviour_log_probs
        return int(slot.num_extra_slots)

    def _update_keys(self, batch: DataProto) -> list[str]:
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "advantages", "prefix_mask"]
        if "old_log_probs" in batch.batch.keys():
            keys.append("old_log_probs")
        if "ref_log_prob" in batch.batch.keys():
            keys.append("ref_log_prob")
        if "behaviour_log_probs" in batch.batch.keys():
            keys.append("behaviour_log_probs")
        rc = self.rollout_correction
        if rc is not None:  # the weights, and the loss mask less the rejected tokens
            keys += [IS_WEIGHTS_KEY] if rc.rollout_is is not None else []
            keys += ["response_mask"] if rc.rollout_rs is not None else []
        keys += [k for k in self.method.batch_keys if k in batch.batch.keys()]  # added by the method's hooks
        return keys

    def _advantages(self, batch: DataProto) -> tuple[DataProto, dict]:
        """KL-in-reward (β=0 without a ref model), the registered estimator's advantage, then LUFFY's post-processing
        of it (prefix weights, truncated rows, SFT prefix advantage); the KL metrics and the count of off-policy rows
        whose behaviour probability is unknown."""
        metrics: dict = {}
        response_mask = batch.batch["attention_mask"][:, -self.response_length :]
        if not self.sections.actor.use_kl_loss:
            rewards, kl_metrics = apply_kl_penalty(
                batch.batch["token_level_scores"],
                batch.batch.get("old_log_probs"),
                batch.batch.get("ref_log_prob"),
                response_mask,
                self.kl_ctrl,
                self.sections.algorithm.kl_penalty,
            )
            metrics.update(kl_metrics)
        else:
            rewards = batch.batch["token_level_scores"]
        batch.batch["token_level_rewards"] = rewards
        adv, returns = compute_advantage(
            self.sections, batch.batch, batch.non_tensor_batch["uid"], self.response_length
        )
        adv = postprocess_batch_advantage(
            adv,
            self.sections,
            batch.batch,
            self.response_length,
            self.n,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.stop_token_ids,
        )
        batch.batch["advantages"] = adv
        batch.batch["returns"] = returns
        metrics.update(unknown_behaviour_metrics(batch.batch, self.sections.actor.use_off_policy_probs))
        return batch, metrics

    def _balance_batch(self, batch: DataProto) -> dict:
        """Reorder rows so each rank's contiguous chunk has a similar token count (Karmarkar-Karp).

        With ``model.shared_prompt_forward`` whole groups are balanced (a group's rows stay together on one
        rank, so its prompt is computed once there); rows otherwise, or when groups cannot split evenly.
        """
        shared = self.sections.workers.model.shared_prompt_forward
        return balance_batch_rows(batch, self.world_size, batch.non_tensor_batch["uid"] if shared else None)

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict:
        """Score ``data.val_files`` (luffy_pool/trainer/validation.py); the metrics, also kept for the best-model
        checkpoint and the resume."""
        out, samples = score_validation(
            self.rollout, self.sections, self.val_dataset, self.collate_fn, self.val_reward_fn, self.tokenizer
        )
        if samples and self.tracker is not None:
            self.tracker.log_generations(samples, step=self.global_steps)
        self.last_val_metrics = out
        return out
