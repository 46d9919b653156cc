"""Every ``examples/*.py`` runs through ``ascend-emu run`` and exits 0 (DESIGN.md, Tests)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

EXAMPLES_DIR = pathlib.Path(__file__).resolve().parent.parent / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_under_ascend_emu(example, tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", "run", str(example)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"{example.name} exited {proc.returncode}\n--- stdout (tail)\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr (tail)\n{proc.stderr[-3000:]}")
