"""The task of reproduce_tiny.py: the tiny model and the split files (train, warm, validation, test, OOD, and one
eval file with the ID rows first), and the held-out scores cut back into their ID and OOD parts."""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from typing import Sequence

from reproduce.methods import METHODS
from reproduce.stats import problem_scores


def publish(staged: str, dest: str) -> None:
    """Move every file of ``staged`` to the same place under ``dest``, each by an atomic rename, leaving a file that
    already holds the same bytes untouched: another reproduce_tiny.py on the same ``--out`` (``--reuse`` with other
    ``--methods``) never reads a half-written split or model file."""
    for root, _, files in os.walk(staged):
        target = os.path.join(dest, os.path.relpath(root, staged))
        os.makedirs(target, exist_ok=True)
        for name in files:
            src, dst = os.path.join(root, name), os.path.join(target, name)
            if not (os.path.isfile(dst) and filecmp.cmp(src, dst, shallow=False)):
                os.replace(src, dst)
    shutil.rmtree(staged, ignore_errors=True)


def prepare_task(args, out: str, names: Sequence[str] = ()) -> dict:
    """Build the tiny model and write the splits; returns their paths (``eval``: test + OOD in one file). Both are
    written to a staging folder first and published file by file (``publish``)."""
    os.makedirs(out, exist_ok=True)
    staged = tempfile.mkdtemp(prefix=".task-", dir=out)
    try:
        paths = _write_task(args, staged, names)
        publish(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return {k: os.path.join(out, os.path.relpath(p, staged)) for k, p in paths.items()}


def _write_task(args, out: str, names: Sequence[str]) -> dict:
    import pandas as pd

    from luffy_pool.tiny import build_tiny_model, write_task_parquets
    from luffy_pool.tiny.arith_task import SYSTEM_PROMPT, write_ood_parquet
    from luffy_pool.tiny.model import TinyModelSpec

    data = os.path.join(out, "data")
    system = SYSTEM_PROMPT if args.system_prompt else None
    paths = dict(
        write_task_parquets(
            data,
            n_train=args.n_train,
            n_test=args.n_test,
            level=args.level,
            ops=tuple(args.ops),
            seed=args.seed,
            system_prompt=system,
            n_warm=args.n_warm if args.warm_steps > 0 else 0,
            n_val=args.n_val,
        )
    )
    paths["ood"] = write_ood_parquet(
        os.path.join(data, "ood.parquet"),
        args.n_ood,
        args.ood_variant,
        ops=tuple(args.ops),
        seed=args.seed + 1,
        system_prompt=system,
        exclude_files=[p for k, p in paths.items() if k != "ood"],
    )
    # One eval file, ID rows first: one generate_vllm.py call per model and temperature scores both.
    paths["eval"] = os.path.join(data, "eval_id_ood.parquet")
    pd.concat([pd.read_parquet(paths["test"]), pd.read_parquet(paths["ood"])], ignore_index=True).to_parquet(
        paths["eval"]
    )
    if any(METHODS[n].train_split == "train_hints" for n in names):  # UFT: the train split with its hint column
        from luffy_pool.methods.uft import add_hints
        from verl.utils.data_format import read_records, write_records

        paths["train_hints"] = os.path.join(data, "train_hints.parquet")
        write_records(add_hints(read_records(paths["train"]), paths["train"], "target", "hint"), paths["train_hints"])
    paths["model"] = build_tiny_model(os.path.join(out, "model"), TinyModelSpec(seed=args.seed))
    return paths


def split_scores(ev: dict, n_test: int) -> dict:
    """Per split (``id``: the first ``n_test`` rows of the eval file, ``ood``: the rest) and metric the
    per-problem scores and their mean."""
    out = {"id": {}, "ood": {}}
    for metric, key in (("greedy", "greedy"), ("avg", "sampled")):
        if key not in ev["files"]:
            continue
        per = problem_scores(ev["files"][key])
        for split, rows in (
            ("id", {r: v for r, v in per.items() if r < n_test}),
            ("ood", {r: v for r, v in per.items() if r >= n_test}),
        ):
            out[split][metric] = {"per_problem": rows, "mean": sum(rows.values()) / len(rows) if rows else None}
    return out
