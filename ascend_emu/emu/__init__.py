"""The CPU backend: Numba kernels and NumPy / BLAS matmuls behind the op contract.

One function per op family, each taking the normalised-argument object its ``ops`` module
builds. Backends trust the contract and never validate user input again.

Threads: chosen when ``ascend_emu`` is imported (:mod:`ascend_emu._threads`).
"""

from .kv_rmsnorm_rope_cache import kv_rmsnorm_rope_cache  # noqa: F401
from .lightning_indexer import lightning_indexer  # noqa: F401
from .mla_preprocess import mla_preprocess  # noqa: F401
from .mla_prolog import mla_prolog  # noqa: F401
from .sparse_flash_attention import sparse_flash_attention  # noqa: F401
