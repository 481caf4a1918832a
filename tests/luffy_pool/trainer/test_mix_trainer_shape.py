"""The trainer keeps no side channels: every attribute a method of ``MIXRayPPOTrainer`` assigns is declared in
``__init__``; values a stage computes for a later one travel as return values (``StepOutput``, the ratios)."""

from __future__ import annotations

import ast
import inspect
import textwrap

from luffy_pool.trainer import mix_trainer


def _assigned_attributes(cls) -> dict[str, set[str]]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    out: dict[str, set[str]] = {}
    for fn in tree.body[0].body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                out.setdefault(node.attr, set()).add(fn.name)
    return out


def test_every_attribute_set_outside_init_is_declared_in_init():
    assigned = _assigned_attributes(mix_trainer.MIXRayPPOTrainer)
    undeclared = {attr: sorted(methods) for attr, methods in assigned.items() if "__init__" not in methods}
    assert undeclared == {}
    assert "global_steps" in assigned and len(assigned) > 10  # the walk does see the trainer's attributes
