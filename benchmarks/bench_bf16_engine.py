"""A bf16-output engine for the products whose fp32 result the kernel rounds straight to bf16:
speed and bits against the emulator's fp32 BLAS path, measured in one run.

The non-quant MLA prolog rounds each of its four products to bf16 right after the matmul (the
Cube's fixpipe output): ``x @ W_dq`` ``[T, 7168] x [7168, 1536]``, ``cq @ W_uq_qr``
``[T, 1536] x [1536, N*192]``, ``q_nope @ W_uk`` (per head ``[T, 128] x [128, 512]``, here as one
``[T, 128] x [128, 512]`` product) and ``x @ W_dkv_kr`` ``[T, 7168] x [7168, 576]``. A product of
two bf16 values is exact in fp32, so engines that accumulate in fp32 differ only in the order of
the sums. Two candidates per product, in alternating rounds:

- ``sgemm``: the emulator's path (``ascend_emu.emu.matmul.matmul_weight`` on a FRACTAL_NZ weight:
  fp32 BLAS on the kept fp32 widening), then round to bf16 (RNE);
- ``torch-bf16``: ``torch.matmul`` on the bf16 tensors (oneDNN: bf16 multiplies, fp32
  accumulation, one rounding to bf16), no widened copy of the weight.

- ``emulator``: ``ascend_emu.emu.matmul.matmul_bf16_out`` in the ``auto`` setting (the engine it
  chose at its first call for the shape, printed; sgemm below ``BF16_MIN_ROWS`` rows), with its
  operand checks and conversions, then the rounding.

Printed per product and T: the median time of each, the median per-round ratio sgemm / torch
(above 1: the bf16 engine is faster), the emulator's median ratio to sgemm and its engine, the
share of output elements whose bf16 bits are equal (torch against sgemm), and the largest
difference in bf16 ulps. Operands are ``randn / sqrt(fan_in)``, no subnormals
(the bf16 dot-product instructions flush subnormal operands to zero: such operands must stay on
the exact path). Thread counts from the environment.

With ``--mkl LIBDIR`` (the ``lib`` folder of the ``mkl`` wheel, holding ``libmkl_rt.so.3``;
an optional extra, never needed) it measures instead an fp32-output bf16 engine for the
products whose fp32 result feeds more fp32 math: MKL's ``cblas_gemm_bf16bf16f32`` through
ctypes against sgemm on pre-widened fp32 operands, with the share of fp32 results whose bits
equal sgemm's, the share equal after a rounding to bf16, and both engines' largest error
against float64. Set ``MKL_THREADING_LAYER=SEQUENTIAL`` (the wheel's OpenMP runtime is another
package) and ``LD_LIBRARY_PATH=LIBDIR``.

Usage: ``python benchmarks/bench_bf16_engine.py [--tokens 1,16] [--heads 32] [--rounds 9] [--mkl LIBDIR]``
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

import ascend_emu  # noqa: F401  (before torch: its OpenMP workers sleep when idle, docs/performance.md#threads)
import ml_dtypes
import numpy as np
import torch

from ascend_emu import ops
from ascend_emu.emu.matmul import bf16_engines_used, matmul_bf16_out, matmul_weight, set_bf16_engine
from ascend_emu.quant.rounding import to_bf16
from ascend_emu.torch_npu._convert import to_torch

BF16 = np.dtype(ml_dtypes.bfloat16)


def _per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in bf16 ulps between two bf16 arrays of finite values (ordered bits)."""
    def ordered(x):
        bits = x.view(np.uint16).astype(np.int32)
        return np.where(bits & 0x8000, 0x8000 - bits, bits)
    return int(np.abs(ordered(a) - ordered(b)).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,16", help="T values, comma-separated")
    parser.add_argument("--heads", type=int, default=32, help="N (W_uq_qr is [1536, N*192])")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds")
    parser.add_argument("--mkl", metavar="LIBDIR", help="measure MKL's cblas_gemm_bf16bf16f32 (module doc)")
    ns = parser.parse_args()
    rng = np.random.default_rng(0)

    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)

    if ns.mkl:
        _mkl(ns, randn)
        return

    shapes = {"x@Wdq": (7168, 1536), "cq@Wuq_qr": (1536, ns.heads * 192), "q@Wuk (one head)": (128, 512),
              "x@Wdkv_kr": (7168, 576)}
    print(f"bf16 x bf16 -> bf16 products, sgemm + rounding against torch.matmul bf16; "
          f"torch {torch.__version__}, {torch.get_num_threads()} torch threads")
    set_bf16_engine("auto")
    print(f"{'product':18} {'T':>3} {'sgemm ms':>9} {'torch ms':>9} {'sgemm/torch':>12} {'emu/sgemm':>10} "
          f"{'emu engine':>12} {'equal bits':>11} {'max ulps':>9}")
    for label, (k, n) in shapes.items():
        w = randn(k, n, scale=k ** -0.5)
        w_nz = ops.npu_format_cast(w, 29)  # as the op gets it: the kept fp32 widening is reused
        w_t = to_torch(w)
        for t in (int(v) for v in ns.tokens.split(",")):
            a = randn(t, k)
            a32, a_t = a.astype(np.float32), to_torch(a)

            def old(a32=a32, w_nz=w_nz):
                return to_bf16(matmul_weight(a32, w_nz))

            def new(a_t=a_t, w_t=w_t):
                return torch.matmul(a_t, w_t)

            def emu(a32=a32, w_nz=w_nz):
                return to_bf16(matmul_bf16_out(a32, w_nz))

            ref, got = old(), new().view(torch.int16).numpy().view(BF16)
            emu()  # the engine the setting picks for this shape (noted by the emulator)
            engine = next((e for key, e in bf16_engines_used().items() if key[2:5] == (t, k, n)), "sgemm")
            equal = float((ref.view(np.uint16) == got.view(np.uint16)).mean())
            ulps = _ulps(ref, got)
            calls = 20 if t * k * n < 1 << 24 else 5
            old_s, new_s, ratios, emu_ratios = [], [], [], []
            for _ in range(ns.rounds + 1):
                o, g, e = _per_call(old, calls), _per_call(new, calls), _per_call(emu, calls)
                old_s.append(o)
                new_s.append(g)
                ratios.append(o / g)
                emu_ratios.append(e / o)
            # the first round warms up
            old_s, new_s, ratios, emu_ratios = old_s[1:], new_s[1:], ratios[1:], emu_ratios[1:]
            print(f"{label:18} {t:3d} {statistics.median(old_s) * 1e3:9.3f} {statistics.median(new_s) * 1e3:9.3f} "
                  f"{statistics.median(ratios):11.2f}x {statistics.median(emu_ratios):9.2f}x {engine:>12} "
                  f"{equal:10.1%} {ulps:9d}")


def _mkl(ns, randn) -> None:
    """The ``--mkl`` measurement (module doc)."""
    lib = ctypes.CDLL(os.path.join(ns.mkl, "libmkl_rt.so.3"))
    gemm = lib.cblas_gemm_bf16bf16f32
    gemm.restype = None
    i32, f32, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    gemm.argtypes = [i32, i32, i32, i32, i32, i32, f32, ptr, i32, ptr, i32, f32, ptr, i32]
    row_major, no_trans = 101, 111
    print(f"bf16 x bf16 -> fp32: sgemm on pre-widened operands against MKL cblas_gemm_bf16bf16f32 "
          f"(MKL_THREADING_LAYER={os.environ.get('MKL_THREADING_LAYER', '')})")
    print(f"{'product':18} {'T':>3} {'sgemm/mkl':>10} {'fp32 equal':>11} {'bf16 equal':>11} {'err mkl':>9} {'err sgemm':>9}")
    for label, (k, n) in {"x@Wdq": (7168, 1536), "cq@Wuq_qr": (1536, ns.heads * 192),
                          "x@Wdkv_kr": (7168, 576)}.items():
        w = randn(k, n, scale=k ** -0.5)
        w32 = w.astype(np.float32)
        for t in (int(v) for v in ns.tokens.split(",")):
            a = randn(t, k)
            a32, out = a.astype(np.float32), np.empty((t, n), np.float32)

            def sgemm(a32=a32, w32=w32):
                return np.matmul(a32, w32)

            def mkl(a=a, w=w, out=out, t=t, k=k, n=n):
                gemm(row_major, no_trans, no_trans, t, n, k, 1.0, a.ctypes.data, k, w.ctypes.data, n, 0.0,
                     out.ctypes.data, n)
                return out

            ref, got = sgemm(), mkl().copy()
            exact = a.astype(np.float64) @ w.astype(np.float64)
            calls = 20 if t * k * n < 1 << 24 else 5
            ratios = [_per_call(sgemm, calls) / _per_call(mkl, calls) for _ in range(ns.rounds + 1)][1:]
            print(f"{label:18} {t:3d} {statistics.median(ratios):9.2f}x "
                  f"{float(np.mean(got.view(np.uint32) == ref.view(np.uint32))):10.1%} "
                  f"{float(np.mean(got.astype(BF16).view(np.uint16) == ref.astype(BF16).view(np.uint16))):10.2%} "
                  f"{np.abs(got - exact).max():9.1e} {np.abs(ref - exact).max():9.1e}")


if __name__ == "__main__":
    main()
