"""The op interface: torch_npu's op names and signatures over NumPy arrays.

Each op validates and normalises its arguments once (the contract: shapes, dtypes, modes,
index ranges), then hands a normalised argument object to the selected backend
(:mod:`ascend_emu.ops._backend`). A rejected call writes nothing. bf16 arrays use
``ml_dtypes.bfloat16``; weights that must be FRACTAL_NZ are :class:`~ascend_emu.layouts.NZArray`
(from :func:`npu_format_cast`).
"""

from .. import _kernel_cache  # noqa: F401  (before any kernel: caches them keyed on the sources)
from ._backend import backend, backend_name, get_backend, set_backend
from .dynamic_quant import npu_dynamic_quant, npu_dynamic_quant_asymmetric
from .format_cast import get_npu_format, npu_format_cast
from .fused_infer_attention_score import (_npu_fused_infer_attention_score_get_max_workspace,  # noqa: F401
                                          _npu_fused_infer_attention_score_infer_output,  # noqa: F401
                                          _npu_fused_infer_attention_score_v2_get_max_workspace,  # noqa: F401
                                          _npu_fused_infer_attention_score_v2_infer_output,  # noqa: F401
                                          npu_fused_infer_attention_score, npu_fused_infer_attention_score_v2)
from .kv_rmsnorm_rope_cache import npu_kv_rmsnorm_rope_cache
from .lightning_indexer import npu_lightning_indexer
from .mla_preprocess import npu_mla_preprocess
from .mla_prolog import npu_mla_prolog, npu_mla_prolog_v2, npu_mla_prolog_v3
from .paged_cache import npu_gather_pa_kv_cache, npu_scatter_pa_kv_cache
from .quant_lightning_indexer import npu_quant_lightning_indexer
from .quant_950 import npu_dtype_cast, npu_dynamic_mx_quant, npu_dynamic_mx_quant_with_dual_axis
from .rope import npu_interleave_rope, npu_rotary_mul
from .sparse_flash_attention import npu_kv_quant_sparse_flash_attention, npu_sparse_flash_attention
from .v4_small import (compressor_metadata, compressor_metadata_out, inplace_partial_rotary_mul,
                       npu_rms_norm_dynamic_quant)
from .hc import (npu_hc_post, npu_hc_pre, npu_hc_pre_inv_rms, npu_hc_pre_sinkhorn,  # DeepSeek-V4 mHC
                 npu_hc_pre_v2, npu_hc_pre_v3)
from .sparse_attn_sharedkv import npu_sparse_attn_sharedkv, npu_sparse_attn_sharedkv_metadata  # DeepSeek-V4
from .compressor import compressor  # DeepSeek-V4
from .kv_quant_sparse_attn_sharedkv import (npu_kv_quant_sparse_attn_sharedkv,  # DeepSeek-V4, Ascend 950
                                            npu_kv_quant_sparse_attn_sharedkv_metadata)
from .vllm_quant_lightning_indexer import (custom_npu_quant_lightning_indexer,  # DeepSeek-V4
                                           npu_vllm_quant_lightning_indexer,
                                           npu_vllm_quant_lightning_indexer_metadata)
from .kv_compress_epilog import kv_compress_epilog  # DeepSeek-V4 cache writers
from .indexer_compress_epilog import indexer_compress_epilog, indexer_compress_epilog_v2
from .scatter_nd_update import (npu_scatter_nd_update_sk, npu_scatter_nd_update_v2,  # DeepSeek-V4
                                scatter_nd_update_asc)

__all__ = ["backend", "backend_name", "get_backend", "set_backend", "get_npu_format", "npu_format_cast"]
__all__ += ["npu_kv_rmsnorm_rope_cache"]
__all__ += ["npu_mla_prolog", "npu_mla_prolog_v2", "npu_mla_prolog_v3"]
__all__ += ["npu_mla_preprocess"]
__all__ += ["npu_lightning_indexer"]
__all__ += ["npu_sparse_flash_attention", "npu_kv_quant_sparse_flash_attention"]
__all__ += ["npu_interleave_rope", "npu_rotary_mul"]
__all__ += ["npu_scatter_pa_kv_cache", "npu_gather_pa_kv_cache"]
__all__ += ["npu_dynamic_quant", "npu_dynamic_quant_asymmetric"]
__all__ += ["npu_quant_lightning_indexer"]
__all__ += ["npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2"]
__all__ += ["npu_dtype_cast", "npu_dynamic_mx_quant", "npu_dynamic_mx_quant_with_dual_axis"]
__all__ += ["npu_rms_norm_dynamic_quant", "inplace_partial_rotary_mul", "compressor_metadata",
            "compressor_metadata_out"]
__all__ += ["npu_hc_pre_v2", "npu_hc_pre_v3", "npu_hc_pre", "npu_hc_pre_inv_rms", "npu_hc_pre_sinkhorn",
            "npu_hc_post"]
__all__ += ["npu_sparse_attn_sharedkv", "npu_sparse_attn_sharedkv_metadata"]
__all__ += ["kv_compress_epilog", "indexer_compress_epilog", "indexer_compress_epilog_v2"]
__all__ += ["npu_scatter_nd_update_v2", "npu_scatter_nd_update_sk", "scatter_nd_update_asc"]
__all__ += ["compressor"]
__all__ += ["npu_kv_quant_sparse_attn_sharedkv", "npu_kv_quant_sparse_attn_sharedkv_metadata"]
__all__ += ["npu_vllm_quant_lightning_indexer", "npu_vllm_quant_lightning_indexer_metadata",
            "custom_npu_quant_lightning_indexer"]


def __getattr__(name: str):
    """``ascend_emu.ops.<op>`` for an op the emulator does not have: an ``AttributeError`` saying
    so, where the emulated ops are listed and how to mock it (:func:`ascend_emu.errors.not_emulated`)."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}", name=name)
    from ..errors import not_emulated

    raise not_emulated("ascend_emu.ops", name, [n for n in __all__ if n.startswith("npu_")],
                       listed_in="ascend_emu.ops.__all__ and docs/ops.md", mock="ascend_emu.ops")
