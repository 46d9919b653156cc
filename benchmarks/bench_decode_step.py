"""The DeepSeek-V3.2 decode step of ``ascend-emu demo`` repeated over L layers, against its floor.

One decode step of the int8 path per layer: ``npu_mla_prolog_v3`` (partial quant, per-tile kv
cache) -> ``npu_lightning_indexer`` -> ``npu_kv_quant_sparse_flash_attention``, at the demo's
shapes (:mod:`ascend_emu.demo`: He 7168, 16 query heads of one TP-8 rank, top-2048 of a 4096-token
context by default). The floor of a layer is the bare work the step contains, each product on
the engine the op uses for it (``DecodeStepReport.floor_int8``: the prolog's three bf16 products
as fp32 BLAS on pre-widened weights, its int8 ``cq @ W_uq_qr`` on the op's int8 engine, the
indexer's q . k product and top-k (``np.partition`` and a sort of the kept values), the
gather of the selected 656-byte rows and the attention's two products). One layer's weights and caches serve every layer (61 layers'
weights widened to fp32 would take about 5 GB), so the figures are those of a model whose layers
all hit warm CPU caches equally. Printed: ms per step (L layers) for the emulator and the floor,
and their ratio, measured in one run (best of alternating rounds).

Beside it, the machine floor (``benchmarks/_floor.py``): the same step's products
(``DecodeStepReport.floor_operands``, in the dtypes the ops multiply) each on the fastest engine
this machine has for it (sgemm, oneDNN bf16 or the int8 engine, chosen by timing at set-up), the
indexer's ReLU, head sum and top-k as in the floor, and the gather of the selected rows
at copy bandwidth; printed with the engine each took and the emulator's ratio to it. A floor
slower than the emulator is a bug in the floor: the script prints a WARNING line then. The own
floor runs both on OpenBLAS's thread count and inside ``one_blas_thread()``, and the faster of
the two is the floor (both printed): on a busy machine a product split over two OpenBLAS threads
waits for the second core, and a floor made almost only of such products fell behind the step. Its oneDNN
candidates import torch where installed, after the step's first run (so with ``--no-drop-in`` the
emulator's int8 engine is still the one a process without torch picks).

With torch installed the same step also runs through the torch_npu drop-in (``--no-drop-in`` to
skip): the demo's calls of ``ascend_emu.ops`` go to ``ascend_emu.torch_npu`` instead, on torch
tensors over the same memory (weights and caches converted once and kept, NZ weights tagged with
their own NZArray so their fp32 widening is shared; per-call arrays such as the token's slices
converted on every call, and outputs viewed back as NumPy, which the drop-in figure includes).

Memory: the process's peak resident set (``getrusage`` maxrss, the prefill and the run through the
drop-in included) and its resident set after the imports, against the step's inputs (one layer's
weights, the caches, the hidden states; ``DecodeStepReport.input_bytes``). Then per step (one
run of the L layers, ops and drop-in): freed heap handed back (``malloc_trim``), the peak
resident set restarted (Linux ``/proc/self/clear_refs``) and read after the step (``VmHWM``):
the step's working set above what the process held, printed as
``(inputs + kept widened weights + that peak) / inputs`` (goal: at most 2x). The ops keep a widened
copy of a FRACTAL_NZ weight only within ``ASCEND_EMU_WEIGHT_KEEP_MIB``
(docs/performance.md#widened-weights-and-memory; 0 keeps none); the floor reads the ops' kept widening of the two bf16 NZ
weights (no copy of its own) and keeps fp32 copies of ``W_uk`` and the indexer keys; the machine
floor keeps its own (its sgemm candidates).

Usage: ``python benchmarks/bench_decode_step.py [--layers 61] [--context 4096] [--repeat 3] [--no-drop-in]``
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import resource

import numpy as np
from _floor import MachineFloor, floor_line, movement, other, product, ratio_line
from _timing import best_times

from ascend_emu import demo
from ascend_emu.demo import DecodeStepConfig, run_decode_step
from ascend_emu.emu.matmul import kept_bytes, one_blas_thread


class DropInOps:
    """Stands in for ``ascend_emu.ops`` in :mod:`ascend_emu.demo`: each op called through
    ``ascend_emu.torch_npu`` on torch tensors over the arguments' memory (module doc)."""

    #: Converted arrays kept by id (with the array, so the id stays its own); cleared past this.
    KEEP = 256

    def __init__(self):
        import numpy as np

        import ascend_emu.torch_npu as torch_npu
        from ascend_emu.layouts import NZArray
        from ascend_emu.torch_npu._convert import tag_nz, to_numpy, to_torch

        self._np, self._nz, self._tag, self._to_numpy, self._to_torch = np, NZArray, tag_nz, to_numpy, to_torch
        self._torch_npu = torch_npu
        self._kept: dict[int, tuple] = {}

    def _tensor(self, a):
        if not isinstance(a, self._np.ndarray):
            return a
        hit = self._kept.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        t = self._to_torch(a)
        if isinstance(a, self._nz):
            self._tag(t, a)  # the same NZArray: the drop-in hands the ops this very object
        if len(self._kept) >= self.KEEP:
            self._kept.clear()
        self._kept[id(a)] = (a, t)
        return t

    def _array(self, r):
        if isinstance(r, (tuple, list)):
            return type(r)(self._array(x) for x in r)
        return self._to_numpy(r) if r is not None and not isinstance(r, (int, float)) else r

    def __getattr__(self, name):
        fn = getattr(self._torch_npu, name)

        def call(*args, **kwargs):
            out = fn(*(self._tensor(a) for a in args), **{k: self._tensor(v) for k, v in kwargs.items()})
            return self._array(out)

        return call


@contextlib.contextmanager
def through(ops_like):
    """Run the demo's ops through ``ops_like`` for the duration."""
    saved = demo.ops
    demo.ops = ops_like
    try:
        yield
    finally:
        demo.ops = saved


def rss_mib() -> float:
    """This process's resident set now, MiB (Linux ``/proc/self/statm``; 0 where unreadable)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def peak_rss_mib() -> float:
    """This process's peak resident set, MiB (``ru_maxrss``: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def vm_hwm_mib() -> float | None:
    """This process's peak resident set since the last :func:`reset_peak`, MiB (Linux
    ``VmHWM``; None where unreadable)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Restart the peak resident set at the current one (Linux ``clear_refs`` 5); False where
    the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def trim_heap() -> None:
    """Hand freed heap memory back to the kernel (glibc ``malloc_trim``; nothing elsewhere), so
    the resident set counts what is alive, not what an earlier step freed."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def step_peak_mib(fn) -> tuple[float, float | None]:
    """``(resident MiB before, MiB the peak rose above it while fn() ran)``: what the process
    held alive before the step (freed heap handed back first) and the step's working set on
    top of it (None where not measurable)."""
    trim_heap()
    before = rss_mib()
    if not reset_peak():
        return None
    fn()
    peak = vm_hwm_mib()
    return before, None if peak is None else max(peak - before, 0.0)


def machine_floor(rep, sparse_count: int) -> MachineFloor:
    """The decode step's machine floor for one layer (module doc), from ``rep``'s floor operands."""
    ops_ = rep.floor_operands
    labels = ("x@Wdq", "cq@Wuq_qr", "q@Wuk", "x@Wdkv_kr", "indexer q.k")
    parts = [product(label, *ops_[label]) for label in labels]
    q_idx, k_idx = ops_["indexer q.k"]
    scores = np.asarray(q_idx, np.float32) @ np.asarray(k_idx, np.float32)  # [64, context + 1]
    k = min(sparse_count, scores.shape[1])

    def top_k():
        np.sort(np.partition(-np.maximum(scores, 0).sum(0), k - 1)[:k])
    parts += [other("top-k", "numpy", top_k), movement("gather", rep.floor_gather_bytes),
              product("q@K", *ops_["q@K"]), product("P@V", *ops_["P@V"])]
    return MachineFloor(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=61, help="decoder layers per step (DeepSeek-V3.2: 61)")
    parser.add_argument("--context", type=int, default=4096, help="tokens in the cache")
    parser.add_argument("--sparse-count", type=int, default=2048, help="indexer top-k")
    parser.add_argument("--heads", type=int, default=16, help="query heads N")
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds")
    parser.add_argument("--no-drop-in", action="store_true", help="skip the run through the torch_npu drop-in")
    ns = parser.parse_args()
    if not ns.no_drop_in:
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401 (imported before the baseline, as the drop-in run will)
    base_rss = rss_mib()
    rep = run_decode_step(DecodeStepConfig(context=ns.context, sparse_count=ns.sparse_count, heads=ns.heads))

    def layers(fn):
        return lambda: [fn() for _ in range(ns.layers)]

    machine = machine_floor(rep, ns.sparse_count)

    def floor_one_thread():
        with one_blas_thread():
            rep.floor_int8()

    # the floor on OpenBLAS's own thread count and on one thread: the faster bounds the step (on a
    # busy machine a two-thread product can wait many times its length for the second core)
    candidates = [layers(rep.decode_int8), layers(rep.floor_int8), layers(machine), layers(floor_one_thread)]
    if not ns.no_drop_in:
        try:
            drop_in = DropInOps()
        except ImportError:
            drop_in = None
        if drop_in is not None:
            def via_drop_in():
                with through(drop_in):
                    rep.decode_int8()
            candidates.append(layers(via_drop_in))
    times = best_times(candidates, ns.repeat)
    t_emu, t_floor_n, t_machine, t_floor_1 = times[:4]
    t_floor = min(t_floor_n, t_floor_1)
    del times[1:4]  # [emulator, drop-in]
    times[1:1] = [t_floor, t_machine]  # [emulator, floor, machine floor, drop-in]
    step_peaks = [("emulator", step_peak_mib(candidates[0]))]
    if len(candidates) > 4:
        step_peaks.append(("drop-in", step_peak_mib(candidates[4])))
    print(f"decode step, {ns.layers} layers, context {ns.context}, top-{ns.sparse_count}, N={ns.heads}:")
    print(f"  emulator {t_emu * 1e3:8.1f} ms per step ({t_emu / ns.layers * 1e3:.2f} ms per layer), ascend_emu.ops")
    if len(times) > 3:
        t_drop = times[3]
        print(f"  drop-in  {t_drop * 1e3:8.1f} ms per step ({t_drop / ns.layers * 1e3:.2f} ms per layer), "
              f"ascend_emu.torch_npu: {t_drop / t_emu:.3f}x the ops path")
    print(f"  floor    {t_floor * 1e3:8.1f} ms per step ({t_floor / ns.layers * 1e3:.2f} ms per layer; OpenBLAS's "
          f"threads {t_floor_n * 1e3:.1f} ms, one thread {t_floor_1 * 1e3:.1f} ms: the faster)")
    print(f"  ratio    {t_emu / t_floor:8.2f}x" + (f" (drop-in {times[3] / t_floor:.2f}x)" if len(times) > 3 else ""))
    if t_emu < t_floor:
        print(f"  WARNING: the floor is slower than the emulator ({t_emu / t_floor:.2f}x): a bug in the floor")
    print(f"  {floor_line(machine, t_machine, per=f'per step, {t_machine / ns.layers * 1e3:.2f} ms per layer')}")
    print(f"  {ratio_line('emulator', t_emu, t_machine)}"
          + (f"; {ratio_line('drop-in', times[3], t_machine)}" if len(times) > 3 else ""))
    inputs = getattr(rep, "input_bytes", {})
    total = sum(inputs.values()) / 2**20
    peak = peak_rss_mib()
    print(f"  memory   peak RSS {peak:.0f} MiB; {base_rss:.0f} MiB after the imports, so "
          f"{peak - base_rss:.0f} MiB for the run; inputs {total:.0f} MiB ("
          + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in inputs.items())
          + (f"): the run takes {(peak - base_rss) / total:.2f}x its inputs" if total else ")"))
    kept = kept_bytes() / 2**20
    for what, (before, rise) in step_peaks:
        if rise is None:
            print(f"  per step ({what}): peak not measurable here (/proc/self/clear_refs)")
        elif total:
            print(f"  per step ({what}): {before - base_rss:.0f} MiB alive above the imports before it (inputs, "
                  f"{kept:.0f} MiB of kept widened weights, the floors' operands), peak {rise:.0f} MiB above "
                  f"that: (inputs + kept + peak) / inputs = {(total + kept + rise) / total:.2f}x")


if __name__ == "__main__":
    main()
