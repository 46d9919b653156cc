"""The CPU backend: Numba kernels and NumPy / BLAS matmuls behind the op contract.

:data:`BACKEND` implements :class:`ascend_emu.ops._backend.Backend`: one method per op family,
each taking the normalised-argument object its ``ops`` module builds and returning that family's
``...Outputs`` tuple, caches written in place. The work lives in one submodule per family
(``ascend_emu.emu.mla_prolog`` is the module; its function of the same name is the kernel
chain). Conversions only the CPU needs (fp32 widening of weights, NZ read-back of
storage-shaped weights, descale decoding, bf16 bits for Numba) happen here, not in ``ops``.
Backends trust the contract and never validate user input again.

Threads: chosen when ``ascend_emu`` is imported (:mod:`ascend_emu._threads`).
"""

from .. import _kernel_cache  # noqa: F401  (before any kernel: caches them keyed on the sources)
from . import fused_infer_attention_score as _fused_infer_attention_score
from . import kv_rmsnorm_rope_cache as _kv_rmsnorm_rope_cache
from . import lightning_indexer as _lightning_indexer
from . import mla_preprocess as _mla_preprocess
from . import mla_prolog as _mla_prolog
from . import paged_cache as _paged_cache
from . import quant as _quant
from . import quant_lightning_indexer as _quant_lightning_indexer
from . import quant_950 as _quant_950
from . import rope as _rope
from . import sparse_flash_attention as _sparse_flash_attention
from . import v4_small as _v4_small
from . import hc as _hc  # DeepSeek-V4 mHC
from . import sparse_attn_sharedkv as _sparse_attn_sharedkv  # DeepSeek-V4 shared-KV attention
from . import compressor as _compressor  # DeepSeek-V4 KV compressor
from . import indexer_compress_epilog as _indexer_compress_epilog  # DeepSeek-V4 cache writers
from . import kv_compress_epilog as _kv_compress_epilog
from . import scatter_nd_update as _scatter_nd_update  # DeepSeek-V4 row scatters


class EmuBackend:
    """The ``emu`` backend (:class:`ascend_emu.ops._backend.Backend`): each method is its
    family's function in the submodule of that name."""

    name = "emu"
    mla_prolog = staticmethod(_mla_prolog.mla_prolog)
    mla_preprocess = staticmethod(_mla_preprocess.mla_preprocess)
    kv_rmsnorm_rope_cache = staticmethod(_kv_rmsnorm_rope_cache.kv_rmsnorm_rope_cache)
    sparse_flash_attention = staticmethod(_sparse_flash_attention.sparse_flash_attention)
    lightning_indexer = staticmethod(_lightning_indexer.lightning_indexer)
    rope = staticmethod(_rope.rope)
    paged_cache = staticmethod(_paged_cache.paged_cache)
    quant = staticmethod(_quant.quant)
    quant_lightning_indexer = staticmethod(_quant_lightning_indexer.quant_lightning_indexer)
    fused_infer_attention_score = staticmethod(_fused_infer_attention_score.fused_infer_attention_score)
    quant_950 = staticmethod(_quant_950.quant_950)
    rms_norm_dynamic_quant = staticmethod(_v4_small.rms_norm_dynamic_quant)
    inplace_partial_rotary_mul = staticmethod(_v4_small.inplace_partial_rotary_mul)
    compressor_metadata = staticmethod(_v4_small.compressor_metadata)
    # DeepSeek-V4 mHC
    hc_pre = staticmethod(_hc.hc_pre)
    hc_post = staticmethod(_hc.hc_post)
    # DeepSeek-V4 shared-KV attention
    sparse_attn_sharedkv = staticmethod(_sparse_attn_sharedkv.sparse_attn_sharedkv)
    # DeepSeek-V4 KV compressor
    compressor = staticmethod(_compressor.compressor)
    # DeepSeek-V4 indexer over compressed keys: the quant indexer's kernel (the contract set the limits)
    vllm_quant_lightning_indexer = staticmethod(_quant_lightning_indexer.quant_lightning_indexer)
    # DeepSeek-V4 cache writers
    kv_compress_epilog = staticmethod(_kv_compress_epilog.kv_compress_epilog)
    indexer_compress_epilog = staticmethod(_indexer_compress_epilog.indexer_compress_epilog)
    # DeepSeek-V4 row scatters (npu_scatter_nd_update_v2 / _sk, custom.scatter_nd_update_asc)
    scatter_nd_update = staticmethod(_scatter_nd_update.scatter_nd_update)


#: The backend object :func:`ascend_emu.ops.get_backend` returns for ``emu``.
BACKEND = EmuBackend()
