"""LUFFY grader-agreement set: build it by running LUFFY's own graders, and compare this project's verdicts.

Build (needs a LUFFY checkout OUTSIDE the project; LUFFY's OAT grader also needs ``pylatexenc``, which this
venv lacks, so install it aside for the generator only: ``pip install --target /tmp/luffy_deps pylatexenc``)::

    git --git-dir=/work/.mirror/ElliottYan+LUFFY/repo archive HEAD eval_scripts luffy | tar -x -C /tmp/luffy_src
    .venv/bin/python exp_scripts/grader_agreement.py --luffy_src /tmp/luffy_src --luffy_deps /tmp/luffy_deps \\
        --write tests/data/luffy_grader_verdicts.jsonl.gz

Compare (no LUFFY code needed; what tests/deepscaler/rewards/test_luffy_grader_agreement.py does)::

    .venv/bin/python exp_scripts/grader_agreement.py --check tests/data/luffy_grader_verdicts.jsonl.gz

The set: ``PER_BENCHMARK`` distinct problems of each of the six math benchmarks of valid.all (aime, aime25,
amc, math, minerva, olympiad_bench) and of ARC-c and GPQA, each answered in the ways of
``grader_variants`` (15 or more per math problem). Each answer is graded by LUFFY's code in a worker
subprocess (``luffy_grader_worker.py``) with ``PER_ANSWER_TIMEOUT_S`` per answer and grader; a timeout or a
LUFFY exception is stored as such and skipped by the comparison. Rows: ``{"id", "bench", "variant",
"gt", "text", "luffy": {grader: verdict | "timeout" | "error: ..."}}``.

The stored file was built from LUFFY commit 01f4ae0 (github ElliottYan/LUFFY) with this venv's sympy 1.14.0,
math-verify 0.9.0 and latex2sympy2_extended 1.11.0, plus pylatexenc 2.11 installed aside for the generator;
math-verify verdicts depend on its version, so rebuild the file when the venv's math-verify changes.
"""

from __future__ import annotations

import gzip
import json
import os
import select
import subprocess
import sys
import time

PER_BENCHMARK = 40
PER_ANSWER_TIMEOUT_S = 10.0
MATH_BENCHMARKS = ("aime", "aime25", "amc", "math", "minerva", "olympiad_bench")
CHOICE_FILES = {"arc_c": "valid.arc_c.parquet", "gpqa": "valid.gpqa.parquet"}
LUFFY_GRADERS = ("v0", "v1", "v2", "v3", "eval_mv", "eval_oat", "eval_oat_any")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "luffy_grader_worker.py")


def build_items(data_dir: str, per_benchmark: int = PER_BENCHMARK) -> list[dict]:
    import pandas as pd

    from grader_variants import choice_variants, math_variants

    items: list[dict] = []
    frame = pd.read_parquet(os.path.join(data_dir, "benchmarks", "valid.all.parquet"))
    sources = {bench: frame[frame["data_source"] == bench] for bench in MATH_BENCHMARKS}
    for name, file in CHOICE_FILES.items():
        sources[name] = pd.read_parquet(os.path.join(data_dir, "benchmarks", file))
    for bench, rows in sources.items():
        seen: set = set()
        for prompt, reward_model in zip(rows["prompt"], rows["reward_model"]):
            key = prompt[-1]["content"]
            if key in seen:
                continue
            seen.add(key)
            gt = str(reward_model["ground_truth"])
            variants = choice_variants(gt) if bench in CHOICE_FILES else math_variants(gt)
            for variant, text in variants:
                items.append(
                    {
                        "id": f"{bench}/{len(seen) - 1}/{variant}",
                        "bench": bench,
                        "variant": variant,
                        "gt": gt,
                        "text": text,
                    }
                )
            if len(seen) >= per_benchmark:
                break
    return items


class _LuffyWorker:
    """A worker subprocess running LUFFY's graders, restarted after a timeout."""

    def __init__(self, luffy_src: str, luffy_deps: str | None):
        self.cmd = [sys.executable, WORKER, "--luffy_src", luffy_src]
        self.env = dict(os.environ)
        if luffy_deps:
            self.env["PYTHONPATH"] = luffy_deps + os.pathsep + self.env.get("PYTHONPATH", "")
        self.proc = None

    def _start(self):
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            bufsize=1,
        )

    def grade(self, grader: str, text: str, gt: str, timeout_s: float):
        if self.proc is None:
            self._start()
        self.proc.stdin.write(json.dumps({"grader": grader, "text": text, "gt": gt}) + "\n")
        self.proc.stdin.flush()
        # The first request also imports LUFFY's modules (sympy, math-verify, ANTLR): allow for it.
        limit = timeout_s + (60.0 if not getattr(self, "_warm", False) else 0.0)
        ready, _, _ = select.select([self.proc.stdout], [], [], limit)
        if not ready:
            self.close()
            return "timeout"
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            return "error: worker died"
        self._warm = True
        reply = json.loads(line)
        return reply["verdict"] if "verdict" in reply else "error: " + reply["error"]

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self._warm = False


def write_luffy_verdicts(
    items: list[dict], luffy_src: str, luffy_deps: str | None, out_path: str, timeout_s: float = PER_ANSWER_TIMEOUT_S
) -> None:
    worker = _LuffyWorker(luffy_src, luffy_deps)
    start = time.time()
    try:
        for n, item in enumerate(items):
            item["luffy"] = {g: worker.grade(g, item["text"], item["gt"], timeout_s) for g in LUFFY_GRADERS}
            if n % 500 == 0:
                print(f"{n}/{len(items)} graded by LUFFY ({time.time() - start:.0f}s)", flush=True)
    finally:
        worker.close()
    with gzip.open(out_path, "wt") as f:
        for item in items:
            f.write(json.dumps(item, separators=(",", ":")) + "\n")
    print(f"wrote {len(items)} rows to {out_path}")


def read_rows(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def project_verdict(grader: str, text: str, gt: str, luffy_bugs: bool = False):
    """This project's verdict under the same name as LUFFY's grader (see luffy_grader_worker)."""
    from deepscaler.rewards import compute_score
    from eval_scripts.grading import grade_text

    if grader.startswith("v"):
        score = compute_score("agreement", text, gt, None, int(grader[1:]))
        return float(score) if grader == "v1" else score == 1.0
    name = {"eval_mv": "math_verify", "eval_oat": "oat", "eval_oat_any": "oat_any"}[grader]
    return grade_text(text, gt, name, split_think=True).correct


def disagreements(rows: list[dict], graders=LUFFY_GRADERS) -> dict[str, list[dict]]:
    """Per grader, the rows where this project's verdict differs from LUFFY's stored one."""
    out: dict[str, list[dict]] = {g: [] for g in graders}
    for row in rows:
        for grader in graders:
            theirs = row["luffy"][grader]
            if isinstance(theirs, str):  # LUFFY timed out or raised: no verdict to compare
                continue
            ours = project_verdict(grader, row["text"], row["gt"])
            if ours != theirs:
                out[grader].append(
                    {"id": row["id"], "ours": ours, "luffy": theirs, "gt": row["gt"], "answer": row["text"][-80:]}
                )
    return out
