"""``python -m luffy_pool.memory_plan [SCRIPT] [--gpu-memory 80] [--model-config PATH] [--config-overrides k=v ...] [-- k=v ...]``

SCRIPT is a launch script (exp_scripts/train.sh, train_16k.sh): its Hydra overrides are read without
running it (MODEL_PATH / DATA_DIR from the environment as the script would); the overrides given here
come after them and win. Without SCRIPT the YAML defaults are composed with the overrides. Needs the
model's config.json only (local folder, HF cache, or the fallback table of known shapes); no data, no
GPU. Exit 0 when every phase fits with a 5 % margin, 1 when one does not (the keys to change are named).
"""

from __future__ import annotations

import argparse
import sys

from luffy_pool.memory_plan import (
    GiB,
    HEADROOM_FRACTION,
    over_budget_message,
    parse_gpu_memory,
    plan_for_config,
    render,
)
from luffy_pool.config.sections import ConfigSections
from luffy_pool.memory_plan.report import rollout_rows_per_engine


def parse_args(argv):
    argv = list(argv)
    tail = []
    if "--" in argv:
        k = argv.index("--")
        argv, tail = argv[:k], argv[k + 1 :]
    p = argparse.ArgumentParser(prog="python -m luffy_pool.memory_plan", description=__doc__.split("\n\n")[1])
    p.add_argument("script", nargs="?", help="launch script (bash) whose overrides to read")
    p.add_argument("--gpu-memory", default="80", help="device memory: a card's GB as sold (80, 141) or e.g. 79.2GiB")
    p.add_argument("--model-config", help="config.json (or its folder) of the model, instead of model.path")
    p.add_argument("--config-overrides", nargs="*", default=[], metavar="KEY=VALUE", help="Hydra overrides")
    p.add_argument(
        "--readme-table",
        action="store_true",
        help="print the table in docs/memory.md: the shipped recipes (TABLE_ROWS) on 80 and 141 GB GPUs",
    )
    args = p.parse_args(argv)
    args.overrides = list(args.config_overrides) + tail
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from luffy_pool.config.compose import compose_config
    from luffy_pool.memory_plan.launch_script import LaunchScriptError, script_overrides
    from luffy_pool.config.method_group import apply_method

    if args.readme_table:
        print(readme_table())
        return 0
    try:
        device_bytes = parse_gpu_memory(args.gpu_memory)
        overrides = script_overrides(args.script, args.overrides) if args.script else args.overrides
        config = compose_config(overrides)
        apply_method(config)  # the method's preset and knob defaults, as the trainer merges them
        plan = plan_for_config(config, device_bytes, model_config=args.model_config)
    except (LaunchScriptError, FileNotFoundError, ValueError) as exc:
        print(f"memory plan: {exc}", file=sys.stderr)
        return 2
    title = (
        f"memory plan of {args.script or 'the composed config'} on a {args.gpu_memory} GB GPU "
        f"({device_bytes / GiB:.1f} GiB)"
    )
    print(render(plan, title, rows_per_engine=rollout_rows_per_engine(ConfigSections.from_config(config))))
    bad = plan.over(HEADROOM_FRACTION) or any("refuse" in n or "raises" in n for n in plan.notes)
    if bad:
        for line in over_budget_message(plan) or [f"memory plan: less than {HEADROOM_FRACTION:.0%} headroom"]:
            print(line)
        if not plan.over(0.0):
            print(
                f"memory plan: fits, but with less than {HEADROOM_FRACTION:.0%} headroom in: "
                + ", ".join(p.name for p in plan.over(HEADROOM_FRACTION))
            )
        return 1
    return 0


def readme_table(env=None) -> str:
    """The shipped recipes' per-phase peaks (the table in docs/memory.md), MODEL_PATH at the scripts' default."""
    import os

    from luffy_pool.config.compose import compose_config
    from luffy_pool.memory_plan.launch_script import script_overrides
    from luffy_pool.memory_plan.report import markdown_table

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        k: v for k, v in (os.environ if env is None else env).items() if k not in ("MODEL_PATH", "DATA_DIR", "ACTOR_PP")
    }
    rows = []
    for label, name, model, extra, node_counts in TABLE_ROWS:
        for gpu in ("80", "141"):
            for nodes in node_counts:
                overrides = script_overrides(
                    os.path.join(here, "exp_scripts", name),
                    [f"trainer.nnodes={nodes}", *extra],
                    env=dict(env, MODEL_PATH=model) if model else env,
                )
                plan = plan_for_config(compose_config(overrides), parse_gpu_memory(gpu))
                rows.append((label, f"{gpu} GB", nodes, plan))
    return markdown_table(rows)


# docs/memory.md's table: (recipe label, script, MODEL_PATH or None for the script's default, overrides, nodes). The
# 72B row is train_32b.sh's layout (actor TP 4) on Qwen2.5-72B-Instruct with vLLM TP 8 (bf16 weights 135 GiB).
TABLE_ROWS = (
    ("`train.sh`", "train.sh", None, (), (1, 2)),
    ("`train_16k.sh`", "train_16k.sh", None, (), (1, 2)),
    ("`train_32b.sh` (Qwen2.5-32B, TP 4)", "train_32b.sh", None, (), (2,)),
    ("`train_moe.sh` (Qwen3-30B-A3B, MoE)", "train_moe.sh", None, (), (2,)),
    (
        "`train_32b.sh` on Qwen2.5-72B-Instruct, vLLM TP 8",
        "train_32b.sh",
        "Qwen/Qwen2.5-72B-Instruct",
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=8",),
        (4, 8),
    ),
)


if __name__ == "__main__":
    sys.exit(main())
