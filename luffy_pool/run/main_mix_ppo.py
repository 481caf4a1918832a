"""Hydra entry point of the LUFFY trainer: ``python -m luffy_pool.main_mix_ppo key=value ...``.

Before Hydra composes, the command-line keys are checked against the YAML (an unknown key names the
closest valid key instead of Hydra's struct error); the composed config is then validated, resolved,
written to ``<trainer.default_local_dir>/resolved_config.yaml`` (its path printed) and handed to the Ray
launcher. ``python3 -m verl.mix_src.main_mix_ppo`` (LUFFY's module
path) is an alias. Hydra's flags work as usual; ``-m ... --cfg job`` previews every job of a sweep.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from luffy_pool.config.check import BASE_CONFIG_NAME, CONFIG_DIR, ConfigError, check_config, prepare_overrides

CONFIG_ERROR_EXIT_CODE = 2


RESOLVED_CONFIG_FILE = "resolved_config.yaml"


def write_resolved_config(config: DictConfig) -> Optional[str]:
    """The resolved config as ``<trainer.default_local_dir>/resolved_config.yaml``; None if it cannot be written
    (pre-flight then names the folder). The console gets its path, not ~300 lines."""
    path = os.path.join(
        os.path.abspath(os.path.expanduser(str(config.trainer.default_local_dir))), RESOLVED_CONFIG_FILE
    )
    from verl.utils.tracking import masked_yaml

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(masked_yaml(config))  # API keys (also inside URLs) masked on disk too
    except OSError:
        return None
    return path


def run(config: DictConfig) -> dict:
    """Validate, resolve and save the config (its path is printed), then train through Ray; returns the final metrics."""
    from luffy_pool.config.method_group import apply_method

    try:  # algorithm.method sets the keys it needs before they are checked (luffy_pool/methods/base.py)
        apply_method(config)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    check_config(config)
    OmegaConf.resolve(config)
    path = write_resolved_config(config)
    if path:
        print(f"[luffy_pool] resolved config: {path}", flush=True)
    else:
        from verl.utils.tracking import masked_yaml

        print(masked_yaml(config), flush=True)  # API keys (also inside URLs) masked
    # Imported here so --help, --cfg and config checks never pay for torch / Ray imports.
    from luffy_pool.run.launcher import run_ppo

    return run_ppo(config)


@hydra.main(config_path=CONFIG_DIR, config_name=BASE_CONFIG_NAME, version_base=None)
def hydra_main(config: DictConfig) -> None:
    """The Hydra task: one training run per composed config (one per job under -m)."""
    try:
        run(config)
    except ConfigError as exc:
        exit_with_config_error(exc)
    except Exception as exc:
        from luffy_pool.run.checkpointing import CheckpointSaveError, CheckpointUnusableError  # torch is loaded by now

        if not isinstance(exc, (CheckpointUnusableError, CheckpointSaveError)):
            raise
        print(f"Checkpoint error: {exc}", file=sys.stderr, flush=True)  # one line naming the bad file
        sys.exit(1)


def exit_with_config_error(exc: ConfigError) -> None:
    """Print every problem on its own line to stderr and exit with CONFIG_ERROR_EXIT_CODE."""
    for line in exc.errors:
        print(f"Config error: {line}", file=sys.stderr)
    sys.stderr.flush()
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def _parse_hydra_args(argv: list[str]):
    """Hydra's own arguments, overrides and flags in any order; None lets Hydra report a bad command line."""
    from hydra._internal.utils import get_args_parser

    try:
        return get_args_parser().parse_intermixed_args(argv)
    except SystemExit:
        return None


def _argv_for_hydra(argv: list[str], originals: list[str], prepared: list[str]) -> list[str]:
    """Prepared overrides first, then the flags in their order: Hydra's parser rejects overrides on both
    sides of a flag, and a flag with an optional value (--info) must not swallow an override."""
    flags, i = [], 0
    for token in argv:
        if i < len(originals) and token == originals[i]:
            i += 1
        else:
            flags.append(token)
    return prepared + flags


def preview_sweep(
    overrides: list[str],
    cfg_type: str = "job",
    resolve: bool = False,
    config_name: Optional[str] = None,
    config_dir: Optional[str] = None,
) -> None:
    """Print the config of every job a ``-m`` sweep would run (Hydra itself refuses ``-m`` with ``--cfg``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    axes = []
    for ov in OverridesParser.create().parse_overrides(overrides):
        if ov.is_sweep_override():
            axes.append([f"{ov.get_key_element()}={value}" for value in ov.sweep_string_iterator()])
        else:
            axes.append([ov.input_line])
    extra = [f"hydra.searchpath=[file://{os.path.abspath(config_dir)}]"] if config_dir else []
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        for num, job in enumerate(itertools.product(*axes)):
            cfg = compose(
                config_name or BASE_CONFIG_NAME, overrides=extra + list(job), return_hydra_config=cfg_type != "job"
            )
            shown = cfg.hydra if cfg_type == "hydra" else cfg
            print(f"# multirun job {num}: {' '.join(job)}")
            from verl.utils.tracking import mask_secrets

            masked = mask_secrets(OmegaConf.to_container(shown, resolve=resolve))  # keys in URLs too
            print(OmegaConf.to_yaml(OmegaConf.create(masked)), flush=True)


def main(config: Optional[DictConfig] = None):
    """Console entry point; ``main(config)`` validates and trains a composed config without Hydra."""
    if config is not None:
        return run(config)
    argv = sys.argv[1:]
    args = _parse_hydra_args(argv)
    if args is not None and not args.shell_completion:
        try:
            prepared = prepare_overrides(args.overrides)
        except ConfigError as exc:
            exit_with_config_error(exc)
        if args.multirun and args.cfg:
            if args.config_path:
                raise SystemExit("-m with --cfg does not support --config-path; use --config-dir")
            return preview_sweep(prepared, args.cfg, args.resolve, args.config_name, args.config_dir)
        sys.argv = [sys.argv[0]] + _argv_for_hydra(argv, args.overrides, prepared)
    return hydra_main()


if __name__ == "__main__":
    main()
