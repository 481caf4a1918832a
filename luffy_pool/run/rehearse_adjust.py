"""What a rehearsal adjusts once the tiny model and task exist (luffy_pool/run/rehearse.py): the prompt length and
token budgets raised to hold the real chat template's longest prompt, and an MoE model's rollout on CPU moved to the HF
engine (vLLM's CPU build takes no weight pushes into its experts)."""

from __future__ import annotations

import os

TOKEN_BUDGET_KEYS = (
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
)


def longest_templated_prompt(model_dir: str, data_dir: str) -> int:
    """Tokens of the tiny task's longest prompt under the tiny model's chat template, as the RL dataset templates it
    (a real model's template adds its own turn tokens and default system prompt: Qwen2.5-Math's is ~40 tokens)."""
    from verl.utils.data_format import read_records
    from verl.utils.tokenizer import hf_tokenizer

    tok = hf_tokenizer(model_dir)
    longest = 0
    for name in ("openr1.parquet", "valid.parquet"):
        for record in read_records(os.path.join(data_dir, name)):
            messages = [{"role": m["role"], "content": m["content"]} for m in record["prompt"]]
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            longest = max(longest, len(tok(text, add_special_tokens=False)["input_ids"]))
    return longest


def fit_prompt_length(overrides: list[str], report: dict, longest: int) -> list[str]:
    """``overrides`` with ``data.max_prompt_length`` raised to hold ``longest`` tokens (rounded up to 8) when the
    scaled value does not, and the token budgets raised by as much, so each still holds the sequences it held;
    the change goes in ``report["lengths"]``."""
    values = dict(o.split("=", 1) for o in overrides if "=" in o)
    key = "data.max_prompt_length"
    if key not in values or int(values[key]) >= longest:
        return overrides
    old, new = int(values[key]), -(-longest // 8) * 8
    raised = {key: new, **{k: int(values[k]) + new - old for k in TOKEN_BUDGET_KEYS if k in values}}
    for k, v in raised.items():
        report["lengths"].setdefault(k, [None, int(values[k])])[1] = v
    report["prompt_for_template"] = {"tokens": longest, "max_prompt_length": new}
    return [
        f"{o.split('=', 1)[0]}={raised[o.split('=', 1)[0]]}" if o.split("=", 1)[0] in raised else o for o in overrides
    ]


def moe_rollout_on_cpu(recipe, real_config, device: str, report: dict, overrides: list[str]) -> list[str]:
    """An MoE model rolls out with the HF engine on CPU: vLLM's CPU build takes no weight pushes into its experts
    (vllm_rollout.py ``_cpu_moe_refusal``)."""
    moe = real_config and any(real_config.get(f) for f in ("num_experts", "num_local_experts", "n_routed_experts"))
    if not moe or device != "cpu" or recipe.kind != "rl" or recipe.get("actor_rollout_ref.rollout.name") != "vllm":
        return overrides
    report["rollout_engine"] = "vllm -> hf (MoE on CPU: vLLM's CPU build takes no weight pushes into experts)"
    return overrides + ["actor_rollout_ref.rollout.name=hf"]
