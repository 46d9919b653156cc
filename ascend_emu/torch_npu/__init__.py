"""A drop-in for ``import torch_npu`` that runs the emulated ops on CPU torch tensors.

Use it as ``import ascend_emu.torch_npu as torch_npu``, or run an unmodified script with
``ascend-emu run script.py`` (which makes ``import torch_npu`` resolve here, see :func:`install`).

Importing this module does to torch what the real ``import torch_npu`` does (see
:mod:`ascend_emu.torch_npu.npu`): ``torch.npu`` exists, ``Tensor.npu()`` copies a host tensor to
the (emulated) NPU and ``.cpu()`` copies it back, so host and device tensors never alias.

The ops take torch_npu's exact signatures (its meta registrations: argument names, order,
keyword-only marks, defaults) and run :mod:`ascend_emu.ops` through the zero-copy bridge in
:mod:`._convert`: in-place caches are updated in the caller's own tensors and returned as those
same tensor objects. Errors are ascend_emu's (``ValueError`` / ``TypeError`` subclasses naming
the argument), not the ``RuntimeError`` torch_npu raises. Graph mode (torchair) is not emulated.
"""

from __future__ import annotations

import sys

try:
    import torch
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError('ascend_emu.torch_npu needs torch; install it with: pip install -e ".[torch]" '
                              "(or pip install torch)", name=exc.name) from exc

from .. import __version__ as _emu_version
from ..layouts import FRACTAL_NZ, ND
from . import npu
from ._convert import call_emulated, nz_of, tag_nz, to_numpy, to_torch

npu.patch_torch()

#: torch_npu versions follow torch's; the local label says this is the emulator.
__version__ = f"{torch.__version__.split('+')[0]}+ascend_emu.{_emu_version}"
version = __version__


def npu_format_cast(self: torch.Tensor, acl_format: int, customize_dtype=None) -> torch.Tensor:
    """``torch_npu.npu_format_cast``: a new tensor in ``acl_format``.

    Like torch_npu, the result shows the logical ND values (``.shape``, indexing, ``.cpu()``);
    for 29 (FRACTAL_NZ) it is tagged so :func:`get_npu_format` reports 29 and the ops accept it
    as an NZ weight (its NZ storage: ``ascend_emu.layouts.nd_to_nz``). 2 (ND) gives an untagged
    copy. Source: the npu_format_cast doc, ops_reference §1.4.

    Args:
        self: tensor of bf16 / fp16 / fp32 / int32 / int8, any shape ``[..., M, N]``.
        acl_format: 29 (FRACTAL_NZ) or 2 (ND).
        customize_dtype: not emulated; must be None.

    Returns:
        A new tensor on the emulated NPU (a copy; the input is not changed).

    Raises:
        ModeError: another ``acl_format``, or a ``customize_dtype``.
        DTypeError: a dtype without an NZ layout (for 29).
    """
    from .. import ops

    if customize_dtype is not None:
        from ..errors import ModeError, arg_error, describe
        raise arg_error(ModeError, "customize_dtype", "None (not emulated)", describe(customize_dtype))
    cast = ops.npu_format_cast(to_numpy(self, "self"), acl_format)
    out = npu.mark_npu(to_torch(cast))
    return tag_nz(out, cast) if ops.get_npu_format(cast) == FRACTAL_NZ else out


def get_npu_format(self) -> int:
    """``torch_npu.get_npu_format``: 29 for a tensor from ``npu_format_cast(t, 29)``, else 2 (ND).

    Also accepts NumPy arrays (:func:`ascend_emu.ops.get_npu_format`).
    """
    from .. import ops

    if isinstance(self, torch.Tensor):
        return FRACTAL_NZ if nz_of(self) is not None else ND
    return ops.get_npu_format(self)


def npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                              c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5,
                              cache_mode="Norm", is_output_kv=False):
    """``torch_npu.npu_kv_rmsnorm_rope_cache`` on CPU tensors.

    Shapes, dtypes, numerics and errors: :func:`ascend_emu.ops.npu_kv_rmsnorm_rope_cache`.
    ``k_cache`` / ``ckv_cache`` are updated in place and returned as the same tensor objects.

    Returns:
        ``(k_cache, ckv_cache, k_rope, c_kv)``.
    """
    return call_emulated("npu_kv_rmsnorm_rope_cache", npu_kv_rmsnorm_rope_cache, locals())


def npu_mla_prolog(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                   rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *,
                   dequant_scale_x=None, dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                   dequant_scale_w_dkv_kr=None, quant_scale_ckv=None, quant_scale_ckr=None,
                   smooth_scales_cq=None, rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-5,
                   cache_mode="PA_BSND"):
    """``torch_npu.npu_mla_prolog`` on CPU tensors.

    Shapes, dtypes, numerics and errors: :func:`ascend_emu.ops.npu_mla_prolog`. Weights
    ``weight_dq`` / ``weight_uq_qr`` / ``weight_dkv_kr`` must come from
    ``npu_format_cast(w, 29)``. ``kv_cache`` / ``kr_cache`` are updated in place.

    Returns:
        ``(query, query_rope, kv_cache, kr_cache)``.
    """
    return call_emulated("npu_mla_prolog", npu_mla_prolog, locals())


def npu_mla_prolog_v2(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                      rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *,
                      dequant_scale_x=None, dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                      dequant_scale_w_dkv_kr=None, quant_scale_ckv=None, quant_scale_ckr=None,
                      smooth_scales_cq=None, rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-5,
                      cache_mode="PA_BSND"):
    """``torch_npu.npu_mla_prolog_v2`` on CPU tensors.

    Shapes, dtypes, numerics and errors: :func:`ascend_emu.ops.npu_mla_prolog_v2`.
    ``kv_cache`` / ``kr_cache`` are updated in place.

    Returns:
        ``(query, query_rope, kv_cache, kr_cache, dequant_scale_q_nope)``.
    """
    return call_emulated("npu_mla_prolog_v2", npu_mla_prolog_v2, locals())


def npu_mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                      rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, *, cache_index=None,
                      dequant_scale_x=None, dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                      dequant_scale_w_dkv_kr=None, quant_scale_ckv=None, quant_scale_ckr=None,
                      smooth_scales_cq=None, actual_seq_len=None, k_nope_clip_alpha=None,
                      rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-5, cache_mode="PA_BSND",
                      query_norm_flag=False, weight_quant_mode=0, kv_cache_quant_mode=0, query_quant_mode=0,
                      ckvkr_repo_mode=0, quant_scale_repo_mode=0, tile_size=128, qc_qr_scale=1.0, kc_scale=1.0,
                      token_x_dtype=None, weight_dq_dtype=None, weight_uq_qr_dtype=None,
                      weight_dkv_kr_dtype=None, kv_cache_dtype=None):
    """``torch_npu.npu_mla_prolog_v3`` on CPU tensors.

    Shapes, dtypes, numerics and errors: :func:`ascend_emu.ops.npu_mla_prolog_v3`.
    ``kv_cache`` / ``kr_cache`` are updated in place (they are not returned, as in torch_npu).
    The ``*_dtype`` arguments (hifloat8 inputs) are accepted only at their default None.

    Returns:
        ``(query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm)``.
    """
    return call_emulated("npu_mla_prolog_v3", npu_mla_prolog_v3, locals())


def install() -> None:
    """Make ``import torch_npu`` (and ``torch_npu.npu``, ``torch_npu.atb``) resolve to this module.

    ``ascend-emu run`` calls it before running a script; call it yourself (e.g. in a
    ``conftest.py``) to run code that imports ``torch_npu`` in-process.
    """
    this = sys.modules[__name__]
    sys.modules["torch_npu"] = this
    sys.modules["torch_npu.npu"] = npu
    sys.modules["torch_npu.atb"] = atb


from . import atb  # noqa: E402  (torch_npu.atb.npu_mla_preprocess)

__all__ = ["atb", "npu", "install", "get_npu_format", "npu_format_cast", "npu_kv_rmsnorm_rope_cache",
           "npu_mla_prolog", "npu_mla_prolog_v2", "npu_mla_prolog_v3", "__version__"]


def npu_lightning_indexer(query, key, weights, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                          block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048,
                          sparse_mode=3, pre_tokens=9223372036854775807, next_tokens=9223372036854775807,
                          return_value=False):
    """``torch_npu.npu_lightning_indexer`` on CPU tensors.

    Shapes, dtypes, numerics and errors: :func:`ascend_emu.ops.npu_lightning_indexer`.

    Returns:
        ``(sparse_indices, sparse_values)``: int32 top-k kv positions and, with ``return_value``,
        their scores in the query dtype (else an empty ``[0]`` tensor).
    """
    return call_emulated("npu_lightning_indexer", npu_lightning_indexer, locals())


__all__ += ["npu_lightning_indexer"]
__all__ += ["npu_sparse_flash_attention", "npu_kv_quant_sparse_flash_attention"]


def npu_sparse_flash_attention(query, key, value, sparse_indices, scale_value, *, block_table=None,
                               actual_seq_lengths_query=None, actual_seq_lengths_kv=None, query_rope=None,
                               key_rope=None, sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                               sparse_mode=3, pre_tokens=9223372036854775807, next_tokens=9223372036854775807,
                               attention_mode=0, return_softmax_lse=False, sinks=None):
    """``torch_npu.npu_sparse_flash_attention`` on CPU tensors.

    Shapes, dtypes, numerics and errors: :func:`ascend_emu.ops.npu_sparse_flash_attention`
    (``attention_mode`` must be 2, as on hardware).

    Returns:
        ``(attention_out, softmax_max, softmax_sum)``.
    """
    return call_emulated("npu_sparse_flash_attention", npu_sparse_flash_attention, locals())


def npu_kv_quant_sparse_flash_attention(query, key, value, sparse_indices, scale_value, key_quant_mode,
                                        value_quant_mode, *, key_dequant_scale=None, value_dequant_scale=None,
                                        block_table=None, actual_seq_lengths_query=None, actual_seq_lengths_kv=None,
                                        sparse_block_size=1, layout_query="BSND", layout_kv="BSND", sparse_mode=3,
                                        pre_tokens=9223372036854775807, next_tokens=9223372036854775807,
                                        attention_mode=0, quant_scale_repo_mode=1, tile_size=128, rope_head_dim=64,
                                        key_dtype=None, value_dtype=None):
    """``torch_npu.npu_kv_quant_sparse_flash_attention`` on CPU tensors.

    Shapes, dtypes, numerics and errors: :func:`ascend_emu.ops.npu_kv_quant_sparse_flash_attention`
    (``value`` must be the ``key`` tensor itself; ``attention_mode`` must be 2).

    Returns:
        ``attention_out``.
    """
    return call_emulated("npu_kv_quant_sparse_flash_attention", npu_kv_quant_sparse_flash_attention, locals())
