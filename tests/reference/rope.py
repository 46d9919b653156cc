"""Reference npu_interleave_rope / npu_rotary_mul: plain loops over every element, fp32 math,
one rounding to the input dtype. Written from the op-plugin docs and goldens
(``docs/context/torch_npu-npu_interleave_rope.md``, ``torch_npu-npu_rotary_mul.md``,
``test/test_custom_ops/test_npu_interleave_rope.py``, ``test_npu_rotary_mul.py``), independently
of ``ascend_emu``; imports only numpy.
"""

from __future__ import annotations

import numpy as np


def _f(v) -> np.float32:
    return np.float32(v)


def interleave_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Golden: ``q = x.reshape(..., 32, 2).transpose(-1, -2).reshape(..., 64)``, then
    ``q * cos + rotate_half(q) * sin``; cos / sin ``[B, 1, S|1, 64]``."""
    b, n, s, d = x.shape
    h = d // 2
    out = np.zeros(x.shape, np.float32)
    for bi in range(b):
        for ni in range(n):
            for si in range(s):
                cs = si if cos.shape[2] == s else 0
                q = [_f(x[bi, ni, si, 2 * i]) for i in range(h)] + [_f(x[bi, ni, si, 2 * i + 1]) for i in range(h)]
                for j in range(d):
                    c = _f(cos[bi, 0, cs, j])
                    sn = _f(sin[bi, 0, cs, j])
                    rot = -q[j + h] if j < h else q[j - h]
                    out[bi, ni, si, j] = _f(q[j] * c) + _f(rot * sn)
    return out.astype(x.dtype)


def rotary_mul(x: np.ndarray, r1: np.ndarray, r2: np.ndarray, mode: str) -> np.ndarray:
    """Golden: ``r1 * x + r2 * x_new``; x_new = ``cat(-x2, x1)`` (half) or the pairs
    ``(-x[2i+1], x[2i])`` (interleave); r1 / r2 broadcast over size-1 dims."""
    a0, a1, a2, d = x.shape
    h = d // 2
    out = np.zeros(x.shape, np.float32)
    for i in range(a0):
        for j in range(a1):
            for k in range(a2):
                ri = (i if r1.shape[0] > 1 else 0, j if r1.shape[1] > 1 else 0, k if r1.shape[2] > 1 else 0)
                for e in range(d):
                    v = _f(x[i, j, k, e])
                    if mode == "half":
                        new = -_f(x[i, j, k, e + h]) if e < h else _f(x[i, j, k, e - h])
                    else:
                        new = -_f(x[i, j, k, e + 1]) if e % 2 == 0 else _f(x[i, j, k, e - 1])
                    out[i, j, k, e] = _f(_f(r1[ri + (e,)]) * v) + _f(_f(r2[ri + (e,)]) * new)
    return out.astype(x.dtype)


def rotary_mul_nd(x: np.ndarray, r1: np.ndarray, r2: np.ndarray, mode: str, rotate: np.ndarray | None = None):
    """:func:`rotary_mul` over a 3-D (TND) or 4-D x, and with a ``rotate`` matrix (op-plugin's doc:
    ``rotate(x) = x . rotate``): ``x_new[e] = sum_i x[i] * rotate[i, e]``, fp32 products added
    in index order, in place of the mode's rotation."""
    d = x.shape[-1]
    h = d // 2
    out = np.zeros(x.shape, np.float32)
    for idx in np.ndindex(x.shape[:-1]):
        ri = tuple(i if n > 1 else 0 for i, n in zip(idx, r1.shape[:-1], strict=True))
        row = [_f(x[idx + (e,)]) for e in range(d)]
        for e in range(d):
            if rotate is not None:
                new = _f(0.0)
                for i in range(d):
                    if rotate[i, e] != 0:  # zero entries contribute nothing (the emulator's choice)
                        new = _f(new + _f(row[i] * _f(rotate[i, e])))
            elif mode == "half":
                new = -row[e + h] if e < h else row[e - h]
            else:
                new = -row[e + 1] if e % 2 == 0 else row[e - 1]
            out[idx + (e,)] = _f(_f(r1[ri + (e,)]) * row[e]) + _f(_f(r2[ri + (e,)]) * new)
    return out.astype(x.dtype)


def rotary_mul_half_bf16_per_op(x: np.ndarray, r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """op-plugin's ``rotary_mul`` golden (``r1 * x + r2 * cat(-x2, x1)``) as torch evaluates it
    eagerly on bf16 CPU tensors: each of the two products rounded to bf16, then their fp32 sum
    rounded to bf16 (three roundings; the op rounds once). x ``[..., D]`` bf16 (ml_dtypes),
    r1 / r2 broadcastable to it. Used to show where the golden and the op part ways."""
    bf16 = x.dtype
    xf = x.astype(np.float32)
    h = x.shape[-1] // 2
    new = np.concatenate([-xf[..., h:], xf[..., :h]], axis=-1)
    p1 = (r1.astype(np.float32) * xf).astype(bf16)
    p2 = (r2.astype(np.float32) * new).astype(bf16)
    return (p1.astype(np.float32) + p2.astype(np.float32)).astype(bf16)
