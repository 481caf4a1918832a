"""Comments, docstrings and YAML/shell comments of the product cite papers and the authors' repositories and
commits, never documents outside the repository or tracker / review ids.

Scanned: every ``.py``, ``.sh``, ``.yaml``, ``.yml``, ``.md`` and ``.txt`` file under ``verl``, ``luffy_pool``,
``deepscaler``, ``exp_scripts`` and ``eval_scripts``, and those directly in ``data``. A reference to the repository's
own docs (``docs/METHOD.md §3``) is fine; a pointer that a reader of the repository cannot follow is not: the
planning documents kept beside the checkout (``METHODS_SPEC``, ``LUFFY_SPEC``, ``PARALLELISM_NOTES``, ``REVIEW_*``,
anything under ``../shared``), review finding ids (``REVIEW H3``) and tracker ids (``issue #32``, ``(issue 5``).
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT_DIRS = ("verl", "luffy_pool", "deepscaler", "exp_scripts", "eval_scripts")
TOP_LEVEL_ONLY_DIRS = ("data",)  # data/ also holds parquet / jsonl tables and their folders
TEXT_SUFFIXES = (".py", ".sh", ".yaml", ".yml", ".md", ".txt")

FORBIDDEN = [
    ("planning document outside the repository", re.compile(r"METHODS_SPEC|LUFFY_SPEC|PARALLELISM_NOTES")),
    ("review document or finding id", re.compile(r"\bREVIEW(?:_|\s+[A-Z]+\d)")),
    ("path outside the repository", re.compile(r"\.\./shared\b")),
    ("tracker issue id", re.compile(r"\bissue\s*#\s*\d+|\(issue\s+#?\d+", re.IGNORECASE)),
]


def product_text_files() -> list[str]:
    """Paths (relative to the repository root) of the scanned files, sorted."""
    paths = []
    for top in PRODUCT_DIRS:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            paths += [os.path.join(folder, f) for f in files if f.endswith(TEXT_SUFFIXES)]
    for top in TOP_LEVEL_ONLY_DIRS:
        folder = os.path.join(ROOT, top)
        paths += [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(TEXT_SUFFIXES)]
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def forbidden_citations(text: str) -> list[tuple[int, str, str]]:
    """``(line number, kind, matched text)`` of every forbidden reference in ``text``."""
    hits = []
    for number, line in enumerate(text.splitlines(), start=1):
        for kind, pattern in FORBIDDEN:
            hits += [(number, kind, m.group(0)) for m in pattern.finditer(line)]
    return hits


def test_patterns_catch_the_forbidden_forms_and_pass_citations():
    bad = [
        "# see METHODS_SPEC §5.2",
        '"""Settings (LUFFY_SPEC §3)."""',
        "# PARALLELISM_NOTES.md",
        "# (REVIEW H3: one CUDA context per rank)",
        "# REVIEW_2026-12.md",
        "# ../shared/docs/ARCHITECTURE.md",
        '"""Benchmarks (issue #33 item 1)."""',
        "# lost workers (Issue #34)",
        "# the family (issue 32, item 5)",
    ]
    for line in bad:
        assert forbidden_citations(line), line
    fine = [
        "# (docs/METHOD.md §6; arXiv 2510.02245)",
        "# ElliottYan/LUFFY ExGRPO/exp_scripts/run_exgrpo.sh (commit 01f4ae06)",
        "# Max global gradient norm (L2); Qwen2.5-Math-7B on an H100",
        "# the issue this works around is vLLM's own timeout",
        "reviewed = review_rows(rows)",
    ]
    for line in fine:
        assert not forbidden_citations(line), line


def test_product_cites_no_review_ids_or_outside_documents():
    files = product_text_files()
    assert len(files) > 100, files  # the walk found the product, not an empty tree
    found = []
    for rel in files:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            found += [f"{rel}:{n}: {kind}: {text!r}" for n, kind, text in forbidden_citations(f.read())]
    assert not found, "cite papers / the authors' repositories instead:\n" + "\n".join(found)
