"""The recipe's SP x TP rehearsal on the GPUs that hold its layout (``exp_scripts/gpu_smoke.py --recipe``), through
``exp_scripts/rehearse.sh --device cuda``."""

from __future__ import annotations

import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def sp_tp_ranks(sp: int, tp: int, gpus: int) -> int:
    """GPUs for the recipe's SP x TP rehearsal (two DP groups when the machine has them, as the CPU rehearsal
    runs), 0 when there is no parallel layout to check or too few GPUs to hold it."""
    from math import lcm

    from luffy_pool.run.recipe import rehearsal_world

    need = lcm(sp, tp)
    if need == 1 or gpus < need:
        return 0
    return min(rehearsal_world(sp, tp, 4), gpus // need * need)


def run_sp_tp(script: str, sp: int, tp: int, gpus: int, work: str) -> dict:
    """The recipe rehearsed on ``sp_tp_ranks`` GPUs: {"ranks", "rc", "steps"}; {"skipped": why} without them."""
    import re
    import subprocess

    ranks = sp_tp_ranks(sp, tp, gpus)
    if not ranks:
        from math import lcm

        why = "no SP/TP in the recipe" if sp * tp == 1 else f"SP {sp} x TP {tp} needs {lcm(sp, tp)} GPUs, {gpus} seen"
        print(f"[gpu_smoke] SP/TP rehearsal skipped: {why}", flush=True)
        return {"skipped": why}
    cmd = [
        "bash",
        os.path.join(ROOT, "exp_scripts", "rehearse.sh"),
        script,
        "--device",
        "cuda",
        "--ranks",
        str(ranks),
        "--work",
        work,
    ]
    print(f"[gpu_smoke] SP {sp} x TP {tp} on {ranks} GPUs: {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    steps = sorted({int(m) for m in re.findall(r"^step:(\d+) - ", proc.stdout, re.M)})
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], flush=True)
    return {"ranks": ranks, "rc": proc.returncode, "steps": steps}
