"""The lint and type gate ``.ci/run`` runs before the tests fails on the findings it is there for:
a ``zip`` without ``strict=`` (ruff B905) and an ``assert f() and g()`` whose ``f`` returns None
(mypy func-returns-value). Skipped where the ``[dev]`` extra is not installed."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"


def test_ruff_rejects_a_zip_without_strict(tmp_path):
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (the [dev] extra)")
    bad = tmp_path / "bad.py"
    bad.write_text("def pairs(a, b):\n    return list(zip(a, b))\n")
    proc = subprocess.run([ruff, "check", "--no-cache", "--config", str(PYPROJECT), str(bad)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "B905" in proc.stdout, proc.stdout + proc.stderr
    bad.write_text("def pairs(a, b):\n    return list(zip(a, b, strict=True))\n")
    proc = subprocess.run([ruff, "check", "--no-cache", "--config", str(PYPROJECT), str(bad)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_rejects_an_assertion_on_a_none_result(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed (the [dev] extra)")
    bad = tmp_path / "test_bad.py"
    bad.write_text("def check(x) -> None:\n    assert x\n\n\n"
                   "def test_two():\n    check(1) and check(2)\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT),
                           "--cache-dir", str(tmp_path / "cache"), str(bad)],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "func-returns-value" in proc.stdout, proc.stdout + proc.stderr
