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


def _pack_words(y: np.ndarray) -> np.ndarray:
    """int4 values ``[n, h]`` -> int32 ``[n, h / 8]``, value j of a word in bits 4j..4j+3."""
    n, h = y.shape
    words = np.zeros((n, h // 8), np.int64)
    for r in range(n):
        for w in range(h // 8):
            word = 0
            for j in range(8):
                word |= (int(y[r, 8 * w + j]) & 0xF) << (4 * j)
            words[r, w] = word - (1 << 32) if word >= 1 << 31 else word
    return words.astype(np.int32)


def dynamic_quant_asymmetric(x: np.ndarray, smooth: np.ndarray | None = None, group_index: np.ndarray | None = None,
                             int4: bool = False, per_channel: bool = False):
    """``(y, scale, offset)`` as npu_dynamic_quant_asymmetric returns them (op-plugin's doc formula).

    Per row (per token: the last axis; per channel: axis -2, one column at a time) of
    ``v = f32(x) * f32(smooth)`` (per channel the smooth value of v's row on axis -2):
    ``scale = f32((max - min) / (qmax - qmin))``, ``offset = f32(qmax - f32(max / scale))``,
    ``y = clip(rint_half_even(f32(f32(v / scale) + offset)), qmin, qmax)``; qmax / qmin 127 /
    -128 (int4 7 / -8); a constant row: scale 0, offset 0, y 0. int4 packed as
    :func:`dynamic_quant`.
    """
    qmax = 7 if int4 else 127
    qmin = -qmax - 1
    h = x.shape[-1]
    xf = x.astype(np.float32)
    if smooth is not None:
        sf = smooth.astype(np.float32)
        if per_channel:
            for idx in np.ndindex(x.shape):
                xf[idx] = _f(xf[idx]) * _f(sf[idx[-2]])
        else:
            flat = xf.reshape(-1, h)
            for r in range(flat.shape[0]):
                g = 0
                if group_index is not None:
                    while group_index[g] <= r:
                        g += 1
                row = sf if group_index is None else sf[g]
                for j in range(h):
                    flat[r, j] = _f(flat[r, j]) * _f(row[j])
    lines = np.swapaxes(xf, -1, -2) if per_channel else xf
    lead = lines.shape[:-1]
    flat = lines.reshape(-1, lines.shape[-1])
    n, width = flat.shape
    y = np.zeros((n, width), np.int64)
    scale = np.zeros(n, np.float32)
    offset = np.zeros(n, np.float32)
    for r in range(n):
        hi = lo = _f(flat[r, 0])
        for e in flat[r]:
            hi = max(hi, _f(e))
            lo = min(lo, _f(e))
        s = _f(_f(hi - lo) / _f(qmax - qmin))
        if s == 0:
            continue
        o = _f(_f(qmax) - _f(hi / s))
        scale[r], offset[r] = s, o
        for j in range(width):
            p = float(_f(_f(flat[r, j] / s) + o))
            y[r, j] = max(qmin, min(qmax, _round_half_even(p)))
    y = y.reshape(lead + (width,))
    if per_channel:
        y = np.swapaxes(y, -1, -2)
    y = np.ascontiguousarray(y)
    if int4:
        y = _pack_words(y.reshape(-1, h)).reshape(x.shape[:-1] + (h // 8,))
    else:
        y = y.astype(np.int8)
    return y, scale.reshape(lead), offset.reshape(lead)


def dynamic_quant_per_channel(x: np.ndarray, smooth: np.ndarray | None = None):
    """``(y, scale)`` of npu_dynamic_quant with ``quant_mode='perchannel'`` (int8), as op-plugin's
    per-channel golden computes it, per column c of ``v = f32(x) * f32(smooth[row])``:
    ``scale = f32(max |v| * f32(1 / 127))``, ``y = rint_half_even(f32(v / scale))`` (a zero
    column: scale 0, y 0)."""
    xf = x.astype(np.float32)
    s_rows, h = x.shape[-2], x.shape[-1]
    lead = x.shape[:-2]
    y = np.zeros(x.shape, np.int8)
    scale = np.zeros(lead + (h,), np.float32)
    for outer in np.ndindex(*lead):
        for c in range(h):
            v = []
            for r in range(s_rows):
                e = _f(xf[outer + (r, c)])
                v.append(_f(e * _f(smooth[r])) if smooth is not None else e)
            amax = _f(0.0)
            for e in v:
                amax = max(amax, _f(abs(e)))
            sc = _f(amax * _f(1.0 / 127.0))
            scale[outer + (c,)] = sc
            if sc == 0:
                continue
            for r in range(s_rows):
                y[outer + (r, c)] = max(-127, min(127, _round_half_even(float(_f(v[r] / sc)))))
    return y, scale
