"""ascend_emu: Huawei Ascend NPU MLA / sparse-attention operators emulated on the CPU.

Sub-packages: ``layouts`` (FRACTAL_NZ, paged caches), ``quant`` (rounding, int8 schemes,
combined rows), ``ops`` (the op interface, torch_npu signatures over NumPy), ``emu`` (the CPU
backend), ``torch_npu`` (a drop-in for ``import torch_npu``).
"""

from . import _threads
from ._version import __version__  # noqa: F401

_threads.configure()  # before any Numba kernel or torch loads an OpenMP runtime

from .checked_mode import checked, mark_written, poison  # noqa: E402, F401  (public)
