"""Reference DeepSeek-V4 small ops, independently of ``ascend_emu`` (numpy, ml_dtypes for bf16, and
the sibling references :mod:`tests.reference.rms_norm` / :mod:`tests.reference.dynamic_quant`).

- ``rms_norm_dynamic_quant``: cann-recipes-infer ``custom-npu_rms_norm_dynamic_quant.md``'s formula
  (``x / rms * gamma + beta``, ``* smooth``, per-row int8 with ``rowmax / 127``), the sum of
  squares in the in-order 64-lane model, then the npu_dynamic_quant reference.
- ``partial_rotary``: the golden ``test_npu_inplace_partial_rotary_mul.py``:
  ``cos * a + rotate_every_two(a) * sin`` on the slice (rotate_every_two of ``(a, b)`` is
  ``(-b, a)``), scalar fp32, one rounding.
- ``compressor_metadata``: vllm-ascend ``test_compressor_metadata.py`` ``_reference_outputs``:
  a row loop with a running request index.
"""

from __future__ import annotations

import numpy as np

from .dynamic_quant import dynamic_quant
from .rms_norm import rms_norm


def rms_norm_dynamic_quant(x, gamma, smooth=None, beta=None, eps=1e-6):
    h = x.shape[-1]
    rows = np.asarray(x, np.float32).reshape(-1, h)
    y = rms_norm(rows, np.asarray(gamma, np.float32), eps, "mla_prolog")
    if beta is not None:
        y = (y + np.asarray(beta, np.float32)).astype(np.float32)
    q, s = dynamic_quant(y, None if smooth is None else np.asarray(smooth, np.float32))
    return q.reshape(x.shape), s.reshape(x.shape[:-1])


def partial_rotary(x, cos, sin, lo, hi, negate_sin=False):
    """A new array: x with ``[..., lo:hi]`` rotated (x ``[B, S, N, D]``, cos / sin broadcast)."""
    out = np.array(x, copy=True)
    b, s, n, _ = x.shape
    c = np.broadcast_to(np.asarray(cos, np.float32), (b, s, n, hi - lo))
    si = np.broadcast_to(np.asarray(sin, np.float32), (b, s, n, hi - lo))
    f = np.float32
    for i in range(b):
        for j in range(s):
            for k in range(n):
                for p in range(0, hi - lo, 2):
                    a, bb = f(x[i, j, k, lo + p]), f(x[i, j, k, lo + p + 1])
                    s0, s1 = f(si[i, j, k, p]), f(si[i, j, k, p + 1])
                    if negate_sin:
                        s0, s1 = -s0, -s1
                    ra = f(f(a * c[i, j, k, p]) + f(-bb * s0))
                    rb = f(f(bb * c[i, j, k, p + 1]) + f(a * s1))
                    out[i, j, k, lo + p] = ra
                    out[i, j, k, lo + p + 1] = rb
    return out


def compressor_metadata(rope_cos, rope_sin, cu, start, table, bs, fmt, ratio, n):
    num_reqs = len(start)
    prefix = [0]
    total = 0
    for i in range(num_reqs):
        length = int(cu[i + 1]) - int(cu[i])
        rows = 0
        if start[i] >= 0 and length > 0:
            rows = (int(start[i]) + length) // ratio - int(start[i]) // ratio
        total += rows
        prefix.append(total)
    d = rope_cos.shape[1]
    cos = np.empty((n, 1, 1, d), rope_cos.dtype)
    sin = np.empty_like(cos)
    slot = np.empty((n,) if fmt == 1 else (n, 2), np.int32)
    req = 0
    for r in range(n):
        valid = r < min(total, n)
        block = -1
        if valid:
            while req < num_reqs and prefix[req + 1] <= r:
                req += 1
            cpos = int(start[req]) // ratio + r - prefix[req]
            col = cpos // bs
            rope_pos = cpos * ratio
            if col >= table.shape[1] or rope_pos >= rope_cos.shape[0]:
                valid = False
            else:
                block = int(table[req, col])
                valid = block >= 0
        if valid:
            cos[r, 0, 0] = rope_cos[rope_pos]
            sin[r, 0, 0] = rope_sin[rope_pos]
            if fmt == 1:
                slot[r] = block * bs + cpos % bs
            else:
                slot[r] = (block, cpos % bs)
        else:
            cos[r, 0, 0] = 1
            sin[r, 0, 0] = 0
            if fmt == 1:
                slot[r] = -1
            else:
                slot[r] = (-1, bs - 1)
    return cos, sin, slot
