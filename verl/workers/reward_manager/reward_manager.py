"""Reward manager of the trainer: DataProto -> token-level scores, graded in a timed process pool.

For every row (off-policy rows included, docs/METHOD.md §1.4) it decodes the valid response tokens with
special tokens kept, grades ``(data_source, text, ground_truth, extra_info)`` in a ``ScoringPool``
(per-item timeout, timed-out items score 0), optionally asks an LLM judge about wrong answers and
applies the format reward, and writes each score at index ``valid_len - 1`` of a zero ``[N, L]``
float32 tensor. The pool is created once and reused every step; call ``close()`` at shutdown.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Optional, Sequence

import torch

from deepscaler.rewards.format_reward import FormatRewardConfig, think_format_ok
from deepscaler.rewards.math_utils.input_guard import GuardLimits
from deepscaler.rewards.math_utils import split_after_think
from deepscaler.rewards.orm import OrmConfig, OrmJudge
from deepscaler.rewards.reward_types import ScoreResult
from deepscaler.rewards.selection import ScorerSpec, fail_success_values, graded_text
from verl.workers.reward_manager.scoring_pool import PoolStats, ScoringPool

REWARD_CONFIG_KEYS = ("num_workers", "timeout_s", "grade_budget_s", "grader", "format_reward", "orm")
FORMAT_REWARD_KEYS = tuple(f.name for f in FormatRewardConfig.__dataclass_fields__.values())
ORM_KEYS = tuple(f.name for f in OrmConfig.__dataclass_fields__.values())


# reward.num_workers=null: on a GPU node the driver grades while the ranks' processes (a few threads each) and Ray
# share its cores, so it takes a quarter of them, at least 2 (what a CPU run gets: its cores are the CPU ranks') and
# at most 32 (each grader is a Python process with sympy loaded, ~150 MB; a step's 1-4k responses keep 32 busy).
AUTO_WORKERS_MIN, AUTO_WORKERS_MAX, AUTO_WORKERS_CORE_SHARE = 2, 32, 4


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, so a Slurm or cgroup share counts), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_num_workers(device: str, cores: Optional[int] = None) -> int:
    """Grader processes for ``reward.num_workers=null`` on a run whose ranks are on ``device`` ('cuda' | 'cpu'):
    ``clamp(cores // 4, 2, 32)`` on cuda (``cores``: :func:`available_cores` when not given), 2 on cpu."""
    if device != "cuda":
        return AUTO_WORKERS_MIN
    cores = available_cores() if cores is None else int(cores)
    return max(AUTO_WORKERS_MIN, min(AUTO_WORKERS_MAX, cores // AUTO_WORKERS_CORE_SHARE))


def _plain(cfg: Any) -> dict:
    """A Hydra/OmegaConf node, dict or None as a plain dict."""
    if cfg is None:
        return {}
    if isinstance(cfg, Mapping):
        return dict(cfg)
    try:
        from omegaconf import OmegaConf

        return dict(OmegaConf.to_container(cfg, resolve=True))
    except Exception as exc:  # noqa: BLE001 - anything else is a caller error, named below
        raise TypeError(f"reward config must be a mapping or an OmegaConf node, got {type(cfg).__name__}") from exc


def _check_keys(cfg: dict, allowed: Sequence[str], where: str) -> None:
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; allowed: {sorted(allowed)}")


def _as_section(cfg, cls, allowed: Sequence[str], where: str):
    """``cfg`` as the dataclass ``cls``: kept if it is one already, else built from a mapping of known keys."""
    if isinstance(cfg, cls):
        return cfg
    cfg = _plain(cfg)
    _check_keys(cfg, allowed, where)
    return cls(**cfg)


class RewardManager:
    """Scores a batch of rollouts.

    Args:
        tokenizer: decodes ``responses`` (``decode(ids, skip_special_tokens=False)``).
        reward_impl_version: LUFFY's ``data.reward_impl_version`` (0-4, default 3).
        num_workers: scoring processes (0 = inline, no timeout).
        timeout_s: per-item CPU-time limit in seconds (the pool's, enforced by killing the worker).
        grade_budget_s: per-item time budget the graders enforce themselves (``GuardLimits.time_budget_s``).
        format_reward: ``FormatRewardConfig`` or mapping with its keys (None = off).
        orm: ``OrmConfig`` or mapping with its keys (None = off).
        compute_score: optional module-level ``fn(data_source, text, gt, extra_info) -> float`` replacing
            the built-in scorers (the ORM is then unavailable: it needs the built-in correctness flag).
        grader: ``math_verify`` | ``rule`` | ``any``; the equivalence check of versions 3/4.
        start_method: process start method of the pool (``forkserver`` default).
    """

    def __init__(
        self,
        tokenizer,
        reward_impl_version: int = 3,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        format_reward=None,
        orm=None,
        compute_score=None,
        grader: str = "math_verify",
        start_method: str = "forkserver",
        grade_budget_s: float = 3.0,
    ):
        self.tokenizer = tokenizer
        self.spec = ScorerSpec(reward_impl_version, grader, GuardLimits(time_budget_s=float(grade_budget_s)))
        self.reward_impl_version = self.spec.reward_impl_version
        self.fail_value, self.success_value = fail_success_values(self.reward_impl_version)
        self.format_reward = _as_section(format_reward, FormatRewardConfig, FORMAT_REWARD_KEYS, "reward.format_reward")
        self.orm_config = _as_section(orm, OrmConfig, ORM_KEYS, "reward.orm")
        if compute_score is not None and self.orm_config.enable:
            raise ValueError("reward.orm.enable=True cannot be combined with a custom compute_score")
        self.judge = OrmJudge(self.orm_config) if self.orm_config.enable else None
        self.pool = ScoringPool(
            compute_score if compute_score is not None else self.spec,
            num_workers=num_workers,
            timeout_s=timeout_s,
            start_method=start_method,
        )

    @classmethod
    def from_config(
        cls, reward_cfg, reward_impl_version: int, tokenizer, device: str = "cpu", **kwargs
    ) -> "RewardManager":
        """Build from the ``reward`` config group for a run whose ranks are on ``device``. Keys and defaults:

        num_workers (null): scoring processes; 0 grades inline without a timeout; null (or absent):
            ``default_num_workers(device)``, from the node's cores on cuda, 2 on cpu.
        timeout_s (10.0): per-item CPU-time limit of a scoring worker; a timed-out item scores 0.
        grade_budget_s (3.0): per-item budget enforced in-process by the graders (any thread).
        grader (math_verify): equivalence check of versions 3/4 (math_verify | rule | any);
            versions 0-2 always use the deepscaler rule grader.
        format_reward.enable (False), format_reward.weight (0.0), format_reward.mode (multiply):
            see ``FormatRewardConfig``.
        orm.enable (False), orm.base_url (null), orm.model (null), orm.api_key_env (OPENAI_API_KEY),
        orm.timeout_s (30), orm.max_retries (3), orm.requests_per_second (5), orm.cache_path (null),
        orm.max_failure_rate (0.5), orm.on_failure (raise): see ``OrmConfig``.
        """
        cfg = _plain(reward_cfg)
        _check_keys(cfg, REWARD_CONFIG_KEYS, "reward")
        workers = cfg.get("num_workers")
        return cls(
            tokenizer,
            reward_impl_version=reward_impl_version,
            num_workers=default_num_workers(device) if workers is None else int(workers),
            timeout_s=float(cfg.get("timeout_s", 10.0)),
            grade_budget_s=float(cfg.get("grade_budget_s", 3.0)),
            format_reward=cfg.get("format_reward"),
            orm=cfg.get("orm"),
            grader=cfg.get("grader", "math_verify"),
            **kwargs,
        )

    def score_texts(
        self, items: Sequence[tuple], problems: Sequence[str] | None = None
    ) -> tuple[list[float], dict[str, float]]:
        """Scores of ``(data_source, solution_str, ground_truth, extra_info)`` items and ``reward/*`` metrics.

        ``problems`` (optional, one per item) is the problem text the LLM judge sees; without it the
        judge gets ``extra_info['problem']`` / ``['question']`` when present.
        """
        items = [tuple(item) + (None,) * (4 - len(item)) for item in items]
        results, stats = self.pool.score(items)
        metrics = self._pool_metrics(stats, len(items))
        if self.judge is not None:
            results = self._apply_judge(items, results, problems, metrics)
        scores = [r.score for r in results]
        if self.format_reward.enable:
            ok = [think_format_ok(graded_text(item[1], self.reward_impl_version)) for item in items]
            scores = [self.format_reward.combine(s, f) for s, f in zip(scores, ok)]
            metrics["reward/format_ok_rate"] = sum(ok) / max(1, len(ok))
        return scores, metrics

    @staticmethod
    def _pool_metrics(stats: PoolStats, n: int) -> dict[str, float]:
        return {
            "reward/timeout_count": float(stats.timeout_count),
            "reward/wall_timeout_count": float(stats.wall_timeout_count),
            "reward/parse_fail_count": float(stats.parse_fail_count),
            "reward/unparseable_count": float(stats.unparseable_count),
            "reward/error_count": float(stats.error_count),
            "reward/score_time_s": stats.score_time_s,
            "reward/num_scored": float(n),
        }

    def _apply_judge(self, items, results: list[ScoreResult], problems, metrics) -> list[ScoreResult]:
        """Ask the judge about graded-wrong items that produced an answer; YES turns them correct."""
        todo = [i for i, r in enumerate(results) if not r.correct and r.answer is not None]
        triples = []
        for i in todo:
            data_source, text, ground_truth, extra_info = items[i]
            problem = problems[i] if problems is not None else None
            if problem is None and isinstance(extra_info, Mapping):
                problem = extra_info.get("problem") or extra_info.get("question")
            solution = split_after_think(graded_text(text, self.reward_impl_version)) or text
            triples.append((str(problem or ""), str(ground_truth), solution))
        start = time.perf_counter()
        cfg = self.judge.config
        abort_after = int(cfg.max_failure_rate * len(triples)) if cfg.on_failure == "raise" else None
        judgments = self.judge.judge_many(triples, abort_after=abort_after)
        metrics["reward/orm_fail_rate"] = self.judge.check_failures(judgments)  # raises or warns past the limit
        results = list(results)
        yes = 0
        for i, judgment in zip(todo, judgments):
            if judgment.verdict:
                yes += 1
                results[i] = ScoreResult(self.success_value, True, results[i].parse_failed, results[i].answer)
        metrics["reward/orm_calls"] = float(len(todo))
        metrics["reward/orm_yes"] = float(yes)
        metrics["reward/orm_fail_count"] = float(sum(1 for j in judgments if j.verdict is None))
        metrics["reward/orm_time_s"] = time.perf_counter() - start
        return results

    def _problems_from(self, data) -> list[str] | None:
        if self.judge is None:
            return None
        batch = data.batch
        response_len = batch["responses"].shape[-1]
        if "prompts" in batch.keys():
            prompts = batch["prompts"]
        else:
            prompts = batch["input_ids"][:, :-response_len]
        prompt_mask = batch["attention_mask"][:, : prompts.shape[-1]].bool()
        return [
            self.tokenizer.decode(prompts[i][prompt_mask[i]].tolist(), skip_special_tokens=True)
            for i in range(prompts.shape[0])
        ]

    def __call__(self, data) -> tuple[torch.Tensor, dict[str, float]]:
        """Token-level scores ``[N, L]`` (score at the last valid response token) and metrics."""
        responses = data.batch["responses"]
        attention_mask = data.batch["attention_mask"]
        n, response_len = responses.shape
        valid_lens = attention_mask[:, -response_len:].sum(dim=-1).tolist()
        texts = self.tokenizer.batch_decode(
            [responses[i, : int(valid_lens[i])].tolist() for i in range(n)], skip_special_tokens=False
        )
        non_tensor = data.non_tensor_batch
        for key in ("reward_model", "data_source"):
            if key not in non_tensor:
                raise KeyError(f"reward manager needs non_tensor_batch[{key!r}]; present: {sorted(non_tensor)}")
        extra_infos = non_tensor["extra_info"] if "extra_info" in non_tensor else [None] * n
        items = []
        for i in range(n):
            reward_model = non_tensor["reward_model"][i]
            if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
                raise KeyError(f"row {i}: non_tensor_batch['reward_model'] needs a 'ground_truth' entry")
            items.append((str(non_tensor["data_source"][i]), texts[i], reward_model["ground_truth"], extra_infos[i]))
        scores, metrics = self.score_texts(items, self._problems_from(data))
        token_level_scores = torch.zeros(n, response_len, dtype=torch.float32)
        for i, (score, valid_len) in enumerate(zip(scores, valid_lens)):
            # An empty response has no token to carry a score (its response mask is all zero anyway).
            if valid_len > 0:
                token_level_scores[i, int(valid_len) - 1] = score
        return token_level_scores, metrics

    def close(self) -> None:
        self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
