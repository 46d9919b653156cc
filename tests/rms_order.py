"""RmsNorm inputs whose result depends on the order the squares are summed in, for the op tests.

On ordinary data the kernels' RmsNorm orders (``tests/reference/rms_norm.py``) and others (an
element-order fp32 chain, pairwise blocks, 32 lanes, a float64 sum) give the same bf16 / int8
outputs almost everywhere, so an op test on such data cannot tell a changed order from the
right one. Here:

- :func:`order_sensitive_rows`: bf16-valued rows whose kernel-order ``rms`` differs from the
  ``rms`` of every order in :func:`other_square_sums` (found by a deterministic seed search);
- :func:`edge_gamma`: a gamma that puts some output elements one fp32 ulp of ``rms`` (or of
  ``1 / rms``) from a rounding edge of the output dtype, on either side. The output is monotone
  in ``rms``, so any other ``rms`` flips at least one of them: the op's output is then
  bit-identical to the kernel-order reference only if the op sums in the kernel's order.

Imports numpy, ml_dtypes and the independent reference only (not the code under test).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tests.reference.rms_norm import KERNELS, LANES, square_sum, tree_64

BF16 = np.dtype(ml_dtypes.bfloat16)


def _pairwise(sq: np.ndarray) -> np.float32:
    """Blocks of ``w <= 64`` lanes (the fewest halvings of H) added neighbour to neighbour, then the lane tree."""
    blocks = sq.reshape(1, -1)
    while blocks.shape[1] > LANES and blocks.shape[1] % 2 == 0:
        blocks = blocks.reshape(blocks.shape[0] * 2, -1)
    while blocks.shape[0] > 1:
        blocks = blocks[0::2] + blocks[1::2]
    lanes = np.zeros(LANES, np.float32)
    lanes[:blocks.shape[1]] = blocks[0]
    return tree_64(lanes)


def _lanes32(sq: np.ndarray) -> np.float32:
    """32 lanes adding the 32-element repeats in order (tail masked), then a neighbour-pair tree."""
    lanes = np.zeros(32, np.float32)
    reps, tail = divmod(sq.size, 32)
    for r in range(reps):
        lanes = sq[r * 32:(r + 1) * 32] + lanes
    lanes[:tail] = sq[reps * 32:] + lanes[:tail]
    while lanes.size > 1:
        lanes = lanes[0::2] + lanes[1::2]
    return lanes[0]


def other_square_sums(x: np.ndarray, kernel: str) -> dict:
    """fp32 sums of the squares of row ``x`` (times fp32(1/H) first for ``kernel``'s prescale)
    in orders other than the kernels' 64 in-order lanes: name -> fp32 scalar."""
    x = np.asarray(x, dtype=np.float32)
    sq = x * x
    if KERNELS[kernel][1]:
        sq = sq * (np.float32(1.0) / np.float32(x.size))
    return {"element order": np.cumsum(sq, dtype=np.float32)[-1], "pairwise blocks": _pairwise(sq),
            "32 lanes": _lanes32(sq), "float64": np.float32(np.sum(sq.astype(np.float64)))}


def rms_from_sum(ss, h: int, eps, kernel: str) -> np.float32:
    """``sqrt(ms + eps)`` with ``ms = ss * fp32(1/H)`` (``ss`` itself for a prescaling kernel), fp32."""
    ss = np.float32(ss)
    ms = ss if KERNELS[kernel][1] else np.float32(ss * (np.float32(1.0) / np.float32(h)))
    return np.float32(np.sqrt(np.float32(ms + np.float32(eps))))


def kernel_rms(x: np.ndarray, eps, kernel: str) -> np.float32:
    """The fp32 ``rms`` of row ``x`` in ``kernel``'s order (the reference's square sum)."""
    x = np.asarray(x, dtype=np.float32)
    return rms_from_sum(square_sum(x, kernel), x.size, eps, kernel)


def order_sensitive_rows(count: int, h: int, eps, kernel: str) -> np.ndarray:
    """``count`` rows ``[count, H]`` (standard normal, one element per lane times 16, bf16 values as
    fp32; seeds 0, 1, ... in turn) whose kernel-order ``rms`` differs from the ``rms`` of every
    order of :func:`other_square_sums`."""
    rows = []
    for seed in range(5000):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(h).astype(np.float32)
        big = rng.integers(0, max(h // LANES, 1), LANES) * LANES + np.arange(LANES)  # one per lane
        x[big[big < h]] *= np.float32(16.0)
        x = x.astype(BF16).astype(np.float32)
        r = kernel_rms(x, eps, kernel)
        if all(rms_from_sum(s, h, eps, kernel) != r for s in other_square_sums(x, kernel).values()):
            rows.append(x)
            if len(rows) == count:
                return np.stack(rows)
    raise AssertionError(f"only {len(rows)} order-sensitive rows of {h} for {kernel}")


def edge_gamma(q: np.ndarray, finish, candidates: np.ndarray, default: np.ndarray, per_side: int = 4):
    """A gamma ``[H]`` (fp32 values): ``default`` except in ``2 * per_side`` columns ``i``, where it is a
    candidate whose output ``finish(q', g)[t, i]`` for some row ``t`` at ``q' = q[t]`` differs from
    the output at ``q[t]`` one fp32 ulp up (``per_side`` columns) or one ulp down (the others).

    ``q`` ``[T]`` is what each row's output is computed from (``rms`` for ``x / rms``, ``1 / rms`` for
    ``x * (1 / rms)``); ``finish(q [T, 1, 1], g [1, 1, C]) -> [T, H, C]`` must be monotone in ``q``
    (it is for fixed x and gamma > 0). Rows of bf16 values give few distinct ``x / rms * gamma``
    mantissas each, hence several rows (and, where the op has one, a scale searched by the caller).
    Returns None where fewer than ``per_side`` columns have an edge on a side.
    """
    q = np.asarray(q, dtype=np.float32).reshape(-1, 1, 1)
    g = np.asarray(candidates, dtype=np.float32).reshape(1, 1, -1)
    at = finish(q, g)  # [T, H, C]
    hits = {side: (at != finish(np.nextafter(q, np.float32(lim)), g)).any(axis=0)  # [H, C]
            for side, lim in (("up", np.inf), ("down", 0.0))}
    gamma = np.array(default, dtype=np.float32, copy=True)
    used = set()
    for side in ("up", "down"):
        cols = [i for i in np.flatnonzero(hits[side].any(axis=1)) if i not in used][:per_side]
        if len(cols) < per_side:
            return None
        for i in cols:
            gamma[i] = g[0, 0, np.flatnonzero(hits[side][i])[0]]
            used.add(i)
    return gamma


def bf16_candidates(lo: float = 0.5, hi: float = 2.0) -> np.ndarray:
    """Every bf16 value in ``[lo, hi)``, as fp32."""
    bits = np.arange(np.array(lo, np.float32).astype(BF16).view(np.uint16),
                     np.array(hi, np.float32).astype(BF16).view(np.uint16), dtype=np.uint16)
    return bits.view(BF16).astype(np.float32)
