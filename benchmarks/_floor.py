"""The machine's floor, shared by the benchmark scripts: each product of a floor on the fastest
engine this machine has for it, each data movement at the machine's copy bandwidth.

A script's own floor runs the emulator's engines (fp32 BLAS on pre-widened operands,
:func:`ascend_emu.emu.matmul.matmul_int8`); the machine floor asks instead how fast this machine
can do the same work at all. For one product it times, once at set-up, every engine that does
the same multiply-adds with at least fp32 accumulation, and keeps the fastest:

- ``"sgemm"``: fp32 BLAS (``np.matmul``) on operands widened to fp32 beforehand, and where
  OpenBLAS runs on more than one thread the same inside ``one_blas_thread()``
  (``"sgemm-1-thread"``: on a busy machine a split product waits for the second core);
- ``"onednn-bf16"``: ``torch.mm`` / ``torch.matmul`` on bf16 tensors (oneDNN: bf16 multiplies,
  fp32 accumulation, bf16 output), only for bf16 x bf16 products and only where torch imports;
- ``"int8-<engine>"``: :func:`~ascend_emu.emu.matmul.matmul_int8` on int8 x int8 operands
  (exact int32; ``<engine>`` is :func:`~ascend_emu.emu.matmul.int8_engine`, ``onednn`` once torch
  is imported on a CPU with VNNI).

"Exact" here means the same products summed with at least fp32 accumulation, not the same bits:
oneDNN's bf16 GEMM accumulates in fp32 in another order than sgemm (and rounds its output to
bf16), so it is the machine's floor for the same work, not an engine whose bits the emulator
promises. fp16 activations run on ``"sgemm"`` only (no bf16 rounding of them is the same work).
On an AVX512-BF16 machine oneDNN bf16 takes about half the time of sgemm for T >= 16 rows
against a [7168, 1536] weight, but more than sgemm at T = 1 and for tiny products, hence the
timing per product rather than a fixed choice.

A data movement of ``R`` bytes read and ``W`` written is floored by a copy (``np.copyto`` into a
preallocated buffer) of ``(R + W) / 2`` bytes, which reads and writes that many: engine
``"bandwidth"``. A gather of scattered rows is floored by the copy of as many contiguous bytes.

Scripts build a :class:`MachineFloor` from :func:`product` and :func:`movement` parts (plus any
:func:`other` part with no faster engine, e.g. a top-k ``np.partition``) and pass it to
``_timing.best_times`` beside the op and their own floor, so all take turns in the same rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import ml_dtypes
import numpy as np
from _timing import best_times

from ascend_emu import _threads
from ascend_emu.emu.matmul import int8_engine, matmul_int8, one_blas_thread

BF16 = np.dtype(ml_dtypes.bfloat16)
#: Timed rounds at set-up (``_timing.best_times``: the candidate engines take turns, after one
#: untimed round for thread pools, oneDNN kernel creation and first touch of the outputs).
TRIALS = 3
SGEMM = "sgemm"
SGEMM_ONE_THREAD = "sgemm-1-thread"
ONEDNN_BF16 = "onednn-bf16"
BANDWIDTH = "bandwidth"


@dataclass
class Part:
    """One product or data movement of a machine floor.

    Attributes:
        label: what it is in the op (``"x@Wdq"``, ``"gather"``).
        engine: the engine that won (``"sgemm"``, ``"onednn-bf16"``, ``"int8-onednn"``,
            ``"bandwidth"``, or what an :func:`other` part names).
        run: runs it once on the prepared operands, no arguments.
        seconds: its best time at set-up, seconds (0.0 where not timed).
        candidates: every engine tried and its best time at set-up, seconds.
    """

    label: str
    engine: str
    run: Callable[[], object]
    seconds: float = 0.0
    candidates: dict[str, float] = field(default_factory=dict)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _bf16_tensor(torch, x: np.ndarray):
    """A torch bf16 view of a bf16 NumPy array (through its 16-bit pattern; any non-negative strides)."""
    x = np.asarray(x)
    if any(s < 0 for s in x.strides):
        x = np.ascontiguousarray(x)
    return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)


def _int8_product(a: np.ndarray, w: np.ndarray) -> Callable[[], object]:
    if a.ndim == 2:
        return lambda: matmul_int8(a, w)
    return lambda: [matmul_int8(a[i], w[i]) for i in range(a.shape[0])]


def candidates(a: np.ndarray, w: np.ndarray) -> dict[str, Callable[[], object]]:
    """The engines that can run ``a @ w`` (module doc), each on operands prepared now.

    Args:
        a: activations ``[M, K]`` or ``[B, M, K]``: bf16, fp16, int8 or fp32.
        w: weight ``[K, N]`` or ``[B, K, N]`` (any non-negative strides: a transposed view
            ``k.T`` is multiplied as such), bf16 with bf16 / fp16 activations, int8 with int8,
            fp32 with fp32.

    Returns:
        ``{engine name: callable}``; the callables return the product (layout and dtype of the
        engine: fp32, bf16 or int32).

    Raises:
        ValueError: a dtype pair outside those above, or shapes that do not multiply.
    """
    a, w = np.asarray(a), np.asarray(w)
    pair = (a.dtype, w.dtype)
    allowed = {(BF16, BF16), (np.dtype(np.float16), BF16), (np.dtype(np.int8), np.dtype(np.int8)),
               (np.dtype(np.float32), np.dtype(np.float32))}
    if pair not in allowed:
        raise ValueError(f"candidates: operand dtypes must be bf16/fp16 x bf16, int8 x int8 or fp32 x fp32, "
                         f"got {a.dtype} x {w.dtype}")
    if a.ndim != w.ndim or a.ndim not in (2, 3) or a.shape[-1] != w.shape[-2] or a.shape[:-2] != w.shape[:-2]:
        raise ValueError(f"candidates: a [.., M, K] and w [.., K, N] must multiply, got {a.shape} and {w.shape}")
    a32, w32 = a.astype(np.float32), w.astype(np.float32)  # order "K": a transposed view stays one
    out = {SGEMM: lambda: np.matmul(a32, w32)}
    if any(get() > 1 for get, _ in _threads.BLAS_THREADS):  # also on one OpenBLAS thread: on a busy
        def sgemm_one_thread():  # machine a split product waits for the second core
            with one_blas_thread():
                return np.matmul(a32, w32)
        out[SGEMM_ONE_THREAD] = sgemm_one_thread
    if pair == (BF16, BF16):
        torch = _torch()
        if torch is not None:
            ta, tw = _bf16_tensor(torch, a), _bf16_tensor(torch, w)
            out[ONEDNN_BF16] = (lambda: torch.mm(ta, tw)) if a.ndim == 2 else (lambda: torch.matmul(ta, tw))
    elif a.dtype == np.int8:
        out[f"int8-{int8_engine()}"] = _int8_product(np.ascontiguousarray(a), w)
    return out


def product(label: str, a: np.ndarray, w: np.ndarray, *, trials: int = TRIALS) -> Part:
    """The fastest engine for ``a @ w`` on this machine, timed now (best of ``trials`` rounds in
    which the candidates take turns, after a warm-up round; :func:`candidates` for shapes and
    dtypes).

    Returns:
        a :class:`Part` running the winner on its prepared operands.

    Raises:
        ValueError: as :func:`candidates`.
    """
    fns = candidates(a, w)
    times = dict(zip(fns, best_times(list(fns.values()), trials), strict=True))
    name = min(times, key=times.get)
    return Part(label, name, fns[name], times[name], times)


def movement(label: str, read: int, written: int | None = None, *, trials: int = TRIALS) -> Part:
    """A data movement floored by the machine's copy bandwidth: a copy of ``(read + written) / 2``
    bytes (``written`` defaults to ``read``: a gather or copy) into a preallocated buffer, so it
    takes turns in the rounds like a product (module doc).

    Args:
        label: what moves (``"gather"``, ``"caches"``).
        read, written: bytes read and written by the op.
    """
    written = read if written is None else written
    n = max((int(read) + int(written)) // 2, 1)
    src, dst = np.ones(n, np.uint8), np.empty(n, np.uint8)
    run = lambda: np.copyto(dst, src)  # noqa: E731
    (t,) = best_times([run], trials)
    return Part(label, BANDWIDTH, run, t, {BANDWIDTH: t})


def other(label: str, engine: str, run: Callable[[], object]) -> Part:
    """A part of the floor no faster engine replaces (e.g. ``np.partition`` of a score row),
    run as it is and shown as ``engine``."""
    return Part(label, engine, run)


class MachineFloor:
    """A machine floor: its :class:`Part` s run in order; call it to run them all once (as one
    candidate of ``_timing.best_times``).

    Args:
        parts: the parts; a sequence of parts repeated per batch item shows each label once
            with the engines it took (``q@K: onednn-bf16``, or ``q@K: sgemm/onednn-bf16`` where
            items differ).
    """

    def __init__(self, parts: Sequence[Part]):
        self.parts = list(parts)
        fns = [p.run for p in self.parts]

        def run():
            for fn in fns:
                fn()
        self._run = run

    def __call__(self) -> None:
        self._run()

    def engines(self) -> str:
        """``"label: engine, ..."``, each label once in first-seen order."""
        seen: dict[str, list[str]] = {}
        for p in self.parts:
            names = seen.setdefault(p.label, [])
            if p.engine not in names:
                names.append(p.engine)
        return ", ".join(f"{label}: {'/'.join(names)}" for label, names in seen.items())


def floor_line(floor: MachineFloor, seconds: float, unit: str = "ms", per: str = "") -> str:
    """``machine floor 3.21 ms (x@Wdq: onednn-bf16, q@Wuk: sgemm, gather: bandwidth)``;
    ``seconds`` its measured time, shown in ``unit`` (``"ms"`` or ``"us"``), followed by ``per``
    where given (``"per step"``)."""
    value = seconds * {"ms": 1e3, "us": 1e6}[unit]
    digits = max(0, 2 - math.floor(math.log10(value))) if value > 0 else 2  # 3 significant digits
    return f"machine floor {value:.{digits}f} {unit}{' ' + per if per else ''} ({floor.engines()})"


def ratio_line(what: str, seconds: float, floor_seconds: float) -> str:
    """``op / machine floor: 1.85`` (``what`` names the candidate); a ratio below 1 says so: a
    floor slower than the code it bounds is a bug in the floor."""
    ratio = seconds / floor_seconds
    return f"{what} / machine floor: {ratio:.2f}" + (" (below 1: a bug in the floor)" if ratio < 1 else "")
