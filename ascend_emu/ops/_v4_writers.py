"""The DeepSeek-V4 cache writers' shared contract pieces: the argument object their backends
receive, the slot policy, the checks every writer makes (the Ascend 950 gate is
:func:`ascend_emu.soc.require_ascend950_op`), and the checked-mode hooks around the backend call. The writers: :mod:`.kv_compress_epilog`,
:mod:`.indexer_compress_epilog`; docs/v4.md states the policy.

Slots: the one index policy of the V4 writers, :func:`._check.writer_slots` (docs/v4.md, "Index
policy of the V4 writers"), read here as rows of x and their distinct slots (:func:`writer_slots`):
``-1`` skips the row (its x values are not read: padding rows may hold anything); any other
value outside ``[0, rows)`` is rejected before anything is written; two rows with one slot: the
last row wins, with :class:`~ascend_emu.errors.DuplicateSlotWarning` (an error in checked mode),
as ``npu_scatter_pa_kv_cache``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from .. import checked_mode
from ..errors import ModeError, NonFiniteInputError, ShapeError, arg_error, describe
from ..layouts import CacheLayout
from ..layouts.slots import has_duplicate_slots
from . import _check
from ._backend import get_backend
from ._check import (check_call_bytes, check_dtype, dtype_name, required, write_targets,
                     writer_slots_and_duplicates)

#: Bytes of working memory per x element a writer may take (fp32 copies, encoded rows).
WORK_BYTES = 16
#: The exponent field of bf16 / fp16 bits: all ones in NaN and Inf.
_EXPONENT_MASKS = {"bfloat16": np.uint16(0x7F80), "float16": np.uint16(0x7C00)}


@dataclass(frozen=True)
class V4WriterArgs:
    """Validated arguments of one V4 cache writer call.

    Attributes:
        kind: ``"kv_rows"`` (kv_compress_epilog layout 1 / quant_mode 3), ``"kv_layout2"``,
            ``"indexer"`` (custom: values + scales) or ``"indexer_v2"`` (packed uint8).
        x: ``[T, d]`` (a 2-D view of the caller's x).
        tokens: int64 ``[L]`` rows of x to write (slot not -1; of duplicates the last).
        slots: int64 ``[L]`` their slots, all distinct and in range.
        cache: the caller's cache, written in place.
        scale_cache: the custom indexer's scale tensor, else None.
        quant_mode, group, round_scale, scale, fp8: the quant (``fp8``: the element type name).
        block_size, block_stride: layout 2 / v2 geometry (bytes), else 0.
    """

    kind: str
    x: np.ndarray
    tokens: np.ndarray
    slots: np.ndarray
    cache: np.ndarray
    scale_cache: np.ndarray | None
    quant_mode: int
    group: int
    round_scale: bool
    scale: float
    fp8: str
    block_size: int = 0
    block_stride: int = 0


class V4WriterOutputs(NamedTuple):
    """The caches written (the caller's arrays)."""

    caches: tuple


# ------------------------------------------------------------------------ shared checks
def check_int(value, name: str, allowed: tuple) -> int:
    v = _check.check_int(value, name, error=ModeError, expected=f"an int, one of {allowed}")
    if v not in allowed:
        raise arg_error(ModeError, name, f"one of {allowed}", v)
    return v


def check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise arg_error(ModeError, name, "a bool", describe(value))
    return bool(value)


def writer_slots(slot_mapping: np.ndarray, rows: int, name: str = "slot_mapping") -> tuple[np.ndarray, np.ndarray]:
    """The V4 writers' index policy (:func:`._check.writer_slots`, docs/v4.md "Index policy of the
    V4 writers") for a flat ``slot_mapping``, as the rows of x to write and where.

    ``-1`` skips the row; any other value outside ``[0, rows)`` raises (before anything is
    written); a slot named twice is written by the last row naming it, with a
    :class:`~ascend_emu.errors.DuplicateSlotWarning` (checked mode: an error).

    Args:
        slot_mapping: integer ``[T]``.
        rows: slots the cache has.
        name: the argument's name for messages.

    Returns:
        ``(tokens, slots)``: int64 ``[L]`` row indices of x (increasing) and their distinct slots.

    Raises:
        DTypeError: not an integer array. IndexRangeError: a slot out of range (naming it).
    """
    slots, dups = writer_slots_and_duplicates(slot_mapping, (rows,), name=name)
    live = np.flatnonzero(slots >= 0)
    s = slots[live]
    if dups:
        _, first_from_end = np.unique(s[::-1], return_index=True)
        keep = np.sort(s.size - 1 - first_from_end)
        live, s = live[keep], s[keep]
    return live.astype(np.int64), s.astype(np.int64)


def slot_vector(slot_mapping, t: int, dtypes: tuple[str, ...]) -> np.ndarray:
    slot_mapping = required(slot_mapping, "slot_mapping")
    check_dtype(slot_mapping, "slot_mapping", dtypes)
    if slot_mapping.shape != (t,):
        raise arg_error(ShapeError, "slot_mapping", f"1-D [T] with T = {t} (x's rows)", f"shape {list(slot_mapping.shape)}")
    return slot_mapping


def finite_rows(x: np.ndarray, tokens: np.ndarray, cols: int) -> None:
    """NaN / Inf in the quantized columns of the rows written: rejected (quant/v4.py)."""
    if not tokens.size or not cols:
        return
    part = x[tokens, :cols]
    exp_mask = _EXPONENT_MASKS.get(dtype_name(part.dtype))
    if exp_mask is not None:  # bf16 / fp16: NaN and Inf have every exponent bit set (no fp32 copy)
        bad = (part.view(np.uint16) & exp_mask) == exp_mask
    else:
        bad = ~np.isfinite(part.astype(np.float32))
    if bad.any():
        i, c = (int(v) for v in np.argwhere(bad)[0])
        raise arg_error(NonFiniteInputError, "x", "finite values in the quantized columns of the rows written "
                        "(NaN / Inf have no defined bytes: docs/v4.md)",
                        f"{np.float32(part[i, c])!r} at x[{int(tokens[i])}, {c}]")



#: Bytes of working copies per slot_mapping element of :func:`writer_slots` (the static size
#: bound every writer checks with its other static checks, :func:`check_index_bytes`).
INDEX_WORK_BYTES = 64
def check_index_bytes(slot_mapping: np.ndarray, name: str = "slot_mapping") -> None:
    """The size bound :func:`writer_slots` checks before its working copies (a static check)."""
    check_call_bytes(slot_mapping, name, INDEX_WORK_BYTES, "index working copies")


@njit(cache=True)
def _plan(slot_mapping, rows, xbits, cols, exp_mask):  # pragma: no cover - compiled
    """One pass of the usual call's slot policy and finite check: ``(True, tokens, slots)`` when
    every slot is -1 or in ``[0, rows)``, no two live rows share a slot and no live row of
    ``xbits`` (16-bit float bits ``[T, d]``) has every bit of ``exp_mask`` set (NaN / Inf) in its
    first ``cols`` values; else ``(False, ...)`` at the first irregularity (the caller then takes
    the full path, which raises or warns with its messages)."""
    t = slot_mapping.shape[0]
    tokens = np.empty(t, np.int64)
    slots = np.empty(t, np.int64)
    n = 0
    for i in range(t):
        v = np.int64(slot_mapping[i])
        if v == -1:
            continue
        if v < 0 or v >= rows:
            return False, tokens[:0], slots[:0]
        tokens[n] = i
        slots[n] = v
        n += 1
    if has_duplicate_slots(slots[:n]):
        return False, tokens[:0], slots[:0]
    for j in range(n):
        xr = xbits[tokens[j]]
        bad = False
        for c in range(cols):  # no exit inside the row: the loop vectorises
            bad |= (xr[c] & exp_mask) == exp_mask
        if bad:
            return False, tokens[:0], slots[:0]
    return True, tokens[:n], slots[:n]


def plan_rows(slot_mapping: np.ndarray, rows: int, x: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`writer_slots` then :func:`finite_rows` of a validated call: the rows of ``x`` to
    write and their slots, in one compiled pass (:func:`_plan`) when the call is regular (every
    slot -1 or in range, no duplicates, finite values); any other call takes those two functions,
    which raise (IndexRangeError, NonFiniteInputError) or warn (DuplicateSlotWarning) with
    their messages. Nothing is written either way.

    Args:
        slot_mapping: int32 / int64 ``[T]`` (checked by the op).
        rows: slots the cache has.
        x: bf16 / fp16 ``[T, d]``.
        cols: leading values of each written row that must be finite (the quantized ones).

    Returns:
        ``(tokens, slots)``: int64 ``[L]`` rows of x (increasing) and their distinct slots.
    """
    mask = _EXPONENT_MASKS.get(dtype_name(x.dtype))
    if mask is not None and slot_mapping.ndim == 1:
        ok, tokens, slots = _plan(slot_mapping, rows, x.view(np.uint16), cols, mask)
        if ok:
            return tokens, slots
    tokens, slots = writer_slots(slot_mapping, rows)
    finite_rows(x, tokens, cols)
    return tokens, slots


@functools.lru_cache(maxsize=256)
def row_layout(num_rows: int, row_bytes: int) -> CacheLayout:
    """The checked-mode slot map of a cache written ``num_rows`` rows of ``row_bytes`` bytes
    (the rows of bytes form of :class:`~ascend_emu.layouts.CacheLayout`; slot = row)."""
    return CacheLayout(mode="PA_BSND", num_blocks=num_rows, block_size=1, dim=row_bytes, itemsize=1)


def run_writer(op: str, method: str, args: V4WriterArgs, names: tuple[str, ...], layouts: tuple) -> None:
    """The backend call of a validated writer, between checked mode's write hooks: ``names``
    are the cache fields of ``args`` (a functional form's copies, :func:`write_targets`),
    ``layouts`` their slot maps (:func:`row_layout`)."""
    args = write_targets(args, names)
    caches = tuple((getattr(args, n), lay) for n, lay in zip(names, layouts, strict=True))
    checked_mode.will_write(*caches)
    getattr(get_backend(), method)(args)
    checked_mode.wrote(op, args.slots, caches)
