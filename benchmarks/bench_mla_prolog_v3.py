"""npu_mla_prolog_v3 (non-quant, PA_BSND) against the bare fp32 matmuls it contains.

Shapes of the seed example: B=8, S=2, N=32, He=7168, Hcq=1536, Hckv=512, D=128, Dr=64,
BlockSize=128. The floor is measured in the same run: ``x @ W_dq``, ``cq @ W_uq_qr``, the
per-head ``q_nope @ W_uk`` and ``x @ W_dkv_kr`` as fp32 BLAS calls on pre-widened fp32 weights
(what the op cannot avoid). Both are the best of N alternating runs after a warm-up. The
target is at most 1.5x the floor.

Usage: ``python benchmarks/bench_mla_prolog_v3.py [--batch 8] [--seq 2] [--heads 32] [--repeat 20]``
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3

BF16 = np.dtype(ml_dtypes.bfloat16)
HE, HCQ, HCKV, D, DR = 7168, 1536, 512, 128, 64
BLOCK_SIZE = 128
#: Largest accepted ratio op / floor.
TARGET_RATIO = 1.5


def best_times(fns, repeat: int) -> list[float]:
    """Best wall time of each ``fn()`` over ``repeat`` rounds, after one warm-up round; the
    candidates alternate within each round so that both see the same machine load."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def bf16(rng, shape, scale: float) -> np.ndarray:
    """Normal bf16 values of standard deviation ``scale``."""
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="B (default 8)")
    parser.add_argument("--seq", type=int, default=2, help="S (default 2)")
    parser.add_argument("--heads", type=int, default=32, help="N (default 32)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per candidate")
    args = parser.parse_args()
    b, s, n = args.batch, args.seq, args.heads
    t = b * s

    rng = np.random.default_rng(0)
    x = bf16(rng, (b, s, HE), 1.0)  # [B, S, He]
    w_dq = bf16(rng, (HE, HCQ), 0.02)  # [He, Hcq]
    w_uq_qr = bf16(rng, (HCQ, n * (D + DR)), 0.03)  # [Hcq, N*(D+Dr)]
    w_uk = bf16(rng, (n, D, HCKV), 0.1)  # [N, D, Hckv]
    w_dkv_kr = bf16(rng, (HE, HCKV + DR), 0.02)  # [He, Hckv+Dr]
    gamma_cq = bf16(rng, (HCQ,), 1.0)  # [Hcq]
    gamma_ckv = bf16(rng, (HCKV,), 1.0)  # [Hckv]
    sin = bf16(rng, (b, s, DR), 0.5)  # [B, S, Dr]
    cos = bf16(rng, (b, s, DR), 0.5)  # [B, S, Dr]
    block_num = -(-t // BLOCK_SIZE) + 1
    kv_cache = np.zeros((block_num, BLOCK_SIZE, 1, HCKV), dtype=BF16)  # [BlockNum, BlockSize, 1, Hckv]
    kr_cache = np.zeros((block_num, BLOCK_SIZE, 1, DR), dtype=BF16)  # [BlockNum, BlockSize, 1, Dr]
    cache_index = rng.permutation(block_num * BLOCK_SIZE)[:t].reshape(b, s).astype(np.int64)  # [B, S]
    w_dq_nz, w_uq_qr_nz, w_dkv_kr_nz = (npu_format_cast(w, 29) for w in (w_dq, w_uq_qr, w_dkv_kr))

    def op():
        npu_mla_prolog_v3(x, w_dq_nz, w_uq_qr_nz, w_uk, w_dkv_kr_nz, gamma_cq, gamma_ckv, sin, cos, kv_cache,
                          kr_cache, cache_index=cache_index, cache_mode="PA_BSND")

    x32 = x.astype(np.float32).reshape(t, HE)  # [T, He]
    w_dq32, w_uq_qr32, w_uk32, w_dkv_kr32 = (w.astype(np.float32) for w in (w_dq, w_uq_qr, w_uk, w_dkv_kr))
    cq32 = rng.standard_normal((t, HCQ), dtype=np.float32)  # [T, Hcq]
    q_nope32 = rng.standard_normal((n, t, D), dtype=np.float32)  # [N, T, D]

    def floor():
        np.matmul(x32, w_dq32)
        np.matmul(cq32, w_uq_qr32)
        np.matmul(q_nope32, w_uk32)
        np.matmul(x32, w_dkv_kr32)

    t_floor, t_op = best_times([floor, op], args.repeat)
    ratio = t_op / t_floor
    print(f"npu_mla_prolog_v3 non-quant PA_BSND, B={b} S={s} N={n} He={HE} Hcq={HCQ}, best of {args.repeat}")
    print(f"  fp32 matmul floor (x@Wdq, cq@Wuq_qr, q@Wuk per head, x@Wdkv_kr): {t_floor * 1e3:8.2f} ms")
    print(f"  npu_mla_prolog_v3:                                              {t_op * 1e3:8.2f} ms")
    verdict = "meets" if ratio <= TARGET_RATIO else "misses"
    print(f"  ratio op / floor: {ratio:.2f} ({verdict} the target <= {TARGET_RATIO})")


if __name__ == "__main__":
    main()
