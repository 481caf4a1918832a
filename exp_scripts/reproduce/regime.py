"""The no-reward regime of reproduce_tiny.py (``--preset no_reward``): its bound on the start model's on-policy pass
rate, the check that stops the run above it, the teacher traces' pass rate printed beside it, and the regime's
statement in ``results.md``."""

from __future__ import annotations

# The no-reward regime's bound on the start model's on-policy pass rate on training prompts.
NO_REWARD_MAX_PASS = 0.01


def check_no_reward(probe: dict, limit: float = NO_REWARD_MAX_PASS) -> None:
    """The no-reward preset's precondition: ValueError unless the start model's on-policy pass rate is under ``limit``."""
    if not probe.get("samples"):
        raise ValueError("--preset no_reward: the start-model probe drew no samples (--probe-rows)")
    if probe["accuracy"] >= limit:
        raise ValueError(
            f"--preset no_reward: the start model solves {probe['correct']} of {probe['samples']} on-policy "
            f"samples of training prompts ({probe['accuracy']:.2%}), not under {limit:.0%}: this is not the "
            f"no-reward regime (fewer --warm-steps, or a harder --level)"
        )


def trace_pass_rate(train_file: str) -> dict:
    """How many teacher traces of ``train_file`` solve their problem, graded as evaluation grades (math-verify on
    the answer after ``</think>``): ``{"correct", "rows", "accuracy"}``."""
    import pandas as pd

    from eval_scripts.grading import grade_text

    rows = pd.read_parquet(train_file)
    ok = sum(
        grade_text(r.target[0]["content"], r.reward_model["ground_truth"], "math_verify", split_think=True).correct
        for r in rows.itertuples()
    )
    return {"correct": int(ok), "rows": len(rows), "accuracy": ok / len(rows) if len(rows) else 0.0}


def regime_lines(args, probe) -> list[str]:
    """The no-reward preset's statement of its regime (none for the other commands)."""
    if args.preset != "no_reward":
        return []
    return [
        "## Regime: on-policy RL finds no reward",
        "",
        f"`--preset no_reward`: the start model ({args.warm_steps} warm SFT steps instead of 160) solves "
        f"{probe['correct']} of {probe['samples']} on-policy samples of training prompts ({probe['accuracy']:.2%}, "
        f"under {NO_REWARD_MAX_PASS:.0%}, checked before any training), while the teacher traces solve "
        f"{probe['traces']['correct']} of {probe['traces']['rows']} training problems.",
        "",
    ]
