"""RmsNorm inputs whose result depends on the order the squares are summed in, for the op tests.

On ordinary data the kernels' RmsNorm orders (``tests/reference/rms_norm.py``) and others (an
element-order fp32 chain, pairwise blocks, 32 lanes, a float64 sum) give the same bf16 / int8
outputs almost everywhere, so an op test on such data cannot tell a changed order from the
right one. Here:

- :func:`order_sensitive_rows`: bf16-valued rows whose kernel-order ``rms`` (``1 / rms`` for a
  kernel that multiplies by it) differs from that of every order in :func:`other_rms` (the
  square-sum orders of :func:`other_square_sums` and 1/H applied on the other side of the sum;
  found by a deterministic seed search);
- :func:`edge_gamma`: a gamma that puts some output elements one fp32 ulp of ``rms`` (or of
  ``1 / rms``) from a rounding edge of the output dtype, on either side. The output is monotone
  in ``rms``, so any other ``rms`` flips at least one of them: the op's output is then
  bit-identical to the kernel-order reference only if the op sums in the kernel's order. Other
  finishing steps (``x / rms`` for ``x * (1 / rms)`` and back) are caught by columns where they
  give another output (``alternatives``).

Imports numpy, ml_dtypes and the independent reference only (not the code under test).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tests.reference.rms_norm import KERNELS, LANES, lane_sums, square_sum, tree_64

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


def other_rms(x: np.ndarray, eps, kernel: str) -> dict:
    """fp32 ``rms`` of row ``x`` for the orders of :func:`other_square_sums` and, unless H is a power
    of two (then scaling by fp32(1/H) is exact on either side), for the kernel's lanes with fp32(1/H)
    applied on the other side of the sum ("1/H toggled": per square for a kernel that scales the
    sum, to the sum for one that scales the squares): name -> fp32 scalar."""
    x = np.asarray(x, dtype=np.float32)
    h = x.size
    rms = {name: rms_from_sum(s, h, eps, kernel) for name, s in other_square_sums(x, kernel).items()}
    if h & (h - 1) == 0:
        return rms
    pairwise, prescale, _ = KERNELS[kernel]
    inv_h = np.float32(1.0) / np.float32(h)
    sq = x * x if prescale else x * x * inv_h
    ss = tree_64(lane_sums(sq, pairwise))
    ms = np.float32(ss * inv_h) if prescale else ss
    rms["1/H toggled"] = np.float32(np.sqrt(np.float32(ms + np.float32(eps))))
    return rms


def rms_factor(rms, kernel: str) -> np.float32:
    """What ``kernel`` scales ``x`` by: ``fp32(1 / rms)`` for a kernel that multiplies by it, else
    ``rms`` itself (it divides); ``rms`` an fp32 scalar or array."""
    rms = np.float32(rms)
    return np.float32(np.float32(1.0) / rms) if KERNELS[kernel][2] else rms


def kernel_rms(x: np.ndarray, eps, kernel: str) -> np.float32:
    """The fp32 ``rms`` of row ``x`` in ``kernel``'s order (the reference's square sum)."""
    x = np.asarray(x, dtype=np.float32)
    return rms_from_sum(square_sum(x, kernel), x.size, eps, kernel)


def normal_row(rng: np.random.Generator, h: int) -> np.ndarray:
    """A row ``[H]`` of bf16 values (as fp32): standard normal, one element per lane times 16."""
    x = rng.standard_normal(h).astype(np.float32)
    big = rng.integers(0, max(h // LANES, 1), LANES) * LANES + np.arange(LANES)  # one per lane
    x[big[big < h]] *= np.float32(16.0)
    return x.astype(BF16).astype(np.float32)


def order_sensitive_rows(count: int, h: int, eps, kernel: str, draw=normal_row) -> np.ndarray:
    """``count`` rows ``[count, H]`` of ``draw(rng, H)`` (bf16 values as fp32; default
    :func:`normal_row`; ``rng`` seeded 0, 1, ... in turn) whose kernel-order ``rms`` differs from
    the ``rms`` of every order of :func:`other_rms`, also once taken as :func:`rms_factor`."""
    rows = []
    for seed in range(5000):
        x = np.asarray(draw(np.random.default_rng(seed), h), dtype=np.float32)
        r = kernel_rms(x, eps, kernel)
        if all(rms_factor(o, kernel) != rms_factor(r, kernel) for o in other_rms(x, eps, kernel).values()):
            rows.append(x)
            if len(rows) == count:
                return np.stack(rows)
    raise AssertionError(f"only {len(rows)} order-sensitive rows of {h} for {kernel}")


def edge_gamma(q: np.ndarray, finish, candidates: np.ndarray, default: np.ndarray, per_side: int = 4,
               alternatives=()):
    """A gamma ``[H]`` (fp32 values): ``default`` except in ``2 * per_side`` columns ``i``, where it is a
    candidate whose output ``finish(q', g)[t, i]`` for some row ``t`` at ``q' = q[t]`` differs from
    the output at ``q[t]`` one fp32 ulp up (``per_side`` columns) or one ulp down (the others); and
    ``per_side`` more columns for each of ``alternatives``, where its output differs from the one at
    ``q``.

    ``q`` ``[T]`` is what each row's output is computed from (``rms`` for ``x / rms``, ``1 / rms`` for
    ``x * (1 / rms)``); ``finish(q [T, 1, 1], g [1, 1, C]) -> [T, H, C]`` must be monotone in ``q``
    (it is for fixed x and gamma > 0). ``alternatives``: callables ``g [1, 1, C] -> [T, H, C]``,
    other ways of finishing from the same rows (say ``x / rms`` where the kernel multiplies by
    ``1 / rms``). Rows of bf16 values give few distinct ``x / rms * gamma`` mantissas each, hence
    several rows (and, where the op has one, a scale searched by the caller). Returns None where
    fewer than ``per_side`` columns have an edge on a side or differ for an alternative.
    """
    q = np.asarray(q, dtype=np.float32).reshape(-1, 1, 1)
    g = np.asarray(candidates, dtype=np.float32).reshape(1, 1, -1)
    at = finish(q, g)  # [T, H, C]
    changed = [finish(np.nextafter(q, np.float32(lim)), g) for lim in (np.inf, 0.0)]  # one ulp up, down
    gamma = np.array(default, dtype=np.float32, copy=True)
    used = set()
    for other in changed + [alt(g) for alt in alternatives]:
        hits = (at != other).any(axis=0)  # [H, C]
        cols = [i for i in np.flatnonzero(hits.any(axis=1)) if i not in used][:per_side]
        if len(cols) < per_side:
            return None
        for i in cols:
            gamma[i] = g[0, 0, np.flatnonzero(hits[i])[0]]
            used.add(i)
    return gamma


def candidates(lo: float = 0.5, hi: float = 2.0, dtype=BF16) -> np.ndarray:
    """Every value of the 16-bit float ``dtype`` (bf16, fp16) in ``[lo, hi)`` (``0 <= lo < hi``), as fp32."""
    dtype = np.dtype(dtype)
    bits = np.arange(np.array(lo, np.float32).astype(dtype).view(np.uint16),
                     np.array(hi, np.float32).astype(dtype).view(np.uint16), dtype=np.uint16)
    return bits.view(dtype).astype(np.float32)
