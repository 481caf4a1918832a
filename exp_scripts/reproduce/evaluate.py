"""Score a model folder with the project's eval pipeline (``eval_scripts/generate_vllm.py``), in a subprocess.

Held-out evaluation is greedy pass@1 plus, optionally, avg@k at T=0.6 (LUFFY's eval temperature); the
probe of the untrained model samples the training prompts at the rollout temperature, which is how
on-policy GRPO would first see them. Prompts are rendered exactly as in training (the system turn is
kept when the data has one) and graded with math-verify after ``</think>``, as the training reward.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Mapping, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GENERATE = os.path.join(REPO, "eval_scripts", "generate_vllm.py")


def summary_file(output_file: str) -> str:
    """Where generate_vllm.py writes its summary for ``output_file``."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from eval_scripts.generate_vllm import summary_path

    return summary_path(output_file)


def eval_command(model_dir: str, input_file: str, output_file: str, *, n: int, temperature: float, max_tokens: int,
                 rollout: str = "vllm", max_rows: Optional[int] = None, seed: int = 0) -> list[str]:
    cmd = [sys.executable, GENERATE, "--model_path", model_dir, "--input_file", input_file, "--output_file", output_file,
           "--n", str(n), "--temperature", str(temperature), "--max_new_tokens", str(max_tokens),
           "--remove_system", "False", "--dtype", "float32", "--backend", rollout, "--seed", str(seed)]
    if rollout == "hf":  # 128 prompts per generate call: measured 1.4x less CPU than the default 16 on the tiny model
        cmd += ["--hf_batch_size", "128"]
    if max_rows is not None:
        cmd += ["--max_rows", str(max_rows)]
    return cmd


def run_eval(cmd: list[str], output_file: str, env: Mapping[str, str], timeout_s: Optional[float] = None,
             reuse: bool = False) -> dict:
    """Run one generate_vllm.py command (log next to ``output_file``) and return its JSON summary.

    ``reuse``: when the summary of exactly this command exists (``<output stem>.cmd.json``), return it.
    """
    os.makedirs(os.path.dirname(os.path.abspath(output_file)), exist_ok=True)
    cmd_file = os.path.splitext(output_file)[0] + ".cmd.json"
    if reuse and os.path.exists(cmd_file) and os.path.exists(summary_file(output_file)):
        with open(cmd_file) as f:
            same = json.load(f) == list(cmd)
        if same:
            with open(summary_file(output_file)) as f:
                return json.load(f)
    log_path = os.path.splitext(output_file)[0] + ".log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env), cwd=REPO, timeout=timeout_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"evaluation failed (exit {proc.returncode}); see {log_path}")
    with open(summary_file(output_file)) as f:
        summary = json.load(f)
    # One process (the in-process engine): its rusage is its CPU time.
    summary["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(summary_file(output_file), "w") as f:
        json.dump(summary, f, indent=1)
    with open(cmd_file, "w") as f:
        json.dump(list(cmd), f)
    return summary


def headline(summary: Mapping) -> dict:
    """The numbers the report uses from one generate_vllm.py summary."""
    return {"accuracy": float(summary["accuracy"]), "samples": int(summary["samples"]),
            "correct": int(sum(s["num_correct"] for s in summary["per_source"].values())),
            "mean_response_tokens": float(summary["mean_response_tokens"]),
            "finish_reasons": dict(summary.get("finish_reasons", {})), "cpu_s": float(summary.get("cpu_s", 0.0))}


def evaluate_model(model_dir: str, test_file: str, out_dir: str, *, max_tokens: int, eval_samples: int,
                   env: Mapping[str, str], rollout: str = "vllm", timeout_s: Optional[float] = None,
                   reuse: bool = False, greedy: bool = True) -> dict:
    """``{"greedy": headline or None, "sampled": headline or None, "files": {"greedy": path, "sampled": path}}`` on
    ``test_file`` (the per-sample output files give the per-problem scores of ``reproduce.stats``); ``greedy=False``
    skips greedy decoding (the learning-rate grid scores avg@k only)."""
    result: dict = {"greedy": None, "sampled": None, "files": {}}
    if greedy:
        greedy_out = os.path.join(out_dir, "greedy.jsonl")
        result["greedy"] = headline(run_eval(eval_command(model_dir, test_file, greedy_out, n=1, temperature=0.0,
                                                          max_tokens=max_tokens, rollout=rollout),
                                             greedy_out, env, timeout_s, reuse))
        result["files"]["greedy"] = greedy_out
    if eval_samples > 0:
        sampled_out = os.path.join(out_dir, f"t0.6_n{eval_samples}.jsonl")
        result["sampled"] = headline(run_eval(eval_command(model_dir, test_file, sampled_out, n=eval_samples,
                                                           temperature=0.6, max_tokens=max_tokens, rollout=rollout),
                                              sampled_out, env, timeout_s, reuse))
        result["sampled"]["k"] = eval_samples
        result["files"]["sampled"] = sampled_out
    result["cpu_s"] = sum(h["cpu_s"] for h in (result["greedy"], result["sampled"]) if h)
    return result


def probe_on_policy_success(model_dir: str, train_file: str, out_dir: str, *, n: int, rows: int, max_tokens: int,
                            env: Mapping[str, str], rollout: str = "vllm", temperature: float = 1.0,
                            timeout_s: Optional[float] = None, reuse: bool = False) -> dict:
    """Sample ``n`` responses for the first ``rows`` training prompts at the rollout temperature and grade them."""
    out = os.path.join(out_dir, f"train_t{temperature:g}_n{n}.jsonl")
    cmd = eval_command(model_dir, train_file, out, n=n, temperature=temperature, max_tokens=max_tokens,
                       rollout=rollout, max_rows=rows)
    return {**headline(run_eval(cmd, out, env, timeout_s, reuse)), "temperature": temperature, "rows": rows, "n": n}
