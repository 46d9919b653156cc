"""Where many independent calls run: in this process, or in a pool of worker processes.

An engine runs one picklable, module-level function over a list of work items (``ascend-emu
replay``: one item per dumped call, :func:`ascend_emu.compare.msprobe.run_unit`; ``ascend-emu
demo`` and ``warmup``: one item per group of kernels to compile) and yields ``(position, result)``
pairs as the items finish, in any order; the caller puts them back in item order, so what it
writes does not depend on the engine or on the number of workers. An item that raises, outlives
the per-item timeout or takes its worker down yields a :class:`TaskFailure` instead of a result,
and the run goes on.

The interface is one method, ``run(fn, items, timeout)``: :class:`InProcess` (``-n 1``),
:class:`ProcessPool` (``-n N``) and :class:`RayEngine` (``--ray``: Ray tasks, each loading its
own tensors from a shared dump path). This module imports nothing beyond the standard library
(Ray is imported inside :meth:`RayEngine.run` only): a worker process starts by importing only
``fn``'s module. It sits on the bottom floor of the package (``docs/architecture.md``), below
``compare``, ``demo``, ``warmup`` and ``cli``, which all use it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator, Protocol, Sequence


@dataclass(frozen=True)
class TaskFailure:
    """Why an item has no result: ``kind`` is ``timeout`` (ran past the timeout; its worker was
    stopped), ``crash`` (its worker process died) or ``error`` (``fn`` raised; ``message`` is
    ``Type: message``)."""

    kind: str
    message: str


class Engine(Protocol):
    """What runs the work items (of a replay, or of a kernel warm-up)."""

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any],
            timeout: float | None) -> Iterator[tuple[int, Any]]:
        """Yield ``(position in items, fn(item) or a TaskFailure)`` for every item, as each
        finishes. ``timeout``: seconds one item may take (None: no limit)."""
        ...


def default_workers() -> int:
    """The number of CPU cores this process may use (``os.sched_getaffinity`` where the
    platform has it, else ``os.cpu_count()``), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


class _Timeout(Exception):
    pass


class InProcess:
    """Every item in this process, one after the other (``-n 1``).

    The timeout is a ``SIGALRM`` timer, armed only where signals can be handled (the main
    thread of a POSIX process); it interrupts Python code, so a kernel running in native code
    is stopped when it returns to Python. Elsewhere items run without a limit.
    """

    def run(self, fn, items, timeout):
        alarm = (timeout is not None and hasattr(signal, "setitimer")
                 and threading.current_thread() is threading.main_thread())
        for i, item in enumerate(items):
            if not alarm:
                yield i, _call(fn, item)
                continue

            def expire(signum, frame):
                raise _Timeout

            previous = signal.signal(signal.SIGALRM, expire)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                result = _call(fn, item)
            except _Timeout:
                result = _timed_out(timeout)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            yield i, result


def _call(fn, item):
    try:
        return fn(item)
    except _Timeout:
        raise
    except Exception as exc:  # noqa: BLE001  (reported per item)
        return TaskFailure("error", f"{type(exc).__name__}: {exc}")


def _timed_out(timeout: float) -> TaskFailure:
    return TaskFailure("timeout", f"ran past the per-call timeout of {timeout:g} s and was stopped")


def _worker(conn, fn) -> None:
    """A pool worker: say it is ready, then ``(i, item)`` -> ``(i, result)`` until None."""
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        i, item = msg
        conn.send((i, _call(fn, item)))


class ProcessPool:
    """``workers`` worker processes (``spawn``: a fresh interpreter each, nothing inherited
    from this one's threads), each item sent to an idle worker; a worker whose item runs past
    the timeout is killed and replaced, as is one that dies.

    Args:
        workers: number of processes (>= 1).
    """

    def __init__(self, workers: int):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: expected an int >= 1, got {workers!r}")
        self.workers = workers

    def run(self, fn, items, timeout):
        ctx = multiprocessing.get_context("spawn")
        todo = deque(enumerate(items))
        slots: list[dict] = []

        def start() -> dict:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, fn), daemon=True)
            proc.start()
            child.close()
            return {"proc": proc, "conn": parent, "ready": False, "task": None, "deadline": None}

        def stop(slot: dict) -> None:
            slot["proc"].kill()
            slot["proc"].join()
            slot["conn"].close()

        try:
            slots = [start() for _ in range(min(self.workers, len(todo)))]
            busy = 0
            while todo or busy:
                for slot in slots:
                    if slot["ready"] and slot["task"] is None and todo:
                        i, item = todo.popleft()
                        slot["conn"].send((i, item))
                        slot["task"] = i
                        slot["deadline"] = None if timeout is None else time.monotonic() + timeout
                        busy += 1
                deadlines = [s["deadline"] for s in slots if s["deadline"] is not None]
                wait_for = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
                ready = wait([s["conn"] for s in slots], timeout=wait_for)
                for n, slot in enumerate(slots):
                    if slot["conn"] in ready:
                        try:
                            msg = slot["conn"].recv()
                        except (EOFError, OSError):
                            task = slot["task"]
                            stop(slot)
                            slots[n] = start()
                            if task is not None:
                                busy -= 1
                                yield task, TaskFailure("crash", "the worker process running it died (exit code "
                                                                 f"{slot['proc'].exitcode})")
                            else:
                                raise RuntimeError("a replay worker process died before taking any call (exit "
                                                   f"code {slot['proc'].exitcode})") from None
                            continue
                        if msg == "ready":
                            slot["ready"] = True
                            continue
                        i, result = msg
                        slot["task"] = slot["deadline"] = None
                        busy -= 1
                        yield i, result
                    elif slot["deadline"] is not None and time.monotonic() >= slot["deadline"]:
                        task = slot["task"]
                        stop(slot)
                        slots[n] = start()
                        busy -= 1
                        yield task, _timed_out(timeout)
        finally:
            for slot in slots:
                try:
                    slot["conn"].send(None)
                except (OSError, ValueError):
                    pass
            for slot in slots:
                slot["proc"].join(timeout=5)
                if slot["proc"].is_alive():
                    slot["proc"].kill()
                    slot["proc"].join()
                slot["conn"].close()


#: Seconds a Ray task may run past the timeout before the driver kills its worker: the task's
#: own timer (:class:`InProcess` in the worker) stops Python code at the timeout; this covers a
#: worker stuck in native code, and the time from submission to start (a new worker importing
#: torch and ascend_emu, or a call waiting for a free CPU).
RAY_GRACE = 60.0


def _import_ray():
    try:
        import ray
    except ModuleNotFoundError as exc:
        from ..install_hints import RAY_HINT

        raise ModuleNotFoundError(f"--ray needs Ray, which is not installed: {RAY_HINT}") from exc
    return ray


def init_ray(address: str | None = None, num_cpus: int | None = None):
    """``ray.init`` as replay starts Ray: no dashboard, the workers' logs not forwarded to this
    process, Ray's own logging at ERROR, no usage report over the network
    (``RAY_USAGE_STATS_ENABLED=0`` unless set). ``address``: the cluster (None: a local Ray, of
    ``num_cpus`` CPUs, or whatever ``RAY_ADDRESS`` names). Returns the ``ray`` module.

    Raises:
        ModuleNotFoundError: Ray is not installed (the message names the ``[ray]`` extra).
    """
    import logging

    ray = _import_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    local = address is None and "RAY_ADDRESS" not in os.environ
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             **({"num_cpus": num_cpus} if local and num_cpus is not None else {}))
    return ray


def _ray_task(fn, item, timeout):
    """The body of one Ray task: ``fn(item)`` under the per-item timer (:class:`InProcess`: a
    Ray worker runs its tasks in its main thread), a :class:`TaskFailure` when it raises or
    runs past ``timeout``."""
    ((_, result),) = InProcess().run(fn, [item], timeout)
    return result


class RayEngine:
    """Every item as one Ray task (``ray.remote``, one CPU each): at most ``workers`` tasks in
    flight (default: the cluster's CPUs), results collected with ``ray.wait`` as they finish.

    Ray is imported when :meth:`run` starts (the ``[ray]`` extra). Where Ray is not initialised
    yet, :meth:`run` starts it with :func:`init_ray` (``address`` None: a local Ray of ``workers``
    CPUs, or whatever ``RAY_ADDRESS`` names; ``"auto"``: the cluster this machine belongs to)
    and shuts it down when done; an initialised Ray is used as it is and left running. The
    tasks find ``fn``'s module by import:
    ``ascend_emu`` must be installed on every node, and the items' paths (the dump, the output
    directory) must be the same shared directories there.

    Timeouts: a task stops itself at ``timeout`` (a timer in the worker, as :class:`InProcess`);
    one still running ``timeout + grace`` seconds after its submission (native code that does not
    return) is cancelled with ``force=True`` (its worker killed). Both are reported as
    ``timeout``. A worker lost while running a task (its process or node died) is retried up to
    ``max_retries`` times, then reported as ``crash``.

    Args:
        address: the Ray cluster (``ray.init``'s ``address``); None: a local Ray.
        workers: tasks in flight at once, and the CPUs of a local Ray (None: the cluster's CPUs,
            all cores for a local Ray).
        max_retries: Ray's ``max_retries`` (retries after a lost worker; exceptions raised by
            ``fn`` are never retried).
        grace: see above, seconds (default :data:`RAY_GRACE`).

    Raises (from :meth:`run`):
        ModuleNotFoundError: Ray is not installed (the message names the ``[ray]`` extra).
    """

    def __init__(self, address: str | None = None, *, workers: int | None = None, max_retries: int = 3,
                 grace: float = RAY_GRACE):
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers: expected an int >= 1 or None, got {workers!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries: expected an int >= 0, got {max_retries!r}")
        self.address = address or None
        self.workers = workers
        self.max_retries = max_retries
        self.grace = grace

    def run(self, fn, items, timeout):
        ray = _import_ray()
        owned = not ray.is_initialized()
        if owned:
            init_ray(self.address, self.workers)
        try:
            yield from self._run(ray, fn, items, timeout)
        finally:
            if owned:
                ray.shutdown()

    def _run(self, ray, fn, items, timeout):
        task = ray.remote(num_cpus=1, max_retries=self.max_retries)(_ray_task)
        window = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        fn_ref = ray.put(fn)
        todo = deque(enumerate(items))
        running: dict = {}  # ObjectRef -> (position, hard deadline or None)
        try:
            while todo or running:
                while todo and len(running) < window:
                    i, item = todo.popleft()
                    ref = task.remote(fn_ref, item, timeout)
                    running[ref] = (i, None if timeout is None else time.monotonic() + timeout + self.grace)
                deadlines = [d for _, d in running.values() if d is not None]
                wait_for = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
                ready, _ = ray.wait(list(running), num_returns=1, timeout=wait_for)
                for ref in ready:
                    i, _ = running.pop(ref)
                    yield i, self._result(ray, ref)
                now = time.monotonic()
                for ref in [r for r, (_, d) in running.items() if d is not None and now >= d]:
                    i, _ = running.pop(ref)
                    ray.cancel(ref, force=True)
                    yield i, TaskFailure("timeout", f"ran past the per-call timeout of {timeout:g} s (and "
                                                    f"{self.grace:g} s more) and its Ray worker was stopped")
        finally:
            for ref in running:
                ray.cancel(ref, force=True)

    def _result(self, ray, ref):
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # fn's own errors come back as TaskFailure
            return TaskFailure("error", f"{type(exc).__name__}: {exc}")
        except ray.exceptions.RayError as exc:  # a lost worker or node, after max_retries
            return TaskFailure("crash", f"its Ray worker was lost ({type(exc).__name__}) after {self.max_retries} "
                                        "retries")


def make_engine(workers: int | None) -> Engine:
    """:class:`InProcess` for ``workers == 1``, else a :class:`ProcessPool` of ``workers``
    processes (None: :func:`default_workers`)."""
    n = default_workers() if workers is None else workers
    return InProcess() if n == 1 else ProcessPool(n)
