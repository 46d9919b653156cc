"""Every ``examples/*.py`` runs through ``ascend-emu run`` and exits 0 (docs/development.md), prints
no warning and a screenful at most; the commands an example prints work."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES_DIR = ROOT / "examples"
#: The examples' environment: this tree's ascend_emu first, wherever another one is installed.
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.py"))
#: An example prints at most this many lines (stdout and stderr together): a few useful lines,
#: never a tensor's whole repr.
MAX_LINES = 60
#: How Python prints a warning: ``file:line: SomeWarning: message``.
WARNING_LINE = re.compile(r"^\S.*:\d+: \w*Warning: ", re.M)


def _run_example(example: pathlib.Path, cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ascend_emu", "run", str(example), *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_under_ascend_emu(example, tmp_path):
    pytest.importorskip("torch")
    proc = _run_example(example, tmp_path)
    assert proc.returncode == 0, (f"{example.name} exited {proc.returncode}\n--- stdout (tail)\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr (tail)\n{proc.stderr[-3000:]}")
    assert not WARNING_LINE.search(proc.stderr), f"{example.name} warns:\n{proc.stderr[-3000:]}"
    lines = len((proc.stdout + proc.stderr).splitlines())
    assert lines <= MAX_LINES, f"{example.name} prints {lines} lines (at most {MAX_LINES})"


def test_warning_line_pattern_matches_pythons_warnings():
    import warnings

    text = warnings.formatwarning("cache slot 0 written twice", UserWarning, "/x/ops.py", 12)
    assert WARNING_LINE.search(text) and not WARNING_LINE.search("no warnings here: 0 of 12 slots\n")


def test_inspect_corrupted_cache_prints_commands_that_work(tmp_path):
    """The example saves clean.npz / broken.npz in --out DIR (kept after it exits) and the
    ``ascend-emu inspect`` commands it prints find the corrupted slot in them."""
    proc = subprocess.run([sys.executable, str(EXAMPLES_DIR / "inspect_corrupted_cache.py"), "--out", "saved"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = re.findall(r"(ascend-emu inspect (?:diff|dump) .*?)(?:  ->|$)", proc.stdout, re.M)
    assert [c.split()[2] for c in commands] == ["diff", "dump"], proc.stdout
    assert (tmp_path / "saved" / "clean.npz").is_file() and (tmp_path / "saved" / "broken.npz").is_file()
    slot = int(re.search(r"inspect dump \S+ --slot (\d+)", proc.stdout).group(1))
    for command in commands:
        run = subprocess.run([sys.executable, "-m", "ascend_emu", *shlex.split(command)[1:], "--json"],
                             cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{command}: {run.stderr}"
        if "diff" in command:
            assert f'"slots": [{slot}]' in run.stdout
        else:
            assert f'"slot": {slot}' in run.stdout


@pytest.mark.slow
def test_vllm_ascend_ut_example_passes_under_the_pytest_plugin():
    """``examples/vllm_ascend_ut`` (vllm-ascend's SFA and V4 DSA forwards as unit tests, its conftest loading
    ``ascend_emu.pytest_plugin``) passes as CI runs it, every test run, none skipped."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "pytest", "examples/vllm_ascend_ut", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exited {proc.returncode}\n{out[-4000:]}"
    want = sum(len(re.findall(r"^    def test_", f.read_text(), re.M))
               for f in (EXAMPLES_DIR / "vllm_ascend_ut").glob("test_*.py"))
    assert want >= 3 and re.search(rf"\b{want} passed\b", out), out[-4000:]
    assert not re.search(r"\b(failed|error|skipped|warnings?)\b", out), out[-4000:]
