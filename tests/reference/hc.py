"""Reference mHC ops (DeepSeek-V4 ``hc_pre`` / ``hc_post``), written from the official CPU
goldens and the op docs (vllm-ascend ``tests/e2e/nightly/single_node/ops/singlecard_ops/
test_npu_hc_pre.py``; cann-recipes-infer ``ops/ascendc/examples/test_npu_hc_pre.py``,
``test_npu_hc_post.py``, ``ops/ascendc/docs/custom-npu_hc_*.md``), independently of
``ascend_emu``; imports only numpy and ml_dtypes.

Two kinds of reference:

- :func:`hc_pre_f64`: the golden's formula in float64 (what the dual criterion compares against);
- the exact fp32 sequences where the kernel's result is one defined fp32 computation:
  :func:`hf32` (a bit mask), :func:`weighted_sum_bf16` (y given its weights: fp32 products summed
  over j = 0..3 in order, one RNE rounding to bf16) and :func:`hc_post_fp32` (the A2 / A3 kernel:
  ``post[i] * x``, then ``+ residual[j] * comb[j, i]`` for j = 0..3, fp32, one rounding).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def hf32(a) -> np.ndarray:
    """fp32 with the low 13 of its 23 mantissa bits cleared (HF32, round toward zero)."""
    bits = np.array(a, dtype=np.float32).view(np.uint32)
    return (bits & np.uint32(0xFFFFE000)).view(np.float32)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def hc_pre_f64(x, hc_fn, hc_scale, hc_base, *, iters=20, norm_eps=1e-6, hc_eps=1e-6, hf32_mixes=True,
               pre_mix=None) -> dict:
    """The golden in float64: ``x [..., 4, D]`` (any real dtype), ``hc_fn [24, 4D]``.

    Returns:
        dict of float64 arrays: ``inv_rms [...]``, ``mixes [..., 24]``, ``pre``, ``post [..., 4]``,
        ``comb [..., 4, 4]``, ``y [..., D]`` (not rounded).
    """
    xf = np.asarray(x).astype(np.float32).astype(np.float64)
    lead, hc, d = xf.shape[:-2], xf.shape[-2], xf.shape[-1]
    flat = xf.reshape(*lead, hc * d)
    inv_rms = 1.0 / np.sqrt((flat * flat).mean(-1) + norm_eps)
    if hf32_mixes:
        a, w = hf32(flat).astype(np.float64), hf32(hc_fn).astype(np.float64)
    else:
        a, w = flat, np.asarray(hc_fn, np.float64)
    mixes = a @ w.T
    m = mixes * inv_rms[..., None]
    scale, base = np.asarray(hc_scale, np.float64), np.asarray(hc_base, np.float64)
    pre = _sigmoid(m[..., :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2.0 * _sigmoid(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    c = (m[..., 2 * hc:] * scale[2] + base[2 * hc:]).reshape(*lead, hc, hc)
    c = np.exp(c - c.max(-1, keepdims=True))
    c = c / c.sum(-1, keepdims=True) + hc_eps
    c = c / (c.sum(-2, keepdims=True) + hc_eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdims=True) + hc_eps)
        c = c / (c.sum(-2, keepdims=True) + hc_eps)
    wts = pre if pre_mix is None else np.asarray(pre_mix, np.float64)
    y = (wts[..., None] * xf).sum(-2)
    return {"inv_rms": inv_rms, "mixes": mixes, "pre": pre, "post": post, "comb": c, "y": y}


def weighted_sum_bf16(w, x) -> np.ndarray:
    """``y = sum_j w[j] * x[j]``: fp32 products, summed j = 0, 1, 2, 3 in order, one RNE rounding to
    bf16. ``w [..., 4]`` fp32, ``x [..., 4, D]`` bf16."""
    w = np.asarray(w, np.float32)
    xf = np.asarray(x).astype(np.float32)
    acc = np.float32(0) + w[..., 0, None] * xf[..., 0, :]
    for j in range(1, xf.shape[-2]):
        acc = (acc + w[..., j, None] * xf[..., j, :]).astype(np.float32)
    return acc.astype(np.float32).astype(BF16)


def hc_post_fp32(x, residual, post, comb) -> np.ndarray:
    """``out[..., i, :] = post[i] * x``, then ``+= residual[j] * comb[j, i]`` for j = 0..3, each an
    fp32 multiply and an fp32 add; one rounding to x's dtype."""
    xf = np.asarray(x).astype(np.float32)
    rf = np.asarray(residual).astype(np.float32)
    pf, cf = np.asarray(post).astype(np.float32), np.asarray(comb).astype(np.float32)
    hc = pf.shape[-1]
    out = np.empty(rf.shape, np.float32)
    for i in range(hc):
        acc = (pf[..., i, None] * xf).astype(np.float32)
        for j in range(hc):
            acc = (acc + (rf[..., j, :] * cf[..., j, i, None]).astype(np.float32)).astype(np.float32)
        out[..., i, :] = acc
    return out.astype(np.asarray(x).dtype)
