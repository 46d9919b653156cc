"""The README and ``docs/*.md`` say what runs: every ```python block runs, every relative link
resolves, and the README opens with the two commands, the second the one ``.ci/run`` runs.

A python block is written to a file and run in a fresh interpreter from an empty directory (the
repository on ``PYTHONPATH``): under ``python -m ascend_emu run`` when it imports torch_npu, as
``python block.py`` otherwise. A block opts out only with a first line ``# not run: <reason>``.
Where every ``print(...)`` of a block is a top-level line ending in a ``# ...`` comment, the
comments are the expected output, line for line.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
NOT_RUN = "# not run:"

#: The README's two commands: try it, and the test suite (what ``.ci/run`` runs).
DEMO_COMMAND = "pip install -e . && ascend-emu demo"
TEST_COMMAND = 'pip install torch==2.13.0 -e ".[torch,test,ray,dev]" && python -m pytest -q'


def fenced_blocks(path: pathlib.Path) -> list[tuple[int, str, list[str]]]:
    """``(line number of the opening fence, info string, code lines)`` of each fenced block."""
    blocks, current = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if current is None and stripped.startswith("```"):
            current = (number, stripped[3:].strip(), [])
        elif current is not None and stripped == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append(line)
    assert current is None, f"{path.name}: the block opened at line {current[0]} is never closed"
    return blocks


def python_blocks() -> list[tuple[str, list[str]]]:
    return [(f"{path.relative_to(ROOT)}:{number}", code)
            for path in PAGES for number, info, code in fenced_blocks(path) if info == "python"]


BLOCKS = python_blocks()


def expected_output(code: list[str]) -> list[str] | None:
    """The ``# ...`` comments of the block's prints, when every print is a commented top-level line."""
    prints = [line for line in code if "print(" in line]
    commented = [line for line in prints if line.startswith("print(") and re.search(r"\)\s+# ", line)]
    if not prints or len(commented) != len(prints):
        return None
    return [re.split(r"\)\s+# ", line, maxsplit=1)[1].strip() for line in commented]


def test_the_docs_have_python_blocks():
    """The README's two runnable examples are found (a parser that finds nothing passes nothing)."""
    readme = [code for name, code in BLOCKS if name.startswith("README.md:")]
    assert len(readme) >= 2
    decode = [code for code in readme if any("npu_kv_quant_sparse_flash_attention(" in line for line in code)]
    assert len(decode) == 1, "the README's torch_npu decode-step example is missing"
    assert any(line.startswith("import torch_npu") for line in decode[0])
    assert any(line.startswith("assert ") for line in decode[0]), "the decode step must check its output"


@pytest.mark.slow
@pytest.mark.parametrize("name,code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_python_block_runs(name, code, tmp_path):
    if code and code[0].startswith(NOT_RUN):
        reason = code[0][len(NOT_RUN):].strip()
        assert reason, f"{name}: '{NOT_RUN}' needs a reason"
        pytest.skip(f"{name}: not run: {reason}")
    source = "\n".join(code) + "\n"
    uses_torch_npu = re.search(r"^\s*(import torch_npu|from torch_npu\b)", source, re.M) is not None
    if uses_torch_npu or re.search(r"^\s*(import|from) torch\b", source, re.M):
        pytest.importorskip("torch")
    script = tmp_path / "block.py"
    script.write_text(source)
    command = [sys.executable] + (["-m", "ascend_emu", "run"] if uses_torch_npu else []) + [str(script)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"{name} exited {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-3000:]}\n"
                                  f"--- stderr (tail)\n{proc.stderr[-3000:]}")
    expected = expected_output(code)
    if expected is not None:
        assert proc.stdout.splitlines() == expected, f"{name}: the output differs from the block's comments"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than ``-`` / ``_`` dropped,
    spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text().splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            base = slug(line.lstrip("#"))
            seen[base] = seen.get(base, -1) + 1
            if seen[base]:
                seen[f"{base}-{seen[base]}"] = 0
    return set(seen)


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every markdown link and image outside code."""
    found, in_code = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            text = re.sub(r"`[^`]*`", "", line)
            found += [(number, target) for target in re.findall(r"\]\(([^)\s]+)\)", text)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for number, target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"line {number}: {target} (no {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"line {number}: {target} (no heading '#{anchor}' in {dest.name})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    targets = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README)}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in targets]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_readme_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# "), "README.md must start with its title"
    code = [line for _, info, block in fenced_blocks(README) for line in block if line.strip()]
    assert code[:2] == [DEMO_COMMAND, TEST_COMMAND]
    assert lines.index(DEMO_COMMAND) < 25 and lines.index(TEST_COMMAND) < 25, "the commands belong on the first screen"
    above = " ".join(lines[lines.index(TEST_COMMAND) - 6:lines.index(TEST_COMMAND)])
    assert "minutes on 2 cores" in above, "the test command's duration is said next to it"
    assert "--index-url https://download.pytorch.org/whl/cpu" in above, "the CPU wheel is named next to it"


def test_readme_test_command_is_what_ci_runs():
    """``.ci/run``: the command's install, the lint and type gate, then the command's tests."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    install, tests = TEST_COMMAND.split(" && ")
    assert [ci[0], ci[-1]] == [install, tests]
    gate = ci[1:-1]  # the checks between install and tests (any finding fails the run: set -e)
    assert "ruff check ascend_emu tests benchmarks examples" in gate and "mypy" in gate, gate
