"""ND -> FRACTAL_NZ layout speed against the machine's copy floor.

Lays out a 7168 x 1536 bf16 matrix (a DeepSeek ``[He, Hcq]`` weight) as FRACTAL_NZ with
:func:`ascend_emu.layouts.nd_to_nz` and compares it with a memcpy of the same bytes
(``np.copyto`` into a preallocated buffer), measured in the same run, in turn: best of N after
a warm-up.
Both the preallocated form (``out=``) and the allocating form (against ``np.copy``) are shown.
The target is at least half the memcpy bandwidth.

Usage: ``python benchmarks/bench_nd_to_nz.py [--m 7168] [--n 1536] [--repeat 20]``
"""

from __future__ import annotations

import argparse
import timeit

import ml_dtypes
import numba
import numpy as np

from ascend_emu.layouts import nd_to_nz, nz_shape

#: Share of the memcpy bandwidth nd_to_nz must reach.
TARGET_RATIO = 0.5


def best_times(fns, repeat: int) -> list[float]:
    """Best wall time of each ``fn()`` over ``repeat`` single runs, after one warm-up run each.

    The candidates run in turn, round after round, so a busy spell of the machine hits them alike.
    """
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], timeit.timeit(fn, number=1))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=7168, help="rows M (default 7168)")
    parser.add_argument("--n", type=int, default=1536, help="columns N (default 1536)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per candidate")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.m, args.n), dtype=np.float32).astype(ml_dtypes.bfloat16)  # [M, N]
    copy_buf = np.empty_like(x)
    nz_buf = np.empty(nz_shape(x.shape, x.dtype), dtype=x.dtype)  # [N/16, M/16, 16, 16]
    gb = x.nbytes / 1e9

    threads = numba.get_num_threads()

    def one_thread():
        numba.set_num_threads(1)
        try:
            nd_to_nz(x, out=nz_buf)
        finally:
            numba.set_num_threads(threads)

    t_copy, t_nz, t_copy_alloc, t_nz_alloc, t_nz_1 = best_times(
        [lambda: np.copyto(copy_buf, x), lambda: nd_to_nz(x, out=nz_buf), lambda: np.copy(x),
         lambda: nd_to_nz(x), one_thread], args.repeat)

    print(f"ND -> FRACTAL_NZ, bf16 [{args.m}, {args.n}] ({x.nbytes / 2**20:.1f} MiB), best of {args.repeat}")
    print(f"  memcpy (np.copyto, preallocated): {gb / t_copy:7.2f} GB/s")
    print(f"  nd_to_nz(x, out=buf):             {gb / t_nz:7.2f} GB/s   ratio {t_copy / t_nz:.2f}"
          f"   ({threads} Numba threads)")
    print(f"  nd_to_nz(x, out=buf), 1 thread:   {gb / t_nz_1:7.2f} GB/s   ratio {t_copy / t_nz_1:.2f}")
    print(f"  np.copy (allocating):             {gb / t_copy_alloc:7.2f} GB/s")
    print(f"  nd_to_nz(x) (allocating):         {gb / t_nz_alloc:7.2f} GB/s   ratio {t_copy_alloc / t_nz_alloc:.2f}")
    verdict = "meets" if t_copy / t_nz >= TARGET_RATIO else "misses"
    print(f"  target: >= {TARGET_RATIO:.2f} of memcpy bandwidth (preallocated) -> {verdict}")


if __name__ == "__main__":
    main()
