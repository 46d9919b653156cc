"""Argument checks shared by every op contract.

Each check raises the house error (see :mod:`ascend_emu.errors`) naming the argument, the
expectation and the value. Nothing here writes to any array.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import os
import sys
import warnings
from collections import OrderedDict
from typing import Callable, Hashable, Iterable, Sequence

import numpy as np

from .. import checked_mode
from ..errors import DTypeError, DuplicateSlotWarning, FormatError, ShapeError, arg_error, describe
from ..layouts import FRACTAL_NZ, NZArray, duplicate_slots, get_npu_format, slots_from_index_rows
from ..quant import BF16

#: dtype names as the seeds spell them.
DTYPES = {
    "bfloat16": BF16,
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "int8": np.dtype(np.int8),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}


@functools.lru_cache(maxsize=256)
def dtype_name(dtype) -> str:
    """Seed spelling of a NumPy dtype (``bfloat16`` for ml_dtypes' type); memoised (dtypes and
    type objects are hashable, and ``np.dtype(...).name`` costs about a microsecond)."""
    return np.dtype(dtype).name


def required(x, name: str) -> np.ndarray:
    """``x`` as an ndarray (subclass kept); raises if it is None or not in native byte order.

    Raises:
        ShapeError: x is None.
        DTypeError: non-native byte order (e.g. ``'>f2'``): the checks compare dtype names and
            the kernels read native bytes, so such an array would be misread (and a cache
            written with native bytes).
    """
    if x is None:
        raise arg_error(ShapeError, name, "a tensor", None)
    x = x if isinstance(x, np.ndarray) else np.asarray(x)
    if not x.dtype.isnative:
        raise arg_error(DTypeError, name, f"native byte order ({sys.byteorder}-endian; convert with "
                        f"{name}.astype({name}.dtype.newbyteorder('=')))", f"dtype {x.dtype.str!r}")
    return x


def optional(x, name: str) -> np.ndarray | None:
    """``x`` as an ndarray, or None."""
    return None if x is None else required(x, name)


def check_dtype(x: np.ndarray, name: str, allowed: Iterable[str]) -> None:
    """Raise unless ``x.dtype`` is one of ``allowed`` (seed spellings).

    Raises:
        DTypeError: dtype not allowed.
    """
    allowed = tuple(allowed)
    if dtype_name(x.dtype) not in allowed:
        raise arg_error(DTypeError, name, f"dtype {' or '.join(allowed)}", dtype_name(x.dtype))


def check_shape(x: np.ndarray, name: str, expected: Sequence[int | None], what: str = "") -> None:
    """Raise unless ``x.shape`` matches ``expected`` (None = any size).

    Raises:
        ShapeError: rank or a size differs; the message says when ``x`` looks transposed.
    """
    ok = x.ndim == len(expected) and all(e is None or e == s for e, s in zip(expected, x.shape, strict=True))
    if not ok:
        shown = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise arg_error(ShapeError, name, f"shape {shown}{' ' + what if what else ''}",
                        f"{list(x.shape)}{transposed_hint(x.shape, expected, name)}")


def transposed_hint(shape: Sequence[int], expected: Sequence[int | None], name: str) -> str:
    """A hint for a weight given transposed: ``shape`` is ``expected`` with its last two dims
    swapped (and they differ), else ``""``."""
    shape, expected = tuple(int(s) for s in shape), tuple(expected)
    if len(shape) < 2 or len(shape) != len(expected) or None in expected[-2:] or expected[-1] == expected[-2]:
        return ""
    swapped = expected[:-2] + (expected[-1], expected[-2])
    if all(e is None or e == s for e, s in zip(swapped, shape, strict=True)):
        return (f" (it looks transposed: pass {name} transposed; for a FRACTAL_NZ weight, transpose the ND "
                f"tensor, make it contiguous, then npu_format_cast it)")
    return ""


def check_ndim(x: np.ndarray, name: str, ndims: Iterable[int], what: str = "") -> None:
    """Raise unless ``x.ndim`` is one of ``ndims``.

    Raises:
        ShapeError: wrong rank.
    """
    ndims = tuple(ndims)
    if x.ndim not in ndims:
        raise arg_error(ShapeError, name, f"{' or '.join(map(str, ndims))}-D{' ' + what if what else ''}",
                        f"{x.ndim}-D shape {list(x.shape)}")


#: Largest batch count B (the seeds' "B: 0~65536", npu_mla_prolog / _v3): a bound on every
#: ``actual_seq_lengths_*`` tensor that sets B by its own length (TND), checked before it is widened
#: or anything is allocated per batch.
MAX_BATCH = 65536


def seq_lengths(x, name: str, b: int | None = None) -> np.ndarray:
    """An int32 1-D ``actual_seq_lengths_*`` tensor (per-batch lengths or TND prefix sums) as
    int64 ``[B]``; ``b``: the batch count it must have (None: any B in ``[1, MAX_BATCH]``).

    Raises:
        DTypeError: not int32.
        ShapeError: not 1-D, empty, longer than :data:`MAX_BATCH`, or not ``[b]``; checked
            before the int64 copy is made.
    """
    x = required(x, name)
    check_dtype(x, name, ("int32",))
    if x.ndim != 1 or (b is not None and x.shape[0] != b) or not 1 <= x.shape[0] <= MAX_BATCH:
        want = f"[B={b}]" if b is not None else f"[B] with 1 <= B <= {MAX_BATCH}"
        raise arg_error(ShapeError, name, f"a 1-D int32 tensor {want}", f"shape {list(x.shape)}")
    return x.astype(np.int64)


def check_cu_seqlens(cu: np.ndarray, name: str, error: type, *, total: int | None = None,
                     at_most: int | None = None) -> np.ndarray:
    """A ``cu_seqlens``-style prefix sum (int64 ``[B + 1]``, e.g. from :func:`seq_lengths`): it
    starts at 0, never decreases (a decreasing one makes the NPU read out of bounds), and its last
    entry equals ``total`` / is at most ``at_most`` where given. Returns the per-request counts
    ``[B]`` (``np.diff``).

    Raises:
        ``error`` (the op's documented class): naming the first offending entry ``name[i]``.
    """
    if cu[0] != 0:
        raise arg_error(error, f"{name}[0]", "0 (a prefix sum starts at 0)", int(cu[0]))
    steps = np.diff(cu)
    if (steps < 0).any():
        i = int(np.argmax(steps < 0)) + 1
        raise arg_error(error, f"{name}[{i}]", "a non-decreasing prefix sum (the NPU reads out of bounds "
                        "otherwise)", f"{int(cu[i])} after {int(cu[i - 1])}")
    last = int(cu[-1])
    if total is not None and last != total:
        raise arg_error(error, f"{name}[{cu.size - 1}]", f"the token count T={total}", last)
    if at_most is not None and last > at_most:
        raise arg_error(error, f"{name}[{cu.size - 1}]", f"at most T = {at_most} (the token rows)", last)
    return steps


def per_batch_lengths(x, name: str, b: int, cap: int | None = None, what: str = "a token count") -> np.ndarray:
    """Per-batch token counts ``[B]`` (BSND / PA_BSND ``actual_seq_lengths_*``), each in ``[0, cap]``.

    Raises:
        DTypeError, ShapeError: as :func:`seq_lengths`; ShapeError also for a count out of range,
            naming its index.
    """
    v = seq_lengths(x, name, b)
    bad = (v < 0) | ((v > cap) if cap is not None else False)
    if bad.any():
        i = int(np.argmax(bad))
        rng = f"in [0, {cap}]" if cap is not None else ">= 0"
        raise arg_error(ShapeError, f"{name}[{i}]", f"{what} {rng}", int(v[i]))
    return v


#: Most entries :func:`known_per_batch_lengths` checks as Python ints (more: NumPy's path).
_SMALL_LENGTHS = 64


def known_per_batch_lengths(x, name: str, b: int, cap: int | None = None, what: str = "a token count") -> np.ndarray:
    """:func:`per_batch_lengths` for a call whose signature (:func:`signature`) passed it before:
    ``x``'s type, dtype (int32) and shape ``[b]`` are then known good, so only its values are
    checked, as Python ints when there are few of them. A value out of range (and a large ``x``)
    goes through :func:`per_batch_lengths`: the same errors with the same messages.

    Returns:
        int64 ``[B]``.

    Raises:
        ShapeError: as :func:`per_batch_lengths` (a count out of range, naming its index).
    """
    if x.size <= _SMALL_LENGTHS:
        vals = x.tolist()
        if min(vals) >= 0 and (cap is None or max(vals) <= cap):
            return np.array(vals, np.int64)
    return per_batch_lengths(x, name, b, cap, what)


def prefix_lengths(x, name: str, total: int, b: int | None = None) -> np.ndarray:
    """TND ``actual_seq_lengths_*`` prefix sums ``[B]`` -> per-batch lengths ``[B]``: non-decreasing,
    >= 0, the last equal to the token rows ``total``.

    Raises:
        DTypeError, ShapeError: as :func:`seq_lengths`; ShapeError also for a decreasing or negative
            sum or a last sum other than ``total``, naming its index.
    """
    v = seq_lengths(x, name, b)
    lens = np.diff(v, prepend=0)
    if (lens < 0).any():
        i = int(np.argmax(lens < 0))
        raise arg_error(ShapeError, f"{name}[{i}]", "a non-decreasing prefix sum >= 0 (TND)",
                        f"{int(v[i])} after {int(v[i - 1]) if i else 0}")
    if int(v[-1]) != total:
        raise arg_error(ShapeError, f"{name}[{v.size - 1}]", f"the total token count T={total} (TND prefix sums)",
                        int(v[-1]))
    return lens


#: Query / output tensor layouts of the sparse attention and indexer ops (not caches: a cache's
#: mode is :func:`ascend_emu.layouts.cache_mode_traits`'s; docs/layouts.md, "Layout names") -> the
#: tensor's rank: BSND ``[B, S, N, D]`` (B batches of S tokens), TND ``[T, N, D]`` (the batches'
#: tokens packed, cut by prefix sums).
QUERY_LAYOUT_RANKS = {"BSND": 4, "TND": 3}


def batched_query(layout: str) -> bool:
    """True for a BSND query ``[B, S, N, D]`` (batch, position per token), False for a TND query
    ``[T, N, D]`` (tokens packed). ``layout`` must be a key of :data:`QUERY_LAYOUT_RANKS` (the op
    checked it)."""
    return QUERY_LAYOUT_RANKS[layout] == 4


def check_cache(x: np.ndarray, name: str) -> None:
    """A cache is written in place as raw memory: it must be C-contiguous and writable.

    Raises:
        ShapeError: not contiguous or not writable.
    """
    if not x.flags.c_contiguous:
        raise arg_error(ShapeError, name, "a C-contiguous cache (it is updated in place as raw memory)",
                        f"strides {x.strides}")
    if not x.flags.writeable:
        raise arg_error(ShapeError, name, "a writable cache", "a read-only array")


def check_int(value, name: str, *, error: type = DTypeError, expected: str = "an int") -> int:
    """A Python / NumPy integer (not a bool), as an int: the one kind check of the ops' int
    arguments (each op keeps the error class its docs give).

    Raises:
        ``error`` (DTypeError by default): not an integer, naming ``name``, ``expected`` and the value.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise arg_error(error, name, expected, describe(value))
    return int(value)


#: The smallest magnitude that rounds to inf in fp32 (RNE): the midpoint ``2**128 - 2**103`` between
#: the largest fp32 value and ``2**128`` (ties go to the even ``2**128``).
F32_INF_FROM = 2.0**128 - 2.0**103


def check_float(value, name: str, *, nonnegative: bool = False) -> float:
    """A real Python / NumPy number (not a bool) that is finite once rounded to fp32, as the
    kernels use it (1e40 passes a float64 check and becomes inf); with ``nonnegative`` also >= 0
    (an RmsNorm epsilon).

    Raises:
        DTypeError: not a real number, not finite in fp32, or negative when ``nonnegative``.
    """
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
    if ok:
        try:
            as_float = float(value)  # OverflowError: an int beyond float64
        except OverflowError:
            ok = False
        else:  # NaN compares False; |x| from F32_INF_FROM up rounds to inf in fp32
            ok = abs(as_float) < F32_INF_FROM and not (nonnegative and as_float < 0)
    if not ok:
        raise arg_error(DTypeError, name, f"a float finite in fp32 (|x| <= {float(np.finfo(np.float32).max):.7g})"
                        + (" and >= 0" if nonnegative else ""), describe(value))
    return float(value)


#: Largest memory one call may allocate, in bytes: its outputs plus the working copies its
#: backend makes (fp32 widenings, broadcast operands). More than any one weight of an MLA / MoE
#: model (one layer's 256 stacked bf16 experts of 7168 x 2048 are 7 GiB), so a bigger request is
#: a mistake, typically a broadcast (stride-0) view that costs nothing until it is copied, and is
#: refused before anything is allocated (:func:`check_call_bytes`).
MAX_CALL_BYTES = 16 << 30


def call_bytes(x: np.ndarray, per_element: int) -> int:
    """Bytes a call allocates for ``x``: ``x``'s element count (its logical shape, so a broadcast
    view counts in full) times ``per_element``, the bytes of outputs and working copies per
    element of ``x``. Exact integer arithmetic (no int64 overflow)."""
    count = 1
    for dim in x.shape:
        count *= int(dim)
    return count * per_element


def check_call_bytes(x: np.ndarray, name: str, per_element: int, what: str = "outputs and working copies") -> None:
    """The one size bound of the ops: raise unless the call's allocations for ``x``
    (:func:`call_bytes`) fit :data:`MAX_CALL_BYTES`. Called before anything is allocated.

    Raises:
        ShapeError: naming ``name``, the limit and the bytes the call would take.
    """
    nbytes = call_bytes(x, per_element)
    if nbytes > MAX_CALL_BYTES:
        raise arg_error(ShapeError, name, f"at most {MAX_CALL_BYTES >> 30} GiB of {what} (a broadcast view?)",
                        f"{describe(x)}, {nbytes / (1 << 30):.1f} GiB")


#: ``np.may_share_memory`` without NumPy's ``__array_function__`` dispatch (half its ~0.2 us a
#: pair; the arrays checked are plain ndarrays / NZArrays, which do not override it).
_may_share_memory = getattr(np.may_share_memory, "_implementation", np.may_share_memory)


def check_disjoint(written: Sequence[tuple[str, np.ndarray]], read: Sequence[tuple[str, object]]) -> None:
    """The memory rule of every op that writes caller arrays: no two written arrays (caches
    updated in place, out= arrays) share memory, and no argument the call reads shares memory
    with one it writes. The kernels read their inputs while they write (an input inside a cache
    would be read after the scatter overwrote it; on hardware the result depends on the order of
    the writes), so such a call is rejected before anything is written.

    An array that is written is not also a read argument: a cache updated in place is listed in
    ``written`` only (also when the call reads its other rows).

    The test is on address ranges (``np.may_share_memory``, bounds only: about a microsecond a
    pair, on every call): two views whose ranges interleave without touching a common byte are
    rejected too (stricter, never looser).

    Args:
        written: ``(name, array)`` of every array the call writes, in the order they are checked
            (each against the ones before it).
        read: ``(name, array or None)`` of every tensor argument the call reads (None: absent).

    Raises:
        ShapeError: naming the later written array and the earlier one, or the read argument and
            the written array it overlaps.
    """
    share = _may_share_memory
    for i, (w_name, w) in enumerate(written):
        for a_name, a in written[:i]:
            if share(a, w):
                raise arg_error(ShapeError, w_name, f"memory separate from {a_name}", "an overlapping array")
    read = [(name, r) for name, r in read if r is not None]
    for w_name, w in written:
        for r_name, r in read:
            if share(r, w):
                raise arg_error(ShapeError, r_name, f"memory separate from {w_name} (the call writes {w_name} "
                                f"while it reads {r_name})", "an overlapping array")


def check_nz_weight(w: np.ndarray, name: str) -> None:
    """Raise unless ``w`` has been cast to FRACTAL_NZ.

    Raises:
        FormatError: ``w`` is ND; the message gives the fix.
    """
    if get_npu_format(w) != FRACTAL_NZ:
        raise FormatError(f"{name}: expected a FRACTAL_NZ weight (format 29), got format "
                          f"{get_npu_format(w)} (ND); cast it first: {name} = npu_format_cast({name}, 29)")


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Modules between the user's call and the op when it goes through ``torch.ops`` (the drop-in's
#: registered ops): skipped like this package's own frames.
_DISPATCH_MODULES = ("torch._ops",)


def _caller_stacklevel() -> int:
    """``stacklevel`` for :func:`warnings.warn` that points at the first frame outside this
    package (the user's call, also through the torch_npu drop-in)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and (os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR)
                                 or frame.f_globals.get("__name__") in _DISPATCH_MODULES):
        level, frame = level + 1, frame.f_back
    return level


def warn_duplicates(slots: np.ndarray, name: str) -> dict[int, list[int]]:
    """Warn when two tokens write the same slot (undefined on hardware; here the last wins).

    The warning is attributed to the user's line that called the op. Returns the duplicates
    (:func:`ascend_emu.layouts.duplicate_slots`: ``{slot: [token, ...]}``, empty when none)."""
    dups = duplicate_slots(slots)
    checked_mode.duplicates(name, dups)  # checked mode: an error instead
    if dups:
        shown = "; ".join(f"slot {s} <- tokens {t}" for s, t in list(dups.items())[:4])
        more = f" (+{len(dups) - 4} more slots)" if len(dups) > 4 else ""
        warnings.warn(f"{name}: {len(dups)} cache slot(s) written by more than one token, undefined on "
                      f"hardware; the emulator keeps the last token: {shown}{more}",
                      DuplicateSlotWarning, stacklevel=_caller_stacklevel())
    return dups


def writer_slots(index, dims: Sequence[int], *, name: str) -> np.ndarray:
    """The index policy of every DeepSeek-V4 cache writer, in one place (docs/v4.md, "Index policy
    of the V4 writers"): ``npu_scatter_nd_update_v2`` / ``_sk``, ``scatter_nd_update_asc`` and the
    epilog writers' ``slot_mapping``. Call it after the shape / dtype checks and before anything is
    written.

    - a row whose index is -1 (``-1`` flat, ``[-1, x]`` with x -1 or in range as (block, offset))
      is skipped: the padding vllm-ascend uses for graph capture;
    - any other value outside its range is rejected (:class:`IndexRangeError` naming the entry)
      before anything is written;
    - two rows writing one slot: :class:`DuplicateSlotWarning` naming the slot and the rows, the
      last row wins (as ``npu_scatter_pa_kv_cache``; checked mode makes it an error).

    Args:
        index: integer ``[n]`` or ``[n, 1]`` (flat slots, ``dims = (num_rows,)``) or ``[n, 2]``
            ((block, offset) rows, ``dims = (num_blocks, block_size)``).
        dims: the sizes the index columns address.
        name: the argument's name, for errors and the warning.

    Returns:
        int64 ``[n]`` flat slots (``block * block_size + offset``), -1 for skipped rows.

    Raises:
        DTypeError, ShapeError, IndexRangeError: as
            :func:`ascend_emu.layouts.slots_from_index_rows`; ShapeError also for an index whose
            working copies would pass :data:`MAX_CALL_BYTES` (a broadcast view), before allocating.

    Warns:
        DuplicateSlotWarning: a slot written by two rows (:func:`warn_duplicates`).
    """
    return writer_slots_and_duplicates(index, dims, name=name)[0]


def writer_slots_and_duplicates(index, dims: Sequence[int], *, name: str) -> tuple[np.ndarray, bool]:
    """:func:`writer_slots`, and whether two rows write one slot (so a kernel that writes every
    live row in order may skip looking for the last of each)."""
    index = np.asarray(index)
    check_call_bytes(index, name, _INDEX_WORK_BYTES, "index working copies")
    slots = slots_from_index_rows(index, dims, name=name)
    return slots, bool(warn_duplicates(slots, name))


#: Bytes of working copies per index element of :func:`writer_slots` (int64 values, range masks,
#: flat slots, the duplicate search's sort), for the size bound before anything is allocated.
_INDEX_WORK_BYTES = 64


# ---------------------------------------------------------------------- memoised static checks
#: Python scalar types whose value (with the type) is part of a call signature.
_SCALAR_TYPES = (bool, int, float, str, np.bool_, np.integer, np.floating)


def signature(*values) -> tuple | None:
    """What the shape / dtype / mode checks of an op contract read of its arguments, as a hashable
    key: per array its exact type (``NZArray`` or a plain ``ndarray``), shape, dtype (byte order
    included), C-contiguity and writability; per scalar or string its type and value; None as
    None (a float's sign with it: ``0.0 == -0.0``, but a scale of -0.0 gives other zeros). None
    when an argument is anything else (a list, a torch tensor, an array subclass
    other than ``np.ndarray`` / ``NZArray``): such calls are always checked in full.

    Two calls with equal signatures pass or fail the same static checks, so a contract may skip
    them for a signature that passed before (:class:`ValidatedSignatures`); the checks that read
    values or addresses (index ranges, memory overlap, finite scale values) run on every call.
    """
    key = []
    add = key.append
    for x in values:
        t = type(x)
        if t is np.ndarray or t is NZArray:
            flags = x.flags
            add((t, x.shape, x.dtype, flags.c_contiguous, flags.writeable))
        elif x is None:
            add(None)
        elif t is float or t is np.float32 or t is np.float64 or t is np.float16:
            add((t, x, math.copysign(1.0, x)))  # 0.0 == -0.0, but scales keep their sign
        elif t is str or t is int or t is bool or isinstance(x, _SCALAR_TYPES):
            add((t, x, math.copysign(1.0, x)) if isinstance(x, np.floating) else (t, x))
        else:
            return None
    return tuple(key)


@functools.cache
def _field_names(cls) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def trusted(cls, *parts: dict, **fields):
    """An instance of the frozen dataclass ``cls`` from already-validated fields (``parts`` then
    ``fields``), without the per-field ``object.__setattr__`` of its ``__init__`` (30-40 of them,
    a few microseconds a call). For the op contracts' argument objects only.

    Raises:
        TypeError: not every field of ``cls`` given, or an unknown one (an internal misuse).
    """
    obj = object.__new__(cls)
    state = obj.__dict__
    for part in parts:
        state.update(part)
    state.update(fields)
    names = _field_names(cls)
    if state.keys() != names:
        raise TypeError(f"{cls.__name__}: fields missing or unknown: {sorted(names ^ state.keys())}")
    return obj


class ValidatedSignatures:
    """Signatures (:func:`signature`) whose static checks passed, each with what those checks
    derived (layouts, modes, sizes); least recently used first out beyond ``maxsize``.

    The one way an op contract memoises its static checks::

        key, static, known = _VALIDATED.lookup(given, check)  # check(*given) unless known
        ...  # the per-call checks (index values, memory, lengths), on every call
        if not known:
            _VALIDATED.put(key, static)

    Only a call whose checks all passed is stored, so a rejected call is always checked (and
    rejected) in full, with the same message.
    """

    def __init__(self, maxsize: int = 128):
        self.maxsize = maxsize
        self._entries: OrderedDict[Hashable, object] = OrderedDict()

    def get(self, key: Hashable | None):
        """The stored value of ``key``, or None (also for a None key)."""
        if key is None:
            return None
        value = self._entries.get(key)
        if value is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile
                pass
        return value

    def lookup(self, given: tuple, check: Callable[..., object] | None = None
               ) -> tuple[Hashable | None, object, bool]:
        """``(key, static, known)`` for a call with arguments ``given``: its :func:`signature`,
        what the static checks derived (``check(*given)`` when the signature is not stored; it
        raises for a rejected call; None without a ``check``, for a contract whose first call
        takes another path), and whether it was stored (every check of an earlier call with this
        signature passed, the per-call ones too). Store it with :meth:`put` once the call's
        per-call checks pass."""
        key = signature(*given)
        static = self.get(key)
        if static is not None:
            return key, static, True
        return key, None if check is None else check(*given), False

    def put(self, key: Hashable | None, value) -> None:
        """Store ``value`` for ``key`` (nothing for a None key)."""
        if key is None:
            return
        self._entries[key] = value
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every signature."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


#: The copier :func:`copying_caches` installed for this thread / task, until an op takes it.
_CACHE_COPIER: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("ascend_emu_cache_copier",
                                                                               default=None)


@contextlib.contextmanager
def copying_caches(copy: Callable[[str, np.ndarray], np.ndarray]):
    """Run the next op called in the block on copies of its caches (a functional form).

    The op validates every argument on the caller's caches first, then :func:`write_targets`
    replaces each cache by ``copy(name, cache)`` (a new C-contiguous array of the same shape,
    dtype and values) and the backend writes the copies; the caller's caches are only read. A
    rejected call makes no copy (a 4 GiB cache is not copied just to be refused) and raises
    what the in-place op raises. Taken by the first op call in the block only. The torch_npu
    ``_functional`` variants (:mod:`ascend_emu.torch_npu._registry`) run through this.
    """
    token = _CACHE_COPIER.set(copy)
    try:
        yield
    finally:
        _CACHE_COPIER.reset(token)


def write_targets(args, names: tuple[str, ...]):
    """``args``, an op's validated frozen argument object, as its backend receives it: itself,
    or inside :func:`copying_caches` a copy whose cache fields ``names`` are the copier's copies
    of those caches (every other field, the derived layouts and slots included, unchanged: a
    copy has the caches' shape and dtype). Call it after the contract, before the backend."""
    copy = _CACHE_COPIER.get()
    if copy is None:
        return args
    _CACHE_COPIER.set(None)
    return dataclasses.replace(args, **{name: copy(name, getattr(args, name)) for name in names})
