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
"""

from __future__ import annotations

import os
import sys

#: Numba layer used when libgomp was loaded with its default (spinning) policy.
FALLBACK_LAYER = "workqueue"
#: What :func:`configure` decided: "omp-passive", "workqueue" or "user".
CHOICE = ""


def libgomp_loaded() -> bool:
    """Whether an OpenMP runtime (libgomp) is already mapped into this process.

    Linux: read from ``/proc/self/maps``; elsewhere: whether torch (which loads it) is imported.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return "libgomp" in maps.read()
    except OSError:
        return "torch" in sys.modules


def configure() -> str:
    """Choose the threading set-up (module doc) once; return :data:`CHOICE`."""
    global CHOICE
    if CHOICE:
        return CHOICE
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
