"""Reference for torch_npu.atb.npu_mla_preprocess (MlaPreprocessV2): plain NumPy, one token at a time.

Written from docs/sources.md#rope (plain rotate_half), docs/sources.md#quant_rounding (RmsNormQuant: fp32 -> fp16 -> clamp ->
int8 RINT), docs/sources.md#paged_nz / docs/sources.md#npu_mla_preprocess (layouts, flow) and the numerics the op documents (the kernels' RmsNorm
orders, ``tests/reference/rms_norm.py``; eps 1e-6, ``ctkv_scale`` divides, ``q_nope_scale`` multiplies).
Imports only numpy, ml_dtypes and that module; bf16 rounding is ml_dtypes' ``astype`` (RNE), the int8 matmuls
are int64 products, the W^UK einsum is float64 rounded once to fp32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tests.reference.rms_norm import rms_norm

BF16 = np.dtype(ml_dtypes.bfloat16)
EPS = np.float32(1e-6)
C0_BYTES = 32
NZ_BLOCK = 128


def f32(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def rnd(x32, dtype) -> np.ndarray:
    """One RNE rounding of fp32 to bf16 / fp16."""
    return np.asarray(x32, dtype=np.float32).astype(dtype)


def int8_via_f16(v) -> np.ndarray:
    """fp32 -> fp16 (RNE) -> clamp [-128, 127] in fp16 -> int8 round-half-even."""
    h = np.asarray(v, dtype=np.float32).astype(np.float16).astype(np.float32)
    return np.rint(np.clip(h, -128, 127)).astype(np.int8)


def rms_norm_row(x, gamma, kernel: str) -> np.ndarray:
    """fp32 RmsNorm of one row in the kernel's order (``tests/reference/rms_norm.py``):
    ``"mlapo_quant"`` (RmsNormQuant: ``x * (1 / sqrt(sum(x^2 * (1/H)) + eps)) * gamma``) or
    ``"mlapo_kv"`` (``x / sqrt(sum(x^2) * (1/H) + eps) * gamma``); 64 lanes, pairwise tree."""
    return rms_norm(f32(x), gamma, EPS, kernel)


def quant_row(y, scale, offset):
    """RmsNormQuant's quant step for one fp32 row: per-tensor (scale given) or per-token.

    Returns (int8 row, per-token dequant scale or None)."""
    if scale is not None:
        return int8_via_f16(y * (np.float32(1.0) / np.float32(scale)) + np.float32(offset)), None
    s = np.float32(np.max(np.abs(y)) / np.float32(127))
    if s == 0:
        return np.zeros(y.shape, np.int8), s
    return int8_via_f16(y * (np.float32(1.0) / s)), s


def matmul_dequant_row(q8, w_nk, bias, descale, token_scale, dtype):
    """``round(fp32(q8 @ w^T + bias) * descale [* token_scale])`` for one row, as fp32."""
    acc = w_nk.astype(np.int64) @ q8.astype(np.int64)  # [N] exact
    if bias is not None:
        acc = acc + bias.astype(np.int64)
    y = acc.astype(np.float32) * f32(descale)
    if token_scale is not None:
        y = y * np.float32(token_scale)
    return f32(rnd(y, dtype))


def rope_rows(x, cos, sin) -> np.ndarray:
    """Plain rotate_half RoPE (no de-interleave) of ``[..., 64]`` rows in fp32."""
    x = f32(x)
    rot = np.concatenate([-x[..., 32:], x[..., :32]], axis=-1)
    return x * f32(cos) + rot * f32(sin)


def descale_f32(d) -> np.ndarray:
    """fp32 descale: as given (fp32), or the low 32 bits of an int64 read as fp32 bits."""
    d = np.asarray(d)
    if d.dtype == np.int64:
        return (d.view(np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    return f32(d)


def mla_preprocess_ref(inp: dict, cache_mode: str, quant_mode: str) -> dict:
    """The op's outputs and cache rows, token by token.

    Args:
        inp: ``input, gamma0, beta0, wdqkv [2112, He] int8, descale0, gamma1, beta1,
            wuq [N*192, 1536] int8, descale1, gamma2, cos, sin, wuk [N, 128, 512]`` and the
            optional ``quant_scale0/1, quant_offset0/1, bias0/1, ctkv_scale, q_nope_scale``.

    Returns:
        ``q_out0`` ``[T, N, 512]``, ``q_out1`` ``[T, N, 64]``,
        ``kv_rows`` ``[T, 512]`` (what each token writes to kv_cache, its dtype) and
        ``krope_rows`` ``[T, 64]``.
    """
    x = inp["input"]
    dt = x.dtype
    t = x.shape[0]
    n = inp["wuk"].shape[0]
    per_token = quant_mode == "per_token_quant_symm"
    wuk = inp["wuk"].astype(np.float64)  # [N, 128, 512]
    q0, q1, kv_rows, kr_rows = [], [], [], []
    for i in range(t):
        y = rms_norm_row(x[i], inp["gamma0"], "mlapo_quant") + f32(inp["beta0"])
        q8, s = quant_row(y, None if per_token else f32(inp["quant_scale0"])[0],
                          None if per_token else f32(inp["quant_offset0"])[0])
        mm0 = matmul_dequant_row(q8, inp["wdqkv"], inp.get("bias0"), descale_f32(inp["descale0"]), s, dt)
        kv, q_a = mm0[:576], mm0[576:]
        y = rms_norm_row(q_a, inp["gamma1"], "mlapo_quant") + f32(inp["beta1"])
        q8, s = quant_row(y, None if per_token else f32(inp["quant_scale1"])[0],
                          None if per_token else f32(inp["quant_offset1"])[0])
        mm1 = matmul_dequant_row(q8, inp["wuq"], inp.get("bias1"), descale_f32(inp["descale1"]), s, dt)
        mm1 = mm1.reshape(n, 192)
        nope = np.stack([(mm1[h, :128].astype(np.float64) @ wuk[h]).astype(np.float32) for h in range(n)])
        nope = rnd(nope, dt)  # [N, 512]
        q_pe = rnd(rope_rows(mm1[:, 128:], inp["cos"][i], inp["sin"][i]), dt)  # [N, 64]
        ckv = rms_norm_row(kv[:512], inp["gamma2"], "mlapo_kv")  # fp32 [512]
        krope = rnd(rope_rows(kv[512:], inp["cos"][i], inp["sin"][i]), dt)  # [64]
        if cache_mode == "int8_nzcache":
            q0.append(int8_via_f16(f32(nope) * f32(inp["q_nope_scale"])[:, None]))
            kv_rows.append(int8_via_f16(ckv * (np.float32(1.0) / f32(inp["ctkv_scale"])[0])))
        else:
            q0.append(nope)
            kv_rows.append(rnd(ckv, dt))
        q1.append(q_pe)
        kr_rows.append(krope)
    stack = (lambda rows, shape, dtype: np.stack(rows) if rows else np.zeros(shape, dtype))
    kv_dt = np.int8 if cache_mode == "int8_nzcache" else dt
    return {
        "q_out0": stack(q0, (0, n, 512), kv_dt),
        "q_out1": stack(q1, (0, n, 64), dt),
        "kv_rows": stack(kv_rows, (0, 512), kv_dt),
        "krope_rows": stack(kr_rows, (0, 64), dt),
    }


# ---------------------------------------------------------------------- cache layouts (docs/sources.md#paged_nz, docs/sources.md#npu_mla_preprocess)
def element_offset(slot: int, d: int, *, dim: int, itemsize: int, nz: bool, block_size: int) -> int:
    """Element offset of element ``d`` of ``slot``: ND rows, or per-block ``[D/C0, bs, C0]`` NZ."""
    if not nz:
        return slot * dim + d
    c0 = C0_BYTES // itemsize
    blk, r = divmod(slot, block_size)
    return blk * block_size * dim + (d // c0) * block_size * c0 + r * c0 + d % c0


def write_rows(cache: np.ndarray, rows: np.ndarray, slots, *, nz: bool, block_size: int) -> None:
    """Write ``rows[t]`` to ``slots[t]`` of ``cache`` (raw memory) element by element; -1 skips."""
    flat = cache.reshape(-1)
    dim = rows.shape[1]
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        for d in range(dim):
            flat[element_offset(int(slot), d, dim=dim, itemsize=cache.itemsize, nz=nz,
                                block_size=block_size)] = rows[t, d]


def read_rows(cache: np.ndarray, slots, dim: int, *, nz: bool, block_size: int) -> np.ndarray:
    """The rows at ``slots`` (no -1), element by element."""
    flat = cache.reshape(-1)
    out = np.empty((len(slots), dim), dtype=cache.dtype)
    for t, slot in enumerate(slots):
        for d in range(dim):
            out[t, d] = flat[element_offset(int(slot), d, dim=dim, itemsize=cache.itemsize, nz=nz,
                                            block_size=block_size)]
    return out
