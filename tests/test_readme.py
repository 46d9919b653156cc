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

from ascend_emu import install_hints

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
NOT_RUN = "# not run:"

#: The README's two commands: try it, and the test suite (what ``.ci/run`` runs).
DEMO_COMMAND = "pip install -e . && ascend-emu demo"
#: The second is defined once, in ascend_emu.install_hints, with the pinned torch and the CPU index.
TEST_COMMAND = install_hints.TEST_COMMAND


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
    assert f"--extra-index-url {install_hints.TORCH_CPU_INDEX}" in above, "the CPU wheel is named next to it"


def test_the_test_command_pins_torch_from_the_cpu_index_in_one_command():
    """The pin and the CPU index in the same pip command (an index named in one command and the pin
    in the next lets pip replace the CPU wheel by PyPI's CUDA build), and the same pin and index in
    the CLI's install hint, the README and every docs page that names a torch pin."""
    install = TEST_COMMAND.split(" && ")[0]
    assert install.startswith("pip install ")
    assert f"torch=={install_hints.TORCH_VERSION}" in install.split()
    assert f"--extra-index-url {install_hints.TORCH_CPU_INDEX}" in install
    assert '".[torch,test,ray,dev]"' in install
    assert install_hints.TORCH_CPU_INSTALL == (f"pip install torch=={install_hints.TORCH_VERSION} "
                                               f"--extra-index-url {install_hints.TORCH_CPU_INDEX}")
    assert install_hints.TORCH_CPU_INSTALL in install_hints.TORCH_HINT
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for command in re.findall(r"pip install torch[^`]*", line):
                where = f"{page.relative_to(ROOT)}:{number}: {command}"
                if "torch==" in command:
                    assert f"torch=={install_hints.TORCH_VERSION}" in command, where
                    assert f"--extra-index-url {install_hints.TORCH_CPU_INDEX}" in command, where
                assert "--index-url" not in command.replace("--extra-index-url", ""), (
                    f"{where}: the CPU index alone, without the pin, installs the newest torch")


#: Steps ``.ci/run`` takes between installing and testing that the README's command leaves out: the
#: gates (import floors, lint, types), each failing the run on a finding.
CI_GATES = ("lint-imports", "ruff ", "mypy")


def test_readme_test_command_is_what_ci_runs():
    ci = [line.split("  #")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert " && ".join(line for line in ci if not line.startswith(CI_GATES)) == TEST_COMMAND
    assert ci[-1] == "python -m pytest -q", "the gates run before the tests"


# ---------------------------------------------------------------------- generated op lists, commands
def test_the_docs_op_lists_are_the_registry():
    """docs/torch_npu.md and docs/pytest_plugin.md list the ops the drop-in registers, generated
    (`python -m tests.doc_op_lists --write` rewrites them after an op is added)."""
    pytest.importorskip("torch")
    from tests import doc_op_lists

    generated = doc_op_lists.regions()
    for page in doc_op_lists.PAGES:
        text = (ROOT / page).read_text()
        found = {m.group("name"): m.group("body") for m in doc_op_lists.REGION.finditer(text)}
        assert found, f"{page}: no generated op list"
        for name, body in found.items():
            assert body == generated[name], f"{page}: the '{name}' op list is stale; run python -m tests.doc_op_lists --write"
    ops = doc_op_lists.registered()
    assert "npu_fused_infer_attention_score" in ops["npu"] and "npu_dynamic_mx_quant" in ops["npu"]
    assert "`npu_dynamic_mx_quant`" not in generated["not-emulated"] and "`npu_rms_norm`" in generated["not-emulated"]


#: A command in the docs spelled as a synopsis (optional parts, alternatives, placeholders).
SYNOPSIS = re.compile(r"\[|\||\.\.\.|\boptions\b")


def doc_commands() -> list[tuple[str, str, str]]:
    """``(where, command, kind)`` of every ``ascend-emu ...`` command in the README and docs:
    ``code`` lines (of code blocks and indented lines: ``$ `` prompts, ``&&`` chains and
    ``# comments`` stripped) and ``prose`` inline code spans."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            where = f"{page.relative_to(ROOT)}:{number}"
            spans = [(where, s.strip(), "prose") for s in re.findall(r"`(ascend-emu [^`]*)`", line)]
            stripped = line.strip().removeprefix("$ ")
            for part in stripped.split("&&"):
                part = part.split("  #")[0].strip()
                if part.startswith("ascend-emu ") and "`" not in part:
                    spans.append((where, part, "code"))
            found += spans
    return found


COMMANDS = doc_commands()


def _subcommand_parser(parser, words):
    """The innermost subcommand parser named by ``words``, and the words after it."""
    import argparse

    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or not words or words[0] not in subs[0].choices:
            return parser, words
        parser, words = subs[0].choices[words[0]], words[1:]


def test_every_docs_command_parses():
    """Every `ascend-emu ...` command line of the README and docs parses with the CLI's own
    parser; one named in prose, or spelled as a synopsis (`[-j N]`, `where|what`, `...`), names
    a subcommand and options that exist (`ascend-emu run --traceback` names an option of run)."""
    import shlex

    from ascend_emu.cli import build_parser

    assert len(COMMANDS) > 30
    for where, command, kind in COMMANDS:
        words = shlex.split(command)[1:]
        if kind == "prose" and not SYNOPSIS.search(command):
            try:
                build_parser().parse_args(words)
                continue
            except SystemExit as stop:  # a mention, not a whole command line: its names must exist
                if stop.code == 0:  # --version / --help: parsed, and answered
                    continue
        if SYNOPSIS.search(command) or kind == "prose":
            firsts = words[0].split("|") if words else []
            seconds = words[1].split("|") if len(words) > 1 and not words[1].startswith(("-", "[")) else [None]
            for sub in firsts:
                top, _ = _subcommand_parser(build_parser(), [sub])
                assert top.prog == f"ascend-emu {sub}", f"{where}: {command}: no subcommand {sub!r}"
                for second in seconds:
                    parser, rest = _subcommand_parser(top, [second] if second else [])
                    nested = any(a.__class__.__name__ == "_SubParsersAction" for a in top._actions)
                    assert not (nested and second) or parser is not top, f"{where}: {command}: no {sub} {second}"
                    for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", command):
                        assert option in parser._option_string_actions, \
                            f"{where}: {command}: {parser.prog} has no {option}"
            continue
        parser, rest = _subcommand_parser(build_parser(), words)
        assert parser.prog.split() == ["ascend-emu", *words[:len(words) - len(rest)]] and parser.prog != "ascend-emu", \
            f"{where}: {command}: no such subcommand"
        if not rest:  # a command named in prose (`ascend-emu locate`): the subcommand exists
            continue
        try:
            build_parser().parse_args(words)
        except SystemExit as exc:
            raise AssertionError(f"{where}: `{command}` does not parse (exit {exc.code})") from None


#: Subcommands whose documented commands run in well under a second without files.
QUICK = ("inspect where", "inspect what", "inspect grid", "inspect blocks", "locate")


def test_the_quick_docs_commands_run(tmp_path, monkeypatch, capsys):
    import shlex

    from ascend_emu.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")
    ran = 0
    for where, command, _ in COMMANDS:
        words = shlex.split(command)[1:]
        if SYNOPSIS.search(command) or not any(" ".join(words).startswith(q) for q in QUICK):
            continue
        if not any(w.startswith("--cache-mode") or w.startswith("--weight-shape") or w.startswith("--block-table")
                   for w in words):
            continue  # reads a cache file the docs made elsewhere
        assert main(words) == 0, f"{where}: `{command}` failed: {capsys.readouterr().err}"
        ran += 1
    capsys.readouterr()
    assert ran >= 3
