"""Reference DeepSeek-V4 cache writers: kv_compress_epilog (layouts 1 and 2), the recipes'
indexer_compress_epilog (values + scales) and vllm-ascend's indexer_compress_epilog_v2 (one
packed uint8 cache).

Independent of ``ascend_emu``: one token at a time, in slot_mapping order (so a repeated slot
ends with the last token's bytes, as the emulator's policy says), over flat byte buffers; the
rows come from the scalar codecs of :mod:`tests.reference.v4_quant`. Written from:

- vllm-ascend ``csrc/attention/kv_compress_epilog/op_kernel/kv_compress_epilog.h`` (``Process``:
  ``slot == -1`` skipped; layout 1 ``gmOffset = slot * rowStride``; layout 2 ``valueGmOff =
  blockIdx * blockStride + slotInBlock * valuePerToken``, ``scaleGmOff = blockIdx * blockStride +
  blockSize * valuePerToken + slotInBlock * scalePerToken``), ``op_host/
  kv_compress_epilog_tiling_arch35.cpp`` (``valuePerToken = d - 64 + 128``, ``scalePerToken =
  RoundUp(scaleCol, 8)``) and ``kv_compress_epilog_common.h`` ``VFProcessDynamicMxFP8QuantLayout2``
  (value part: fp8 values at 0, rope bf16 at ``d - 64``; scale part: E8M0 byte j at j);
- cann-recipes-infer ``ops/ascendc/src/indexer_compress_epilog/op_kernel/indexer_compress_epilog_base.h``
  (``VFProcessDynamicBlockQuant``: coefficient ``1/448`` or ``1/57344`` by the cache type;
  ``VFProcessDynamicMxFp8Quant``: 1e-4 clamp, E8M0 step, clip, per 128 values) and its doc
  ``custom-npu_indexer_compress_epilog.md`` (``cache[slot] = value``, ``scale[slot] = scale``);
- vllm-ascend ``indexer_compress_epilog_v2_single_row.h`` (offsets: :func:`v4_quant.indexer_v2_offsets`).

Layout 2's scale part has ``RoundUp(scaleCol, 8) - scaleCol`` bytes the kernel does not compute:
this reference writes them as zeros (the emulator's documented reading).
"""

from __future__ import annotations

import math
import struct

import numpy as np

from . import v4_quant as q4
from .formats_950 import fp8_encode, fp8_max

ROPE = q4.ROPE


def kv_layout1(cache_rows: np.ndarray, x: np.ndarray, slots, *, quant_mode: int = 2, name: str = "float8_e4m3fn",
               round_scale: bool = True, group: int = 64, scale: float = 1.0) -> np.ndarray:
    """A copy of ``cache_rows`` (uint8 ``[N, W]``) after kv_compress_epilog layout 1."""
    out = cache_rows.copy()
    for i, s in enumerate(int(v) for v in slots):
        if s == -1:
            continue
        if quant_mode == 2:
            row = q4.kv_row_mode2(x[i], name, round_scale, group=group)
        elif quant_mode == 1:
            row = q4.kv_row_mode1(x[i], name)
        else:
            row = q4.kv_row_mode3(x[i], scale)
        out[s, :row.shape[0]] = row
    return out


def kv_layout2(cache_flat: np.ndarray, x: np.ndarray, slots, *, block_size: int, block_stride: int,
               name: str = "float8_e4m3fn", round_scale: bool = True, group: int = 64) -> np.ndarray:
    """A copy of the flat uint8 cache after kv_compress_epilog layout 2 (quant_mode 2)."""
    out = cache_flat.copy()
    d = x.shape[1]
    qc = d - ROPE
    n_scale = math.ceil(qc / group)
    value_per_token = qc + 2 * ROPE
    scale_per_token = math.ceil(n_scale / 8) * 8
    for i, s in enumerate(int(v) for v in slots):
        if s == -1:
            continue
        row = q4.kv_row_mode2(x[i], name, round_scale, group=group)
        value = np.concatenate([row[2 * ROPE:2 * ROPE + qc], row[:2 * ROPE]])
        scale_part = np.zeros(scale_per_token, np.uint8)
        scale_part[:n_scale] = row[2 * ROPE + qc:2 * ROPE + qc + n_scale]
        blk, off = divmod(s, block_size)
        v0 = blk * block_stride + off * value_per_token
        s0 = blk * block_stride + block_size * value_per_token + off * scale_per_token
        out[v0:v0 + value_per_token] = value
        out[s0:s0 + scale_per_token] = scale_part
    return out


def indexer_fp8_row(x_row: np.ndarray, name: str = "float8_e4m3fn") -> tuple[np.ndarray, list[np.float32]]:
    """The recipes' quant_mode 1 row (E4M3FN: the v2 kernel's row, :func:`v4_quant.indexer_fp8_row`)."""
    if name == "float8_e4m3fn":
        return q4.indexer_fp8_row(x_row)
    inv = q4.bits_f32(0x37924925)  # the kernel's INV_FP8_E5M2_MAX_VALUE
    d = x_row.shape[0]
    codes = np.zeros(d, np.uint8)
    scales = []
    for start in range(0, d, 128):
        grp = [q4.f32(float(v)) for v in x_row[start:min(start + 128, d)]]
        amax = q4.f32(0.0)
        for v in grp:
            amax = max(amax, q4.f32(abs(v)))
        s = q4.f32(amax * inv) if amax != 0 else q4.f32(0.0)
        vals = grp if s == 0 else [q4.f32(v / s) for v in grp]
        codes[start:start + len(grp)] = fp8_encode(np.array(vals, np.float32), name, False)
        scales.append(s)
    return codes, scales


def indexer_mx_row(x_row: np.ndarray, name: str = "float8_e4m3fn", round_scale: bool = True
                   ) -> tuple[np.ndarray, list[int]]:
    """The recipes' quant_mode 0 row: fp8 codes and one E8M0 byte per 128 values."""
    d = x_row.shape[0]
    top = q4.f32(fp8_max(name))
    codes = np.zeros(d, np.uint8)
    bytes_ = []
    for start in range(0, d, 128):
        grp = [q4.f32(float(v)) for v in x_row[start:min(start + 128, d)]]
        amax = q4.f32(0.0)
        for v in grp:
            amax = max(amax, q4.f32(abs(v)))
        byte, div = q4.e8m0_byte(amax, name, round_scale)
        vals = [min(max(q4.f32(v / div), -top), top) for v in grp]
        codes[start:start + len(grp)] = fp8_encode(np.array(vals, np.float32), name, False)
        bytes_.append(byte)
    return codes, bytes_


def indexer_v1(cache: np.ndarray, scale: np.ndarray, x: np.ndarray, slots, *, quant_mode: int = 1,
               name: str = "float8_e4m3fn", round_scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Copies of (uint8 ``[N, d]`` codes, uint8 ``[N, scale bytes]``) after indexer_compress_epilog."""
    out_c, out_s = cache.copy(), scale.copy()
    for i, s in enumerate(int(v) for v in slots):
        if s == -1:
            continue
        if quant_mode == 1:
            codes, scales = indexer_fp8_row(x[i], name)
            raw = b"".join(struct.pack("<f", float(v)) for v in scales)
        else:
            codes, bytes_ = indexer_mx_row(x[i], name, round_scale)
            raw = bytes(bytes_)
        out_c[s] = codes
        out_s[s] = np.frombuffer(raw, np.uint8)
    return out_c, out_s


def indexer_v2(cache_flat: np.ndarray, x: np.ndarray, slots, *, block_size: int, row_bytes: int
               ) -> np.ndarray:
    """A copy of the flat packed uint8 cache after indexer_compress_epilog_v2."""
    out = cache_flat.copy()
    d = x.shape[1]
    for i, s in enumerate(int(v) for v in slots):
        if s == -1:
            continue
        codes, scales = q4.indexer_fp8_row(x[i])
        v0, s0 = q4.indexer_v2_offsets(s, d, block_size, row_bytes)
        out[v0:v0 + d] = codes
        raw = np.frombuffer(b"".join(struct.pack("<f", float(v)) for v in scales), np.uint8)
        out[s0:s0 + raw.size] = raw
    return out
