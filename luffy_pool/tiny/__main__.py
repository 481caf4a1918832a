"""CLI: ``python -m luffy_pool.tiny --out DIR [--data DIR]`` builds the tiny model (and task data)."""

from __future__ import annotations

import argparse
import dataclasses

from luffy_pool.tiny.arith_task import write_task_parquets
from luffy_pool.tiny.model import TinyModelSpec, build_tiny_model


def main(argv=None) -> None:
    spec = TinyModelSpec()
    ap = argparse.ArgumentParser(prog="python -m luffy_pool.tiny", description=__doc__)
    ap.add_argument("--out", required=True, help="folder for the model + tokenizer (save_pretrained layout)")
    ap.add_argument("--data", default=None, help="also write the synthetic task parquets into this folder")
    ap.add_argument("--level", type=int, default=2, help="difficulty of the synthetic task (operand digits)")
    ap.add_argument("--ops", default="+", help="operators of the synthetic task, e.g. '+*'")
    ap.add_argument("--n-train", type=int, default=512)
    ap.add_argument("--n-test", type=int, default=64)
    ap.add_argument(
        "--n-warm",
        type=int,
        default=0,
        help="also write warm.parquet: this many problems disjoint from train/test (SFT warm-start)",
    )
    for f in dataclasses.fields(spec):
        if f.type in ("int", int):
            ap.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=getattr(spec, f.name))
    ap.add_argument("--no-think", action="store_true", help="generation prompt does not open <think>")
    ap.add_argument(
        "--model-config",
        default=None,
        metavar="FILE",
        help="a real model's config.json: shrink only its sizes, keep every other field (model_config.py)",
    )
    args = ap.parse_args(argv)
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(spec) if f.type in ("int", int)}
    spec = TinyModelSpec(**kw, think=not args.no_think)
    real = None
    if args.model_config:
        from luffy_pool.tiny.model_config import read_model_config

        real = read_model_config(args.model_config)
    build_tiny_model(args.out, spec, model_config=real)
    print(f"tiny model written to {args.out}")
    if args.data:
        paths = write_task_parquets(
            args.data,
            args.n_train,
            args.n_test,
            level=args.level,
            ops=tuple(args.ops),
            seed=spec.seed,
            n_warm=args.n_warm,
        )
        print(f"synthetic task written: {paths}")


if __name__ == "__main__":
    main()
