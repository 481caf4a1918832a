"""Read a shipped launch script (exp_scripts/train*.sh) as data: its trainer, its overrides, its switches.

A launch script is run, never re-implemented: ``script_command`` executes it with ``PYTHON`` pointing at a
shim that records the final command line (env defaults, ``exec`` chains to train.sh and trailing ``"$@"``
all apply as they would on the cluster) and exits 0. ``Recipe`` then answers what the script switches on
(SP, TP, gradient checkpointing, token budgets, ...) from the composed config, so the CPU rehearsal
(``luffy_pool.run.rehearse``) and the GPU smoke check (``exp_scripts/gpu_smoke.py --recipe``) read one recipe
the same way.

Discovery: a launch script is an ``exp_scripts/*.sh`` that runs ``"$PYTHON" -m ...`` itself or ``exec``s
another launch script of the folder (quickstart.sh runs its own venv's python on a CPU config: not one).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import tempfile
from typing import Optional, Sequence

RL_MODULES = ("verl.mix_src.main_mix_ppo", "luffy_pool.main_mix_ppo")
SFT_MODULE = "verl.trainer.fsdp_sft_trainer"
_PYTHON_CALL = re.compile(r'"\$PYTHON"\s+-m\s')
_EXEC_SCRIPT = re.compile(r'exec\s+bash\s+[^\n]*?/([A-Za-z0-9_.-]+\.sh)"')

# Keys of the RL config that are lengths or token budgets: the rehearsal divides each by one factor.
RL_LENGTH_KEYS = (
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.rollout.max_prefix_len",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.model.logprob_chunk_size",
)
# Batch sizes in rows: divided by one (other) factor so 2 steps stay small; their ratios are kept.
RL_BATCH_KEYS = (
    "data.train_batch_size",
    "data.val_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size",
    "actor_rollout_ref.rollout.max_num_seqs",  # vLLM: concurrent rows (<= max_num_batched_tokens)
)


def method_batch_keys(method_name: str) -> tuple[str, ...]:
    """A method's own batch sizes in rows (``Method.scaled_keys``), scaled with the RL batch when selected."""
    from luffy_pool.methods import get_method

    return tuple(get_method(method_name).scaled_keys)


SFT_LENGTH_KEYS = ("data.max_length",)
SFT_BATCH_KEYS = ("data.train_batch_size",)


class RecipeError(RuntimeError):
    """A launch script that cannot be read (it failed, or never called its trainer)."""


def discover_launch_scripts(exp_dir: str) -> list[str]:
    """Every launch script of ``exp_dir`` (sorted paths): runs ``"$PYTHON" -m`` or execs one that does."""
    texts = {}
    for name in sorted(os.listdir(exp_dir)):
        if name.endswith(".sh"):
            with open(os.path.join(exp_dir, name)) as f:
                texts[name] = f.read()
    found = {n for n, t in texts.items() if _PYTHON_CALL.search(t)}
    grew = True
    while grew:  # scripts that exec a launch script are launch scripts too (train_16k.sh -> train.sh)
        grew = False
        for name, text in texts.items():
            if name not in found and any(m in found for m in _EXEC_SCRIPT.findall(text)):
                found.add(name)
                grew = True
    return [os.path.join(exp_dir, n) for n in sorted(found)]


def script_command(
    script: str, env: Optional[dict] = None, timeout_s: float = 60.0, args: Sequence[str] = ()
) -> list[str]:
    """The arguments ``bash script *args`` passes to ``$PYTHON`` (e.g. ``["-m", "verl.mix_src.main_mix_ppo", ...]``)."""
    with tempfile.TemporaryDirectory(prefix="recipe_") as tmp:
        shim, out = os.path.join(tmp, "python"), os.path.join(tmp, "argv")
        with open(shim, "w") as f:
            f.write('#!/bin/sh\nprintf \'%s\\0\' "$@" > "$RECIPE_ARGV_OUT"\n')
        os.chmod(shim, 0o755)
        run_env = dict(os.environ if env is None else env, PYTHON=shim, RECIPE_ARGV_OUT=out)
        run_env.pop("RAY_STOP", None)  # reading a script must never stop a cluster
        proc = subprocess.run(["bash", script, *args], env=run_env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RecipeError(f"{script}: exited {proc.returncode} before its trainer: {tail}")
        if not os.path.exists(out):
            raise RecipeError(f"{script}: never called $PYTHON (not a launch script?)")
        with open(out, "rb") as f:
            raw = f.read()
    return [a.decode() for a in raw.split(b"\0")[:-1]]


def overrides_dict(overrides: list[str]) -> dict[str, str]:
    """``key=value`` overrides as a dict (last one wins, ``+``/``++``/``~`` prefixes dropped), flags left out."""
    out = {}
    for item in overrides:
        if item.startswith("-") or "=" not in item:
            continue
        key, value = item.split("=", 1)
        out[key.lstrip("+~")] = value
    return out


@dataclasses.dataclass
class Recipe:
    """One launch script read through its own command line."""

    script: str
    argv: list[str]  # what the script hands to $PYTHON
    module: str  # the trainer module it runs
    overrides: list[str]  # the trainer's Hydra overrides, in order
    launcher_args: dict[str, str]  # torchrun flags (SFT): --nproc_per_node etc.

    @property
    def kind(self) -> str:
        return "sft" if self.module == SFT_MODULE else "rl"

    @property
    def values(self) -> dict[str, str]:
        return overrides_dict(self.overrides)

    def composed(self):
        """The trainer's composed config (unresolved) for the script's overrides."""
        if self.kind == "sft":
            from verl.trainer.sft.config import compose_sft_config

            return compose_sft_config(self.overrides)
        from luffy_pool.config.check import prepare_overrides
        from luffy_pool.config.compose import compose_config

        return compose_config(prepare_overrides([o for o in self.overrides if not o.startswith("-")]))

    def get(self, key: str, default=None):
        from omegaconf import OmegaConf

        return OmegaConf.select(self.composed_cached, key, default=default)

    @property
    def composed_cached(self):
        if not hasattr(self, "_composed"):
            self._composed = self.composed()
        return self._composed

    @property
    def model_path(self) -> str:
        return str(self.get("model.path" if self.kind == "sft" else "actor_rollout_ref.model.path"))

    @property
    def sp(self) -> int:
        return 1 if self.kind == "sft" else int(self.get("actor_rollout_ref.actor.ulysses_sequence_parallel_size") or 1)

    @property
    def tp(self) -> int:
        if self.kind == "sft" or self.get("actor_rollout_ref.rollout.name") != "vllm":
            return 1
        return int(self.get("actor_rollout_ref.rollout.tensor_model_parallel_size") or 1)

    @property
    def world(self) -> int:
        if self.kind == "sft":
            return int(self.launcher_args.get("--nproc_per_node", 1))
        return int(self.get("trainer.nnodes")) * int(self.get("trainer.n_gpus_per_node"))

    def switches(self) -> dict:
        """The GPU-relevant switches of an RL recipe (what gpu_smoke --recipe turns on)."""
        g = self.get
        return {
            "gradient_checkpointing": bool(g("actor_rollout_ref.model.enable_gradient_checkpointing")),
            "remove_padding": bool(g("actor_rollout_ref.model.use_remove_padding")),
            "dynamic_bsz": bool(g("actor_rollout_ref.actor.use_dynamic_bsz")),
            "ppo_max_token_len_per_gpu": int(g("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")),
            "log_prob_max_token_len_per_gpu": int(g("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")),
            "ref_param_offload": bool(g("actor_rollout_ref.ref.fsdp_config.param_offload")),
            "use_ref": bool(g("actor_rollout_ref.ref.use_ref")),
            "param_dtype": str(g("actor_rollout_ref.actor.fsdp_config.param_dtype")),
            "rollout": str(g("actor_rollout_ref.rollout.name")),
            "logprob_chunk_size": int(g("actor_rollout_ref.model.logprob_chunk_size")),
            "sp": self.sp,
            "tp": self.tp,
        }

    def scalable(self, keys) -> dict[str, int]:
        """``key -> value`` for the keys (of ``keys``) that hold a positive int in the composed config and
        are not interpolations of another key (those follow theirs)."""
        from omegaconf import OmegaConf

        cfg, out = self.composed_cached, {}
        for key in keys:
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is None or leaf not in node or OmegaConf.is_interpolation(node, leaf):
                continue
            value = OmegaConf.select(cfg, key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                out[key] = value
        return out


def read_recipe(script: str, env: Optional[dict] = None, args: Sequence[str] = ()) -> Recipe:
    """Run ``script`` (with ``args`` as its ``"$@"``) through the shim and split its command line into trainer
    module and overrides."""
    if not os.path.isfile(script):
        raise RecipeError(f"launch script {script}: no such file")
    argv = script_command(script, env, args=args)
    launcher: dict[str, str] = {}
    rest = list(argv)
    if rest[:2] in (
        ["-m", "torch.distributed.run"],
        ["-m", "verl.trainer.sft.launch"],
    ):  # launch.py: torchrun + exit codes
        rest = rest[2:]
        while rest and rest[0] != "-m":
            flag = rest.pop(0)
            if flag.startswith("--") and "=" in flag:
                k, v = flag.split("=", 1)
                launcher[k] = v
            elif rest and not rest[0].startswith("-"):
                launcher[flag] = rest.pop(0)
            else:
                launcher[flag] = "1"
    if len(rest) < 2 or rest[0] != "-m":
        raise RecipeError(f"{script}: $PYTHON {' '.join(argv[:3])} ... is not `-m <trainer module>`")
    module = rest[1]
    if module not in RL_MODULES + (SFT_MODULE,):
        raise RecipeError(
            f"{script}: runs {module}, not a trainer of this project ({', '.join(RL_MODULES + (SFT_MODULE,))})"
        )
    return Recipe(script=script, argv=argv, module=module, overrides=rest[2:], launcher_args=launcher)


def divisible_heads(sp: int, tp: int, min_kv: int = 2) -> tuple[int, int]:
    """(attention heads, kv heads) of a tiny model whose heads split over SP and TP (kv heads too)."""
    kv = math.lcm(sp, tp)
    kv *= -(-min_kv // kv)
    return 2 * kv, kv


def rehearsal_world(sp: int, tp: int, ranks: int = 4) -> int:
    """``ranks``, or the smallest multiple of lcm(SP, TP) above it."""
    unit = math.lcm(sp, tp)
    return unit * -(-ranks // unit)
