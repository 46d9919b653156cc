"""npu_mla_preprocess (per-token quant, krope_ctkv) against the bare products it contains.

DeepSeek-V3 shapes (He = 7168, Hcq = 1536, Hckv = 512, D = 128, Dr = 64), ``--heads`` query heads,
``--tokens`` tokens per call (decode: 1; a batch of decodes or a short prefill: 16, 64), bf16
activations, FRACTAL_NZ int8 ``wdqkv`` ``[2112, He]`` and ``wuq`` ``[N*192, 1536]``, bf16
``wuk`` ``[N, 128, 512]``, a PA_BSND cache with block_size 128. Measured in one run, best of
alternating rounds after a warm-up (``_timing.best_times``):

- floor: the op's three products and nothing else: ``int8 x [T, He] @ wdqkv^T`` and
  ``int8 q [T, 1536] @ wuq^T`` through :func:`ascend_emu.emu.matmul.matmul_int8` (exact int32,
  on the engine the op uses; its name is printed: ``"onednn"`` is ``torch._int_mm``, oneDNN's
  VNNI int8 GEMM, the fastest exact int8 engine here), and ``q_nope @ wuk`` per head on the op's
  engine: fp32 BLAS on a pre-widened ``wuk``, or oneDNN bf16 where the op chose it
  (``emu.matmul.matmul_bf16_out_heads``, from 16 tokens with torch loaded);
- machine floor: the same three products, each on the fastest engine this machine has for it
  (``benchmarks/_floor.py``: the int8 engine, oneDNN bf16 or sgemm), with the engine each took;
- the op through ``ascend_emu.ops`` and, with torch, through the torch_npu drop-in
  (``ascend_emu.torch_npu.atb.npu_mla_preprocess`` on torch copies of the same inputs).

Target (docs/performance.md#against-the-floors): the op at most 1.3x this int8-GEMM floor. ``--threads N`` restarts the script
with ``OPENBLAS_NUM_THREADS``, ``NUMBA_NUM_THREADS`` and ``OMP_NUM_THREADS`` set to N
(``_timing.run_with_threads``), so the op and its floors get the same threads.

Usage: ``python benchmarks/bench_mla_preprocess.py [--heads 32] [--tokens 1 16] [--repeat 10]
[--threads N]``
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from _floor import MachineFloor, floor_line, product, ratio_line
from _timing import best_times, have_torch, run_with_threads

TARGET = 1.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeat", type=int, default=10, help="timed rounds (best of)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of OpenBLAS, Numba and torch (default: as the environment has them)")
    args = parser.parse_args()
    setup = run_with_threads(args.threads)
    torch_ok = have_torch()
    import ascend_emu  # noqa: F401  (before torch, as `ascend-emu run` imports it: docs/performance.md "Threads")

    if torch_ok:
        import torch  # noqa: F401  (the drop-in's users have it; the int8 engine then is oneDNN)

    import ml_dtypes

    from ascend_emu.emu.matmul import bf16_engines_used, int8_engine, matmul_bf16_out_heads, matmul_f32, matmul_int8, widen_f32
    from ascend_emu.ops import npu_format_cast, npu_mla_preprocess

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(0)
    he, hcq, hckv, d, dr, block, n = 7168, 1536, 512, 128, 64, 128, args.heads

    def randn(shape, scale):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(bf16)

    def int8(shape):
        return rng.integers(-127, 128, shape).astype(np.int8)

    wdqkv, wuq = int8((2112, he)), int8((n * (d + dr), hcq))  # [2112, He], [N*192, 1536]
    wuk = randn((n, d, hckv), 0.1)  # [N, 128, 512]
    wdqkv_nz, wuq_nz = npu_format_cast(wdqkv, 29), npu_format_cast(wuq, 29)
    wuk32 = widen_f32(wuk)
    print(f"npu_mla_preprocess per_token_quant_symm krope_ctkv, N={n} He={he}; {setup}; int8 engine: "
          f"{int8_engine()}; best of {args.repeat}", flush=True)
    for t in args.tokens:
        blocks = -(-t // block) + 1
        pre = (randn((t, he), 1.0), randn((he,), 1.0), randn((he,), 0.0), wdqkv_nz, np.full(2112, 1e-4, np.float32),
               randn((hcq,), 1.0), randn((hcq,), 0.0), wuq_nz, np.full(n * (d + dr), 1e-4, np.float32),
               randn((hckv,), 1.0), randn((t, dr), 0.5), randn((t, dr), 0.5), wuk,
               np.zeros((blocks, block, 1, hckv), bf16), np.zeros((blocks, block, 1, dr), bf16),
               rng.permutation(blocks * block)[:t].astype(np.int32))
        outs = dict(q_out0=np.zeros((t, n, hckv), bf16), kv_cache_out0=np.zeros((blocks, block, 1, hckv), bf16),
                    q_out1=np.zeros((t, n, dr), bf16), kv_cache_out1=np.zeros((blocks, block, 1, dr), bf16))
        kw = dict(outs, cache_mode="krope_ctkv", quant_mode="per_token_quant_symm")
        x8, q8 = int8((t, he)), int8((t, hcq))
        q_nope = rng.standard_normal((n, t, d), dtype=np.float32)  # [N, T, 128]

        q_nope = q_nope.astype(bf16).astype(np.float32)  # bf16 values, as the op's

        def floor(x8=x8, q8=q8, q_nope=q_nope, t=t):
            matmul_int8(x8, wdqkv, w_nk=True)  # [T, 2112]
            matmul_int8(q8, wuq, w_nk=True)  # [T, N*192]
            # [N, T, 512] on the op's engine: oneDNN bf16 where the op chose it, else sgemm on wuk32
            if ("heads", n, t, d, hckv) in {key[:5] for key, e in bf16_engines_used().items() if e != "sgemm"}:
                matmul_bf16_out_heads(q_nope, wuk)
            else:
                matmul_f32(q_nope, wuk32)

        machine = MachineFloor([product("x@wdqkv", x8, wdqkv.T),  # [K, N] views of the [N, K] weights
                                product("q@wuq", q8, wuq.T),
                                product("q_nope@wuk", q_nope.astype(bf16), wuk)])
        cands = {"floor (int8 x@wdqkv, q@wuq; q_nope@wuk on the op's engine)": floor, "machine": machine,
                 "npu_mla_preprocess (ops)": lambda pre=pre, kw=kw: npu_mla_preprocess(*pre, **kw)}
        if torch_ok:
            from ascend_emu.warmup import Call

            cands["npu_mla_preprocess (drop-in)"] = Call("", "npu_mla_preprocess", pre, kw).through_drop_in()
        times = dict(zip(cands, best_times(list(cands.values()), args.repeat), strict=True))
        base = times[next(iter(cands))]
        t_machine = times.pop("machine")
        print(f"  T={t}", flush=True)
        for name, sec in times.items():
            line = f"    {name:48s} {sec * 1e3:8.3f} ms"
            if sec is not base:
                ratio = sec / base
                line += f"   ratio / floor: {ratio:.2f} ({'meets' if ratio <= TARGET else 'misses'} the target " \
                        f"<= {TARGET})"
            print(line, flush=True)
        print(f"    {floor_line(machine, t_machine)}", flush=True)
        print("    " + "; ".join(ratio_line(name.split(" ", 1)[1].strip("()"), sec, t_machine)
                                for name, sec in times.items() if sec is not base), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
