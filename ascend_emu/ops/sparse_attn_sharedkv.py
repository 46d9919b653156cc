"""DeepSeek-V4's shared-KV sparse attention (A2 / A3, bf16 / fp16 caches): the contract.

``npu_sparse_attn_sharedkv`` (vllm-ascend ``torch.ops._C_ascend``, cann-recipes-infer
``torch.ops.custom``) attends each query token over one 512-wide latent that is both K and V
(MQA, KV_N = 1)::

    O = softmax([q . K~^T * softmax_scale, sink]) @ K~      (the sink adds to the denominator only)

with ``K~`` the union of

- the **window** rows of the original (SWA) cache: positions ``p - ori_win_left .. p +
  ori_win_right`` clipped to ``[0, p]`` (band mask, ``ori_mask_mode`` 4, ``ori_win_left`` 127,
  ``ori_win_right`` 0), where ``p = seqused_kv[b] - q_len[b] + i`` is query ``i``'s position in
  its request;
- the **compressed** rows (``cmp_kv``, right-down causal, ``cmp_mask_mode`` 3): row ``j`` (which
  pools original tokens ``j * cmp_ratio .. (j + 1) * cmp_ratio - 1``) is visible to position ``p``
  iff ``j < (p + 1) // cmp_ratio``. HCA (``cmp_ratio`` 128, no indices) attends all visible rows;
  CSA (``cmp_ratio`` 4) attends only the rows ``cmp_sparse_indices`` names (the lightning
  indexer's top-512; ``-1`` entries are skipped);
- and the per-head sink logit ``sinks[n]`` when given.

Three scenarios (README): ``ori_kv`` only (SWA), ``ori_kv + cmp_kv`` (HCA), ``ori_kv + cmp_kv +
cmp_sparse_indices`` (CSA). Caches are paged PA_ND ``[blocks, block_size, 1, 512]``; kv token
``t`` of request ``b`` lives in block ``block_table[b, t // block_size]``, row ``t % block_size``
(:func:`_cache_slots`, the one place this module addresses a cache).

``npu_sparse_attn_sharedkv_metadata`` returns the int32 ``[1024]`` plan the attention requires
(:data:`PLAN_FIELDS`): on the NPU a per-core task list computed by an AICPU op; here a documented
encoding of the arguments it was built for, which the attention compares with its own call
(docs/ops.md "Shared-KV sparse attention"). The emulator does not split work by the plan.

Checks (stricter than the kernel where its README is stricter, never looser): N1 = 64, KV_N = 1,
D = 512; ``ori_win_left`` 127 and ``ori_win_right`` 0 only (the ``_C_ascend`` schema's default 128
is rejected: the README supports 127 only); mask modes 4 / 3; ``layout_kv`` PA_ND; block sizes
multiples of 16 up to 1024; ``metadata`` required and matching; ``cu_seqlens_q`` (TND) a
non-decreasing prefix sum from 0 to T (the NPU reads out of bounds otherwise); every needed
block-table entry in range; CSA indices ``-1`` or visible compressed rows, no duplicates;
``return_softmax_lse`` False only (README: "not supported yet"; the returned softmax_lse is the
empty fp32 ``[0]`` tensor the adapter makes); ``softmax_scale`` > 0 and finite in fp32. Arguments
the README says have no effect (``ori_sparse_indices``, ``cu_seqlens_ori_kv``,
``cu_seqlens_cmp_kv``, ``seqused_q``) are checked for type and ignored, as the kernel ignores them.

Sources: vllm-project/vllm-ascend ``csrc/attention/sparse_attn_sharedkv/README.md``,
``csrc/attention/sparse_attn_sharedkv_metadata/README.md``, ``csrc/torch_binding.cpp`` (schemas,
output shapes), ``vllm_ascend/attention/dsa_v1.py`` (the caller); hicann/cann-recipes-infer
``ops/ascendc/docs/custom-npu_sparse_attn_sharedkv*.md``, the V4 reference model
``models/deepseek_v4_flash_tilelang_and_inductor_af/model.py`` (window and compressed indices,
the sink) (docs/sources.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import DTypeError, IndexRangeError, ModeError, ShapeError, arg_error, describe
from ..layouts import CacheLayout, slots_from_block_table
from ..soc import is_ascend950, soc_name
from ._backend import get_backend
from ._check import (check_call_bytes, check_cu_seqlens, check_dtype, check_float, check_int, dtype_name, optional,
                     required, seq_lengths)
from ._plan import PlanFormat, crc

#: Query heads N1 and kv heads KV_N the kernel takes (README).
NUM_HEADS_Q = 64
NUM_HEADS_KV = 1
#: The latent width D (K and V).
HEAD_DIM = 512
#: The only window the README supports: ``ori_win_left`` 127, ``ori_win_right`` 0.
ORI_WIN_LEFT = 127
ORI_WIN_RIGHT = 0
#: Mask modes: 4 band (original rows), 3 right-down causal (compressed rows); the only values.
ORI_MASK_MODE = 4
CMP_MASK_MODE = 3
#: cmp_ratio of the dense compressed scenario (HCA) and of the sparse one (CSA).
HCA_RATIO = 128
CSA_RATIO = 4
#: Compressed rows CSA selects per token (K2, the README's only value; the metadata's cmp_topk).
CMP_TOPK = 512
#: Sparse-index width of ``ori_sparse_indices`` (K1; accepted and ignored).
ORI_TOPK = 512
#: Block size rule of PA_ND caches: a multiple of 16, at most 1024.
BLOCK_ALIGN = 16
MAX_BLOCK_SIZE = 1024
#: Query layouts and the kv layout the kernel takes.
LAYOUTS_Q = ("TND", "BSND")
LAYOUT_KV = "PA_ND"
#: Cache / query dtypes (README: BFLOAT16, FLOAT16; one dtype for q and both caches).
DTYPES = ("bfloat16", "float16")
#: First word of a plan made by :func:`npu_sparse_attn_sharedkv_metadata` (ASCII "SKV1").
PLAN_MAGIC = 0x534B5631
PLAN_VERSION = 1
#: The plan's words, in order (docs/ops.md): the rest of the 1024 words are 0.
PLAN_FIELDS = ("magic", "version", "num_heads_q", "num_heads_kv", "head_dim", "batch_size", "layout_q",
               "layout_kv", "has_ori_kv", "has_cmp_kv", "cmp_ratio", "cmp_topk", "ori_win_left",
               "ori_win_right", "ori_mask_mode", "cmp_mask_mode", "max_seqlen_q", "max_seqlen_kv",
               "crc_cu_seqlens_q", "crc_seqused_kv", "checksum")
PLAN = PlanFormat(PLAN_MAGIC, PLAN_VERSION, PLAN_FIELDS, "npu_sparse_attn_sharedkv_metadata", "README: required",
                  ("max_seqlen_q", "max_seqlen_kv"))
#: Codes of the layouts in the plan.
LAYOUT_CODES = {"TND": 1, "BSND": 2, "PA_ND": 1}
#: Metadata cmp_ratio values accepted without a compressed cache (ignored then): the custom
#: schema's default -1, the attention's 0, the caller's 1, the _C_ascend default 4, and 128.
IGNORED_CMP_RATIOS = (-1, 0, 1, CSA_RATIO, HCA_RATIO)
#: Bound on a request's kv length (positions are int32 on the NPU).
MAX_SEQ = 2**31 - 1
_EMPTY_LSE = np.empty((0,), np.float32)


@dataclass(frozen=True)
class SharedKvArgs:
    """Normalised, validated arguments of ``npu_sparse_attn_sharedkv`` (and of the Ascend 950's
    ``npu_kv_quant_sparse_attn_sharedkv``, whose contract decodes the rows it reads to bf16 first).

    Attributes:
        q: ``[T, N1, 512]`` bf16 / fp16 (BSND flattened to ``B * S`` tokens; N1 64, or 128 on the
            950), the caller's data.
        out_shape: the output's shape (q's).
        token_batch, token_pos: int64 ``[T]``: each token's request and position ``p``.
        ori_rows: ``[ori_blocks * ori_block_size, 512]`` view of ori_kv (the 950: ``[.., 640]``
            FP8 rows, ``encoded``).
        ori_slots: int64 ``[B, W]``: the ori row of request b's position ``ori_base[b] + w`` (-1
            past it; positions before ``ori_base[b]`` are not read: no window reaches them).
        ori_base: int64 ``[B]``: the position of column 0 of ``ori_slots``.
        cmp_rows: ``[cmp_rows, 512]`` view of cmp_kv (the 950: as ori_rows), or None (SWA).
        cmp_slots: int64 ``[B, max S3]``: the cmp row of each compressed position, or None.
        cmp_indices: int64 ``[T, 512]`` compressed positions (-1 skip) for CSA, else None.
        sinks: fp32 ``[64]`` or None.
        softmax_scale: the scale (fp32 when applied).
        cmp_ratio: 4 / 128 with a compressed cache, else 1.
        win_left, win_right: 127, 0.
        sink_init: where the sink enters the online softmax: False, added to the denominator
            after the last tile (A2 / A3 reading); True, the running max starts at the sink and
            the running sum at 1 (the Ascend 950 kernel, ``kv_quant_sparse_attn_sharedkv``).
        encoded: the rows are the 950's 640-byte rows, each read decoded to its bf16 values by
            :func:`ascend_emu.quant.v4.decode_kv_rows_bf16_into` (the 950 contract's decode).
    """

    q: np.ndarray
    out_shape: tuple
    token_batch: np.ndarray
    token_pos: np.ndarray
    ori_rows: np.ndarray
    ori_slots: np.ndarray
    ori_base: np.ndarray
    cmp_rows: np.ndarray | None
    cmp_slots: np.ndarray | None
    cmp_indices: np.ndarray | None
    sinks: np.ndarray | None
    softmax_scale: float
    cmp_ratio: int
    win_left: int = ORI_WIN_LEFT
    win_right: int = ORI_WIN_RIGHT
    sink_init: bool = False
    encoded: bool = False


class SharedKvOutputs(NamedTuple):
    """What a backend returns: ``out`` ``[T, 64, 512]`` of q's dtype (the contract reshapes it)."""

    out: np.ndarray


# ------------------------------------------------------------------------------ small checks
def _int(value, name: str) -> int:
    return check_int(value, name, error=ModeError)


def _only(value, name: str, allowed: tuple, why: str) -> int:
    v = _int(value, name)
    if v not in allowed:
        raise arg_error(ModeError, name, f"{' or '.join(map(str, allowed))} ({why})", v)
    return v


def _window(ori_win_left, ori_win_right, ori_mask_mode, cmp_mask_mode) -> None:
    _only(ori_win_left, "ori_win_left", (ORI_WIN_LEFT,),
          "the only value the README supports; the _C_ascend schema's default 128 is not")
    _only(ori_win_right, "ori_win_right", (ORI_WIN_RIGHT,), "the only value the README supports")
    _only(ori_mask_mode, "ori_mask_mode", (ORI_MASK_MODE,), "band, the only mode the README supports")
    _only(cmp_mask_mode, "cmp_mask_mode", (CMP_MASK_MODE,), "right-down causal, the only mode the README supports")


def _layouts(layout_q, layout_kv) -> str:
    if layout_q not in LAYOUTS_Q:
        raise arg_error(ModeError, "layout_q", f"one of {list(LAYOUTS_Q)}", describe(layout_q))
    if layout_kv != LAYOUT_KV:
        raise arg_error(ModeError, "layout_kv", f"{LAYOUT_KV!r} (the only kv layout the kernel takes)",
                        describe(layout_kv))
    return layout_q


def _ignored_lengths(values: dict) -> None:
    """Arguments the README says have no effect: int32 1-D when given, then ignored."""
    for name, x in values.items():
        if x is not None:
            seq_lengths(x, name)


def _cu_seqlens_q(x, total: int) -> np.ndarray:
    """TND ``cu_seqlens_q`` ``[B + 1]`` -> per-request query counts ``[B]``."""
    v = seq_lengths(x, "cu_seqlens_q")
    if v.size < 2:
        raise arg_error(ShapeError, "cu_seqlens_q", "a 1-D int32 [B + 1] prefix sum with B >= 1",
                        f"shape {list(np.shape(x))}")
    return check_cu_seqlens(v, "cu_seqlens_q", ShapeError, total=total)


# -------------------------------------------------------------------------------- metadata
def npu_sparse_attn_sharedkv_metadata(num_heads_q: int, num_heads_kv: int, head_dim: int, cu_seqlens_q=None,
                                      cu_seqlens_ori_kv=None, cu_seqlens_cmp_kv=None, seqused_q=None,
                                      seqused_kv=None, batch_size: int = 0, max_seqlen_q: int = 0,
                                      max_seqlen_kv: int = 0, ori_topk: int = 0, cmp_topk: int = 0,
                                      cmp_ratio: int = -1, ori_mask_mode: int = ORI_MASK_MODE,
                                      cmp_mask_mode: int = CMP_MASK_MODE, ori_win_left: int = ORI_WIN_LEFT,
                                      ori_win_right: int = ORI_WIN_RIGHT, layout_q: str = "BSND",
                                      layout_kv: str = LAYOUT_KV, has_ori_kv: bool = True,
                                      has_cmp_kv: bool = True, device: str = "npu:0") -> np.ndarray:
    """``npu_sparse_attn_sharedkv_metadata``: the int32 ``[1024]`` plan the attention requires.

    The words (:data:`PLAN_FIELDS`, the rest 0): magic ``0x534B5631``, version 1, the head
    counts, D, B, layout codes (:data:`LAYOUT_CODES`), has_ori_kv / has_cmp_kv, cmp_ratio (0
    without a compressed cache), cmp_topk, the window and mask modes, max_seqlen_q / _kv, CRC-32s
    of ``cu_seqlens_q`` and ``seqused_kv`` (0 when absent), and a CRC-32 of the words before it.

    Args:
        num_heads_q, num_heads_kv, head_dim: 64, 1, 512.
        cu_seqlens_q: int32 ``[B + 1]`` prefix sums from 0, non-decreasing; required for TND,
            optional for BSND (checked and recorded in the plan either way).
        seqused_kv: int32 ``[B]`` kv tokens per request (required).
        cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q: int32 1-D or None; no effect (README).
        batch_size: B (must equal ``seqused_kv``'s length).
        max_seqlen_q, max_seqlen_kv: bounds on the query / kv counts (>= the actual maxima).
        ori_topk: 0 (README: not supported). cmp_topk: 512 for CSA (cmp_ratio 4), else 0.
        cmp_ratio: 4 or 128 with ``has_cmp_kv``; else one of :data:`IGNORED_CMP_RATIOS` (ignored).
        ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right: 4, 3, 127, 0 only.
        layout_q: ``'TND'`` / ``'BSND'``; layout_kv: ``'PA_ND'``.
        has_ori_kv: True (every scenario has the window). has_cmp_kv: bool.
        device: a str (where the real op allocates; the emulator ignores it).

    Returns:
        int32 ``[1024]``.

    Raises:
        ModeError: a mode, count or flag other than the above. ShapeError / DTypeError: the length
        tensors (a decreasing ``cu_seqlens_q`` names its position).

    Source: vllm-ascend ``csrc/attention/sparse_attn_sharedkv_metadata/README.md`` (docs/sources.md).
    """
    return PLAN.encode(plan_words(A2A3, num_heads_q, num_heads_kv, head_dim, cu_seqlens_q, cu_seqlens_ori_kv,
                                  cu_seqlens_cmp_kv, seqused_q, seqused_kv, batch_size, max_seqlen_q, max_seqlen_kv,
                                  ori_topk, cmp_topk, cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left,
                                  ori_win_right, layout_q, layout_kv, has_ori_kv, has_cmp_kv, device))


# ---------------------------------------------------------------------------- cache addressing
def _cache_slots(cache: np.ndarray, name: str, table, table_name: str, lens: np.ndarray, first: np.ndarray,
                 width: int = HEAD_DIM):
    """The one place this module addresses a paged cache: PA_ND ``[blocks, block_size, 1, width]``
    (``width`` 512, or the 950's 640-byte rows)
    read through ``table`` (:class:`~ascend_emu.layouts.paged.CacheLayout`,
    :func:`~ascend_emu.layouts.slots.slots_from_block_table`). Request ``b`` reads positions
    ``first[b] .. lens[b] - 1``: only the table entries covering them are read and checked (the
    entries before are not read: a window's old blocks may have been freed).

    Returns:
        ``(rows, slots, base)``: the cache as ``[blocks * block_size, 512]`` rows (a view); int64
        ``[B, W]`` row numbers of positions ``base[b] .. base[b] + W - 1`` (-1 past ``lens[b]``);
        int64 ``[B]`` ``base`` (``first`` rounded down to a block start).

    Raises:
        ShapeError: not 4-D ``[*, bs, 1, 512]``, a block size not a multiple of 16 in [16, 1024],
        not C-contiguous; a table too narrow. IndexRangeError: a needed entry out of range (named by
        its coordinates in ``table``). DTypeError: a table not int32.
    """
    if cache.ndim != 4 or cache.shape[2] != NUM_HEADS_KV or cache.shape[3] != width:
        raise arg_error(ShapeError, name, f"shape [blocks, block_size, 1, {width}] (PA_ND)",
                        f"shape {list(cache.shape)}")
    bs = int(cache.shape[1])
    if bs % BLOCK_ALIGN or not BLOCK_ALIGN <= bs <= MAX_BLOCK_SIZE:
        raise arg_error(ShapeError, f"{name} block_size (shape[1])",
                        f"a multiple of {BLOCK_ALIGN} in [{BLOCK_ALIGN}, {MAX_BLOCK_SIZE}] (README)", bs)
    if not cache.flags.c_contiguous:
        raise arg_error(ShapeError, name, "a C-contiguous cache", f"strides {cache.strides}")
    layout = CacheLayout.from_declared("PA_BSND", cache.shape, cache.dtype.itemsize, name=name)
    tab = required(table, table_name)
    check_dtype(tab, table_name, ("int32",))
    first_block = first // layout.block_size  # [B]
    if tab.ndim == 2 and tab.shape[0] == lens.size and layout.num_blocks and first_block.any():
        cols = np.arange(tab.shape[1])[None, :]
        tab = np.where(cols < first_block[:, None], 0, tab).astype(np.int32)  # unread entries: not checked
    slots = slots_from_block_table(tab, lens, layout.block_size, layout.num_blocks, name=table_name)
    base = first_block * layout.block_size
    width = int((lens - base).max(initial=0))
    cols = np.minimum(base[:, None] + np.arange(width)[None, :], max(slots.shape[1] - 1, 0))  # [B, W]
    inside = base[:, None] + np.arange(width)[None, :] < lens[:, None]
    window = np.where(inside, np.take_along_axis(slots, cols, axis=1) if slots.size else -1, -1)
    return cache.reshape(layout.num_rows, layout.dim), window.astype(np.int64), base


# ------------------------------------------------------------------------------- attention
@dataclass(frozen=True)
class Variant:
    """What the A2 / A3 op and the Ascend 950 op (``npu_kv_quant_sparse_attn_sharedkv``) do not
    share; everything else is one contract (:func:`prepare`).

    Attributes:
        op: the attention's name (messages).
        heads_q: accepted N1. row_width: the last dim of a cache row (512 values / 640 bytes).
        q_dtypes: accepted q dtypes. cache_dtypes: accepted cache dtypes (None: q's dtype).
        topks: accepted K2 (the last dim of ``cmp_sparse_indices``).
        sinks_required: whether ``sinks`` must be given.
        swa_ratios: ``cmp_ratio`` values accepted without ``cmp_kv``, and why.
        ratio_by_indices: True: 4 with indices (CSA) and 128 without (HCA); False: 4 or 128 either way.
        valid_first: whether each index row must hold its valid entries before its -1 entries.
        reject_kv_lengths: whether ``cu_seqlens_ori_kv`` / ``cu_seqlens_cmp_kv`` must be None
            (else checked for their kind and ignored).
        plan: the plan format of its ``_metadata`` op. sink_init: :attr:`SharedKvArgs.sink_init`.
    """

    op: str
    heads_q: tuple[int, ...]
    row_width: int
    q_dtypes: tuple[str, ...]
    cache_dtypes: tuple[str, ...] | None
    topks: tuple[int, ...]
    sinks_required: bool
    swa_ratios: tuple[int, ...]
    swa_ratio_why: str
    ratio_by_indices: bool
    valid_first: bool
    reject_kv_lengths: bool
    plan: PlanFormat
    sink_init: bool


#: The A2 / A3 op (README of ``sparse_attn_sharedkv``).
A2A3 = Variant("npu_sparse_attn_sharedkv", (NUM_HEADS_Q,), HEAD_DIM, DTYPES, None, (CMP_TOPK,), False, (0, 1),
               "without cmp_kv (SWA only)", True, False, False, PLAN, False)


def _heads_text(v: Variant) -> str:
    return " or ".join(map(str, v.heads_q)) + (" only" if len(v.heads_q) == 1 else "")


def prepare(v: Variant, q, ori_kv, cmp_kv, ori_sparse_indices, cmp_sparse_indices, ori_block_table, cmp_block_table,
            cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_kv, sinks, metadata,
            softmax_scale, cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, layout_q, layout_kv,
            return_softmax_lse, plan_extra: dict | None = None) -> SharedKvArgs:
    """The shared contract of both shared-KV attentions: every check of the module doc (with
    ``v``'s values), the plan compared with ``metadata`` (``plan_extra``: more fields to match),
    then each token's request, position and cache rows. Reads every input, writes nothing.

    Returns:
        :class:`SharedKvArgs` whose ``ori_rows`` / ``cmp_rows`` are the caches' rows as stored
        (``[rows, v.row_width]``).

    Raises:
        ModeError, ShapeError, DTypeError, IndexRangeError: naming the argument (module doc).
    """
    layout_q = _layouts(layout_q, layout_kv)
    _window(ori_win_left, ori_win_right, ori_mask_mode, cmp_mask_mode)
    if not isinstance(return_softmax_lse, (bool, np.bool_)) or return_softmax_lse:
        raise arg_error(ModeError, "return_softmax_lse", "False (README: returning softmax_lse is not supported "
                        "yet; its output is invalid)", describe(return_softmax_lse))
    scale = check_float(softmax_scale, "softmax_scale")
    if not scale > 0:
        raise arg_error(ModeError, "softmax_scale", "a scale > 0 (the schema's default 0 is no scale the "
                        "sources define)", scale)
    q = required(q, "q")
    check_dtype(q, "q", v.q_dtypes)
    want_nd = 3 if layout_q == "TND" else 4
    if q.ndim != want_nd or q.shape[-1] != HEAD_DIM or q.shape[-2] not in v.heads_q or 0 in q.shape:
        n1 = str(v.heads_q[0]) if len(v.heads_q) == 1 else "N1"
        want = f"[T, {n1}, 512]" if layout_q == "TND" else f"[B, S, {n1}, 512]"
        raise arg_error(ShapeError, "q", f"shape {want} (layout_q {layout_q}; N1 = {_heads_text(v)}, no empty "
                        "dims)", f"shape {list(q.shape)}")
    n1 = int(q.shape[-2])
    ori = required(ori_kv, "ori_kv")
    cmp = optional(cmp_kv, "cmp_kv")
    for name, cache in (("ori_kv", ori), ("cmp_kv", cmp)):
        if cache is None:
            continue
        if v.cache_dtypes is None:
            if cache.dtype != q.dtype:
                raise arg_error(DTypeError, name, f"q's dtype {dtype_name(q.dtype)}", dtype_name(cache.dtype))
        else:
            check_dtype(cache, name, v.cache_dtypes)
    if cmp is None:
        if cmp_sparse_indices is not None:
            raise arg_error(ShapeError, "cmp_sparse_indices", "None without cmp_kv (README scenarios)", "a tensor")
        if cmp_block_table is not None:
            raise arg_error(ShapeError, "cmp_block_table", "None without cmp_kv", "a tensor")
        ratio = _only(cmp_ratio, "cmp_ratio", v.swa_ratios, v.swa_ratio_why)
    elif v.ratio_by_indices:
        ratio = CSA_RATIO if cmp_sparse_indices is not None else HCA_RATIO
        _only(cmp_ratio, "cmp_ratio", (ratio,), "4 with cmp_sparse_indices (CSA), 128 without (HCA)")
    else:
        ratio = _only(cmp_ratio, "cmp_ratio", (CSA_RATIO, HCA_RATIO), "README: 4 or 128 with cmp_kv")
    if v.reject_kv_lengths:
        for name, x in (("cu_seqlens_ori_kv", cu_seqlens_ori_kv), ("cu_seqlens_cmp_kv", cu_seqlens_cmp_kv)):
            if x is not None:
                raise arg_error(ModeError, name, f"None (reserved: {v.op}'s kernel rejects it)", "a tensor")
        _ignored_lengths({"seqused_q": seqused_q})
    else:
        _ignored_lengths({"cu_seqlens_ori_kv": cu_seqlens_ori_kv, "cu_seqlens_cmp_kv": cu_seqlens_cmp_kv,
                          "seqused_q": seqused_q})
    kv_lens = seq_lengths(required(seqused_kv, "seqused_kv"), "seqused_kv")
    b = kv_lens.size
    if layout_q == "TND":
        t = int(q.shape[0])
        q_lens = _cu_seqlens_q(required(cu_seqlens_q, "cu_seqlens_q"), t)
        if q_lens.size != b:
            raise arg_error(ShapeError, "cu_seqlens_q", f"[B + 1] = [{b + 1}] (B from seqused_kv)",
                            f"shape {[q_lens.size + 1]}")
    else:
        if q.shape[0] != b:
            raise arg_error(ShapeError, "q", f"B = {b} (seqused_kv's length) in dim 0", f"shape {list(q.shape)}")
        s = int(q.shape[1])
        if cu_seqlens_q is not None:
            _cu_seqlens_q(cu_seqlens_q, b * s)
        q_lens = np.full(b, s, np.int64)
        t = b * s
    bad = (kv_lens < q_lens) | (kv_lens > MAX_SEQ)
    if bad.any():
        i = int(np.argmax(bad))
        raise arg_error(ShapeError, f"seqused_kv[{i}]", f"a kv count in [{int(q_lens[i])} (the request's query "
                        f"tokens, which are its last kv positions), {MAX_SEQ}]", int(kv_lens[i]))
    check_call_bytes(q, "q", 2 * q.dtype.itemsize + 8)
    token_batch = np.repeat(np.arange(b, dtype=np.int64), q_lens)  # [T]
    starts = np.cumsum(q_lens) - q_lens  # [B]
    token_pos = (kv_lens - q_lens)[token_batch] + (np.arange(t, dtype=np.int64) - starts[token_batch])  # [T]
    if sinks is not None:
        sk = required(sinks, "sinks")
        check_dtype(sk, "sinks", ("float32",))
        if sk.shape != (n1,):
            raise arg_error(ShapeError, "sinks", f"shape [{n1}]", f"shape {list(sk.shape)}")
        if not np.isfinite(sk).all():
            raise arg_error(ModeError, "sinks", "finite fp32 logits", describe(sk))
    elif v.sinks_required:
        raise arg_error(ShapeError, "sinks", f"an fp32 [{n1}] tensor (README: sinks must be passed)", None)
    else:
        sk = None
    lead = q.shape[:-2]
    if ori_sparse_indices is not None:  # no effect (README); checked for its kind
        osi = required(ori_sparse_indices, "ori_sparse_indices")
        check_dtype(osi, "ori_sparse_indices", ("int32",))
        if osi.shape[:-1] != (*lead, NUM_HEADS_KV):
            raise arg_error(ShapeError, "ori_sparse_indices", f"shape [{', '.join(map(str, lead))}, 1, K1]",
                            f"shape {list(osi.shape)}")
    ori_first = np.maximum(kv_lens - q_lens - ORI_WIN_LEFT, 0)  # [B] the oldest position a window reads
    ori_rows, ori_slots, ori_base = _cache_slots(ori, "ori_kv", ori_block_table, "ori_block_table", kv_lens,
                                                 ori_first, v.row_width)
    cmp_rows = cmp_slots = idx = None
    cmp_lens = kv_lens // max(ratio, 1)
    if cmp is not None:
        if cmp_block_table is None:
            raise arg_error(ShapeError, "cmp_block_table", "an int32 [B, W] table with cmp_kv", None)
        cmp_rows, cmp_slots, _ = _cache_slots(cmp, "cmp_kv", cmp_block_table, "cmp_block_table", cmp_lens,
                                              np.zeros(b, np.int64), v.row_width)
    if cmp_sparse_indices is not None:
        raw_idx = required(cmp_sparse_indices, "cmp_sparse_indices")
        check_dtype(raw_idx, "cmp_sparse_indices", ("int32",))
        if raw_idx.shape[:-1] != (*lead, NUM_HEADS_KV) or raw_idx.shape[-1] not in v.topks:
            k2 = str(v.topks[0]) if len(v.topks) == 1 else "K2"
            ks = " or ".join(map(str, v.topks)) + (" only" if len(v.topks) == 1 else "")
            raise arg_error(ShapeError, "cmp_sparse_indices",
                            f"shape [{', '.join(map(str, lead))}, 1, {k2}] (K2 = {ks})",
                            f"shape {list(raw_idx.shape)}")
        topk = int(raw_idx.shape[-1])
        idx = raw_idx.reshape(t, topk).astype(np.int64)
        visible = ((token_pos + 1) // ratio)[:, None]  # [T, 1]
        bad = (idx != -1) & ((idx < 0) | (idx >= visible))
        if bad.any():
            ti, k = (int(x) for x in np.argwhere(bad)[0])
            raise IndexRangeError(f"cmp_sparse_indices[token {ti}, 0, {k}] = {int(idx[ti, k])}: expected -1 or a "
                                  f"compressed row visible to position {int(token_pos[ti])}, in [0, "
                                  f"{int(visible[ti, 0])}); {int(bad.sum())} entries out of range")
        if v.valid_first:
            after = np.maximum.accumulate(idx == -1, axis=1) & (idx != -1)  # a valid entry after a -1
            if after.any():
                ti, k = (int(x) for x in np.argwhere(after)[0])
                raise IndexRangeError(f"cmp_sparse_indices[token {ti}, 0, {k}] = {int(idx[ti, k])}: expected the "
                                      f"valid indices first and every -1 after them (README), got a valid index "
                                      f"after a -1")
        srt = np.sort(idx, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] != -1)
        if dup.any():
            ti = int(np.argwhere(dup)[0][0])
            raise IndexRangeError(f"cmp_sparse_indices[token {ti}]: expected distinct compressed rows (the indexer "
                                  f"never repeats one), got {int(srt[ti, 1:][dup[ti]][0])} more than once")
    expect = {"num_heads_q": n1, "num_heads_kv": NUM_HEADS_KV, "head_dim": HEAD_DIM, "batch_size": b,
              "layout_q": LAYOUT_CODES[layout_q], "layout_kv": LAYOUT_CODES[layout_kv],
              "has_cmp_kv": int(cmp is not None), "cmp_ratio": ratio if cmp is not None else 0,
              "cmp_topk": idx.shape[1] if idx is not None else 0, "crc_seqused_kv": crc(seqused_kv)}
    if layout_q == "TND":
        expect["crc_cu_seqlens_q"] = crc(cu_seqlens_q)
    expect.update(plan_extra or {})
    v.plan.check(metadata, expect, (int(q_lens.max()), int(kv_lens.max())))
    return SharedKvArgs(q=q.reshape(t, n1, HEAD_DIM), out_shape=q.shape, token_batch=token_batch,
                        token_pos=token_pos, ori_rows=ori_rows, ori_slots=ori_slots, ori_base=ori_base,
                        cmp_rows=cmp_rows, cmp_slots=cmp_slots, cmp_indices=idx, sinks=sk, softmax_scale=scale,
                        cmp_ratio=ratio if cmp is not None else 1, sink_init=v.sink_init)


def plan_words(var: Variant, num_heads_q, num_heads_kv, head_dim, cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv,
               seqused_q, seqused_kv, batch_size, max_seqlen_q, max_seqlen_kv, ori_topk, cmp_topk, cmp_ratio,
               ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, layout_q, layout_kv, has_ori_kv, has_cmp_kv,
               device) -> list[int]:
    """The shared checks of both ``_metadata`` ops (``var``'s values) and the plan's words up to
    ``crc_seqused_kv`` (:data:`PLAN_FIELDS` without the checksum); the caller appends its own
    fields and encodes them with ``var.plan``. Raises as :func:`npu_sparse_attn_sharedkv_metadata`."""
    _only(num_heads_q, "num_heads_q", var.heads_q, f"README: {_heads_text(var)}")
    _only(num_heads_kv, "num_heads_kv", (NUM_HEADS_KV,), "README: only 1")
    _only(head_dim, "head_dim", (HEAD_DIM,), "the latent width the attention takes")
    layout_q = _layouts(layout_q, layout_kv)
    _window(ori_win_left, ori_win_right, ori_mask_mode, cmp_mask_mode)
    _only(ori_topk, "ori_topk", (0,), "README: sparse ori_kv is not supported")
    if not isinstance(has_ori_kv, (bool, np.bool_)) or not has_ori_kv:
        raise arg_error(ModeError, "has_ori_kv", "True (every scenario attends the window of ori_kv)",
                        describe(has_ori_kv))
    if not isinstance(has_cmp_kv, (bool, np.bool_)):
        raise arg_error(ModeError, "has_cmp_kv", "a bool", describe(has_cmp_kv))
    if not isinstance(device, str):
        raise arg_error(ModeError, "device", "a str", describe(device))
    if has_cmp_kv:
        ratio = _only(cmp_ratio, "cmp_ratio", (CSA_RATIO, HCA_RATIO), "README: 4 or 128 with a compressed cache")
        if var.ratio_by_indices:
            want_topk = CMP_TOPK if ratio == CSA_RATIO else 0
            _only(cmp_topk, "cmp_topk", (want_topk,), f"{want_topk} for cmp_ratio {ratio}")
        else:
            _only(cmp_topk, "cmp_topk", (0, *var.topks), "0 without cmp_sparse_indices, else their K2 (README)")
    else:
        _only(cmp_ratio, "cmp_ratio", IGNORED_CMP_RATIOS, "without a compressed cache it is ignored")
        _only(cmp_topk, "cmp_topk", (0,), "no compressed cache")
        ratio = 0
    _ignored_lengths({"cu_seqlens_ori_kv": cu_seqlens_ori_kv, "cu_seqlens_cmp_kv": cu_seqlens_cmp_kv,
                      "seqused_q": seqused_q})
    kv = seq_lengths(required(seqused_kv, "seqused_kv"), "seqused_kv")
    b = kv.size
    _only(batch_size, "batch_size", (b,), "the length of seqused_kv")
    if (kv < 0).any():
        i = int(np.argmax(kv < 0))
        raise arg_error(ShapeError, f"seqused_kv[{i}]", "a kv token count >= 0", int(kv[i]))
    cu = None
    if layout_q == "TND" or cu_seqlens_q is not None:
        cu = required(cu_seqlens_q, "cu_seqlens_q")
        v = seq_lengths(cu, "cu_seqlens_q", b + 1)
        q_lens = _cu_seqlens_q(cu, int(v[-1]))
        if int(q_lens.max(initial=0)) > _int(max_seqlen_q, "max_seqlen_q"):
            raise arg_error(ModeError, "max_seqlen_q", f">= the longest query run {int(q_lens.max())}", max_seqlen_q)
    if _int(max_seqlen_q, "max_seqlen_q") < 1:
        raise arg_error(ModeError, "max_seqlen_q", "an int >= 1", max_seqlen_q)
    if int(kv.max()) > _int(max_seqlen_kv, "max_seqlen_kv") or max_seqlen_kv > MAX_SEQ:
        raise arg_error(ModeError, "max_seqlen_kv", f"an int in [max(seqused_kv)={int(kv.max())}, {MAX_SEQ}]",
                        max_seqlen_kv)
    words = [var.plan.magic, var.plan.version, num_heads_q, num_heads_kv, head_dim, b, LAYOUT_CODES[layout_q],
             LAYOUT_CODES[layout_kv], 1, int(bool(has_cmp_kv)), ratio, int(cmp_topk), ori_win_left,
             ori_win_right, ori_mask_mode, cmp_mask_mode, int(max_seqlen_q), int(max_seqlen_kv),
             crc(cu), crc(seqused_kv)]
    return words


def npu_sparse_attn_sharedkv(q, ori_kv=None, cmp_kv=None, ori_sparse_indices=None, cmp_sparse_indices=None,
                             ori_block_table=None, cmp_block_table=None, cu_seqlens_q=None, cu_seqlens_ori_kv=None,
                             cu_seqlens_cmp_kv=None, seqused_q=None, seqused_kv=None, sinks=None, metadata=None,
                             softmax_scale: float = 0.0, cmp_ratio: int = 0, ori_mask_mode: int = ORI_MASK_MODE,
                             cmp_mask_mode: int = CMP_MASK_MODE, ori_win_left: int = ORI_WIN_LEFT,
                             ori_win_right: int = ORI_WIN_RIGHT, layout_q: str = "BSND", layout_kv: str = LAYOUT_KV,
                             return_softmax_lse: bool = False):
    """``npu_sparse_attn_sharedkv``: window + compressed (+ sink) attention with K as V (module doc).

    Args:
        q: bf16 / fp16 ``[T, 64, 512]`` (TND) or ``[B, S, 64, 512]`` (BSND).
        ori_kv: ``[blocks, bs, 1, 512]`` of q's dtype (required). cmp_kv: the same geometry rule,
            or None (SWA only).
        ori_sparse_indices: int32 ``[T, 1, K1]`` / ``[B, S, 1, K1]`` or None; no effect (README).
        cmp_sparse_indices: int32 ``[T, 1, 512]`` / ``[B, S, 1, 512]`` compressed positions, -1
            skips (CSA only).
        ori_block_table, cmp_block_table: int32 ``[B, >= ceil(S / bs)]`` (S2 = seqused_kv, S3 =
            seqused_kv // cmp_ratio).
        cu_seqlens_q: int32 ``[B + 1]`` prefix sums from 0 to T, non-decreasing (TND, required;
            BSND: optional, checked as the prefix sums of ``B * S`` tokens).
        cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q: int32 1-D or None; no effect (README).
        seqused_kv: int32 ``[B]``, each >= the request's query count (required).
        sinks: fp32 ``[64]``, finite, or None.
        metadata: the plan of :func:`npu_sparse_attn_sharedkv_metadata` for this call (required).
        softmax_scale: > 0. cmp_ratio: 4 (CSA) / 128 (HCA) with cmp_kv; 0 or 1 without.
        ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right: 4, 3, 127, 0 only.
        layout_q: ``'TND'`` / ``'BSND'``; layout_kv: ``'PA_ND'``.
        return_softmax_lse: False only (README: not supported).

    Returns:
        ``(out, softmax_lse)``: out of q's shape and dtype; softmax_lse fp32 ``[0]``.

    Raises:
        ModeError, ShapeError, DTypeError, IndexRangeError: as the module doc lists, naming the
        argument; nothing is written (the outputs are new arrays). ModeError on an emulated Ascend
        950 (the README's A2 / A3 only; :func:`ascend_emu.ops.npu_kv_quant_sparse_attn_sharedkv`).

    Source: vllm-ascend ``csrc/attention/sparse_attn_sharedkv/README.md`` (docs/sources.md).
    """
    if is_ascend950():
        raise ModeError(f"npu_sparse_attn_sharedkv: not supported on the Ascend 950 (README: Atlas A2 / A3 only; "
                        f"the emulated SoC is {soc_name()}): its 950 form is npu_kv_quant_sparse_attn_sharedkv over "
                        f"640-byte FP8 rows")
    args = prepare(A2A3, q, ori_kv, cmp_kv, ori_sparse_indices, cmp_sparse_indices, ori_block_table, cmp_block_table,
                   cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_kv, sinks, metadata,
                   softmax_scale, cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, layout_q,
                   layout_kv, return_softmax_lse)
    out = get_backend().sparse_attn_sharedkv(args).out
    return out.reshape(args.out_shape), _EMPTY_LSE.copy()
