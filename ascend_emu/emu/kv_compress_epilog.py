"""DeepSeek-V4's ``kv_compress_epilog`` on the CPU: the work behind :mod:`ascend_emu.ops.kv_compress_epilog`
(and the byte scatter :mod:`.indexer_compress_epilog` shares).

quant_mode 2 (the 640-byte rows of layout 1 and the split of layout 2: vllm-ascend's path) runs
in one Numba pass per call (:func:`mode2_rows`): each token's groups are quantized and their
bytes stored straight at their offsets in the cache (the slots are distinct, so the order does
not matter). quant_mode 1 and 3 encode the rows with the vectorised codecs of
:mod:`ascend_emu.quant.v4` and copy them with one fancy-indexed assignment. The Numba pass
computes what the codec computes, operation for operation (fp32 arithmetic, the kernel's E8M0
step, RNE to fp8 by :func:`f32_to_fp8_bits`); ``tests/test_v4_writers.py`` holds both to the
reference. ``benchmarks/bench_v4_writers.py`` measures them against a copy floor.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..ops._v4_writers import V4WriterArgs, V4WriterOutputs
from ..quant import v4 as codec
from ..quant.fp8 import FP8_MAX, to_fp8


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
    kept (signed zeros included). ``tests/test_v4_writers.py`` checks it against ``to_fp8``."""
    u = np.float32(x).view(np.uint32)
    sign = np.uint32((u >> np.uint32(24)) & np.uint32(0x80))
    e32 = np.int64((u >> np.uint32(23)) & np.uint32(0xFF))
    if e32 == 0:  # fp32 zero or subnormal: far below half the smallest fp8 subnormal
        return np.uint8(sign)
    sig = np.int64(u & np.uint32(0x7FFFFF)) | np.int64(0x800000)
    e = e32 - 127
    emin = 1 - bias
    drop = 23 - mant + (emin - e if e < emin else 0)
    if drop > 25:
        return np.uint8(sign)
    # ties to even without a branch: add half - 1, plus 1 when the kept part is odd, then cut
    q = (sig + ((np.int64(1) << (drop - 1)) - 1) + ((sig >> drop) & 1)) >> drop
    if e < emin:
        code = q
    else:
        code = ((e + bias) << mant) + q - (np.int64(1) << mant)
    if code > top:
        code = over
    return np.uint8(sign | np.uint32(code))


@njit(cache=True)
def mode2_rows(dst, xbits, tokens, value_off, rope_off, scale_off, pad_off, pad_len, q, group, inv, top_f,
               round_scale, mant, bias, top, over, bf16_codes):  # pragma: no cover - compiled
    """quant_mode 2 rows (quant/v4.py's arithmetic, one token at a time) written into ``dst``
    (flat uint8): the ``q`` fp8 codes of token ``i`` at ``value_off[i]``, its 64 rope values (bf16
    bits, 128 bytes) at ``rope_off[i]``, its E8M0 bytes at ``scale_off[i]``, then ``pad_len``
    zeros at ``pad_off[i]``. ``xbits``: x's bf16 bits ``[T, d]``; ``bf16_codes``: the fp8 code of
    every bf16 value (:func:`bf16_fp8_codes`)."""
    d = xbits.shape[1]
    groups = (q + group - 1) // group
    row = np.empty(q, np.float32)
    for i in range(tokens.shape[0]):
        t = tokens[i]
        for c in range(q):
            row[c] = np.uint32(np.uint32(xbits[t, c]) << np.uint32(16)).view(np.float32)
        for g in range(groups):
            lo = g * group
            hi = min(lo + group, q)
            amax = np.float32(0.0)
            for c in range(lo, hi):
                amax = max(amax, abs(row[c]))
            if amax < np.float32(1e-4):
                amax = np.float32(1e-4)
            s = np.float32(amax * inv)
            exp = np.int64((s.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF))
            dst[scale_off[i] + g] = np.uint8((exp + 1) & 0xFF if round_scale else exp)
            if round_scale:
                # the kernel's mask of the exponent field: +1 for every normal s (s >= 1e-4 / 57344
                # is normal); x / 2**k is x * 2**-k exactly (one rounding of the same value)
                # x * 2**-k of a bf16 x is a bf16 value (below 2**-126 it rounds to a signed zero
                # either way): its fp8 code is bf16_codes[its upper 16 bits]
                mul = np.uint32(np.uint32(253 - exp) << np.uint32(23)).view(np.float32)
                for c in range(lo, hi):
                    v = np.float32(row[c] * mul)
                    v = min(max(v, -top_f), top_f)
                    dst[value_off[i] + c] = bf16_codes[np.float32(v).view(np.uint32) >> np.uint32(16)]
            else:
                for c in range(lo, hi):
                    v = np.float32(row[c] / s)
                    v = min(max(v, -top_f), top_f)
                    dst[value_off[i] + c] = f32_to_fp8_bits(v, mant, bias, top, over)
        for k in range(d - q):
            h = xbits[t, q + k]
            dst[rope_off[i] + 2 * k] = np.uint8(h & 0xFF)
            dst[rope_off[i] + 2 * k + 1] = np.uint8(h >> 8)
        for k in range(pad_len):
            dst[pad_off[i] + k] = np.uint8(0)


@njit(cache=True)
def indexer_fp8_rows(dst, scale_dst, x32, tokens, value_off, scale_off, inv, mant, bias, top, over
                     ):  # pragma: no cover - compiled
    """The indexer key quant (quant/v4.py ``indexer_quant_fp8``) of each token: its ``d`` fp8
    codes into ``dst`` at ``value_off[i]``, its fp32 scales (little-endian) into ``scale_dst`` at
    ``scale_off[i]`` (both flat uint8). ``x32``: x as fp32 ``[T, d]``."""
    d = x32.shape[1]
    groups = (d + 127) // 128
    for i in range(tokens.shape[0]):
        t = tokens[i]
        for g in range(groups):
            lo = g * 128
            hi = min(lo + 128, d)
            amax = np.float32(0.0)
            for c in range(lo, hi):
                a = abs(x32[t, c])
                if a > amax:
                    amax = a
            s = np.float32(amax * inv)  # 0 where amax is 0
            sb = s.view(np.uint32)
            for b in range(4):
                scale_dst[scale_off[i] + 4 * g + b] = np.uint8((sb >> np.uint32(8 * b)) & np.uint32(0xFF))
            for c in range(lo, hi):
                v = x32[t, c]
                if s != 0:
                    w = np.float32(v / s)
                    if np.isfinite(w):  # the kernel's Select: a non-finite quotient keeps x
                        v = w
                dst[value_off[i] + c] = f32_to_fp8_bits(v, mant, bias, top, over)


@functools.lru_cache(maxsize=None)
def bf16_fp8_codes(name: str) -> np.ndarray:
    """uint8 ``[65536]``: the fp8 code (``name``) of every bf16 bit pattern, as
    :func:`ascend_emu.quant.fp8.to_fp8` encodes it (read-only)."""
    values = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    codes = to_fp8(values, name).view(np.uint8)
    codes.flags.writeable = False
    return codes


def _mode2(args: V4WriterArgs, value_off, rope_off, scale_off, pad_off, pad_len: int) -> None:
    """Run :func:`mode2_rows` for the tokens of ``args`` at the given byte offsets."""
    d = args.x.shape[1]
    mant, bias, top, over = FP8_FORMATS[args.fp8]
    top_f = np.float32(FP8_MAX[args.fp8])
    inv = np.float32(np.float32(1.0) / top_f)
    xbits = np.ascontiguousarray(args.x).view(np.uint16)
    mode2_rows(as_bytes(args.cache), xbits, args.tokens, value_off, rope_off, scale_off, pad_off, int(pad_len),
                d - codec.KV_ROPE_DIM, int(args.group), inv, top_f, bool(args.round_scale), mant, bias, top, over,
                bf16_fp8_codes(args.fp8))


def kv_compress_epilog(args: V4WriterArgs) -> V4WriterOutputs:
    """Encode ``x[tokens]`` and write it at ``slots`` (module doc); returns the cache."""
    slots = args.slots
    if args.kind == "kv_rows":
        if args.quant_mode == 2:
            if slots.size:
                d = args.x.shape[1]
                q = d - codec.KV_ROPE_DIM
                n = -(-q // args.group)
                width = codec.kv_row_bytes(d, 2, args.group)
                base = slots * width
                _mode2(args, base + codec.KV_ROPE_BYTES, base, base + codec.KV_ROPE_BYTES + q,
                       base + codec.KV_ROPE_BYTES + q + n, width - (codec.KV_ROPE_BYTES + q + n))
            return V4WriterOutputs((args.cache,))
        xs = args.x[args.tokens]
        if args.quant_mode == 3:
            rows = codec.encode_kv_rows(xs, quant_mode=3, scale=args.scale) if slots.size else None
        else:
            rows = codec.encode_kv_rows(xs, quant_mode=args.quant_mode, dtype=args.fp8, round_scale=args.round_scale,
                                        quant_group_size=args.group) if slots.size else None
        if rows is not None:
            width = rows.shape[1]
            as_bytes(args.cache).reshape(-1, width)[slots] = rows
        return V4WriterOutputs((args.cache,))
    if args.kind == "kv_layout2":
        if slots.size:
            d = args.x.shape[1]
            q = d - codec.KV_ROPE_DIM
            geo = codec.kv_layout2_geometry(d, args.block_size, args.block_stride, args.group)
            blk, off = slots // args.block_size, slots % args.block_size
            base = blk * args.block_stride
            value = base + off * geo["value_row"]
            scale = base + geo["scale_base"] + off * geo["scale_row"]
            n = geo["scale_count"]
            _mode2(args, value, value + q, scale, scale + n, geo["scale_row"] - n)
        return V4WriterOutputs((args.cache,))
    raise AssertionError(f"kv_compress_epilog backend: unknown kind {args.kind!r}")
