"""DeepSeek-V4's ``kv_compress_epilog`` on the CPU: the work behind :mod:`ascend_emu.ops.kv_compress_epilog`
(and the byte scatter :mod:`.indexer_compress_epilog` shares).

quant_mode 2 (the 640-byte rows of layout 1 and the split of layout 2: vllm-ascend's path) runs
in one Numba pass per call (:func:`mode2_rows`), quant_mode 1 in the fp32-scale pass
(:func:`indexer_fp8_rows`), quant_mode 3 (HiF8) in :func:`hif8_rows` (a table of the code of
every fp32 magnitude's upper 12 bits, :func:`hif8_codes`): each token's groups are quantized and their bytes
stored straight at their offsets in the cache (the slots are distinct, so the order does not
matter). The Numba passes compute what the codecs of :mod:`ascend_emu.quant.v4` compute,
operation for operation (fp32 arithmetic, the kernel's E8M0 step, RNE to fp8 by
:func:`f32_to_fp8_bits`, HiF8's ties away from zero);
``tests/test_v4_writers.py`` holds them to the
reference. One kernel per quant serves every placement: a slot's value and scale offsets come
from one parameter vector (:func:`place`, :data:`GEO_FIELDS`), so layout 1, layout 2 and the
indexer caches differ only in it. The per-element loops run branch-free over slices (so that
they vectorise: about 0.25 us per 640-byte row on the 2-core EPYC of docs/performance.md, three
times the per-element version they replaced). ``benchmarks/bench_v4_writers.py`` measures them
against a copy floor.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..ops._v4_writers import V4WriterArgs, V4WriterOutputs
from ..quant import v4 as codec
from ..quant.fp8 import FP8_MAX
from ..quant.hifloat8 import to_hif8
from .kernels import widen_row


def as_bytes(a: np.ndarray) -> np.ndarray:
    """The caller's C-contiguous array as a flat uint8 view (writes land in it)."""
    return a.reshape(-1).view(np.uint8)


# ---------------------------------------------------------------------- Numba kernels
#: fp8 element formats for :func:`f32_to_fp8_bits`: (mantissa bits, exponent bias, largest finite
#: code, the code a larger magnitude takes: E4M3FN NaN 0x7F, E5M2 +Inf 0x7C).
FP8_FORMATS = {"float8_e4m3fn": (3, 7, 0x7E, 0x7F), "float8_e5m2": (2, 15, 0x7B, 0x7C)}


@njit(cache=True, inline="always")
def f32_to_fp8_bits(x, mant, bias, top, over):
    """The fp8 code (uint8) of finite fp32 ``x``: round to nearest, ties to even on the bits
    (what ``ml_dtypes``' cast computes for finite inputs; :func:`ascend_emu.quant.fp8.to_fp8`):
    magnitudes past the largest finite code give ``over`` (E4M3FN NaN, E5M2 Inf), the sign is
    kept (signed zeros included). Without branches (the loops calling it vectorise): a normal
    result rounds the magnitude's bits to ``mant`` bits (ties to even) and rebiases; below the
    smallest normal one fp32 addition of ``2**(emin - mant + 23)`` rounds the magnitude to the
    fp8 subnormal spacing (one rounding, ties to even). ``tests/test_v4_writers.py`` checks it
    against ``to_fp8``."""
    u = np.float32(x).view(np.uint32)
    sign = np.uint32((u >> np.uint32(24)) & np.uint32(0x80))
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    drop = np.int64(23 - mant)
    normal = ((np.int64(a) + ((np.int64(1) << (drop - 1)) - 1) + ((np.int64(a) >> drop) & 1)) >> drop) \
        - ((127 - bias) << mant)
    magic = np.uint32((127 + 1 - bias - mant + 23) << 23)
    f = np.float32(a.view(np.float32) + magic.view(np.float32))
    sub = np.int64(f.view(np.uint32)) - np.int64(magic)
    code = sub if a < np.uint32((127 + 1 - bias) << 23) else normal
    code = over if code > top else code
    return np.uint8(sign | np.uint32(code))


#: Fields of the ``geo`` int64 vector the writer kernels read (:func:`place`): rows a block, then
#: per part (values, scales) the bytes a block, the part's offset in a block, the bytes a row.
GEO_FIELDS = ("block_size", "value_stride", "value_base", "value_row", "scale_stride", "scale_base", "scale_row")


@njit(cache=True, inline="always")
def place(geo, slot):
    """Flat byte offsets of slot ``slot``'s value part and scale part (``geo``: :data:`GEO_FIELDS`)."""
    blk = slot // geo[0]
    off = slot - blk * geo[0]
    return blk * geo[1] + geo[2] + off * geo[3], blk * geo[4] + geo[5] + off * geo[6]


@njit(cache=True, inline="always")
def put_rope(rope, xr, q):
    """The rope part of a row: ``xr[q:]``'s bf16 bits as little-endian bytes, as the cache holds
    them, into the uint8 slice ``rope`` (``2 * (len(xr) - q)`` bytes)."""
    for k in range(xr.shape[0] - q):
        h = xr[q + k]
        rope[2 * k] = np.uint8(h & 0xFF)
        rope[2 * k + 1] = np.uint8(h >> 8)


@njit(cache=True)
def mode2_rows(dst, scale_dst, xbits, tokens, slots, geo, top_f):  # pragma: no cover - compiled
    """E8M0-scaled fp8 rows (quant/v4.py's quant_mode 2 arithmetic, also the indexer's MX quant;
    one token at a time): the ``q`` fp8 codes of token ``tokens[i]`` into ``dst`` at its value
    offset (:func:`place` of ``slots[i]``), its ``d - q`` rope values (bf16 bits) at value offset
    + ``rope_rel``, its E8M0 bytes into ``scale_dst`` at its scale offset, then ``pad_len`` zeros
    (both flat uint8, possibly one array). ``xbits``: x's bits ``[T, d]`` (bf16, or fp16 when
    ``geo[16]``); ``geo``: :data:`GEO_FIELDS`, then ``q, group, round_scale, rope_rel, pad_len``,
    the fp8 format ``mant, bias, top, over`` (:data:`FP8_FORMATS`) and ``fp16``; ``top_f`` the
    format's largest finite value (fp32). The loops run over slices from 0 (indices Numba knows
    are not negative: no wrap-around test, so they vectorise)."""
    d = xbits.shape[1]
    q, group, round_scale, rope_rel, pad_len = geo[7], geo[8], geo[9] != 0, geo[10], geo[11]
    mant, bias, top, over, fp16 = geo[12], geo[13], geo[14], geo[15], geo[16] != 0
    inv = np.float32(np.float32(1.0) / top_f)
    groups = (q + group - 1) // group
    bits = np.empty(q, np.uint32)
    row = bits.view(np.float32)
    codes = np.empty(q, np.uint8)
    for i in range(tokens.shape[0]):
        xr = xbits[tokens[i]]
        voff, soff = place(geo, slots[i])
        widen_row(xr[:q], row, not fp16)
        scale_out = scale_dst[soff:soff + groups + pad_len]
        for g in range(groups):
            lo = g * group
            hi = min(lo + group, q)
            gb, gr, gc = bits[lo:hi], row[lo:hi], codes[lo:hi]
            # |x| of finite values orders as the magnitude's bits: an integer max
            m = np.uint32(0)
            for c in range(gb.shape[0]):
                a = np.uint32(gb[c] & np.uint32(0x7FFFFFFF))
                m = a if a > m else m
            amax = np.uint32(m).view(np.float32)
            amax = amax if amax >= np.float32(1e-4) else np.float32(1e-4)
            s = np.float32(amax * inv)
            exp = np.int64((s.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF))
            if round_scale:
                # the kernel's mask of the exponent field: +1 for every normal s (s >= 1e-4 / 57344
                # is normal); x / 2**k is x * 2**-k (2**-k a normal fp32: one rounding of one value)
                scale_out[g] = np.uint8((exp + 1) & 0xFF)
                mul = np.uint32(np.uint32(253 - exp) << np.uint32(23)).view(np.float32)
                for c in range(gr.shape[0]):
                    v = np.float32(gr[c] * mul)
                    v = top_f if v > top_f else v
                    v = -top_f if v < -top_f else v
                    gc[c] = f32_to_fp8_bits(v, mant, bias, top, over)
            else:
                scale_out[g] = np.uint8(exp)
                for c in range(gr.shape[0]):
                    v = np.float32(gr[c] / s)
                    v = top_f if v > top_f else v
                    v = -top_f if v < -top_f else v
                    gc[c] = f32_to_fp8_bits(v, mant, bias, top, over)
        values = dst[voff:voff + q]
        for c in range(q):
            values[c] = codes[c]
        put_rope(dst[voff + rope_rel:voff + rope_rel + 2 * (d - q)], xr, q)
        for k in range(pad_len):
            scale_out[groups + k] = 0


@njit(cache=True)
def indexer_fp8_rows(dst, scale_dst, xbits, tokens, slots, geo, inv):  # pragma: no cover - compiled
    """fp32-scaled fp8 rows: the indexer key quant (quant/v4.py ``indexer_quant_fp8``), also
    ``kv_compress_epilog`` quant_mode 1 (``_kv_mode1``, groups of 128 and a rope part) of each
    token: its first ``q`` values as fp8 codes into ``dst`` at its value offset (:func:`place` of
    ``slots[i]``), its ``d - q`` rope values (bf16 bits) at value offset + ``rope_rel``, its fp32
    scales (little-endian) into ``scale_dst`` at its scale offset, then ``pad_len`` zeros (both
    flat uint8, possibly one array). ``xbits``: x's bits ``[T, d]`` (bf16, or fp16 when
    ``geo[7]``); ``geo``: :data:`GEO_FIELDS`, then ``fp16``, the fp8 format ``mant, bias, top,
    over``, then ``q, rope_rel, pad_len``; ``inv``: fp32 ``1 / fp8 max`` as the kernel holds it."""
    d = xbits.shape[1]
    fp16 = geo[7] != 0
    mant, bias, top, over = geo[8], geo[9], geo[10], geo[11]
    q, rope_rel, pad_len = geo[12], geo[13], geo[14]
    groups = (q + 127) // 128
    bits = np.empty(q, np.uint32)
    row = bits.view(np.float32)
    codes = np.empty(q, np.uint8)
    scales = np.empty(groups, np.float32)
    for i in range(tokens.shape[0]):
        xr = xbits[tokens[i]]
        voff, soff = place(geo, slots[i])
        widen_row(xr[:q], row, not fp16)
        for g in range(groups):
            lo = g * 128
            hi = min(lo + 128, q)
            gb, gr, gc = bits[lo:hi], row[lo:hi], codes[lo:hi]
            m = np.uint32(0)
            for c in range(gb.shape[0]):
                a = np.uint32(gb[c] & np.uint32(0x7FFFFFFF))
                m = a if a > m else m
            s = np.float32(np.uint32(m).view(np.float32) * inv)  # 0 where amax is 0
            scales[g] = s
            keep = s == 0
            for c in range(gr.shape[0]):
                v = gr[c]
                w = np.float32(v / s)
                # the kernel's Select: a zero scale or a non-finite quotient (all exponent bits
                # set) keeps x; tested on the bits, without a branch
                inf_nan = (w.view(np.uint32) & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
                v = v if (keep | inf_nan) else w
                gc[c] = f32_to_fp8_bits(v, mant, bias, top, over)
        values = dst[voff:voff + q]
        for c in range(q):
            values[c] = codes[c]
        put_rope(dst[voff + rope_rel:voff + rope_rel + 2 * (d - q)], xr, q)
        scale_bytes = scales.view(np.uint8)
        scale_out = scale_dst[soff:soff + 4 * groups + pad_len]
        for k in range(4 * groups):
            scale_out[k] = scale_bytes[k]
        for k in range(pad_len):
            scale_out[4 * groups + k] = 0


#: :func:`hif8_codes`' index: a magnitude's bits above this (8 exponent and 4 mantissa bits).
HIF8_INDEX_SHIFT = 19


@njit(cache=True)
def hif8_rows(dst, xbits, tokens, slots, width, scale, table):  # pragma: no cover - compiled
    """quant_mode 3 rows (quant/v4.py: HiF8 codes of ``fl32(x * scale)``) into ``dst`` (flat
    uint8) at ``slots[i] * width``: ``xbits`` x's bf16 bits ``[T, d]``, ``scale`` fp32, ``table``
    :func:`hif8_codes`, looked up by the product's upper magnitude bits (a NaN by its whole
    magnitude); a negative product takes the sign bit
    unless its code is 0x00 (no -0) or 0x80 (NaN)."""
    d = xbits.shape[1]
    for i in range(tokens.shape[0]):
        xr = xbits[tokens[i]]
        out = dst[slots[i] * width:slots[i] * width + d]
        for c in range(d):
            v = np.float32(np.uint32(np.uint32(xr[c]) << np.uint32(16)).view(np.float32) * scale)
            u = v.view(np.uint32)
            mag = np.uint32(u & np.uint32(0x7FFFFFFF))
            code = np.uint32(table[mag >> np.uint32(HIF8_INDEX_SHIFT)])
            nan = np.uint32(mag > np.uint32(0x7F800000))  # also a NaN whose payload is all low bits
            code = (code & (nan - np.uint32(1))) | (nan << np.uint32(7))
            # the sign, without a branch (signs are random): not on 0x00 (no -0) nor 0x80 (NaN)
            signed = np.uint32(code != np.uint32(0)) & np.uint32(code != np.uint32(0x80))
            out[c] = np.uint8(code | (((u >> np.uint32(31)) & signed) << np.uint32(7)))


@functools.lru_cache(maxsize=None)
def hif8_codes() -> np.ndarray:
    """uint8 ``[4096]``: :func:`ascend_emu.quant.hifloat8.to_hif8` of every non-negative fp32
    magnitude whose bits below the top 4 mantissa bits are zero, indexed by those upper 12
    magnitude bits (read-only). It decides every fp32 magnitude by those bits: HiF8 values have
    at most 4 significant bits, so every rounding boundary (the midpoint of two neighbouring
    values, at most 5) has at most 4 mantissa bits, and the fp32 values sharing the upper 12 bits
    lie on one side of each boundary (at or above one that equals the prefix: a tie, rounded
    away from zero as :func:`~ascend_emu.quant.hifloat8.to_hif8` does); only a NaN whose payload
    lies in the low bits reads as Inf here (:func:`hif8_rows` tests for it). 4 KiB: the lookups
    stay in L1. ``tests/test_v4_writers.py`` checks the pass against ``to_hif8``."""
    values = (np.arange(1 << 12, dtype=np.uint32) << np.uint32(HIF8_INDEX_SHIFT)).view(np.float32)
    codes = to_hif8(values)
    codes.flags.writeable = False
    return codes


@functools.lru_cache(maxsize=256)
def geometry(*fields: int) -> np.ndarray:
    """The kernels' int64 parameter vector ``fields`` (read-only; one per distinct call form)."""
    g = np.array(fields, np.int64)
    g.flags.writeable = False
    return g


def mode2(args: V4WriterArgs, dst: np.ndarray, scale_dst: np.ndarray, placement: tuple, q: int, rope_rel: int,
          pad_len: int) -> None:
    """Run :func:`mode2_rows` for the tokens of ``args`` (its group, round_scale, fp8 type):
    ``placement`` the :data:`GEO_FIELDS`, ``q`` the values quantized of each row."""
    geo = geometry(*placement, q, int(args.group), int(args.round_scale), rope_rel, pad_len, *FP8_FORMATS[args.fp8],
                   int(args.x.dtype == np.float16))
    mode2_rows(dst, scale_dst, np.ascontiguousarray(args.x).view(np.uint16), args.tokens, args.slots, geo,
               np.float32(FP8_MAX[args.fp8]))


def fp32_scaled(args: V4WriterArgs, dst: np.ndarray, scale_dst: np.ndarray, placement: tuple, inv: np.float32,
                q: int, rope_rel: int = 0, pad_len: int = 0) -> None:
    """Run :func:`indexer_fp8_rows` for the tokens of ``args`` (its fp8 type): ``placement`` the
    :data:`GEO_FIELDS`, ``inv`` the fp32 ``1 / fp8 max``, ``q`` the values quantized of each row."""
    geo = geometry(*placement, int(args.x.dtype == np.float16), *FP8_FORMATS[args.fp8], q, rope_rel, pad_len)
    indexer_fp8_rows(dst, scale_dst, np.ascontiguousarray(args.x).view(np.uint16), args.tokens, args.slots, geo, inv)


@functools.lru_cache(maxsize=256)
def _kv_form(kind: str, quant_mode: int, d: int, group: int, block_size: int, block_stride: int, fp8: str,
             round_scale: bool) -> tuple:
    """``(kernel, geo, fp32 parameter)`` of a quant_mode 1 / 2 call form: :func:`mode2_rows` with
    ``top_f`` or :func:`indexer_fp8_rows` with ``1 / fp8 max`` (quant/v4.py ``_kv_mode1``), and
    their parameter vector for layout 1 rows of ``kv_row_bytes`` bytes (quant_mode 2: rope,
    values, E8M0 bytes, zeros; quant_mode 1: values, rope, fp32 scales, zeros) or layout 2's split
    (:func:`ascend_emu.quant.v4.kv_layout2_geometry`)."""
    q = d - codec.KV_ROPE_DIM
    rope = codec.KV_ROPE_BYTES
    if kind == "kv_layout2":
        geo = codec.kv_layout2_geometry(d, block_size, block_stride, group)
        placement, rope_rel, pad_len = ((block_size, block_stride, 0, geo["value_row"], block_stride, geo["scale_base"],
                                         geo["scale_row"]), q, geo["scale_row"] - geo["scale_count"])
    else:
        width = codec.kv_row_bytes(d, quant_mode, group)
        n = -(-q // group)
        if quant_mode == 2:
            placement, rope_rel, pad_len = (1, width, rope, 0, width, rope + q, 0), -rope, width - (rope + q + n)
        else:
            placement, rope_rel, pad_len = (1, width, 0, 0, width, q + rope, 0), q, width - (q + rope + 4 * n)
    fmt = FP8_FORMATS[fp8]
    top_f = np.float32(FP8_MAX[fp8])
    if quant_mode == 2:
        return mode2_rows, geometry(*placement, q, group, int(round_scale), rope_rel, pad_len, *fmt, 0), top_f
    return indexer_fp8_rows, geometry(*placement, 0, *fmt, q, rope_rel, pad_len), np.float32(np.float32(1.0) / top_f)


def kv_compress_epilog(args: V4WriterArgs) -> V4WriterOutputs:
    """Encode ``x[tokens]`` and write it at ``slots`` (module doc); returns the cache."""
    slots = args.slots
    if not slots.size:
        return V4WriterOutputs((args.cache,))
    if args.kind not in ("kv_rows", "kv_layout2"):
        raise AssertionError(f"kv_compress_epilog backend: unknown kind {args.kind!r}")
    flat = as_bytes(args.cache)
    xbits = np.ascontiguousarray(args.x).view(np.uint16)  # bf16 (the op's only x dtype)
    if args.quant_mode == 3:  # HiF8 rows of d bytes
        hif8_rows(flat, xbits, args.tokens, slots, args.x.shape[1], np.float32(args.scale), hif8_codes())
        return V4WriterOutputs((args.cache,))
    kernel, geo, param = _kv_form(args.kind, args.quant_mode, args.x.shape[1], args.group, args.block_size,
                                  args.block_stride, args.fp8, args.round_scale)
    kernel(flat, flat, xbits, args.tokens, slots, geo, param)
    return V4WriterOutputs((args.cache,))
