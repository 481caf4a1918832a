"""Several ``eval_scripts/generate_vllm.py`` commands in one process: torch, transformers and math-verify are
imported once per model instead of once per command (about 4.5 CPU s each on this machine kind).

    python exp_scripts/reproduce/eval_batch.py CALLS.json

``CALLS.json`` is a list of generate_vllm.py argument lists. Each call runs ``generate_vllm.main`` as the CLI
would, then adds ``cpu_s`` to its summary file: the process CPU seconds since the previous call ended (the
first call also carries the start-up). A call that fails stops the batch with its exit code, like the CLI.
"""

from __future__ import annotations

import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
if __name__ == "__main__" and os.environ.get("LUFFY_DEV_SPEEDUPS") == "1":  # the test harness: no collector at start
    from luffy_pool_dev.startup_gc import pause_for_startup  # dev/luffy_pool_dev/startup_gc.py

    pause_for_startup()


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print("usage: eval_batch.py CALLS.json\n\n" + (__doc__ or "").strip())
        return 0
    if len(args) != 1:
        print("usage: eval_batch.py CALLS.json", file=sys.stderr)
        return 2
    with open(args[0]) as f:
        calls = json.load(f)
    from eval_scripts.generate_vllm import build_parser, main as generate_main, summary_path
    from verl.utils.data_format import run_cli

    startup_gc = sys.modules.get("luffy_pool_dev.startup_gc")  # loaded where the harness paused the collector
    if startup_gc is not None:
        startup_gc.end_startup()

    used = 0.0
    for call in calls:
        code = run_cli(generate_main, call)
        if code:
            return code
        now = time.process_time()
        path = summary_path(build_parser().parse_args(call).output_file)
        with open(path) as f:
            summary = json.load(f)
        summary["cpu_s"] = now - used
        used = now
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
