"""Checked mode: uninitialised-read, duplicate-slot and NaN / Inf checks around the ops.

In the vocabulary of msSanitizer (``initcheck``, ``racecheck``) and Pallas's interpret-mode
checks. Off by default; switched on by ``ascend-emu run --checked [--poison] script.py``, by the
environment (:data:`ENV_CHECKED` = ``1``, :data:`ENV_POISON` = ``1``, read at import) or, for
library use, by the :func:`checked` context manager (``with ascend_emu.checked(poison=True): ...``).

When on:

- Every cache an op writes keeps a **written-slot map** (one bool per slot, ``slot = block *
  block_size + row``; BSND ``b * S2 + s``; TND ``t``) for the life of the process, keyed by the
  cache's memory (data pointer, nbytes) and dropped when the array that owns the memory is
  garbage-collected (weakly referenced where the owner allows it). Cache memory filled outside
  the ops (a user's own scatter, ``np.copyto``) is declared with :func:`mark_written`.
- A cache seen for the first time (by any op) has every slot unwritten. With ``poison`` a cache
  is **poison-filled** (every byte ``0xFF``: NaN in bf16 / fp16 / fp32, -1 in int8) when a
  writer op first sees it, before the op writes, so a read that escapes the check still shows;
  :func:`poison` does the same explicitly and resets the cache's map.
- The readers (``npu_sparse_flash_attention``, ``npu_kv_quant_sparse_flash_attention``,
  ``npu_lightning_indexer``, ``npu_quant_lightning_indexer``, ``npu_fused_infer_attention_score``)
  raise :class:`~ascend_emu.errors.UninitializedReadError` before
  the kernel runs when a kv slot they would read was never written, naming the op, the argument
  and the coordinates (batch, query token, head, sparse index entry, kv token, slot, block,
  row). One hook serves them all (:func:`read`): each contract states the rows it reads
  (:class:`CacheReads`: the caches with their :class:`~ascend_emu.layouts.CacheLayout`, the
  slots, the words for each read's coordinates), as the writers state the slots they write.
- Duplicate destination slots raise :class:`~ascend_emu.errors.DuplicateSlotError` instead of
  warning :class:`~ascend_emu.errors.DuplicateSlotWarning`.
- A NaN / Inf in an op's floating outputs raises :class:`~ascend_emu.errors.NonFiniteOutputError`
  naming the op, the output and the first coordinates.

Off (and nothing collecting with :func:`observe`), every hook is a global test or two and a return
(measured in ``benchmarks/bench_checked.py``).
Source: docs/inspect.md#checked-mode; the ops' contracts in :mod:`ascend_emu.ops`. This module sits beside the
ops rather than in :mod:`ascend_emu.inspect` (which docs/architecture.md places above the ops): the ops call
its hooks, and importing it must not load the inspector.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .errors import DuplicateSlotError, HostTensorWarning, NonFiniteOutputError, UninitializedReadError

#: Environment variables that switch checked mode / poisoning on at import (value ``1``).
ENV_CHECKED = "ASCEND_EMU_CHECKED"
ENV_POISON = "ASCEND_EMU_POISON"
#: Byte written by poisoning: 0xFF is NaN in every float cache dtype and -1 in int8.
POISON_BYTE = 0xFF


@dataclass
class _State:
    enabled: bool = False
    poison: bool = False
    maps: dict = field(default_factory=dict)  # (ptr, nbytes) -> _Map
    watchers: list = field(default_factory=list)  # the lists :func:`observe` collects into


@dataclass
class _Map:
    written: np.ndarray  # bool [num_slots]
    owner: object  # weakref to the memory's owner, or None (kept for the process lifetime)


_STATE = _State(enabled=os.environ.get(ENV_CHECKED, "") == "1", poison=os.environ.get(ENV_POISON, "") == "1")


def enabled() -> bool:
    """Whether checked mode is on."""
    return _STATE.enabled


def enable(on: bool = True, *, poison: bool | None = None) -> None:
    """Switch checked mode on / off process-wide (``poison``: also poison-fill new caches)."""
    _STATE.enabled = bool(on)
    if poison is not None:
        _STATE.poison = bool(poison)


@contextlib.contextmanager
def checked(poison: bool = False):
    """Context manager: checked mode on inside the block (``poison``: poison-fill caches a
    writer op sees for the first time). Written-slot maps persist after the block."""
    saved = (_STATE.enabled, _STATE.poison)
    _STATE.enabled, _STATE.poison = True, bool(poison) or saved[1]
    try:
        yield
    finally:
        _STATE.enabled, _STATE.poison = saved


def reset() -> None:
    """Forget every written-slot map."""
    _STATE.maps.clear()


# ---------------------------------------------------------------------- memory identity
def _key(a: np.ndarray) -> tuple[int, int]:
    return int(a.__array_interface__["data"][0]), int(a.nbytes)


def _owner(a: np.ndarray):
    """A weak reference to the ndarray that owns ``a``'s memory, or None when the owner is not
    an ndarray owning its data (a view of a torch tensor made per call, a buffer): such a map is
    kept for the process lifetime."""
    root = a
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if not (isinstance(root, np.ndarray) and root.flags.owndata):
        return None
    return weakref.ref(root)


def _map(a: np.ndarray, num_slots: int, *, create: bool = True) -> _Map | None:
    key = _key(a)
    m = _STATE.maps.get(key)
    if m is not None and m.owner is not None and m.owner() is None:  # memory freed and reused
        del _STATE.maps[key]
        m = None
    if m is not None and m.written.size != num_slots:  # same memory seen as another slot count
        m = _STATE.maps[key] = _Map(np.full(num_slots, bool(m.written.all())), m.owner)
    if m is None and create:
        m = _STATE.maps[key] = _Map(np.zeros(num_slots, bool), _owner(a))
    return m


#: How a tensor type other than ``np.ndarray`` is seen as an ndarray over its own memory:
#: ``(type, view(value, name) -> ndarray)`` pairs, handed down by the layers above at their import
#: (the drop-in registers ``torch.Tensor`` with :func:`ascend_emu.torch_npu.to_numpy`), so this
#: module imports nothing above it.
_TENSOR_VIEWS: list[tuple[type, Callable[[Any, str], np.ndarray]]] = []


def register_tensor_view(tensor_type: type, view: Callable[[Any, str], np.ndarray]) -> None:
    """Let :func:`poison`, :func:`mark_written` and the maps take ``tensor_type`` values, seen
    through ``view(value, name)``: an ndarray over the value's own memory (no copy), so a map is
    the one the ops keep for that memory. Registering a type again replaces its view."""
    _TENSOR_VIEWS[:] = [(t, v) for t, v in _TENSOR_VIEWS if t is not tensor_type]
    _TENSOR_VIEWS.append((tensor_type, view))


def _as_array(cache, name: str = "cache") -> np.ndarray:
    """``cache`` as an ndarray over its own memory: a torch tensor through the view the drop-in
    registered (:func:`register_tensor_view`; no copy), so its map is the one the ops keep for
    the tensor's memory."""
    if isinstance(cache, np.ndarray):
        return cache
    for tensor_type, view in _TENSOR_VIEWS:
        if isinstance(cache, tensor_type):
            return view(cache, name)
    from .errors import DTypeError, arg_error

    if type(cache).__module__.split(".")[0] == "torch":  # a tensor before the drop-in was imported
        raise arg_error(DTypeError, name, "a NumPy array, or a CPU torch tensor once ascend_emu.torch_npu is imported",
                        type(cache).__name__)
    raise arg_error(DTypeError, name, "a NumPy array or a CPU torch tensor", type(cache).__name__)


def _slot_count(cache: np.ndarray, num_slots: int | None) -> int:
    if num_slots is not None:
        return int(num_slots)
    return int(np.prod(cache.shape[:-2])) if cache.ndim >= 3 else int(cache.shape[0])


def poison(cache, num_slots: int | None = None):
    """Fill ``cache`` with :data:`POISON_BYTE` and mark every slot unwritten.

    Args:
        cache: a C-contiguous, writable cache (any dtype / shape): a NumPy array or a CPU torch
            tensor (the drop-in's caches).
        num_slots: slots in the cache; default the product of all but the last two dims
            (``[blocks, block_size, N, D]`` -> blocks * block_size).

    Returns:
        ``cache`` (filled in place).

    Raises:
        DTypeError: ``cache`` is neither an ndarray nor a torch tensor.
    """
    a = _as_array(cache)
    a.reshape(-1).view(np.uint8)[:] = POISON_BYTE
    _map(a, _slot_count(a, num_slots)).written[:] = False
    return cache


def mark_written(cache, slots=None, num_slots: int | None = None) -> None:
    """Declare slots of ``cache`` written outside the ops (``slots`` None: all; -1 entries are
    skipped; a list, an int array or an int tensor). ``cache``: a NumPy array or a CPU torch
    tensor (the drop-in's caches, as passed to ``torch_npu`` ops under ``ascend-emu run
    --checked``). ``num_slots`` as :func:`poison`. Works whether checked mode is on or not.

    Raises:
        DTypeError: ``cache`` is neither an ndarray nor a torch tensor.
    """
    cache = _as_array(cache)
    if slots is not None and not isinstance(slots, (np.ndarray, list, tuple, int)):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(slots, torch.Tensor):
            slots = slots.detach().cpu().numpy()
    m = _map(cache, _slot_count(cache, num_slots))
    if slots is None:
        m.written[:] = True
    else:
        s = np.asarray(slots, np.int64).reshape(-1)
        m.written[s[s >= 0]] = True


def written_slots(cache) -> np.ndarray | None:
    """The cache's written-slot map (bool ``[num_slots]``, a copy), or None if never seen
    (``cache``: a NumPy array or a CPU torch tensor)."""
    m = _STATE.maps.get(_key(_as_array(cache)))
    return None if m is None else m.written.copy()


# ---------------------------------------------------------------------- hooks (ops call these)
def will_write(*caches) -> None:
    """Writer hook before the backend: poison-fill caches seen for the first time (poison on).

    ``caches``: ``(cache, layout)`` pairs (a :class:`~ascend_emu.layouts.CacheLayout`, whose
    ``num_rows`` is the slot count; a None layout or cache is skipped), or ``(cache, layout,
    source)`` when the op writes into a copy of ``source`` (a functional form): the copy
    inherits ``source``'s map."""
    if _STATE.watchers:
        _tell(CacheUse("write", tuple((None, c, lay, *src) for c, lay, *src in caches)))
    if not _STATE.enabled:
        return
    for cache, layout, *source in caches:
        if cache is None or layout is None:
            continue
        src = _STATE.maps.get(_key(source[0])) if source and source[0] is not None else None
        if src is not None and _key(cache) != _key(source[0]):
            _STATE.maps[_key(cache)] = _Map(src.written.copy(), _owner(cache))
        elif _STATE.poison and _key(cache) not in _STATE.maps:
            poison(cache, layout.num_rows)


def wrote(op: str, slots, caches, outputs=()) -> None:
    """Writer hook after the backend: mark ``slots`` (int64, -1 = skipped) written in each
    ``(cache, layout)`` of ``caches`` (as :func:`will_write`); check ``outputs`` (``(name,
    array)``) for NaN / Inf."""
    if not _STATE.enabled:
        return
    if slots is not None:
        s = np.asarray(slots, np.int64).reshape(-1)
        s = s[s >= 0]
        for cache, layout, *_ in caches:
            if cache is not None and layout is not None:
                _map(cache, layout.num_rows).written[s] = True
    check_finite(op, outputs)


def duplicates(name: str, dups: dict) -> None:
    """Raise :class:`DuplicateSlotError` for ``dups`` (slot -> tokens) when checked mode is on."""
    if _STATE.enabled and dups:
        shown = "; ".join(f"slot {s} <- tokens {t}" for s, t in list(dups.items())[:4])
        raise DuplicateSlotError(f"{name}: {len(dups)} cache slot(s) written by more than one token "
                                 f"(checked mode; undefined on hardware): {shown}")


def host_call(op: str) -> None:
    """Warn :class:`~ascend_emu.errors.HostTensorWarning` when checked mode is on: ``op`` (an NPU
    op) was called with every tensor on the CPU, which runs here and fails on the NPU."""
    if _STATE.enabled:
        warnings.warn(f"{op}: every tensor argument is on the CPU (checked mode; the NPU needs them on "
                      "the npu device: a forgotten .npu()?)", HostTensorWarning, stacklevel=4)


def check_finite(op: str, outputs) -> None:
    """Raise :class:`NonFiniteOutputError` at the first NaN / Inf of a floating output
    (``outputs``: ``(name, array)`` pairs; non-float arrays and None are skipped)."""
    if not _STATE.enabled:
        return
    for name, out in outputs:
        if not isinstance(out, np.ndarray) or not (out.dtype.kind == "f" or out.dtype.name == "bfloat16"):
            continue
        bad = ~np.isfinite(out.astype(np.float32) if out.dtype.name == "bfloat16" else out)
        if bad.any():
            at = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), out.shape))
            raise NonFiniteOutputError(f"{op}: {name}{list(at)} = {out[at]} is not finite "
                                       f"({int(bad.sum())} non-finite values in {name}, shape {list(out.shape)})")


@dataclass(frozen=True)
class CacheReads:
    """The cache rows one call reads, as its contract states them (each reader's args expose
    ``cache_reads()``): checked mode's one read hook, :func:`read`, checks them.

    Attributes:
        caches: ``(name, cache, layout)`` per cache read at those rows: the argument name, the
            caller's array and its :class:`~ascend_emu.layouts.CacheLayout` (whose ``num_rows``
            is the slot count and whose ``place`` names a slot); a None cache is skipped.
        slots: int64 ``[R]``: the slot of every read, in the order the kernel reads them.
        where: ``where(i)``: the op's coordinates of read ``i`` in words (batch, query token,
            head, index entry, kv token, ...).
    """

    caches: tuple
    slots: np.ndarray
    where: Callable[[int], str]


def read(op: str, reads: Callable[[], CacheReads | None]) -> None:
    """Reader hook (after validation, before the kernel): raise :class:`UninitializedReadError`
    at the first read whose slot was never written, naming the op, the cache argument, the
    read's coordinates (``reads().where``) and the slot's place in the cache
    (:meth:`~ascend_emu.layouts.CacheLayout.place`), and the count of unwritten reads.

    ``reads``: the contract's ``cache_reads`` method, called only when checked mode is on or
    :func:`observe` collects (otherwise the hook is one global test)."""
    if not (_STATE.enabled or _STATE.watchers):
        return
    r = reads()
    if _STATE.watchers and r is not None:
        _tell(CacheUse("read", tuple((name, cache, layout) for name, cache, layout in r.caches)))
    if not _STATE.enabled:
        return
    if r is None or r.slots.size == 0:
        return
    for name, cache, layout in r.caches:
        if cache is None:
            continue
        m = _map(np.asarray(cache), layout.num_rows, create=False)
        bad = np.ones(r.slots.shape, bool) if m is None else ~m.written[r.slots]
        if bad.any():
            i = int(np.argmax(bad))
            raise UninitializedReadError(f"{op}: {name} read before written: {r.where(i)} at "
                                         f"{layout.place(int(r.slots[i]))}; {int(bad.sum())} {_UNWRITTEN_TAIL}")


@dataclass(frozen=True)
class CacheUse:
    """The caches one hook call named, as :func:`observe` collects them.

    Attributes:
        kind: ``"read"`` (:func:`read`) or ``"write"`` (:func:`will_write`).
        caches: ``(name, cache, layout, *source)`` per cache: the argument name (None for a
            written cache: the writers' hooks name none), the array, its
            :class:`~ascend_emu.layouts.CacheLayout` (the contract's object) and, for a functional
            form's copy, the caller's array it copies.
    """

    kind: str
    caches: tuple


def _tell(use: CacheUse) -> None:
    for w in _STATE.watchers:
        w.append(use)


@contextlib.contextmanager
def observe():
    """Collect the caches every op reads and writes inside the block (a list of
    :class:`CacheUse`, yielded), whether checked mode is on or off: how replay describes each
    cache with the layout its op's contract gives it (:func:`ascend_emu.compare.replay`). Readers
    build their :class:`CacheReads` for it."""
    uses: list[CacheUse] = []
    _STATE.watchers.append(uses)
    try:
        yield uses
    finally:
        _STATE.watchers.remove(uses)


#: The end of every uninitialised-read message.
_UNWRITTEN_TAIL = ("unwritten reads in this call (checked mode: slot never written by an op since the cache was "
                   "created / poisoned; declare outside writes with ascend_emu.mark_written)")
