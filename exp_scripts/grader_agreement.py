"""Grader accuracy check on real data: GSM8K worked solutions and benchmark ground truths graded against themselves.

Run it before and after a grader change and compare the two result files sample by sample:

    .venv/bin/python exp_scripts/grader_agreement.py --out /tmp/before.json   # on the old code
    .venv/bin/python exp_scripts/grader_agreement.py --out /tmp/after.json --compare /tmp/before.json

Sets (each item graded with ``grade(text, ground_truth, grader)`` for ``math_verify`` and ``rule``;
``any`` is their OR, as in ``grade_solution``):
- ``gsm8k_hash``: the human solution as written (ends in ``#### N``), ground truth ``N``;
- ``gsm8k_boxed``: the same solution with ``#### N`` replaced by ``\\boxed{N}``;
- ``gsm8k_long``: the boxed form of the first 2,000 rows followed by 4,000-9,000 characters of
  re-checking text (the answer sits before the last 4,000 characters math-verify reads);
- ``bench_self``: every distinct benchmark ground truth (valid.all, ARC-c, GPQA) as ``\\boxed{gt}``
  against itself.
Every item should grade correct; the script prints per-set accuracy, the wall time, and with
``--compare`` the items whose outcome changed.

LUFFY agreement (``exp_scripts/luffy_agreement.py``): ``--luffy_src DIR --write FILE`` builds the
comparison set graded by LUFFY's own code (run from a checkout outside the project) and
``--check FILE`` prints, per grader, how often this project's verdict differs from LUFFY's.
"""

from __future__ import annotations

import argparse
import json
import os
import time

DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "data")
GRADERS = ("math_verify", "rule")


def _gsm8k_items(data_dir: str, limit: int) -> tuple[list, list]:
    hash_items, boxed_items = [], []
    for name in ("test.jsonl", "train.jsonl"):
        with open(os.path.join(data_dir, "gsm8k", name)) as f:
            for line in f:
                row = json.loads(line)
                solution = row["answer"]
                head, _, final = solution.rpartition("####")
                gt = final.strip().replace(",", "")
                hash_items.append((solution, gt))
                boxed_items.append((head + "The answer is $\\boxed{" + final.strip() + "}$.", gt))
    return hash_items[:limit], boxed_items[:limit]


def _bench_items(data_dir: str) -> list:
    import pandas as pd

    seen, items = set(), []
    for name in ("valid.all.parquet", "valid.arc_c.parquet", "valid.gpqa.parquet"):
        frame = pd.read_parquet(os.path.join(data_dir, "benchmarks", name))
        for reward_model in frame["reward_model"]:
            gt = str(reward_model["ground_truth"])
            if gt not in seen:
                seen.add(gt)
                items.append(("The final answer is $\\boxed{" + gt + "}$.", gt))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=DEFAULT_DATA)
    parser.add_argument("--gsm8k_limit", type=int, default=10**9, help="first K GSM8K rows (test, then train)")
    parser.add_argument("--out", default=None, help="JSON file for the per-item outcomes")
    parser.add_argument("--luffy_src", default=None, help="LUFFY checkout (outside the project) to build --write")
    parser.add_argument("--luffy_deps", default=None, help="extra sys.path for LUFFY's graders (pylatexenc)")
    parser.add_argument("--write", default=None, help="jsonl.gz file for the LUFFY agreement set")
    parser.add_argument("--per_benchmark", type=int, default=None, help="problems per benchmark (default 40)")
    parser.add_argument("--check", default=None, help="a LUFFY agreement set to compare this project with")
    parser.add_argument("--compare", default=None, help="an earlier --out file to diff against")
    args = parser.parse_args()
    if args.write or args.check:
        _luffy_mode(args)
        return
    if not args.out:
        parser.error("--out is required (or --write / --check for the LUFFY agreement set)")

    from deepscaler.rewards import grade

    hash_items, boxed_items = _gsm8k_items(args.data_dir, args.gsm8k_limit)
    filler = "Let me double check each step of the computation once more. "
    long_items = [(text + "\n" + filler * (70 + i % 80), gt) for i, (text, gt) in enumerate(boxed_items[:2000])]
    sets = {
        "gsm8k_hash": hash_items,
        "gsm8k_boxed": boxed_items,
        "gsm8k_long": long_items,
        "bench_self": _bench_items(args.data_dir),
    }
    results: dict = {}
    for set_name, items in sets.items():
        for grader in GRADERS:
            start = time.perf_counter()
            outcomes = [bool(grade(text, gt, grader=grader)) for text, gt in items]
            elapsed = time.perf_counter() - start
            results[f"{set_name}/{grader}"] = outcomes
            print(
                f"{set_name:12s} {grader:12s} n={len(items):5d} correct={sum(outcomes) / len(items):.4f} "
                f"time={elapsed:.1f}s",
                flush=True,
            )
        either = [a or b for a, b in zip(results[f"{set_name}/math_verify"], results[f"{set_name}/rule"])]
        results[f"{set_name}/any"] = either
        print(f"{set_name:12s} {'any':12s} n={len(items):5d} correct={sum(either) / len(items):.4f}")
    with open(args.out, "w") as f:
        json.dump(
            {
                "results": results,
                "texts": {k: [t for t, _ in v] for k, v in sets.items()},
                "gts": {k: [g for _, g in v] for k, v in sets.items()},
            },
            f,
        )
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        for key, after in results.items():
            old = before["results"].get(key)
            if old is None or len(old) != len(after):
                print(f"{key}: not comparable")
                continue
            changed = [i for i, (a, b) in enumerate(zip(old, after)) if a != b]
            agree = 1 - len(changed) / max(1, len(after))
            print(f"{key:26s} agreement={agree:.5f} changed={len(changed)}")
            set_name = key.split("/")[0]
            for i in changed[:5]:
                print(
                    f"    #{i} {old[i]} -> {after[i]} gt={sets[set_name][i][1]!r} "
                    f"text=...{sets[set_name][i][0][-120:]!r}"
                )


def _luffy_mode(args) -> None:
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import luffy_agreement as la

    if args.write:
        if not args.luffy_src:
            raise SystemExit("--write needs --luffy_src (a LUFFY checkout outside the project)")
        items = la.build_items(args.data_dir, args.per_benchmark or la.PER_BENCHMARK)
        la.write_luffy_verdicts(items, args.luffy_src, args.luffy_deps, args.write)
    if args.check:
        rows = la.read_rows(args.check)
        start = time.perf_counter()
        for grader, bad in la.disagreements(rows).items():
            print(f"{grader:13s} n={len(rows)} disagreements={len(bad)}")
            for d in bad[:8]:
                print(f"    {d['id']} ours={d['ours']} luffy={d['luffy']} gt={d['gt']!r} ...{d['answer']!r}")
        print(f"checked in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
