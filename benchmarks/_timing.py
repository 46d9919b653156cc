"""Timing shared by the benchmark scripts: best of alternating rounds, measured in one run.

Candidates (the op and its floor) take turns round after round, so a busy spell of a shared
machine slows them alike and the printed ratios stay meaningful; one untimed warm-up round
comes first (Numba compilation, BLAS thread start-up, cached weight widening).
"""

from __future__ import annotations

import timeit
from typing import Callable, Sequence


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
