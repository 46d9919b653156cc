"""Timing shared by the benchmark scripts: best of alternating rounds, measured in one run.

Candidates (the op and its floor) take turns round after round, so a busy spell of a shared
machine slows them alike and the printed ratios stay meaningful; one untimed warm-up round
comes first (Numba compilation, BLAS thread start-up, cached weight widening).
"""

from __future__ import annotations

import os
import sys
import timeit
from typing import Callable, Sequence

#: The thread counts a ``--threads N`` benchmark sets: OpenBLAS, Numba and torch's OpenMP.
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS")


def run_with_threads(threads: int | None) -> str:
    """With ``threads``, restart this script with every :data:`THREAD_VARIABLES` set to it (the
    libraries read them when they load) unless all of them already are (one set by hand, e.g.
    ``OPENBLAS_NUM_THREADS=1`` alone, would leave torch's oneDNN floor on every core); return the
    thread set-up as one line (``OPENBLAS_NUM_THREADS=1, ...``)."""
    if threads is not None and any(os.environ.get(v) != str(threads) for v in THREAD_VARIABLES):
        env = dict(os.environ, **{v: str(threads) for v in THREAD_VARIABLES})
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    return ", ".join(f"{v}={os.environ.get(v, 'unset')}" for v in THREAD_VARIABLES)


def have_torch() -> bool:
    """Whether torch imports (the benchmarks' torch goldens need it)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def best_times(fns: Sequence[Callable[[], object]], repeat: int, *, number: int = 1,
               before: Sequence[Callable[[], object] | None] | None = None) -> list[float]:
    """Best wall time per call of each candidate, in seconds.

    Args:
        fns: the candidates, each called with no arguments.
        repeat: timed rounds; each round runs every candidate once, in order.
        number: calls per candidate per round; a round's time is divided by it.
        before: optional untimed hook per candidate, run before each of its rounds (e.g. to
            set a library's thread count).

    Returns:
        For each candidate, the best over ``repeat`` rounds of its mean time per call.
    """
    hooks = list(before) if before is not None else [None] * len(fns)
    best = [float("inf")] * len(fns)
    for r in range(repeat + 1):  # round 0 warms up
        for i, fn in enumerate(fns):
            if hooks[i] is not None:
                hooks[i]()
            t = timeit.timeit(fn, number=number) / number
            if r:
                best[i] = min(best[i], t)
    return best
