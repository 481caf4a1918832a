"""The GPU smoke's numeric checks on real training steps, and its split-engine run (``exp_scripts/gpu_smoke.py``).

- packed vs padded: one micro-batch of a step's rollout scored by the actor padded (one row per sequence), packed
  (``model.use_remove_padding``: the valid tokens in one row, position ids restarting per sequence; flash-attn's
  varlen kernels on a GPU that has them, sdpa's block-diagonal mask otherwise) and packed through the chunked
  scoring head (``verl/workers/actor/response_head.py``): the same weights must give the same log-probs, up to
  the rounding of the compute dtype.
- engine vs actor: right after the step's weight push, the engine's log-probs of the tokens it sampled
  (``rollout.calculate_log_probs``) against the actor's on the same tokens. A push that lost, reordered or
  mis-cast a tensor shows as an O(1) gap (vllm_rollout/weight_groups.py measured 2.6 for a split decoder layer);
  bf16 kernels of two frameworks differ by ~1e-3.
- split engines (``hybrid_engine=False``, ``rollout_pipeline=one_step_off``): a short run through the launcher and
  Ray, one actor rank and one engine rank, with the engine-vs-actor gap on the steps generated from the weights
  the actor still holds (staleness 0: the first; later batches are launched before an update), then on one batch
  generated right after a push of the trained weights over the weight group.

Each check is a name, a bool and a detail line; ``gpu_smoke.main`` prints PASS/FAIL per check.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch

# Bounds on |log p_packed - log p_padded| per response token, by the actor's compute dtype. bf16: verl's own
# rmpad-vs-padded test holds the masked mean within 1e-2 (volcengine/verl tests/models/test_transformer.py);
# single tokens of a 28-layer model vary more, so the max gets 0.1. fp32 (CPU): both orders of summation round
# at ~1e-7 relative; 1e-4 leaves room for a long sequence.
PACKED_BOUNDS = {"bf16": {"max_abs": 0.1, "mean_abs": 1e-2}, "fp32": {"max_abs": 1e-4, "mean_abs": 1e-5}}
# Bound on |mean(log p_actor - log p_engine)| and on the k3 estimate of KL(engine || actor) over the engine's
# sampled tokens. bf16: ~1e-3 is what two frameworks' kernels give (verl logs the same gap as
# training/rollout_probs_diff_mean, ~3e-3 in probability); a broken push gives O(1). fp32 (CPU): the engine
# and the actor run the same arithmetic up to summation order.
KL_BOUNDS = {"bf16": 0.05, "fp32": 1e-3}
LOG_PROB_KEYS = ["responses", "input_ids", "attention_mask", "position_ids"]
PACKED_ROWS = 4  # one micro-batch: rows of different prompts, so a packed row holds 4 sequences
SPLIT_OVERRIDES = [
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=1",
    "trainer.rollout_pipeline=one_step_off",
    "trainer.save_freq=-1",
]


def precision(dtype) -> str:
    """``bf16`` for any 16-bit float (the loose bounds), else ``fp32``."""
    return "bf16" if str(dtype).replace("torch.", "") in ("bfloat16", "float16", "bf16", "fp16") else "fp32"


def masked_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict:
    """``max_abs`` and ``mean_abs`` of ``a - b`` over the tokens where ``mask`` is set, and their count."""
    d = (a.double() - b.double())[mask.bool()].abs()
    if d.numel() == 0:
        return {"max_abs": float("nan"), "mean_abs": float("nan"), "tokens": 0}
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "tokens": int(d.numel())}


def engine_actor_gap(actor_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> dict:
    """The gap between the actor's and the engine's log-probs of the engine's sampled tokens (``mask``).

    ``mean_actor_minus_engine``: mean of log p_actor - log p_engine (k1; the negated KL(engine || actor) estimate);
    ``kl_k3``: mean of r - 1 - log r with r = p_actor / p_engine, KL(engine || actor) estimated without
    cancelling signs (Schulman, "Approximating KL divergence", 2020); ``prob_diff_mean``: mean |p_actor - p_engine|,
    verl's training/rollout_probs_diff_mean (volcengine/verl verl/trainer/ppo/ray_trainer.py)."""
    from verl.trainer.ppo.rollout_corr import mismatch_metrics

    m = mask.bool()
    if not m.any():
        return {
            "mean_actor_minus_engine": float("nan"),
            "kl_k3": float("nan"),
            "max_abs": float("nan"),
            "prob_diff_mean": float("nan"),
            "tokens": 0,
        }
    # the rollout-correction metrics with the actor as pi_old and the engine as pi_rollout (k1 = -kl)
    actor, engine = (torch.where(m, x.double(), 0.0) for x in (actor_lp, engine_lp))  # no NaN from outside the mask
    kl = mismatch_metrics(actor, engine, m.double())
    d = actor_lp.double()[m] - engine_lp.double()[m]
    probs = (actor_lp.double()[m].exp() - engine_lp.double()[m].exp()).abs()
    return {
        "mean_actor_minus_engine": -kl["kl"],
        "kl_k3": kl["k3_kl"],
        "max_abs": float(d.abs().max()),
        "prob_diff_mean": float(probs.mean()),
        "tokens": int(d.numel()),
    }


def gap_within(gap: dict, bound: float) -> bool:
    """Both KL estimates finite and within ``bound`` (no token compared is a failure, not a pass)."""
    k1, k3 = gap["mean_actor_minus_engine"], gap["kl_k3"]
    return gap["tokens"] > 0 and math.isfinite(k1) and math.isfinite(k3) and abs(k1) <= bound and k3 <= bound


def packed_within(gaps: dict, bounds: dict) -> bool:
    """Every packed variant's gap to the padded log-probs finite and within ``bounds``."""
    return bool(gaps) and all(
        g["tokens"] > 0 and g["max_abs"] <= bounds["max_abs"] and g["mean_abs"] <= bounds["mean_abs"]
        for g in gaps.values()
    )


@contextlib.contextmanager
def actor_forward(actor, packed: bool, chunk_size: int):
    """The actor's forward switched to padded/packed rows and dense/chunked scoring (restored after): one micro-batch
    through the code the update runs, only the switch changed. The shared-prompt forward stays off in all."""
    saved = actor.use_remove_padding, actor.logprob_chunk_size, actor.shared_prompt_forward
    actor.use_remove_padding, actor.logprob_chunk_size, actor.shared_prompt_forward = packed, chunk_size, False
    try:
        yield
    finally:
        actor.use_remove_padding, actor.logprob_chunk_size, actor.shared_prompt_forward = saved


def micro_batch(batch, rows: int = PACKED_ROWS):
    """``rows`` rows spread over ``batch`` (different prompts and slots), the log-prob inputs only."""
    from verl.protocol import DataProto

    idx = torch.linspace(0, len(batch) - 1, min(rows, len(batch))).round().long()
    return DataProto.from_dict(
        tensors={k: batch.batch[k][idx] for k in LOG_PROB_KEYS},
        meta_info={"temperature": 1.0, "micro_batch_size": len(idx), "use_dynamic_bsz": False},
    )


def packed_vs_padded(actor, data) -> dict:
    """{variant: masked_gap to the padded log-probs}: ``packed`` (dense logits) and ``packed_chunked_head`` (the
    scoring head in chunks of a quarter of the micro-batch's positions, so it runs more than one chunk), over the
    response tokens of ``data`` (one micro-batch)."""
    mask = data.batch["attention_mask"][:, -data.batch["responses"].size(-1) :]

    def score(packed: bool, chunk: int) -> torch.Tensor:
        with actor_forward(actor, packed, chunk):
            return actor.compute_log_prob(data)[0]

    padded = score(False, 0)
    gaps = {"packed": masked_gap(score(True, 0), padded, mask)}
    if actor.logprob_chunk_size > 0:  # 0: the model's head cannot be swapped (response_head.supports_scoring_head)
        chunk = max(1, data.batch["input_ids"].numel() // 4)
        gaps["packed_chunked_head"] = masked_gap(score(True, chunk), padded, mask)
    return gaps


class StepWatch:
    """Sees each training step's batch right after its generation (it wraps the trainer's ``_train_on``, which the
    hybrid and the split step both call then) and measures the engine-vs-actor gap there; with an in-process
    ``actor``, also packed vs padded on the first step's micro-batch."""

    def __init__(self, trainer, dtype, actor=None):
        self.trainer, self.actor, self.prec = trainer, actor, precision(dtype)
        self.steps: list = []
        self.packed: Optional[dict] = None
        original = trainer._train_on

        def train_on(batch, ratios, metrics, timing):
            self.see(batch, metrics)
            return original(batch, ratios, metrics, timing)

        trainer._train_on = train_on

    def see(self, batch, metrics: dict) -> None:
        from luffy_pool.trainer.rollout_source import STALENESS_METRIC

        t = batch.batch
        if "rollout_log_probs" not in t.keys():
            raise RuntimeError("the smoke's KL check needs actor_rollout_ref.rollout.calculate_log_probs=True")
        out = self.trainer.wg.compute_log_prob(batch.select(batch_keys=LOG_PROB_KEYS))
        sampled = t["response_mask"].bool() & ~t["prefix_mask"].bool()  # the engine's own tokens
        gap = engine_actor_gap(out.batch["old_log_probs"], t["rollout_log_probs"], sampled)
        gap.update(step=self.trainer.global_steps, staleness=int(metrics.get(STALENESS_METRIC, 0)))
        self.steps.append(gap)
        if self.actor is not None and self.packed is None:
            self.packed = packed_vs_padded(self.actor, micro_batch(batch))

    def checks(self) -> dict:
        """{name: (ok, detail)}: the gap on every step generated from the weights the actor held (staleness 0);
        packed vs padded when it ran."""
        bound = KL_BOUNDS[self.prec]
        fresh = [s for s in self.steps if s["staleness"] == 0]
        worst = max(fresh, key=lambda s: max(abs(s["mean_actor_minus_engine"]), s["kl_k3"]), default=None)
        out = {
            "engine_vs_actor_kl": (
                bool(fresh) and all(gap_within(s, bound) for s in fresh),
                f"{self.prec} bound {bound}, worst of {len(fresh)} step(s) at staleness 0: "
                + (_gap_line(worst) if worst else "none"),
            )
        }
        if self.packed is not None:
            b = PACKED_BOUNDS[self.prec]
            out["packed_vs_padded"] = (
                packed_within(self.packed, b),
                f"{self.prec} bounds {b}; "
                + "; ".join(
                    f"{k} max_abs {g['max_abs']:.3g} mean_abs {g['mean_abs']:.3g} ({g['tokens']} tokens)"
                    for k, g in self.packed.items()
                ),
            )
        return out

    def summary(self) -> dict:
        return {"precision": self.prec, "engine_vs_actor": self.steps, "packed_vs_padded": self.packed}


def _gap_line(g: dict) -> str:
    return (
        f"step {g['step']}: mean(log p_actor - log p_engine) {g['mean_actor_minus_engine']:.3g}, k3 "
        f"{g['kl_k3']:.3g}, max_abs {g['max_abs']:.3g}, prob diff {g['prob_diff_mean']:.3g} ({g['tokens']} tokens)"
    )


def generate_after_push(trainer, watch: StepWatch) -> None:
    """After the run: push the trained weights to the split engines, generate the next batch from them (the
    trainer's own rollout stages, no update) and measure the gap on it, as a step at staleness 0."""
    from verl.protocol import DataProto

    step = trainer.global_steps + 1
    metrics = trainer.rollout.push()
    batch, gen_batch, ratios, stage = trainer.prepare_rollout(DataProto.from_single_dict(trainer._next_batch()), step)
    metrics.update(stage)
    batch, _, metrics = trainer.merge_rollout(
        batch, trainer.rollout_wg.generate_sequences(gen_batch), ratios, metrics, step
    )
    trainer.global_steps = step
    watch.see(batch, metrics)


def split_skip_reason(choice: str, device: str, gpus: int, recipe: Optional[str]) -> Optional[str]:
    """Why the split run does not run (None: it runs). ``auto`` runs it where the machine holds one actor rank and
    one engine rank on devices of their own (any CPU; 2 GPUs), and not with ``--recipe`` (whose switches the hybrid
    runs check); ``on`` always; ``off`` never."""
    if choice == "off":
        return "--split off"
    if choice == "on":
        return None
    if recipe:
        return "--recipe runs the recipe's switches on the hybrid engine (--split on adds the split run)"
    if device == "cuda" and gpus < 2:
        return f"split engines need 2 GPUs (1 actor rank + 1 engine rank), {gpus} seen"
    return None


def run_split(config, dtype) -> dict:
    """Train ``config`` (the smoke's overrides + ``SPLIT_OVERRIDES``) through the launcher, as ``main_mix_ppo`` does;
    the result: steps with their staleness and gap, checks as ``StepWatch.checks`` plus ``split_trained``."""
    import ray

    from luffy_pool.run.launcher import build_trainer

    started = not ray.is_initialized()
    trainer, close = build_trainer(config)
    try:
        watch = StepWatch(trainer, dtype)
        before = trainer.wg.actor_weight_fingerprint()
        trainer.fit()
        after = trainer.wg.actor_weight_fingerprint()
        trained = [s["staleness"] for s in watch.steps]
        generate_after_push(trainer, watch)
    finally:
        close()
        if started and ray.is_initialized():
            ray.shutdown()
    checks = watch.checks()
    want = [0] + [1] * (int(trainer.last_step()) - 1)  # one_step_off: each later batch launched before an update
    moved = all(abs(a - b) > 1e-12 * max(1.0, abs(b)) for a, b in zip(after, before))
    checks["split_trained"] = (
        trained == want and moved and trainer.rollout_wg is not None,
        f"staleness per step {trained} (want {want}), actor weights changed: {moved}",
    )
    return {
        "steps": watch.steps,
        "precision": watch.prec,
        "checks": {k: ok for k, (ok, _) in checks.items()},
        "details": {k: d for k, (_, d) in checks.items()},
    }
