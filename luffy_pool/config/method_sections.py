"""The family methods' knob groups ``algorithm.<method>`` (ExGRPO, HPT, SRFT, CHORD, Prefix-RFT, UFT, ReLIFT): one
frozen section per method, nested in ``AlgorithmSection`` (luffy_pool/config/sections.py, which re-exports them).
Each field is declared once here, next to its YAML default and comment in luffy_pool/config/mix_ppo_trainer.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl.utils.config_section import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, Bound, key


def _from(module: str, name: str):
    def values():
        import importlib

        return tuple(getattr(importlib.import_module(module), name))

    return values


@dataclass(frozen=True)
class ExgrpoSection:
    """``algorithm.exgrpo``: ExGRPO's experience pool, batch mix and phase switch (luffy_pool/methods/exgrpo.py)."""

    start_solved_ratio: float = key(bounds=UNIT)
    experience_ratio: float = key(bounds=UNIT)
    lbound: int = key(bounds=NON_NEGATIVE)
    rbound: int = key(bounds=NON_NEGATIVE)
    bucket_weighting: str = key(choices=("normal", "linear", "sqrt", "linear_clip", "uniform"))
    traj_metric: str = key(choices=("ent", "ppl", "random"))
    traj_select: str = key(choices=("argmin", "argmax"))
    sample_range: str = key(choices=("all", "first_half", "last_half"))
    is_correct: bool = key()
    metric_impl: str = key(choices=("paper", "original"))
    retire_all_correct: bool = key()
    max_trajectories_per_question: int = key(bounds=NON_NEGATIVE)


@dataclass(frozen=True)
class HptSection:
    """``algorithm.hpt``: HPT's gate (luffy_pool/methods/hpt.py)."""

    switch_gate: int = key(bounds=NON_NEGATIVE)


@dataclass(frozen=True)
class SrftSection:
    """``algorithm.srft``: SRFT's entropy weights (luffy_pool/methods/srft.py)."""

    srft_type: str = key(choices=_from("luffy_pool.algorithm.family.srft", "SRFT_TYPES"))
    sft_weight_scale: float = key(bounds=NON_NEGATIVE)
    rl_pos_weight_scale: float = key(bounds=NON_NEGATIVE)


@dataclass(frozen=True)
class ChordSection:
    """``algorithm.chord``: CHORD's μ schedule and SFT term (luffy_pool/methods/chord.py)."""

    mu_warmup_steps: int = key(bounds=NON_NEGATIVE)
    mu_decay_steps: int = key(bounds=NON_NEGATIVE)
    mu_peak: float = key(bounds=UNIT)
    mu_valley: float = key(bounds=UNIT)
    enable_phi_function: bool = key()
    clip_ratio_c: float = key(bounds=POSITIVE)
    use_token_level_loss_in_sft: bool = key()


@dataclass(frozen=True)
class PrefixRftSection:
    """``algorithm.prefix_rft``: Prefix-RFT's prefix schedule and entropy mask (luffy_pool/methods/prefix_rft.py)."""

    ratio_start: float = key(bounds=UNIT)
    ratio_end: float = key(bounds=UNIT)
    decay_steps: Optional[int] = key(bounds=AT_LEAST_ONE)
    prefix_entropy_top_frac: float = key(bounds=UNIT)


@dataclass(frozen=True)
class UftSection:
    """``algorithm.uft``: UFT's hint schedule and hint NLL (luffy_pool/methods/uft.py)."""

    hint_key: str = key()
    schedule: str = key(choices=_from("luffy_pool.algorithm.family.uft", "SCHEDULES"))
    total_training_steps_hint: int = key(bounds=AT_LEAST_ONE)
    lower_prob: float = key(bounds=UNIT)
    upper_prob: float = key(bounds=UNIT)
    max_segments: int = key(bounds=AT_LEAST_ONE)
    hint_sft_coef: float = key(bounds=NON_NEGATIVE)


@dataclass(frozen=True)
class ReliftSection:
    """``algorithm.relift``: ReLIFT's hard-question buffer and interleaved SFT stage (luffy_pool/methods/relift.py)."""

    sft_data_size: int = key(bounds=Bound(lambda v: v == -1 or v > 0, "must be -1 (off) or > 0"))
    sft_mini_batch_size: int = key(bounds=POSITIVE)
    sft_micro_batch_size: int = key(bounds=POSITIVE)
    sft_epochs: int = key(bounds=POSITIVE)
    sft_lr: float = key(bounds=POSITIVE)
    sft_grad_clip: float = key(bounds=POSITIVE)
    sft_entropy_coeff: float = key()

    def validate(self) -> list[str]:
        errors = []
        if self.sft_data_size > 0 and self.sft_data_size % self.sft_mini_batch_size:  # theirs asserts both
            errors.append(
                f"'algorithm.relift.sft_data_size'={self.sft_data_size} must be a multiple of "
                f"'algorithm.relift.sft_mini_batch_size'={self.sft_mini_batch_size}"
            )
        if self.sft_mini_batch_size % self.sft_micro_batch_size:
            errors.append(
                f"'algorithm.relift.sft_mini_batch_size'={self.sft_mini_batch_size} must be a multiple of "
                f"'algorithm.relift.sft_micro_batch_size'={self.sft_micro_batch_size}"
            )
        return errors
