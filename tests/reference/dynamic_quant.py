"""Reference npu_dynamic_quant: plain loops over every row and element, fp32 scalar math.

Written from op-plugin ``docs/context/torch_npu-npu_dynamic_quant.md`` (formula, group_index
rule, int4 in int32) and the A2 / A3 kernels' operation order in ops-nn
``quant/dynamic_quant/op_kernel/`` (``dynamic_quant.h`` / ``dynamic_quant_moe.h``: ``127 / amax``
then ``1 / that`` for the stored scale; ``dynamic_quant_db.h`` / ``_multi_row.h``:
``amax * (1 / 127)``; both quantize ``rint(v * (127 / amax))``), independently of ``ascend_emu``;
imports only numpy. Rounding half to even is written out here (floor and compare), not taken
from ``np.rint``.
"""

from __future__ import annotations

import math

import numpy as np


def _f(v) -> np.float32:
    return np.float32(v)


def _round_half_even(p: float) -> int:
    """Nearest integer, ties to the even neighbour (exact: p is an fp32 value held as a Python
    float)."""
    lo = math.floor(p)
    frac = p - lo
    if frac > 0.5 or (frac == 0.5 and lo % 2 == 1):
        return lo + 1
    return lo


def dynamic_quant(x: np.ndarray, smooth: np.ndarray | None = None, group_index: np.ndarray | None = None,
                  int4: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(y, scale)`` as npu_dynamic_quant returns them.

    Per row r of ``x`` ``[..., H]``: ``v = f32(x) * f32(smooth)`` (MoE: the smooth row i with
    ``group_index[i-1] <= r < group_index[i]``); ``amax = max |v|``; ``m = f32(qmax / amax)``
    (qmax 127, int4 7); ``y = rint_half_even(v * m)`` (an all-zero row: 0); the scale
    ``amax * f32(1 / qmax)`` without group_index, ``f32(1 / m)`` with it (0 for a zero row). An
    infinite m (amax below qmax / FLT_MAX) gives +-qmax for non-zero values, 0 for zeros.
    int4: 8 values per int32, value j of a word in bits 4j..4j+3.
    """
    h = x.shape[-1]
    rows = x.reshape(-1, h)
    n = rows.shape[0]
    qmax = 7 if int4 else 127
    y = np.zeros((n, h), np.int64)
    scale = np.zeros(n, np.float32)
    for r in range(n):
        if smooth is None:
            s = None
        elif group_index is None:
            s = smooth
        else:
            g = 0
            while group_index[g] <= r:
                g += 1
            s = smooth[g]
        v = [_f(rows[r, j]) * _f(s[j]) if s is not None else _f(rows[r, j]) for j in range(h)]
        amax = _f(0.0)
        for e in v:
            if abs(e) > amax:
                amax = _f(abs(e))
        if amax == 0:
            continue  # y 0, scale 0
        with np.errstate(over="ignore", invalid="ignore"):
            m = _f(qmax) / amax  # inf when amax < qmax / FLT_MAX
            if group_index is None:
                scale[r] = amax * (_f(1.0) / _f(qmax))
            else:
                scale[r] = _f(1.0) / m
            for j in range(h):
                p = float(_f(v[j] * m))  # 0 * inf: NaN -> 0
                y[r, j] = 0 if math.isnan(p) else _round_half_even(max(-qmax, min(qmax, p)))
    lead = x.shape[:-1]
    if not int4:
        return y.astype(np.int8).reshape(x.shape), scale.reshape(lead)
    words = np.zeros((n, h // 8), np.int64)
    for r in range(n):
        for w in range(h // 8):
            word = 0
            for j in range(8):
                word |= (int(y[r, 8 * w + j]) & 0xF) << (4 * j)
            words[r, w] = word - (1 << 32) if word >= 1 << 31 else word
    return words.astype(np.int32).reshape(lead + (h // 8,)), scale.reshape(lead)
