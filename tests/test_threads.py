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


IDLE_PROBE = """
import json, os, time
import numpy as np
import ascend_emu
from ascend_emu import _threads

a, b = np.ones((64, 2048), np.float32), np.ones((2048, 2048), np.float32)
idle = []
for _ in range(3):
    a @ b  # large enough for OpenBLAS to run it on its worker threads
    c0 = time.process_time()
    time.sleep(0.05)
    idle.append(time.process_time() - c0)
print(json.dumps({"openblas": _threads.OPENBLAS, "timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
                  "idle": min(idle)}))
"""


def idle_probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    proc = subprocess.run([sys.executable, "-c", IDLE_PROBE], env={**clean, "OPENBLAS_NUM_THREADS": "2", **env},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_openblas_workers_sleep_when_a_call_ends():
    """After a threaded OpenBLAS call, its idle worker polls for about 0.1 s by default, which shows
    as CPU time while the process sleeps; with the short timeout (2**16 cycles) it sleeps within
    a millisecond."""
    got = idle_probe()
    if got["openblas"] == "none":
        pytest.skip("no pthreads OpenBLAS with openblas_read_env / blas_thread_shutdown_ in this NumPy")
    from ascend_emu import _threads

    assert got["openblas"] == f"timeout-{_threads.OPENBLAS_TIMEOUT}" and got["timeout"] == str(_threads.OPENBLAS_TIMEOUT)
    assert got["idle"] < 0.01, got  # a spinning worker: about 0.05 s of CPU in each 0.05 s sleep


def test_openblas_timeout_of_the_user_is_kept():
    got = idle_probe(OPENBLAS_THREAD_TIMEOUT="28")
    assert got["openblas"] == "user" and got["timeout"] == "28"
    if (os.cpu_count() or 1) >= 2:
        assert got["idle"] > 0.015, got  # the user's choice: OpenBLAS's default spin, still in effect


def test_restart_openblas_checks_the_timeout_and_sets_it(monkeypatch):
    from ascend_emu import _threads

    for bad in (3, 31, 16.0, True, "16"):
        with pytest.raises(ValueError, match="timeout: expected an int in \\[4, 30\\]"):
            _threads.restart_openblas(bad)
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", os.environ.get("OPENBLAS_THREAD_TIMEOUT", "16"))
    restarted = _threads.restart_openblas(12)
    try:
        assert os.environ["OPENBLAS_THREAD_TIMEOUT"] == "12"
        assert restarted == len(_threads._RESTARTS)
        import numpy as np

        a = (np.arange(256 * 256) % 7).astype(np.float32).reshape(256, 256)  # threaded sgemm
        assert np.array_equal(a @ a, a.astype(np.float64) @ a)  # workers start again; exact small integers
    finally:
        _threads.restart_openblas(_threads.OPENBLAS_TIMEOUT)
