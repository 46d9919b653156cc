"""The MHA / GQA form of ``npu_fused_infer_attention_score`` / ``_v2``: no ``query_rope`` /
``key_rope``, float query / key / value; its limits (named constants) and its validation,
producing the same :class:`~ascend_emu.ops._fused_infer_attention_args.FusedInferAttentionArgs`
the MLA subset produces (one backend path for both).

Sources: op-plugin ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md``
(the ``input_layout`` table, the axis limits, ``atten_mask`` / ``sparse_mode`` / ``actual_seq_lengths``,
the PageAttention and TND constraints) and ``torch_npu-npu_fused_infer_attention_score_v2.md``
(the same for v2, ``learnable_sink``, its constraints); the meta function's layout map
(``get_query_and_attention_out_layout``, mirrored in :mod:`ascend_emu.torch_npu._fake`). See the
op module :mod:`ascend_emu.ops.fused_infer_attention_score` for the numerics (the MLA subset's
steps 1-4, with the row rules below; its int8 quant: :mod:`ascend_emu.ops._fused_infer_attention_quant`) and
docs/ops.md for the emulated set.

Row rules (which kv positions ``j`` the query token at position ``s`` of its request sees, among
the request's ``act_kv`` tokens; ``act_q`` its query tokens):

- sparse_mode 0 without ``atten_mask``: all; with one (and 1, which needs one): those whose mask
  entry ``mask[s, j]`` is 0 (1 masks out), the mask ``[Q_S, KV_S]``, ``[1, Q_S, KV_S]``,
  ``[1, 1, Q_S, KV_S]`` or ``[B, 1, Q_S, KV_S]`` (Q_S = 1: also ``[B, KV_S]``); ``pre_tokens`` /
  ``next_tokens`` must leave the band of mode 0 the whole matrix (each >= Q_S + KV_S: narrower
  bands are not emulated).
- sparse_mode 2 (leftUpCausal): ``j <= s``; 3 (rightDownCausal): ``j <= act_kv - act_q + s``;
  4 (band, bottom-right aligned as the PFA kernel's ``GetSparseParam`` shifts the tokens by
  ``act_kv - act_q``): ``act_kv - act_q + s - pre_tokens <= j <= act_kv - act_q + s +
  next_tokens``; ``atten_mask`` None or the optimised 2048 x 2048 causal mask.
- Q_S = 1 with a B-first layout (decode): the doc's "sparse_mode has no effect when Q_S = 1
  without rope" (and pre_tokens / next_tokens "Q_S=1时无效"): modes 2, 3 and 4 see all tokens.
- A row with no kv position (a causal row before its first token, a band outside the row) is an
  empty row (output 0, lse +inf; the doc's invalid-row handling, unverified); a row an explicit mask leaves
  empty is rejected naming ``atten_mask`` (the value of such a row under ``inner_precise`` 0 is
  the hardware's and not emulated).

Separated kv antiquant (:data:`ANTIQUANT_DTYPES` key / value, dense B-first layouts, or int8 paged
caches with Q_S = 1; modes 0):
each element ``scale * (x + offset)`` with the per-tensor or per-channel ``[KV_N, D]`` scale and
offset in the query's dtype (Ascend C's AscendAntiQuant, hiascend.com API page
``atlasascendc_api_07_0822``: fp16 step by step, bf16 via fp32 and one rounding; that FIA's
kernels use it is unverified), int4 unpacked as :func:`ascend_emu.quant.unpack_int4_from_int32`.

``learnable_sink`` (v2): bf16 ``[N]``, TND / NTD_TND with value D <= 128 (the v2 doc's
constraints): one more softmax entry per head, ``sink[n]`` as is (not scaled): ``m = max(max S,
sink)``, ``l = sum e + fp32(exp(sink - m))`` (the sink term added last), P and the output as without
it; ``lse = m + ln l``.
"""

from __future__ import annotations

import numpy as np

from .. import soc
from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..layouts import CacheLayout, blocks_from_block_table
from ._check import MAX_BATCH, check_dtype, check_float, dtype_name, prefix_lengths, required
from ._fused_infer_attention_quant import FULL_QUANT_DTYPE, check_offset_rows, check_quant

#: input_layout -> (query layout, attention_out layout) of the MHA / GQA form (the doc's table and
#: the meta function's map). NSD (B = 1, ``[N, S, D]``) is an Ascend 950 layout.
MHA_LAYOUTS = {"BSH": ("BSH", "BSH"), "BSND": ("BSND", "BSND"), "BNSD": ("BNSD", "BNSD"), "TND": ("TND", "TND"),
               "NTD": ("NTD", "NTD"), "BNSD_BSND": ("BNSD", "BSND"), "BSH_BNSD": ("BSH", "BNSD"),
               "BSND_BNSD": ("BSND", "BNSD"), "BSH_NBSD": ("BSH", "NBSD"), "BSND_NBSD": ("BSND", "NBSD"),
               "BNSD_NBSD": ("BNSD", "NBSD"), "TND_NTD": ("TND", "NTD"), "NTD_TND": ("NTD", "TND"),
               "NSD": ("NSD", "NSD")}
#: Layouts the A2 / A3 table limits to a query length range (BNSD_BSND: Q_S > 1; BNSD_NBSD:
#: 1 < Q_S <= 16); op-plugin's 950 tests call BNSD_BSND with Q_S = 1, so not gated there.
QS_LIMITED_LAYOUTS = {"BNSD_BSND": (2, 2 ** 31 - 1), "BNSD_NBSD": (2, 16)}
#: Layouts only the Ascend 950 has (rejected on A2 / A3 with the hint to set the SoC).
MHA_LAYOUTS_950 = ("NSD",)
#: Query layouts whose tokens are packed (``actual_seq_*`` prefix sums, required).
PACKED_LAYOUTS = ("TND", "NTD")
#: Query dtypes of the MHA form (key / value the same dtype).
MHA_DTYPES = ("bfloat16", "float16")
#: Axis limits (the doc's table): N and KV_N <= 256, N / KV_N <= 64, D <= 512 and 16-byte aligned.
MAX_HEADS = 256
MAX_GROUP = 64
MAX_HEAD_DIM = 512
HEAD_DIM_ALIGN_BYTES = 16
#: The packed layouts' head dims (the TND constraints without rope): Q_D = K_D = V_D = 128, or
#: Q_D = K_D = 192 with V_D 128 or 192 (192 not with an NTD input).
PACKED_HEAD_DIMS = ((128, 128), (192, 128), (192, 192))
#: Q_D = K_D = 192 with V_D = 128 in a B-first layout: the Ascend 950 (op-plugin's 950 tests).
UNEQUAL_HEAD_DIMS_950 = ((192, 128),)
#: sparse_mode values of the MHA form (5-8 are not emulated).
MHA_SPARSE_MODES = (0, 1, 2, 3, 4)
#: Explicit-mask modes, and the modes with the optimised 2048 x 2048 mask (their row rules).
EXPLICIT_MASK_MODES = (0, 1)
CAUSAL_MODES = {2: "top_left", 3: "bottom_right", 4: "band"}
#: PageAttention: a multiple of 16 in [16, 512]; a B-first prefill (Q_S > 1): of 128 in [128, 512].
PREFILL_BLOCK_ALIGN = 128
#: learnable_sink: bf16 [N], TND / NTD_TND, value D <= 128 (the v2 doc).
SINK_DTYPE = "bfloat16"
SINK_LAYOUTS = ("TND", "NTD_TND")
SINK_MAX_VALUE_DIM = 128
#: Separated kv antiquant (int8 or int4 packed 8 to an int32 key / value, a float query):
#: ``kv = qdt(scale * (kv_int + offset))`` per tensor or per channel (``[KV_N, D]``), Ascend C's
#: AscendAntiQuant (fp16: each step in fp16; bf16: in fp32, one bf16 rounding); modes 0 only.
ANTIQUANT_DTYPES = ("int8", "int32")
#: Logical D alignment of antiquant keys: int8 32 bytes, int4 64 bytes (the doc's D row).
ANTIQUANT_D_ALIGN = {"int8": 32, "int32": 128}
#: block_size of a paged int8 cache read with antiquant: 32 rows (the doc: int8 "32字节对齐").
ANTIQUANT_PAGED_BLOCK_ALIGN = 32
#: Dense key / value shapes by query layout, as errors name them.
DENSE_KV_SHAPES = {"BSH": "[B, KV_S, KV_N*D]", "BSND": "[B, KV_S, KV_N, D]", "BNSD": "[B, KV_N, KV_S, D]",
                   "TND": "[T2, KV_N, D]", "NTD": "[KV_N, T2, D]", "NSD": "[KV_N, KV_S, D]"}
QUERY_SHAPES = {"BSH": "[B, S1, N*D]", "BSND": "[B, S1, N, D]", "BNSD": "[B, N, S1, D]", "TND": "[T, N, D]",
                "NTD": "[N, T, D]", "NSD": "[N, S1, D]"}


def _query_dims(query: np.ndarray, q_layout: str, n: int, heads_name: str) -> tuple[int, int, int]:
    """``(B or T, S1 or T, D)`` of the query; N checked against ``n``."""
    want_nd = 3 if q_layout in ("BSH", "TND", "NTD", "NSD") else 4
    if query.ndim != want_nd or query.size == 0:
        raise arg_error(ShapeError, "query", f"a non-empty {QUERY_SHAPES[q_layout]} for its layout {q_layout}",
                        list(query.shape))
    if q_layout == "BSH":
        if query.shape[2] % n:
            raise arg_error(ShapeError, heads_name, f"a divisor of query's H = {query.shape[2]} (BSH: H = N*D)", n)
        return query.shape[0], query.shape[1], query.shape[2] // n
    q_n = {"BSND": 2, "BNSD": 1, "TND": 1, "NTD": 0, "NSD": 0}[q_layout]
    if query.shape[q_n] != n:
        raise arg_error(ShapeError, heads_name, f"query's N = {query.shape[q_n]} ({QUERY_SHAPES[q_layout]})", n)
    if q_layout == "BSND":
        return query.shape[0], query.shape[1], query.shape[3]
    if q_layout == "BNSD":
        return query.shape[0], query.shape[2], query.shape[3]
    if q_layout == "TND":
        return query.shape[0], query.shape[0], query.shape[2]
    if q_layout == "NTD":
        return query.shape[1], query.shape[1], query.shape[2]
    return 1, query.shape[1], query.shape[2]  # NSD


def _dense_kv(x: np.ndarray, name: str, q_layout: str, b: int, kv_n: int) -> tuple[int, int]:
    """``(KV_S or T2, D)`` of a dense key / value in the query's layout; batch and KV_N checked."""
    want_nd = 3 if q_layout in ("BSH", "TND", "NTD", "NSD") else 4
    shown = DENSE_KV_SHAPES[q_layout]
    if x.ndim != want_nd or x.size == 0:
        raise arg_error(ShapeError, name, f"a non-empty {shown} ({q_layout} without block_table)", list(x.shape))
    if q_layout == "BSH":
        ok = x.shape[0] == b and x.shape[2] % kv_n == 0
        s2, d = x.shape[1], x.shape[2] // kv_n
    elif q_layout == "BSND":
        ok, s2, d = x.shape[0] == b and x.shape[2] == kv_n, x.shape[1], x.shape[3]
    elif q_layout == "BNSD":
        ok, s2, d = x.shape[0] == b and x.shape[1] == kv_n, x.shape[2], x.shape[3]
    elif q_layout == "TND":
        ok, s2, d = x.shape[1] == kv_n, x.shape[0], x.shape[2]
    else:  # NTD, NSD
        ok, s2, d = x.shape[0] == kv_n, x.shape[1], x.shape[2]
    if not ok:
        raise arg_error(ShapeError, name, f"{shown} with B = {b}, KV_N = {kv_n} (query's B, num_key_value_heads)",
                        list(x.shape))
    return int(s2), int(d)


def _paged_kv(x: np.ndarray, name: str, q_layout: str, kv_n: int) -> CacheLayout:
    """The :class:`CacheLayout` of a paged key / value: ``[nb, bs, KV_N*D]`` (any query layout) or
    ``[nb, KV_N, bs, D]`` (BNSD / TND queries only, the doc's PageAttention table)."""
    from ._fused_infer_attention_args import _cache_layout
    if x.ndim == 4 and q_layout not in ("BNSD", "TND"):
        raise arg_error(ShapeError, name, f"[nb, bs, KV_N*D] (a {q_layout} query reads only that cache layout)",
                        list(x.shape))
    if x.ndim not in (3, 4):
        raise arg_error(ShapeError, name, "a paged cache [nb, bs, KV_N*D] or [nb, KV_N, bs, D] (the MHA form reads "
                        "no FRACTAL_NZ cache)", list(x.shape))
    return _cache_layout(x, name, None, kv_n)


def _bcast_lengths(x, name: str, b: int, cap: int, what: str) -> np.ndarray:
    """A B-first layout's per-request lengths: None -> ``cap`` each; one value -> every request;
    at least B values -> the first B (the doc's rule); each in ``[0, cap]``."""
    from ._fused_infer_attention_args import _lengths
    if x is None:
        return np.full(b, cap, np.int64)
    v = _lengths(x, name)
    if v.size == 1:
        v = np.full(b, int(v[0]), np.int64)
    elif v.size < b:
        raise arg_error(ShapeError, name, f"1 or at least B = {b} lengths", int(v.size))
    v = v[:b]
    bad = (v < 0) | (v > cap)
    if bad.any():
        i = int(np.argmax(bad))
        raise arg_error(ShapeError, f"{name}[{i}]", f"{what} in [0, {cap}]", int(v[i]))
    return v


def _packed_lengths(x, name: str, total: int | None, required_what: str) -> np.ndarray:
    """Prefix sums (TND / NTD) -> per-request lengths; the last sum equal to ``total`` (None:
    per-request lengths as given, the paged kv of a packed query)."""
    from ._fused_infer_attention_args import _lengths
    if x is None:
        raise arg_error(ShapeError, name, f"{required_what} (required for TND / NTD)", None)
    v = _lengths(x, name)
    if total is None:
        bad = v < 0
        if bad.any():
            i = int(np.argmax(bad))
            raise arg_error(ShapeError, f"{name}[{i}]", "a kv length >= 0", int(v[i]))
        return v
    too_big = np.abs(v) > np.iinfo(np.int32).max
    if too_big.any():
        i = int(np.argmax(too_big))
        raise arg_error(ShapeError, f"{name}[{i}]", f"a prefix sum <= {total}", int(v[i]))
    return prefix_lengths(v.astype(np.int32), name, total).astype(np.int64)


def _explicit_mask(mask: np.ndarray, b: int, s1: int, kv_cap: int, paged: bool) -> np.ndarray:
    """sparse_mode 0 / 1's mask as a bool view ``[Bm, S1, KV_S]`` (Bm 1 or B; True masks out)."""
    from ._fused_infer_attention_args import MASK_DTYPES
    if not isinstance(mask, np.ndarray):
        raise arg_error(DTypeError, "atten_mask", "None or a bool / int8 / uint8 array", describe(mask))
    check_dtype(mask, "atten_mask", MASK_DTYPES)
    shape = mask.shape
    kv_ok = (shape[-1] >= kv_cap) if paged else (shape[-1] == kv_cap)
    if len(shape) == 2 and shape[0] == s1 and kv_ok:
        m3 = mask.reshape(1, s1, shape[-1])
    elif len(shape) == 2 and s1 == 1 and shape[0] == b and kv_ok:  # decode [B, KV_S]
        m3 = mask.reshape(b, 1, shape[-1])
    elif len(shape) == 3 and shape[:2] == (1, s1) and kv_ok:
        m3 = mask
    elif len(shape) == 4 and shape[0] in (1, b) and shape[1:3] == (1, s1) and kv_ok:
        m3 = mask.reshape(shape[0], s1, shape[-1])
    else:
        kv = f">= {kv_cap} (block_table's blocks x block_size)" if paged else f"{kv_cap}"
        raise arg_error(ShapeError, "atten_mask", f"[Q_S, KV_S], [1, Q_S, KV_S], [1, 1, Q_S, KV_S] or "
                        f"[B, 1, Q_S, KV_S] (Q_S = 1: also [B, KV_S]) with B = {b}, Q_S = {s1}, KV_S {kv}",
                        list(shape))
    if mask.dtype != np.bool_ and ((m3 != 0) & (m3 != 1)).any():
        raise arg_error(DTypeError, "atten_mask", "0 / 1 entries (1 masks a position out)", describe(mask))
    return m3.view(np.bool_) if m3.dtype != np.bool_ else m3


def _check_live_rows(m3: np.ndarray, act_q: np.ndarray, act_kv: np.ndarray) -> None:
    """Reject an explicit mask that leaves a computed query row without any kv position."""
    kv_s = m3.shape[-1]
    free = ~m3  # [Bm, S1, KV_S]
    first = np.where(free.any(axis=-1), free.argmax(axis=-1), kv_s)  # [Bm, S1] first unmasked position
    b = act_q.size
    first_b = first if first.shape[0] == b else np.broadcast_to(first, (b, first.shape[1]))
    s = np.arange(first_b.shape[1])[None, :]
    dead = (s < act_q[:, None]) & (first_b >= act_kv[:, None]) & (act_kv[:, None] > 0)
    if dead.any():
        bi, si = (int(v) for v in np.argwhere(dead)[0])
        raise arg_error(ModeError, "atten_mask", "at least one unmasked kv position in every computed row (a row "
                        "masked whole is the hardware's inner_precise business: not emulated)",
                        f"request {bi}, query token {si} masked over all its {int(act_kv[bi])} kv tokens")


def normalise_mha(call, sink=None):
    """Validate a call of either name without rope arguments (the MHA / GQA form).

    Args:
        call: the :class:`~ascend_emu.ops._fused_infer_attention_args.FusedInferAttentionCall`.
        sink: v2's ``learnable_sink`` (None for v1).

    Returns:
        The :class:`~ascend_emu.ops._fused_infer_attention_args.FusedInferAttentionArgs`.

    Raises:
        ShapeError, DTypeError, ModeError, IndexRangeError: as the op's docstring states, naming
        the argument.
    """
    from ._fused_infer_attention_args import (BLOCK_SIZE_ALIGN, MAX_BLOCK_SIZE, FusedInferAttentionArgs,
                                              _causal_mask, _int, CAUSAL_MASK_SIZE, MASK_DTYPES, row_limits)
    input_layout, heads_name = call.input_layout, call.heads_name
    if input_layout not in MHA_LAYOUTS:
        raise arg_error(ModeError, "input_layout", f"one of {list(MHA_LAYOUTS)} (without query_rope / key_rope)",
                        repr(input_layout))
    if input_layout in MHA_LAYOUTS_950:
        soc.require_ascend950("input_layout", input_layout, "an Ascend 950 layout")
    q_layout, out_layout = MHA_LAYOUTS[input_layout]
    packed = q_layout in PACKED_LAYOUTS
    sm = _int(call.sparse_mode, "sparse_mode")
    if sm not in MHA_SPARSE_MODES:
        raise arg_error(ModeError, "sparse_mode", f"one of {list(MHA_SPARSE_MODES)} (5-8 are not emulated)", sm)
    pre, nxt = _int(call.pre_tokens, "pre_tokens"), _int(call.next_tokens, "next_tokens")
    if not isinstance(call.lse_flag, (bool, np.bool_)):
        raise arg_error(DTypeError, call.lse_name, "a bool", type(call.lse_flag).__name__)
    scale_f = check_float(call.scale, call.scale_name)
    n = _int(call.num_heads, heads_name)
    kv_n_in = _int(call.num_key_value_heads, "num_key_value_heads")
    if not 1 <= n <= MAX_HEADS:
        raise arg_error(ShapeError, heads_name, f"1 .. {MAX_HEADS}", n)
    kv_n = n if kv_n_in == 0 else kv_n_in
    if kv_n < 1 or n % kv_n or n // kv_n > MAX_GROUP:
        raise arg_error(ShapeError, "num_key_value_heads", f"0 or a divisor of N = {n} with N / KV_N <= {MAX_GROUP}",
                        kv_n_in)

    # ---- query, key, value
    query = required(call.query, "query")
    if call.quant is not None:  # v2 on a float query: query_quant_mode 0, no query scale
        if _int(call.quant[0], "query_quant_mode") != 0:
            raise arg_error(ModeError, "query_quant_mode", "0 with a float query", call.quant[0])
        if call.quant[1] is not None:
            raise arg_error(ModeError, "dequant_scale_query", "None with a float query", describe(call.quant[1]))
    check_dtype(query, "query", MHA_DTYPES + ((FULL_QUANT_DTYPE,) if call.quant is None else ()))
    qdt = dtype_name(query.dtype)
    lead, s1, d = _query_dims(query, q_layout, n, heads_name)
    key, value = required(call.key, "key"), required(call.value, "value")
    kv_dt = dtype_name(key.dtype)
    quantised = kv_dt in ANTIQUANT_DTYPES and qdt != FULL_QUANT_DTYPE  # kv antiquant (an int8 query: full quant)
    check_dtype(key, "key", (qdt, *ANTIQUANT_DTYPES))
    check_dtype(value, "value", (kv_dt,))
    aq = dict(call.antiquant or {})
    for name in [k for k in aq if "mode" in k]:
        if _int(aq.pop(name), name) != 0:
            raise arg_error(ModeError, name, "0 (per channel / per tensor; the other antiquant modes are not "
                            "emulated)", aq.get(name))
    if not quantised:
        for name, x in aq.items():
            if x is not None:
                raise arg_error(ModeError, name, f"None with {kv_dt} key / value (antiquant takes int8 or int4 "
                                "packed in int32)", describe(x))
    block_table = call.block_table
    paged = block_table is not None
    b_hint = 1 if q_layout == "NSD" else lead
    if paged:
        if q_layout in ("NTD", "NSD"):
            raise arg_error(ModeError, "block_table", f"None with input_layout={input_layout} (PageAttention takes "
                            "BSH, BSND, BNSD and TND queries)", describe(block_table))
        k_lay = _paged_kv(key, "key", q_layout, kv_n)
        v_lay = _paged_kv(value, "value", q_layout, kv_n)
        kd, dv = k_lay.dim, v_lay.dim
        if (v_lay.num_blocks, v_lay.block_size, v_lay.heads, value.ndim) != \
                (k_lay.num_blocks, k_lay.block_size, k_lay.heads, key.ndim):
            raise arg_error(ShapeError, "value", f"key's cache layout (nb = {k_lay.num_blocks}, bs = "
                            f"{k_lay.block_size}, KV_N = {kv_n})", list(value.shape))
        s2 = None
    else:
        s2, kd = _dense_kv(key, "key", q_layout, b_hint, kv_n)
        s2v, dv = _dense_kv(value, "value", q_layout, b_hint, kv_n)
        if s2v != s2:
            raise arg_error(ShapeError, "value", f"key's KV_S = {s2}", list(value.shape))
    if quantised:
        per = 8 if kv_dt == "int32" else 1  # int4 values per element
        kd, dv = kd * per, dv * per
    if kd != d:
        raise arg_error(ShapeError, "key", f"query's D = {d}" + (" (8 int4 per int32)" if quantised and
                                                                     kv_dt == "int32" else ""), list(key.shape))
    if packed:
        pairs = [p for p in PACKED_HEAD_DIMS if not (q_layout == "NTD" and p == (192, 192))]
        if (d, dv) not in pairs:
            raise arg_error(ShapeError, "value", f"(Q_D, V_D) in {pairs} for {input_layout} (the TND constraints)",
                            f"Q_D = {d}, V_D = {dv}")
    else:
        align = HEAD_DIM_ALIGN_BYTES // query.dtype.itemsize
        if not (1 <= d <= MAX_HEAD_DIM and d % align == 0):
            raise arg_error(ShapeError, "query", f"D a multiple of {align} in [{align}, {MAX_HEAD_DIM}] (16 bytes)",
                            f"D = {d}")
        if dv != d:
            if (d, dv) not in UNEQUAL_HEAD_DIMS_950:
                raise arg_error(ShapeError, "value", f"query's D = {d} (value's D differs only as "
                                f"{list(UNEQUAL_HEAD_DIMS_950)} on the Ascend 950)", f"V_D = {dv}")
            soc.require_ascend950("value", f"V_D = {dv} with Q_D = {d}", "an Ascend 950 head-dim pair")

    antiquant = _antiquant(aq, kv_dt, qdt, kv_n, d, dv, paged, packed, int(s1)) if quantised else None
    quant = check_quant(call, qdt=qdt, kv_dt=kv_dt, input_layout=input_layout, s1=int(s1), n=n, d=int(d),
                        dv=int(dv), paged=paged, packed=packed, lse_flag=bool(call.lse_flag))

    if input_layout in QS_LIMITED_LAYOUTS and not soc.is_ascend950():
        lo, hi = QS_LIMITED_LAYOUTS[input_layout]
        if not lo <= s1 <= hi:
            raise arg_error(ShapeError, "query", f"Q_S in [{lo}, {hi}] for input_layout={input_layout} (the A2 / A3 "
                            "layout table)", f"Q_S = {s1}")

    # ---- lengths
    act_q_in, act_kv_in = call.act_q, call.act_kv
    if packed:
        act_q = _packed_lengths(act_q_in, call.act_q_name, int(lead), "prefix sums [B]")
        b = int(act_q.size)
        s1 = int(act_q.max())
        q_start = np.cumsum(act_q) - act_q
    else:
        b = int(b_hint)
        if not 1 <= b <= MAX_BATCH:
            raise arg_error(ShapeError, "query", f"B in [1, {MAX_BATCH}]", list(query.shape))
        act_q = _bcast_lengths(act_q_in, call.act_q_name, b, int(s1), "a query length")
        q_start = np.arange(b, dtype=np.int64) * s1
    kv_blocks, kv_rows, bs = None, None, 0
    bsz = _int(call.block_size, "block_size")
    if paged:
        if act_kv_in is None:
            raise arg_error(ShapeError, call.act_kv_name, "per-request kv lengths [B] (required with block_table)",
                            None)
        act_kv = _packed_lengths(act_kv_in, call.act_kv_name, None, "") if packed else \
            _bcast_lengths(act_kv_in, call.act_kv_name, b, np.iinfo(np.int64).max, "a kv length")
        if act_kv.size != b:
            raise arg_error(ShapeError, call.act_kv_name, f"{b} lengths (one per request)", int(act_kv.size))
        table = required(block_table, "block_table")
        check_dtype(table, "block_table", ("int32",))
        if table.ndim != 2 or table.shape[0] != b or table.shape[1] == 0:
            raise arg_error(ShapeError, "block_table", f"[B={b}, max_blocks >= 1]", list(table.shape))
        bs = k_lay.block_size
        if bsz != bs:
            raise arg_error(ShapeError, "block_size", f"the caches' block dim bs = {bs}", bsz)
        align = PREFILL_BLOCK_ALIGN if (not packed and s1 > 1) else \
            (ANTIQUANT_PAGED_BLOCK_ALIGN if quantised else BLOCK_SIZE_ALIGN)
        if bs % align or not align <= bs <= MAX_BLOCK_SIZE:
            raise arg_error(ShapeError, "block_size", f"a multiple of {align} in [{align}, {MAX_BLOCK_SIZE}]", bs)
        cap = int(table.shape[1]) * bs
        bad = act_kv > cap
        if bad.any():
            i = int(np.argmax(bad))
            raise arg_error(ShapeError, f"{call.act_kv_name}[{i}]", f"a kv length in [0, {cap}] (block_table's "
                            f"{table.shape[1]} blocks of {bs})", int(act_kv[i]))
        kv_blocks = blocks_from_block_table(table, act_kv, bs, k_lay.num_blocks, name="block_table")
        layouts = (k_lay, v_lay)
        kv_cap = cap
    else:
        if bsz != 0:
            raise arg_error(ModeError, "block_size", "0 without block_table", bsz)
        table = None
        if packed:
            act_kv = _packed_lengths(act_kv_in, call.act_kv_name, int(s2), "prefix sums [B]")
            if act_kv.size != b:
                raise arg_error(ShapeError, call.act_kv_name, f"{b} prefix sums (one per request)", int(act_kv.size))
            starts = np.cumsum(act_kv) - act_kv
        else:
            act_kv = _bcast_lengths(act_kv_in, call.act_kv_name, b, int(s2), "a kv length")
            starts = np.arange(b, dtype=np.int64) * s2
        width = max(int(act_kv.max()), 1)
        pos = np.arange(width)[None, :]
        kv_rows = np.where(pos < act_kv[:, None], starts[:, None] + pos, -1).astype(np.int64)
        t2 = int(s2) * (1 if packed or q_layout == "NSD" else b)
        layouts = tuple(CacheLayout.from_declared("TND", (t2, kv_n, dd), query.dtype.itemsize, name=name)
                        for name, dd in (("key", d), ("value", dv)))
        kv_cap = int(s2)

    # ---- mask and row rule
    mask = call.atten_mask
    rule, m3 = "all", None
    if sm in CAUSAL_MODES:
        if mask is not None:
            if not isinstance(mask, np.ndarray):
                raise arg_error(DTypeError, "atten_mask", "None or a bool / int8 / uint8 array", describe(mask))
            check_dtype(mask, "atten_mask", MASK_DTYPES)
            size = CAUSAL_MASK_SIZE
            if mask.reshape(-1, *mask.shape[-2:]).shape != (1, size, size) or mask.ndim > 4:
                raise arg_error(ShapeError, "atten_mask", f"the optimised causal mask [{size}, {size}] (or with "
                                f"leading 1s; sparse_mode {sm})", list(mask.shape))
            if not np.array_equal(mask.reshape(size, size).astype(bool), _causal_mask()):
                raise arg_error(ModeError, "atten_mask", "1 strictly above the diagonal, 0 elsewhere (the optimised "
                                "causal mask)", describe(mask))
        rule = CAUSAL_MODES[sm] if (packed or s1 > 1) else "all"
    elif mask is not None or sm == 1:
        if mask is None:
            raise arg_error(ModeError, "atten_mask", "a mask (sparse_mode 1, allMask)", None)
        if packed:
            raise arg_error(ModeError, "atten_mask", f"None with sparse_mode {sm} for {input_layout} (an explicit "
                            "mask is emulated with B-first layouts)", describe(mask))
        m3 = _explicit_mask(mask, b, int(s1), kv_cap, paged)
        if sm == 0 and s1 > 1:
            need = int(s1) + int(m3.shape[-1])
            for name, got in (("pre_tokens", pre), ("next_tokens", nxt)):
                if got < need:
                    raise arg_error(ModeError, name, f">= Q_S + KV_S = {need} with sparse_mode 0 and a mask (a "
                                    "narrower band is not emulated)", got)
        _check_live_rows(m3, act_q, act_kv)

    if quant.get("quant_out") is not None:
        if rule == "band" and min(pre, nxt) < 0:
            raise arg_error(ModeError, "pre_tokens" if pre < 0 else "next_tokens", ">= 0 with sparse_mode 4 and an "
                            "int8 output (the doc's int8 constraints)", min(pre, nxt))
        check_offset_rows(quant["quant_out"], list(call.quant_out)[1], act_q, act_kv, int(s1),
                          lambda nq, kv: row_limits(rule, nq, kv, pre, nxt))

    # ---- learnable_sink
    sink_f = None
    if sink is not None:
        sink = required(sink, "learnable_sink")
        check_dtype(sink, "learnable_sink", (SINK_DTYPE,))
        if input_layout not in SINK_LAYOUTS or dv > SINK_MAX_VALUE_DIM:
            raise arg_error(ModeError, "learnable_sink", f"None unless input_layout is one of {list(SINK_LAYOUTS)} "
                            f"with value D <= {SINK_MAX_VALUE_DIM}", f"{input_layout}, V_D = {dv}")
        if sink.shape != (n,):
            raise arg_error(ShapeError, "learnable_sink", f"[N] = [{n}]", list(sink.shape))
        sink_f = sink.astype(np.float32)
        if not np.isfinite(sink_f).all():
            raise arg_error(DTypeError, "learnable_sink", "finite values", describe(sink))

    # ---- output shapes
    t = int(lead) if packed else b * int(s1)
    out_shape = {"BSH": (b, s1, n * dv), "BSND": (b, s1, n, dv), "BNSD": (b, n, s1, dv), "TND": (t, n, dv),
                 "NBSD": (n, b, s1, dv), "NTD": (n, t, dv), "NSD": (n, s1, dv)}[out_layout]
    lse_shape = ((t, n, 1) if packed else (b, n, s1, 1)) if call.lse_flag else (0,)
    return FusedInferAttentionArgs(
        op=call.op, query=query, query_rope=None, key=key, value=value, key_rope=None, atten_mask=mask,
        block_table=table, actual_seq_lengths=act_q_in, actual_seq_lengths_kv=act_kv_in, num_heads=n,
        num_kv_heads=kv_n, scale=scale_f, input_layout=input_layout, query_layout=q_layout, out_layout=out_layout,
        key_layout=layouts[0], value_layout=layouts[1], rope_layout=None, block_size=bs, sparse_mode=sm,
        softmax_lse_flag=bool(call.lse_flag), batch=b, seq_q=int(s1), head_dim=int(d), act_q=act_q.astype(np.int64),
        act_kv=act_kv.astype(np.int64), q_start=q_start.astype(np.int64), kv_blocks=kv_blocks, kv_rows=kv_rows,
        out_shape=tuple(int(x) for x in out_shape), lse_shape=tuple(int(x) for x in lse_shape), value_dim=int(dv),
        row_rule=rule, mask=m3, sink=sink_f, pre_tokens=pre, next_tokens=nxt, kv_antiquant=antiquant,
        kv_antiquant_given={k: v for k, v in aq.items() if v is not None} if quantised else None, **quant)


def _antiquant(aq: dict, kv_dt: str, qdt: str, kv_n: int, d: int, dv: int, paged: bool, packed: bool, s1: int):
    """The separated kv antiquant of an int8 / int32 key and value: ``(key scale, key offset,
    value scale, value offset)`` as fp32 ``[KV_N, D]`` (offsets None when not given). Paged
    caches: int8 only, decode only (the doc's PageAttention table: antiquant with Q_S = 1 and an
    int8 kv; "int4 kv ... 不支持 page attention"), block_size a multiple of
    :data:`ANTIQUANT_PAGED_BLOCK_ALIGN`; TND / NTD take none (the doc's TND constraints)."""
    names = list(aq)  # key scale, key offset, value scale, value offset (v1 or v2 names)
    if packed:
        raise arg_error(ModeError, names[0], "None with a TND / NTD layout (the doc's TND constraints take no "
                        "antiquant)", describe(aq[names[0]]))
    if paged and (s1 != 1 or kv_dt != "int8"):
        raise arg_error(ModeError, names[0], "None with a paged cache unless Q_S = 1 with an int8 key / value (the "
                        "doc's PageAttention table; int4 kv takes no PageAttention)",
                        f"Q_S = {s1}, {kv_dt} key / value")
    if d != dv:
        raise arg_error(ShapeError, "value", f"key's D = {d} with antiquant", f"V_D = {dv}")
    align = ANTIQUANT_D_ALIGN[kv_dt]
    if d % align:
        raise arg_error(ShapeError, "key", f"D a multiple of {align} ({kv_dt} antiquant)", f"D = {d}")
    out = []
    for i, name in enumerate(names):
        x = aq[name]
        if x is None:
            if i % 2 == 0:
                raise arg_error(ModeError, name, f"a scale (the {kv_dt} key / value need both scales)", None)
            out.append(None)
            continue
        x = required(x, name)
        check_dtype(x, name, (qdt,))
        if x.size not in (1, kv_n * d) or (x.size > 1 and x.shape not in (
                (kv_n * d,), (1, kv_n * d), (kv_n, d), (kv_n, 1, d), (1, kv_n, 1, d))):
            raise arg_error(ShapeError, name, f"per tensor (one value) or per channel: [{kv_n * d}], [1, {kv_n * d}], "
                            f"[{kv_n}, {d}], [{kv_n}, 1, {d}] or [1, {kv_n}, 1, {d}]", list(x.shape))
        f = np.broadcast_to(x.astype(np.float32).reshape(kv_n, d) if x.size > 1 else x.astype(np.float32).reshape(1, 1),
                            (kv_n, d))
        if not np.isfinite(f).all():
            raise arg_error(DTypeError, name, "finite values", describe(x))
        out.append(np.ascontiguousarray(f))
    for i in (1, 3):
        if out[i] is not None and (aq[names[i]].size == 1) != (aq[names[i - 1]].size == 1):
            raise arg_error(ShapeError, names[i], f"{names[i - 1]}'s granularity (per tensor or per channel)",
                            list(aq[names[i]].shape))
    return tuple(out)


# ---------------------------------------------------------------------- output shapes (infer_output, fakes)
#: input_layout -> (query layout, attention_out layout, query dims) of the meta function's map
#: (``get_query_and_attention_out_layout``; the MLA layouts included).
OUTPUT_LAYOUTS = {name: (q, o, 3 if q in ("BSH", "TND", "NTD", "NSD") else 4)
                  for name, (q, o) in MHA_LAYOUTS.items()}


def output_shapes(query_shape, value_shape, paged: bool, input_layout: str, num_heads: int,
                  num_key_value_heads: int, lse_flag: bool, *, name: str = "input_layout"):
    """``(attention_out shape, softmax_lse shape)`` as the meta functions infer them
    (``npu_fused_infer_attention_score_forward`` / ``_v2_forward``: ``get_value_d``,
    ``infer_attention_out_shape``, ``infer_lse_out_shape``) from the query's and value's shapes:
    value D from the paged cache (``[nb, bs, KV_N*D]``, ``[nb, KV_N, bs, D]``, NZ ``[nb, KV_N,
    D/C0, bs, C0]``) or the value in the query's layout; lse ``[T, N, 1]`` (TND / NTD queries),
    ``[B, N, S1, 1]`` or ``[0]`` without the flag.

    Raises:
        ModeError: an input_layout outside the map or not matching the query's dims (named ``name``).
        ShapeError: ``num_heads`` < 1.
    """
    if input_layout not in OUTPUT_LAYOUTS or len(query_shape) != OUTPUT_LAYOUTS[input_layout][2]:
        raise arg_error(ModeError, name, f"one of {list(OUTPUT_LAYOUTS)} matching query's dims",
                        f"{input_layout!r} with a {len(query_shape)}-D query")
    if num_heads < 1:
        raise arg_error(ShapeError, "num_heads", ">= 1", num_heads)
    q_layout, out_layout, _ = OUTPUT_LAYOUTS[input_layout]
    kv_n = num_heads if num_key_value_heads == 0 else num_key_value_heads
    v = tuple(value_shape)
    if paged:
        value_d = {3: lambda: v[2] // kv_n, 4: lambda: v[3], 5: lambda: v[2] * v[4]}.get(len(v), lambda: 0)()
    elif q_layout == "BSH":
        value_d = v[2] // kv_n
    else:
        value_d = v[3] if q_layout in ("BNSD", "BSND") else v[2]
    q = tuple(query_shape)
    if q_layout in PACKED_LAYOUTS:
        t, n1, d1 = (q[0], q[1], q[2]) if q_layout == "TND" else (q[1], q[0], q[2])
        b = s1 = 0
    else:
        b, s1, n1, d1 = {"BSH": lambda: (q[0], q[1], num_heads, q[2] // num_heads), "BSND": lambda: q,
                         "BNSD": lambda: (q[0], q[2], q[1], q[3]), "NSD": lambda: (1, q[1], q[0], q[2])}[q_layout]()
        t = 0
    out_d = d1 if (value_d == 0 or d1 == 0) else value_d
    out = {"BSH": lambda: [b, s1, n1 * value_d if n1 * value_d and q[2] else q[2]],
           "BSND": lambda: [b, s1, n1, out_d], "BNSD": lambda: [b, n1, s1, out_d], "NBSD": lambda: [n1, b, s1, out_d],
           "TND": lambda: [t, n1, out_d], "NTD": lambda: [n1, t, out_d], "NSD": lambda: [n1, s1, out_d]}[out_layout]()
    if not lse_flag:
        lse = [0]
    elif q_layout in PACKED_LAYOUTS:
        lse = [t, n1, 1]
    else:
        lse = [b, n1, s1, 1]
    return [int(x) for x in out], [int(x) for x in lse]
