"""DeepSeek-V4's shared-KV sparse attention on the Ascend 950 (640-byte FP8 rows): the contract.

``npu_kv_quant_sparse_attn_sharedkv`` (vllm-ascend ``torch.ops._C_ascend``, cann-recipes-infer
``torch.ops.custom``) is :func:`ascend_emu.ops.npu_sparse_attn_sharedkv` over caches whose rows
are the 640 bytes ``kv_compress_epilog`` writes (quant_mode 2, docs/v4.md):

    bytes 0-127 the 64 rope values (bf16) | 128-575 the 448 nope values (FP8 E4M3FN) |
    576-582 one E8M0 scale per 64 nope values | 583-639 pad

and the same formula, window, compressed rows and checks (one contract:
:func:`ascend_emu.ops.sparse_attn_sharedkv.prepare`), with the README's differences:

- q bf16 only, ``[T, N1, 512]`` / ``[B, S, N1, 512]`` with N1 64 or 128; ``ori_kv`` / ``cmp_kv``
  float8_e4m3fn ``[blocks, block_size, 1, 640]``;
- ``kv_quant_mode`` 1 (per-tile FP8 nope), ``tile_size`` 64, ``rope_head_dim`` 64: the only
  values (the schema defaults 0 are rejected);
- ``sinks`` fp32 ``[N1]`` required; ``softmax_scale`` required (> 0);
- ``cmp_ratio`` 1 without ``cmp_kv`` (README: "only 1"; the schema default 0 is rejected), 4 or
  128 with it, dense (no indices) or sparse (``cmp_sparse_indices``) either way (the kernel's
  check accepts both ratios in both modes);
- ``cmp_sparse_indices`` ``[.., 1, K2]`` with K2 512 or 1024, each row's valid entries first and
  its ``-1`` entries after them (README);
- ``cu_seqlens_ori_kv`` / ``cu_seqlens_cmp_kv`` must be None (the kernel's tiling check rejects
  them: "is not supported now, it must be nullptr"); ``seqused_q`` has no effect;
- the plan of :func:`npu_kv_quant_sparse_attn_sharedkv_metadata` (its own magic; an A2 / A3 plan
  is rejected), also recording ``kv_quant_mode``;
- Ascend 950 only (:func:`ascend_emu.soc.require_ascend950`).

What is read, exactly: each row the call reads (window rows of every request and its compressed
rows) is decoded as the kernel's vector unit does before the cube's ``Q @ K^T`` (``AntiquantVFImpl
Fp8D448``, ``CastScale``): the E8M0 byte to bf16 to fp32 (``2**(byte - 127)``), the FP8 value to
fp32, one fp32 multiply, a cast to bf16 (RINT); the rope part is the stored bf16. The product of a
3-bit mantissa and a power of two is exact in bf16 unless it leaves bf16's range, so the decoded
row is :func:`ascend_emu.quant.v4.decode_kv_rows`' value rounded to bf16 (a scale byte ``0xFF``
gives NaN; a product past the fp32 range inf, as the multiply does). The kernel decodes each row
it reads, and no other, as it gathers the rows (:func:`ascend_emu.quant.v4.decode_kv_rows_bf16_into`,
one compiled pass, the rows' values as fp32). Those bf16 rows then run the shared-KV
kernel (``ascend_emu/emu/sparse_attn_sharedkv.py``) with the sink as this kernel applies it:
the running max starts at ``sinks[n]`` and the running sum at 1 ("maxUb initialised from sinks,
sumUb to 1.0").

Sources: vllm-project/vllm-ascend ``csrc/attention/kv_quant_sparse_attn_sharedkv/README.md``,
``.../op_host/kv_quant_sparse_attn_sharedkv_check_*.cpp`` (the checks),
``.../op_kernel/arch35/kv_quant_sparse_attn_sharedkv_scfa_block_vector.h`` (dequant, sinks),
``csrc/attention/kv_quant_sparse_attn_sharedkv_metadata/README.md``, ``csrc/torch_binding.cpp``
(schemas), ``vllm_ascend/device/device_op.py`` (the A5 caller's arguments) (docs/sources.md).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..quant.v4 import kv_row_bytes
from ..soc import require_ascend950
from ._backend import get_backend
from ._plan import PlanFormat
from .sparse_attn_sharedkv import (_EMPTY_LSE, CMP_MASK_MODE, CMP_TOPK, HEAD_DIM, LAYOUT_KV, NUM_HEADS_Q,
                                   ORI_MASK_MODE, ORI_WIN_LEFT, ORI_WIN_RIGHT, PLAN_FIELDS, Variant,
                                   _only, plan_words, prepare)

#: kv_quant_mode 1: per-tile FP8 E4M3FN nope with E8M0 scales (the README's only mode).
KV_QUANT_MODE = 1
#: Nope values per scale (README: only 64) and the rope width (README: only 64).
TILE_SIZE = 64
ROPE_HEAD_DIM = 64
#: Query heads N1 the kernel takes.
HEADS_Q = (NUM_HEADS_Q, 128)
#: K2 (the width of ``cmp_sparse_indices``) the kernel takes.
TOPKS = (CMP_TOPK, 1024)
#: Bytes per cache row (the 640-byte row of ``kv_compress_epilog`` quant_mode 2).
ROW_BYTES = kv_row_bytes(HEAD_DIM, 2)
#: First word of a plan of :func:`npu_kv_quant_sparse_attn_sharedkv_metadata` (ASCII "KQS1").
PLAN_MAGIC = 0x4B515331
PLAN_VERSION = 1
#: The plan's words: the A2 / A3 plan's, then ``kv_quant_mode``, then the checksum.
PLAN_FIELDS_950 = (*PLAN_FIELDS[:-1], "kv_quant_mode", "checksum")
PLAN = PlanFormat(PLAN_MAGIC, PLAN_VERSION, PLAN_FIELDS_950, "npu_kv_quant_sparse_attn_sharedkv_metadata",
                  "README: the metadata op's core split", ("max_seqlen_q", "max_seqlen_kv"))
#: The Ascend 950 op's side of the shared contract.
V950 = Variant("npu_kv_quant_sparse_attn_sharedkv", HEADS_Q, ROW_BYTES, ("bfloat16",), ("float8_e4m3fn",), TOPKS,
               True, (1,), "README: only 1 without cmp_kv (SWA); the schema's default 0 is not", False, True, True,
               PLAN, True)


def _modes(kv_quant_mode, tile_size, rope_head_dim, *, allow_unset: bool) -> None:
    """``kv_quant_mode`` 1, ``tile_size`` 64, ``rope_head_dim`` 64 (``allow_unset``: 0 too, the
    metadata schema's default, which vllm-ascend's A5 caller leaves)."""
    require_ascend950("kv_quant_mode", kv_quant_mode, "per-tile FP8 KV, 640-byte rows")
    _only(kv_quant_mode, "kv_quant_mode", (KV_QUANT_MODE,), "README: per-tile FP8 E4M3FN nope, the only mode")
    unset = (0,) if allow_unset else ()
    _only(tile_size, "tile_size", (TILE_SIZE, *unset), "README: only 64 (448 nope values / 7 scales)")
    _only(rope_head_dim, "rope_head_dim", (ROPE_HEAD_DIM, *unset), "README: only 64")


def npu_kv_quant_sparse_attn_sharedkv_metadata(num_heads_q: int, num_heads_kv: int, head_dim: int,
                                               kv_quant_mode: int, cu_seqlens_q=None, cu_seqlens_ori_kv=None,
                                               cu_seqlens_cmp_kv=None, seqused_q=None, seqused_kv=None,
                                               batch_size: int = 0, max_seqlen_q: int = 0, max_seqlen_kv: int = 0,
                                               ori_topk: int = 0, cmp_topk: int = 0, tile_size: int = 0,
                                               rope_head_dim: int = 0, cmp_ratio: int = -1,
                                               ori_mask_mode: int = ORI_MASK_MODE,
                                               cmp_mask_mode: int = CMP_MASK_MODE, ori_win_left: int = ORI_WIN_LEFT,
                                               ori_win_right: int = ORI_WIN_RIGHT, layout_q: str = "BSND",
                                               layout_kv: str = LAYOUT_KV, has_ori_kv: bool = True,
                                               has_cmp_kv: bool = True, device: str = "npu:0") -> np.ndarray:
    """``npu_kv_quant_sparse_attn_sharedkv_metadata``: the int32 ``[1024]`` plan the Ascend 950
    attention requires.

    The words (:data:`PLAN_FIELDS_950`, the rest 0): those of
    :func:`ascend_emu.ops.npu_sparse_attn_sharedkv_metadata` with magic ``0x4B515331``, then
    ``kv_quant_mode``, then a CRC-32 of the words before it.

    Args:
        num_heads_q: 64 or 128. num_heads_kv: 1. head_dim: 512.
        kv_quant_mode: 1.
        cu_seqlens_q, seqused_kv, batch_size, max_seqlen_q, max_seqlen_kv, ori_topk, the window
            and mask modes, layout_q / layout_kv, has_ori_kv, device: as the A2 / A3 op's.
        cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q: int32 1-D or None; no effect (README).
        cmp_topk: with ``has_cmp_kv``: 0 (dense compressed rows) or the K2 the attention's
            ``cmp_sparse_indices`` will have (512 / 1024); else 0.
        tile_size, rope_head_dim: 64, or 0 (the schema default vllm-ascend's A5 caller leaves;
            not recorded: the attention checks its own).
        cmp_ratio: 4 or 128 with ``has_cmp_kv``; else one of -1, 0, 1, 4, 128 (ignored).

    Returns:
        int32 ``[1024]``.

    Raises:
        ModeError: a mode, count or flag other than the above, or a SoC that is not an Ascend 950.
        ShapeError / DTypeError: the length tensors (a decreasing ``cu_seqlens_q`` names its position).

    Source: vllm-ascend ``csrc/attention/kv_quant_sparse_attn_sharedkv_metadata/README.md`` (docs/sources.md).
    """
    _modes(kv_quant_mode, tile_size, rope_head_dim, allow_unset=True)
    words = plan_words(V950, num_heads_q, num_heads_kv, head_dim, cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv,
                       seqused_q, seqused_kv, batch_size, max_seqlen_q, max_seqlen_kv, ori_topk, cmp_topk, cmp_ratio,
                       ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, layout_q, layout_kv, has_ori_kv,
                       has_cmp_kv, device)
    return PLAN.encode([*words, KV_QUANT_MODE])


def npu_kv_quant_sparse_attn_sharedkv(q, kv_quant_mode: int, ori_kv=None, cmp_kv=None, ori_sparse_indices=None,
                                      cmp_sparse_indices=None, ori_block_table=None, cmp_block_table=None,
                                      cu_seqlens_q=None, cu_seqlens_ori_kv=None, cu_seqlens_cmp_kv=None,
                                      seqused_q=None, seqused_kv=None, sinks=None, metadata=None,
                                      tile_size: int = 0, rope_head_dim: int = 0, softmax_scale: float = 0.0,
                                      cmp_ratio: int = 0, ori_mask_mode: int = ORI_MASK_MODE,
                                      cmp_mask_mode: int = CMP_MASK_MODE, ori_win_left: int = ORI_WIN_LEFT,
                                      ori_win_right: int = ORI_WIN_RIGHT, layout_q: str = "BSND",
                                      layout_kv: str = LAYOUT_KV, return_softmax_lse: bool = False):
    """``npu_kv_quant_sparse_attn_sharedkv``: window + compressed + sink attention over 640-byte
    FP8 rows, K as V (module doc).

    Args:
        q: bf16 ``[T, N1, 512]`` (TND) or ``[B, S, N1, 512]`` (BSND), N1 64 or 128.
        kv_quant_mode: 1.
        ori_kv: float8_e4m3fn ``[blocks, bs, 1, 640]`` (required). cmp_kv: the same, or None (SWA).
        ori_sparse_indices: int32 ``[T, 1, K1]`` / ``[B, S, 1, K1]`` or None; no effect (README).
        cmp_sparse_indices: int32 ``[T, 1, K2]`` / ``[B, S, 1, K2]``, K2 512 or 1024: compressed
            positions, valid entries first, then -1.
        ori_block_table, cmp_block_table: int32 ``[B, >= ceil(S / bs)]`` (S2 = seqused_kv, S3 =
            seqused_kv // cmp_ratio).
        cu_seqlens_q: int32 ``[B + 1]`` prefix sums from 0 to T, non-decreasing (TND, required).
        cu_seqlens_ori_kv, cu_seqlens_cmp_kv: None only. seqused_q: int32 1-D or None; no effect.
        seqused_kv: int32 ``[B]``, each >= the request's query count (required).
        sinks: fp32 ``[N1]``, finite (required).
        metadata: the plan of :func:`npu_kv_quant_sparse_attn_sharedkv_metadata` for this call.
        tile_size, rope_head_dim: 64. softmax_scale: > 0.
        cmp_ratio: 1 without cmp_kv; 4 or 128 with it.
        ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right: 4, 3, 127, 0 only.
        layout_q: ``'TND'`` / ``'BSND'``; layout_kv: ``'PA_ND'``. return_softmax_lse: False only.

    Returns:
        ``(out, softmax_lse)``: out bf16 of q's shape; softmax_lse fp32 ``[0]``.

    Raises:
        ModeError, ShapeError, DTypeError, IndexRangeError: naming the argument (module doc and
        :mod:`ascend_emu.ops.sparse_attn_sharedkv`); ModeError on a SoC that is not an Ascend 950.
        Nothing is written (the outputs are new arrays).

    Source: vllm-ascend ``csrc/attention/kv_quant_sparse_attn_sharedkv/README.md`` (docs/sources.md).
    """
    _modes(kv_quant_mode, tile_size, rope_head_dim, allow_unset=False)
    args = prepare(V950, q, ori_kv, cmp_kv, ori_sparse_indices, cmp_sparse_indices, ori_block_table, cmp_block_table,
                   cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_kv, sinks, metadata,
                   softmax_scale, cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, layout_q,
                   layout_kv, return_softmax_lse, {"kv_quant_mode": KV_QUANT_MODE})
    out = get_backend().sparse_attn_sharedkv(replace(args, encoded=True)).out
    return out.reshape(args.out_shape), _EMPTY_LSE.copy()


__all__ = ["npu_kv_quant_sparse_attn_sharedkv", "npu_kv_quant_sparse_attn_sharedkv_metadata"]
