"""Per-call cost of every op at B=1 through the torch_npu drop-in against ``ascend_emu.ops``, in
both import orders and at 1 and 2 threads.

Each op runs on the same B = 1 inputs through ``ascend_emu.ops`` (NumPy) and through
``ascend_emu.torch_npu.<op>`` (torch copies of them, :meth:`ascend_emu.warmup.Call.through_drop_in`),
the two taking turns round after round; every figure is the median over ``--rounds`` rounds, and
drop-in / ops ratios and the microseconds the drop-in adds are medians of each round's pair.

A second pass measures the Python around the compiled work ("outside"): every Numba dispatcher and
``matmul_f32`` / ``matmul_int8`` / ``matmul_weight`` of the emu modules are wrapped with a timer
whose time is subtracted (its own ~0.3 us per kernel counts as compiled work), and the matmuls are stubbed (each
returns its first result again), because after streaming tens of MB of weights through BLAS the
code around the matmuls runs on cold CPU caches. Targets (docs/performance.md#per-call-cost): the drop-in within 1.1x of
``ops`` (about 6 us added to ~30 us), <= 60 us outside the compiled work through the drop-in and
<= 30 us through ``ops``.

The script runs itself in a fresh interpreter per (thread count, import order): ``torch`` imported
before ``ascend_emu`` (as torch_npu scripts do) or after it, each with the threading set-up of
``ascend_emu._threads`` that order gets, ``NUMBA_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` set.

Cases (B = 1, one token): ``npu_format_cast`` of a bf16 [64, 64] weight; ``npu_kv_rmsnorm_rope_cache``
bf16 PA_NZ; ``npu_mla_prolog`` / ``_v2`` / ``_v3`` non-quant PA_NZ, N = 1 (He = 7168, Hcq = 1536);
``npu_mla_preprocess`` bf16 krope_ctkv out=, He = 2048, N = 1; ``npu_lightning_indexer`` bf16
PA_BSND, 256 kv tokens, sparse_count 64; ``npu_sparse_flash_attention`` bf16 PA_BSND and
``npu_kv_quant_sparse_flash_attention`` per-tile int8, N = 16, 64 selected of 256 kv tokens.

Device pass (same process, taking turns with the two above): the drop-in call with every tensor on
the ``npu`` device (:class:`~ascend_emu.torch_npu._npu_tensor.NPUTensor`\ s over the same memory,
what ``.npu()`` gives by default) against the same call with the tensors as the ``mark`` device
model gave them (CPU tensors marked as on the NPU, the old default): ``npu/mark`` is the median of
each round's ratio, target <= 1.05 (docs/performance.md#per-call-cost). The two share their
tensors' memory, so in a round they run one untimed mark call, then mark, npu, npu, mark (half
the calls each): a call that runs right after the ``ops`` call (which reads its own copies of the
inputs) would otherwise find the shared weights out of the CPU caches, and the other one in them
(about 12 % of the MLA prolog's time, either way round).

Clock: ``--clock wall`` (the default) times rounds with ``time.perf_counter``; ``--clock cpu`` with
``time.process_time``, the CPU time of the process (every thread), which leaves out the time the
process waits for a core: on a machine shared with other work, at one thread, the per-call times
and ratios it gives are those of the process when it runs, not of the queue for the cores.

Usage: ``python benchmarks/bench_overhead.py [--rounds 9] [--seconds 0.03] [--threads 1 2]
[--order torch-first emu-first] [--clock wall|cpu]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time

ORDERS = ("torch-first", "emu-first")
#: Targets (docs/performance.md#per-call-cost): us outside the compiled work through ops / the drop-in; drop-in / ops per
#: call; us the drop-in adds (1.1x of ~30 us).
TARGET_OPS_US, TARGET_DROP_IN_US, TARGET_RATIO, TARGET_ADDED_US = 30.0, 60.0, 1.1, 6.0
#: Drop-in per call with tensors on the npu device / with CPU tensors marked as on the NPU.
TARGET_DEVICE_RATIO = 1.05
#: First call with a warm Numba cache, ms (docs/performance.md#first-calls-and-warm-up).
TARGET_FIRST_MS = 150.0
#: emu modules whose Numba dispatchers and matmul helpers count as compiled work.
EMU_MODULES = ("ascend_emu.emu.kernels", "ascend_emu.emu.kv_rmsnorm_rope_cache", "ascend_emu.emu.mla_prolog",
               "ascend_emu.emu.mla_preprocess", "ascend_emu.emu.lightning_indexer", "ascend_emu.emu.sparse_flash_attention",
               "ascend_emu.emu.matmul",
               "ascend_emu.layouts.nz", "ascend_emu.quant.rounding", "ascend_emu.quant.schemes")
MATMULS = ("matmul_f32", "matmul_int8", "matmul_weight", "matmul_weight_heads")


class CompiledTimer:
    """Wraps the emu modules' Numba dispatchers and matmul helpers; ``inside`` sums their wall time.

    With ``stub_blas`` the matmul helpers return the result of their first call with the same
    operand shapes instead of multiplying: what is left is the Python overhead without the cache
    pollution of streaming large weights (the outputs are then wrong; the benchmark discards them).
    """

    def __init__(self, stub_blas: bool = False):
        import numba

        self.stub_blas = stub_blas
        self._results = {}
        self.inside = 0.0
        self._saved = []
        self._depth = 0
        for name in EMU_MODULES:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
            for attr, value in list(vars(mod).items()):
                if isinstance(value, numba.core.registry.CPUDispatcher) or attr in MATMULS:
                    self._saved.append((mod, attr, value))

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            clock = _clock
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside += clock() - start
                self._depth -= 1
        return timed

    def _stub(self, fn):
        def stubbed(*args, **kwargs):
            key = (fn.__name__,) + tuple((a.shape, a.dtype) for a in args) + tuple(sorted(kwargs))
            if key not in self._results:
                self._results[key] = fn(*args, **kwargs)
            return self._results[key]
        return stubbed

    def __enter__(self):
        for mod, attr, value in self._saved:
            stub = self.stub_blas and attr in MATMULS
            setattr(mod, attr, self._wrap(self._stub(value) if stub else value))
        return self

    def __exit__(self, *exc):
        for mod, attr, value in self._saved:
            setattr(mod, attr, value)


def _cases():
    """``{label: warmup.Call}``: every op at B = 1 (one token), as a NumPy call that
    :meth:`~ascend_emu.warmup.Call.through_drop_in` turns into the same call through the drop-in."""
    import ml_dtypes
    import numpy as np

    from ascend_emu import ops
    from ascend_emu.warmup import Call

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(0)

    def randn(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(bf16)

    cases = {"npu_format_cast [64, 64] bf16": Call("", "npu_format_cast", (randn(64, 64), 29), {})}

    kv_args = (randn(1, 1, 1, 576), randn(512), randn(1, 1, 1, 64), randn(1, 1, 1, 64), np.array([17], np.int64),
               np.zeros((64, 16, 1, 64), bf16), np.zeros((64, 16, 1, 512), bf16))
    cases["npu_kv_rmsnorm_rope_cache PA_NZ"] = Call("", "npu_kv_rmsnorm_rope_cache", kv_args,
                                                    dict(cache_mode="PA_NZ"))

    he, hcq, n = 7168, 1536, 1
    w = (randn(1, he), ops.npu_format_cast(randn(he, hcq, scale=he ** -0.5), 29),
         ops.npu_format_cast(randn(hcq, n * 192, scale=hcq ** -0.5), 29), randn(n, 128, 512, scale=128 ** -0.5),
         ops.npu_format_cast(randn(he, 576, scale=he ** -0.5), 29), randn(hcq), randn(512), randn(1, 64),
         randn(1, 64))
    index = np.array([3], np.int64)
    for version in ("", "_v2"):
        caches = (np.zeros((4, 16, 1, 512), bf16), np.zeros((4, 16, 1, 64), bf16))
        cases[f"npu_mla_prolog{version} non-quant PA_NZ N=1"] = Call(
            "", f"npu_mla_prolog{version}", (*w, index, *caches), dict(cache_mode="PA_NZ"))
    caches = (np.zeros((4, 16, 1, 512), bf16), np.zeros((4, 16, 1, 64), bf16))
    cases["npu_mla_prolog_v3 non-quant PA_NZ N=1"] = Call("", "npu_mla_prolog_v3", (*w, *caches),
                                                          dict(cache_index=index, cache_mode="PA_NZ"))

    t_, hidden = 1, 2048
    pre = (randn(t_, hidden), randn(hidden), randn(hidden),
           ops.npu_format_cast(rng.integers(-8, 8, (2112, hidden)).astype(np.int8), 29),
           np.full(2112, 1e-3, np.float32), randn(1536), randn(1536),
           ops.npu_format_cast(rng.integers(-8, 8, (n * 192, 1536)).astype(np.int8), 29),
           np.full(n * 192, 1e-3, np.float32), randn(512), randn(t_, 64), randn(t_, 64), randn(n, 128, 512),
           np.zeros((2, 128, 1, 512), bf16), np.zeros((2, 128, 1, 64), bf16), np.array([5], np.int32))
    outs = dict(q_out0=np.zeros((t_, n, 512), bf16), kv_cache_out0=np.zeros((2, 128, 1, 512), bf16),
                q_out1=np.zeros((t_, n, 64), bf16), kv_cache_out1=np.zeros((2, 128, 1, 64), bf16))
    cases["npu_mla_preprocess krope_ctkv out= N=1"] = Call(
        "", "npu_mla_preprocess", pre, dict(outs, cache_mode="krope_ctkv", quant_mode="per_token_quant_symm"))

    n1, d, bs, kv_len = 64, 128, 64, 256
    blocks = np.arange(kv_len // bs, dtype=np.int32).reshape(1, -1)  # [B, blocks]
    cases["npu_lightning_indexer PA_BSND kv=256"] = Call(
        "", "npu_lightning_indexer", (randn(1, 1, n1, d), randn(kv_len // bs, bs, 1, d), randn(1, 1, n1)),
        dict(actual_seq_lengths_query=np.ones(1, np.int32), actual_seq_lengths_key=np.array([kv_len], np.int32),
             block_table=blocks, layout_query="BSND", layout_key="PA_BSND", sparse_count=64, sparse_mode=3))

    n1, k = 16, 64
    indices = np.arange(k, dtype=np.int32).reshape(1, 1, 1, k)  # [B, S1, N2, K] kv positions
    common = dict(block_table=blocks, actual_seq_lengths_query=np.ones(1, np.int32),
                  actual_seq_lengths_kv=np.array([kv_len], np.int32), sparse_block_size=1, layout_query="BSND",
                  layout_kv="PA_BSND", sparse_mode=3, attention_mode=2)
    key = randn(kv_len // bs, bs, 1, 512)
    cases["npu_sparse_flash_attention PA_BSND N=16 K=64"] = Call(
        "", "npu_sparse_flash_attention", (randn(1, 1, n1, 512), key, key, indices, 0.04),
        dict(common, query_rope=randn(1, 1, n1, 64), key_rope=randn(kv_len // bs, bs, 1, 64)))
    rows = np.zeros((kv_len // bs, bs, 1, 656), np.int8)  # [blocks, block_size, 1, 656] combined rows
    rows[..., :512] = rng.integers(-127, 128, (kv_len // bs, bs, 1, 512))
    rows[..., 512:640] = randn(kv_len // bs, bs, 1, 64).view(np.int8)
    rows[..., 640:] = np.full((kv_len // bs, bs, 1, 4), 1e-2, np.float32).view(np.int8)
    cases["npu_kv_quant_sparse_flash_attention per-tile N=16 K=64"] = Call(
        "", "npu_kv_quant_sparse_flash_attention", (randn(1, 1, n1, 576), rows, rows, indices, 0.04, 2, 2),
        dict(common, quant_scale_repo_mode=1, tile_size=128, rope_head_dim=64))
    return cases


#: The clock of the timed rounds (``--clock``): ``time.perf_counter`` or ``time.process_time``.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def _per_round(fn, calls: int, timer: CompiledTimer | None = None) -> tuple[float, float]:
    """(seconds per call, seconds per call outside the compiled work) of one round, on ``_clock``."""
    clock = _clock
    if timer is None:
        start = clock()
        for _ in range(calls):
            fn()
        wall = (clock() - start) / calls
        return wall, wall
    with timer:
        timer.inside = 0.0
        start = clock()
        for _ in range(calls):
            fn()
        wall = clock() - start
    return wall / calls, (wall - timer.inside) / calls


def _median(values) -> float:
    return statistics.median(values)


def _on_device(drop):
    """``drop`` (a drop-in call on CPU tensors) twice: with its tensors marked as on the NPU (what
    ``.npu()`` gave in the ``mark`` model; marked in place, so ``drop`` itself is that call) and
    with each tensor an NPUTensor over the same memory (and format tags)."""
    import functools

    import torch

    from ascend_emu.torch_npu._npu_tensor import to_npu
    from ascend_emu.torch_npu.npu import ON_NPU_ATTR

    def move(v):
        if isinstance(v, torch.Tensor):
            v.__dict__[ON_NPU_ATTR] = True
            return to_npu(v)
        return v

    args = tuple(move(v) for v in drop.args)
    return functools.partial(drop.func, *args, **{k: move(v) for k, v in drop.keywords.items()})


def measure(rounds: int, seconds_per_round: float) -> dict:
    """This process's table: ``{op: {ops_us, drop_us, ratio, added_us, ops_stub_us, drop_stub_us,
    stub_added_us}}`` (medians over rounds; ratio and added from each round's pair)."""
    try:
        importlib.import_module("ascend_emu.torch_npu")
        have_torch = True
    except ImportError:
        have_torch = False
    cases = _cases()
    stub = CompiledTimer(stub_blas=True)
    table = {}
    for op, call in cases.items():
        drop = call.through_drop_in() if have_torch else None
        pair = [("ops", call)] + ([("drop", drop), ("npu", _on_device(drop))] if drop is not None else [])
        for _, fn in pair:  # warm-up: kernels loaded, weights widened, signatures memoised
            fn()
            fn()
        start = time.perf_counter()
        call()
        calls = max(3, min(2000, int(seconds_per_round / max(time.perf_counter() - start, 1e-7))))
        samples = {f"{label}{suffix}": [] for label, _ in pair for suffix in ("", "_stub")}
        for _ in range(rounds):  # ops and drop-in take turns round after round
            samples["ops"].append(_per_round(call, calls)[0])
            if drop is not None:  # mark, npu, npu, mark (half the calls each) after one untimed mark call
                pair[1][1]()  # the ops call before streamed its own copies of the inputs through the caches
                half = max(1, calls // 2)
                times = [_per_round(fn, half)[0] for fn in (pair[1][1], pair[2][1], pair[2][1], pair[1][1])]
                samples["drop"].append((times[0] + times[3]) / 2)
                samples["npu"].append((times[1] + times[2]) / 2)
            for label, fn in pair:  # matmuls stubbed, compiled work subtracted: the Python around it
                samples[f"{label}_stub"].append(_per_round(fn, calls, stub)[1])
        row = {"calls": calls, "ops_us": _median(samples["ops"]) * 1e6,
               "ops_stub_us": _median(samples["ops_stub"]) * 1e6}
        if drop is not None:
            row.update(drop_us=_median(samples["drop"]) * 1e6, drop_stub_us=_median(samples["drop_stub"]) * 1e6,
                       ratio=_median([d / o for d, o in zip(samples["drop"], samples["ops"], strict=True)]),
                       added_us=_median([d - o for d, o in zip(samples["drop"], samples["ops"], strict=True)]) * 1e6,
                       stub_added_us=_median([d - o for d, o in zip(samples["drop_stub"], samples["ops_stub"], strict=True)]) * 1e6,
                       npu_us=_median(samples["npu"]) * 1e6,
                       npu_ratio=_median([n / d for n, d in zip(samples["npu"], samples["drop"], strict=True)]))
        table[op] = row
    return table


def _print(order: str, info: dict) -> None:
    table = info["table"]
    print(f"\nimport order {order}: threading {info['threading']}, Numba threads {info['threads']}, clock {info['clock']}"
          f"{'' if info['drop_in'] else ', torch_npu drop-in not importable'}")
    print("  us per call, medians of alternating rounds; 'outside' = time outside Numba kernels with the matmuls"
          " stubbed; added = drop-in - ops")
    print(f"  {'op (B=1)':56s} {'ops':>9s} {'drop-in':>9s} {'drop/ops':>8s} {'added':>7s} {'ops outside':>11s} "
          f"{'drop outside':>12s} {'added':>7s} {'on npu':>8s} {'npu/mark':>8s}")
    for op, r in table.items():
        line = f"  {op:56s} {r['ops_us']:9.1f}"
        if "drop_us" in r:
            line += (f" {r['drop_us']:9.1f} {r['ratio']:8.2f} {r['added_us']:7.1f} {r['ops_stub_us']:11.1f}"
                     f" {r['drop_stub_us']:12.1f} {r['stub_added_us']:7.1f} {r['npu_us']:8.1f} {r['npu_ratio']:8.3f}")
        print(line)
    rows = [r for r in table.values() if "drop_us" in r]
    if rows:
        print(f"  worst: drop/ops {max(r['ratio'] for r in rows):.2f} (target <= {TARGET_RATIO}), added outside "
              f"{max(r['stub_added_us'] for r in rows):.1f} us (target <= {TARGET_ADDED_US:.0f}), drop-in outside "
              f"{max(r['drop_stub_us'] for r in rows):.1f} us (target <= {TARGET_DROP_IN_US:.0f}), ops outside "
              f"{max(r['ops_stub_us'] for r in rows):.1f} us (target <= {TARGET_OPS_US:.0f}); npu device / mark "
              f"{max(r['npu_ratio'] for r in rows):.3f} worst, {statistics.median(r['npu_ratio'] for r in rows):.3f} "
              f"median (target <= {TARGET_DEVICE_RATIO})")


def first_calls() -> dict:
    """This process's first calls through the drop-in, seconds: importing the drop-in, Numba's
    one-time registry set-up (triggered on its own, so no op's figure carries it), preparing every
    case's inputs (untimed per op: it casts the NZ weights, which loads the NZ kernels), then per
    op its first and second call, one op after the other."""
    start = time.perf_counter()
    importlib.import_module("ascend_emu.torch_npu")
    out = {"import_s": time.perf_counter() - start}
    from numba.core.registry import cpu_target

    start = time.perf_counter()
    cpu_target.target_context.refresh()  # what the first kernel of a process pays: Numba's registries
    out["registries_s"] = time.perf_counter() - start
    start = time.perf_counter()
    drops = {op: call.through_drop_in() for op, call in _cases().items()}
    out["inputs_s"] = time.perf_counter() - start
    out["ops"] = {}
    for op, drop in drops.items():
        start = time.perf_counter()
        drop()
        first = time.perf_counter() - start
        start = time.perf_counter()
        drop()
        out["ops"][op] = (first, time.perf_counter() - start)
    return out


def _first_calls(threads: int) -> None:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, __file__, "--first-call"], env=env, capture_output=True, text=True)
    if proc.returncode:
        print(f"\nfirst calls ({threads} thread(s)): failed\n{proc.stderr[-2000:]}")
        return
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nfirst calls through the drop-in, fresh process, warm Numba cache ({threads} thread(s)); target <= "
          f"{TARGET_FIRST_MS:.0f} ms per op\n  import ascend_emu.torch_npu {r['import_s'] * 1e3:.0f} ms; Numba registry "
          f"set-up (once per process, paid by its first kernel) {r['registries_s'] * 1e3:.0f} ms; inputs (NZ casts)"
          f" {r['inputs_s'] * 1e3:.0f} ms")
    print(f"  {'op (B=1), in this order':56s} {'first call':>11s} {'second':>9s}")
    for op, (first, second) in r["ops"].items():
        print(f"  {op:56s} {first * 1e3:8.0f} ms {second * 1e3:6.1f} ms")


def child(order: str, rounds: int, seconds: float, clock: str = "wall") -> dict:
    global _clock
    _clock = CLOCKS[clock]
    if order == "torch-first":
        try:
            importlib.import_module("torch")
        except ImportError:  # no torch: both orders are the same
            pass
    import numba

    from ascend_emu import _threads

    return {"table": measure(rounds, seconds), "threading": _threads.CHOICE or "not configured",
            "threads": numba.get_num_threads(), "drop_in": "torch" in sys.modules, "clock": clock}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (default 9)")
    parser.add_argument("--seconds", type=float, default=0.03,
                        help="target seconds per op per round (calls per round follow; default 0.03)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="thread counts, one process each (NUMBA_NUM_THREADS / OPENBLAS_NUM_THREADS; "
                             "default 1 2)")
    parser.add_argument("--order", choices=ORDERS, nargs="*", default=list(ORDERS),
                        help="import orders (none: skip the per-call tables)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall: perf_counter (default); cpu: the process's CPU time (a shared machine, 1 thread)")
    parser.add_argument("--first-calls", action="store_true",
                        help="also time each op's first call in a fresh process (warm Numba cache)")
    parser.add_argument("--first-call", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_call:
        print(json.dumps(first_calls()))
        return
    if args.child:
        print(json.dumps(child(args.order[0], args.rounds, args.seconds, args.clock)))
        return
    for threads in args.threads:
        env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                   OMP_NUM_THREADS=str(threads))
        for order in args.order:
            proc = subprocess.run([sys.executable, __file__, "--child", "--order", order, "--rounds",
                                   str(args.rounds), "--seconds", str(args.seconds), "--clock", args.clock],
                                  env=env, capture_output=True, text=True)
            if proc.returncode:
                print(f"\nimport order {order}, {threads} thread(s): failed\n{proc.stderr[-3000:]}")
                continue
            _print(order, json.loads(proc.stdout.strip().splitlines()[-1]))
    if args.first_calls:
        for threads in args.threads:
            _first_calls(threads)


if __name__ == "__main__":
    main()
