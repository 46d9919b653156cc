"""ND -> FRACTAL_NZ layout speed against the machine's copy floor.

Lays out a 7168 x 1536 bf16 matrix (a DeepSeek ``[He, Hcq]`` weight) as FRACTAL_NZ with
:func:`ascend_emu.layouts.nd_to_nz` and compares it with a memcpy of the same bytes
(``np.copyto`` into a preallocated buffer: the machine floor of this data movement, engine
"bandwidth", ``benchmarks/_floor.py``), measured in the same run, in turn: best of N after
a warm-up. Three phases, each with its own copy figure: the default Numba thread count, one
thread, and the allocating forms (``nd_to_nz(x)`` against ``np.copy``). The target is at least
half the memcpy bandwidth (first phase). On a machine shared with other busy processes the
parallel figure swings widely; run it more than once.

Usage: ``python benchmarks/bench_nd_to_nz.py [--m 7168] [--n 1536] [--repeat 20]``
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numba
import numpy as np
from _floor import BANDWIDTH, movement
from _timing import best_times

from ascend_emu.layouts import nd_to_nz, nz_shape

#: Share of the memcpy bandwidth nd_to_nz must reach.
TARGET_RATIO = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=7168, help="rows M (default 7168)")
    parser.add_argument("--n", type=int, default=1536, help="columns N (default 1536)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per candidate")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.m, args.n), dtype=np.float32).astype(ml_dtypes.bfloat16)  # [M, N]
    nz_buf = np.empty(nz_shape(x.shape, x.dtype), dtype=x.dtype)  # [N/16, M/16, 16, 16]
    gb = x.nbytes / 1e9

    threads = numba.get_num_threads()
    copy = movement("ND -> NZ", x.nbytes).run  # a copy of as many bytes
    nz = lambda: nd_to_nz(x, out=nz_buf)  # noqa: E731
    # three phases, each against its own memcpy figure: switching the thread count or allocating
    # inside a round would disturb the other candidates
    t_copy, t_nz = best_times([copy, nz], args.repeat)
    numba.set_num_threads(1)
    try:
        t_copy_1, t_nz_1 = best_times([copy, nz], args.repeat)
    finally:
        numba.set_num_threads(threads)
    t_copy_alloc, t_nz_alloc = best_times([lambda: np.copy(x), lambda: nd_to_nz(x)], args.repeat)

    print(f"ND -> FRACTAL_NZ, bf16 [{args.m}, {args.n}] ({x.nbytes / 2**20:.1f} MiB), best of {args.repeat}")
    rows = [(f"machine floor ({BANDWIDTH}: np.copyto)", t_copy, None),
            (f"nd_to_nz(x, out=buf), {threads} threads", t_nz, t_copy),
            (f"machine floor ({BANDWIDTH}), again", t_copy_1, None),
            ("nd_to_nz(x, out=buf), 1 thread", t_nz_1, t_copy_1),
            (f"{BANDWIDTH}, allocating (np.copy)", t_copy_alloc, None),
            ("nd_to_nz(x) (allocating)", t_nz_alloc, t_copy_alloc)]
    for label, t, floor in rows:
        ratio = f"   ratio {floor / t:.2f}" if floor else ""
        print(f"  {label + ':':38s}{gb / t:7.2f} GB/s{ratio}")
    verdict = "meets" if t_copy / t_nz >= TARGET_RATIO else "misses"
    print(f"  target: >= {TARGET_RATIO:.2f} of the machine floor's copy bandwidth (preallocated, {threads} threads) -> {verdict}")


if __name__ == "__main__":
    main()
