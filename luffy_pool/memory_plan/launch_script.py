"""The Hydra overrides a launch script passes, for the offline memory plan.

The same overrides composed and checked (``script_config_problems``) are what a launch would be refused with.
The script is read the way the rehearsal reads it (``luffy_pool.run.recipe.read_recipe``): bash runs it with a
stand-in ``$PYTHON`` that records its command line and starts nothing, so bash arrays, ``${NAME:-default}``,
``exec bash train.sh ... "$@"`` wrappers and anything else a script does give exactly the overrides a real
launch composes. Environment variables (``MODEL_PATH``, ``DATA_DIR``, ...) come from ``env``. A script the plan
does not cover (the SFT trainer) states the GPU it needs in one ``# GPU: ...`` comment line, quoted in the refusal.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from luffy_pool.run.recipe import RecipeError, read_recipe


class LaunchScriptError(ValueError):
    pass


def script_overrides(script: str, extra: Sequence[str] = (), env: Optional[Mapping[str, str]] = None) -> list[str]:
    """The Hydra overrides ``bash script *extra`` passes to the trainer (flags such as ``--cfg`` dropped)."""
    try:
        recipe = read_recipe(script, None if env is None else dict(env), args=list(extra))
    except RecipeError as exc:
        raise LaunchScriptError(str(exc)) from exc
    if recipe.kind != "rl":
        need = gpu_line(script)
        raise LaunchScriptError(
            f"launch script {script}: runs {recipe.module}; the memory plan covers the RL trainer"
            + (f" (the script says: {need})" if need else "")
        )
    return [a for a in recipe.overrides if "=" in a and not a.startswith("-")]


def gpu_line(script: str) -> str:
    """The script's own one-line statement of the GPU it needs (a ``# GPU: ...`` comment line), "" when none."""
    with open(script) as f:
        for line in f:
            if line.startswith("# GPU: "):
                return line[2:].strip()
    return ""


def script_config_problems(
    script: str, extra: Sequence[str] = (), env: Optional[Mapping[str, str]] = None
) -> list[str]:
    """What a launch of ``bash script *extra`` is refused with before any worker starts, one line each (empty:
    none): its composed config with ``algorithm.method`` applied, through the config checker, which reads a local
    model's config.json for its positions and heads (against Ulysses SP and vLLM TP)."""
    from luffy_pool.config.check import prepare_overrides, validate_config
    from luffy_pool.config.compose import compose_config
    from luffy_pool.config.method_group import apply_method

    config = compose_config(prepare_overrides(script_overrides(script, extra, env)))
    try:
        apply_method(config)
    except ValueError as exc:
        return [str(exc)]
    return validate_config(config)
