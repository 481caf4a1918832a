"""The product's import layers, read from the source with ``ast`` (nothing is imported).

The product is ``verl``, ``luffy_pool`` and ``deepscaler``. Two rules:

- no import circle among the imports a module runs when it is loaded (its module-level imports, class bodies and
  ``try`` / ``if`` blocks included, ``if TYPE_CHECKING:`` blocks excluded); imports inside functions run later and
  are listed apart (:func:`deferred_edges`), they do not count as circles;
- verl is generic: only ``verl/mix_src`` (LUFFY's own module paths, kept as aliases) imports ``luffy_pool``, at
  any depth (deepscaler's rule, no verl / luffy_pool import at all, is tests/deepscaler/rewards/test_import_layers.py).

An edge goes to the most specific product module an import names (``from luffy_pool.config import sections`` ->
``luffy_pool.config.sections``; ``from verl.trainer.ppo.core_algos import agg_loss`` ->
``verl.trainer.ppo.core_algos``).
Parent packages are not edges: Python imports a sibling through a package that is still initialising.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = ("verl", "luffy_pool", "deepscaler")
LUFFY_ALIASES = "verl.mix_src"  # LUFFY's module paths: the one part of verl that imports luffy_pool


def product_modules() -> dict[str, str]:
    """Dotted module name -> file path, for every ``.py`` file of the product packages."""
    modules = {}
    for package in PRODUCT:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    modules[name.removesuffix(".__init__")] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement of ``tree`` with whether it sits inside a function (skips ``if TYPE_CHECKING:``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from (item for child in node.orelse for item in _imports(ast.Module([child], []), in_function))
        else:
            nested = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _imports(node, nested)


def _imported_names(node: ast.stmt, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names: ``from a import b`` names ``a.b``, which resolves to the module
    ``a.b`` when there is one (Python then imports that submodule, even from a package still initialising) and to
    ``a`` when ``b`` is a name defined in ``a``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def import_edges() -> dict[str, dict[str, bool]]:
    """module -> {product module it imports: True when every such import sits inside a function}."""
    modules = product_modules()
    graph: dict[str, dict[str, bool]] = {}
    for module, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read(), filename=path)
        targets: dict[str, bool] = {}
        for node, in_function in _imports(tree):
            for full in _imported_names(node, module, path.endswith("__init__.py")):
                parts = full.split(".")
                known = [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules]
                if known and known[-1] != module:
                    targets[known[-1]] = targets.get(known[-1], True) and in_function
        graph[module] = targets
    return graph


def load_time_graph(edges: dict[str, dict[str, bool]]) -> dict[str, set[str]]:
    """The edges a module follows while it is loaded (imports outside functions)."""
    return {m: {t for t, deferred in targets.items() if not deferred} for m, targets in edges.items()}


def deferred_edges(edges: dict[str, dict[str, bool]]) -> dict[str, set[str]]:
    """The edges only imports inside functions make (not circles: they run after every module has loaded)."""
    return {m: {t for t, deferred in targets.items() if deferred} for m, targets in edges.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted), Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    circles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(circles)


def _circle_report(graph: dict[str, set[str]], circles: list[list[str]]) -> str:
    lines = []
    for members in circles:
        inside = set(members)
        lines.append(" | ".join(f"{m} -> {sorted(graph[m] & inside)}" for m in members))
    return "\n".join(lines)


def test_the_product_has_no_import_circle():
    graph = load_time_graph(import_edges())
    assert "verl.trainer.ppo.core_algos" in graph["luffy_pool.algorithm.mix_core_alg"]  # the walk sees the edges
    circles = import_circles(graph)
    assert circles == [], f"{len(circles)} import circle(s):\n{_circle_report(graph, circles)}"


def test_the_circle_finder_sees_circles_and_ignores_deferred_imports():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
    edges = {"a": {"b": False}, "b": {"a": True}}
    assert import_circles(load_time_graph(edges)) == [] and deferred_edges(edges) == {"a": set(), "b": {"a"}}


def test_imports_inside_functions_and_type_checking_blocks_are_told_apart():
    source = (
        "from typing import TYPE_CHECKING\nimport verl.a\nif TYPE_CHECKING:\n    import verl.b\n"
        "class K:\n    import verl.c\ndef f():\n    import verl.d\ntry:\n    from . import e\nexcept ImportError:\n"
        "    pass\n"
    )
    found = {
        name: in_function
        for node, in_function in _imports(ast.parse(source))
        for name in _imported_names(node, "verl.x", False)
    }
    assert found == {
        "typing.TYPE_CHECKING": False,
        "verl.a": False,
        "verl.c": False,  # a class body runs at load time
        "verl.d": True,
        "verl.e": False,  # ``from . import e`` in verl/x.py
    }


def test_no_circle_through_imports_inside_functions_either():
    edges = import_edges()
    every = {m: set(targets) for m, targets in edges.items()}
    circles = import_circles(every)
    assert circles == [], f"{len(circles)} circle(s) with function-level imports:\n{_circle_report(every, circles)}"


def _names_luffy_pool(node: ast.AST) -> bool:
    """An import of luffy_pool, or a dynamic one (``importlib.import_module("luffy_pool...")``, ``__import__``)."""
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "luffy_pool" for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return not node.level and (node.module or "").split(".")[0] == "luffy_pool"
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in ("import_module", "__import__") and any(
            isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.split(".")[0] == "luffy_pool"
            for a in node.args
        )
    return False


def test_only_verl_mix_src_imports_luffy_pool():
    """verl is generic: LUFFY's own module paths (verl/mix_src) are the one part of it that imports luffy_pool, at
    module level or inside a function."""
    found = []
    for module, path in product_modules().items():
        if module.split(".")[0] != "verl" or module == LUFFY_ALIASES or module.startswith(LUFFY_ALIASES + "."):
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), filename=path)
        found += [f"{os.path.relpath(path, ROOT)}:{n.lineno}" for n in ast.walk(tree) if _names_luffy_pool(n)]
    assert found == []
    aliases = [m for m, p in product_modules().items() if m.startswith(LUFFY_ALIASES + ".")]
    assert any(_names_luffy_pool(n) for m in aliases for n in ast.walk(ast.parse(open(product_modules()[m]).read())))


def test_the_luffy_pool_import_finder_sees_every_form():
    tree = ast.parse(
        "import luffy_pool.x as y\nfrom luffy_pool import z\nimportlib.import_module('luffy_pool.a')\n"
        "from . import luffy_pool\nimport luffy_poolish\n"
    )
    assert [n.lineno for n in ast.walk(tree) if _names_luffy_pool(n)] == [1, 2, 3]
