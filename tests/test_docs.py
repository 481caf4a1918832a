"""README.md and the docs site (mkdocs.yml), checked without a build: the README stays short, every page of docs/
is in the site's nav, the README's methods table is the Methods page's, and what the README names (its links and
their anchors, the repository paths and `python -m` modules of its commands) exists. `.ci/run` builds the site with
`mkdocs build --strict`, which checks the links inside docs/."""

import os
import re

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
README_MAX_LINES = 250  # issue #47: the README is the entry point; the rest lives in docs/


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _nav_pages(entries) -> list[str]:
    """The page paths of a mkdocs nav (nested lists of ``{title: path | [entries]}``), in order."""
    pages = []
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def _docs_pages() -> set[str]:
    return {
        os.path.relpath(os.path.join(folder, name), DOCS).replace(os.sep, "/")
        for folder, _, names in os.walk(DOCS)
        for name in names
        if name.endswith(".md")
    }


def _methods_table(text: str) -> list[str]:
    """The rows of the table whose header starts ``| method | mechanism |``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | mechanism |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _headings_slugs(text: str) -> set[str]:
    """The anchors mkdocs gives a page's headings (Python-Markdown's toc slugify; code blocks skipped)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    headings = re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in headings}


def test_readme_is_at_most_250_lines():
    n = len(_read(README).splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move the detail to a page of docs/"


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists():
    config = yaml.safe_load(_read(os.path.join(ROOT, "mkdocs.yml")))
    assert config["docs_dir"] == "docs"
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    pages = _docs_pages()
    assert pages - set(nav) == set(), "docs/ pages missing from mkdocs.yml's nav"
    assert set(nav) - pages == set(), "nav entries without a page in docs/"


def test_readme_methods_table_is_the_methods_pages():
    readme, page = _methods_table(_read(README)), _methods_table(_read(os.path.join(DOCS, "methods.md")))
    assert readme == page
    names = [re.match(r"\| `(\w+)` \|", row).group(1) for row in readme[2:]]
    from luffy_pool.methods import method_names

    assert sorted(names) == sorted(method_names()), "every registered method has its row (and no other row)"
    for row in readme[2:]:
        script = re.findall(r"`(exp_scripts/train[\w]*\.sh)`", row)[-1]
        assert os.path.isfile(os.path.join(ROOT, script)), script


def test_readme_links_and_anchors_resolve():
    links = re.findall(r"\]\(([^)\s]+)\)", _read(README))
    local = [link for link in links if not re.match(r"https?://", link)]
    assert local, "the README links to the docs pages"
    for link in local:
        path, _, anchor = link.partition("#")
        target = os.path.join(ROOT, path)
        assert os.path.isfile(target), link
        if anchor:
            assert anchor in _headings_slugs(_read(target)), link


def test_readme_commands_name_files_and_modules_that_exist():
    text = _read(README)
    blocks = "\n".join(re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S))
    assert "bash tests/run.sh" in blocks and 'bash tests/run.sh -m "not e2e"' in text
    paths = set(
        re.findall(r"\b((?:exp_scripts|eval_scripts|data|tests|luffy_pool)/[\w/.-]+\.(?:sh|py|txt|yaml))", text)
    )
    paths |= set(re.findall(r"-r (requirements[\w-]*\.txt)", blocks))
    assert len(paths) > 10
    for path in sorted(paths):
        assert os.path.isfile(os.path.join(ROOT, path)), path
    modules = set(re.findall(r"python -m ([\w.]+)", text))
    assert {"luffy_pool.memory_plan", "luffy_pool.main_mix_ppo", "verl.model_merger"} <= modules
    for module in sorted(modules):
        base = os.path.join(ROOT, *module.split("."))
        assert os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__main__.py")), module


@pytest.mark.parametrize("page", ["user_guide.md", "methods.md", "memory.md", "reliability.md", "development.md"])
def test_readme_links_each_guide_page(page):
    assert f"](docs/{page}" in _read(README)
