"""deepscaler.rewards is layered: no module imports (at top level or inside a function) one that imports it
back, and the bottom layer (``bounded``) still warms every grader on a process's first bounded call."""

import ast
import os
import subprocess
import sys

import deepscaler.rewards

PKG_DIR = os.path.dirname(deepscaler.rewards.__file__)
ROOT = os.path.dirname(os.path.dirname(PKG_DIR))


def _modules() -> dict[str, str]:
    mods = {}
    for folder, _, files in os.walk(PKG_DIR):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name.removesuffix(".__init__")] = path
    return mods


def _import_graph() -> dict[str, set[str]]:
    """module -> the package modules it names in any import statement (most specific module of each name)."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for full in names:
                parts = full.split(".")
                known = [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in mods]
                if known and known[-1] != name:
                    targets.add(known[-1])
        graph[name] = targets
    return graph


def _cycle(graph: dict[str, set[str]]):
    """One import cycle as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w) :] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = _import_graph()
    assert "deepscaler.rewards.selection" in graph["deepscaler.rewards"]  # the package pulls in the top layer
    assert "deepscaler.rewards.bounded" in graph["deepscaler.rewards.selection"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_a_scorer_imported_alone_warms_every_grader_on_its_first_call():
    code = (
        "from deepscaler.rewards.math_reward import deepscaler_score\n"
        "from deepscaler.rewards import bounded\n"
        "assert not bounded._warmed and bounded._warm_routine is not None\n"
        "deepscaler_score('<think>\\nx\\n</think>\\n\\\\boxed{2}', '2')\n"
        "assert bounded._warmed\n"
        "import sys; print('latex2sympy2_extended' in sys.modules, 'math_verify' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT)
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]  # the rule grader's call warmed math-verify's path too


def test_deepscaler_imports_nothing_from_verl_or_luffy_pool():
    """The rewards are the bottom of the product: verl and luffy_pool import them, never the other way round."""
    pkg = os.path.dirname(PKG_DIR)
    found = []
    for folder, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                for node in ast.walk(ast.parse(open(path).read())):
                    names = (
                        [a.name for a in node.names]
                        if isinstance(node, ast.Import)
                        else [node.module or ""]
                        if isinstance(node, ast.ImportFrom) and not node.level
                        else []
                    )
                    found += [
                        f"{os.path.relpath(path, ROOT)}: {n}"
                        for n in names
                        if n.split(".")[0] in ("verl", "luffy_pool")
                    ]
    assert found == []
