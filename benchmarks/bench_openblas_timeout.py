"""How long OpenBLAS's idle workers should poll: ops at several ``OPENBLAS_THREAD_TIMEOUT`` values,
alternated in one process.

After each threaded call, OpenBLAS's idle workers poll for ``2**OPENBLAS_THREAD_TIMEOUT`` CPU
cycles before they sleep (``ascend_emu._threads``). Too short, and the back-to-back products of
one op wake them each time; too long, and they spin on the cores the op's own Numba kernels, torch's
threads or the next op need. This script restarts the workers with each timeout in turn
(:func:`ascend_emu._threads.restart_openblas`), round after round in reversed order every other
round, and prints each op's median time per call at each timeout and its ratio to the last
timeout given (default: ``ascend_emu``'s own, :data:`ascend_emu._threads.OPENBLAS_TIMEOUT`).

Ops (``ascend_emu`` imported before torch, as ``ascend-emu run`` does): the int8 C8 and the bf16
``npu_fused_infer_attention_score_v2`` decode (cases of ``bench_fused_infer_attention_score.py``),
``npu_kv_quant_sparse_flash_attention`` b = 1 and 4 (``bench_sparse_attention.py``),
``npu_lightning_indexer`` (``bench_lightning_indexer.py``'s default case),
``npu_mla_prolog_v3`` non-quant at T = 1 and 16 (N = 32, He = 7168, Hcq = 1536), and a loop of one
torch matmul ``[16, 7168] x [7168, 1536]`` then that prolog (``bench_mixed_threads.py``'s loop).

Usage: ``python benchmarks/bench_openblas_timeout.py [--timeouts 4 12 16 18 20 28] [--rounds 5]
[--seconds 0.15] [--threads 2] [--only c8 prolog ...]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import ascend_emu  # noqa: F401  (before torch, as `ascend-emu run` imports it)
import ml_dtypes
import numpy as np
from _timing import run_with_threads

from ascend_emu import _threads
from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3

BF16 = np.dtype(ml_dtypes.bfloat16)


def workloads(rng) -> dict:
    """``{name: call}`` of the ops the module doc lists."""
    import bench_fused_infer_attention_score as fia
    import bench_sparse_attention as sfa
    import torch

    calls = {}
    for b, n, kv, c8 in ((16, 128, 1024, True), (64, 16, 2048, True), (16, 128, 1024, False)):
        calls[f"FIA {'C8' if c8 else 'bf16'} B={b} N={n} kv={kv}"] = fia.op_call(*fia.make_inputs(rng, b, n, kv, c8))
    for b in (1, 4):
        calls[f"KV-quant SFA b={b}"] = sfa.op_call(sfa.make_inputs(rng, b))
    calls["indexer b=1 kv=4096"] = indexer_call(rng)

    def r(shape, scale):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)

    n, he, hcq = 32, 7168, 1536
    w_dq, w_uq_qr, w_dkv_kr = (npu_format_cast(r(s, 0.02), 29) for s in ((he, hcq), (hcq, n * 192), (he, 576)))
    w_uk, g_cq, g_ckv = r((n, 128, 512), 0.1), r((hcq,), 1.0), r((512,), 1.0)
    for t in (1, 16):
        x, sin, cos = r((t, 1, he), 1.0), r((t, 1, 64), 0.5), r((t, 1, 64), 0.5)  # [T, 1, He], [T, 1, Dr]
        kv, kr = np.zeros((2, 128, 1, 512), BF16), np.zeros((2, 128, 1, 64), BF16)  # PA_BSND caches
        idx = np.arange(t, dtype=np.int64).reshape(t, 1)  # cache_index [T, 1]
        calls[f"prolog_v3 non-quant T={t}"] = (
            lambda x=x, sin=sin, cos=cos, kv=kv, kr=kr, idx=idx: npu_mla_prolog_v3(
                x, w_dq, w_uq_qr, w_uk, w_dkv_kr, g_cq, g_ckv, sin, cos, kv, kr, cache_index=idx,
                cache_mode="PA_BSND"))
    ta, tb = torch.randn(16, he), torch.randn(he, hcq)
    prolog = calls["prolog_v3 non-quant T=16"]

    def loop():
        torch.mm(ta, tb)
        prolog()
    calls["torch mm, then prolog_v3 T=16"] = loop
    return calls


def indexer_call(rng):
    """``npu_lightning_indexer`` as ``bench_lightning_indexer.py`` runs it by default: B = 1, N1 = 64,
    D = 128, 4096 of 8192 cached tokens (PA_BSND, block 256), top 2048."""
    from ascend_emu.ops import npu_lightning_indexer

    b, kv_len, s2, bs, n1, d = 1, 4096, 8192, 256, 64, 128
    nb = b * s2 // bs
    query = rng.standard_normal((b, 1, n1, d)).astype(BF16)  # [B, 1, N1, D]
    key = rng.standard_normal((nb, bs, 1, d)).astype(BF16)  # [blocks, bs, 1, D]
    weights = rng.uniform(-1, 1, (b, 1, n1)).astype(BF16)  # [B, 1, N1]
    kw = dict(actual_seq_lengths_query=np.ones(b, np.int32), actual_seq_lengths_key=np.full(b, kv_len, np.int32),
              block_table=rng.permutation(nb).astype(np.int32).reshape(b, -1), layout_query="BSND",
              layout_key="PA_BSND", sparse_count=2048, sparse_mode=3)
    return lambda: npu_lightning_indexer(query, key, weights, **kw)


def per_call(fn, seconds: float) -> float:
    """Mean seconds per call over at least ``seconds`` (at least 2 calls), after one untimed call
    and a short pause (the workers restarted by the timeout change start on the untimed call)."""
    fn()
    time.sleep(0.02)
    start, calls = time.perf_counter(), 0
    while calls < 2 or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeouts", type=int, nargs="+", default=[4, 12, 16, 18, 20, 28],
                    help="log2 cycles; ratios are to the last one (default 4 12 16 18 20 28, then ascend_emu's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.15, help="timed seconds per op, timeout and round")
    ap.add_argument("--threads", type=int, default=2, help="threads of OpenBLAS, Numba and torch (default 2)")
    ap.add_argument("--only", nargs="*", help="ops whose name contains one of these")
    args = ap.parse_args()
    setup = run_with_threads(args.threads)
    timeouts = list(dict.fromkeys(args.timeouts + [_threads.OPENBLAS_TIMEOUT]))
    if _threads.quiet_openblas() == "none":
        print("no pthreads OpenBLAS with openblas_read_env / blas_thread_shutdown_ in this NumPy: nothing to vary")
        return
    print(f"threads: {setup}; ratios to timeout {timeouts[-1]} (2**{timeouts[-1]} cycles); median of "
          f"{args.rounds} alternating rounds, ms per call")
    for name, fn in workloads(np.random.default_rng(0)).items():
        if args.only and not any(o in name for o in args.only):
            continue
        fn()
        times = {t: [] for t in timeouts}
        for i in range(args.rounds):
            for t in timeouts if i % 2 == 0 else timeouts[::-1]:
                _threads.restart_openblas(t)
                times[t].append(per_call(fn, args.seconds) * 1e3)
        base = statistics.median(times[timeouts[-1]])
        cells = [f"2**{t}: {statistics.median(v):7.2f} ({statistics.median(v) / base:.2f})" for t, v in times.items()]
        print(f"  {name:32s} " + "  ".join(cells), flush=True)
    _threads.restart_openblas(_threads.OPENBLAS_TIMEOUT)


if __name__ == "__main__":
    main()
