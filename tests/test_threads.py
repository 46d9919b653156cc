"""The threading set-up (:mod:`ascend_emu._threads`): what is in effect for each import order.

Each case runs in a fresh interpreter (the choice is made once per process), with the user's
``OMP_WAIT_POLICY`` / ``NUMBA_THREADING_LAYER`` removed unless the case sets them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
{imports}
import numba
import numpy as np
from ascend_emu import _threads

@numba.njit(parallel=True)
def total(x):
    s = 0.0
    for i in numba.prange(x.shape[0]):
        s += x[i]
    return s

assert total(np.ones(1000)) == 1000.0
print(json.dumps({{"choice": _threads.CHOICE, "layer": numba.threading_layer(),
                  "policy": os.environ.get("OMP_WAIT_POLICY"), "gomp": _threads.libgomp_loaded()}}))
"""


def probe(imports: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER")}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(imports=imports)], env={**clean, **env},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ascend_emu_first_sets_the_passive_policy_before_torch_loads_libgomp():
    pytest.importorskip("torch")
    got = probe("import ascend_emu\nimport torch")
    assert got["choice"] == "omp-passive" and got["policy"] == "PASSIVE"
    assert got["layer"] != "workqueue"


def test_torch_first_sleeping_workqueue_layer():
    pytest.importorskip("torch")
    got = probe("import torch\nimport ascend_emu.torch_npu")
    assert got["gomp"] and got["choice"] == "workqueue" and got["layer"] == "workqueue"


def test_user_choice_is_kept():
    got = probe("import ascend_emu", OMP_WAIT_POLICY="ACTIVE")
    assert got["choice"] == "user" and got["policy"] == "ACTIVE"
    got = probe("import ascend_emu", NUMBA_THREADING_LAYER="workqueue")
    assert got["choice"] == "user" and got["layer"] == "workqueue" and got["policy"] is None
