"""``emu.kernels.side_by_side``: work items split between Python threads, every item once, Numba
kernels serial inside, the first error raised."""

from __future__ import annotations

import threading

import numba
import pytest

from ascend_emu.emu import kernels


def test_every_item_once_and_kernels_serial_inside():
    seen, parts, idents = [], [], set()
    lock = threading.Lock()

    def fn(item):
        with lock:
            seen.append(item)
            parts.append(kernels.parallel_parts(10 ** 6, 10 ** 6))
            idents.add(threading.get_ident())

    kernels.side_by_side(fn, list(range(7)), 3)
    assert sorted(seen) == list(range(7))
    assert parts == [1] * 7  # no parallel launch from a worker or the caller inside
    assert len(idents) >= 2 and threading.get_ident() in idents  # the caller and pool threads
    if numba.get_num_threads() > 1:
        assert kernels.parallel_parts(10 ** 6, 10 ** 6) > 1  # the caller's flag is restored


def test_one_thread_runs_in_order_on_the_caller():
    order = []
    kernels.side_by_side(lambda i: order.append((i, threading.get_ident())), [3, 1, 2], 1)
    assert order == [(3, threading.get_ident()), (1, threading.get_ident()), (2, threading.get_ident())]


def test_a_worker_error_is_raised_after_all_finish():
    done = []

    def fn(item):
        if item == 5:
            raise KeyError("item 5")
        done.append(item)

    with pytest.raises(KeyError, match="item 5"):
        kernels.side_by_side(fn, list(range(6)), 2)  # 5 is in the worker's run
    assert sorted(done) == [0, 1, 2, 3, 4]


def test_runs_split_at_equal_costs():
    where = {}
    lock = threading.Lock()

    def fn(item):
        with lock:
            where[item] = threading.get_ident()

    kernels.side_by_side(fn, list(range(6)), 2, costs=[5, 1, 1, 1, 1, 1])
    assert where[0] == threading.get_ident()  # the caller's run: item 0 (cost 5)
    assert {where[i] for i in range(1, 6)} - {threading.get_ident()}  # the rest (cost 5) on a worker
    assert len({where[i] for i in range(1, 6)}) == 1


def test_torch_thread_count_of_the_caller_is_kept():
    """torch sets a thread's count on its first use from the last count any thread set: a worker's
    one-thread setting must not become the count of a caller that had not used torch yet."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    code = """
import ascend_emu, torch
from ascend_emu.emu import kernels
kernels.side_by_side(lambda i: torch.ones(4).sum(), list(range(8)), 2)
print(torch.get_num_threads())
"""
    env = dict(os.environ, OMP_NUM_THREADS="2")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split()[-1] == "2"


def test_a_split_inside_a_run_runs_in_place():
    """A split asked for inside a run (one pool thread) runs there: no wait on the busy pool."""
    seen = []
    lock = threading.Lock()

    def inner(item):
        with lock:
            seen.append((item, threading.get_ident()))

    def outer(item):
        ident = threading.get_ident()
        kernels.side_by_side(inner, [(item, j) for j in range(3)], 2)
        with lock:
            assert all(i == ident for (it, _), i in seen if it == item)

    runner = threading.Thread(target=kernels.side_by_side, args=(outer, [0, 1], 2), daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive(), "a nested split waits on the pool it runs in"
    assert sorted(item for item, _ in seen) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
