"""``torch_npu.npu_fused_infer_attention_score`` (FIA) and ``npu_fused_infer_attention_score_v2`` on
NumPy arrays, the MLA subset: one contract for both names and their ``.out`` forms.

Sources: torch_npu 2.14's schemas (``npu_native_functions_by_codegen.yaml`` lines 349-370: v1,
v1 ``.out``, ``_npu_fused_infer_attention_score_get_max_workspace``, v2, v2 ``.out``, the v2
workspace query) and meta functions (``op_plugin/meta/_meta_registrations.py``:
``get_query_and_attention_out_layout``, ``get_value_d``, ``infer_attention_out_shape``,
``infer_lse_out_shape``, ``npu_fused_infer_attention_score_forward`` / ``_v2_forward``); the
callers: vllm-ascend ``vllm_ascend/attention/mla_v1.py`` (absorbed decode: q_nope
``[B, N, 1, 512]`` BNSD or ``[T, N, 512]`` TND, ``query_rope`` 64-d, the ckv cache passed as key
*and* value, the kr cache as ``key_rope``, ``num_key_value_heads = 1``, ``block_table`` /
``block_size``, ``actual_seq_lengths_kv`` a per-request list, ``sparse_mode`` 3 with the 2048 x
2048 causal ``atten_mask`` for MTP / spec decode, ``input_layout`` BNSD / TND / BSND_NBSD /
TND_NTD); the A2 / A3 kernel ops-transformer
``attention/incre_flash_attention/op_kernel/incre_flash_attention_preload_mla.h`` (numerics).

What the op computes, per query row (token ``t`` of request ``b``, query head ``n``; kv head
``h = n // G``, ``G = N / KV_N``) over the request's kv tokens ``j < limit``:

1. ``limit = act_kv`` (sparse_mode 0) or ``min(act_kv, act_kv - act_q + s + 1)`` (sparse_mode 3:
   causal, bottom-right aligned; ``s`` the token's position in its request); tokens at or past
   ``act_q`` (BSND / BNSD padding rows) and rows with ``limit <= 0`` are empty.
2. ``S = fp32(fp32(q . k + q_rope . k_rope) * scale)`` (fp32 matmul of the exact inputs);
   ``m = max S``; ``e = fp32(exp(S - m))``; ``l = sum e`` (fp32, kv order).
3. ``P = qdt(e)``: the *unnormalised* exp rounded to the query dtype (the kernel's
   ``ProcessVec1`` casts the SoftmaxFlashV2 exp result to KV_T, ``incre_flash_attention_preload_mla.h``
   line 2520, before the second matmul); ``O = P @ V`` in fp32; ``O = fp32(O / l)`` (the kernel
   divides the fp32 bmm2 result by the softmax sum after the last kv block, ``DealBmm2ResBaseBlock``
   lines 2952-2962); output ``qdt(O)``, rounded once. op-plugin's CPU golden normalises before
   rounding P instead; the kernel source is followed here.
4. ``softmax_lse = fp32(m + fp32(ln l))`` (``[B, N, S1, 1]``, or ``[T, N, 1]`` for TND layouts)
   with ``softmax_lse_flag`` / ``return_softmax_lse``; fp32 ``[0]`` otherwise.

The v2 C8 decode (int8 query, ``query_quant_mode`` 3; vllm-ascend's ``fa_quant_layer`` on A2 / A3),
per row with ``qs`` its fp32 query scale, ``ks`` / ``vs`` the per-tensor key / value scales, read
from ops-transformer ``attention/incre_flash_attention/op_kernel/`` (``QUANT`` with
``QUANT_MM2_FP16``, ``MM1_RES_ADD``, ``MM1_DATO``, ``SOFTMAX_NEW``, ``IFA_SOFTMAX_WITHOUT_BRC``
defined, ``ifa_public_define.h`` lines 153, 837-840):

C1. ``raw = fp32(nope + q_rope . k_rope)``: the int8 nope dot accumulates in int32 onto the bias
    :data:`C8_DOT_BIAS_BITS`, read back as fp32, minus 2**21 * 5 (``ifa_service_matmul_full_quant.h``
    lines 758-895; exact for ``|q . k| < 2**21``, beyond it the bits wrap as on the cube); the bf16
    rope products are added in fp32 (BLAS order here, the cube's order is not public).
C2. ``S = fp32(raw * fp32(fp32(qs * ks) * scale))`` (``ProcessVec1L`` lines 3321-3323, ``RowMuls`` in
    ``DealBmm1ResBaseBlock`` line 2424). The rope is scaled too: callers pass q_rope pre-divided
    by ``qs * ks`` (``npu_mla_prolog_v2``'s ``MulQr``).
C3. kv in blocks of :data:`C8_KV_BLOCK` from position 0 with the online softmax (SoftmaxFlashV2):
    ``m`` the running max, ``e = fp32(exp(S - m))``, ``l = fp32(fp32(l * exp(m_old - m)) + sum e)``.
C4. ``maxP = fp32(exp(blockmax - m)) + FLOAT_EPS`` (lines 1946-1957), ``P = int8(fp16(e *
    fp32(127 / maxP)))``, both casts CAST_RINT (lines 2503-2518).
C5. ``pv = fp16(int32(P @ V) * 2**-10)`` (fixpipe ``DEQF16`` scale 0x3A800000,
    ``ifa_service_matmul_full_quant.h`` lines 1187-1189), ``pv = fp16(pv * fp16(maxP))``
    (``DealQuantBmm2ResBaseBlock`` lines 2765-2779).
C6. ``acc = pv`` on the first block, else ``fp16(fp16(acc * fp16(exp(m_old - m))) + pv)``
    (lines 2782-2809).
C7. ``out = bf16(fp32(fp32(fp32(acc) * 1024) / l) * fp32(vs * fp32(1 / 127)))`` (lines 2813-2835,
    bf16 CAST_RINT in ``Bmm2CastAndCopyOut``); lse as step 4.

Unverified on hardware: the block boundaries (the tiling halves the block for 256 < kv <= 512
with flash decode, and flash decode splits long rows across cores, combining them through the
lse: not reproduced), the fp32 sum order inside SoftmaxFlashV2, fp16 overflow of ``acc`` (kept:
inf, as fp16 arithmetic gives). Rows with no kv token: as above.

Choices where the sources leave room (each in one named constant below):

- :data:`EMPTY_ROW_OUTPUT` (0: the kernel's ``InitAllZeroOutput`` for a request with kv length 0,
  ``incre_flash_attention_preload_mla.h`` lines 638-676) and :data:`EMPTY_ROW_LSE` (+inf: the
  FlashAttention convention, ``exp(S - lse) = 0``; unverified on hardware) for empty rows.
- :data:`QUERY_DTYPE_ROUNDING`: P and the output are rounded RNE. The kernel casts P with
  CAST_ROUND (ties away from zero, line 2520) and an fp16 output with CAST_ROUND (bf16: CAST_RINT,
  lines 2389-2392); the two differ only on exact ties.
- The kernel processes kv in blocks of ``singleProcessSInnerSize`` (tiling) with the online
  softmax update (SoftmaxFlashV2, fp32 rescale of the running output) and may split kv across
  cores (flash decode, combined through the lse); the emulation takes one max over the whole row
  (the two agree when the row fits one block; otherwise they differ in the last bits).
- ``exp`` is evaluated in float64 and rounded once to fp32, as the sparse attention ops
  (:data:`ascend_emu.ops.sparse_flash_attention.EXP_EVALUATION`).
- Without query_rope / key_rope only vllm-ascend's prefill form with ``head_padding > 0`` (N not
  a power of 2): TND without block_table, query / key D = 192 (:data:`HEAD_DIM_NO_ROPE`, nope and
  rope concatenated by the caller), value / output D = 128, N up to 128 (``mla_v1.py``
  ``_forward_prefill`` / ``_compute_prefill_context``; the v2 doc's MHA constraint "Q_D, K_D 192
  with V_D 128"); other calls without rope name ``query_rope``.
- MLA otherwise: query_rope / key_rope (64-d) required; D = 512 with ``num_key_value_heads = 1``
  (absorbed decode, value = the ckv cache) or D = 128 with KV_N dividing N; value's D equals
  the query's. N in :data:`QUERY_HEADS`.
- Paged caches (``block_table`` given): ``[nb, bs, KV_N*D]``, ``[nb, KV_N, bs, D]`` and
  FRACTAL_NZ ``[nb, KV_N, D/C0, bs, C0]`` (C0 = 32 bytes / itemsize, the paged NZ tile rule of
  :mod:`ascend_emu.layouts.paged`); key, value and key_rope in one of them, ``block_size`` the
  cache's block dim, a multiple of 16 in [16, 512]. ``actual_seq_lengths_kv`` required: per
  request lengths (a list of ints or a 1-D int32 / int64 array); a length above
  ``block_table.shape[1] * block_size`` names the length argument; a block id the lengths need
  outside ``[0, nb)`` names ``block_table``. Without ``block_table``: TND only, key / value /
  key_rope ``[T2, KV_N, D]``, ``actual_seq_lengths_kv`` prefix sums ending at T2, ``block_size`` 0
  (sglang's prefill form).
- ``actual_seq_lengths`` (query): TND layouts: prefix sums (required; last = T); BSND / BNSD:
  None (every request S1 tokens) or per-request lengths in [0, S1].
- ``sparse_mode`` 3 takes ``atten_mask`` None or the callers' optimised 2048 x 2048 causal mask
  (bool / int8 / uint8, 1 above the diagonal), checked; sparse_mode 0 takes no mask.
  ``pre_tokens`` / ``next_tokens``: any int, not read: the kernel ignores them with sparse_mode 0
  without ``atten_mask`` and with sparse_mode 3 (set to INT_MAX / by the mode's rule; op-plugin
  docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score_v2.md lines 332-334, the
  v1 page's sparse_mode constraints lines 407-409), the only modes emulated. op-plugin's own tests
  pass 65535 / 65535.
- Rejected, naming the argument (not emulated): ``pse_shift``, every quant / antiquant / dequant
  tensor and mode outside v2's C8 decode, ``query_padding_size`` / ``kv_padding_size`` (left
  padding), the shared prefix, ``key_rope_antiquant_scale``, ``learnable_sink``, ``inner_precise``
  other than 0 and the v2 dtype tags.
- The ``.out`` forms write ``attention_out`` (and ``softmax_lse`` with the lse flag) after every
  check passed; ``workspace`` is not read. The workspace query returns uint8 ``[0]``: the
  emulation needs none (the real size comes from the device tiling).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import checked_mode, input_contracts
from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..layouts.paged import NZ_ROW_BYTES, slots_from_block_table
from ..mla import D_ROPE, HCKV, NKV
from ._backend import get_backend
from ._check import check_dtype, check_float, dtype_name, prefix_lengths, required

#: input_layout values of the MLA callers -> (query layout, attention_out layout) (the meta
#: function's ``get_query_and_attention_out_layout`` map, restricted).
LAYOUTS = {"BSND": ("BSND", "BSND"), "BNSD": ("BNSD", "BNSD"), "TND": ("TND", "TND"),
           "BSND_NBSD": ("BSND", "NBSD"), "BNSD_NBSD": ("BNSD", "NBSD"), "TND_NTD": ("TND", "NTD")}
#: Query dtypes (key / value / rope in the same dtype).
QUERY_DTYPES = ("bfloat16", "float16")
#: Query head counts of the MLA path (a power of 2 up to 128, as the sparse attention ops).
QUERY_HEADS = (1, 2, 4, 8, 16, 32, 64, 128)
#: Head dims: absorbed decode (value = ckv) and the non-absorbed prefill / chunked form.
HEAD_DIM_ABSORBED = HCKV
HEAD_DIM_PREFILL = 128
HEAD_DIMS = (HEAD_DIM_ABSORBED, HEAD_DIM_PREFILL)
#: The form without rope arguments: query / key D = 128 + 64 concatenated, value D = 128, TND
#: without block_table, any N (vllm-ascend ``_forward_prefill`` / ``_compute_prefill_context`` with
#: ``head_padding > 0``; the v2 doc's MHA row "Q_D and K_D 192 with V_D 128").
HEAD_DIM_NO_ROPE = HEAD_DIM_PREFILL + D_ROPE
VALUE_DIM_NO_ROPE = HEAD_DIM_PREFILL
MAX_QUERY_HEADS_NO_ROPE = 128
#: sparse_mode values: 0 (all tokens), 3 (causal, bottom-right aligned).
SPARSE_MODES = (0, 3)
#: The optimised causal mask the callers pass with sparse_mode 3: ``[2048, 2048]``, 1 above the diagonal.
CAUSAL_MASK_SIZE = 2048
MASK_DTYPES = ("bool", "int8", "uint8")
#: pre_tokens / next_tokens: the schemas' default (any int is taken; the emulated modes ignore them).
DEFAULT_TOKENS = 2147483647
#: block_size: a multiple of 16 in [16, 512].
BLOCK_SIZE_ALIGN = 16
MAX_BLOCK_SIZE = 512
#: Output of an empty row and its lse.
EMPTY_ROW_OUTPUT = 0.0
EMPTY_ROW_LSE = float("inf")
#: Rounding of P and of the output to the query dtype.
QUERY_DTYPE_ROUNDING = "half_even"
#: Which exp P rounds: the kernel's (unnormalised, divided by the sum after P @ V).
P_ROUNDING = "unnormalised"
#: Paged cache layouts: 3-D ``[nb, bs, KV_N*D]``, 4-D ``[nb, KV_N, bs, D]``, 5-D NZ ``[nb, KV_N, D/C0, bs, C0]``.
CACHE_LAYOUTS = {3: "PA_BSH", 4: "PA_BNSD", 5: "PA_NZ"}

#: v1 arguments not emulated: name -> the only value taken.
V1_REJECTED = {name: None for name in (
    "pse_shift", "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2",
    "antiquant_scale", "antiquant_offset", "key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale",
    "value_antiquant_offset", "query_padding_size", "kv_padding_size", "key_shared_prefix", "value_shared_prefix",
    "actual_shared_prefix_len", "key_rope_antiquant_scale")}
V1_REJECTED.update(antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0, inner_precise=0)
#: v2 arguments not emulated: name -> the only value taken.
V2_REJECTED = {name: None for name in (
    "pse_shift", "dequant_offset_key", "dequant_offset_value", "dequant_scale_key_rope", "quant_scale_out",
    "quant_offset_out", "quant_scale_p",
    "learnable_sink", "query_dtype", "key_dtype", "value_dtype", "query_rope_dtype", "key_rope_dtype",
    "key_shared_prefix_dtype", "value_shared_prefix_dtype", "dequant_scale_query_dtype", "dequant_scale_key_dtype",
    "dequant_scale_value_dtype", "dequant_scale_key_rope_dtype", "out_dtype")}
V2_REJECTED.update(key_quant_mode=0, value_quant_mode=0, inner_precise=0)

#: v2 C8 decode (full quant, A2 / A3): int8 query / key / value, ``query_quant_mode`` 3
#: (per-token-head ``dequant_scale_query``), ``key_quant_mode`` / ``value_quant_mode`` 0 (per-tensor
#: fp32 ``dequant_scale_key`` / ``dequant_scale_value``), bf16 rope, bf16 output (the v2 doc's MLA
#: constraints, D = 512).
QUERY_QUANT_MODE_C8 = 3
C8_DTYPE = "int8"
C8_ROPE_DTYPES = ("bfloat16",)
C8_SCALE_DTYPE = "float32"
#: C8 kv block of the kernel's online softmax (``CalcInnerSize``: ``sInnerSize_ = 512`` with rope,
#: ``incre_flash_attention_tiling.cpp`` line 2306): P is quantised per block against its max.
C8_KV_BLOCK = 512
#: The kernel's P quantisation range (``scaleP1`` = 127, ``scaleP2`` = 1 / 127) and the fp16
#: staging of P @ V (fixpipe ``DEQF16`` scale 2**-10, undone by ``Muls(.., 1024)``).
C8_P_RANGE = 127.0
C8_PV_STAGE_SCALE = 2.0 ** -10
#: ``FLOAT_EPS`` added to the block's P max (``ifa_public_define.h`` line 158), as fp32.
C8_FLOAT_EPS = 2.220446049250313e-16
#: The int32 -> fp32 reinterpretation of the nope dot (``ifa_service_matmul_full_quant.h`` lines
#: 758-895): the int8 matmul accumulates onto the bias 0x4B200000 (fp32 2**23 + 2**21), the cube
#: then adds -2**21 * 5 in fp32 before the rope products: exact for |q . k| < 2**21.
C8_DOT_BIAS_BITS = 0x4B200000
C8_DOT_BIAS = 10485760.0


@dataclass(frozen=True, kw_only=True)
class FusedInferAttentionArgs:
    """Normalised, validated arguments of both FIA names.

    Attributes:
        op: ``npu_fused_infer_attention_score`` or ``npu_fused_infer_attention_score_v2``.
        query, query_rope: the caller's arrays, ``[B, S1, N, D]`` / ``[B, N, S1, D]`` / ``[T, N, D]``
            (rope: D = 64).
        key, value, key_rope: the caller's caches (paged or non-paged TND: :attr:`cache_layout`).
        atten_mask: the caller's mask (sparse_mode 3) or None.
        block_table: the caller's int32 table, or None (non-paged TND).
        actual_seq_lengths, actual_seq_lengths_kv: as passed (lists or arrays, or None).
        num_heads, num_kv_heads: N and KV_N; scale: the score scale (finite).
        input_layout: as passed; query_layout (BSND / BNSD / TND) and out_layout (BSND, BNSD,
            TND, NBSD, NTD) derived from it.
        cache_layout: ``PA_BSH`` / ``PA_BNSD`` / ``PA_NZ``, or ``TND`` (non-paged); block_size: rows
            per block (0 for TND).
        sparse_mode: 0 or 3; softmax_lse_flag: return the lse.
        batch, seq_q: B and S1 (TND: the longest request).
        head_dim: D of query / key / value.
        act_q, act_kv: int64 ``[B]`` query / kv tokens per request.
        q_start: int64 ``[B]`` first token of each request in token-major order (``b * S1``,
            TND: the prefix sums' starts).
        slots: int64 ``[B, W]`` cache slot (``block * bs + row``; TND: token row) of kv position
            ``p`` of request ``b`` (-1 past its length; W = max act_kv).
        out_shape, lse_shape: output shapes (lse ``[0]`` without the flag).
        dequant_scale_query: C8 only: fp32 per-token-head scales as passed (``[B, S1, N]`` BSND,
            ``[B, N, S1]`` BNSD, ``[T, N]`` TND), else None; dequant_scale_key /
            dequant_scale_value: C8: the fp32 one-element per-tensor scales; query_quant_mode: 3
            under C8, else 0.
        value_dim: D of value and attention_out (= head_dim except the no-rope form's 128).
    """

    op: str
    query: np.ndarray
    query_rope: np.ndarray
    key: np.ndarray
    value: np.ndarray
    key_rope: np.ndarray
    atten_mask: np.ndarray | None
    block_table: np.ndarray | None
    actual_seq_lengths: object
    actual_seq_lengths_kv: object
    num_heads: int
    num_kv_heads: int
    scale: float
    input_layout: str
    query_layout: str
    out_layout: str
    cache_layout: str
    block_size: int
    sparse_mode: int
    softmax_lse_flag: bool
    batch: int
    seq_q: int
    head_dim: int
    act_q: np.ndarray
    act_kv: np.ndarray
    q_start: np.ndarray
    slots: np.ndarray
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...]
    dequant_scale_query: np.ndarray | None = None
    dequant_scale_key: np.ndarray | None = None
    dequant_scale_value: np.ndarray | None = None
    query_quant_mode: int = 0
    value_dim: int = 0

    @property
    def rope(self) -> bool:
        """query_rope / key_rope given (every form but the no-rope D = 192 prefill)."""
        return self.query_rope is not None

    @property
    def quantised(self) -> bool:
        """The v2 C8 decode (int8 query / caches with their dequant scales)."""
        return self.dequant_scale_query is not None

    @property
    def out_dtype(self) -> np.dtype:
        """attention_out's dtype: query_rope's (bf16 / fp16; bf16 under C8), query's without rope."""
        return self.query.dtype if self.query_rope is None else self.query_rope.dtype

    @property
    def group(self) -> int:
        """G = N / KV_N query heads per kv head."""
        return self.num_heads // self.num_kv_heads

    @property
    def query_dtype(self) -> np.dtype:
        """bf16 or fp16 (int8 under C8)."""
        return self.query.dtype


class FusedInferAttentionOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`), torch_npu's order.

    Attributes:
        attention_out: ``args.out_shape``, ``args.out_dtype`` (query_rope's dtype).
        softmax_lse: fp32 ``args.lse_shape`` (``[0]`` without the lse flag).
    """

    attention_out: np.ndarray
    softmax_lse: np.ndarray


# ---------------------------------------------------------------------- public ops
def npu_fused_infer_attention_score(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                                    actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None,
                                    dequant_scale2=None, quant_scale2=None, quant_offset2=None, antiquant_scale=None,
                                    antiquant_offset=None, key_antiquant_scale=None, key_antiquant_offset=None,
                                    value_antiquant_scale=None, value_antiquant_offset=None, block_table=None,
                                    query_padding_size=None, kv_padding_size=None, key_shared_prefix=None,
                                    value_shared_prefix=None, actual_shared_prefix_len=None, query_rope=None,
                                    key_rope=None, key_rope_antiquant_scale=None, num_heads: int = 1,
                                    scale: float = 1.0, pre_tokens: int = DEFAULT_TOKENS,
                                    next_tokens: int = DEFAULT_TOKENS, input_layout: str = "BSH",
                                    num_key_value_heads: int = 0, sparse_mode: int = 0, inner_precise: int = 0,
                                    block_size: int = 0, antiquant_mode: int = 0, key_antiquant_mode: int = 0,
                                    value_antiquant_mode: int = 0, softmax_lse_flag: bool = False,
                                    workspace=None, attention_out=None, softmax_lse=None):
    """Fused infer attention (MLA subset) over a paged cache; the schema of torch_npu 2.14 (the
    ``.out`` form: ``workspace``, ``attention_out``, ``softmax_lse``).

    Args:
        query: bf16 / fp16 ``[B, S1, N, D]`` (BSND), ``[B, N, S1, D]`` (BNSD) or ``[T, N, D]``
            (TND); D = 512 (absorbed, KV_N = 1) or 128; N in 1, 2, 4, ..., 128.
        key, value: paged caches of query's dtype, ``[nb, bs, KV_N*D]``, ``[nb, KV_N, bs, D]`` or
            NZ ``[nb, KV_N, D/16, bs, 16]``; one layout for key, value and key_rope (value may be
            key itself: the ckv cache of absorbed MLA). Without block_table (TND only):
            ``[T2, KV_N, D]``.
        atten_mask: sparse_mode 3: None or bool / int8 / uint8 ``[2048, 2048]``, 1 above the
            diagonal; sparse_mode 0: None.
        actual_seq_lengths: query tokens: TND prefix sums ``[B]`` (required, last = T); BSND /
            BNSD: None or per-request lengths in [0, S1]. A list of ints or a 1-D int32 / int64 array.
        actual_seq_lengths_kv: per-request kv lengths ``[B]`` (required), each at most
            ``block_table.shape[1] * block_size``; without block_table: prefix sums, last = T2.
        block_table: int32 ``[B, max_blocks]``, entries the lengths need in [0, nb); None: the
            non-paged TND form.
        query_rope: ``query``'s layout with D = 64, query's dtype (None, with key_rope, only in the
            TND no-rope form: query / key D = 192, value D = 128, no block_table).
        key_rope: key's cache layout with D = 64, query's dtype.
        num_heads: N (query's N). scale: score scale, finite.
        pre_tokens, next_tokens: ints, ignored (sparse_mode 0 without mask and 3 ignore them).
        input_layout: BSND, BNSD, TND, BSND_NBSD, BNSD_NBSD or TND_NTD.
        num_key_value_heads: KV_N (0: N); 1 for D = 512, a divisor of N for D = 128.
        sparse_mode: 0 or 3. block_size: the caches' bs, a multiple of 16 in [16, 512] (0 without
            block_table).
        softmax_lse_flag: also return the lse.
        workspace: ``.out`` form: not read. attention_out, softmax_lse: ``.out`` form: given
            together; attention_out of the output's shape and dtype, softmax_lse fp32 of the lse
            shape with the flag (not written without it).
        pse_shift, the (anti)quant / dequant tensors and modes, query_padding_size,
        kv_padding_size, the shared prefix, key_rope_antiquant_scale, inner_precise: only their
            defaults (:data:`V1_REJECTED`).

    Returns:
        ``(attention_out, softmax_lse)``: attention_out in query's dtype, ``[B, S1, N, D]``
        (BSND), ``[B, N, S1, D]`` (BNSD), ``[T, N, D]`` (TND), ``[N, B, S1, D]`` (``*_NBSD``),
        ``[N, T, D]`` (TND_NTD); softmax_lse fp32 ``[B, N, S1, 1]`` / ``[T, N, 1]`` with the flag,
        else ``[0]``. The ``.out`` form returns the out arrays themselves.

    Numerics: the module docstring, steps 1-4.

    Raises:
        ShapeError: a shape, a length outside its range, a layout mismatch, a block_size.
        DTypeError: a dtype, a non-finite scale, a non-integer mode.
        ModeError: an unsupported layout, mode, mask or argument (naming it).
        IndexRangeError: a block_table entry the lengths need outside the cache.
    """
    given = dict(pse_shift=pse_shift, dequant_scale1=dequant_scale1, quant_scale1=quant_scale1,
                 dequant_scale2=dequant_scale2, quant_scale2=quant_scale2, quant_offset2=quant_offset2,
                 antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                 key_antiquant_scale=key_antiquant_scale, key_antiquant_offset=key_antiquant_offset,
                 value_antiquant_scale=value_antiquant_scale, value_antiquant_offset=value_antiquant_offset,
                 query_padding_size=query_padding_size, kv_padding_size=kv_padding_size,
                 key_shared_prefix=key_shared_prefix, value_shared_prefix=value_shared_prefix,
                 actual_shared_prefix_len=actual_shared_prefix_len, key_rope_antiquant_scale=key_rope_antiquant_scale,
                 antiquant_mode=antiquant_mode, key_antiquant_mode=key_antiquant_mode,
                 value_antiquant_mode=value_antiquant_mode, inner_precise=inner_precise)
    _reject(given, V1_REJECTED, "npu_fused_infer_attention_score")
    args = _normalise("npu_fused_infer_attention_score", query, key, value, query_rope, key_rope, atten_mask,
                      actual_seq_lengths, "actual_seq_lengths", actual_seq_lengths_kv, "actual_seq_lengths_kv",
                      block_table, num_heads, "num_heads", num_key_value_heads, scale, "scale", pre_tokens,
                      next_tokens, input_layout, sparse_mode, block_size, softmax_lse_flag, "softmax_lse_flag")
    return _run(args, attention_out, softmax_lse)


def npu_fused_infer_attention_score_v2(query, key, value, *, query_rope=None, key_rope=None, pse_shift=None,
                                       atten_mask=None, actual_seq_qlen=None, actual_seq_kvlen=None, block_table=None,
                                       dequant_scale_query=None, dequant_scale_key=None, dequant_offset_key=None,
                                       dequant_scale_value=None, dequant_offset_value=None, dequant_scale_key_rope=None,
                                       quant_scale_out=None, quant_offset_out=None, quant_scale_p=None,
                                       learnable_sink=None, num_query_heads: int = 1, num_key_value_heads: int = 0,
                                       softmax_scale: float = 1.0, pre_tokens: int = DEFAULT_TOKENS,
                                       next_tokens: int = DEFAULT_TOKENS, input_layout: str = "BSH",
                                       sparse_mode: int = 0, block_size: int = 0, query_quant_mode: int = 0,
                                       key_quant_mode: int = 0, value_quant_mode: int = 0, inner_precise: int = 0,
                                       return_softmax_lse: bool = False, query_dtype=None, key_dtype=None,
                                       value_dtype=None, query_rope_dtype=None, key_rope_dtype=None,
                                       key_shared_prefix_dtype=None, value_shared_prefix_dtype=None,
                                       dequant_scale_query_dtype=None, dequant_scale_key_dtype=None,
                                       dequant_scale_value_dtype=None, dequant_scale_key_rope_dtype=None,
                                       out_dtype=None, workspace=None, attention_out=None, softmax_lse=None):
    """:func:`npu_fused_infer_attention_score` under the v2 names (torch_npu 2.14's v2 schema):
    ``actual_seq_qlen`` / ``actual_seq_kvlen`` for the lengths, ``num_query_heads`` for N,
    ``softmax_scale`` for the scale, ``return_softmax_lse`` for the lse flag; the same contract,
    numerics, outputs and errors (errors name the v2 arguments).

    C8 decode (vllm-ascend ``mla_v1.py`` ``_forward_decode`` with ``fa_quant_layer`` on A2 / A3):
    int8 ``query`` ``[.., N, 512]`` with ``query_quant_mode=3`` and fp32 ``dequant_scale_query`` of
    query's shape without D (``[B, S1, N]`` BSND, ``[B, N, S1]`` BNSD, ``[T, N]`` TND; the kernel
    reads it at the query offset / D, ``incre_flash_attention_preload_mla.h`` line 3301); int8
    paged ``key`` / ``value`` (NZ ``[nb, 1, 16, bs, 32]`` as vllm-ascend views the ckv cache, or
    the ND layouts) with fp32 one-element per-tensor ``dequant_scale_key`` / ``dequant_scale_value``
    (``key_quant_mode`` / ``value_quant_mode`` 0; vllm-ascend passes ``fak_descale_float``, fp32
    ``[1]``, for both); bf16 ``query_rope`` / ``key_rope``; bf16 output. Numerics: the module
    docstring's C8 chain. The v2 doc lists TND without full quant while vllm-ascend calls TND_NTD
    with it (spec decode) and the kernel indexes the scale for TND; TND is taken.

    The other v2-only arguments (offsets, quant_scale_out / p, ``learnable_sink``, the dtype tags,
    ``out_dtype``) take only their defaults (:data:`V2_REJECTED`).

    Raises:
        As :func:`npu_fused_infer_attention_score`; C8: ModeError naming ``query_quant_mode`` (an
        int8 query without mode 3, or mode 3 with a float query), DTypeError / ShapeError naming
        the scale or cache that does not fit.
    """
    given = dict(pse_shift=pse_shift, dequant_offset_key=dequant_offset_key,
                 dequant_offset_value=dequant_offset_value, dequant_scale_key_rope=dequant_scale_key_rope,
                 quant_scale_out=quant_scale_out, quant_offset_out=quant_offset_out, quant_scale_p=quant_scale_p,
                 learnable_sink=learnable_sink, query_dtype=query_dtype, key_dtype=key_dtype, value_dtype=value_dtype,
                 query_rope_dtype=query_rope_dtype, key_rope_dtype=key_rope_dtype,
                 key_shared_prefix_dtype=key_shared_prefix_dtype, value_shared_prefix_dtype=value_shared_prefix_dtype,
                 dequant_scale_query_dtype=dequant_scale_query_dtype, dequant_scale_key_dtype=dequant_scale_key_dtype,
                 dequant_scale_value_dtype=dequant_scale_value_dtype,
                 dequant_scale_key_rope_dtype=dequant_scale_key_rope_dtype, out_dtype=out_dtype,
                 key_quant_mode=key_quant_mode, value_quant_mode=value_quant_mode, inner_precise=inner_precise)
    _reject(given, V2_REJECTED, "npu_fused_infer_attention_score_v2")
    args = _normalise("npu_fused_infer_attention_score_v2", query, key, value, query_rope, key_rope, atten_mask,
                      actual_seq_qlen, "actual_seq_qlen", actual_seq_kvlen, "actual_seq_kvlen", block_table,
                      num_query_heads, "num_query_heads", num_key_value_heads, softmax_scale, "softmax_scale",
                      pre_tokens, next_tokens, input_layout, sparse_mode, block_size, return_softmax_lse,
                      "return_softmax_lse",
                      quant=(query_quant_mode, dequant_scale_query, dequant_scale_key, dequant_scale_value))
    return _run(args, attention_out, softmax_lse)


#: What the workspace queries return: the emulation needs no workspace.
WORKSPACE = np.zeros(0, dtype=np.uint8)


def _workspace_query(op):
    """The workspace query of ``op``: its signature (``functools.wraps``), the call validated as
    ``op`` validates it (same errors), then uint8 ``[0]``."""

    @functools.wraps(op)
    def query_workspace(query, key, value, **kwargs):
        op(query, key, value, **kwargs)
        return WORKSPACE.copy()

    query_workspace.__doc__ = (f"The workspace query of ``{op.__name__}``: the call validated as it validates it "
                               "(same arguments, same errors), then uint8 ``[0]`` (no workspace needed).")
    return query_workspace


#: ``torch_npu._npu_fused_infer_attention_score_get_max_workspace`` and the v2 one: the call
#: validated as :func:`npu_fused_infer_attention_score` / ``_v2``, then uint8 ``[0]`` (the
#: emulation needs no workspace; the ``.out`` forms do not read it).
_npu_fused_infer_attention_score_get_max_workspace = _workspace_query(npu_fused_infer_attention_score)
_npu_fused_infer_attention_score_v2_get_max_workspace = _workspace_query(npu_fused_infer_attention_score_v2)
_npu_fused_infer_attention_score_get_max_workspace.__name__ = "_npu_fused_infer_attention_score_get_max_workspace"
_npu_fused_infer_attention_score_v2_get_max_workspace.__name__ = "_npu_fused_infer_attention_score_v2_get_max_workspace"


# ---------------------------------------------------------------------- validation
def _reject(given: dict, allowed: dict, op: str) -> None:
    for name, value in given.items():
        want = allowed[name]
        if value is None and want is None:
            continue
        if want is not None and not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer)) \
                and int(value) == want:
            continue
        raise arg_error(ModeError, name, f"{want!r} ({op} in ascend_emu emulates the MLA subset without "
                        f"{name}; not emulated yet)", value if not hasattr(value, "shape") else describe(value))


def _int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise arg_error(DTypeError, name, "an int", repr(value))
    return int(value)


def _lengths(x, name: str) -> np.ndarray:
    """A SymInt[] length argument (list / tuple of ints, or a 1-D int32 / int64 array) as int64 ``[B]``."""
    if isinstance(x, np.ndarray):
        check_dtype(x, name, ("int32", "int64"))
        if x.ndim != 1 or x.size == 0:
            raise arg_error(ShapeError, name, "a non-empty 1-D array of lengths", list(x.shape))
        return x.astype(np.int64)
    if not isinstance(x, (list, tuple)) or not x:
        raise arg_error(DTypeError, name, "a non-empty list of ints or a 1-D int32 / int64 array", describe(x))
    for i, v in enumerate(x):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise arg_error(DTypeError, f"{name}[{i}]", "an int", repr(v))
    return np.array([int(v) for v in x], dtype=np.int64)


def _cache_dims(x: np.ndarray, name: str, layout_ndim: int | None, kv_n: int | None) -> tuple[str, int, int, int, int]:
    """``(layout, nb, KV_N, bs, D)`` of a paged cache (3-D ``[nb, bs, KV_N*D]`` needs ``kv_n``)."""
    if x.ndim not in CACHE_LAYOUTS or x.size == 0:
        raise arg_error(ShapeError, name, "a non-empty paged cache [nb, bs, KV_N*D], [nb, KV_N, bs, D] or FRACTAL_NZ "
                        "[nb, KV_N, D/C0, bs, C0]", list(x.shape))
    if layout_ndim is not None and x.ndim != layout_ndim:
        raise arg_error(ShapeError, name, f"key's cache layout {CACHE_LAYOUTS[layout_ndim]} ({layout_ndim}-D)",
                        list(x.shape))
    if x.ndim == 3:
        nb, bs, hd = x.shape
        if hd % kv_n:
            raise arg_error(ShapeError, name, f"last dim KV_N*D a multiple of KV_N={kv_n}", list(x.shape))
        return "PA_BSH", nb, kv_n, bs, hd // kv_n
    if x.ndim == 4:
        nb, n, bs, d = x.shape
        return "PA_BNSD", nb, n, bs, d
    nb, n, d1, bs, c0 = x.shape
    want_c0 = NZ_ROW_BYTES // x.dtype.itemsize
    if c0 != want_c0:
        raise arg_error(ShapeError, name, f"FRACTAL_NZ [nb, KV_N, D/C0, bs, C0] with C0 = {want_c0} (32 bytes of "
                        f"{x.dtype.name})", list(x.shape))
    return "PA_NZ", nb, n, bs, d1 * c0


def _normalise(op, query, key, value, query_rope, key_rope, atten_mask, act_q_in, act_q_name, act_kv_in,
               act_kv_name, block_table, num_heads, heads_name, num_key_value_heads, scale, scale_name, pre_tokens,
               next_tokens, input_layout, sparse_mode, block_size, lse_flag, lse_name,
               quant=None) -> FusedInferAttentionArgs:
    """Validate every argument of either name (nothing is read from a cache before all pass).
    ``quant``: v2's ``(query_quant_mode, dequant_scale_query, dequant_scale_key,
    dequant_scale_value)``, None for v1."""
    # ---- modes and scalars
    if input_layout not in LAYOUTS:
        raise arg_error(ModeError, "input_layout", f"one of {list(LAYOUTS)} (the MLA callers' layouts)",
                        repr(input_layout))
    q_layout, out_layout = LAYOUTS[input_layout]
    sm = _int(sparse_mode, "sparse_mode")
    if sm not in SPARSE_MODES:
        raise arg_error(ModeError, "sparse_mode", "0 (no mask) or 3 (causal, bottom-right aligned)", sparse_mode)
    for name, got in (("pre_tokens", pre_tokens), ("next_tokens", next_tokens)):
        _int(got, name)  # an int; its value is ignored by both emulated modes (module docstring)
    if not isinstance(lse_flag, (bool, np.bool_)):
        raise arg_error(DTypeError, lse_name, "a bool", type(lse_flag).__name__)
    scale_f = check_float(scale, scale_name)
    n = _int(num_heads, heads_name)
    kv_n = _int(num_key_value_heads, "num_key_value_heads")
    kv_n = n if kv_n == 0 else kv_n

    # ---- query, query_rope
    query = required(query, "query")
    c8 = _c8_mode(query, quant)
    check_dtype(query, "query", (C8_DTYPE,) if c8 else QUERY_DTYPES)
    q_nd = 3 if q_layout == "TND" else 4
    shown = {"BSND": "[B, S1, N, D]", "BNSD": "[B, N, S1, D]", "TND": "[T, N, D]"}[q_layout]
    if query.ndim != q_nd or query.size == 0:
        raise arg_error(ShapeError, "query", f"a non-empty {shown} for input_layout={input_layout}",
                        list(query.shape))
    q_n = query.shape[2] if q_layout == "BSND" else query.shape[1]
    d = int(query.shape[-1])
    if q_n != n:
        raise arg_error(ShapeError, heads_name, f"query's N = {q_n} ({shown})", n)
    no_rope = query_rope is None and key_rope is None and not c8
    if no_rope:
        if d != HEAD_DIM_NO_ROPE or q_layout != "TND" or block_table is not None:
            raise arg_error(ShapeError, "query_rope", f"a [.., {D_ROPE}] tensor (without rope arguments only the "
                            f"TND prefill form with query D = {HEAD_DIM_NO_ROPE} and no block_table is emulated)",
                            None)
        if not 1 <= n <= MAX_QUERY_HEADS_NO_ROPE:
            raise arg_error(ShapeError, heads_name, f"1 .. {MAX_QUERY_HEADS_NO_ROPE}", n)
    elif n not in QUERY_HEADS:
        raise arg_error(ShapeError, heads_name, f"one of {list(QUERY_HEADS)} (MLA)", n)
    elif d not in HEAD_DIMS:
        raise arg_error(ShapeError, "query", f"D in {list(HEAD_DIMS)} (absorbed MLA 512, prefill 128 + 64 rope)",
                        list(query.shape))
    if kv_n < 1 or n % kv_n or (d == HEAD_DIM_ABSORBED and kv_n != NKV):
        want = f"{NKV} (D = {HEAD_DIM_ABSORBED}: absorbed MLA)" if d == HEAD_DIM_ABSORBED else f"a divisor of N={n}"
        raise arg_error(ShapeError, "num_key_value_heads", want, num_key_value_heads)
    if c8 and (d != HEAD_DIM_ABSORBED or kv_n != NKV):
        raise arg_error(ShapeError, "query", f"D = {HEAD_DIM_ABSORBED} with num_key_value_heads = {NKV} (the C8 "
                        "decode is absorbed MLA only)", list(query.shape))
    if no_rope:
        qdt, dv = dtype_name(query.dtype), VALUE_DIM_NO_ROPE
    else:
        query_rope = required(query_rope, "query_rope")
        check_dtype(query_rope, "query_rope", C8_ROPE_DTYPES if c8 else (dtype_name(query.dtype),))
        qdt, dv = dtype_name(query_rope.dtype), d  # the rope / output dtype
        if query_rope.shape != (*query.shape[:-1], D_ROPE):
            raise arg_error(ShapeError, "query_rope", f"query's shape with D = {D_ROPE} "
                            f"{[*query.shape[:-1], D_ROPE]}", list(query_rope.shape))

    # ---- caches
    key, value = required(key, "key"), required(value, "value")
    key_rope = None if no_rope else required(key_rope, "key_rope")
    for name, x in (("key", key), ("value", value), ("key_rope", key_rope)):
        if x is not None:
            check_dtype(x, name, (C8_DTYPE if c8 and name != "key_rope" else qdt,))
    bsz = _int(block_size, "block_size")
    if c8 and block_table is None:
        raise arg_error(ModeError, "block_table", "a table (the C8 decode reads paged caches)", None)
    if block_table is None:  # non-paged: TND key / value / key_rope [T2, KV_N, D]
        if q_layout != "TND":
            raise arg_error(ModeError, "block_table", f"a table for input_layout={input_layout} (without "
                            "PageAttention only TND is emulated)", None)
        for name, x, want_d in (("key", key, d), ("value", value, dv), ("key_rope", key_rope, D_ROPE)):
            if x is None:
                continue
            if x.ndim != 3 or x.shape[1:] != (kv_n, want_d) or x.shape[0] != key.shape[0]:
                raise arg_error(ShapeError, name, f"[T2, KV_N={kv_n}, {want_d}] (TND without block_table; T2 of "
                                "key)", list(x.shape))
        if bsz != 0:
            raise arg_error(ModeError, "block_size", "0 without block_table", bsz)
        layout, nb, bs = "TND", 0, 0
    else:
        layout, nb, k_n, bs, k_d = _cache_dims(key, "key", None, kv_n)
        if k_n != kv_n or k_d != d:
            raise arg_error(ShapeError, "key", f"KV_N = {kv_n} kv heads of D = {d} (query's D)", list(key.shape))
        for name, x, want_d in (("value", value, d), ("key_rope", key_rope, D_ROPE)):
            _, x_nb, x_n, x_bs, x_d = _cache_dims(x, name, key.ndim, kv_n)
            if (x_nb, x_n, x_bs, x_d) != (nb, kv_n, bs, want_d):
                raise arg_error(ShapeError, name, f"key's cache layout with nb={nb}, KV_N={kv_n}, bs={bs}, "
                                f"D={want_d}", list(x.shape))
        if bsz != bs:
            raise arg_error(ShapeError, "block_size", f"the caches' block dim bs = {bs}", bsz)
        if bs % BLOCK_SIZE_ALIGN or not BLOCK_SIZE_ALIGN <= bs <= MAX_BLOCK_SIZE:
            raise arg_error(ShapeError, "block_size", f"a multiple of {BLOCK_SIZE_ALIGN} in [{BLOCK_SIZE_ALIGN}, "
                            f"{MAX_BLOCK_SIZE}]", bs)

    # ---- mask
    if atten_mask is not None:
        if sm == 0:
            raise arg_error(ModeError, "atten_mask", "None with sparse_mode=0 (masks other than sparse_mode 3's "
                            "causal one are not emulated)", describe(atten_mask))
        check_dtype(atten_mask, "atten_mask", MASK_DTYPES)
        size = CAUSAL_MASK_SIZE
        if atten_mask.shape != (size, size):
            raise arg_error(ShapeError, "atten_mask", f"the optimised causal mask [{size}, {size}] (sparse_mode 3)",
                            list(atten_mask.shape))
        if not np.array_equal(atten_mask.astype(bool), _causal_mask()):
            raise arg_error(ModeError, "atten_mask", "1 strictly above the diagonal, 0 elsewhere (sparse_mode 3's "
                            "causal mask)", describe(atten_mask))

    c8_fields = _c8_scales(query, q_layout, quant) if c8 else {}

    # ---- lengths, block_table
    if q_layout == "TND":
        if act_q_in is None:
            raise arg_error(ShapeError, act_q_name, "prefix sums [B] (required for TND)", None)
        q_sums = _lengths(act_q_in, act_q_name)
        too_big = np.abs(q_sums) > np.iinfo(np.int32).max
        if too_big.any():
            i = int(np.argmax(too_big))
            raise arg_error(ShapeError, f"{act_q_name}[{i}]", f"a prefix sum <= T={query.shape[0]}", int(q_sums[i]))
        act_q = prefix_lengths(q_sums.astype(np.int32), act_q_name, int(query.shape[0]))
        b = int(act_q.size)
        s1 = int(act_q.max())
        q_start = np.cumsum(act_q) - act_q
    else:
        b, s1 = int(query.shape[0]), int(query.shape[2] if q_layout == "BNSD" else query.shape[1])
        if act_q_in is None:
            act_q = np.full(b, s1, np.int64)
        else:
            act_q = _lengths(act_q_in, act_q_name)
            if act_q.size != b:
                raise arg_error(ShapeError, act_q_name, f"{b} lengths (query's B)", act_q.size)
            bad = (act_q < 0) | (act_q > s1)
            if bad.any():
                i = int(np.argmax(bad))
                raise arg_error(ShapeError, f"{act_q_name}[{i}]", f"a query length in [0, S1={s1}]", int(act_q[i]))
        q_start = np.arange(b, dtype=np.int64) * s1
    if act_kv_in is None:
        raise arg_error(ShapeError, act_kv_name, "per-request kv lengths [B] (required)", None)
    act_kv = _lengths(act_kv_in, act_kv_name)
    if act_kv.size != b:
        raise arg_error(ShapeError, act_kv_name, f"{b} lengths (one per request)", act_kv.size)
    if layout == "TND":
        return _args(op, query, query_rope, key, value, key_rope, atten_mask, None, act_q_in, act_kv_in, n, kv_n,
                     scale_f, input_layout, q_layout, out_layout, layout, 0, sm, lse_flag, b, s1, d, act_q,
                     _tnd_kv(act_kv, act_kv_name, int(key.shape[0])), q_start, value_dim=dv)
    table = required(block_table, "block_table")
    check_dtype(table, "block_table", ("int32",))
    if table.ndim != 2 or table.shape[0] != b or table.shape[1] == 0:
        raise arg_error(ShapeError, "block_table", f"[B={b}, max_blocks >= 1]", list(table.shape))
    cap = int(table.shape[1]) * bs
    bad = (act_kv < 0) | (act_kv > cap)
    if bad.any():
        i = int(np.argmax(bad))
        raise arg_error(ShapeError, f"{act_kv_name}[{i}]", f"a kv length in [0, {cap}] (block_table's "
                        f"{table.shape[1]} blocks of {bs})", int(act_kv[i]))
    slots = slots_from_block_table(table, act_kv, bs, nb, name="block_table")  # IndexRangeError naming block_table
    return _args(op, query, query_rope, key, value, key_rope, atten_mask, table, act_q_in, act_kv_in, n, kv_n, scale_f,
                 input_layout, q_layout, out_layout, layout, bs, sm, lse_flag, b, s1, d, act_q, (act_kv, slots),
                 q_start, value_dim=dv, **c8_fields)


def _c8_mode(query, quant) -> bool:
    """Whether a v2 call is the C8 decode: an int8 query, which needs query_quant_mode 3 (and mode 3
    needs an int8 query); v1 (``quant`` None) and float queries keep the plain path."""
    if quant is None:
        return False
    qqm = _int(quant[0], "query_quant_mode")
    is_int8 = isinstance(query, np.ndarray) and query.dtype == np.int8
    if is_int8 and qqm != QUERY_QUANT_MODE_C8:
        raise arg_error(ModeError, "query_quant_mode", f"{QUERY_QUANT_MODE_C8} (per-token-head) with an int8 query "
                        "(the C8 decode)", qqm)
    if not is_int8:
        if qqm != 0:
            raise arg_error(ModeError, "query_quant_mode", "0 with a float query (3 only with an int8 query: the C8 "
                            "decode)", qqm)
        for name, x in zip(("dequant_scale_query", "dequant_scale_key", "dequant_scale_value"), quant[1:]):
            if x is not None:
                raise arg_error(ModeError, name, "None with a float query (the dequant scales belong to the int8 C8 "
                                "decode)", describe(x))
    return is_int8


def _c8_scales(query: np.ndarray, q_layout: str, quant) -> dict:
    """The C8 scales checked: dequant_scale_query fp32 of query's shape without D, key / value fp32
    with one element (per-tensor)."""
    _, dq, dk, dv = quant
    dq = required(dq, "dequant_scale_query")
    check_dtype(dq, "dequant_scale_query", (C8_SCALE_DTYPE,))
    want = query.shape[:-1]
    if dq.shape != want:
        shown = {"BSND": "[B, S1, N]", "BNSD": "[B, N, S1]", "TND": "[T, N]"}[q_layout]
        raise arg_error(ShapeError, "dequant_scale_query", f"{shown} = {list(want)} (per token and head, query's "
                        "shape without D)", list(dq.shape))
    for name, x in (("dequant_scale_key", dk), ("dequant_scale_value", dv)):
        x = required(x, name)
        check_dtype(x, name, (C8_SCALE_DTYPE,))
        if x.size != 1 or x.ndim not in (1, 2):
            raise arg_error(ShapeError, name, "one fp32 value, [1] or [1, 1] (per-tensor: key_quant_mode / "
                            "value_quant_mode 0)", list(x.shape))
    for name, x in (("dequant_scale_query", dq), ("dequant_scale_key", dk), ("dequant_scale_value", dv)):
        if not np.isfinite(x).all():
            raise arg_error(DTypeError, name, "finite scales", describe(x))
    return dict(dequant_scale_query=dq, dequant_scale_key=np.asarray(dk), dequant_scale_value=np.asarray(dv),
                query_quant_mode=QUERY_QUANT_MODE_C8)


def _tnd_kv(sums: np.ndarray, name: str, t2: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-paged TND kv: prefix sums ``[B]`` (last = T2) -> (lengths ``[B]``, rows ``[B, W]``, -1 past each length)."""
    too_big = np.abs(sums) > np.iinfo(np.int32).max
    if too_big.any():
        i = int(np.argmax(too_big))
        raise arg_error(ShapeError, f"{name}[{i}]", f"a prefix sum <= T2={t2}", int(sums[i]))
    lens = prefix_lengths(sums.astype(np.int32), name, t2)
    width = max(int(lens.max()), 1)
    pos = np.arange(width)[None, :]
    rows = np.where(pos < lens[:, None], (np.cumsum(lens) - lens)[:, None] + pos, -1)
    return lens, rows.astype(np.int64)


def _args(op, query, query_rope, key, value, key_rope, atten_mask, table, act_q_in, act_kv_in, n, kv_n, scale_f,
          input_layout, q_layout, out_layout, layout, bs, sm, lse_flag, b, s1, d, act_q, kv, q_start, value_dim,
          **c8_fields):
    """:class:`FusedInferAttentionArgs` with the output shapes (``c8_fields``: the C8 scales)."""
    act_kv, slots = kv
    t = int(query.shape[0]) if q_layout == "TND" else b * s1
    dv = value_dim
    out_shape = {"BSND": (b, s1, n, dv), "BNSD": (b, n, s1, dv), "TND": (t, n, dv), "NBSD": (n, b, s1, dv),
                 "NTD": (n, t, dv)}[out_layout]
    lse_shape = ((t, n, 1) if q_layout == "TND" else (b, n, s1, 1)) if lse_flag else (0,)
    return FusedInferAttentionArgs(
        op=op, query=query, query_rope=query_rope, key=key, value=value, key_rope=key_rope, atten_mask=atten_mask,
        block_table=table, actual_seq_lengths=act_q_in, actual_seq_lengths_kv=act_kv_in, num_heads=n,
        num_kv_heads=kv_n, scale=scale_f, input_layout=input_layout, query_layout=q_layout, out_layout=out_layout,
        cache_layout=layout, block_size=bs, sparse_mode=sm, softmax_lse_flag=bool(lse_flag), batch=b, seq_q=s1,
        head_dim=d, act_q=act_q, act_kv=act_kv, q_start=q_start.astype(np.int64), slots=slots,
        out_shape=out_shape, lse_shape=lse_shape, value_dim=dv, **c8_fields)


_CAUSAL: list[np.ndarray] = []


def _causal_mask() -> np.ndarray:
    """The sparse_mode 3 mask: bool ``[2048, 2048]``, True strictly above the diagonal (built once)."""
    if not _CAUSAL:
        _CAUSAL.append(np.triu(np.ones((CAUSAL_MASK_SIZE, CAUSAL_MASK_SIZE), dtype=bool), k=1))
    return _CAUSAL[0]


def _check_out(x, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    x = required(x, name)
    if x.dtype != dtype or x.shape != shape:
        raise arg_error(ShapeError, name, f"a {list(shape)} {dtype.name} array (the out= form's {name})", describe(x))
    if not (x.flags.c_contiguous and x.flags.writeable):
        raise arg_error(ShapeError, name, "a C-contiguous, writable array (written in place)", describe(x))
    return x


def _run(args: FusedInferAttentionArgs, attention_out, softmax_lse):
    """Check the out= arrays (both or neither), run the backend, write them."""
    if (attention_out is None) != (softmax_lse is None):
        missing = "softmax_lse" if softmax_lse is None else "attention_out"
        raise arg_error(ModeError, missing, "an array (the out= form takes attention_out and softmax_lse "
                        "together)", None)
    if attention_out is not None:
        _check_out(attention_out, "attention_out", args.out_shape, args.out_dtype)
        if args.softmax_lse_flag:
            _check_out(softmax_lse, "softmax_lse", args.lse_shape, np.dtype(np.float32))
    checked_mode.read_fused_infer_attention(args.op, args)
    input_contracts.paged_read(args.op, args.block_table, args.act_kv, args.block_size)
    result = get_backend().fused_infer_attention_score(args)
    checked_mode.check_finite(args.op, (("attention_out", result.attention_out),))  # lse is +inf on empty rows
    if attention_out is None:
        return tuple(result)
    attention_out[...] = result.attention_out
    if args.softmax_lse_flag:
        softmax_lse[...] = result.softmax_lse
    return attention_out, softmax_lse
