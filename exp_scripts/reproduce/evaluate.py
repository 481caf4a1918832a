"""Score a model folder with the project's eval pipeline (``eval_scripts/generate_vllm.py``), in a subprocess.

Held-out evaluation is greedy pass@1 plus, optionally, avg@k at T=0.6 (LUFFY's eval temperature); the
probe of the untrained model samples the training prompts at the rollout temperature, which is how
on-policy GRPO would first see them. Prompts are rendered exactly as in training (the system turn is
kept when the data has one) and graded with math-verify after ``</think>``, as the training reward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Mapping, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GENERATE = os.path.join(REPO, "eval_scripts", "generate_vllm.py")
EVAL_BATCH = os.path.join(HERE, "eval_batch.py")


def summary_file(output_file: str) -> str:
    """Where generate_vllm.py writes its summary for ``output_file``."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from eval_scripts.generate_vllm import summary_path

    return summary_path(output_file)


def eval_command(
    model_dir: str,
    input_file: str,
    output_file: str,
    *,
    n: int,
    temperature: float,
    max_tokens: int,
    rollout: str = "vllm",
    max_rows: Optional[int] = None,
    seed: int = 0,
) -> list[str]:
    cmd = [
        sys.executable,
        GENERATE,
        "--model_path",
        model_dir,
        "--input_file",
        input_file,
        "--output_file",
        output_file,
        "--n",
        str(n),
        "--temperature",
        str(temperature),
        "--max_new_tokens",
        str(max_tokens),
        "--remove_system",
        "False",
        "--dtype",
        "float32",
        "--backend",
        rollout,
        "--seed",
        str(seed),
    ]
    if rollout == "hf":  # 128 prompts (x n samples) per decode batch: measured 1.4x less CPU than the default 16
        cmd += ["--hf_batch_size", "128"]
    if max_rows is not None:
        cmd += ["--max_rows", str(max_rows)]
    return cmd


def run_evals(
    calls: Sequence[tuple[list[str], str]],
    env: Mapping[str, str],
    timeout_s: Optional[float] = None,
    reuse: bool = False,
    log_path: Optional[str] = None,
    only_finished: bool = False,
) -> list[dict]:
    """Run generate_vllm.py commands ``(cmd, output_file)`` in one process (``reproduce/eval_batch.py``) and
    return their JSON summaries, each with the ``cpu_s`` it used.

    ``reuse``: a command whose summary exists for exactly that command (``<output stem>.cmd.json``) is not run.
    ``only_finished``: run nothing; RuntimeError when a command has no such summary (a partial report).
    """
    todo = []
    for cmd, output_file in calls:
        os.makedirs(os.path.dirname(os.path.abspath(output_file)), exist_ok=True)
        cmd_file = os.path.splitext(output_file)[0] + ".cmd.json"
        done = reuse and os.path.exists(cmd_file) and os.path.exists(summary_file(output_file))
        if done:
            with open(cmd_file) as f:
                done = json.load(f) == list(cmd)
        if not done:
            todo.append((cmd, output_file, cmd_file))
    if todo and only_finished:
        raise RuntimeError(f"not evaluated yet: {todo[0][1]} (--report-only)")
    if todo:
        first = todo[0][1]
        log_path = log_path or os.path.splitext(first)[0] + ".log"
        calls_file = os.path.splitext(first)[0] + ".calls.json"
        with open(calls_file, "w") as f:
            json.dump([list(cmd[2:]) for cmd, _, _ in todo], f, indent=1)  # cmd = [python, generate_vllm.py, ...]
        with open(log_path, "w") as log:
            proc = subprocess.run(
                [sys.executable, EVAL_BATCH, calls_file],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=REPO,
                timeout=timeout_s,
            )
        if proc.returncode != 0:
            raise RuntimeError(f"evaluation failed (exit {proc.returncode}); see {log_path}")
        for cmd, _, cmd_file in todo:
            with open(cmd_file, "w") as f:
                json.dump(list(cmd), f)
    summaries = []
    for _, output_file in calls:
        with open(summary_file(output_file)) as f:
            summaries.append(json.load(f))
    return summaries


def headline(summary: Mapping) -> dict:
    """The numbers the report uses from one generate_vllm.py summary."""
    return {
        "accuracy": float(summary["accuracy"]),
        "samples": int(summary["samples"]),
        "correct": int(sum(s["num_correct"] for s in summary["per_source"].values())),
        "mean_response_tokens": float(summary["mean_response_tokens"]),
        "finish_reasons": dict(summary.get("finish_reasons", {})),
        "cpu_s": float(summary.get("cpu_s", 0.0)),
    }


def evaluate_model(
    model_dir: str,
    test_file: str,
    out_dir: str,
    *,
    max_tokens: int,
    eval_samples: int,
    env: Mapping[str, str],
    rollout: str = "vllm",
    timeout_s: Optional[float] = None,
    reuse: bool = False,
    greedy: bool = True,
    probe: Optional[dict] = None,
    only_finished: bool = False,
) -> dict:
    """``{"greedy": headline or None, "sampled": headline or None, "probe": headline or None, "files": {...},
    "cpu_s"}`` on ``test_file``, all in one process (the per-sample output files give the per-problem scores of
    ``reproduce.stats``); ``greedy=False`` skips greedy decoding (the learning-rate grid scores avg@k only).

    ``probe``: also sample the training prompts at the rollout temperature, ``probe_command``'s keywords.
    """
    calls: dict[str, tuple[list[str], str]] = {}
    if probe is not None:
        calls["probe"] = probe_command(model_dir, out_dir, rollout=rollout, **probe)
    if greedy:
        out = os.path.join(out_dir, "greedy.jsonl")
        calls["greedy"] = (
            eval_command(model_dir, test_file, out, n=1, temperature=0.0, max_tokens=max_tokens, rollout=rollout),
            out,
        )
    if eval_samples > 0:
        out = os.path.join(out_dir, f"t0.6_n{eval_samples}.jsonl")
        calls["sampled"] = (
            eval_command(
                model_dir, test_file, out, n=eval_samples, temperature=0.6, max_tokens=max_tokens, rollout=rollout
            ),
            out,
        )
    summaries = run_evals(
        list(calls.values()),
        env,
        timeout_s,
        reuse,
        log_path=os.path.join(out_dir, "eval.log"),
        only_finished=only_finished,
    )
    result: dict = {
        "greedy": None,
        "sampled": None,
        "probe": None,
        "files": {name: out for name, (_, out) in calls.items()},
    }
    for name, summary in zip(calls, summaries):
        result[name] = headline(summary)
    if result["sampled"]:
        result["sampled"]["k"] = eval_samples
    if result["probe"]:
        result["probe"].update(temperature=probe["temperature"], rows=probe["rows"], n=probe["n"])
    result["cpu_s"] = sum(h["cpu_s"] for h in (result["greedy"], result["sampled"], result["probe"]) if h)
    return result


def probe_command(
    model_dir: str,
    out_dir: str,
    *,
    train_file: str,
    n: int,
    rows: int,
    max_tokens: int,
    temperature: float,
    rollout: str = "vllm",
) -> tuple[list[str], str]:
    """The start-model probe: ``n`` responses for the first ``rows`` training prompts at the rollout temperature
    (how on-policy GRPO first sees them)."""
    out = os.path.join(out_dir, f"train_t{temperature:g}_n{n}.jsonl")
    return eval_command(
        model_dir, train_file, out, n=n, temperature=temperature, max_tokens=max_tokens, rollout=rollout, max_rows=rows
    ), out
