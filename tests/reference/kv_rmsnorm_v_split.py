"""Reference for the K/V-split mode (``v`` given) of ``npu_kv_rmsnorm_rope_cache``: plain NumPy.

Written from op-plugin's ``test_npu_kv_rms_norm_rope_cache.py`` golden (method_mode 1) and the
ops-nn kernels (hicann/ops-nn b927bff ``norm/kv_rms_norm_rope_cache/op_kernel``), independently of
``ascend_emu``; imports only numpy, ml_dtypes and the other references (layouts / slots from
``tests.reference.kv_rmsnorm_rope_cache``, the 64-lane tree from ``tests.reference.rms_norm``).

Per token, ``x = kv[b, 0, s, :192]`` widened to fp32:

- squares ``q = x * x``; the 192 squares cut into blocks of ``w`` lanes, added neighbour to
  neighbour until one block is left: ``w = 48`` (``RmsNormV2`` of the MTP / B1SD / PA / quant
  kernels: ``Add`` with a 48-lane mask, 192 -> 96 -> 48) or ``w = 24`` (the non-quant PA_BLK_NZ
  kernel: a 24-lane mask, 192 -> 96 -> 48 -> 24); the ``w`` lanes, zero-padded to 64, summed by the
  64-lane neighbour tree (``WholeReduceSum``);
- ``rms = sqrt(sum * fp32(1/192) + eps)``, ``y = x / rms * gamma``;
- RoPE of the fp32 ``y[:64]``: ``real = y[0:64:2]``, ``imag = y[1:64:2]``,
  ``out[:32] = real * cos[:32] + (-imag) * sin[:32]``, ``out[32:] = imag * cos[32:] + real * sin[32:]``;
- the k row ``[out | y[64:]]``: kv dtype by one RNE rounding (ml_dtypes' cast), or int8
  ``clip(rint(k * k_rope_scale))`` from the fp32 row; the v row: ``v`` itself, or int8
  ``clip(rint(v * c_kv_scale))``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tests.reference.kv_rmsnorm_rope_cache import cache_geometry, scatter, token_slots
from tests.reference.rms_norm import tree_64

DK = 192
DV = 128
ROPE = 64


class SplitResult(NamedTuple):
    k_cache: np.ndarray      # updated copy of k_cache
    ckv_cache: np.ndarray    # updated copy of ckv_cache
    k_out: np.ndarray        # [B, 1, S, 192] kv dtype
    v_out: np.ndarray        # [B, 1, S, 128] kv dtype (v)
    k_f32: np.ndarray        # [T, 192] fp32 k rows before rounding


def block_width(cache_mode: str, quant: bool) -> int:
    """Lanes left by the kernel's halving ``Add`` calls: 24 for the non-quant PA_BLK_NZ kernel, else 48."""
    return 24 if cache_mode == "PA_BLK_NZ" and not quant else 48


def square_sum(x, width: int) -> np.ndarray:
    """``[T, 192]`` fp32 -> ``[T]``: the kernel's sum of squares with ``width``-lane blocks."""
    q = np.asarray(x, np.float32) ** 2
    blocks = q.reshape(q.shape[0], -1, width)  # [T, 192/w, w]
    while blocks.shape[1] > 1:
        blocks = blocks[:, 0::2] + blocks[:, 1::2]
    lanes = np.zeros((q.shape[0], 64), np.float32)
    lanes[:, :width] = blocks[:, 0]
    return tree_64(lanes)


def k_rows_f32(kv, gamma, cos, sin, epsilon, width: int) -> np.ndarray:
    """fp32 k rows ``[T, 192]`` = ``[rope(y[:64]) | y[64:]]``."""
    x = np.asarray(kv).astype(np.float32).reshape(-1, DK)  # [T, 192]
    ss = square_sum(x, width)[:, None]
    rms = np.sqrt(ss * (np.float32(1.0) / np.float32(DK)) + np.float32(epsilon))
    y = x / rms * np.asarray(gamma).astype(np.float32)
    c = np.asarray(cos).astype(np.float32).reshape(-1, ROPE)
    s = np.asarray(sin).astype(np.float32).reshape(-1, ROPE)
    real, imag = y[:, 0:ROPE:2], y[:, 1:ROPE:2]
    h = ROPE // 2
    rope = np.concatenate([real * c[:, :h] + (-imag) * s[:, :h], imag * c[:, h:] + real * s[:, h:]], axis=1)
    return np.concatenate([rope, y[:, ROPE:]], axis=1).astype(np.float32)


def quantize(x, scale) -> np.ndarray:
    """``clip(rint(x * scale), -128, 127)`` as int8, NaN -> 0."""
    prod = np.asarray(x, np.float32) * np.asarray(scale, np.float32).reshape(-1)
    return np.nan_to_num(np.clip(np.rint(prod), -128, 127), nan=0.0).astype(np.int8)


def v_split_ref(kv, gamma, cos, sin, index, k_cache, ckv_cache, v, *, k_rope_scale=None, c_kv_scale=None,
                epsilon=1e-5, cache_mode="Norm") -> SplitResult:
    """Expected caches and outputs; the inputs are not modified."""
    b, _, s, _ = kv.shape
    quant = k_rope_scale is not None
    k32 = k_rows_f32(kv, gamma, cos, sin, epsilon, block_width(cache_mode, quant))
    k_out = k32.astype(kv.dtype)  # [T, 192]
    v_rows = np.asarray(v).reshape(-1, DV)  # [T, 128]
    if quant:
        k_rows, c_rows = quantize(k32, k_rope_scale), quantize(v_rows.astype(np.float32), c_kv_scale)
    else:
        k_rows, c_rows = k_out, v_rows
    block_size, cache_length = cache_geometry(k_cache, cache_mode)
    slots = token_slots(index, cache_mode, b, s, block_size, cache_length)
    return SplitResult(scatter(k_cache, k_rows, slots, cache_mode, block_size),
                       scatter(ckv_cache, c_rows, slots, cache_mode, block_size),
                       k_out.reshape(b, 1, s, DK), np.array(v_rows).reshape(b, 1, s, DV), k32)
