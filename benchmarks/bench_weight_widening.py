"""Per-call time of the ops whose weights are widened to fp32, before and after the bounded
widening, in one run: two worker processes, one importing ``ascend_emu`` from ``--before`` (a
checkout of the package that kept an fp32 copy of every weight) and one from this checkout (a
block of columns at a time in a per-thread scratch, ``ascend_emu.emu.matmul.matmul_weight``),
timed in alternating rounds; ratios are the medians of the per-round ratios (after / before).

Cases: ``npu_mla_prolog_v3`` non-quant (bf16 weights), per-tile partial quant (int8 W_uq_qr) and
per-tile full quant (int8 weights) at T = 1 and 16, N = 8 and 32 (He 7168, FRACTAL_NZ weights),
and the demo's decode step over ``--layers`` layers (``benchmarks/bench_decode_step.py``'s
step: prolog -> indexer -> KV-quant sparse attention). Each worker also checks that its outputs
are the other's bytes, and prints its peak RSS (it holds every case's weights at once).

Usage::

    git archive <base> ascend_emu | tar -x -C /tmp/before    # e.g. base 10f8a09
    python benchmarks/bench_weight_widening.py --before /tmp/before [--rounds 7] [--layers 61]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HE, HCQ, HCKV, DR, D, BLOCK = 7168, 1536, 512, 64, 128, 128


def _cases(layers: int, context: int):
    """``{name: fn}``: each fn runs one call (the decode step: ``layers`` of them) and returns its outputs."""
    import ml_dtypes
    import numpy as np

    from ascend_emu.demo import DecodeStepConfig, run_decode_step
    from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3

    bf16_t = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(21)

    def bf16(shape, scale):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(bf16_t)

    def int8(shape):
        return rng.integers(-127, 128, shape).astype(np.int8)

    cases = {}
    for n in (8, 32):
        w_dq, w_dkv_kr = npu_format_cast(bf16((HE, HCQ), 0.02), 29), npu_format_cast(bf16((HE, HCKV + DR), 0.02), 29)
        w_uq_qr = npu_format_cast(bf16((HCQ, n * (D + DR)), 0.03), 29)
        w_dq_i8, w_uq_qr_i8, w_dkv_kr_i8 = (npu_format_cast(int8(s), 29)
                                            for s in ((HE, HCQ), (HCQ, n * (D + DR)), (HE, HCKV + DR)))
        w_uk = bf16((n, D, HCKV), 0.1)
        gamma_cq, gamma_ckv = bf16((HCQ,), 1.0), bf16((HCKV,), 1.0)
        for t in (1, 16):
            x, x_i8 = bf16((t, 1, HE), 1.0), int8((t, 1, HE))
            sin, cos = bf16((t, 1, DR), 0.5), bf16((t, 1, DR), 0.5)
            blocks = -(-t // BLOCK) + 1
            cache_index = rng.permutation(blocks * BLOCK)[:t].reshape(t, 1).astype(np.int64)
            kv, kr = np.zeros((blocks, BLOCK, 1, HCKV), bf16_t), np.zeros((blocks, BLOCK, 1, DR), bf16_t)
            rows = np.zeros((blocks, BLOCK, 1, 656), np.int8)
            cases[f"prolog non-quant   N={n:2d} T={t:2d}"] = (
                lambda x=x, w_uq_qr=w_uq_qr, sin=sin, cos=cos, kv=kv, kr=kr, ci=cache_index, w_uk=w_uk, w_dq=w_dq,
                w_dkv_kr=w_dkv_kr, g=(gamma_cq, gamma_ckv): npu_mla_prolog_v3(
                    x, w_dq, w_uq_qr, w_uk, w_dkv_kr, *g, sin, cos, kv, kr, cache_index=ci, cache_mode="PA_BSND"))
            scales = dict(dequant_scale_w_uq_qr=np.full((1, n * (D + DR)), 1e-3, np.float32),
                          k_nope_clip_alpha=np.ones(1, np.float32))
            full_scales = dict(scales, dequant_scale_x=np.full((t, 1), 1e-2, np.float32),
                               dequant_scale_w_dq=np.full((1, HCQ), 1e-3, np.float32),
                               dequant_scale_w_dkv_kr=np.full((1, HCKV + DR), 1e-3, np.float32))
            for wqm, label in ((1, "partial"), (2, "full")):
                full = wqm == 2
                pos = (x_i8 if full else x, w_dq_i8 if full else w_dq, w_uq_qr_i8, w_uk,
                       w_dkv_kr_i8 if full else w_dkv_kr, gamma_cq, gamma_ckv, sin, cos, rows, np.zeros((0,), bf16_t))
                kw = dict(full_scales if full else scales, cache_index=cache_index, cache_mode="PA_BSND",
                          weight_quant_mode=wqm, kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1)
                cases[f"prolog {label:7s} quant N={n:2d} T={t:2d}"] = (
                    lambda pos=pos, kw=kw: npu_mla_prolog_v3(*pos, **kw))
    rep = run_decode_step(DecodeStepConfig(context=context))
    cases[f"decode step, {layers} layers"] = lambda: [rep.decode_int8() for _ in range(layers)][-1]
    return cases


def _digest(out) -> str:
    """A hash of every output array's bytes (tuples flattened)."""
    import numpy as np

    h = hashlib.sha256()
    for a in out if isinstance(out, (tuple, list)) else (out,):
        if a is not None:
            h.update(np.ascontiguousarray(a).view(np.uint8).tobytes())
    return h.hexdigest()[:16]


def worker(ns) -> None:
    """Build the cases, warm them up, then time one round per input line (JSON out)."""
    if ns.scratch_mib:
        from ascend_emu.emu import matmul

        if hasattr(matmul, "SCRATCH_BYTES"):
            matmul.SCRATCH_BYTES = int(ns.scratch_mib * 2**20)
    cases = _cases(ns.layers, ns.context)
    digests = {name: _digest(fn()) for name, fn in cases.items()}
    print(json.dumps({"digests": digests}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        times = {}
        for name, fn in cases.items():
            calls = 1 if name.startswith("decode") else ns.calls
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
            times[name] = statistics.median(samples)
        print(json.dumps({"times": times}), flush=True)
    print(json.dumps({"maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="directory holding the 'before' ascend_emu package")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    parser.add_argument("--calls", type=int, default=5, help="calls per prolog case per round (median)")
    parser.add_argument("--layers", type=int, default=61, help="layers of the decode step (default 61)")
    parser.add_argument("--context", type=int, default=4096, help="decode step's context (default 4096)")
    parser.add_argument("--scratch-mib", type=float, default=0,
                        help="the 'after' side's per-thread scratch, MiB (default: the library's)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.worker:
        worker(ns)
        return
    if not ns.before:
        parser.error("--before DIR is required (a checkout of the package before the change)")
    here = Path(__file__).resolve().parent.parent
    args = [sys.executable, __file__, "--worker", "--calls", str(ns.calls), "--layers", str(ns.layers),
            "--context", str(ns.context), "--scratch-mib", str(ns.scratch_mib)]
    procs = {}
    for label, root in (("before", Path(ns.before).resolve()), ("after", here)):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(here / "benchmarks")]))
        procs[label] = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first = {k: json.loads(p.stdout.readline())["digests"] for k, p in procs.items()}
    same = {name: first["before"][name] == first["after"][name] for name in first["after"]}
    rounds = {k: [] for k in procs}
    for _ in range(ns.rounds):
        for label, p in procs.items():  # alternating: before, then after, each round
            time.sleep(0.5)  # the other worker's BLAS threads stop spinning
            p.stdin.write("round\n")
            p.stdin.flush()
            rounds[label].append(json.loads(p.stdout.readline())["times"])
    rss = {}
    for label, p in procs.items():
        p.stdin.write("end\n")
        p.stdin.flush()
        rss[label] = json.loads(p.stdout.readline())["maxrss_mib"]
        p.wait()
    print(f"per call, median of {ns.rounds} alternating rounds (prolog: median of {ns.calls} calls per round); "
          f"ratio = median of per-round after / before; load average {os.getloadavg()[0]:.1f}")
    for name in first["after"]:
        before = statistics.median(r[name] for r in rounds["before"])
        after = statistics.median(r[name] for r in rounds["after"])
        ratio = statistics.median(a[name] / b[name] for a, b in zip(rounds["after"], rounds["before"], strict=True))
        print(f"  {name:34s} before {before * 1e3:8.2f} ms  after {after * 1e3:8.2f} ms  ratio {ratio:.3f}"
              f"  {'same bytes' if same[name] else 'BYTES DIFFER'}")
    print(f"  peak RSS of the worker (every case's weights held at once): before {rss['before']:.0f} MiB, "
          f"after {rss['after']:.0f} MiB")


if __name__ == "__main__":
    main()
