"""The Hydra overrides a launch script passes, read without running it (for the offline memory plan).

The shipped scripts are bash: ``export NAME=${NAME:-default}`` lines, bash arrays ``NAME=(k=v ...)``
spliced as ``"${NAME[@]}"``, then one ``python -m <...main_mix_ppo> key=value \\`` command
(``exp_scripts/train.sh``), or ``exec bash other.sh key=value
... "$@"`` (``train_16k.sh`` wraps ``train.sh``: its arguments land where that script writes
``"$@"``, so they win). ``script_overrides(path, extra)`` returns the override list such a run would
compose, with ``$NAME`` / ``${NAME}`` / ``${NAME:-default}`` taken from the environment first, then the
script's own defaults. No command is executed; ``$(...)`` is understood only as the script's folder
(``$(cd "$(dirname "$0")" && pwd)``) or its parent (``.../..``).
"""
from __future__ import annotations

import os
import re
import shlex
from typing import Mapping, Optional, Sequence

_ENTRY = re.compile(r"-m\s+(verl\.mix_src|luffy_pool)\.main_mix_ppo\b")
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class LaunchScriptError(ValueError):
    pass


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and comments dropped."""
    out, current = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not current and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    if current:
        out.append(current)
    return out


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$NAME``, ``${NAME}``, ``${NAME:-default}`` from ``env`` (unset -> the default, else '')."""
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        value = env.get(name)
        if value in (None, "") and m.group(2) is not None:
            return expand(m.group(2), env)
        return value or ""

    return _VAR.sub(sub, text)


def _assignment_value(raw: str, script: str, env: Mapping[str, str]) -> str:
    raw = raw.strip()
    if raw.startswith("$("):  # ROOT=$(cd "$(dirname "$0")/.." && pwd) and HERE=$(cd "$(dirname "$0")" && pwd)
        here = os.path.dirname(os.path.abspath(script))
        return os.path.dirname(here) if '/.."' in raw or "/.. " in raw else here
    words = shlex.split(raw, comments=True)
    return expand(words[0], env) if words else ""


def script_overrides(script: str, extra: Sequence[str] = (), env: Optional[Mapping[str, str]] = None) -> list[str]:
    """The Hydra overrides ``bash script *extra`` would pass to the trainer (flags such as ``--cfg`` dropped)."""
    if not os.path.isfile(script):
        raise LaunchScriptError(f"launch script {script}: no such file")
    scope = dict(os.environ if env is None else env)
    with open(script) as f:
        lines = _logical_lines(f.read())
    arrays: dict[str, list[str]] = {}
    for line in lines:
        m = _ASSIGN.match(line)
        if m and m.group(2).startswith("("):  # NAME=(a b ...): a bash array, spliced where "${NAME[@]}" is
            arrays[m.group(1)] = [expand(w, scope) for w in shlex.split(m.group(2).strip()[1:-1], comments=True)]
            continue
        if m and not line.lstrip().startswith(("if ", "[")):
            name = m.group(1)
            if name in scope and scope[name] and "${" + name + ":-" in m.group(2):
                continue  # NAME=${NAME:-default} keeps the caller's value
            scope[name] = _assignment_value(m.group(2), script, scope)
            continue
        words = line.split()
        if _ENTRY.search(line):
            return _arguments(line, scope, extra, after=_ENTRY, arrays=arrays)
        # exec bash other.sh args "$@": the other script with these args as its "$@"
        if len(words) >= 2 and words[0] in ("exec", "bash") and any(w.strip('"').endswith(".sh") for w in words[1:]):
            tokens = shlex.split(line, comments=True)
            i = next(k for k, w in enumerate(tokens) if w.endswith(".sh"))
            inner = expand(tokens[i], scope)
            if not os.path.isabs(inner):
                inner = os.path.join(os.path.dirname(os.path.abspath(script)), inner)
            args = _expand_args(tokens[i + 1:], scope, extra, arrays)
            return script_overrides(inner, args, scope)
    raise LaunchScriptError(f"launch script {script}: no `python -m luffy_pool.main_mix_ppo` (or verl.mix_src) command "
                            "and no `bash other.sh` call found")


def _expand_args(tokens: Sequence[str], scope: Mapping[str, str], extra: Sequence[str],
                 arrays: Optional[Mapping[str, list]] = None) -> list[str]:
    out = []
    for tok in tokens:
        array = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}", tok)
        if tok == "$@":
            out += list(extra)
        elif array:
            out += list((arrays or {}).get(array.group(1), []))
        else:
            out.append(expand(tok, scope))
    return out


def _arguments(line: str, scope, extra, after: re.Pattern, arrays=None) -> list[str]:
    m = after.search(line)
    # shlex drops the quotes of "$@" and "trainer.logger=[...]", as bash would
    tokens = shlex.split(line[m.end():], comments=True)
    args = _expand_args(tokens, scope, extra, arrays)
    return [a for a in args if "=" in a and not a.startswith("-")]
