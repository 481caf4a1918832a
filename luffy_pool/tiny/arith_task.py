"""Synthetic arithmetic task with step-by-step teacher traces (the embedded default data).

Each problem is a multi-digit addition or multiplication. A deterministic solver writes the
off-policy trace the way a stronger model would: a ``<think>`` block with column-by-column work,
then a short solution with ``\\boxed{N}``. Rows are written in LUFFY's training-parquet format
(docs/METHOD.md §3.1): ``prompt`` (chat list), ``target`` (one assistant message), ``reward_model``,
``data_source``, ``ability`` and ``extra_info.index``.

Difficulty levels set the number of digits; a randomly initialised model never produces a correct
boxed answer at level >= 2, which makes the task a small stand-in for the paper's hard subset.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Iterable

SYSTEM_PROMPT = (
    "You are a careful calculator. Think step by step inside <think> </think>, then give the final answer in \\boxed{}."
)
DATA_SOURCE = "synthetic_arith"

# (min_digits, max_digits) of each operand per difficulty level.
LEVELS = {1: (1, 1), 2: (2, 2), 3: (2, 3), 4: (3, 4), 5: (4, 5)}


@dataclasses.dataclass(frozen=True)
class ArithProblem:
    a: int
    b: int
    op: str  # "+" or "*"
    level: int

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a * self.b

    @property
    def question(self) -> str:
        return f"What is {self.a} {self.op} {self.b}?"


def _digits(n: int) -> list[int]:
    return [int(c) for c in str(n)][::-1]  # least significant first


def _addition_steps(a: int, b: int) -> list[str]:
    """One line per column, least significant first: ``x+y+carry=sum``."""
    da, db = _digits(a), _digits(b)
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}+{carry}={s}")
        carry = s // 10
    return steps


def _multiplication_steps(a: int, b: int) -> list[str]:
    """One partial product per digit of ``b``, then the running sum."""
    steps, partial_sum = [], 0
    for i, d in enumerate(_digits(b)):
        part = a * d * (10**i)
        steps.append(f"{a}*{d * 10**i}={part}")
        if i:
            steps.append(f"{partial_sum}+{part}={partial_sum + part}")
        partial_sum += part
    return steps


def solve_with_trace(p: ArithProblem) -> str:
    """Return the teacher trace (think block with one line per column, then the boxed answer).

    Compact on purpose (about 40 tokens for two-digit addition) so that CPU runs stay fast.
    """
    steps = _addition_steps(p.a, p.b) if p.op == "+" else _multiplication_steps(p.a, p.b)
    body = "\n".join(steps)
    return f"<think>\n{p.a}{p.op}{p.b}\n{body}\n</think>\n\\boxed{{{p.answer}}}"


def make_problems(n: int, level: int = 2, ops: Iterable[str] = ("+",), seed: int = 0) -> list[ArithProblem]:
    """Draw ``n`` distinct-seeded problems at a difficulty level (operand digits from ``LEVELS``)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level}")
    lo, hi = LEVELS[level]
    rng = random.Random(seed)
    ops = tuple(ops)
    out = []
    for _ in range(n):
        da, db = rng.randint(lo, hi), rng.randint(lo, hi)
        a = rng.randint(10 ** (da - 1) if da > 1 else 0, 10**da - 1)
        b = rng.randint(10 ** (db - 1) if db > 1 else 0, 10**db - 1)
        out.append(ArithProblem(a, b, rng.choice(ops), level))
    return out


def problem_to_row(p: ArithProblem, index: int, split: str, system_prompt: str | None = SYSTEM_PROMPT) -> dict:
    prompt = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": p.question}
    ]
    return {
        "data_source": DATA_SOURCE,
        "prompt": prompt,
        "target": [{"role": "assistant", "content": solve_with_trace(p)}],
        "ability": "math",
        "reward_model": {"ground_truth": str(p.answer), "style": "rule"},
        "extra_info": {"index": index, "split": split, "level": p.level, "op": p.op},
    }


def write_task_parquets(
    out_dir: str,
    n_train: int = 512,
    n_test: int = 64,
    level: int = 2,
    ops: Iterable[str] = ("+",),
    seed: int = 0,
    system_prompt: str | None = SYSTEM_PROMPT,
    n_warm: int = 0,
    n_val: int = 0,
) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` (disjoint problems) and return their paths.

    With ``n_warm > 0`` also ``warm.parquet``: problems disjoint from both, for warming a base model
    with SFT (a stand-in for pretraining) before RL on ``train``. With ``n_val > 0`` also ``val.parquet``:
    problems disjoint from all of them, for choosing hyper-parameters without touching ``test``. The
    splits come from one seeded stream in the order train, test, warm, val, so adding a split never
    changes the problems of the others.
    """
    import pandas as pd

    os.makedirs(out_dir, exist_ok=True)
    need = n_train + n_test + n_warm + n_val
    problems = make_problems(4 * need, level=level, ops=ops, seed=seed)
    seen, uniq = set(), []
    for p in problems:
        key = (p.a, p.b, p.op)
        if key not in seen:
            seen.add(key)
            uniq.append(p)
    if len(uniq) < need:
        raise ValueError(f"level {level} has only {len(uniq)} distinct problems, asked for {need}")
    paths = {}
    splits = [("train", uniq[:n_train]), ("test", uniq[n_train : n_train + n_test])]
    if n_warm > 0:
        splits.append(("warm", uniq[n_train + n_test : n_train + n_test + n_warm]))
    if n_val > 0:
        splits.append(("val", uniq[n_train + n_test + n_warm : need]))
    for split, chunk in splits:
        rows = [problem_to_row(p, i, split, system_prompt) for i, p in enumerate(chunk)]
        path = os.path.join(out_dir, f"{split}.parquet")
        pd.DataFrame(rows).to_parquet(path, index=False)
        paths[split] = path
    return paths


# Out-of-distribution variants of a level-2 task: problems the training data never shows, solved by the same kind
# of trace. "more_digits": at least one operand has three digits (one more column and carry than in training);
# "mixed_digits": one one-digit and one two-digit operand (a column with a missing digit).
OOD_VARIANTS = {"more_digits": ((2, 3), (3, 3)), "mixed_digits": ((1, 2), (1, 2))}


def make_ood_problems(
    n: int, variant: str = "more_digits", ops: Iterable[str] = ("+",), seed: int = 0, exclude: Iterable[tuple] = ()
) -> list[ArithProblem]:
    """``n`` distinct problems of an OOD variant (``OOD_VARIANTS``), none of them in ``exclude`` ((a, b, op) keys).

    The operand digit counts are drawn from the variant's range and redrawn until the pair meets the
    variant's rule (``more_digits``: the longer operand has 3 digits; ``mixed_digits``: the lengths differ).
    """
    if variant not in OOD_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(OOD_VARIANTS)}, got {variant!r}")
    (lo, hi), (need_lo, need_hi) = OOD_VARIANTS[variant]
    rng, ops, seen = random.Random(seed), tuple(ops), set(exclude)
    out: list[ArithProblem] = []
    for _ in range(100 * n):
        if len(out) == n:
            break
        da, db = rng.randint(lo, hi), rng.randint(lo, hi)
        if not need_lo <= max(da, db) <= need_hi or (variant == "mixed_digits" and da == db):
            continue
        a = rng.randint(10 ** (da - 1) if da > 1 else 0, 10**da - 1)
        b = rng.randint(10 ** (db - 1) if db > 1 else 0, 10**db - 1)
        p = ArithProblem(a, b, rng.choice(ops), level=max(da, db))  # level here: the longer operand's digits
        if (p.a, p.b, p.op) not in seen:
            seen.add((p.a, p.b, p.op))
            out.append(p)
    if len(out) < n:
        raise ValueError(f"OOD variant {variant} gave only {len(out)} distinct problems, asked for {n}")
    return out


def write_ood_parquet(
    path: str,
    n: int,
    variant: str = "more_digits",
    ops: Iterable[str] = ("+",),
    seed: int = 0,
    system_prompt: str | None = SYSTEM_PROMPT,
    exclude_files: Iterable[str] = (),
) -> str:
    """Write ``n`` OOD problems (split ``ood_<variant>``) to ``path``, disjoint from the problems in ``exclude_files``."""
    import pandas as pd

    exclude = set()
    for file in exclude_files:
        for row in pd.read_parquet(file).itertuples():
            a, op, b = row.prompt[-1]["content"][len("What is ") : -1].split(" ")
            exclude.add((int(a), int(b), op))
    problems = make_ood_problems(n, variant, ops=ops, seed=seed, exclude=exclude)
    rows = [problem_to_row(p, i, f"ood_{variant}", system_prompt) for i, p in enumerate(problems)]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def tokenizer_corpus(n: int = 3000, seed: int = 1) -> list[str]:
    """Text the tiny tokenizer is trained on: problems and traces of every level, plus prompts."""
    lines = [SYSTEM_PROMPT]
    for level in LEVELS:
        for p in make_problems(n // len(LEVELS), level=level, ops=("+", "*"), seed=seed + level):
            lines.append(p.question)
            lines.append(solve_with_trace(p))
    return lines
