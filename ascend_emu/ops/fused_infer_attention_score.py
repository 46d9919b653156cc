"""``torch_npu.npu_fused_infer_attention_score`` (FIA) and ``npu_fused_infer_attention_score_v2`` on
NumPy arrays, the MLA subset and the MHA / GQA form (no rope): one contract for both names and
their ``.out`` forms. The MHA / GQA form's layouts, caches, masks, lengths and ``learnable_sink``
are validated in :mod:`ascend_emu.ops._fused_infer_attention_mha` (its module docstring gives its
row rules and sources); it computes the numerics below (steps 1-4, with its row rule in step 1).

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

The MHA form's int8 quant (validation in :mod:`ascend_emu.ops._fused_infer_attention_quant`), read
from the A2 / A3 PFA kernel (cann-ops-adv ``src/transformer/prompt_flash_attention/``
``prompt_flash_attention_s1s2_bns1_x910.h`` and ``_x910_base.h``: an int8 query has compute type
fp16, ``PromptFlashAttentionTypeTraits<int8_t>`` in ``prompt_flash_attention_base.h``) and Ascend C's
AscendQuant (``ascend_quant_pre_impl.h``: Cast to half, Muls, Adds, Cast to int8, each CAST_NONE),
per row with ``ds1`` / ``ds2`` the FP19 of ``dequant_scale1`` / ``dequant_scale2`` (the fp32 bits,
or bits 0-31 of the uint64 form, with the low 13 bits cleared: the fixpipe's quant register, op-plugin
``torch_npu-npu_trans_quant_param.md``) and ``qs1`` = ``quant_scale1``:

Q1. ``dot = q . k`` exactly in int32 (int8 cube).
Q2. ``s = fp16(dot * ds1)`` (``SetQuantScalar(dequantScale1)``: the fixpipe dequant to fp16, one RNE
    rounding; beyond 65504: inf, unverified).
Q3. ``S = fp16(s * fp16(scale))`` (``Muls`` by the scale cast to half); masks as step 1.
Q4. (pse is not emulated.)
Q5. ``m = max S``; ``e = fp32(exp(fp32(S - m)))``; ``l = sum e`` (fp32, kv order; SoftmaxFlashV2 on
    half data with fp32 max / sum).
Q6. ``P = int8(fp16(fp16(e) * fp16(qs1)))`` (``QuantCompute`` = AscendQuant with offset 0, RNE,
    saturating): the *unnormalised* exp is quantised.
Q7. ``o = fp16(int32(P @ V) * ds2)`` (``SetQuantScalar(dequantScale2)``).
Q8. ``out = fp16(o / fp16(l))`` (``Bmm2UpdateDivNoTail``'s half path: the sum cast with CAST_ROUND,
    ties away, then ``Div`` in fp16); lse as step 4. Without ``quant_scale2`` the output is fp16.
Q9. With ``quant_scale2`` (``quant_offset2`` optional; v2 ``quant_scale_out`` / ``quant_offset_out``,
    also for a float query: the "后量化"): ``y = int8(fp16(fp16(fp16(x) * fp16(scale)) +
    fp16(offset)))`` per element, AscendQuant (``DataCopyTransposeOut*``'s ``QuantCompute`` /
    ``PostQuant2PerChannel*``), ``x`` the fp32 output before its rounding (an fp16 query's output
    in fp16), the scale per tensor or per channel ``[N, D]``, RNE, saturating.

Q10. v2's ``out_dtype`` with ``quant_scale_out`` on an emulated Ascend 950 (FP8 E4M3FN / E5M2,
    HiFloat8), from the arch35 post-quant (ops-transformer
    ``attention/common/op_kernel/arch35/vf/vf_post_quant_arch35.h`` and ``vf_post_quant_common.h``:
    ``Muls`` / ``Mul`` by the scale, ``Adds`` / ``Add`` of the offset, then one ``Cast`` to the
    output type, NO_SAT): ``y = cast(fp32(fp32(x * scale) + offset))`` per element, ``x`` the
    fp32 output before its rounding, a bf16 scale / offset widened to fp32 (exact). FP8: RNE
    (``castTraitP0``, CAST_RINT), not saturating (the 950's INF_NAN mode:
    :func:`ascend_emu.quant.to_fp8` with ``saturate=False``: E4M3FN overflow NaN, E5M2 Inf).
    HiFloat8: the kernel casts with CAST_HYBRID, which the Ascend C RoundMode doc calls a
    stochastic rounding for hif8 outputs; the emulation rounds to nearest, ties away
    (:func:`ascend_emu.quant.to_hif8`), so a hardware code may differ by one HiF8 step where the
    hardware rounds the other way (unverified, and not reproducible bit for bit). Unverified:
    whether an fp16 query's output reaches the post-quant in fp32 (taken) or rounded to fp16
    first. The int8 output keeps step Q9 on every SoC (the arch35 file computes the int8 product
    in fp32 before its fp16 and int8 casts, unsaturated; not emulated on the 950).

Unverified for the int8 chain: the kv block size (the kernel runs the online softmax over tiles
of ``singleProcessSInnerSize``, rescaling the fp16 accumulator per tile: here one block over the
row, as the float path), the fp32 sum order inside SoftmaxFlashV2, RNE for the scalar casts of
the scales to fp16 (the per-channel fp32 scale of the fp16 compute type is cast with CAST_ROUND:
they differ on exact ties only).

Unverified on hardware: the block boundaries (the tiling halves the block for 256 < kv <= 512
with flash decode, and flash decode splits long rows across cores, combining them through the
lse: not reproduced), the fp32 sum order inside SoftmaxFlashV2, fp16 overflow of ``acc`` (kept:
inf, as fp16 arithmetic gives). Rows with no kv token: as above.

Choices where the sources leave room (each in one named constant, defined with the validation in
:mod:`ascend_emu.ops._fused_infer_attention_args` and re-exported here):

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
- Without query_rope and key_rope: the MHA / GQA form (:mod:`ascend_emu.ops._fused_infer_attention_mha`),
  vllm-ascend's TND prefill with ``head_padding > 0`` (query / key D = 192 = nope | rope
  concatenated by the caller, value D = 128) among its calls.
- MLA (one of query_rope / key_rope given: both required, 64-d): D = 512 with ``num_key_value_heads = 1``
  (absorbed decode, value = the ckv cache) or D = 128 with KV_N dividing N; value's D equals
  the query's. N in :data:`QUERY_HEADS`.
- Paged caches (``block_table`` given): ``[nb, bs, KV_N*D]``, ``[nb, KV_N, bs, D]`` and
  FRACTAL_NZ ``[nb, KV_N, D/C0, bs, C0]`` (C0 = 32 bytes / itemsize, the paged NZ tile rule of
  :mod:`ascend_emu.layouts.paged`), each described by a :class:`~ascend_emu.layouts.CacheLayout`
  (PA_BSND with KV_N heads, head-major PA_BNSD, head-major PA_NZ: the object the writers' caches
  use); a request reads whole blocks, the block_table entries its length needs; key, value and
  key_rope in one of them, ``block_size`` the
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
  tensor and mode outside v2's C8 decode, the MHA form's kv antiquant and its int8 quant (Q1-Q9),
  ``query_padding_size`` / ``kv_padding_size`` (left
  padding), the shared prefix, ``key_rope_antiquant_scale``, ``learnable_sink`` outside the MHA
  form's TND / NTD_TND, ``inner_precise`` other than 0 and the v2 dtype tags (``out_dtype`` but
  with ``quant_scale_out``, step Q10).
- The ``.out`` forms write ``attention_out`` (and ``softmax_lse`` with the lse flag) after every
  check passed; ``workspace`` is not read. The workspace query returns uint8 ``[0]``: the
  emulation needs none (the real size comes from the device tiling).
"""

from __future__ import annotations

import functools

import numpy as np

from .. import checked_mode, input_contracts
from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ._backend import get_backend
from ._check import check_disjoint, required
from ._fused_infer_attention_mha import MAX_HEADS as MAX_QUERY_HEADS_NO_ROPE
from ._fused_infer_attention_mha import normalise_mha, output_shapes
from ._fused_infer_attention_quant import QUANT_OUT_DEFAULT_TYPE, check_out_dtype, quant_out_dtype
from ._fused_infer_attention_args import (LAYOUTS, QUERY_DTYPES, QUERY_HEADS, HEAD_DIM_ABSORBED, HEAD_DIM_PREFILL,
                                          HEAD_DIMS, HEAD_DIM_NO_ROPE, VALUE_DIM_NO_ROPE,
                                          SPARSE_MODES, CAUSAL_MASK_SIZE, MASK_DTYPES, DEFAULT_TOKENS,
                                          BLOCK_SIZE_ALIGN, MAX_BLOCK_SIZE, EMPTY_ROW_OUTPUT, EMPTY_ROW_LSE,
                                          QUERY_DTYPE_ROUNDING, P_ROUNDING, CACHE_LAYOUTS, V1_REJECTED, V2_REJECTED,
                                          QUERY_QUANT_MODE_C8, C8_DTYPE, C8_ROPE_DTYPES, C8_SCALE_DTYPE, C8_KV_BLOCK,
                                          C8_P_RANGE, C8_PV_STAGE_SCALE, C8_FLOAT_EPS, C8_DOT_BIAS_BITS, C8_DOT_BIAS,
                                          FusedInferAttentionArgs, FusedInferAttentionCall,
                                          FusedInferAttentionOutputs, _int, normalise_mla, reject)

#: The public ops, and the limits, choices and argument types defined beside the validation.
__all__ = ["npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2",
           "_npu_fused_infer_attention_score_get_max_workspace",
           "_npu_fused_infer_attention_score_v2_get_max_workspace", "_npu_fused_infer_attention_score_infer_output",
           "_npu_fused_infer_attention_score_v2_infer_output", "WORKSPACE", "LAYOUTS", "QUERY_DTYPES",
           "QUERY_HEADS", "HEAD_DIM_ABSORBED", "HEAD_DIM_PREFILL", "HEAD_DIMS", "HEAD_DIM_NO_ROPE",
           "VALUE_DIM_NO_ROPE", "MAX_QUERY_HEADS_NO_ROPE", "SPARSE_MODES", "CAUSAL_MASK_SIZE", "MASK_DTYPES",
           "DEFAULT_TOKENS", "BLOCK_SIZE_ALIGN", "MAX_BLOCK_SIZE", "EMPTY_ROW_OUTPUT", "EMPTY_ROW_LSE",
           "QUERY_DTYPE_ROUNDING", "P_ROUNDING", "CACHE_LAYOUTS", "V1_REJECTED", "V2_REJECTED",
           "QUERY_QUANT_MODE_C8", "C8_DTYPE", "C8_ROPE_DTYPES", "C8_SCALE_DTYPE", "C8_KV_BLOCK", "C8_P_RANGE",
           "C8_PV_STAGE_SCALE", "C8_FLOAT_EPS", "C8_DOT_BIAS_BITS", "C8_DOT_BIAS", "FusedInferAttentionArgs",
           "FusedInferAttentionCall", "FusedInferAttentionOutputs", "normalise", "reject"]


# ---------------------------------------------------------------------- public ops
def normalise(call: FusedInferAttentionCall) -> FusedInferAttentionArgs:
    """Validate a call (nothing is read from a cache before every check passes): without
    ``query_rope`` / ``key_rope``, the MHA / GQA form (an int8 query there only under v1: full quant)
    (:func:`._fused_infer_attention_mha.normalise_mha`); otherwise the MLA form
    (:func:`._fused_infer_attention_args.normalise_mla`).

    Raises:
        As :func:`npu_fused_infer_attention_score`.
    """
    if call.query_rope is None and call.key_rope is None and (call.quant is None or not (
            isinstance(call.query, np.ndarray) and call.query.dtype == np.int8)):
        return normalise_mha(call, call.sink)
    return normalise_mla(call)


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
    """Fused infer attention: the MLA subset over a paged cache, and the MHA / GQA form (no rope,
    :mod:`ascend_emu.ops._fused_infer_attention_mha`: BSH / BSND / BNSD / TND / NTD queries and the
    layout transforms, dense or paged key / value, sparse_mode 0-3 with explicit masks); the
    schema of torch_npu 2.14 (the ``.out`` form: ``workspace``, ``attention_out``, ``softmax_lse``).

    Args (the MLA subset; the MHA / GQA form's shapes: the op-plugin layout table, in the MHA
    module's docstring):
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
            shape with the flag (not written without it); both apart in memory from each
            other and from every input (ShapeError naming the overlapping one otherwise).
        dequant_scale1, quant_scale1, dequant_scale2: the MHA form's int8 full quant (an int8
            query, key and value, BSH / BSND / BNSD / BNSD_BSND, dense, Q_S >= 2, D a multiple of
            32): each one value, fp32 or uint64 (npu_trans_quant_param's form, offset bits 0),
            all three required (steps Q1-Q8); None otherwise.
        quant_scale2, quant_offset2: the int8 output quant (step Q9), of an int8 or a float16 /
            bfloat16 query of the MHA form: fp32 (or bf16 with a bf16 query), one value or N * D
            (per channel: D a multiple of 32, no lse); the offset optional, of the scale's dtype
            and shape, rejected when a row takes no part in the computation.
        pse_shift, the legacy antiquant_scale / _offset / _mode, query_padding_size,
            kv_padding_size, the shared prefix, key_rope_antiquant_scale, inner_precise: only
            their defaults (:data:`V1_REJECTED`).

    Returns:
        ``(attention_out, softmax_lse)``: attention_out in query's dtype (int8 with quant_scale2;
        fp16 for an int8 query without it), ``[B, S1, N, D]``
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
    given = dict(pse_shift=pse_shift, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                 query_padding_size=query_padding_size, kv_padding_size=kv_padding_size,
                 key_shared_prefix=key_shared_prefix, value_shared_prefix=value_shared_prefix,
                 actual_shared_prefix_len=actual_shared_prefix_len, key_rope_antiquant_scale=key_rope_antiquant_scale,
                 antiquant_mode=antiquant_mode, inner_precise=inner_precise)
    reject(given, V1_REJECTED, "npu_fused_infer_attention_score")
    antiquant = dict(key_antiquant_scale=key_antiquant_scale, key_antiquant_offset=key_antiquant_offset,
                     value_antiquant_scale=value_antiquant_scale, value_antiquant_offset=value_antiquant_offset,
                     key_antiquant_mode=key_antiquant_mode, value_antiquant_mode=value_antiquant_mode)
    full_quant = dict(dequant_scale1=dequant_scale1, quant_scale1=quant_scale1, dequant_scale2=dequant_scale2)
    quant_out = dict(quant_scale2=quant_scale2, quant_offset2=quant_offset2)
    read = dict(query=query, key=key, value=value, query_rope=query_rope, key_rope=key_rope, atten_mask=atten_mask,
                actual_seq_lengths=actual_seq_lengths, actual_seq_lengths_kv=actual_seq_lengths_kv,
                block_table=block_table, **{k: v for k, v in antiquant.items() if "mode" not in k}, **full_quant,
                **quant_out)
    args = normalise(FusedInferAttentionCall(
        op="npu_fused_infer_attention_score", query=query, key=key, value=value, query_rope=query_rope,
        key_rope=key_rope, atten_mask=atten_mask, act_q=actual_seq_lengths, act_q_name="actual_seq_lengths",
        act_kv=actual_seq_lengths_kv, act_kv_name="actual_seq_lengths_kv", block_table=block_table,
        num_heads=num_heads, heads_name="num_heads", num_key_value_heads=num_key_value_heads, scale=scale,
        scale_name="scale", pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
        sparse_mode=sparse_mode, block_size=block_size, lse_flag=softmax_lse_flag, lse_name="softmax_lse_flag",
        antiquant=antiquant, full_quant=full_quant, quant_out=quant_out))
    return _run(args, attention_out, softmax_lse, read)


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

    ``learnable_sink``: the MHA / GQA form's bf16 ``[N]`` sink (TND / NTD_TND, value D <= 128;
    numerics in :mod:`ascend_emu.ops._fused_infer_attention_mha`). ``quant_scale_out`` /
    ``quant_offset_out``: v1's ``quant_scale2`` / ``quant_offset2`` (the int8 output quant of the
    MHA form, step Q9). ``out_dtype`` (with ``quant_scale_out`` only): the output quant's type,
    int8 when None; on an emulated Ascend 950 also ``torch.float8_e4m3fn`` / ``float8_e5m2`` (24
    / 23, or torch_npu's 292 / 291; an ml_dtypes FP8 output) and ``torch_npu.hifloat8`` (290; uint8
    HiFloat8 codes), numerics step Q10
    (:func:`._fused_infer_attention_quant.check_out_dtype`). The other v2-only arguments
    (quant_scale_p, the dtype tags) take only their defaults (:data:`V2_REJECTED`); an int8 query
    without rope is the C8 decode's (rope required): v2 has no MHA full quant here.

    Raises:
        As :func:`npu_fused_infer_attention_score`; C8: ModeError naming ``query_quant_mode`` (an
        int8 query without mode 3, or mode 3 with a float query), DTypeError / ShapeError naming
        the scale or cache that does not fit; ModeError naming ``out_dtype`` (given without
        ``quant_scale_out``, a type outside int8 / FP8 / HiFloat8, FP8 / HiFloat8 off the 950).
    """
    given = dict(pse_shift=pse_shift, dequant_scale_key_rope=dequant_scale_key_rope, quant_scale_p=quant_scale_p,
                 query_dtype=query_dtype, key_dtype=key_dtype, value_dtype=value_dtype,
                 query_rope_dtype=query_rope_dtype, key_rope_dtype=key_rope_dtype,
                 key_shared_prefix_dtype=key_shared_prefix_dtype, value_shared_prefix_dtype=value_shared_prefix_dtype,
                 dequant_scale_query_dtype=dequant_scale_query_dtype, dequant_scale_key_dtype=dequant_scale_key_dtype,
                 dequant_scale_value_dtype=dequant_scale_value_dtype,
                 dequant_scale_key_rope_dtype=dequant_scale_key_rope_dtype,
                 key_quant_mode=key_quant_mode, value_quant_mode=value_quant_mode, inner_precise=inner_precise)
    reject(given, V2_REJECTED, "npu_fused_infer_attention_score_v2")
    out_type = check_out_dtype(out_dtype, quant_scale_out)
    read = dict(query=query, key=key, value=value, query_rope=query_rope, key_rope=key_rope, atten_mask=atten_mask,
                actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen, block_table=block_table,
                dequant_scale_query=dequant_scale_query, dequant_scale_key=dequant_scale_key,
                dequant_scale_value=dequant_scale_value, learnable_sink=learnable_sink,
                dequant_offset_key=dequant_offset_key, dequant_offset_value=dequant_offset_value,
                quant_scale_out=quant_scale_out, quant_offset_out=quant_offset_out)
    args = normalise(FusedInferAttentionCall(
        op="npu_fused_infer_attention_score_v2", query=query, key=key, value=value, query_rope=query_rope,
        key_rope=key_rope, atten_mask=atten_mask, act_q=actual_seq_qlen, act_q_name="actual_seq_qlen",
        act_kv=actual_seq_kvlen, act_kv_name="actual_seq_kvlen", block_table=block_table, num_heads=num_query_heads,
        heads_name="num_query_heads", num_key_value_heads=num_key_value_heads, scale=softmax_scale,
        scale_name="softmax_scale", pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
        sparse_mode=sparse_mode, block_size=block_size, lse_flag=return_softmax_lse, lse_name="return_softmax_lse",
        quant=(query_quant_mode, dequant_scale_query, dequant_scale_key, dequant_scale_value), sink=learnable_sink,
        antiquant=dict(dequant_scale_key=dequant_scale_key, dequant_offset_key=dequant_offset_key,
                       dequant_scale_value=dequant_scale_value, dequant_offset_value=dequant_offset_value),
        quant_out=dict(quant_scale_out=quant_scale_out, quant_offset_out=quant_offset_out), out_type=out_type))
    return _run(args, attention_out, softmax_lse, read)


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


def _infer_output(query, value, quant_out, block_table, input_layout, num_heads, num_key_value_heads, lse_flag,
                  query_rope, names, out_type=QUANT_OUT_DEFAULT_TYPE):
    """The infer_output ops' shared body: shapes by :func:`._fused_infer_attention_mha.output_shapes`,
    dtype ``out_type``'s (int8 unless v2's out_dtype says otherwise) with a quant output scale,
    else query_rope's (fp16 without) for an int8 query, else query's; zero-filled arrays (the
    device returns uninitialised memory)."""
    query, value = required(query, "query"), required(value, "value")
    heads = _int(num_heads, names[0])
    kv_heads = _int(num_key_value_heads, "num_key_value_heads")
    if not isinstance(lse_flag, (bool, np.bool_)):
        raise arg_error(DTypeError, names[1], "a bool", type(lse_flag).__name__)
    if not isinstance(input_layout, str):
        raise arg_error(DTypeError, "input_layout", "a str", type(input_layout).__name__)
    out_shape, lse_shape = output_shapes(query.shape, value.shape, block_table is not None, input_layout, heads,
                                         kv_heads, bool(lse_flag))
    if quant_out is not None:
        dtype = quant_out_dtype(out_type)
    elif query.dtype == np.int8:
        dtype = np.float16 if query_rope is None else required(query_rope, "query_rope").dtype
    else:
        dtype = query.dtype
    return np.zeros(out_shape, dtype=dtype), np.zeros(lse_shape, dtype=np.float32)


def _npu_fused_infer_attention_score_infer_output(query, value, *, input_layout: str = "BSH", quant_scale2=None,
                                                  block_table=None, num_heads: int = 1, num_key_value_heads: int = 0,
                                                  softmax_lse_flag: bool = False, query_rope=None):
    """``torch_npu._npu_fused_infer_attention_score_infer_output``: the out= arrays of a later
    ``npu_fused_infer_attention_score.out`` call (op-plugin ``op_plugin_functions.yaml`` line 6190;
    ``construct_fia_output_tensor``), zero-filled: attention_out of the meta function's shape
    (query's leading dims in the output layout, value's D) in query's dtype (int8 with
    ``quant_scale2``; an int8 query: query_rope's, fp16 without), softmax_lse fp32 ``[B, N, S1, 1]``
    / ``[T, N, 1]`` with the flag, ``[0]`` without.

    Raises:
        ModeError: an unknown input_layout or one not matching query's dims. ShapeError:
        ``num_heads`` < 1. DTypeError: an argument of the wrong type.
    """
    return _infer_output(query, value, quant_scale2, block_table, input_layout, num_heads, num_key_value_heads,
                         softmax_lse_flag, query_rope, ("num_heads", "softmax_lse_flag"))


def _npu_fused_infer_attention_score_v2_infer_output(query, value, *, query_dtype=None, value_dtype=None,
                                                     input_layout: str = "BSH", quant_scale_out=None,
                                                     block_table=None, num_query_heads: int = 1,
                                                     num_key_value_heads: int = 0, return_softmax_lse: bool = False,
                                                     query_rope=None, out_dtype=None):
    """``torch_npu._npu_fused_infer_attention_score_v2_infer_output`` (op-plugin
    ``op_plugin_functions.yaml`` line 6207; ``construct_fia_output_tensor_v2``): as the v1 form
    under the v2 names; ``out_dtype`` with ``quant_scale_out``: the output's type as the op's
    (:func:`._fused_infer_attention_quant.check_out_dtype`); the input dtype tags
    (``query_dtype``, ``value_dtype``) take only None (not emulated).

    Raises:
        As the v1 form; ModeError naming a dtype tag given, or an ``out_dtype`` the op rejects.
    """
    reject(dict(query_dtype=query_dtype, value_dtype=value_dtype), dict(query_dtype=None, value_dtype=None),
           "_npu_fused_infer_attention_score_v2_infer_output")
    out_type = check_out_dtype(out_dtype, quant_scale_out)
    return _infer_output(query, value, quant_scale_out, block_table, input_layout, num_query_heads,
                         num_key_value_heads, return_softmax_lse, query_rope, ("num_query_heads", "return_softmax_lse"),
                         out_type)


def _check_out(x, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    x = required(x, name)
    if x.dtype != dtype or x.shape != shape:
        raise arg_error(ShapeError, name, f"a {list(shape)} {dtype.name} array (the out= form's {name})", describe(x))
    if not (x.flags.c_contiguous and x.flags.writeable):
        raise arg_error(ShapeError, name, "a C-contiguous, writable array (written in place)", describe(x))
    return x


def _run(args: FusedInferAttentionArgs, attention_out, softmax_lse, read: dict):
    """Check the out= arrays (both or neither; each of its shape and dtype, and their memory
    apart from each other and from every array of ``read``, the call's inputs by name: the
    overlap rule of :func:`._check.check_disjoint`), run the backend, write them."""
    if (attention_out is None) != (softmax_lse is None):
        missing = "softmax_lse" if softmax_lse is None else "attention_out"
        raise arg_error(ModeError, missing, "an array (the out= form takes attention_out and softmax_lse "
                        "together)", None)
    if attention_out is not None:
        _check_out(attention_out, "attention_out", args.out_shape, args.out_dtype)
        if args.softmax_lse_flag:
            _check_out(softmax_lse, "softmax_lse", args.lse_shape, np.dtype(np.float32))
        else:  # not written without the flag, but an out= array all the same
            softmax_lse = required(softmax_lse, "softmax_lse")
        check_disjoint((("attention_out", attention_out), ("softmax_lse", softmax_lse)),
                       [(name, x) for name, x in read.items() if isinstance(x, np.ndarray)])
    checked_mode.read(args.op, args.cache_reads)
    input_contracts.paged_read(args.op, args.block_table, args.act_kv, args.block_size)
    result = get_backend().fused_infer_attention_score(args)
    checked_mode.check_finite(args.op, (("attention_out", result.attention_out),))  # lse is +inf on empty rows
    if attention_out is None:
        return tuple(result)
    attention_out[...] = result.attention_out
    if args.softmax_lse_flag:
        softmax_lse[...] = result.softmax_lse
    return attention_out, softmax_lse
