"""Driver memory and checkpoint size of ExGRPO's experience pool after a run like exp_scripts/train_exgrpo.sh's.

No model, no GPU: ``luffy_pool.replay.experience.ExperiencePool`` is filled step by step the way a run fills it,
``--batch`` prompts x ``--n`` rollouts a step for ``--steps`` steps over a ``--dataset``-question set drawn epoch by
epoch. Each question has a solve rate p ~ Beta(``--beta-a``, ``--beta-b``); a group has k ~ Binomial(n, p) correct
rollouts (a replayed question's slot 0 is its chosen stored trajectory, correct, and k - 1 of the others); correct
responses get lognormal lengths (mean ``--mean-tokens``, sigma ``--sigma``, cut at ``--max-tokens`` without an EOS)
and random token ids. The pool's own rules decide what is stored, replayed, retired and when the mixed phase starts
(``plan`` / ``observe`` / ``end_step``), so the pool holds what those rules keep from such a run.

Measured, for the authors' unbounded pool (``--cap 0``, what the previous code kept) and for the cap (``--cap``):
- after (this code): the arrays' bytes + the per-trajectory headers, and ``data.pt`` of ``pool.state_dict()``
  written by ``verl.utils.checkpoint.safe_io.save_state`` (the trainer's checkpoint writer);
- before (the previous code, on the unbounded pool): Python lists of ints and floats, measured with ``tracemalloc``
  on ``--list-sample`` trajectories rebuilt as lists and scaled by the pool's token count, and the version-1 state
  (an int64 and a float64 tensor per trajectory) written the same way; its loader is the one the new code keeps.

    .venv/bin/python exp_scripts/bench_exgrpo_pool.py [--steps 701] [--mean-tokens 1500] [--out DIR]

Prints one table row per measurement and, last, ``checkpoint before/after=<r> ram before/after=<r>``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

EOS, VOCAB = 151643, 151936  # Qwen2.5's <|endoftext|> and vocabulary size


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=701, help="training steps (train_exgrpo.sh: 701)")
    p.add_argument("--batch", type=int, default=128, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="rollouts per prompt (rollout.n)")
    p.add_argument("--dataset", type=int, default=46000, help="questions in the training set (OpenR1-Math-46k)")
    p.add_argument("--mean-tokens", type=float, default=1500.0, help="mean length of a correct response")
    p.add_argument("--sigma", type=float, default=0.6, help="lognormal sigma of the lengths")
    p.add_argument("--max-tokens", type=int, default=8192, help="data.max_response_length")
    p.add_argument("--beta-a", type=float, default=0.5, help="solve-rate prior Beta(a, b)")
    p.add_argument("--beta-b", type=float, default=0.7, help="solve-rate prior Beta(a, b)")
    p.add_argument("--cap", type=int, default=8, help="algorithm.exgrpo.max_trajectories_per_question to compare")
    p.add_argument("--list-sample", type=int, default=2000, help="trajectories rebuilt as lists for tracemalloc")
    p.add_argument(
        "--legacy-gib",
        type=float,
        default=2.0,
        help="most GiB of version-1 tensors to build at once (beyond: a share of the questions, scaled)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for the data.pt files (default: a temporary one, removed)")
    return p.parse_args(argv)


def _knobs(cap: int):
    from types import SimpleNamespace

    # train_exgrpo.sh's algorithm.exgrpo values (the YAML's defaults otherwise)
    return SimpleNamespace(
        start_solved_ratio=0.35,
        experience_ratio=0.5,
        lbound=0,
        rbound=7,
        bucket_weighting="normal",
        traj_metric="ent",
        traj_select="argmin",
        sample_range="all",
        is_correct=True,
        metric_impl="paper",
        retire_all_correct=True,
        max_trajectories_per_question=cap,
    )


def simulate(args, cap: int):
    """The pool after ``args.steps`` steps of the run described in the module docstring."""
    import numpy as np
    import torch

    from luffy_pool.replay.experience import ExperiencePool

    rng = np.random.default_rng(args.seed)
    solve = rng.beta(args.beta_a, args.beta_b, size=args.dataset)
    pool = ExperiencePool(
        _knobs(cap), n=args.n, batch_size=args.batch, dataset_size=args.dataset, success=1.0, seed=args.seed
    )
    order, at = rng.permutation(args.dataset), 0
    mu = math.log(args.mean_tokens) - args.sigma**2 / 2  # lognormal mean = exp(mu + sigma^2 / 2)
    for _ in range(args.steps):
        if at + args.batch > args.dataset:
            order, at = rng.permutation(args.dataset), 0
        drawn = [int(q) for q in order[at : at + args.batch]]
        at += args.batch
        plan = pool.plan(drawn)
        questions = [drawn[i] for i in plan.fresh] + list(plan.replay)
        replayed = set(range(len(plan.fresh), len(questions)))
        rows = []  # (question, group, correct, tokens or None)
        for g, q in enumerate(questions):
            k = int(rng.binomial(args.n, solve[q]))
            if g in replayed:  # slot 0: a stored trajectory (a success), then n - 1 fresh rollouts
                stored = pool.pool[q]
                rows.append((q, g, True, np.append(stored[int(rng.integers(len(stored)))].ids, EOS)))
                k = 1 + int(rng.binomial(args.n - 1, solve[q]))
                correct = [True] * (k - 1) + [False] * (args.n - k)
            else:
                correct = [True] * k + [False] * (args.n - k)
            for c in correct:
                tokens = None
                if c:
                    length = int(min(args.max_tokens, max(2, round(rng.lognormal(mu, args.sigma)))))
                    tokens = rng.integers(0, EOS, size=length)
                    if length < args.max_tokens:
                        tokens[-1] = EOS
                rows.append((q, g, c, tokens))
        width = max(len(t) for *_, t in rows if t is not None) if any(r[3] is not None for r in rows) else 1
        responses = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        mask[:, 0] = 1
        for r, (*_, tokens) in enumerate(rows):
            if tokens is not None:
                responses[r, : len(tokens)] = torch.from_numpy(tokens.astype(np.int64))
                mask[r, : len(tokens)] = 1
        old = -torch.rand((len(rows), width), generator=torch.Generator().manual_seed(int(rng.integers(2**31))))
        scores = torch.tensor([1.0 if c else 0.0 for _, _, c, _ in rows])
        pool.observe([q for q, *_ in rows], [g for _, g, *_ in rows], scores, responses, mask, old, EOS)
        pool.end_step(scores)
    return pool


def ram_bytes(pool) -> int:
    """The pool's trajectories as held now: array bytes + the headers (memory_plan/host.py)."""
    from luffy_pool.memory_plan.host import TRAJECTORY_OVERHEAD_BYTES

    return sum(t.nbytes + TRAJECTORY_OVERHEAD_BYTES for v in pool.pool.values() for t in v)


def list_ram_bytes(pool, sample: int, seed: int) -> tuple[int, float]:
    """(bytes, bytes per response token) of the trajectories as the previous code held them: a dataclass of two
    Python lists (``responses[row].tolist()``, ``old_log_probs[row].double().tolist()``), traced on a sample, scaled
    by tokens."""
    import dataclasses
    import random
    import tracemalloc

    @dataclasses.dataclass
    class ListTrajectory:  # the previous luffy_pool.replay.experience.Trajectory
        token_ids: list
        log_probs: list

    trajs = [t for v in pool.pool.values() for t in v]
    chosen = random.Random(seed).sample(trajs, min(sample, len(trajs)))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [ListTrajectory(t.ids.tolist(), t.lps.astype("float64").tolist()) for t in chosen]
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del kept
    tokens = sum(len(t.ids) for t in chosen)
    total = sum(len(t.ids) for t in trajs)
    per = used / max(1, tokens)
    return int(per * total), per


def legacy_state(pool, questions) -> dict:
    """The version-1 ``state_dict`` (what the previous code wrote to data.pt) of ``pool`` cut to ``questions``."""
    import numpy as np
    import torch

    state = pool.state_dict()
    state["version"] = 1
    state["pool"] = [
        (
            uid,
            [
                (torch.from_numpy(t.ids.astype(np.int64)), torch.from_numpy(t.lps.astype(np.float64)))
                for t in pool.pool[uid]
            ],
        )
        for uid in questions
    ]
    return state


def legacy_questions(pool, budget_bytes: int, seed: int) -> list:
    """Every question when the version-1 tensors (16 B per token) fit ``budget_bytes``, else a random share that
    does (the file's size is then scaled by tokens: it is bytes per token plus a header per tensor)."""
    import random

    uids = list(pool.pool)
    tokens = sum(len(t.ids) for v in pool.pool.values() for t in v)
    if 16 * tokens <= budget_bytes:
        return uids
    share = budget_bytes / (16 * tokens)
    return sorted(random.Random(seed).sample(uids, max(1, int(share * len(uids)))), key=uids.index)


def saved_bytes(state: dict, folder: str, name: str) -> int:
    from verl.utils.checkpoint.safe_io import save_state

    path = os.path.join(folder, name)
    save_state(path, {"exgrpo": state})
    return os.path.getsize(path)


def describe(pool) -> str:
    trajs = [t for v in pool.pool.values() for t in v]
    tokens = sum(len(t.ids) for t in trajs)
    return (
        f"{len(pool.pool):,} questions, {len(trajs):,} trajectories, {tokens:,} tokens, "
        f"{len(pool.retired):,} retired, mixed={pool.mixed}"
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    import shutil

    from luffy_pool.replay.experience import ExperiencePool
    from verl.utils.checkpoint.safe_io import load_state

    folder = args.out or tempfile.mkdtemp(prefix="exgrpo_pool_")
    os.makedirs(folder, exist_ok=True)
    gib = 2**30
    try:
        t0 = time.time()
        free = simulate(args, cap=0)
        print(f"unbounded pool after {args.steps} steps ({time.time() - t0:.0f} s): {describe(free)}")
        list_ram, per_token = list_ram_bytes(free, args.list_sample, args.seed)
        # before: the version-1 data.pt (a share of the questions when it would not fit --legacy-gib), then loaded
        # back by this code's loader into the same trajectories
        kept = legacy_questions(free, int(args.legacy_gib * gib), args.seed)
        legacy = saved_bytes(legacy_state(free, kept), folder, "data_v1.pt")
        share = sum(len(t.ids) for u in kept for t in free.pool[u]) / sum(
            len(t.ids) for v in free.pool.values() for t in v
        )
        restored = ExperiencePool(
            _knobs(0), n=args.n, batch_size=args.batch, dataset_size=args.dataset, success=1.0, seed=args.seed
        )
        restored.load_state_dict(load_state(os.path.join(folder, "data_v1.pt"))["exgrpo"])
        assert list(restored.pool) == kept and all(restored.pool[u] == free.pool[u] for u in kept), (
            "the version-1 state did not load back to the same trajectories"
        )
        del restored
        os.remove(os.path.join(folder, "data_v1.pt"))
        legacy = int(legacy / share)
        compact = saved_bytes(free.state_dict(), folder, "data_v2_nocap.pt")
        compact_ram = ram_bytes(free)
        del free
        t0 = time.time()
        capped = simulate(args, cap=args.cap)
        print(f"pool with max_trajectories_per_question={args.cap} ({time.time() - t0:.0f} s): {describe(capped)}")
        capped_ckpt = saved_bytes(capped.state_dict(), folder, "data_v2_cap.pt")
        capped_ram = ram_bytes(capped)
        sampled = "" if share == 1 else f" (v1 file of {share:.0%} of the tokens, scaled)"
        print(f"{'pool':<56}{'driver RAM MiB':>16}{'data.pt MiB':>14}")
        rows = [
            (f"before: lists ({per_token:.0f} B/token), v1 tensors, no cap", list_ram, legacy),
            ("after: int32/float32 arrays, flat tensors, no cap", compact_ram, compact),
            (f"after: the same, max_trajectories_per_question={args.cap}", capped_ram, capped_ckpt),
        ]
        for name, ram, ckpt in rows:
            print(f"{name:<56}{ram / 2**20:>16,.1f}{ckpt / 2**20:>14,.1f}")
        if sampled:
            print(sampled.strip())
        print(
            f"checkpoint before/after={legacy / max(1, capped_ckpt):.1f} "
            f"ram before/after={list_ram / max(1, capped_ram):.1f}"
        )
    finally:
        if args.out is None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
