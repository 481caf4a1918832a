"""The methods of LUFFY's comparison (docs/METHOD.md §6) and of its family (docs/methods.md) as tiny CPU runs, and the
overrides every run shares.

A method is a name, a label for the table, how it trains (``rl``: one trainer run; ``sft``: the SFT
trainer; ``sft_rl``: the SFT model, then an RL run) and its config in ``luffy_pool/config``. The shared
settings (model, data, steps, batch, lengths, learning rate, seeds) are applied to every method the same
way, so the methods differ only in what their config files and recipes say. A family method (HPT, SRFT, CHORD,
ExGRPO, ReLIFT, UFT, Prefix-RFT, RL-PLUS, QuestA, SDPO, SDFT) is ``tiny_cpu_luffy.yaml`` plus ``extra``: its own
recipe's keys from ``exp_scripts/train_<name>.sh``, scaled to the tiny run (``reproduce/recipes.py``); UFT trains on
the train split with its hint column. ``NOT_RUN``: the members the tiny task cannot run, with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional

from reproduce.recipes import recipe_overrides


@dataclasses.dataclass(frozen=True)
class Method:
    name: str  # CLI and folder name
    label: str  # table and legend name
    kind: str  # rl | sft | sft_rl
    config_name: str  # luffy_pool/config/<config_name>.yaml (for sft_rl: its RL part)
    # overrides of this method on top of the shared ones, from the run's settings (family methods: family_overrides)
    extra: Optional[Callable[["RunSettings"], list[str]]] = None
    train_split: str = "train"  # which split file it trains on (UFT: "train_hints", the train split + hint column)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("on_policy", "On-policy GRPO", "rl", "tiny_cpu_on_policy"),
        Method("rl_sft_loss", "RL w/ SFT loss", "rl", "tiny_cpu_rl_sft_loss"),
        Method("sft", "SFT", "sft", "tiny_cpu_sft"),
        Method("sft_rl", "SFT then RL", "sft_rl", "tiny_cpu_sft_rl"),
        Method("luffy_no_shaping", "LUFFY w/o shaping", "rl", "tiny_cpu_luffy_no_shaping"),
        Method("luffy", "LUFFY", "rl", "tiny_cpu_luffy"),
        Method("luffy_replay", "LUFFY + self-replay", "rl", "tiny_cpu_luffy_replay"),
    )
}
# The paper's central comparison: what the weak-start regime is measured with.
MAIN_METHODS = ("on_policy", "luffy", "luffy_no_shaping", "sft", "luffy_replay")
# The four LUFFY's three claims need.
CLAIMS_METHODS = ("on_policy", "luffy", "luffy_no_shaping", "sft")


def family_overrides(name: str) -> Callable[["RunSettings"], list[str]]:
    """The method's own recipe on the tiny run (``reproduce/recipes.py``): the algorithm keys of
    ``exp_scripts/train_<name>.sh`` (``algorithm.method=<name>`` among them) over tiny LUFFY's, its group size and
    updates per step scaled, and the knobs tied to the authors' batch or run length rescaled (results.md lists
    them per method)."""

    def extra(s: "RunSettings") -> list[str]:
        return recipe_overrides(name, s)

    return extra


# LUFFY's family (luffy_pool/methods/, docs/methods.md): the tiny LUFFY config with its own recipe's keys.
FAMILY = {
    "hpt": "HPT",
    "srft": "SRFT",
    "chord": "CHORD-φ",
    "exgrpo": "ExGRPO",
    "relift": "ReLIFT",
    "uft": "UFT",
    "prefix_rft": "Prefix-RFT",
    "rl_plus": "RL-PLUS",
    "questa": "QuestA",
    "sdpo": "SDPO",
    "sdft": "SDFT",
}
# Members of luffy_pool/methods/ that the tiny task cannot run, with the reason (results.md lists them).
NOT_RUN = {
    "ampo": "AMPO ranks several teachers per prompt (train_ampo.sh: up to 4 in a `targets` column, 2 guides per "
    "failed group) and grades `<answer>` tags; the tiny task has one teacher trace per problem and a boxed answer, so "
    "its multi-guidance would reduce to LUFFY's single trace",
}
METHODS.update(
    {
        name: Method(
            name, label, "rl", "tiny_cpu_luffy", family_overrides(name), "train_hints" if name == "uft" else "train"
        )
        for name, label in FAMILY.items()
    }
)
# --methods family: the family beside on-policy GRPO, LUFFY and SFT.
FAMILY_METHODS = ("sft", "on_policy", "luffy", *FAMILY)
KEYWORDS = {"all": METHODS, "main": MAIN_METHODS, "claims": CLAIMS_METHODS, "family": FAMILY_METHODS}


def parse_methods(text: str) -> list[str]:
    """A keyword of ``KEYWORDS`` (all, main, claims, family) or a comma list of method names -> names in the order
    given, each once."""
    keyword = KEYWORDS.get(text.strip())
    names = list(keyword) if keyword is not None else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(
            f"--methods: unknown method(s) {unknown}; valid: {', '.join(KEYWORDS)} or a comma list of {list(METHODS)}"
        )
    if not names:
        raise ValueError("--methods: no method given")
    return list(dict.fromkeys(names))


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every method shares; one value per flag of reproduce_tiny.py."""

    model_dir: str
    train_file: str
    test_file: str
    steps: int
    batch_size: int  # prompts per step (RL) = traces per step (SFT)
    n: int  # group size: samples per prompt
    response_length: int
    max_prompt_length: int
    lr: float
    rollout: str  # vllm | hf
    ranks: int  # FSDP ranks of the RL runs
    seed: int = 0  # run seed: data order, driver and rollout sampling (the same for every method)
    val_every: int = -1  # in-training held-out validation every K steps (-1: none; the curve of held-out accuracy)
    mini_batches: int = 2  # optimizer updates per RL step

    def __post_init__(self):
        for key in ("steps", "batch_size", "n", "response_length", "max_prompt_length", "ranks"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.rollout not in ("vllm", "hf"):
            raise ValueError(f"rollout must be vllm or hf, got {self.rollout!r}")

    @property
    def mini_batch_size(self) -> int:
        """Prompts per optimizer step: by default half the batch, i.e. two updates per step as LUFFY (128 / 64)."""
        return max(1, self.batch_size // self.mini_batches)

    @property
    def sft_micro_batch_size(self) -> int:
        """Rows per SFT forward pass: the largest divisor of the batch up to 4 (one SFT rank)."""
        return max(d for d in range(1, min(4, self.batch_size) + 1) if self.batch_size % d == 0)


def rl_overrides(s: RunSettings, out_dir: str, model_dir: str | None = None) -> list[str]:
    """Hydra overrides that put an RL method's tiny config on the shared settings and into ``out_dir``."""
    return [
        f"actor_rollout_ref.model.path={model_dir or s.model_dir}",
        f"data.train_files={s.train_file}",
        f"data.val_files={s.test_file}",
        f"data.train_batch_size={s.batch_size}",
        f"data.max_prompt_length={s.max_prompt_length}",
        f"data.max_response_length={s.response_length}",
        f"actor_rollout_ref.rollout.max_prefix_len={s.response_length}",
        f"actor_rollout_ref.rollout.n={s.n}",
        f"actor_rollout_ref.rollout.name={s.rollout}",
        f"actor_rollout_ref.actor.optim.lr={s.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s.mini_batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size={s.mini_batch_size}",
        f"trainer.n_gpus_per_node={s.ranks}",
        f"trainer.total_training_steps={s.steps}",
        # Final held-out accuracy comes from the eval pipeline; the optional in-training validation draws its curve.
        f"trainer.test_freq={s.val_every}",
        f"+trainer.val_before_train={s.val_every > 0}",
        f"data.seed={47 + s.seed}",
        f"trainer.seed={1 + s.seed}",
        f"actor_rollout_ref.rollout.seed={s.seed}",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=['console','jsonl']",
        f"trainer.default_local_dir={out_dir}",
    ]


def sft_overrides(s: RunSettings, out_dir: str) -> list[str]:
    """Overrides of ``tiny_cpu_sft.yaml``: the same traces per step, steps and lr as the RL methods."""
    return [
        f"model.path={s.model_dir}",
        f"data.train_files={s.train_file}",
        f"data.train_batch_size={s.batch_size}",
        f"data.micro_batch_size_per_gpu={s.sft_micro_batch_size}",
        f"data.max_length={s.max_prompt_length + s.response_length}",
        f"optim.lr={s.lr}",
        f"trainer.total_training_steps={s.steps}",
        f"trainer.seed={47 + s.seed}",
        "trainer.logger=['console','jsonl']",
        f"trainer.default_local_dir={out_dir}",
    ]


def needs_sft(names: Iterable[str]) -> bool:
    """The SFT stage runs when SFT itself or SFT-then-RL is asked for (its model starts SFT then RL)."""
    return any(METHODS[n].kind in ("sft", "sft_rl") for n in names)
