"""A torch matmul and an emulated op in one loop, against the two run apart (docs/performance.md#threads).

Drop-in users always have torch loaded: torch's OpenMP threads (its MKL / oneDNN matmuls), Numba's
threads and OpenBLAS's threads then share the cores. This script runs, in one fresh interpreter
per set-up, rounds of three candidates taking turns: ``K`` torch matmuls alone (fp32
``[16, 7168] x [7168, 1536]``), ``K`` calls of ``npu_mla_prolog_v3`` alone (non-quant, B=1 S=1
N=32, through ``ascend_emu.ops``), and ``K`` iterations of one torch matmul then one prolog call.
It prints the medians and the median per-round ratio ``mixed / (torch alone + prolog alone)``
(1.0: the two do not disturb each other).

Set-ups (each in both import orders, torch first and ascend_emu first): the environment as given
(what ``ascend_emu._threads`` sets up by itself, recorded in the printed line); the same with
``OPENBLAS_THREAD_TIMEOUT=28`` (OpenBLAS's default spin, which ``ascend_emu`` then leaves alone:
the set-up before it shortened that spin); ``OMP_WAIT_POLICY=PASSIVE``; ``OMP_WAIT_POLICY=PASSIVE``
with ``OPENBLAS_THREAD_TIMEOUT=4``.
Thread counts: ``--threads N`` sets ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
``NUMBA_NUM_THREADS`` (default: as the environment has them).

Usage: ``python benchmarks/bench_mixed_threads.py [--rounds 7] [--calls 5] [--threads 2]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

SETUPS = (("as given (ascend_emu's own set-up)", {}),
          ("OpenBLAS's default spin kept (OPENBLAS_THREAD_TIMEOUT=28, the set-up before)",
           {"OPENBLAS_THREAD_TIMEOUT": "28"}),
          ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}),
          ("PASSIVE + OPENBLAS_THREAD_TIMEOUT=4", {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}))


def child(order: str, rounds: int, calls: int) -> None:
    if order == "torch first":
        import torch

        import ascend_emu
    else:
        import ascend_emu  # noqa: F401  (the import order is what this measures)
        import torch
    import ml_dtypes
    import numpy as np

    from ascend_emu import _threads
    from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(0)

    def r(shape, scale):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(bf16)

    n, he, hcq = 32, 7168, 1536
    x = r((1, 1, he), 1.0)
    w_dq, w_uq_qr, w_dkv_kr = (npu_format_cast(r(s, 0.02), 29) for s in ((he, hcq), (hcq, n * 192), (he, 576)))
    w_uk, g_cq, g_ckv, sin, cos = r((n, 128, 512), 0.1), r((hcq,), 1.0), r((512,), 1.0), r((1, 1, 64), .5), r(
        (1, 1, 64), .5)
    kv, kr = np.zeros((2, 128, 1, 512), bf16), np.zeros((2, 128, 1, 64), bf16)
    idx = np.array([[3]], np.int64)
    ta, tb = torch.randn(16, he), torch.randn(he, hcq)

    def prolog():
        npu_mla_prolog_v3(x, w_dq, w_uq_qr, w_uk, w_dkv_kr, g_cq, g_ckv, sin, cos, kv, kr, cache_index=idx,
                          cache_mode="PA_BSND")

    def t_alone():
        for _ in range(calls):
            torch.mm(ta, tb)

    def p_alone():
        for _ in range(calls):
            prolog()

    def mixed():
        for _ in range(calls):
            torch.mm(ta, tb)
            prolog()

    times = {"torch": [], "prolog": [], "mixed": []}
    for i in range(rounds + 1):
        for name, fn in (("torch", t_alone), ("prolog", p_alone), ("mixed", mixed)):
            t0 = time.perf_counter()
            fn()
            if i:
                times[name].append((time.perf_counter() - t0) / calls)
    ratio = statistics.median(m / (t + p) for t, p, m in zip(times["torch"], times["prolog"], times["mixed"], strict=True))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    import numba

    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel launched (decode-sized work runs on one thread)
        layer = "not started"
    print(f"    {order:18s} torch {med['torch']:7.2f} ms, prolog {med['prolog']:7.2f} ms, mixed {med['mixed']:7.2f} ms:"
          f" {ratio:.2f}x the parts apart (ascend_emu threads: {_threads.CHOICE}, Numba layer "
          f"{layer}, OpenBLAS {_threads.OPENBLAS}, torch {torch.get_num_threads()} threads)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5, help="calls per candidate per round")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--child", default="")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rounds, args.calls)
        return
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")}
    if args.threads:
        base.update(OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
                    NUMBA_NUM_THREADS=str(args.threads))
    print(f"median of {args.rounds} rounds x {args.calls} calls; threads: "
          f"{base.get('OMP_NUM_THREADS', 'default')} OMP / {base.get('OPENBLAS_NUM_THREADS', 'default')} BLAS / "
          f"{base.get('NUMBA_NUM_THREADS', 'default')} Numba", flush=True)
    for label, extra in SETUPS:
        print(f"  {label}", flush=True)
        for order in ("torch first", "ascend_emu first"):
            subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--calls", str(args.calls),
                            "--child", order], env=dict(base, **extra), check=False)


if __name__ == "__main__":
    main()
