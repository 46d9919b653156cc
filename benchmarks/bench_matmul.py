"""The exact int8 x int8 -> int32 product (``ascend_emu.emu.matmul.matmul_int8``) on each engine,
and what the engine choice does to the ops that use it.

1. The full-quant prolog's three int8 products, ``x @ W_dq`` ``[T, 7168] x [7168, 1536]``,
   ``q @ W_uq_qr`` ``[T, 1536] x [1536, N*192]`` and ``x @ W_dkv_kr`` ``[T, 7168] x [7168, 576]``, at
   T = 1, 16 and 64 (FRACTAL_NZ weights, as the op gets them): ``"float64"`` (float64 BLAS on the
   kept float64 weight, the path before) against ``"sgemm"`` (fp32 BLAS over K-chunks of 1024) and
   ``"onednn"`` (``torch._int_mm``, with torch). Each line checks the engines' results equal.
   For reference, in the same rounds, the bf16 x bf16 product of the same shape on the machine
   floor's bf16 engines (``benchmarks/_floor.py``: ``"sgemm"`` on pre-widened fp32 operands and,
   with torch, ``"onednn-bf16"``), and which of all the line's candidates is the machine floor of
   that shape (the fastest: an int8 engine or a bf16 one).
2. Per call, at T = 16: ``npu_mla_prolog_v3`` per-tile (656-byte rows) with partial
   (weight_quant_mode=1) and full (2) quant, and ``npu_mla_preprocess`` (per-token quant,
   krope_ctkv, He = 7168), with the int8 engine switched between ``"float64"`` (before) and each
   other engine (after) round by round.

Timing: the candidates of one line take turns in every round (one untimed warm-up round first),
so a busy spell of a shared machine slows them alike; each figure is the median over rounds, and
each ratio the median of the per-round ratios ``float64 / engine`` (above 1: the engine is faster).

Thread counts come from the environment (``OPENBLAS_NUM_THREADS``, ``NUMBA_NUM_THREADS``,
``OMP_NUM_THREADS``); on a shared machine run each count in its own process.

Usage: ``python benchmarks/bench_matmul.py [--heads 32] [--tokens 1,16,64] [--rounds 15]
[--engines sgemm,onednn] [--skip-ops]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time

import ml_dtypes
import numpy as np
from _floor import candidates

from ascend_emu.emu import matmul
from ascend_emu.ops import npu_format_cast, npu_mla_preprocess, npu_mla_prolog_v3

BF16 = np.dtype(ml_dtypes.bfloat16)
HE, HCQ, HCKV, D, DR, BLOCK = 7168, 1536, 512, 128, 64, 128


def engines() -> list[str]:
    """The engines this machine can run, the reference ``"float64"`` first."""
    have_torch = importlib.util.find_spec("torch") is not None
    return ["float64", "sgemm"] + (["onednn"] if have_torch else [])


def rounds_median(fns: dict[str, callable], rounds: int, base: str) -> tuple[dict, dict]:
    """Median time per candidate and median per-round ratio ``base / candidate`` (module doc)."""
    times = {k: [] for k in fns}
    for r in range(rounds + 1):  # round 0 warms up
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r:
                times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: statistics.median(b / x for b, x in zip(times[base], times[k], strict=True)) for k in fns if k != base}
    return med, ratio


def with_engine(name: str, fn):
    def run():
        before = matmul.set_int8_engine(name)
        try:
            return fn()
        finally:
            matmul.set_int8_engine(before)
    return run


def bf16(rng, shape, scale: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)


def int8(rng, shape) -> np.ndarray:
    return rng.integers(-128, 128, shape, dtype=np.int8)


def products(args, rng, names) -> None:
    n = args.heads
    weights = {"x @ W_dq": npu_format_cast(int8(rng, (HE, HCQ)), 29),
               "q @ W_uq_qr": npu_format_cast(int8(rng, (HCQ, n * (D + DR))), 29),
               "x @ W_dkv_kr": npu_format_cast(int8(rng, (HE, HCKV + DR)), 29)}
    print(f"1. int8 x int8 -> int32 products of the full-quant prolog (N={n}), median of {args.rounds} rounds; "
          "ratio = float64 / engine")
    weights16 = {label: bf16(rng, w.shape, 0.02) for label, w in weights.items()}  # the bf16 reference
    for t in args.tokens:
        for label, w in weights.items():
            a = int8(rng, (t, w.shape[0]))
            results = {e: with_engine(e, lambda w=w, a=a: matmul.matmul_int8(a, w))() for e in names}
            assert all(np.array_equal(results["float64"], r) for r in results.values()), label
            fns = {e: with_engine(e, lambda w=w, a=a: matmul.matmul_int8(a, w)) for e in names}
            fns.update({f"bf16 {e}": fn for e, fn in
                        candidates(bf16(rng, (t, w.shape[0]), 1.0), weights16[label]).items()})
            med, ratio = rounds_median(fns, args.rounds, "float64")
            line = f"  T={t:3d} {label:13s} [{t}, {w.shape[0]}] x [{w.shape[0]}, {w.shape[1]}]: " \
                   f"float64 {med['float64'] * 1e3:8.2f} ms"
            for e in list(fns)[1:]:
                line += f"; {e} {med[e] * 1e3:8.2f} ms ({ratio[e]:.2f}x)"
            line += f"; fastest (machine floor): {min(med, key=med.get)}"
            print(line, flush=True)


def op_calls(args, rng, names) -> None:
    n, t = args.heads, args.op_tokens
    b, s = t, 1
    x = bf16(rng, (b, s, HE), 1.0)
    w_uk = bf16(rng, (n, D, HCKV), 0.1)
    gamma_cq, gamma_ckv = bf16(rng, (HCQ,), 1.0), bf16(rng, (HCKV,), 1.0)
    sin, cos = bf16(rng, (b, s, DR), 0.5), bf16(rng, (b, s, DR), 0.5)
    blocks = -(-t // BLOCK) + 1
    cache_index = rng.permutation(blocks * BLOCK)[:t].reshape(b, s).astype(np.int64)
    rows = np.zeros((blocks, BLOCK, 1, 656), dtype=np.int8)
    w_dq_nz, w_dkv_kr_nz = npu_format_cast(bf16(rng, (HE, HCQ), 0.02), 29), npu_format_cast(
        bf16(rng, (HE, HCKV + DR), 0.02), 29)
    w_dq_i8, w_uq_qr_i8, w_dkv_kr_i8 = (npu_format_cast(int8(rng, shape), 29)
                                        for shape in ((HE, HCQ), (HCQ, n * (D + DR)), (HE, HCKV + DR)))
    scales = dict(dequant_scale_w_uq_qr=np.full((1, n * (D + DR)), 1e-3, np.float32),
                  k_nope_clip_alpha=np.ones(1, np.float32))
    full_scales = dict(scales, dequant_scale_x=np.full((t, 1), 1e-2, np.float32),
                       dequant_scale_w_dq=np.full((1, HCQ), 1e-3, np.float32),
                       dequant_scale_w_dkv_kr=np.full((1, HCKV + DR), 1e-3, np.float32))
    calls = {}
    for wqm, label in ((1, "partial"), (2, "full")):
        full = wqm == 2
        pos = (int8(rng, (b, s, HE)) if full else x, w_dq_i8 if full else w_dq_nz, w_uq_qr_i8, w_uk,
               w_dkv_kr_i8 if full else w_dkv_kr_nz, gamma_cq, gamma_ckv, sin, cos, rows, np.zeros((0,), BF16))
        kw = dict(full_scales if full else scales, cache_index=cache_index, cache_mode="PA_BSND", weight_quant_mode=wqm,
                  kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1)
        calls[f"npu_mla_prolog_v3 per-tile {label} quant"] = (lambda pos=pos, kw=kw: npu_mla_prolog_v3(*pos, **kw))

    pre = (bf16(rng, (t, HE), 1.0), bf16(rng, (HE,), 1.0), bf16(rng, (HE,), 0.0),
           npu_format_cast(int8(rng, (2112, HE)), 29), np.full(2112, 1e-4, np.float32), bf16(rng, (HCQ,), 1.0),
           bf16(rng, (HCQ,), 0.0), npu_format_cast(int8(rng, (n * 192, HCQ)), 29), np.full(n * 192, 1e-4, np.float32),
           bf16(rng, (HCKV,), 1.0), bf16(rng, (t, DR), 0.5), bf16(rng, (t, DR), 0.5), w_uk,
           np.zeros((blocks, BLOCK, 1, HCKV), BF16), np.zeros((blocks, BLOCK, 1, DR), BF16),
           rng.permutation(blocks * BLOCK)[:t].astype(np.int32))
    outs = dict(q_out0=np.zeros((t, n, HCKV), BF16), kv_cache_out0=np.zeros((blocks, BLOCK, 1, HCKV), BF16),
                q_out1=np.zeros((t, n, DR), BF16), kv_cache_out1=np.zeros((blocks, BLOCK, 1, DR), BF16))
    calls["npu_mla_preprocess per-token quant krope_ctkv"] = (
        lambda: npu_mla_preprocess(*pre, **outs, cache_mode="krope_ctkv", quant_mode="per_token_quant_symm"))

    print(f"2. per call at T={t} (N={n}, He={HE}), int8 engine switched round by round, median of {args.rounds} "
          "rounds; ratio = before (float64) / after (engine)")
    for label, fn in calls.items():
        med, ratio = rounds_median({e: with_engine(e, fn) for e in names}, args.rounds, "float64")
        line = f"  {label:46s} float64 {med['float64'] * 1e3:8.2f} ms"
        for e in names[1:]:
            line += f"; {e} {med[e] * 1e3:8.2f} ms ({ratio[e]:.2f}x)"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=32, help="N (default 32)")
    parser.add_argument("--tokens", default="1,16,64", help="T of the products, comma-separated (default 1,16,64)")
    parser.add_argument("--op-tokens", type=int, default=16, help="T of the op calls (default 16)")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (default 15)")
    parser.add_argument("--skip-ops", action="store_true", help="only the products")
    parser.add_argument("--engines", default="", help="engines after float64, comma-separated (default: all here)")
    args = parser.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    names = engines()
    if args.engines:
        names = ["float64"] + [e for e in args.engines.split(",") if e in names and e != "float64"]
    print(f"engines: {', '.join(names)}; default here: {matmul.default_int8_engine()}; "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'default')} BLAS threads, {os.cpu_count()} CPUs")
    rng = np.random.default_rng(0)
    products(args, rng, names)
    if not args.skip_ops:
        op_calls(args, rng, names)


if __name__ == "__main__":
    main()
