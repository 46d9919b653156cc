"""The CPU backend: Numba kernels and NumPy / BLAS matmuls behind the op contract.

One function per op family, each taking the normalised-argument object its ``ops`` module
builds. Backends trust the contract and never validate user input again.

Threads: OpenMP workers that spin after each parallel region starve OpenBLAS's spinning threads
(and the reverse) when Numba kernels and BLAS calls alternate on a small machine (a 5 ms stall per
kernel launch on 2 cores). Unless the user chose a policy, Numba's OpenMP workers sleep when idle:
``OMP_WAIT_POLICY`` is read when Numba first launches a parallel kernel, after this import.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .kv_rmsnorm_rope_cache import kv_rmsnorm_rope_cache  # noqa: F401
from .mla_preprocess import mla_preprocess  # noqa: F401
from .mla_prolog import mla_prolog  # noqa: F401
from .sparse_flash_attention import sparse_flash_attention  # noqa: F401
