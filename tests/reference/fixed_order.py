"""Independent reference of the deterministic mode's product order (docs/numerics.md#deterministic),
in plain Python loops on NumPy float32 scalars: for each output element, ``acc = 0``; for each step
of 16 consecutive ``k``: ``part = 0``, then ``part = part + a[i, k] * b[k, j]`` in ``k`` order
(each product and each sum rounded to fp32 on its own), then ``acc = acc + part``.

Small shapes only (one Python operation per multiply-add).
"""

from __future__ import annotations

import numpy as np

#: Depth of one step of the order (the Cube's 16-element fractal of bf16 / fp16).
STEP = 16


def fixed_order_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fp32 ``a [M, K] @ b [K, N]`` in the documented step order; fp32 ``[M, N]``."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), dtype=np.float32)
    with np.errstate(all="ignore"):
        for i in range(m):
            for j in range(n):
                acc = np.float32(0.0)
                for k0 in range(0, k, STEP):
                    part = np.float32(0.0)
                    for kk in range(k0, min(k, k0 + STEP)):
                        prod = np.float32(a[i, kk] * b[kk, j])  # fp32 * fp32 -> fp32, rounded once
                        part = np.float32(part + prod)
                    acc = np.float32(acc + part)
                out[i, j] = acc
    return out


def exact_int8_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int8 ``a [M, K] @ b [K, N]`` as exact Python integers, returned as int32 ``[M, N]``."""
    a = np.asarray(a).astype(object)
    b = np.asarray(b).astype(object)
    return np.array(a.dot(b), dtype=np.int64).astype(np.int32)
