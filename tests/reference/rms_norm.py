"""Reference RmsNorm in the AscendC kernels' fp32 order: plain NumPy, shared by the op references.

Written from the kernel sources (ops-transformer @ cannmirror 05c401f), independently of
``ascend_emu.emu.kernels``; imports only numpy.

Sum of squares, as the vector unit forms it (256-byte repeats = 64 fp32 lanes):

- "in order" (mla_prolog ``arch32/rms_norm.h`` L43-L54; MlaPreprocess ``ReduceSumCustom``,
  ``mla_preprocess_bf16.h`` L594-L629): the row as ``[repeats, 64]``; the 64 lane sums start at
  zero and add one repeat after the other; a last partial repeat adds to its first lanes only.
- "pairwise" (kv_rms_norm_rope_cache ``*_pa_nz_quant.h`` L426-L437): the ``[repeats, 64]``
  blocks added neighbour to neighbour until one block is left (512: 8 -> 4 -> 2 -> 1).
- then ``WholeReduceSum`` over the 64 lanes: neighbour pairs, 64 -> 32 -> ... -> 1 (the
  binary-tree order of the AscendC reduction docs).

Then ``* (1/H)`` (or, MlaPreprocess RmsNormQuant, each square times ``1/H`` before the sum),
``+ eps``, ``sqrt``, and ``x / rms * gamma * scale`` (RmsNormQuant: ``x * (1 / rms) * gamma``).
"""

from __future__ import annotations

import numpy as np

LANES = 64
#: kernel -> (pairwise blocks, squares scaled by 1/H before the sum, multiply by 1/rms)
KERNELS = {
    "mla_prolog": (False, False, False),
    "mlapo_kv": (False, False, False),
    "kv_cache": (True, False, False),
    "mlapo_quant": (False, True, True),
}


def tree_64(lanes: np.ndarray) -> np.ndarray:
    """``[..., 64]`` fp32 lanes -> ``[...]``: neighbour pairs added, level by level."""
    v = np.asarray(lanes, dtype=np.float32)
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    return v[..., 0]


def lane_sums(sq: np.ndarray, pairwise: bool) -> np.ndarray:
    """``[..., H]`` fp32 squares -> ``[..., 64]`` fp32 lane sums (see the module doc)."""
    sq = np.asarray(sq, dtype=np.float32)
    lead, h = sq.shape[:-1], sq.shape[-1]
    reps, tail = divmod(h, LANES)
    blocks = sq[..., :reps * LANES].reshape(*lead, reps, LANES)  # [..., repeats, 64]
    if pairwise:
        assert tail == 0 and reps & (reps - 1) == 0, "pairwise blocks need H = 64 * 2^k"
        while blocks.shape[-2] > 1:
            blocks = blocks[..., 0::2, :] + blocks[..., 1::2, :]
        return blocks[..., 0, :]
    lanes = np.zeros((*lead, LANES), dtype=np.float32)
    for r in range(reps):
        lanes = blocks[..., r, :] + lanes
    lanes[..., :tail] = sq[..., reps * LANES:] + lanes[..., :tail]
    return lanes


def square_sum(x, kernel: str) -> np.ndarray:
    """The kernel's fp32 sum of squares over the last axis (RmsNormQuant: of ``x^2 * (1/H)``)."""
    x = np.asarray(x, dtype=np.float32)
    pairwise, prescale, _ = KERNELS[kernel]
    sq = x * x
    if prescale:
        sq = sq * (np.float32(1.0) / np.float32(x.shape[-1]))
    return tree_64(lane_sums(sq, pairwise))


def rms_norm(x, gamma, eps, kernel: str, scale=1.0) -> np.ndarray:
    """fp32 RmsNorm over the last axis in ``kernel``'s order (a key of :data:`KERNELS`)."""
    x = np.asarray(x, dtype=np.float32)
    _, prescale, reciprocal = KERNELS[kernel]
    ss = square_sum(x, kernel)[..., None]
    ms = ss if prescale else ss * (np.float32(1.0) / np.float32(x.shape[-1]))
    rms = np.sqrt(ms + np.float32(eps))
    y = x * (np.float32(1.0) / rms) if reciprocal else x / rms
    return y * np.asarray(gamma, dtype=np.float32) * np.float32(scale)


def rms_norm_f64_sum(x, gamma, eps, kernel: str, scale=1.0) -> np.ndarray:
    """``kernel``'s formula with its sum of squares accumulated in float64 and rounded once to fp32
    (RmsNormQuant: the sum of ``x^2 / H``): the accuracy yardstick of the fidelity test."""
    x = np.asarray(x, dtype=np.float32)
    _, prescale, reciprocal = KERNELS[kernel]
    h = x.shape[-1]
    ss64 = np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    if prescale:
        ms = (ss64 / h).astype(np.float32)
    else:
        ms = ss64.astype(np.float32) * (np.float32(1.0) / np.float32(h))
    rms = np.sqrt(ms + np.float32(eps))
    y = x * (np.float32(1.0) / rms) if reciprocal else x / rms
    return y * np.asarray(gamma, dtype=np.float32) * np.float32(scale)
