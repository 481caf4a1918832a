"""What one config key is, from its one declaration: ``python -m luffy_pool.config.describe KEY [KEY ...]``.

Prints the key's type, YAML default, allowed values (from the registry or module that owns them), bounds,
whether LUFFY's key acts here or is accepted at its default only (and why), refused values, and its doc: the
comment above it in mix_ppo_trainer.yaml (verl's worker keys: verl/trainer/config/ppo_worker.yaml), which is
the key's documentation for users and LUFFY alike and is not restated in code. An unknown key is answered with
the closest valid one.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Optional

import yaml

from luffy_pool.config.check import (
    BASE_CONFIG_NAME,
    CONFIG_DIR,
    declared,
    method_knobs,
    schema_defaults,
    unknown_key_message,
)
from verl.utils.config_section import DEFAULT_ONLY
from verl.workers.worker_config import WORKER_CONFIG_PATH


@functools.lru_cache(maxsize=None)
def yaml_docs(path: Optional[str] = None) -> dict[str, str]:
    """Dotted key -> the comment lines right above it in the YAML (joined, ``#`` stripped); without ``path``, in
    mix_ppo_trainer.yaml and verl's worker YAML it composes (verl/trainer/config/ppo_worker.yaml)."""
    if path is None:
        return {**yaml_docs(WORKER_CONFIG_PATH), **yaml_docs(os.path.join(CONFIG_DIR, f"{BASE_CONFIG_NAME}.yaml"))}
    text = open(path).read()
    lines = text.splitlines()
    docs: dict[str, str] = {}
    stack = [("", yaml.compose(text))]
    while stack:
        prefix, node = stack.pop()
        if not isinstance(node, yaml.MappingNode):
            continue
        for key_node, value in node.value:
            dotted = f"{prefix}{key_node.value}"
            above, i = [], key_node.start_mark.line - 1
            while i >= 0 and lines[i].lstrip().startswith("#"):
                above.insert(0, lines[i].lstrip().lstrip("#").strip())
                i -= 1
            docs[dotted] = " ".join(a for a in above if a)
            stack.append((dotted + ".", value))
    return docs


def describe(key: str) -> str:
    """The lines ``describe`` prints for one dotted key."""
    owner, d = method_knobs().get(key, (None, declared().get(key)))  # a method's knob: declared in its module
    if d is None:
        return unknown_key_message(key)
    lines = [key, f"  type: {' | '.join('null' if t is type(None) else t.__name__ for t in d.types)}"]
    if owner is not None:
        lines.append(f"  default: {d.default!r} (with algorithm.method={owner})")
    else:
        lines.append(f"  default: {schema_defaults().get(key)!r}" if not d.optional else "  optional: add it with '+'")
    lines += [f"  allowed: {', '.join(map(str, d.allowed()))}"] if d.choices is not None else []
    lines += [f"  bounds: {d.bounds.message}"] if d.bounds is not None else []
    lines.append(f"  LUFFY: accepted at its default only ({d.why})" if d.luffy == DEFAULT_ONLY else "  LUFFY: acts")
    for value, why in d.refuse.items():
        lines.append(f"  refused: {value!r} ({why})")
    doc = d.doc or yaml_docs().get(key)
    return "\n".join(lines + ([f"  doc: {doc}"] if doc else []))


def main(argv=None) -> int:
    keys = sys.argv[1:] if argv is None else argv
    if not keys:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    print("\n".join(describe(k) for k in keys))
    return 0 if all(k in declared() or k in method_knobs() for k in keys) else 1


if __name__ == "__main__":
    sys.exit(main())
