"""Reference DeepSeek-V4 cache quants: the kv_compress_epilog rows and the indexer key quant.

Written from the goldens and the kernel texts, independently of ``ascend_emu`` (numpy, ml_dtypes
for the bf16 bytes, stdlib, and the sibling reference codecs in :mod:`tests.reference.formats_950`
and :mod:`tests.reference.dynamic_quant`):

- cann-recipes-infer ``ops/ascendc/examples/test_npu_kv_compress_epilog.py``
  (``calc_kv_compress_layout``, ``golden_mxfp8_row``, ``golden_group_fp8_row``,
  ``hifp8_block_quant``) and ``ops/ascendc/docs/custom-npu_kv_compress_epilog.md``;
- vllm-ascend ``csrc/attention/kv_compress_epilog/op_kernel/kv_compress_epilog_common.h``: the
  E8M0 exponent step (``ShiftRights`` 23, ``And 0xFF``, ``And 0x7FFFFF``, ``Compare NE 0``, add):
  the second mask is applied to the exponent, so the increment happens for every non-zero
  exponent. :func:`e8m0_byte` implements both that and the golden's mantissa test, chosen by
  ``rule``;
- vllm-ascend ``csrc/attention/indexer_compress_epilog_v2/op_kernel/indexer_compress_epilog_v2_base.h``
  and ``..._single_row.h`` (fp8 indexer quant, packed v2 offsets).

Everything is scalar fp32 arithmetic, one group at a time; fp32 bit fields through ``struct``.
"""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np

from .dynamic_quant import dynamic_quant
from .formats_950 import fp8_encode, fp8_max, hif8_encode

ROPE = 64
BF16 = np.dtype(ml_dtypes.bfloat16)


def f32(v) -> np.float32:
    return np.float32(v)


def f32_bits(v) -> int:
    return struct.unpack("<I", struct.pack("<f", float(f32(v))))[0]


def bits_f32(u: int) -> np.float32:
    return np.float32(struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0])


def row_width(d: int, quant_mode: int, group: int = 64) -> int:
    """The golden's ``kv_cache_col`` (quant_mode 1 with group 128; quant_mode 2 with ``group``,
    vllm-ascend's tiling ``scaleCol = ceil((d - 64) / quant_group_size)``)."""
    q = d - ROPE
    if quant_mode == 2:
        used = q + 2 * ROPE + math.ceil(q / group)
    else:
        used = q + 2 * ROPE + 4 * math.ceil(q / 128)
    return math.ceil(used / 128) * 128


def e8m0_byte(amax, name: str, round_scale: bool, rule: str = "kernel") -> tuple[int, np.float32]:
    """``(byte, divisor)`` of one quant_mode 2 group: divisor is what the group's values are divided by."""
    a = max(f32(amax), f32(1e-4))
    s = f32(a * (f32(1.0) / f32(fp8_max(name))))
    u = f32_bits(s)
    exp = (u >> 23) & 0xFF
    if not round_scale:
        return exp, s
    if rule == "kernel":
        bump = 1 if (exp & 0x7FFFFF) != 0 else 0
    else:  # golden: mantissa test
        bump = 1 if (u & 0x7FFFFF) != 0 else 0
    new = exp + bump
    return new & 0xFF, bits_f32(new << 23)


def kv_row_mode2(x_row_bf16: np.ndarray, name: str = "float8_e4m3fn", round_scale: bool = True,
                 rule: str = "kernel", group: int = 64) -> np.ndarray:
    """``group`` 128: vllm-ascend's "fold-two" path (two 64-lane halves share one scale)."""
    d = x_row_bf16.shape[0]
    q = d - ROPE
    out = np.zeros(row_width(d, 2, group), np.uint8)
    out[:2 * ROPE] = np.frombuffer(np.ascontiguousarray(x_row_bf16[q:]).tobytes(), np.uint8)
    top = f32(fp8_max(name))
    for j, start in enumerate(range(0, q, group)):
        grp = [f32(float(v)) for v in x_row_bf16[start:min(start + group, q)]]
        amax = f32(0.0)
        for v in grp:
            amax = max(amax, f32(abs(v)))
        byte, div = e8m0_byte(amax, name, round_scale, rule)
        scaled = [min(max(f32(v / div), -top), top) for v in grp]
        out[2 * ROPE + start:2 * ROPE + start + len(grp)] = fp8_encode(np.array(scaled, np.float32), name, False)
        out[2 * ROPE + q + j] = byte
    return out


def kv_row_mode1(x_row_bf16: np.ndarray, name: str = "float8_e4m3fn") -> np.ndarray:
    """quant_mode 1 as the kernel computes it: ``s = amax * f32(1/max)`` (the golden divides
    ``amax / max``), values ``x / s`` uncapped; a zero group: scale 0, its values kept (zeros)."""
    d = x_row_bf16.shape[0]
    q = d - ROPE
    out = np.zeros(row_width(d, 1), np.uint8)
    out[q:q + 2 * ROPE] = np.frombuffer(np.ascontiguousarray(x_row_bf16[q:]).tobytes(), np.uint8)
    inv = f32(1.0) / f32(fp8_max(name))
    for j, start in enumerate(range(0, q, 128)):
        grp = [f32(float(v)) for v in x_row_bf16[start:min(start + 128, q)]]
        amax = f32(0.0)
        for v in grp:
            amax = max(amax, f32(abs(v)))
        s = f32(amax * inv)
        if s == 0:
            vals = grp
        else:
            vals = [f32(v / s) for v in grp]
        out[start:start + len(grp)] = fp8_encode(np.array(vals, np.float32), name, False)
        off = q + 2 * ROPE + 4 * j
        out[off:off + 4] = np.frombuffer(struct.pack("<f", float(s)), np.uint8)
    return out


def kv_row_mode3(x_row: np.ndarray, scale: float) -> np.ndarray:
    """The golden's ``hifp8_block_quant``: HiF8 of ``f32(x) * f32(scale)``."""
    return hif8_encode(np.array([f32(f32(float(v)) * f32(scale)) for v in x_row], np.float32))


def indexer_fp8_row(x_row: np.ndarray) -> tuple[np.ndarray, list[np.float32]]:
    """One row of the 950 indexer key quant: fp8 E4M3FN bytes and its fp32 scales."""
    inv = bits_f32(0x3B124925)
    d = x_row.shape[0]
    codes = np.zeros(d, np.uint8)
    scales = []
    for start in range(0, d, 128):
        grp = [f32(float(v)) for v in x_row[start:min(start + 128, d)]]
        amax = f32(0.0)
        for v in grp:
            amax = max(amax, f32(abs(v)))
        s = f32(amax * inv) if amax != 0 else f32(0.0)
        vals = grp if s == 0 else [f32(v / s) for v in grp]
        codes[start:start + len(grp)] = fp8_encode(np.array(vals, np.float32), "float8_e4m3fn", False)
        scales.append(s)
    return codes, scales


def indexer_int8_row(x_row: np.ndarray) -> tuple[np.ndarray, list[np.float16]]:
    """One row of the A2 / A3 indexer key quant: npu_dynamic_quant per 128 values, fp16 scales."""
    vals, scales = [], []
    for start in range(0, x_row.shape[0], 128):
        y, s = dynamic_quant(np.asarray(x_row[start:start + 128], np.float32).reshape(1, -1))
        vals.append(y.reshape(-1))
        scales.append(np.float16(s.reshape(-1)[0]))
    return np.concatenate(vals), scales


def indexer_v2_offsets(slot: int, d: int, bs: int, row_bytes: int, block_stride: int = 0) -> tuple[int, int]:
    """``(value_offset, scale_offset)`` of one slot, as ``indexer_compress_epilog_v2_single_row.h``
    computes ``valueOffset`` / ``scaleOffset``."""
    stride = block_stride or bs * row_bytes
    blk, off = divmod(slot, bs)
    scale_col = (d + 127) // 128
    return blk * stride + off * d, blk * stride + bs * d + off * scale_col * 4
