"""``torch_npu.npu_sparse_flash_attention`` and ``npu_kv_quant_sparse_flash_attention`` on NumPy
arrays: one contract for both.

Sources: the op page (docs/sources.md#npu_kv_quant_sparse_flash_attention); op-plugin's
``docs/zh/custom_APIs/torch_npu/torch_npu-npu_sparse_flash_attention.md``; docs/sources.md#npu_kv_quant_sparse_flash_attention, docs/sources.md#npu_sparse_flash_attention
(inputs, math, test vectors, the non-quant sibling); torch_npu 2.14's meta functions
``npu_sparse_flash_attention_forward`` / ``npu_kv_quant_sparse_flash_attention_forward``
(signatures, output shapes and dtypes); the official goldens (op-plugin
``test_npu_sparse_flash_attention.py`` / ``test_npu_kv_quant_sparse_flash_attention.py``).

What the ops compute, per query token ``t`` (batch ``b``, position ``s`` in its batch) and kv
head ``h`` (the ``G = N1 / N2`` query heads ``h*G .. h*G+G-1`` share it):

1. Selection: entry ``i`` of ``sparse_indices[t, h]`` selects kv tokens
   ``[i*sbs, min((i+1)*sbs, act_kv))`` of batch ``b``; the first -1 ends the row. With
   ``sparse_mode=3`` tokens at or past ``limit = act_kv - act_q + s + 1`` are dropped
   (right-down causal); ``sparse_mode=0`` keeps all. Selected tokens keep the entries' order.
2. Keys ``K = [k_nope 512 | k_rope 64]`` and values ``V`` in the query dtype (``qdt``):
   non-quant: ``key`` / ``key_rope`` / ``value`` as stored. KV-quant (656-byte rows,
   :data:`ascend_emu.quant.MLA_ROW`): ``k_nope = qdt(fp32(elem) * scale[tile])`` (exact widening
   of the int8 / HiF8 / FP8 E4M3 element, one fp32 multiply, RNE to qdt), ``k_rope`` = bytes
   512..639 read as qdt, ``V = k_nope``.
3. ``S = (q . K) * scale_value`` in fp32 (an fp32 matmul: exact fp32 inputs, fp32 accumulation in
   BLAS order, then one fp32 multiply); ``m = max S``; ``e = fp32(exp(S - m))``; ``l = sum e``
   (selection order); ``P = qdt(e / l)``; ``O = P @ V`` (fp32 matmul as ``S``); output ``qdt(O)``.
   softmax_max = ``m``, softmax_sum = ``l``. With ``sinks`` (KV-quant op, Ascend 950): query head
   ``n``'s sink ``z`` (fp32, not multiplied by scale_value) joins the max and the sum as one more
   logit without a value row: ``m = max(max S, z)``, ``l = fp32(exp(z - m)) + sum e`` (the sink
   term first, then the rows in selection order), as op-plugin's golden
   ``TestKvQuantSparseFlashAttention.softmax`` computes it.

The Ascend 950 (``ASCEND_EMU_SOC_NAME`` starting with ``Ascend950``, :mod:`ascend_emu.soc`), for
npu_kv_quant_sparse_flash_attention (op-plugin ``torch_npu-npu_kv_quant_sparse_flash_attention.md``,
"约束说明"): keys of HiF8 codes (uint8 with ``key_dtype = value_dtype = 290``) or FP8 E4M3 (an
ml_dtypes / torch ``float8_e4m3fn`` key, ``key_dtype`` None: op-plugin's adapter accepts no other
code, ``KvQuantSparseFlashAttentionKernelNpuOpApi.cpp``) as well as int8, all in the same 656-byte
rows (:data:`ascend_emu.quant.combined.MLA_ROWS`); N1 may be 48 (:data:`QUERY_HEADS_950`);
``sparse_block_size`` only 1; with HiF8 keys K (sparse_size) only 2048; ``sinks`` fp32 ``[N1]``.
On Atlas A2 / A3 each of these is rejected naming the SoC. The dequant chain is the A2 / A3 one:
the arch35 kernel widens the element to fp32, multiplies by the tile's fp32 scale and casts to the
query dtype with CAST_RINT (vllm-ascend ``csrc/attention/kv_quant_sparse_flash_attention/op_kernel/
arch35/kv_quant_sparse_flash_attention_service_vector_mla.h:342-359``, ``AntiquantVFImplFp8D448``).

Choices where the sources leave room (each in one named constant below):

- :data:`EMPTY_ROW_OUTPUT` / :data:`EMPTY_ROW_SOFTMAX_MAX` / :data:`EMPTY_ROW_SOFTMAX_SUM`: a
  (token, head) with no valid kv token (causal limit <= 0, a row starting with -1, a batch with
  act_kv = 0, or a BSND query position at or past ``act_q``) gets output 0 (the kernel sets the
  length to 0, docs/sources.md#npu_kv_quant_sparse_flash_attention; the goldens leave rows past ``act_q`` at 0), softmax_max =
  the lowest fp32 (the initial max Ascend's attention kernels use, NEGATIVE_MIN_VALUE_FP32) and
  softmax_sum = 0. Unverified on hardware.
- Every rounding to the query dtype (dequantized k_nope, P,
  output) is RNE, as the goldens' ``.to(query_type)``. docs/sources.md#npu_kv_quant_sparse_flash_attention reads the A2/A3 fp16
  dequant cast as CAST_ROUND (ties away); the two differ only on exact ties.
- ``exp`` is evaluated in float64 and rounded once to fp32 (the
  correctly rounded fp32 exp in practice); the NPU's vector exp is not documented.
- npu_sparse_flash_attention reads V from ``value`` (same slots as the
  key); ``value=None`` (CANN >= 9.2) reads V from ``key``. The doc says key and value share one
  tensor in attention_mode 2; the official golden passes ``key.clone()``.
- npu_kv_quant_sparse_flash_attention reads V from the k_nope bytes
  of ``key``'s 656-byte rows (attention_mode 2, MLA absorb). ``value`` must be an int8 tensor of
  key's shape (key itself, or a copy) or of key's leading dims and a last dim of 512 (the doc's example and
  op-plugin's ``test_sfa_eager`` pass ``key.clone()`` taken before the rope and scale bytes are
  appended); its values are not read.
- :data:`MIN_SPARSE_K`: ``sparse_indices`` with K = 0 is rejected: the current doc
  (ops-transformer ``attention/sparse_flash_attention/README.md``: "sparse_size大于0") requires
  sparse_size > 0. op-plugin's older ``test_sfa_saprse_size_zero`` golden computed a zero output
  for it; torch_npu's meta function rejects an empty tensor.
- ``sinks``: npu_sparse_flash_attention: None only (:func:`check_sinks`). npu_kv_quant_sparse_flash_attention
  (``Tensor? sinks=None`` in op-plugin master's schema; torch_npu 2.14's has none, see
  :mod:`ascend_emu.torch_npu.schemas`): fp32 ``[N1]`` on the Ascend 950, without NaN or +Inf
  (stricter than the doc, which says nothing of values); None on Atlas A2 / A3 (the doc: "不支持sinks").
  Where the sink sits in the fp32 sum is the golden's order (step 3); the kernel's is not public.
- Sparse-index rows: entries before the first -1 must be block ids in
  ``[0, ceil(act_kv / sbs))``; after the first -1 every entry must be -1 (the doc: "valid values
  first, invalid values last"); other negative values are errors. Rows of query tokens the op
  does not compute (BSND positions at or past ``act_q``) are not read and not checked. A block
  id listed twice counts twice (as in the goldens).
- :data:`SFA_MAX_SPARSE_BLOCK_SIZE` = 128 (the npu_sparse_flash_attention doc: a power of 2 in
  [1, 128]); :data:`KVQ_MAX_SPARSE_BLOCK_SIZE` = 16 (the seed: [1, 16]). For PA_BSND it must
  divide block_size.
- ``return_softmax_lse=True`` with ``layout_kv="PA_BSND"`` is rejected (doc: the lse outputs
  are supported only when layout_kv is not PA_BSND).
- Dtypes as the docs: ``sparse_indices``, ``block_table`` and ``actual_seq_lengths_*`` int32.
  TND prefix sums must end at the tensor's T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..layouts import CacheLayout, cache_mode_traits
from ..mla import D_QK, D_ROPE, HCKV, NKV, TILE_SIZE
from ..quant import MLA_ROW
from ..quant.fp8 import TORCH_NPU_DTYPE_CODES
from ..soc import is_ascend950, require_ascend950
from .. import checked_mode, input_contracts
from ._backend import get_backend
from ._sparse_rows import _bsnd_tokens, _raise_bad_index, sparse_rows
from .lightning_indexer import SPARSE_COUNTS_LARGE
from ._check import (QUERY_LAYOUT_RANKS, ValidatedSignatures, batched_query, check_dtype, check_float, dtype_name,
                     known_per_batch_lengths, per_batch_lengths, prefix_lengths, required, trusted)

LayoutQuery = Literal["BSND", "TND"]
LayoutKv = Literal["BSND", "TND", "PA_BSND"]

#: Query / key layouts the docs list.
QUERY_LAYOUTS = ("BSND", "TND")
KV_LAYOUTS = ("BSND", "TND", "PA_BSND")
#: Query dtypes (the key / rope / value dtype of the non-quant op too).
QUERY_DTYPES = ("bfloat16", "float16")
#: N1 values the docs allow (N2 = 1).
QUERY_HEADS = (1, 2, 4, 8, 16, 32, 64, 128)
#: N1 values of npu_kv_quant_sparse_flash_attention on the Ascend 950 (the doc: also 48).
QUERY_HEADS_950 = (1, 2, 4, 8, 16, 32, 48, 64, 128)
#: npu_kv_quant_sparse_flash_attention on the Ascend 950: the only sparse_block_size, and the only
#: sparse_size (K) with HiF8 keys (the doc's 950 constraints).
KVQ_950_SPARSE_BLOCK_SIZE = 1
KVQ_HIF8_SPARSE_K = 2048
#: torch_npu's code of ``hifloat8``: the only key_dtype / value_dtype (op-plugin's adapter).
HIFLOAT8_CODE = TORCH_NPU_DTYPE_CODES["hifloat8"]
#: sparse_mode values: 0 (all selected tokens), 3 (right-down causal).
SPARSE_MODES = (0, 3)
#: Largest sparse_block_size (a power of 2) per op.
SFA_MAX_SPARSE_BLOCK_SIZE = 128
KVQ_MAX_SPARSE_BLOCK_SIZE = 16
#: PA_BSND block_size: a multiple of 16, at most 1024 (docs).
BLOCK_SIZE_ALIGN = 16
MAX_BLOCK_SIZE = 1024
#: The only pre_tokens / next_tokens value the docs accept.
DEFAULT_TOKENS = (1 << 63) - 1
#: attention_mode 2: MLA absorb (the only mode either doc supports).
ATTENTION_MODE = 2
#: KV-quant fixed modes (seed): per-tile key / value quant, combined scale storage.
KEY_QUANT_MODE = 2
VALUE_QUANT_MODE = 2
QUANT_SCALE_REPO_MODE = 1
#: Output of a (token, head) with no valid kv token, and its softmax_max / softmax_sum.
EMPTY_ROW_OUTPUT = 0.0
EMPTY_ROW_SOFTMAX_MAX = float(np.finfo(np.float32).min)
EMPTY_ROW_SOFTMAX_SUM = 0.0
#: Smallest K of sparse_indices (the current doc: sparse_size > 0).
MIN_SPARSE_K = 1
#: Largest K of sparse_indices: the largest ``sparse_count`` npu_lightning_indexer produces (its doc:
#: 1-2048 or 3072 ... 8192), the indices these ops consume. Checked before the per-entry arrays
#: (``[T, N2, K]``, 12 bytes an entry) are allocated.
MAX_SPARSE_K = max(SPARSE_COUNTS_LARGE)


@dataclass(frozen=True, kw_only=True)
class SparseFlashAttentionArgs:
    """Normalised, validated arguments of both sparse attention ops: the caller's arrays as passed
    and the kv rows each (token, head) reads. The emu backend makes its kernel operands (bits
    views, the concatenated query) of them.

    Rows of the key cache are addressed as ``row = slot * N2 + h`` of the cache viewed as 2-D
    (``slot``: PA_BSND ``block * block_size + r``; BSND ``b * S2 + p``; TND ``t``). Every
    ``starts`` entry with a positive count addresses ``counts`` consecutive, in-range rows (a
    sparse block never crosses a PA block: sbs divides block_size).

    Attributes:
        quant: KV-quant op (656-byte rows) or not.
        query: ``[B, S1, N1, D]`` / ``[T, N1, D]`` bf16 / fp16 (D = 576 quant, else 512).
        query_rope: non-quant: ``[.., N1, 64]`` like query; quant: None.
        key: the cache: 656-byte rows (quant; int8, HiF8 codes as uint8, or float8_e4m3fn) or
            query-dtype ``[.., N2, 512]``.
        key_rope: non-quant: ``[.., N2, 64]`` like key; quant: None.
        value: the caller's value (quant: key itself, a copy, or its ``[.., 512]`` k_nope, not
            read; non-quant: key's shape, or None).
        v_from_key: V is the key's k_nope (quant, value None, or value is key itself).
        sparse_indices: the caller's int32 ``[B, S1, N2, K]`` / ``[T, N2, K]``.
        block_table: the caller's int32 table (PA_BSND) or None.
        actual_seq_lengths_query, actual_seq_lengths_kv: the caller's int32 tensors or None.
        starts: int64 ``[T, N2, K]`` first key row of each entry's kept tokens (0 where the
            count is 0).
        counts: int32 ``[T, N2, K]`` kept tokens per entry, in ``[0, sbs]``.
        lengths: int64 ``[T, N2]`` kept tokens per (token, head) = ``counts.sum(-1)``.
        scale_value: the score scale (a finite float; the kernels use it as fp32).
        sparse_block_size: sbs.
        layout_query: ``BSND`` or ``TND``.
        layout_kv: ``BSND``, ``TND`` or ``PA_BSND``.
        sparse_mode: 0 or 3.
        out_shape: output shape (``[B, S1, N1, 512]`` / ``[T, N1, 512]``).
        batch, seq_q: B and S1 (TND: S1 = T).
        num_heads, num_kv_heads: N1 and N2.
        return_softmax_lse: the op returns softmax_max / softmax_sum (non-quant op only).
        nope_element: quant: the k_nope element type (``int8``, ``hifloat8``, ``float8_e4m3fn``;
            :data:`ascend_emu.quant.combined.NOPE_ELEMENTS`); non-quant: ``int8`` (unused).
        sinks: fp32 ``[N1]`` attention sinks (KV-quant op on the Ascend 950), or None.
    """

    quant: bool
    query: np.ndarray
    query_rope: np.ndarray | None
    key: np.ndarray
    key_rope: np.ndarray | None
    value: np.ndarray | None
    v_from_key: bool
    sparse_indices: np.ndarray
    block_table: np.ndarray | None
    actual_seq_lengths_query: np.ndarray | None
    actual_seq_lengths_kv: np.ndarray | None
    starts: np.ndarray
    counts: np.ndarray
    lengths: np.ndarray
    scale_value: float
    sparse_block_size: int
    layout_query: str
    layout_kv: str
    sparse_mode: int
    out_shape: tuple[int, ...]
    batch: int
    seq_q: int
    num_heads: int
    num_kv_heads: int
    return_softmax_lse: bool
    nope_element: str = "int8"
    sinks: np.ndarray | None = None

    @property
    def group(self) -> int:
        """G = N1 / N2 query heads per kv head."""
        return self.num_heads // self.num_kv_heads

    @property
    def num_key_slots(self) -> int:
        """Slots of the key cache (every dim but N2 and the row)."""
        return math.prod(self.key.shape[:-2])

    @property
    def query_dtype(self) -> np.dtype:
        """bf16 or fp16."""
        return self.query.dtype

    def cache_reads(self) -> checked_mode.CacheReads:
        """The cache rows the kernel reads (checked mode's read hook): one per (query token, kv
        head, sparse index entry, kept kv token), from :attr:`starts` / :attr:`counts`, in
        ``key`` (and ``key_rope`` / a separate ``value``), each described by its
        :class:`~ascend_emu.layouts.CacheLayout` in ``layout_kv``."""
        n2, sbs = self.num_kv_heads, int(self.sparse_block_size)
        t_idx, h_idx, j_idx = np.nonzero(self.counts > 0)
        counts = self.counts[t_idx, h_idx, j_idx].astype(np.int64)
        rep = np.repeat(np.arange(t_idx.size), counts)  # one entry per (entry, kept kv token)
        within = np.arange(rep.size) - np.repeat(np.cumsum(counts) - counts, counts)
        slots = (self.starts[t_idx, h_idx, j_idx][rep] + within) // n2

        def where(i: int) -> str:
            e = int(rep[i])
            t, h, j = int(t_idx[e]), int(h_idx[e]), int(j_idx[e])
            if batched_query(self.layout_query):
                q_at, idx_at = f"batch {t // self.seq_q}, query token {t % self.seq_q}", (t // self.seq_q, t % self.seq_q)
            else:
                q_at, idx_at = f"query token {t} (TND)", (t,)
            si = int(np.asarray(self.sparse_indices)[idx_at + (h, j)])
            return (f"{q_at}, kv head {h}, sparse_indices[{', '.join(map(str, idx_at + (h, j)))}] = {si} -> kv token "
                    f"{si * sbs + int(within[i])}")

        named = (("key", self.key),) if self.quant else (("key", self.key), ("key_rope", self.key_rope),
                                                         ("value", None if self.v_from_key else self.value))
        caches = tuple((name, c, CacheLayout.from_declared(self.layout_kv, c.shape, c.dtype.itemsize, name=name))
                       for name, c in named if c is not None)
        return checked_mode.CacheReads(caches, slots.astype(np.int64), where)


class SparseFlashAttentionOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`), torch_npu's order (the KV-quant op
    returns only ``attention_out``).

    Attributes:
        attention_out: ``args.out_shape``, the query dtype.
        softmax_max, softmax_sum: fp32 ``[B, N2, S1, G]`` (BSND) / ``[N2, T, G]`` (TND) with
            ``args.return_softmax_lse``, else fp32 ``[0]``.
    """

    attention_out: np.ndarray
    softmax_max: np.ndarray
    softmax_sum: np.ndarray


def npu_sparse_flash_attention(query, key, value, sparse_indices, scale_value, *, block_table=None,
                               actual_seq_lengths_query=None, actual_seq_lengths_kv=None, query_rope=None,
                               key_rope=None, sparse_block_size: int = 1, layout_query: LayoutQuery = "BSND",
                               layout_kv: LayoutKv = "BSND", sparse_mode: int = 3, pre_tokens: int = DEFAULT_TOKENS,
                               next_tokens: int = DEFAULT_TOKENS, attention_mode: int = 0,
                               return_softmax_lse: bool = False, sinks=None):
    """Sparse flash attention over a bf16 / fp16 (paged) cache, MLA absorb (docs/sources.md#npu_sparse_flash_attention).

    Args:
        query: ``[B, S1, N1, 512]`` (BSND) or ``[T, N1, 512]`` (TND), bf16 / fp16; N1 in
            1, 2, 4, ..., 128.
        key: query's dtype; ``[B, S2, 1, 512]`` (BSND), ``[T2, 1, 512]`` (TND) or
            ``[block_num, block_size, 1, 512]`` (PA_BSND; block_size a multiple of 16, <= 1024).
        value: key's shape and dtype (V is read from it), or None (V from key).
        sparse_indices: int32 ``[B, S1, 1, K]`` / ``[T, 1, K]``, K in ``[MIN_SPARSE_K,
            MAX_SPARSE_K]`` (1-8192; the current doc: sparse_size > 0): sparse block ids of each query token, valid ids first, then -1.
        scale_value: score scale (e.g. ``576 ** -0.5``), a finite float.
        block_table: int32 ``[B, >= ceil(max act_kv / block_size)]``; PA_BSND only (required).
        actual_seq_lengths_query: int32 ``[B]``: BSND: per-batch query lengths in [0, S1]
            (None: S1); TND: prefix sums (required; B is its length, at most
            ``_check.MAX_BATCH`` = 65536; last = T).
        actual_seq_lengths_kv: int32 ``[B]``: BSND / PA_BSND: per-batch kv lengths (None: S2
            for BSND; required for PA_BSND); TND: prefix sums (required; last = T2).
        query_rope: ``[.., N1, 64]`` like query, query's dtype (required).
        key_rope: ``[.., 1, 64]`` like key, query's dtype (required).
        sparse_block_size: tokens per sparse block: a power of 2 in [1, 128]; divides
            block_size for PA_BSND. Default 1.
        layout_query: ``BSND`` (default) or ``TND``.
        layout_kv: ``BSND`` (default), ``TND`` or ``PA_BSND``; unless PA_BSND it must equal
            layout_query.
        sparse_mode: 3 (default, right-down causal) or 0 (no mask).
        pre_tokens, next_tokens: only the default 2**63 - 1.
        attention_mode: must be 2 (MLA absorb; the default 0 is not supported, as on hardware).
        return_softmax_lse: also return softmax_max / softmax_sum (not with PA_BSND).
        sinks: must be None (Atlas A2 / A3 do not support sinks; :func:`check_sinks`).

    Returns:
        ``(attention_out, softmax_max, softmax_sum)``: attention_out in the query dtype,
        ``[B, S1, N1, 512]`` / ``[T, N1, 512]``; softmax_max / softmax_sum fp32
        ``[B, N2, S1, N1/N2]`` / ``[N2, T, N1/N2]`` with ``return_softmax_lse``, else fp32 ``[0]``.

    Numerics: the module docstring (steps 1-3); rows with no valid kv token:
    :data:`EMPTY_ROW_OUTPUT`, :data:`EMPTY_ROW_SOFTMAX_MAX`, :data:`EMPTY_ROW_SOFTMAX_SUM`.

    Raises:
        ShapeError: a shape, a length outside its tensor, a layout mismatch, a block_size.
        DTypeError: a dtype, a non-finite scale_value, a non-integer mode.
        ModeError: unknown layout, sparse_mode, attention_mode, pre/next_tokens, sinks,
            return_softmax_lse with PA_BSND, a bad sparse_block_size.
        IndexRangeError: a sparse index past its batch's kv length or after a -1, a negative
            index other than -1, a block_table entry outside the cache.
    """
    args = _normalise(False, query, key, value, sparse_indices, scale_value, block_table, actual_seq_lengths_query,
                      actual_seq_lengths_kv, query_rope, key_rope, sparse_block_size, layout_query, layout_kv,
                      sparse_mode, pre_tokens, next_tokens, attention_mode, return_softmax_lse, sinks=sinks)
    op = "npu_sparse_flash_attention"
    checked_mode.read(op, args.cache_reads)
    if cache_mode_traits(layout_kv).paged:
        input_contracts.paged_read(op, block_table, args.actual_seq_lengths_kv, int(key.shape[1]))
    result = get_backend().sparse_flash_attention(args)
    checked_mode.check_finite(op, zip(result._fields, result, strict=True))
    return tuple(result)


def npu_kv_quant_sparse_flash_attention(query, key, value, sparse_indices, scale_value, key_quant_mode: int,
                                        value_quant_mode: int, *, key_dequant_scale=None, value_dequant_scale=None,
                                        block_table=None, actual_seq_lengths_query=None, actual_seq_lengths_kv=None,
                                        sparse_block_size: int = 1, layout_query: LayoutQuery = "BSND",
                                        layout_kv: LayoutKv = "BSND", sparse_mode: int = 3,
                                        pre_tokens: int = DEFAULT_TOKENS, next_tokens: int = DEFAULT_TOKENS,
                                        attention_mode: int = 0, quant_scale_repo_mode: int = 1,
                                        tile_size: int = TILE_SIZE, rope_head_dim: int = D_ROPE, key_dtype=None,
                                        value_dtype=None, sinks=None):
    """Sparse flash attention over a per-tile cache of 656-byte rows (op page;
    docs/sources.md#npu_kv_quant_sparse_flash_attention; op-plugin's current doc for the Ascend 950 modes): the rows ``npu_mla_prolog_v3``
    writes with ``kv_cache_quant_mode=3``.

    Args:
        query: ``[B, S1, N1, 576]`` (BSND) or ``[T, N1, 576]`` (TND) = ``[q_nope 512 | q_rope 64]``,
            bf16 / fp16; N1 in 1, 2, 4, ..., 128 (Ascend 950: also 48).
        key: combined rows ``[B, S2, 1, 656]`` (BSND), ``[T2, 1, 656]`` (TND) or
            ``[block_num, block_size, 1, 656]`` (PA_BSND): ``[512 x elem | 64 x qdt rope |
            4 fp32 scales]``; elem int8 (int8 key), or on the Ascend 950 HiF8 (uint8 key with
            ``key_dtype=290``) or FP8 E4M3 (ml_dtypes ``float8_e4m3fn`` key).
        value: key's dtype, key's shape (key itself or a copy), or ``[.., 512]`` with key's leading
            dims (not read: V is key's k_nope).
        sparse_indices, scale_value, block_table, actual_seq_lengths_query,
        actual_seq_lengths_kv, layout_query, layout_kv, sparse_mode, pre_tokens, next_tokens:
            as :func:`npu_sparse_flash_attention`.
        key_quant_mode, value_quant_mode: must be 2 (per-tile).
        key_dequant_scale, value_dequant_scale: reserved, must be None.
        sparse_block_size: a power of 2 in [1, 16]; divides block_size for PA_BSND (Ascend 950:
            only 1).
        attention_mode: must be 2 (MLA absorb).
        quant_scale_repo_mode: must be 1 (scales inside the rows).
        tile_size: must be 128. rope_head_dim: must be 64.
        key_dtype, value_dtype: None, or both 290 (``torch_npu.hifloat8``: the key holds HiF8
            codes; Ascend 950 only; K must then be 2048).
        sinks: None, or on the Ascend 950 fp32 ``[N1]``: one logit per query head added to the
            softmax (module docstring, step 3).

    Returns:
        attention_out in the query dtype, ``[B, S1, N1, 512]`` / ``[T, N1, 512]``.

    Numerics: the module docstring (steps 1-3).

    Raises:
        As :func:`npu_sparse_flash_attention`; ModeError also for a fixed mode with another value,
        a reserved argument given, a value that is not the key tensor itself, a key_dtype other
        than None / 290, and an Ascend 950 mode (HiF8 / FP8 key, N1 = 48, sinks) on another SoC
        (:func:`ascend_emu.soc.require_ascend950`: names the argument and the SoC).
    """
    fixed = (("key_quant_mode", key_quant_mode, KEY_QUANT_MODE, "per-tile quant"),
             ("value_quant_mode", value_quant_mode, VALUE_QUANT_MODE, "per-tile quant"),
             ("quant_scale_repo_mode", quant_scale_repo_mode, QUANT_SCALE_REPO_MODE, "scales stored in the rows"),
             ("tile_size", tile_size, TILE_SIZE, "the only tile size"),
             ("rope_head_dim", rope_head_dim, D_ROPE, "the only rope width"))
    for name, got, want, why in fixed:
        if (type(got) is not int or got != want) and _int(got, name) != want:  # plain ints: no _int call
            raise arg_error(ModeError, name, f"{want} ({why}; the only value the doc allows)", got)
    for name, got in (("key_dequant_scale", key_dequant_scale), ("value_dequant_scale", value_dequant_scale)):
        if got is not None:
            raise arg_error(ModeError, name, "None (reserved; only the default is supported)",
                            "a value" if isinstance(got, np.ndarray) else repr(got))
    element = kv_element(key, key_dtype, value_dtype)
    args = _normalise(True, query, key, value, sparse_indices, scale_value, block_table, actual_seq_lengths_query,
                      actual_seq_lengths_kv, None, None, sparse_block_size, layout_query, layout_kv, sparse_mode,
                      pre_tokens, next_tokens, attention_mode, False, sinks=sinks, element=element)
    op = "npu_kv_quant_sparse_flash_attention"
    checked_mode.read(op, args.cache_reads)
    if cache_mode_traits(layout_kv).paged:
        input_contracts.paged_read(op, block_table, args.actual_seq_lengths_kv, int(key.shape[1]))
    out = get_backend().sparse_flash_attention(args).attention_out
    checked_mode.check_finite(op, (("attention_out", out),))
    return out


# ---------------------------------------------------------------------- validation
def kv_element(key, key_dtype, value_dtype) -> str:
    """The k_nope element type of npu_kv_quant_sparse_flash_attention's key rows, from
    ``key_dtype`` / ``value_dtype`` and the key's dtype (op-plugin
    ``KvQuantSparseFlashAttentionKernelNpuOpApi.cpp``: key_dtype is only for hifloat8; otherwise
    the type is the key tensor's): ``"hifloat8"`` for ``key_dtype=290``, ``"float8_e4m3fn"`` for
    an ml_dtypes float8_e4m3fn key, else ``"int8"`` (the dtype check of the contract then
    rejects a key that is not int8). Checked here, before anything else reads the key: the
    Ascend 950 modes on another SoC.

    Raises:
        DTypeError: key_dtype / value_dtype not an int or None.
        ModeError: key_dtype other than None / 290, value_dtype other than key_dtype, or a HiF8 /
            FP8 key on a SoC that is not an Ascend 950 (:func:`~ascend_emu.soc.require_ascend950`).
    """
    for name, got in (("key_dtype", key_dtype), ("value_dtype", value_dtype)):
        if got is not None and _int(got, name) != HIFLOAT8_CODE:
            raise arg_error(ModeError, name, f"None or {HIFLOAT8_CODE} (hifloat8): {name} is only used to "
                            "support hifloat8, and is left at its default for an int8 / float8_e4m3fn key", got)
    if (key_dtype is None) != (value_dtype is None):
        raise arg_error(ModeError, "value_dtype", f"key_dtype's value ({key_dtype!r}): key and value share one "
                        "dtype", value_dtype)
    if key_dtype is not None:
        require_ascend950("key_dtype", int(key_dtype), "hifloat8")
        return "hifloat8"
    if dtype_name(getattr(key, "dtype", np.int8)) == "float8_e4m3fn":
        require_ascend950("key", "float8_e4m3fn", "FP8 E4M3 656-byte rows")
        return "float8_e4m3fn"
    return "int8"


def check_sinks(sinks) -> None:
    """``sinks`` of npu_sparse_flash_attention: only None (the docs: Atlas A2 / A3 do not support
    attention sinks; the Ascend 950's are emulated for npu_kv_quant_sparse_flash_attention only,
    :func:`_check_kv_sinks`).

    Raises:
        ModeError: ``sinks`` is not None (names ``sinks``).
    """
    if sinks is not None:
        raise arg_error(ModeError, "sinks", "None (attention sinks are an Ascend 950 feature; the docs: Atlas "
                        "A2 / A3 do not support sinks)", "a tensor" if hasattr(sinks, "shape") else repr(sinks))


def _int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise arg_error(DTypeError, name, "an int", repr(value))
    return int(value)


def _tensor(x, name: str, dtypes, shape, what: str) -> np.ndarray:
    x = required(x, name)
    check_dtype(x, name, dtypes)
    ok = x.ndim == len(shape) and all(e is None or e == s for e, s in zip(shape, x.shape, strict=True))
    if not ok:
        shown = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise arg_error(ShapeError, name, f"shape {shown} {what}", list(x.shape))
    return x


def _check_kv_sinks(sinks, n1: int, soc950: bool) -> None:
    """``sinks`` of npu_kv_quant_sparse_flash_attention: None, or on the Ascend 950 an fp32
    ``[N1]`` array (op-plugin doc: "数据类型支持float32，shape为[Q_N]").

    Raises:
        ModeError: a tensor on another SoC (names the SoC). DTypeError / ShapeError: not fp32
        ``[N1]``.
    """
    if sinks is None:
        return
    if not soc950:
        require_ascend950("sinks", describe(sinks), "attention sinks")
    sinks = required(sinks, "sinks")
    check_dtype(sinks, "sinks", ("float32",))
    if sinks.shape != (n1,):
        raise arg_error(ShapeError, "sinks", f"[N1] = [{n1}] (one fp32 logit per query head)", list(sinks.shape))


def _check_static(quant, query, key, value, sparse_indices, scale_value, block_table, actual_seq_lengths_query,
                  actual_seq_lengths_kv, query_rope, key_rope, sparse_block_size, layout_query, layout_kv, sparse_mode,
                  pre_tokens, next_tokens, attention_mode, return_softmax_lse, sinks, element, soc950) -> _Static:
    """Every check that reads only types, shapes, dtypes, modes and scalars, in the contract's
    order (lengths, block_table and sparse index values: :func:`_normalise`). ``element``: the
    k_nope element type (:func:`kv_element`); ``soc950``: the emulated SoC is an Ascend 950.

    Raises:
        As :func:`npu_sparse_flash_attention` (ShapeError, DTypeError, ModeError).
    """
    op = "npu_kv_quant_sparse_flash_attention" if quant else "npu_sparse_flash_attention"
    # ---- modes
    if layout_query not in QUERY_LAYOUTS:
        raise arg_error(ModeError, "layout_query", f"one of {list(QUERY_LAYOUTS)}", repr(layout_query))
    if layout_kv not in KV_LAYOUTS:
        raise arg_error(ModeError, "layout_kv", f"one of {list(KV_LAYOUTS)}", repr(layout_kv))
    kv = cache_mode_traits(layout_kv, allowed=KV_LAYOUTS, name="layout_kv")
    if not kv.paged and layout_kv != layout_query:
        raise arg_error(ModeError, "layout_kv", f"layout_query={layout_query!r} (without PageAttention the two "
                        "layouts must match)", repr(layout_kv))
    if _int(sparse_mode, "sparse_mode") not in SPARSE_MODES:
        raise arg_error(ModeError, "sparse_mode", "0 (no mask) or 3 (right-down causal)", sparse_mode)
    for name, got in (("pre_tokens", pre_tokens), ("next_tokens", next_tokens)):
        if _int(got, name) != DEFAULT_TOKENS:
            raise arg_error(ModeError, name, f"the default 2**63-1 = {DEFAULT_TOKENS} (the only supported value)", got)
    if _int(attention_mode, "attention_mode") != ATTENTION_MODE:
        raise arg_error(ModeError, "attention_mode", f"{ATTENTION_MODE} (MLA absorb, the only mode {op} supports)",
                        attention_mode)
    if not quant:
        check_sinks(sinks)
    if not isinstance(return_softmax_lse, (bool, np.bool_)):
        raise arg_error(DTypeError, "return_softmax_lse", "a bool", type(return_softmax_lse).__name__)
    if return_softmax_lse and kv.paged:
        raise arg_error(ModeError, "return_softmax_lse", "False with layout_kv='PA_BSND' (the doc supports "
                        "softmax_max / softmax_sum only without PageAttention)", True)
    sbs = _int(sparse_block_size, "sparse_block_size")
    max_sbs = KVQ_MAX_SPARSE_BLOCK_SIZE if quant else SFA_MAX_SPARSE_BLOCK_SIZE
    if quant and soc950 and sbs != KVQ_950_SPARSE_BLOCK_SIZE:
        raise arg_error(ModeError, "sparse_block_size", f"{KVQ_950_SPARSE_BLOCK_SIZE} (the only value on the "
                        "Ascend 950)", sbs)
    if not (1 <= sbs <= max_sbs and sbs & (sbs - 1) == 0):
        raise arg_error(ModeError, "sparse_block_size", f"a power of 2 in [1, {max_sbs}]", sbs)
    scale = check_float(scale_value, "scale_value")

    # ---- query
    d_q = D_QK if quant else HCKV
    q_nd = QUERY_LAYOUT_RANKS[layout_query]
    query = required(query, "query")
    check_dtype(query, "query", QUERY_DTYPES)
    lead_q = "[B, S1, N1, " if q_nd == 4 else "[T, N1, "
    if query.ndim != q_nd or query.shape[-1] != d_q:
        raise arg_error(ShapeError, "query", f"{lead_q}{d_q}] for layout_query={layout_query}", list(query.shape))
    n1 = query.shape[-2]
    heads = QUERY_HEADS_950 if quant and soc950 else QUERY_HEADS
    if n1 not in heads:
        more = " (48: Ascend 950 only)" if quant and n1 in QUERY_HEADS_950 else ""
        raise arg_error(ShapeError, "query", f"N1 in {list(heads)}{more}", f"N1={n1} (shape {list(query.shape)})")
    if query.size == 0:
        raise arg_error(ShapeError, "query", "a non-empty tensor", list(query.shape))
    qdt = dtype_name(query.dtype)
    lead = query.shape[:-2]  # [B, S1] or [T]
    if not quant:
        query_rope = _tensor(query_rope, "query_rope", (qdt,), [*lead, n1, D_ROPE],
                             f"(query's leading dims, {D_ROPE} rope values, dtype of query)")

    # ---- key / value
    d_k = MLA_ROW.row_bytes if quant else HCKV
    key = required(key, "key")
    if quant and element == "hifloat8" and dtype_name(key.dtype) != "uint8":
        raise arg_error(DTypeError, "key", "uint8 HiF8 codes with key_dtype=290", dtype_name(key.dtype))
    if quant and element == "int8" and dtype_name(key.dtype) != "int8":
        allowed = "int8, or on the Ascend 950 float8_e4m3fn or uint8 HiF8 codes with key_dtype=290"
        raise arg_error(DTypeError, "key", f"dtype {allowed}", dtype_name(key.dtype))
    if not quant:
        check_dtype(key, "key", (qdt,))
    k_nd = kv.declared_rank
    shown = {"per_batch": "[B, S2, N2, ", "packed": "[T2, N2, ", "blocks": "[block_num, block_size, N2, "}[kv.sequences]
    if key.ndim != k_nd or key.shape[-1] != d_k or key.size == 0:
        raise arg_error(ShapeError, "key", f"a non-empty {shown}{d_k}] for layout_kv={layout_kv}", list(key.shape))
    n2 = key.shape[-2]
    if n2 != NKV:
        raise arg_error(ShapeError, "key", f"N2 = {NKV} (the only kv head count the doc supports)",
                        f"N2={n2} (shape {list(key.shape)})")
    if quant:
        nope_shape = (*key.shape[:-1], HCKV)
        if not (isinstance(value, np.ndarray) and value.dtype == key.dtype
                and value.shape in (tuple(key.shape), nope_shape)):
            got = "None" if value is None else describe(value)
            raise arg_error(ModeError, "value", f"key itself (or a copy), or an {dtype_name(key.dtype)} "
                            f"{list(nope_shape)} k_nope tensor (attention_mode 2: V is the dequantized k_nope of "
                            "key's 656-byte rows)", got)
        _check_kv_sinks(sinks, int(n1), soc950)
    else:
        key_rope = _tensor(key_rope, "key_rope", (qdt,), [*key.shape[:-1], D_ROPE],
                           f"(key's leading dims, {D_ROPE} rope values, dtype of query)")
        if value is not None:
            value = _tensor(value, "value", (qdt,), list(key.shape), "(the shape of key, dtype of query)")

    # ---- lengths (static part), block_table presence, sparse_indices shape
    if not batched_query(layout_query) and actual_seq_lengths_query is None:
        raise arg_error(ShapeError, "actual_seq_lengths_query", "int32 prefix sums [B] (required for TND)", None)
    if kv.sequences == "packed" and actual_seq_lengths_kv is None:
        raise arg_error(ShapeError, "actual_seq_lengths_kv", "int32 prefix sums [B] (required for TND)", None)
    kv_layout = CacheLayout.from_declared(layout_kv, key.shape, key.dtype.itemsize, name="key")
    if kv.paged:
        block_size = kv_layout.block_size
        if block_size % BLOCK_SIZE_ALIGN or block_size > MAX_BLOCK_SIZE:
            raise arg_error(ShapeError, "key", f"block_size a multiple of {BLOCK_SIZE_ALIGN} in "
                            f"[{BLOCK_SIZE_ALIGN}, {MAX_BLOCK_SIZE}] (dim 1 of a PA_BSND cache)", block_size)
        if block_size % sbs:
            raise arg_error(ModeError, "sparse_block_size", f"a divisor of block_size={block_size}", sbs)
        if block_table is None:
            raise arg_error(ShapeError, "block_table", "an int32 [B, max_blocks] table (required for PA_BSND)", None)
        if actual_seq_lengths_kv is None:
            raise arg_error(ShapeError, "actual_seq_lengths_kv", "int32 per-batch lengths [B] (required for PA_BSND)",
                            None)
        check_dtype(required(block_table, "block_table"), "block_table", ("int32",))
    elif block_table is not None:
        raise arg_error(ModeError, "block_table", f"None for layout_kv={layout_kv} (PA_BSND only)", "a tensor")
    sparse_indices = required(sparse_indices, "sparse_indices")
    check_dtype(sparse_indices, "sparse_indices", ("int32",))
    want = [*lead, n2, None]
    if sparse_indices.ndim != len(want) or tuple(sparse_indices.shape[:-1]) != tuple(want[:-1]) \
            or not MIN_SPARSE_K <= sparse_indices.shape[-1] <= MAX_SPARSE_K:
        shown = "[B, S1, N2, K]" if q_nd == 4 else "[T, N2, K]"
        raise arg_error(ShapeError, "sparse_indices", f"{shown} = [{', '.join(map(str, want[:-1]))}, K] with "
                        f"{MIN_SPARSE_K} <= K <= {MAX_SPARSE_K} (the doc: sparse_size > 0; the largest "
                        "sparse_count of npu_lightning_indexer)",
                        list(sparse_indices.shape))
    if quant and element == "hifloat8" and sparse_indices.shape[-1] != KVQ_HIF8_SPARSE_K:
        raise arg_error(ShapeError, "sparse_indices", f"K = {KVQ_HIF8_SPARSE_K} (the only sparse_size with "
                        "hifloat8 keys)", list(sparse_indices.shape))
    return _Static(sbs=sbs, scale=scale, n1=int(n1), n2=int(n2), lead=tuple(int(x) for x in lead), q_nd=q_nd,
                   kv_layout=kv_layout)


@dataclass(frozen=True)
class _Static:
    """What :func:`_check_static` derives from a call signature."""

    sbs: int
    scale: float
    n1: int
    n2: int
    lead: tuple[int, ...]
    q_nd: int
    kv_layout: CacheLayout  #: the key cache's (and key_rope / value's geometry: same leading dims)


#: Signatures whose static checks passed (:func:`ascend_emu.ops._check.signature`).
_VALIDATED = ValidatedSignatures()


def _normalise(quant, query, key, value, sparse_indices, scale_value, block_table, actual_seq_lengths_query,
               actual_seq_lengths_kv, query_rope, key_rope, sparse_block_size, layout_query, layout_kv, sparse_mode,
               pre_tokens, next_tokens, attention_mode, return_softmax_lse, *, sinks,
               element: str = "int8") -> SparseFlashAttentionArgs:
    """Validate every argument of either op and build :class:`SparseFlashAttentionArgs`.

    The checks :func:`_check_static` makes run once per call signature
    (:func:`~ascend_emu.ops._check.signature`; a decode loop repeats one); the lengths, the
    block_table entries a batch reads and the sparse index values are checked on every call, in
    that order, after them.
    """
    given = (quant, query, key, value, sparse_indices, scale_value, block_table, actual_seq_lengths_query,
             actual_seq_lengths_kv, query_rope, key_rope, sparse_block_size, layout_query, layout_kv, sparse_mode,
             pre_tokens, next_tokens, attention_mode, return_softmax_lse, sinks, element, is_ascend950())
    sig, st, known = _VALIDATED.lookup(given, _check_static)  # known: the lengths' dtypes and shapes passed too
    lengths_of = known_per_batch_lengths if known else per_batch_lengths
    if not known:  # a known signature: plain arrays of native dtypes, as required() leaves them
        query, key, sparse_indices = required(query, "query"), required(key, "key"), required(sparse_indices,
                                                                                             "sparse_indices")
        if not quant:
            query_rope, key_rope = required(query_rope, "query_rope"), required(key_rope, "key_rope")
        if not quant and value is not None:
            value = required(value, "value")
    v_from_key = True
    if not quant and value is not None:
        v_from_key = value is key or (value.__array_interface__["data"][0] == key.__array_interface__["data"][0]
                                      and value.strides == key.strides)  # the key itself
    n2, sbs, lead = st.n2, st.sbs, st.lead
    if sinks is not None:  # KV-quant on the Ascend 950: fp32 [N1] (static checks above)
        sinks = required(sinks, "sinks")
        if np.isnan(sinks).any() or np.isposinf(sinks).any():
            bad = int(np.flatnonzero(np.isnan(sinks) | np.isposinf(sinks))[0])
            raise arg_error(DTypeError, "sinks", "fp32 logits without NaN or +inf",
                            f"sinks[{bad}] = {float(sinks[bad])}")

    # ---- batch, lengths
    if batched_query(layout_query):
        b, s1 = lead
        act_q = (np.full(b, s1, np.int64) if actual_seq_lengths_query is None
                 else lengths_of(actual_seq_lengths_query, "actual_seq_lengths_query", b, s1))
        tok_b, tok_s = _bsnd_tokens(b, s1)  # [T], [T]
    else:
        act_q = prefix_lengths(actual_seq_lengths_query, "actual_seq_lengths_query", lead[0])
        b, s1 = int(act_q.size), lead[0]
        tok_b = np.repeat(np.arange(b), act_q)  # [T]
        tok_s = np.arange(lead[0]) - np.repeat(np.cumsum(act_q) - act_q, act_q)  # [T]
    kv_layout = st.kv_layout
    if kv_layout.sequences == "per_batch":  # [B, S2, N2, D]: block b is batch b
        if kv_layout.num_blocks != b:
            raise arg_error(ShapeError, "key", f"B={b} batches like query", list(key.shape))
        s2 = kv_layout.block_size
        act_kv = (np.full(b, s2, np.int64) if actual_seq_lengths_kv is None
                  else lengths_of(actual_seq_lengths_kv, "actual_seq_lengths_kv", b, s2))
    elif kv_layout.sequences == "packed":  # [T2, N2, D]
        act_kv = prefix_lengths(actual_seq_lengths_kv, "actual_seq_lengths_kv", kv_layout.block_size)
        if act_kv.size != b:
            raise arg_error(ShapeError, "actual_seq_lengths_kv", f"[B={b}] like actual_seq_lengths_query",
                            list(act_kv.shape))
    else:
        act_kv = lengths_of(actual_seq_lengths_kv, "actual_seq_lengths_kv", b, None)
    slot_map = kv_layout.sequence_slots(act_kv, block_table, name="block_table")  # [B, max act_kv]

    # ---- sparse_indices -> (starts, counts), every read entry checked
    t_total = tok_b.size
    k = int(sparse_indices.shape[-1])
    idx = np.ascontiguousarray(sparse_indices).reshape(t_total, n2, k)  # [T, N2, K] int32
    starts = np.empty((t_total, n2, k), np.int64)  # [T, N2, K]
    counts = np.empty((t_total, n2, k), np.int32)  # [T, N2, K]
    lengths = np.empty((t_total, n2), np.int64)  # [T, N2]
    status = np.zeros(5, np.int64)  # bad entries, first bad (t, h, j), first -1 of its row
    sparse_rows(idx, tok_b, tok_s, act_q, act_kv, np.ascontiguousarray(slot_map, dtype=np.int64), sbs,
                int(sparse_mode), starts, counts, lengths, status)
    if status[0]:
        _raise_bad_index(idx, status, tok_b, tok_s, act_kv, sbs, st.q_nd)
    if not known:
        _VALIDATED.put(sig, st)
    return trusted(  # every field checked above: no per-field __setattr__ of the frozen __init__
        SparseFlashAttentionArgs, quant=bool(quant), query=query, query_rope=None if quant else query_rope, key=key,
        key_rope=None if quant else key_rope, value=value, v_from_key=v_from_key, sparse_indices=sparse_indices,
        block_table=block_table, actual_seq_lengths_query=actual_seq_lengths_query,
        actual_seq_lengths_kv=actual_seq_lengths_kv, starts=starts, counts=counts, lengths=lengths,
        scale_value=st.scale, sparse_block_size=sbs, layout_query=layout_query, layout_kv=layout_kv,
        sparse_mode=int(sparse_mode), out_shape=(*lead, st.n1, HCKV), batch=b, seq_q=s1, num_heads=st.n1,
        num_kv_heads=n2, return_softmax_lse=bool(return_softmax_lse), nope_element=element, sinks=sinks)
