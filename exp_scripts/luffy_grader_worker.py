"""Subprocess side of ``grader_agreement.py --luffy``: grades answers with LUFFY's OWN code, loaded from a checkout
outside this project (``--luffy_src``, e.g. /tmp/luffy_src extracted from github ElliottYan/LUFFY).

Nothing from LUFFY is copied here: its files are imported from ``--luffy_src`` by path. The worker reads one JSON
request per line on stdin, ``{"grader": name, "text": raw_response, "gt": ground_truth, "ds": data_source}``,
and answers one JSON line ``{"verdict": ...}`` (or ``{"error": "..."}``). The parent process owns the per-answer
time limit (it kills and restarts this worker), because LUFFY's graders set their own SIGALRM timers.

Graders (LUFFY's call paths, docs/METHOD.md §4.1 and §4.4):
- ``v0`` .. ``v3``: ``main_mix_ppo._select_rm_score_fn`` of the version on ``"<think>\\n" + response``
  (the RewardManager's prefix); v1 returns LUFFY's reward value, the others its bool.
- ``eval_mv``: ``generate_vllm.py``'s default label for a think-format prompt: split after ``</think>``
  (a missing tag is False), then ``labeling_responses`` (math-verify, gold wrapped in ``$``).
- ``eval_oat`` / ``eval_oat_any``: ``--add_oat_evaluate`` (without / with ``--any_true``): OAT's
  ``boxed_reward_fn(fast=False)`` on the split text, or on the whole text when the split raised.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import types


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_luffy(src: str) -> dict:
    """LUFFY's score functions by grader name, imported from the checkout at ``src``."""
    root = os.path.join(src, "luffy")
    sys.path.insert(0, root)  # LUFFY's own ``deepscaler`` package
    # deepscaler.utils (LLM judge clients) is imported by math_reward but only used with enable_llm=True.
    stub = types.ModuleType("deepscaler.utils")
    stub.call_gemini_llm = stub.call_oai_rm_llm = None
    sys.modules["deepscaler.utils"] = stub
    import deepscaler.rewards.math_reward as math_reward  # noqa: E402 (LUFFY's module)

    mix = os.path.join(root, "verl", "verl", "mix_src")
    with_format = _load("luffy_reward_with_format", os.path.join(mix, "reward_with_format.py"))
    mv_reward = _load("luffy_math_verify_reward", os.path.join(mix, "math_verify_reward.py"))
    oat = _load("luffy_oat_math_grader", os.path.join(src, "eval_scripts", "oat_math_grader.py"))
    from math_verify import parse, verify

    def nothink(solution_str, ground_truth):  # main_mix_ppo.deepscaler_reward_fn_nothink
        return math_reward.deepscaler_reward_fn(f"<think>\n</think>\n{solution_str}", ground_truth)

    def eval_label(text, gt):  # generate_vllm.labeling_responses, one response
        return verify(parse("$" + gt + "$"), parse(text))

    def eval_flow(response, gt, oat_mode):
        generated = "<think>\n" + response
        label = None
        try:
            generated = generated.split("</think>")[1]
        except IndexError:
            label = False
        if label is None:
            try:
                label = bool(eval_label(generated, gt))
            except Exception:  # noqa: BLE001 - LUFFY's eval catches and labels False
                label = False
        if oat_mode is None:
            return label
        oat_label = oat.boxed_reward_fn(generated, gt, fast=False)[1] == 1.0
        return (label or oat_label) if oat_mode == "any" else oat_label

    think = "<think>\n"
    return {
        "v0": lambda r, gt: bool(math_reward.deepscaler_reward_fn(think + r, gt)),
        "v1": lambda r, gt: float(with_format.deepscaler_reward_fn_impl1(think + r, gt)),
        "v2": lambda r, gt: bool(nothink(think + r, gt)),
        "v3": lambda r, gt: bool(mv_reward.reward_fn_math_verify(think + r, gt)),
        "eval_mv": lambda r, gt: eval_flow(r, gt, None),
        "eval_oat": lambda r, gt: eval_flow(r, gt, "oat"),
        "eval_oat_any": lambda r, gt: eval_flow(r, gt, "any"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--luffy_src", required=True)
    args = parser.parse_args()
    graders = load_luffy(args.luffy_src)
    out = sys.stdout
    sys.stdout = sys.stderr  # LUFFY's graders print; keep the protocol channel clean
    for line in sys.stdin:
        request = json.loads(line)
        try:
            verdict = graders[request["grader"]](request["text"], request["gt"])
            reply = {"verdict": verdict}
        except Exception as err:  # noqa: BLE001 - recorded; a LUFFY reward call that raises
            reply = {"error": f"{type(err).__name__}: {err}"[:200]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
