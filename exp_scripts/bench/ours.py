"""Our trainer on the benchmark's work: ``luffy_pool.run.launcher.build_trainer`` + ``fit`` through Ray.

The config is ``mix_ppo_trainer.yaml`` with LUFFY's loss settings made purely on-policy (prefix ratio
0, so the work equals TRL's): 8 prompts x n=8, 64 response tokens, one mini-batch (one optimizer
update) per step, no reference model, no validation, no checkpoint. A step ends when the trainer hands
its metrics to the tracker, so the step time is the wall time between two ``tracker.log`` calls
(everything the driver does per step); verl's own ``timing_s/*`` are kept next to it. The worker
group's ``generate_sequences`` is wrapped to keep the per-rank ``rollout_stats`` (engine time)
that the trainer drops; the weight push is its own stage (``timing_s/update_weights``).
"""

from __future__ import annotations

import os
import time

from bench.common import BenchSpec, REWARD_IMPL_VERSION, write_result
from bench.cpu_load import StepRecorder


def trainer_overrides(spec: BenchSpec) -> list[str]:
    """Hydra overrides of ``mix_ppo_trainer`` for one benchmark run."""
    task, out = spec.task_dir, os.path.join(spec.work_dir, "ours_out")
    return [
        f"data.train_files={task}/train.parquet",
        f"data.val_files={task}/test.parquet",
        f"data.train_batch_size={spec.prompts}",
        f"data.max_prompt_length={spec.max_prompt_length}",
        f"data.max_response_length={spec.max_new_tokens}",
        f"data.reward_impl_version={REWARD_IMPL_VERSION}",
        f"data.seed={spec.seed}",
        f"actor_rollout_ref.model.path={spec.model_dir}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.optim.lr={spec.lr}",
        # One mini-batch = the whole step's prompts: exactly one optimizer update per step.
        f"actor_rollout_ref.actor.ppo_mini_batch_size={spec.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size={spec.prompts}",
        "actor_rollout_ref.actor.use_off_policy_loss=True",
        "actor_rollout_ref.actor.off_policy_reshape=p_div_p_0.1",
        "actor_rollout_ref.actor.loss_remove_token_mean=True",
        "actor_rollout_ref.actor.loss_remove_clip=True",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.ref.use_ref=False",
        # As the tiny CPU configs: a small model keeps gathered parameters from forward to backward.
        "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=False",
        "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=1000000",
        "actor_rollout_ref.rollout.weight_sync_packed=True",
        "ray_init.max_direct_call_object_size=2000000",
        f"actor_rollout_ref.rollout.name={spec.rollout}",
        f"actor_rollout_ref.rollout.dtype={spec.rollout_dtype}",
        f"actor_rollout_ref.rollout.n={spec.samples}",
        f"actor_rollout_ref.rollout.ignore_eos={spec.fixed}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size={spec.prompts}",
        # Pure on-policy: the off-policy slot gets a 0-token prefix, i.e. plain generation.
        "actor_rollout_ref.rollout.n_prefix=1",
        "actor_rollout_ref.rollout.min_prefix_ratio=0.0",
        "actor_rollout_ref.rollout.max_prefix_ratio=0.0",
        f"actor_rollout_ref.rollout.max_prefix_len={spec.max_new_tokens}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.seed={spec.seed}",
        "algorithm.adv_estimator=grpo",
        "algorithm.grpo_use_std=False",
        "algorithm.kl_ctrl.kl_coef=0.0",
        f"reward.num_workers={spec.reward_workers}",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={spec.ranks}",
        f"trainer.total_training_steps={spec.warmup + spec.steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=['jsonl']",
        f"trainer.default_local_dir={out}",
        "+trainer.val_before_train=False",
        "trainer.project_name=bench_step",
        f"trainer.experiment_name={spec.case}_{spec.rollout}_{spec.ranks}rank",
    ] + list(spec.ours_overrides)


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    from luffy_pool.config.check import BASE_CONFIG_NAME, CONFIG_DIR, check_config

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = hydra_compose(config_name=BASE_CONFIG_NAME, overrides=overrides)
    check_config(config)
    return config


class _RecordingTracker:
    """Stands in for the trainer's tracker: closes a step at each ``log`` call, then forwards it."""

    def __init__(self, inner, recorder: StepRecorder, rollout_stats: list):
        self.inner, self.recorder, self.rollout_stats = inner, recorder, rollout_stats

    def log(self, data: dict, step: int) -> None:
        metrics = {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}
        workers = self.rollout_stats[-1] if self.rollout_stats else []
        self.recorder.mark(
            gen_s=metrics.get("timing_s/gen"),
            reward_s=metrics.get("timing_s/reward"),
            gen_tokens=int(metrics.get("rollout/engine_tokens", 0)),
            metrics=metrics,
            rollout_workers=workers,
        )
        if self.inner is not None:
            self.inner.log(data, step)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _keep_rollout_stats(wg, sink: list) -> None:
    """Wrap ``wg.generate_sequences`` to copy each call's per-rank worker timings into ``sink``."""
    original = wg.generate_sequences

    def generate_sequences(*args, **kwargs):
        out = original(*args, **kwargs)
        stats = out.meta_info.get("rollout_stats") or []
        sink.append(
            [
                {k: float(v) for k, v in s.items() if k.startswith("timing_s/") and isinstance(v, (int, float))}
                for s in stats
            ]
        )
        return out

    wg.generate_sequences = generate_sequences


def run(spec: BenchSpec, result_path: str) -> None:
    import ray

    from luffy_pool.run.launcher import build_trainer

    start = time.perf_counter()
    config = compose(trainer_overrides(spec))
    trainer, close = build_trainer(config)
    startup_s = time.perf_counter() - start
    rollout_stats: list = []
    try:
        _keep_rollout_stats(trainer.wg, rollout_stats)
        recorder = StepRecorder()
        trainer.tracker = _RecordingTracker(trainer.tracker, recorder, rollout_stats)
        recorder.restart()
        trainer.fit()
    finally:
        close()
        ray.shutdown()
    steps = recorder.steps
    if len(steps) != spec.warmup + spec.steps:
        raise RuntimeError(f"our trainer logged {len(steps)} steps, expected {spec.warmup + spec.steps}")
    for s in steps:
        unexpected = [k for k in ("timing_s/testing", "timing_s/save_checkpoint") if k in s["metrics"]]
        if unexpected:
            raise RuntimeError(f"a timed step included {unexpected}: validation/checkpointing must be off")
    write_result(
        result_path,
        spec,
        steps,
        startup_s=startup_s,
        torch_threads=1,
        notes=f"Ray + FSDP2 ({spec.ranks} rank(s), 1 thread each) + {spec.rollout} rollout",
    )
