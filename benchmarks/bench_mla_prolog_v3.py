"""npu_mla_prolog_v3 (non-quant and per-tile quant) against the bare matmuls it contains; the
exact int8 matmul path against the integer matmul a developer would write.

Shapes of the seed example: B=8, S=2, N=32, He=7168, Hcq=1536, Hckv=512, D=128, Dr=64,
BlockSize=128. With torch installed each op also runs through the torch_npu drop-in
(``ascend_emu.torch_npu``, torch copies of the same inputs). Every floor is measured in the same
run, and every figure is the best of N alternating runs after a warm-up:

- non-quant, PA_BSND: the floor is ``x @ W_dq``, ``cq @ W_uq_qr``, the per-head
  ``q_nope @ W_uk`` and ``x @ W_dkv_kr`` on the op's bf16-output engine
  (``emu.matmul.matmul_bf16_out`` / ``matmul_bf16_out_heads``: sgemm on the kept fp32 widening
  of the NZ weights and a pre-widened ``W_uk``, or oneDNN bf16 by the emulator's engine rule
  (``auto``: the CPU kind and the shape), which the floor and the op share;
  ``ASCEND_EMU_BF16_ENGINE=sgemm`` for sgemm only); the engines used are printed.
- per-tile (kv_cache_quant_mode=3, 656-byte rows, PA_BSND), partial quant (weight_quant_mode=1)
  and full quant (2): the same four matmuls as the op runs them: int8 x int8 products through
  ``matmul_int8`` on the engine the op uses (exact int32; its name is printed), bf16 ones on the
  op's bf16-output engine as above.
- machine floor (every scenario, beside the floor above): the same products, each on the fastest
  engine this machine has for it (``benchmarks/_floor.py``: sgemm, oneDNN bf16 or the int8
  engine, chosen by timing them at set-up), printed with the engine each product took.
- int8 matmuls (with ``--int8-matmuls``): ``matmul_int8`` on its ``"float64"`` engine (float64
  BLAS on the cached float64 weight) against
  ``np.matmul`` on int32 operands and ``torch.matmul`` on int32 tensors (if torch is installed),
  for the three int8 x int8 shapes of the full-quant op; the results are checked equal.

The targets (docs/performance.md#against-the-floors): non-quant at most 1.2x its floor at 1 and 2 threads (1.5x at 16), the
per-tile scenarios at most 1.3x. Each thread count runs in its own interpreter with
``NUMBA_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and ``OMP_NUM_THREADS`` set to it, so the op and
its floor get the same threads (default: 1 and 2; ``--threads 1,2,4,16`` on a bigger machine).

With ``--spin`` it measures instead what the threading set-up costs (``ascend_emu._threads``): the
non-quant op alone, on ``--spin N`` threads (default 2), in three interpreters: Numba's
OpenMP layer with spinning workers (``OMP_WAIT_POLICY=ACTIVE``), with sleeping ones (``PASSIVE``),
and the ``workqueue`` layer, each line with the layer Numba reports.

Usage: ``python benchmarks/bench_mla_prolog_v3.py [--batch 8] [--seq 2] [--heads 32] [--repeat 20]
[--threads 1,2] [--spin [N]]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
from _floor import MachineFloor, floor_line, product, ratio_line
from _timing import best_times

from ascend_emu.mla import D_NOPE as D
from ascend_emu.mla import D_ROPE as DR
from ascend_emu.mla import HCKV
from ascend_emu.emu.matmul import (bf16_engines_used, int8_engine, matmul_bf16_out, matmul_bf16_out_heads, matmul_int8,
                                   set_int8_engine)
from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3

BF16 = np.dtype(ml_dtypes.bfloat16)
HE, HCQ = 7168, 1536
BLOCK_SIZE = 128
#: Largest accepted ratio op / floor: non-quant (1 and 2 threads), per-tile scenarios.
TARGET_RATIO = 1.2
TARGET_RATIO_TILE = 1.3


def bf16(rng, shape, scale: float) -> np.ndarray:
    """Normal bf16 values of standard deviation ``scale``."""
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)


def int8(rng, shape) -> np.ndarray:
    """Uniform int8 values in [-127, 127]."""
    return rng.integers(-127, 128, shape).astype(np.int8)


def report(title: str, floor_what: str, t_floor: float, t_op: float, t_drop: float | None,
           target: float = TARGET_RATIO, machine: MachineFloor | None = None, t_machine: float = 0.0) -> None:
    """Print the floor, the op through ``ops`` and (``t_drop``, seconds) through the drop-in, then
    the machine floor (``t_machine`` seconds) and the op's ratios to it."""
    label = f"floor ({floor_what}):"
    print(title)
    print(f"  {label} {t_floor * 1e3:8.2f} ms")
    for what, t_x in (("npu_mla_prolog_v3 (ops):", t_op), ("npu_mla_prolog_v3 (drop-in):", t_drop)):
        if t_x is None:
            continue
        ratio = t_x / t_floor
        verdict = "meets" if ratio <= target else "misses"
        print(f"  {what:{len(label)}} {t_x * 1e3:8.2f} ms   ratio / floor: {ratio:.2f} ({verdict} the target <= {target})")
    if machine is not None:
        print(f"  {floor_line(machine, t_machine)}")
        print("  " + "; ".join(ratio_line(what, t_x, t_machine)
                               for what, t_x in (("ops", t_op), ("drop-in", t_drop)) if t_x is not None))


def drop_in(fn, *args, **kwargs):
    """The same call through ``ascend_emu.torch_npu`` (torch copies of the arguments, NZ weights
    cast by the drop-in), or None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    from ascend_emu.warmup import Call

    return Call("", fn.__name__, args, kwargs).through_drop_in()


def _without_threads(argv: list[str]) -> list[str]:
    """``argv`` less its ``--threads`` option (``--threads N`` or ``--threads=N``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--threads":
            skip = True
        elif not a.startswith("--threads="):
            out.append(a)
    return out


def _without_spin(argv: list[str]) -> list[str]:
    """``argv`` less its ``--spin [N]`` option (the children time one set-up each)."""
    out = []
    for i, a in enumerate(argv):
        if a == "--spin" or a.startswith("--spin=") or (i and argv[i - 1] == "--spin" and a.isdigit()):
            continue
        out.append(a)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="B (default 8)")
    parser.add_argument("--seq", type=int, default=2, help="S (default 2)")
    parser.add_argument("--heads", type=int, default=32, help="N (default 32)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per candidate")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--int8-matmuls", action="store_true", help="also compare the int8 matmul paths")
    parser.add_argument("--spin", type=int, nargs="?", const=2, default=0, metavar="THREADS",
                        help="the non-quant op with spinning / sleeping OpenMP workers and the workqueue layer, "
                             "on THREADS threads (default 2)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--op-only", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.spin and not args.child:
        count = str(args.spin)
        base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER")}
        base.update(NUMBA_NUM_THREADS=count, OPENBLAS_NUM_THREADS=count, OMP_NUM_THREADS=count)
        print(f"==== threading set-up, {count} thread(s)", flush=True)
        for label, extra in (("OpenMP, spinning workers (OMP_WAIT_POLICY=ACTIVE)",
                              dict(NUMBA_THREADING_LAYER="omp", OMP_WAIT_POLICY="ACTIVE")),
                             ("OpenMP, sleeping workers (OMP_WAIT_POLICY=PASSIVE)",
                              dict(NUMBA_THREADING_LAYER="omp", OMP_WAIT_POLICY="PASSIVE")),
                             ("workqueue layer", dict(NUMBA_THREADING_LAYER="workqueue"))):
            subprocess.run([sys.executable, __file__, *_without_spin(sys.argv[1:]), "--child", "--op-only", label],
                           env=dict(base, **extra), check=False)
        return
    if not args.child:
        for count in args.threads.split(","):
            env = dict(os.environ, NUMBA_NUM_THREADS=count, OPENBLAS_NUM_THREADS=count, OMP_NUM_THREADS=count)
            print(f"==== {count} thread(s)", flush=True)
            subprocess.run([sys.executable, __file__, *_without_threads(sys.argv[1:]), "--child"], env=env,
                           check=False)
        return
    import numba

    b, s, n = args.batch, args.seq, args.heads
    t = b * s
    shape = (f"B={b} S={s} N={n} He={HE} Hcq={HCQ}, best of {args.repeat}, "
             f"{numba.get_num_threads()} Numba / {os.environ.get('OPENBLAS_NUM_THREADS', '?')} BLAS threads")

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
    cq32 = rng.standard_normal((t, HCQ), dtype=np.float32)  # [T, Hcq]
    q_nope32 = rng.standard_normal((n, t, D), dtype=np.float32)  # [N, T, D]

    cq_b, q_nope_b = (v.astype(BF16).astype(np.float32) for v in (cq32, q_nope32))  # bf16 values, as the op's
    w_uk32 = w_uk.astype(np.float32)

    def uk_product():
        """q_nope @ W_uk on the op's engine: oneDNN where the op chose it, else sgemm on the
        pre-widened weight (the op widens W_uk per call: not counted in the floor)."""
        if ("heads", n, t, D, HCKV) in {key[:5] for key, e in bf16_engines_used().items() if e != "sgemm"}:
            return matmul_bf16_out_heads(q_nope_b, w_uk)
        return np.matmul(q_nope_b, w_uk32)

    def floor():  # the op's engines: sgemm on the kept widening, or oneDNN bf16 where it chose that
        matmul_bf16_out(x32, w_dq_nz)
        matmul_bf16_out(cq_b, w_uq_qr_nz)
        uk_product()
        matmul_bf16_out(x32, w_dkv_kr_nz)

    if args.op_only:
        (t_op,) = best_times([op], args.repeat)
        print(f"  {args.op_only}: npu_mla_prolog_v3 non-quant {t_op * 1e3:8.2f} ms "
              f"(Numba layer {numba.threading_layer()}), {shape}", flush=True)
        return
    drop = drop_in(npu_mla_prolog_v3, x, w_dq_nz, w_uq_qr_nz, w_uk, w_dkv_kr_nz, gamma_cq, gamma_ckv, sin, cos,
                   kv_cache, kr_cache, cache_index=cache_index, cache_mode="PA_BSND")
    x2 = x.reshape(t, HE)  # [T, He] bf16
    cq16, q_nope16 = cq32.astype(BF16), q_nope32.astype(BF16)  # the op's bf16 query_norm and q_nope
    machine = MachineFloor([product("x@Wdq", x2, w_dq), product("cq@Wuq_qr", cq16, w_uq_qr),
                            product("q@Wuk", q_nope16, w_uk), product("x@Wdkv_kr", x2, w_dkv_kr)])
    t_floor, t_machine, t_op, *t_drop = best_times([floor, machine, op] + ([drop] if drop else []), args.repeat)
    report(f"npu_mla_prolog_v3 non-quant PA_BSND, {shape}",
           "x@Wdq, cq@Wuq_qr, q@Wuk per head, x@Wdkv_kr on the op's bf16 engines", t_floor, t_op, (t_drop or [None])[0],
           machine=machine, t_machine=t_machine)
    chosen = ", ".join(f"{kind} [{m}, {k}] x [{k}, {nn}]{f' x {h}' if h > 1 else ''}: {engine}"
                       for (kind, h, m, k, nn, _), engine in sorted(bf16_engines_used().items()))
    print(f"  the op's bf16-output engines (emu.matmul.bf16_engines_used): {chosen or 'sgemm'}")

    # ---- per-tile quant, partial (1, 3, 0) and full (2, 3, 0)
    x_i8 = int8(rng, (b, s, HE))  # [B, S, He]
    w_dq_i8, w_uq_qr_i8, w_dkv_kr_i8 = int8(rng, (HE, HCQ)), int8(rng, (HCQ, n * (D + DR))), int8(rng, (HE, HCKV + DR))
    w_dq_i8_nz, w_uq_qr_i8_nz, w_dkv_kr_i8_nz = (npu_format_cast(w, 29) for w in (w_dq_i8, w_uq_qr_i8, w_dkv_kr_i8))
    rows = np.zeros((block_num, BLOCK_SIZE, 1, 656), dtype=np.int8)  # [BlockNum, BlockSize, 1, 656]
    no_kr = np.zeros((0,), dtype=BF16)
    scales = dict(dequant_scale_w_uq_qr=np.full((1, n * (D + DR)), 1e-3, np.float32),
                  k_nope_clip_alpha=np.ones(1, np.float32))
    full_scales = dict(scales, dequant_scale_x=np.full((t, 1), 1e-2, np.float32),
                       dequant_scale_w_dq=np.full((1, HCQ), 1e-3, np.float32),
                       dequant_scale_w_dkv_kr=np.full((1, HCKV + DR), 1e-3, np.float32))
    x_i8_2d = np.ascontiguousarray(x_i8.reshape(t, HE))  # [T, He]
    q_i8 = rng.integers(-127, 128, (t, HCQ)).astype(np.int8)  # [T, Hcq]
    for wqm, label in ((1, "partial"), (2, "full")):
        full = wqm == 2
        tokens = x_i8 if full else x
        w_down = (w_dq_i8_nz, w_dkv_kr_i8_nz) if full else (w_dq_nz, w_dkv_kr_nz)

        tile_args = (tokens, w_down[0], w_uq_qr_i8_nz, w_uk, w_down[1], gamma_cq, gamma_ckv, sin, cos, rows, no_kr)
        tile_kwargs = dict(full_scales if full else scales, cache_index=cache_index, cache_mode="PA_BSND",
                           weight_quant_mode=wqm, kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1)

        def op_tile(tile_args=tile_args, tile_kwargs=tile_kwargs):
            npu_mla_prolog_v3(*tile_args, **tile_kwargs)

        def floor_tile(full=full):
            if full:
                matmul_int8(x_i8_2d, w_dq_i8_nz)
                matmul_int8(x_i8_2d, w_dkv_kr_i8_nz)
            else:
                matmul_bf16_out(x32, w_dq_nz)
                matmul_bf16_out(x32, w_dkv_kr_nz)
            matmul_int8(q_i8, w_uq_qr_i8_nz)
            uk_product()

        drop = drop_in(npu_mla_prolog_v3, *tile_args, **tile_kwargs)
        down = (x_i8_2d, w_dq_i8, w_dkv_kr_i8) if full else (x2, w_dq, w_dkv_kr)
        machine = MachineFloor([product("x@Wdq", down[0], down[1]), product("q@Wuq_qr", q_i8, w_uq_qr_i8),
                                product("q@Wuk", q_nope16, w_uk), product("x@Wdkv_kr", down[0], down[2])])
        t_floor, t_machine, t_op, *t_drop = best_times([floor_tile, machine, op_tile] + ([drop] if drop else []),
                                                       args.repeat)
        engine = int8_engine()
        kinds = f"int8 ({engine}) x@Wdq, x@Wdkv_kr" if full else "bf16-engine x@Wdq, x@Wdkv_kr"
        report(f"npu_mla_prolog_v3 per-tile ({label} quant, weight_quant_mode={wqm}, 656-byte rows), {shape}",
               f"{kinds}; int8 ({engine}) q@Wuq_qr; bf16-engine q@Wuk", t_floor, t_op, (t_drop or [None])[0],
               TARGET_RATIO_TILE, machine=machine, t_machine=t_machine)

    if not args.int8_matmuls:
        return
    # ---- int8 x int8 matmuls: float64 BLAS vs integer matmul
    print(f"int8 x int8 matmuls of the full-quant op (T={t}), best of {args.repeat}")
    cases = (("x @ W_dq", x_i8.reshape(t, HE), w_dq_i8_nz), ("q @ W_uq_qr", q_i8, w_uq_qr_i8_nz),
             ("x @ W_dkv_kr", x_i8.reshape(t, HE), w_dkv_kr_i8_nz))
    try:
        import torch
    except ModuleNotFoundError:
        torch = None
    for name, a, w in cases:
        set_int8_engine("float64")  # the float64 copy is cached on the NZ weight, as in the op
        a32, w32 = a.astype(np.int32), np.asarray(w).astype(np.int32)
        fns = [lambda a=a, w=w: matmul_int8(a, w), lambda a32=a32, w32=w32: np.matmul(a32, w32)]
        if torch is not None:
            ta, tw = torch.from_numpy(a32), torch.from_numpy(w32)
            fns.append(lambda ta=ta, tw=tw: torch.matmul(ta, tw))
        exact = matmul_int8(a, w)
        assert np.array_equal(exact.astype(np.int64), np.matmul(a32, w32).astype(np.int64)), name
        times = best_times(fns, max(3, args.repeat // 4))
        line = (f"  {name:13s} [{a.shape[0]}, {a.shape[1]}] x [{w.shape[0]}, {w.shape[1]}]: float64 BLAS "
                f"{times[0] * 1e3:7.2f} ms; np.matmul int32 {times[1] * 1e3:8.2f} ms ({times[1] / times[0]:.1f}x)")
        if torch is not None:
            line += f"; torch int32 {times[2] * 1e3:8.2f} ms ({times[2] / times[0]:.1f}x)"
        print(line)


if __name__ == "__main__":
    main()
