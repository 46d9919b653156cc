"""Every citation in the repository points into the repository.

Code, tests, benchmarks, examples and docs cite the pages ``docs/sources.md`` (where each behaviour
comes from) and ``docs/numerics.md`` (the numerics and error policy) by anchor, e.g.
``docs/sources.md#npu_mla_prolog_v3``. Two checks: no file cites research notes or paths that are
not in the repository, and every ``docs/<page>.md#<anchor>`` cited exists as a heading.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from tests.test_readme import anchors

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: Text files that may carry a citation.
SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yaml", ".yml", ".json", ".sh", ""}
#: Directories never scanned (tool and build output).
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist", ".venv", "venv"}
#: Citations of documents that are not in the repository.
OUTSIDE = re.compile(r"ops_reference|DESIGN\.md|\.\./shared|shared/(?:seeds|reference)/|/work/")
#: A cited repo page and anchor: ``docs/sources.md#rope`` (also ``sources.md#rope`` inside docs/).
CITED = re.compile(r"(?<![\w/.-])((?:docs/)?[\w-]+\.md)#([\w-]+)")

THIS = pathlib.Path(__file__).resolve()


def text_files() -> list[pathlib.Path]:
    found = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
            continue
        if path.suffix in SUFFIXES and path.resolve() != THIS:
            found.append(path)
    return found


FILES = text_files()


def _lines(path: pathlib.Path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    return list(enumerate(text.splitlines(), 1))


def test_the_scan_sees_code_tests_and_docs():
    """A scan that finds nothing checks nothing."""
    names = {str(p.relative_to(ROOT)) for p in FILES}
    for expected in ("README.md", "docs/sources.md", "docs/numerics.md", "ascend_emu/ops/mla_prolog.py",
                     "tests/reference/layouts.py"):
        assert expected in names
    cited = [m for p in FILES for _, line in _lines(p) for m in CITED.finditer(line)]
    assert len(cited) > 100


def test_no_citation_leaves_the_repository():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
             for path in FILES for number, line in _lines(path) if OUTSIDE.search(line)]
    assert not found, "cite docs/sources.md or docs/numerics.md instead:\n" + "\n".join(found)


@pytest.mark.parametrize("page", ["sources.md", "numerics.md"])
def test_cited_pages_have_anchors(page):
    assert len(anchors(ROOT / "docs" / page)) > 5


def test_every_cited_anchor_exists():
    cache: dict[pathlib.Path, set[str]] = {}
    missing = []
    for path in FILES:
        for number, line in _lines(path):
            for match in CITED.finditer(line):
                page, anchor = match.groups()
                if page.startswith("docs/"):
                    target = ROOT / page
                elif path.parent == ROOT / "docs":
                    target = ROOT / "docs" / page
                else:
                    continue  # a bare page name outside docs/ (e.g. a file named in prose)
                if not target.exists():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {page} does not exist")
                    continue
                if target not in cache:
                    cache[target] = anchors(target)
                if anchor not in cache[target]:
                    missing.append(f"{path.relative_to(ROOT)}:{number}: no heading '#{anchor}' in {page}")
    assert not missing, "\n".join(missing)
