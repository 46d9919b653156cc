"""One OpenBLAS thread or all: where waking OpenBLAS's workers pays (``emu.matmul.SMALL_PRODUCT_MACS``).

``ascend_emu`` makes OpenBLAS's idle workers sleep within a millisecond of a call's end (``ascend_emu._threads``),
so a threaded product first wakes them. Two parts, measured in one run (alternating rounds, after a
warm-up; medians of the per-round ratios):

1. fp32 products of the MLA ops' shapes ``[M, K] x [K, N]`` (the per-head ``q_nope @ W_uk``, the
   decode-sized ``x @ W``, the attention's ``K @ q``), each timed on one OpenBLAS thread and on
   ``OPENBLAS_NUM_THREADS``, with a 0.5 ms pause before each candidate so its workers are asleep
   as they are between ops. Printed: both times and the ratio threads / one (above 1: the threads
   lose), beside ``M * N * K``.
2. ``npu_mla_prolog_v3`` per-tile (partial and full quant, N = 32) at T = 1 and 16, with the rule
   on (products of at most ``SMALL_PRODUCT_MACS`` multiply-adds on one thread) and off (every
   product on all threads), the outputs checked byte-equal first.

Run it with ``OPENBLAS_NUM_THREADS`` (and ``NUMBA_NUM_THREADS``, ``OMP_NUM_THREADS``) at the
count to compare, e.g. ``--threads 2`` (``_timing.run_with_threads``).

Usage: ``python benchmarks/bench_blas_threads.py [--threads 2] [--rounds 9]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _timing import have_torch, run_with_threads

SHAPES = ((1, 128, 512), (16, 128, 512), (64, 128, 512), (1, 7168, 576), (1, 7168, 1536), (16, 1536, 512),
          (16, 7168, 576), (16, 7168, 1536), (2048, 576, 16))


def rounds(fns: dict, n: int, pause: float = 0.0) -> dict[str, list[float]]:
    """Per-round seconds of each candidate, the candidates taking turns (round 0 untimed)."""
    times = {k: [] for k in fns}
    for r in range(n + 1):
        for name, fn in fns.items():
            if pause:
                time.sleep(pause)
            t0 = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    setup = run_with_threads(args.threads)
    import ascend_emu  # noqa: F401  (before torch, as `ascend-emu run` imports it: docs/performance.md "Threads")

    if have_torch():
        import torch  # noqa: F401  (the int8 engine then is oneDNN, as for the drop-in's users)
    import ml_dtypes

    from ascend_emu import _threads
    from ascend_emu.emu import matmul
    from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3

    print(f"{setup}; OpenBLAS idle workers: {_threads.OPENBLAS}; SMALL_PRODUCT_MACS = {matmul.SMALL_PRODUCT_MACS}",
          flush=True)
    if not _threads.BLAS_THREADS:
        print("no pthreads OpenBLAS found: nothing to compare")
        return
    rng = np.random.default_rng(0)
    print("1. fp32 products, one OpenBLAS thread against all (0.5 ms pause before each)")
    for m, k, n in SHAPES:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        reps = max(1, int(2e7 // (m * k * n)))

        def one(a=a, b=b, reps=reps):
            with matmul.one_blas_thread():
                for _ in range(reps):
                    np.matmul(a, b)

        def all_(a=a, b=b, reps=reps):
            for _ in range(reps):
                np.matmul(a, b)

        t = rounds({"one": one, "all": all_}, args.rounds, pause=5e-4)
        ratio = statistics.median(y / x for x, y in zip(t["one"], t["all"], strict=True))
        print(f"  [{m}, {k}] x [{k}, {n}]  M*N*K = {m * k * n / 1e6:6.2f}M: one thread "
              f"{statistics.median(t['one']) / reps * 1e6:8.1f} us, all {statistics.median(t['all']) / reps * 1e6:8.1f} us"
              f", all / one {ratio:.2f}", flush=True)

    bf16 = np.dtype(ml_dtypes.bfloat16)
    he, hcq, hckv, d, dr, block, heads = 7168, 1536, 512, 128, 64, 128, 32

    def randn(shape, scale):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(bf16)

    def int8(shape):
        return rng.integers(-127, 128, shape).astype(np.int8)

    print("2. npu_mla_prolog_v3 per-tile, N = 32: small products on one thread (rule on) or on all (off)")
    w_uk, g_cq, g_ckv = randn((heads, d, hckv), 0.1), randn((hcq,), 1.0), randn((hckv,), 1.0)
    w_uq = npu_format_cast(int8((hcq, heads * (d + dr))), 29)
    weights = {1: (npu_format_cast(randn((he, hcq), 0.02), 29), npu_format_cast(randn((he, hckv + dr), 0.02), 29)),
               2: (npu_format_cast(int8((he, hcq)), 29), npu_format_cast(int8((he, hckv + dr)), 29))}
    small = matmul.SMALL_PRODUCT_MACS
    for t in (1, 16):
        for wqm, label in ((1, "partial"), (2, "full")):
            blocks = -(-t // block) + 1
            rows = np.zeros((blocks, block, 1, 656), np.int8)
            kw = dict(dequant_scale_w_uq_qr=np.full((1, heads * (d + dr)), 1e-3, np.float32),
                      k_nope_clip_alpha=np.ones(1, np.float32), cache_mode="PA_BSND", weight_quant_mode=wqm,
                      kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1,
                      cache_index=rng.permutation(blocks * block)[:t].reshape(t, 1).astype(np.int64))
            if wqm == 2:
                kw.update(dequant_scale_x=np.full((t, 1), 1e-2, np.float32),
                          dequant_scale_w_dq=np.full((1, hcq), 1e-3, np.float32),
                          dequant_scale_w_dkv_kr=np.full((1, hckv + dr), 1e-3, np.float32))
            x = int8((t, 1, he)) if wqm == 2 else randn((t, 1, he), 1.0)
            w_dq, w_dkv = weights[wqm]
            sin, cos = randn((t, 1, dr), .5), randn((t, 1, dr), .5)

            def call(x=x, w_dq=w_dq, w_dkv=w_dkv, rows=rows, kw=kw, sin=sin, cos=cos):
                return npu_mla_prolog_v3(x, w_dq, w_uq, w_uk, w_dkv, g_cq, g_ckv, sin, cos, rows,
                                         np.zeros((0,), bf16), **kw)

            def rule(value, fn=call):
                def run():
                    matmul.SMALL_PRODUCT_MACS = value
                    try:
                        return fn()
                    finally:
                        matmul.SMALL_PRODUCT_MACS = small
                return run

            on, off = rule(small), rule(0)
            got_on, got_off = [np.asarray(o).tobytes() for o in on()], [np.asarray(o).tobytes() for o in off()]
            same = "same bytes" if got_on == got_off else "BYTES DIFFER"
            tm = rounds({"on": on, "off": off}, args.rounds)
            ratio = statistics.median(x / y for x, y in zip(tm["on"], tm["off"], strict=True))
            print(f"  T={t:2d} {label:7s} quant: rule on {statistics.median(tm['on']) * 1e3:7.2f} ms, off "
                  f"{statistics.median(tm['off']) * 1e3:7.2f} ms, on / off {ratio:.2f} ({same})", flush=True)


if __name__ == "__main__":
    main()
