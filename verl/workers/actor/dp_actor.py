"""Data-parallel PPO actor: log-probs, entropy and the policy update on one rank's FSDP module.

The worker hands this class its chunk of the batch (a DataProto). ``compute_log_prob`` runs a no-grad
forward in micro-batches (fixed size, or by token budget with ``use_dynamic_bsz``); ``update_policy``
splits the chunk into mini-batches (one optimizer step each, ``ppo_epochs`` passes), accumulates
micro-batch gradients and clips the global grad norm. The policy loss is the one registered as
``actor.policy_loss`` (``auto``: the loss whose switch key is on, else ``vanilla``; verl/trainer/ppo/loss_inputs.py),
called as ``fn(PolicyLossInputs, cfg)`` with whatever loss tensors the micro-batch carries; the LUFFY actor only
adds tensors (``loss_input_keys``) and terms (``extra_policy_loss``).

Gradient accumulation follows verl/LUFFY (docs/METHOD.md §1.9): each micro-batch loss is divided by
``gradient_accumulation = mini / micro`` rows after normalisation, even when dynamic batching makes
a different number of micro-batches; FSDP then averages over data-parallel ranks. The step's metrics do not
depend on the micro-batching (token means over the step, ``actor.metric_aggregation``, verl/utils/step_metrics.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Optional

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.workers.actor.moe_router import RouterRecorder
from verl.workers.actor.response_head import response_logprobs, supports_scoring_head
from verl.workers.actor.shared_prompt import shared_prompt_logits
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.loss_inputs import ROLLOUT_IS_LOSSES, PolicyLossInputs
from verl.trainer.ppo.rollout_corr import fill_unknown_old_log_probs
from verl.utils.batch_sizes import RankBatchSizes, rank_batch_sizes
from verl.workers.config_sections import ActorSection
from verl.utils.seqlen_balancing import get_reverse_idx, padded_micro_batches_indices, rearrange_micro_batches_indices
from verl.utils.step_metrics import StepMetrics
from verl.utils.tensor_parallel import allreduce_replicated_grads, tp_size_of
from verl.utils.torch_functional import logprobs_and_entropy_from_logits, logprobs_from_logits, masked_mean

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Raised when a loss or grad norm is NaN/inf and the policy is ``on_nonfinite=stop``."""


@contextlib.contextmanager
def report_oom(micro: dict, where: str):
    """Re-raise an accelerator OOM with the size of the micro-batch that hit it (rows, positions, tokens)."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        rows, positions = micro["input_ids"].shape
        tokens = int(micro["attention_mask"].sum())
        raise torch.OutOfMemoryError(
            f"{where}: out of memory on a micro-batch of {rows} rows x {positions} positions = {tokens} valid tokens; "
            f"lower actor.ppo_micro_batch_size / rollout.log_prob_micro_batch_size, or with use_dynamic_bsz the "
            f"*_max_token_len_per_gpu budget ({err})"
        ) from err


class DataParallelPPOActor:
    """Policy forward/backward on a (possibly FSDP-sharded) HF causal LM.

    Args:
        config: the ``actor_rollout_ref.actor`` config group (batch sizes in prompts, as the user wrote them); a
            trainable actor reads it through ``ActorSection`` (every key it names must be present: compose the
            group from the YAML), a log-prob-only actor (reference, no optimizer) reads none of it.
        actor_module: the HF model (FSDP2-wrapped or plain).
        actor_optimizer: optimizer, None for a reference (log-prob only) actor.
        use_remove_padding: pack valid tokens into one row (position ids restart per sequence).
        dp_group: process group used to agree on the number of dynamic micro-batches.
        shared_prompt_forward: run each distinct prompt of a micro-batch once and the responses over its
            cache (``shared_prompt.py``); padded path only (packing already skips pad tokens).
        logprob_chunk_size: score only the response tokens, this many at a time through the LM head
            (``response_head.py``), instead of full ``[rows, width, V]`` logits; 0 = always full logits.
        ulysses_group: sequence-parallel process group (``ulysses_forward.py``), None for SP=1.
        grad_norm_device: run the gradient-norm reduction on this device (``verl/utils/grad_norm.py``): the
            worker sets it under ``fsdp_config.param_offload`` on GPU, where the gradients live in host
            memory and the group has no CPU backend; None = ``torch.nn.utils.clip_grad_norm_``.
        batch_sizes: rows per rank of the update (``verl/utils/batch_sizes.RankBatchSizes``, from the worker);
            None = a standalone actor (one rank, one response per prompt: the config's prompts are rows).
        pipeline: the ``PipelineModel`` over ``actor_module`` under pipeline parallelism
            (verl/utils/pipeline_parallel.py): log-probs and updates run through its stages (pipeline_actor.py).
    """

    section_cls = ActorSection  # the typed actor group a caller without a ``section`` gets built from ``config``

    def __init__(
        self,
        config,
        actor_module: torch.nn.Module,
        actor_optimizer: Optional[torch.optim.Optimizer] = None,
        use_remove_padding: bool = False,
        dp_group=None,
        device: str = "cpu",
        shared_prompt_forward: bool = False,
        logprob_chunk_size: int = 1024,
        ulysses_group=None,
        grad_norm_device=None,
        batch_sizes: Optional[RankBatchSizes] = None,
        section: Optional[ActorSection] = None,
        pipeline=None,
    ):
        self.config = config
        # The update's keys, typed: the worker passes the section it built at start (verl/workers/config_sections.py);
        # a caller without one (a test, a script) gets it built from ``config`` here.
        if actor_optimizer is None:
            self.update_config = None
        else:
            self.update_config = section if section is not None else self.section_cls.from_actor_config(config)
            # The loss, once: its name (an unknown one fails here, naming the registered ones), function and cfg
            # (its registered knob dataclass built from ``config``, else the actor's loss section).
            loss = self.update_config.loss
            self.policy_loss = core_algos.resolve_policy_loss(loss)
            self.policy_loss_fn = core_algos.get_policy_loss_fn(self.policy_loss)
            self.policy_loss_cfg = core_algos.policy_loss_config(self.policy_loss, config, loss)
        self.batch_sizes = batch_sizes
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.use_remove_padding = use_remove_padding and self._has_varlen_attention(actor_module)
        if use_remove_padding and not self.use_remove_padding:
            # WARNING: on a GPU this is the flash-attn-missing fallback; dynamic micro-batches then count padded
            # positions (_micro_batches), so the same token budget runs more, smaller micro-batches.
            logger.warning(
                "model.use_remove_padding ignored: attention %r has no varlen kernel (flash-attn, pip "
                "install flash-attn, provides it), and packing into one row would make sdpa/eager build a "
                "dense mask over all tokens (quadratic); using padded rows, dynamic micro-batches budget "
                "rows x padded width",
                getattr(getattr(actor_module, "config", None), "_attn_implementation", None),
            )
        # Ulysses SP group (ulysses_forward.py): ranks of the group hold the same rows, 1/sp of the positions each.
        self.ulysses_group = (
            ulysses_group if ulysses_group is not None and dist.get_world_size(ulysses_group) > 1 else None
        )
        if self.ulysses_group is not None:
            from verl.workers.actor.ulysses_forward import check_model

            check_model(actor_module, dist.get_world_size(self.ulysses_group))
        self.shared_prompt_forward = (
            shared_prompt_forward and not self.use_remove_padding and self.ulysses_group is None
        )
        self.dp_group = dp_group
        self.device = device
        self.nonfinite_skips = 0
        self.grad_bound_skips = 0
        self.grad_norm_device = grad_norm_device
        self.logprob_chunk_size = int(logprob_chunk_size) if supports_scoring_head(actor_module) else 0
        # A tensor-parallel head scores vocab-parallel in chunks whatever the micro-batch size (its dense forward
        # gathers the whole head weight); verl/utils/tensor_parallel.py
        self.tensor_parallel = tp_size_of(actor_module) > 1
        # pipeline parallel: the stages over ``actor_module``'s parts run every pass (pipeline_actor.py)
        self.pipeline = pipeline
        # MoE: each update micro-batch's router aux loss and load metric (moe_router.py); None for a dense model
        self.router_recorder = RouterRecorder.attach(actor_module) if actor_optimizer is not None else None

    @staticmethod
    def _has_varlen_attention(module) -> bool:
        """Packing pays off only with flash-attention's varlen kernels (GPU); sdpa/eager on CPU would
        attend over the whole packed row through a dense block-diagonal mask."""
        impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
        return impl is not None and "flash" in str(impl)

    # ------------------------------------------------------------------ forward
    def _forward_micro_batch(self, micro: dict, temperature: float, calculate_entropy: bool):
        """Return (entropy [b, L] or None, log_probs [b, L]) of the response tokens."""
        if self.pipeline is not None:  # a pass outside compute_log_prob / update_policy (e.g. an SFT update)
            raise RuntimeError(  # every pass of the actor and of ReLIFT's SFT stage runs through pipeline_actor.py
                "this pass runs the whole model in one rank; it does not run with "
                "'actor_rollout_ref.actor.pipeline_model_parallel_size' > 1"
            )
        input_ids, attention_mask = micro["input_ids"], micro["attention_mask"]
        position_ids, responses = micro["position_ids"], micro["responses"]
        # Full logits only while they are no larger than one chunk of the scoring head (small micro-batches).
        chunked = 0 < self.logprob_chunk_size and (self.tensor_parallel or self.logprob_chunk_size < input_ids.numel())
        # SP first: its forward shards the sequence and scores each rank's slice (ulysses_forward.py).
        if self.ulysses_group is not None:
            from verl.workers.actor.ulysses_forward import ulysses_response_log_probs

            return ulysses_response_log_probs(
                self.actor_module,
                micro,
                temperature,
                calculate_entropy,
                self.ulysses_group,
                packed=self.use_remove_padding,
                chunk_size=self.logprob_chunk_size if chunked else 0,
            )
        if chunked:
            log_probs, entropy = response_logprobs(
                self.actor_module,
                input_ids,
                attention_mask,
                position_ids,
                responses,
                temperature=temperature,
                chunk_size=self.logprob_chunk_size,
                with_entropy=calculate_entropy,
                packed=self.use_remove_padding,
                shared_prompt=self.shared_prompt_forward,
            )
            return entropy, log_probs
        response_length = responses.size(-1)
        logits = None
        if self.shared_prompt_forward:  # already aligned with the response tokens
            logits = shared_prompt_logits(self.actor_module, input_ids, attention_mask, position_ids, response_length)
        if logits is None:
            if self.use_remove_padding:
                logits = self._packed_logits(input_ids, attention_mask, position_ids)
            else:
                logits = self.actor_module(
                    input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
                ).logits
            # logits at t predict token t+1: the response's predictions sit one step to the left.
            logits = logits[:, -response_length - 1 : -1, :]
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        if calculate_entropy:
            log_probs, entropy = logprobs_and_entropy_from_logits(logits, responses)
            return entropy, log_probs
        return None, logprobs_from_logits(logits, responses)

    def _packed_logits(self, input_ids, attention_mask, position_ids):
        """Forward with padding removed: one packed row, position ids restarting per sequence.

        transformers detects the restarts (``find_packed_sequence_indices``) and builds a block-diagonal
        causal mask for sdpa/eager, or uses varlen kernels for flash-attention, so no compute is spent
        on pad tokens. Logits are scattered back to the padded [b, s, V] layout.
        """
        valid = attention_mask.bool()
        flat_ids = input_ids[valid].unsqueeze(0)
        flat_pos = position_ids[valid].unsqueeze(0)
        out = self.actor_module(input_ids=flat_ids, position_ids=flat_pos, attention_mask=None, use_cache=False)
        packed = out.logits[0]
        logits = packed.new_zeros(input_ids.shape + (packed.size(-1),))
        logits[valid] = packed
        return logits

    def _micro_batches(
        self, data: DataProto, keys: list[str], micro_size: int, use_dynamic_bsz: bool, max_token_len: int
    ):
        """Split ``data`` into micro-batches; returns (list of dict-of-tensors, reverse index or None)."""
        batch = data.batch.select(*keys)
        if use_dynamic_bsz:
            seq_lens = batch["attention_mask"].sum(-1).tolist()
            # The budget is per rank; an SP rank holds 1/sp of each row's tokens (verl scales it the same way).
            if self.ulysses_group is not None:
                max_token_len = max_token_len * dist.get_world_size(self.ulysses_group)
            if self.use_remove_padding:
                groups = rearrange_micro_batches_indices(seq_lens, max_token_len, dp_group=self.dp_group)
            else:  # padded rows compute at the full width: budget rows x width, not valid tokens
                groups = padded_micro_batches_indices(
                    len(seq_lens), batch["attention_mask"].size(-1), max_token_len, dp_group=self.dp_group
                )
            flat = [i for g in groups for i in g]
            micro = [{k: batch[k][g] for k in keys} for g in groups]
            return micro, get_reverse_idx(flat)
        n = batch.batch_size[0]
        return [{k: batch[k][s : s + micro_size] for k in keys} for s in range(0, n, micro_size)], None

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False):
        """Log-probs (and optionally entropy) of ``responses`` under the current weights, no grad."""
        self.actor_module.eval()
        if self.pipeline is not None:
            from verl.workers.actor.pipeline_actor import pipeline_log_probs

            return pipeline_log_probs(self, data, calculate_entropy)
        temperature = data.meta_info["temperature"]
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        micro_batches, rev = self._micro_batches(
            data,
            keys,
            data.meta_info["micro_batch_size"],
            data.meta_info["use_dynamic_bsz"],
            data.meta_info.get("max_token_len", 0),
        )
        log_probs, entropies = [], []
        # Rows that are not GRPO groups (ExGRPO's trajectory candidates) ask for the plain forward: the shared-prompt
        # forward makes two model calls only where a prompt repeats, so ranks could run different numbers of
        # FSDP forwards and wait on each other's all-gathers for ever.
        shared, self.shared_prompt_forward = (
            self.shared_prompt_forward,
            self.shared_prompt_forward and data.meta_info.get("shared_prompt_forward", True),
        )
        try:
            for mb in micro_batches:
                mb = {k: v.to(self.device) for k, v in mb.items()}
                with report_oom(mb, "compute_log_prob"):
                    ent, lp = self._forward_micro_batch(mb, temperature, calculate_entropy)
                log_probs.append(lp.cpu())
                if ent is not None:
                    entropies.append(ent.cpu())
        finally:
            self.shared_prompt_forward = shared
        log_probs = torch.cat(log_probs)
        entropy = torch.cat(entropies) if entropies else None
        if rev is not None:
            rev = torch.tensor(rev, dtype=torch.long)
            log_probs = log_probs[rev]
            entropy = entropy[rev] if entropy is not None else None
        return log_probs, entropy

    # ------------------------------------------------------------------ loss hook
    def loss_input_keys(self) -> list[str]:
        # rollout_is_weights / response_mask arrive only with rollout correction (IS weights / rejection mask)
        keys = [
            "responses",
            "input_ids",
            "attention_mask",
            "position_ids",
            "old_log_probs",
            "advantages",
            "rollout_is_weights",
            "response_mask",
        ]
        if self.update_config.use_kl_loss:
            keys.append("ref_log_prob")
        return keys

    def compute_policy_loss(self, micro: dict, log_prob, entropy, response_mask, global_steps=None, update_state=None):
        """The registered loss ``self.policy_loss`` on this micro-batch (``prefix_mask`` / ``behaviour_log_probs``
        when ``loss_input_keys`` loaded them), plus :meth:`extra_policy_loss`; returns (loss before accumulation
        scaling, metrics: the loss's own as ``actor/<name>`` and ``actor/pg_loss``, the registered loss's value).
        ``global_steps`` and ``update_state`` are the update's arguments (``update_policy``), for a subclass's
        losses that read them; verl's losses do not."""
        inputs = PolicyLossInputs(
            log_prob=log_prob,
            old_log_prob=micro["old_log_probs"],
            advantages=micro["advantages"],
            response_mask=response_mask,
            prefix_mask=micro.get("prefix_mask"),
            behaviour_log_probs=micro.get("behaviour_log_probs"),
            rollout_is_weights=micro.get("rollout_is_weights"),
        )
        if inputs.rollout_is_weights is not None and self.policy_loss not in ROLLOUT_IS_LOSSES:
            raise ValueError(
                f"algorithm.rollout_correction.rollout_is: policy loss {self.policy_loss!r} does not take "
                f"rollout_is_weights (those that do: {', '.join(sorted(ROLLOUT_IS_LOSSES))})"
            )
        pg_loss, out = self.policy_loss_fn(inputs, self.policy_loss_cfg)
        metrics = {f"actor/{k}": v.item() for k, v in out.items()}
        metrics["actor/pg_loss"] = pg_loss.item()
        extra = self.extra_policy_loss(out, metrics)
        return (pg_loss if extra is None else pg_loss + extra), metrics

    def extra_policy_loss(self, loss_metrics: dict, metrics: dict):
        """A term added to the policy loss from the loss's metric tensors (None: none; LUFFY's actor adds
        ``use_ppo_kl_loss``'s |ppo_kl|); may log into ``metrics``."""
        return None

    def entropy_coeff(self, entropy_value: torch.Tensor) -> float:
        return self.update_config.entropy_coeff

    def _regularisers(self, micro: dict, log_prob, entropy, response_mask, metrics: dict):
        """Entropy bonus and optional KL-to-reference term, added to the policy loss."""
        cfg = self.update_config
        ent = masked_mean(entropy, response_mask)
        coeff = self.entropy_coeff(ent.detach())
        loss = -coeff * ent
        metrics["actor/entropy_loss"] = ent.item()
        if cfg.use_kl_loss:
            kld = core_algos.kl_penalty(log_prob, micro["ref_log_prob"], kl_penalty=cfg.kl_loss_type)
            kl_loss = masked_mean(kld, response_mask)
            loss = loss + kl_loss * cfg.kl_loss_coef
            metrics["actor/kl_loss"] = kl_loss.item()
            metrics["actor/kl_coef"] = cfg.kl_loss_coef
        return loss

    def _micro_batch_loss(self, mb: dict, log_prob, entropy, global_steps=None, update_state=None):
        """(the micro-batch's loss before accumulation scaling, its metrics, the loss's token mask): the registered
        policy loss plus the regularisers on the micro-batch's per-token log-probs and entropy."""
        if "response_mask" in mb:  # rollout correction's rejection removed tokens from the loss
            response_mask = mb["response_mask"].float()
        else:
            response_mask = mb["attention_mask"][:, -mb["responses"].size(-1) :].float()
        if "old_log_probs" not in mb:
            # The driver skipped the recompute pass (recompute_old_log_prob=auto, single on-policy mini-batch):
            # these weights are the ones that pass would have used.
            mb["old_log_probs"] = log_prob.detach()
        else:
            mb["old_log_probs"] = fill_unknown_old_log_probs(mb["old_log_probs"], log_prob, mb.get("prefix_mask"))
        pg_loss, metrics = self.compute_policy_loss(mb, log_prob, entropy, response_mask, global_steps, update_state)
        loss = pg_loss + self._regularisers(mb, log_prob, entropy, response_mask, metrics)
        return loss, metrics, response_mask

    # ------------------------------------------------------------------ update
    def update_policy(self, data: DataProto) -> dict:
        """One training step's worth of optimizer updates on this rank's chunk; returns metric lists."""
        if self.update_config is None:
            raise RuntimeError("update_policy on an actor built without an optimizer (a log-prob-only reference)")
        cfg = self.update_config
        self.actor_module.train()
        temperature = data.meta_info["temperature"]
        # the update's arguments besides its rows: the training step and what the driver's hooks send the loss
        global_steps, update_state = data.meta_info.get("global_steps"), data.meta_info.get("update_state")
        keys = [k for k in self.loss_input_keys() if k in data.batch.keys()]
        sizes = self.batch_sizes if self.batch_sizes is not None else rank_batch_sizes(self.config)
        if "old_log_probs" not in keys and (cfg.ppo_epochs > 1 or len(data) > sizes.ppo_mini_rows):
            raise ValueError(
                "old_log_probs missing from the update batch; it may only be skipped for a single "
                "on-policy mini-batch (ppo_epochs=1, one mini-batch per rank)"
            )
        mini_size = sizes.ppo_mini_rows
        grad_accum = sizes.gradient_accumulation
        # metrics reduced over the whole step (verl/utils/step_metrics.py); the loss name picks each metric's tokens
        step_metrics = StepMetrics(cfg.metric_aggregation, getattr(self, "policy_loss", "vanilla"), grad_accum)
        for _epoch in range(cfg.ppo_epochs):
            for mini in data.select(batch_keys=keys).split(mini_size):
                micro_batches, _ = self._micro_batches(
                    mini, keys, sizes.ppo_micro_rows, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu
                )
                self.actor_optimizer.zero_grad(set_to_none=True)
                if self.pipeline is not None:  # the stages run the micro-batches (pipeline_actor.py)
                    from verl.workers.actor.pipeline_actor import pipeline_mini_batch

                    pipeline_mini_batch(
                        self, micro_batches, temperature, grad_accum, step_metrics, global_steps, update_state
                    )
                for mb in micro_batches if self.pipeline is None else ():
                    mb = {k: v.to(self.device) for k, v in mb.items()}
                    with report_oom(mb, "update_policy"):
                        with self.router_recorder.recording() if self.router_recorder else contextlib.nullcontext():
                            entropy, log_prob = self._forward_micro_batch(mb, temperature, calculate_entropy=True)
                        loss, mb_metrics, response_mask = self._micro_batch_loss(
                            mb, log_prob, entropy, global_steps, update_state
                        )
                        if self.router_recorder is not None:
                            coef = cfg.router_aux_loss_coef
                            loss = loss + self.router_recorder.loss_term(mb["attention_mask"], coef, mb_metrics)
                        (loss / grad_accum).backward()
                    step_metrics.add_micro_batch(mb_metrics, response_mask, mb.get("prefix_mask"))
                step_metrics.end_mini_batch(self._optimizer_step())
        self.actor_optimizer.zero_grad(set_to_none=True)
        metrics = step_metrics.result(self.dp_group)
        metrics["actor/nonfinite_skips"] = [self.nonfinite_skips]
        if self.update_config.skip_grad_bound is not None:
            metrics["actor/grad_bound_skips"] = [self.grad_bound_skips]
        return metrics

    def _optimizer_step(self) -> float:
        """Clip the global grad norm and step, or skip the step when the norm is not finite or above
        ``skip_grad_bound``."""
        allreduce_replicated_grads(self.actor_module)  # TP: grads each tp rank holds a part of (Qwen3 q/k norms)
        if self.grad_norm_device is not None:
            from verl.utils.grad_norm import clip_grad_norm_on_device

            # each pp stage holds other parameters: their squares sum over the pp group too
            pp = {} if self.pipeline is None else {"pp_group": self.pipeline.pp_group}
            grad_norm = clip_grad_norm_on_device(
                self.actor_module.parameters(), self.update_config.grad_clip, self.grad_norm_device, **pp
            )
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.actor_module.parameters(), max_norm=self.update_config.grad_clip
            )
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        if not math.isfinite(grad_norm):
            if self.update_config.on_nonfinite == "stop":
                raise NonFiniteLossError(f"grad norm is {grad_norm}; stopping (actor.on_nonfinite=stop)")
            self.nonfinite_skips += 1
            logger.warning(
                "grad norm is %s: skipping this optimizer step (%d skipped so far)", grad_norm, self.nonfinite_skips
            )
            self.actor_optimizer.zero_grad(set_to_none=True)
            return grad_norm
        bound = self.update_config.skip_grad_bound
        if bound is not None and grad_norm > bound:
            # as ExGRPO's and HPT's actors do (the pre-clip norm against their skip_grad_bound / max_grad_norm)
            self.grad_bound_skips += 1
            logger.warning("grad norm %.4g > actor.skip_grad_bound=%g: skipping this optimizer step", grad_norm, bound)
            self.actor_optimizer.zero_grad(set_to_none=True)
            return grad_norm
        self.actor_optimizer.step()
        return grad_norm
