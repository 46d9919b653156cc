"""The threading set-up of the CPU kernels, chosen once when ``ascend_emu`` is first imported.

The emu backend alternates Numba parallel kernels with OpenBLAS matmuls. OpenMP workers that spin
after each parallel region (libgomp's default) take the cores OpenBLAS needs, and the reverse:
measured on 2 cores, ``npu_mla_prolog_v3`` (non-quant, B=8 S=2 N=32) takes 32 ms with spinning
workers against 10 ms when they sleep (``OMP_WAIT_POLICY=PASSIVE``). libgomp reads that variable
once, when it is loaded, and ``import torch`` loads it (``torch/lib/libgomp*.so``); Numba's OpenMP
layer then binds to that copy. So:

- libgomp not loaded yet (``ascend_emu`` imported before torch, and always under
  ``ascend-emu run``): ``OMP_WAIT_POLICY=PASSIVE`` is set, unless the user set it, and Numba uses
  its OpenMP layer with sleeping workers. torch, loaded later, reads the same policy.
- libgomp already loaded with no policy set (``import torch`` first, as torch_npu scripts do):
  the policy can no longer change, so Numba uses its ``workqueue`` layer, whose workers sleep
  (10-15 % slower than sleeping OpenMP workers here, 3x faster than spinning ones). The
  workqueue layer must not be entered from two Python threads at once: call the ops from one
  thread, or import ``ascend_emu`` before torch.
- ``NUMBA_THREADING_LAYER`` or ``OMP_WAIT_POLICY`` set by the user: left as the user set it.

:data:`CHOICE` records what was decided (``ascend_emu._threads.CHOICE``).

OpenBLAS (NumPy's, which runs the emu backend's products) has a spin of its own: after each call
its idle worker threads poll for new work for ``2**OPENBLAS_THREAD_TIMEOUT`` CPU cycles (default
2**28, about 0.1 s) before they sleep, taking the cores torch's OpenMP threads and the Numba
kernels run on next. A loop of one torch matmul then one emulated prolog took 2.0-2.2x the two
apart; sleeping OpenMP workers and OpenBLAS workers made it 1.02-1.03x. OpenBLAS reads that
variable when it is loaded, which is when NumPy is first imported, before ``ascend_emu`` can act;
so :func:`quiet_openblas` (called by :func:`configure`) sets it to :data:`OPENBLAS_TIMEOUT`
(unless the user set it), has OpenBLAS read its environment again (``openblas_read_env``) and
stops its worker threads (``blas_thread_shutdown_``, what OpenBLAS itself does before a
``fork``); its next threaded call starts them again with the short timeout (OpenBLAS
``driver/others/blas_server.c``: ``blas_thread_init`` takes ``thread_timeout`` from the
environment read). Results are unchanged: only how long an idle worker polls. Processes started
from this one inherit the variable. :data:`OPENBLAS` records what was done.
"""

from __future__ import annotations

import os
import sys

#: Numba layer used when libgomp was loaded with its default (spinning) policy.
FALLBACK_LAYER = "workqueue"
#: What :func:`configure` decided: "omp-passive", "workqueue" or "user".
CHOICE = ""
#: ``OPENBLAS_THREAD_TIMEOUT`` set where the user did not: idle OpenBLAS workers poll for 2**16 CPU
#: cycles (a few tens of microseconds) before they sleep, so the back-to-back products of one op
#: find them awake while the op's own Numba kernels, torch's threads and the next op get the cores
#: right after. ``benchmarks/bench_openblas_timeout.py`` alternates timeouts in one process on 2
#: cores: the int8 C8 attention (``npu_fused_infer_attention_score_v2`` B = 16, N = 128, kv 1024)
#: took 0.71-0.74x its time at 2**20 with 2**4-2**16 (at 2**20 the workers spun through its
#: parallel softmax), the other ops (KV-quant sparse attention b = 1 / 4, the prolog at T = 1 / 16,
#: FIA bf16 and C8 N = 16, a torch / prolog loop) 0.96-1.05x; OpenBLAS's own 2**28 (about 0.1 s)
#: doubled a torch matmul run right after an op.
OPENBLAS_TIMEOUT = 16
#: What :func:`quiet_openblas` did: "timeout-16" (restarted with the short timeout), "user" (the
#: user's ``OPENBLAS_THREAD_TIMEOUT`` kept), "none" (no pthreads OpenBLAS with the entry points in
#: this process: an OpenMP build, another BLAS, not Linux).
OPENBLAS = ""
#: ``(get, set)`` of the thread count of each pthreads OpenBLAS in the process
#: (``openblas_get_num_threads`` / ``openblas_set_num_threads``, a process-wide setting that
#: costs about a microsecond to change), found by :func:`quiet_openblas`;
#: :func:`ascend_emu.emu.matmul.one_blas_thread` uses them.
BLAS_THREADS: list[tuple] = []
#: ``(openblas_read_env, blas_thread_shutdown_)`` of each pthreads OpenBLAS in the process, found
#: by :func:`quiet_openblas`; :func:`restart_openblas` uses them.
_RESTARTS: list[tuple] = []


def libgomp_loaded() -> bool:
    """Whether an OpenMP runtime (libgomp) is already mapped into this process.

    Linux: read from ``/proc/self/maps``; elsewhere: whether torch (which loads it) is imported.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return "libgomp" in maps.read()
    except OSError:
        return "torch" in sys.modules


def _openblas_paths() -> list[str]:
    """Files of the OpenBLAS libraries mapped into this process (Linux ``/proc/self/maps``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    paths = {line.split(None, 5)[5] for line in lines if line.count(" ") >= 5 and "openblas" in line.lower()}
    return sorted(p for p in paths if p.startswith("/") and ".so" in p)


def _entry(lib, name: str):
    """OpenBLAS entry point ``name`` under the names builds give it (plain; with the 64-bit
    interface's ``64_`` suffix; SciPy / NumPy wheels' ``scipy_`` prefix and suffix), or None."""
    for symbol in (name, f"{name}64_", f"scipy_{name}64_"):
        fn = getattr(lib, symbol, None)
        if fn is not None:
            return fn
    return None


def quiet_openblas() -> str:
    """Make the idle worker threads of every pthreads OpenBLAS in the process sleep within a
    millisecond of a call's end (module doc) and find their thread-count entry points
    (:data:`BLAS_THREADS`); return :data:`OPENBLAS`. Loads NumPy (and with it its OpenBLAS)."""
    global OPENBLAS
    if OPENBLAS:
        return OPENBLAS
    import ctypes

    import numpy  # noqa: F401  (loads the OpenBLAS that runs the products)

    libs = []
    counts = []
    for path in _openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        parallel = _entry(lib, "openblas_get_parallel")  # 0 sequential, 1 pthreads, 2 OpenMP
        read_env, shutdown = getattr(lib, "openblas_read_env", None), getattr(lib, "blas_thread_shutdown_", None)
        if parallel is None or parallel() != 1:
            continue
        get, put = _entry(lib, "openblas_get_num_threads"), _entry(lib, "openblas_set_num_threads")
        if get is not None and put is not None:
            counts.append((get, put))
        if read_env is not None and shutdown is not None:
            libs.append((read_env, shutdown))
    BLAS_THREADS[:] = counts
    _RESTARTS[:] = libs
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        OPENBLAS = "user"
        return OPENBLAS
    if not libs:
        OPENBLAS = "none"
        return OPENBLAS
    restart_openblas(OPENBLAS_TIMEOUT)
    OPENBLAS = f"timeout-{OPENBLAS_TIMEOUT}"
    return OPENBLAS


def restart_openblas(timeout: int) -> int:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` to ``timeout`` (log2 of the CPU cycles an idle worker polls,
    OpenBLAS clamps it to 4-30) and restart the workers of every pthreads OpenBLAS that
    :func:`quiet_openblas` found, so that their next threaded call polls that long; returns how
    many libraries were restarted (0 before :func:`quiet_openblas` or without one). For measuring
    (``benchmarks/bench_openblas_timeout.py``); results do not depend on it.

    Raises ValueError: ``timeout`` not an int in [4, 30]."""
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 4 <= timeout <= 30:
        raise ValueError(f"timeout: expected an int in [4, 30] (log2 cycles), got {timeout!r}")
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(timeout)
    for read_env, shutdown in _RESTARTS:
        read_env()
        shutdown()
    return len(_RESTARTS)


def configure() -> str:
    """Choose the threading set-up (module doc) once; return :data:`CHOICE`."""
    global CHOICE
    if CHOICE:
        return CHOICE
    quiet_openblas()
    if "NUMBA_THREADING_LAYER" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        CHOICE = "user"
    elif libgomp_loaded():
        import numba

        numba.config.THREADING_LAYER = FALLBACK_LAYER
        CHOICE = FALLBACK_LAYER
    else:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        CHOICE = "omp-passive"
    return CHOICE
