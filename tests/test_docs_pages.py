"""The README stays a short entry page: under 1,800 words, one line per op, each op's detail under
its own heading in docs/ops.md and its sources under the same name in docs/sources.md."""

from __future__ import annotations

import pathlib
from tests.test_readme import anchors, links

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The README's size limit, in whitespace-separated words (code blocks included).
README_MAX_WORDS = 1800


def test_readme_is_short():
    words = len(README.read_text().split())
    assert words < README_MAX_WORDS, f"README.md has {words} words; move detail to docs/ (at most {README_MAX_WORDS - 1})"


def _readme_op_anchors() -> list[str]:
    return [t.partition("#")[2] for _, t in links(README) if t.startswith("docs/ops.md#") and t != "docs/ops.md#operators"]


def test_every_readme_op_has_a_heading_in_ops_and_in_sources():
    ops = _readme_op_anchors()
    assert len(ops) >= 15, ops  # a parser that finds nothing checks nothing
    in_ops = anchors(ROOT / "docs" / "ops.md")
    assert not [a for a in ops if a not in in_ops]
    in_sources = anchors(ROOT / "docs" / "sources.md")
    assert not [a for a in ops if a not in in_sources]
    ops_text = (ROOT / "docs" / "ops.md").read_text()
    for op in ops:  # each op's section names its sources
        section = ops_text.split(f"### {op}\n", 1)[1].split("\n#", 1)[0]
        assert f"(sources.md#{op})" in section, f"docs/ops.md#{op} does not link sources.md#{op}"


def test_readme_op_table_is_one_line_per_op():
    table = [line for line in README.read_text().splitlines() if line.startswith("| [`")]
    assert table and all(len(line) < 240 for line in table), [line for line in table if len(line) >= 240]
