"""``python SCRIPT --help`` prints a usage and exits 0 for every command-line script the project ships.

A script is a ``.py`` file under exp_scripts/, eval_scripts/ or data/ with a ``__main__`` guard. Each runs in its own
process from the repository root, as a user would type it (a help string with a bare ``%`` once ended argparse's
``--help`` in a traceback). All start at once: a ``--help`` imports little, ~0.25 CPU-s a script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MAIN_GUARD = re.compile(r"""^if __name__ == ["']__main__["']""", re.M)


def _scripts():
    found = []
    for top in ("exp_scripts", "eval_scripts", "data"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(REPO, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                path = os.path.join(dirpath, name)
                if name.endswith(".py") and MAIN_GUARD.search(open(path, encoding="utf-8").read()):
                    found.append(os.path.relpath(path, REPO))
    return sorted(found)


def test_every_script_answers_help_with_a_usage_and_exit_0():
    scripts = _scripts()
    # the discovery finds the scripts the README and the issues name
    assert {
        "exp_scripts/reproduce_tiny.py",
        "exp_scripts/bench_async.py",
        "eval_scripts/generate_vllm.py",
        "data/prepare_train.py",
        "exp_scripts/reproduce/eval_batch.py",
    } <= set(scripts), scripts
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # what a user's shell has: the script finds the project itself
    procs = {
        s: subprocess.Popen(
            [sys.executable, s, "--help"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for s in scripts
    }
    bad = {}
    for script, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        if proc.returncode != 0 or "usage" not in out.lower() or "Traceback" in out:
            bad[script] = f"rc={proc.returncode}: {out[-600:]}"
    assert not bad, "\n".join(f"{k}: {v}" for k, v in bad.items())
