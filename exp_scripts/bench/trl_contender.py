"""TRL's ``GRPOTrainer`` on the benchmark's work, configured the way a user would run it on a CPU.

One optimizer step consumes 8 prompts x 8 completions: ``per_device_train_batch_size=64``,
``num_generations=8``, ``gradient_accumulation_steps=1`` (so one generation per step), plain HF
``generate`` (no vLLM), ``max_completion_length``, ``beta=0`` (no reference model, like ours), fp32, no
gradient checkpointing (the model is tiny), ``min_new_tokens`` = the cap in the fixed-length case. A
``TrainerCallback`` closes a step at every ``on_step_end``; generation time comes from wrapping the
model's ``generate`` and generated tokens from the ``completion_ids`` TRL hands the reward function.
"""

from __future__ import annotations

import os
import time

from bench.common import BenchSpec, load_task_rows, make_grader, set_torch_threads, write_result
from bench.cpu_load import StepRecorder


def trl_config_kwargs(spec: BenchSpec, output_dir: str) -> dict:
    """``GRPOConfig`` arguments: the same work per optimizer step as the other contenders."""
    kwargs = dict(
        output_dir=output_dir,
        per_device_train_batch_size=spec.prompts * spec.samples,
        gradient_accumulation_steps=1,
        num_generations=spec.samples,
        max_completion_length=spec.max_new_tokens,
        use_vllm=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        learning_rate=spec.lr,
        beta=0.0,
        max_grad_norm=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        max_steps=spec.warmup + spec.steps,
        seed=spec.seed,
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if spec.fixed:
        kwargs["generation_kwargs"] = {"min_new_tokens": spec.max_new_tokens}
    return kwargs


def run(spec: BenchSpec, result_path: str) -> None:
    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise SystemExit(
            "TRL is not installed: `.venv/bin/pip install -r requirements-bench.txt` "
            f"(the benchmark compares against trl's GRPOTrainer): {exc}"
        ) from exc
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    threads = set_torch_threads(spec.threads)
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(spec.model_dir)
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    grader = make_grader(tok)
    per_step = {"gen_s": 0.0, "reward_s": 0.0, "gen_tokens": 0, "reward_sum": 0.0, "rows": 0}

    def reward_fn(prompts, completions, completion_ids, ground_truth, data_source, **_):
        t0 = time.perf_counter()
        texts = tok.batch_decode(completion_ids, skip_special_tokens=False)
        scores, _ = grader.score_texts(list(zip(data_source, texts, ground_truth, [None] * len(texts))))
        per_step["reward_s"] += time.perf_counter() - t0
        per_step["gen_tokens"] += sum(len(ids) for ids in completion_ids)
        per_step["reward_sum"] += sum(scores)
        per_step["rows"] += len(scores)
        return scores

    original_generate = model.generate

    def timed_generate(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original_generate(*args, **kwargs)
        finally:
            per_step["gen_s"] += time.perf_counter() - t0

    model.generate = timed_generate
    recorder = StepRecorder()

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            recorder.restart()

        def on_step_end(self, args, state, control, **kwargs):
            recorder.mark(
                gen_s=per_step["gen_s"],
                reward_s=per_step["reward_s"],
                gen_tokens=per_step["gen_tokens"],
                reward_mean=per_step["reward_sum"] / max(1, per_step["rows"]),
            )
            per_step.update(gen_s=0.0, reward_s=0.0, gen_tokens=0, reward_sum=0.0, rows=0)

    rows = load_task_rows(spec.task_dir)
    dataset = Dataset.from_list(rows)
    cfg = GRPOConfig(**trl_config_kwargs(spec, os.path.join(spec.work_dir, "trl_out")))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=cfg,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[StepClock()],
    )
    startup_s = time.perf_counter() - start
    trainer.train()
    grader.close()
    if len(recorder.steps) != spec.warmup + spec.steps:
        raise RuntimeError(f"TRL ran {len(recorder.steps)} optimizer steps, expected {spec.warmup + spec.steps}")
    import trl

    write_result(
        result_path,
        spec,
        recorder.steps,
        startup_s=startup_s,
        torch_threads=threads,
        trl_version=trl.__version__,
        loss_type=cfg.loss_type,
        notes="TRL GRPOTrainer, HF generate, beta=0, 1 optimizer step per generation",
    )
