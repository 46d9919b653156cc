"""Independent float64 reference of DeepSeek-V4's KV compressor (no ascend_emu imports).

Written from the reference model's ``Compressor`` (hicann/cann-recipes-infer
``models/deepseek_v4_flash_tilelang_and_inductor_af/model.py``: the prefill path that pools whole
groups of a sequence at once, ``overlap_transform`` for coff 2) and vllm-ascend's
``csrc/attention/compressor/README.md`` (formulas; RoPE half / interleave; the state cache holds
one row per position: kv then score with ape). It sees a request's whole token history at once,
so a test that feeds the op in steps checks the state the op carried between them.

Everything in float64 from the bf16 / fp16 / fp32 inputs' exact values; no intermediate
rounding (the model's cast of the pooled row to bf16 before its norm is left out).
"""

from __future__ import annotations

import numpy as np


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32).astype(np.float64)


def projections(x_hist, wkv, wgate, ape, r: int) -> tuple[np.ndarray, np.ndarray]:
    """kv ``[P, coff * D]`` and score with ape ``[P, coff * D]`` of positions 0..P-1 (the rows
    of the state cache)."""
    x = f64(x_hist)
    kv = x @ f64(wkv).T
    score = x @ f64(wgate).T + f64(ape)[np.arange(x.shape[0]) % r]
    return kv, score


def _rotate(v: np.ndarray, rotary_mode: int) -> np.ndarray:
    if rotary_mode == 1:  # half: rotate_half
        h = v.shape[-1] // 2
        return np.concatenate([-v[..., h:], v[..., :h]], axis=-1)
    out = np.empty_like(v)  # interleave: pairs (2i, 2i + 1)
    out[..., 0::2] = -v[..., 1::2]
    out[..., 1::2] = v[..., 0::2]
    return out


def group_rows(x_hist, wkv, wgate, ape, norm_weight, groups, sin_rows, cos_rows, *, r: int, coff: int,
               eps: float, rotary_mode: int, rope_dim: int = 64) -> np.ndarray:
    """The compressed rows ``[len(groups), D]`` of groups ``groups`` of one request whose tokens
    at positions 0..P-1 are ``x_hist [P, H]``; ``sin_rows`` / ``cos_rows [len(groups), 64]``."""
    kv, score = projections(x_hist, wkv, wgate, ape, r)
    d = kv.shape[1] // coff
    out = np.zeros((len(groups), d))
    for i, g in enumerate(groups):
        own = slice(g * r, g * r + r)
        if coff == 1:
            k, s = kv[own], score[own]
        else:
            if g == 0:
                pk, ps = np.zeros((r, d)), np.full((r, d), -np.inf)
            else:
                prev = slice(g * r - r, g * r)
                pk, ps = kv[prev, :d], score[prev, :d]
            k = np.concatenate([pk, kv[own, d:]])
            s = np.concatenate([ps, score[own, d:]])
        w = np.exp(s - s.max(axis=0))
        w /= w.sum(axis=0)
        c = (w * k).sum(axis=0)
        y = c / np.sqrt(np.mean(c * c) + eps) * f64(norm_weight)
        tail = y[d - rope_dim:]
        y[d - rope_dim:] = tail * f64(cos_rows[i]) + _rotate(tail, rotary_mode) * f64(sin_rows[i])
        out[i] = y
    return out


def completed_groups(start: int, used: int, r: int) -> list[int]:
    """Groups whose last position is among positions ``start .. start + used - 1``."""
    return [g for g in range(start // r, (start + used) // r)]


def state_rows_written(table_row, start: int, used: int, block_size: int) -> list[tuple[int, int, int]]:
    """``(position, block, row)`` of each state row a call writes (cache_mode 1): every position
    of the call whose block-table entry is not 0."""
    rows = []
    for p in range(start, start + used):
        blk = int(table_row[p // block_size])
        if blk != 0:
            rows.append((p, blk, p % block_size))
    return rows


def ring_rows_written(block: int, start: int, used: int, r: int, coff: int,
                      block_size: int) -> list[tuple[int, int, int]]:
    """``(position, block, row)`` of each state row a cache_mode 2 call writes (the 950's ring,
    vllm-ascend ``op_kernel/arch35/compressor_block_vec.h`` ``SaveState``): one block per request,
    row ``position % block_size``, only the positions from the last group boundary reached,
    less one group for coff 2 (what the next call may read)."""
    first = max((start + used) // r * r - (coff - 1) * r, 0)
    return [(p, block, p % block_size) for p in range(max(start, first), start + used)]
