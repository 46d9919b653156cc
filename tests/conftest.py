import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import settings

#: CI runs (env ``CI`` set, as CI services do): the same examples on every run (``derandomize``),
#: no example database replaying earlier failures (``database=None``) and no per-example deadline
#: (timing on shared runners is noise), so a red CI always means a regression. Locally the
#: default profile keeps random exploration and the database; ``HYPOTHESIS_PROFILE=ci`` selects
#: the CI one.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
settings.load_profile("ci" if _CI else os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: The terminal every test runs in: rich, and the inspect / compare text output, size themselves
#: from ``COLUMNS`` / ``LINES`` (rich also from the real terminal pytest was started in), so text
#: assertions would otherwise depend on where the suite runs. Wide enough for a dump line.
TEST_COLUMNS, TEST_LINES = "240", "50"


def pytest_configure(config):
    """torch is an optional extra and the core tests run without it (the drop-in's tests skip),
    but CI installs ``[torch,test]`` (``.ci/run``): there a missing or broken torch is an error,
    not a run of skips. Checked in a child interpreter: importing torch here, before the test
    modules import ``ascend_emu``, would change the threading set-up it chooses (``_threads``)."""
    if _CI:
        proc = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise pytest.UsageError(f"CI is set but torch does not import ({proc.stderr.strip()[-300:]}); CI "
                                    "installs the [torch] extra and runs the drop-in's tests")


@pytest.fixture(autouse=True)
def _fixed_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", TEST_COLUMNS)
    monkeypatch.setenv("LINES", TEST_LINES)


@pytest.fixture
def rng():
    """A seeded generator, fresh per test."""
    return np.random.default_rng(20261122)
