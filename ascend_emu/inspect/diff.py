"""Byte diff of two caches of one spec, NaN-aware, grouped block -> slot -> field.

Two float elements that are both NaN count as equal whatever their payload bits (a kernel that
writes NaN writes *a* NaN). Everything else is compared byte by byte: the result lists exactly
the bytes that differ. Distances: ulps for float fields (bf16 / fp16 / fp32: how many
representable values apart; +0 and -0 are 0 ulps apart, though their bytes count as changed;
the Ascend 950's HiF8 / FP8 k_nope: places apart in the element type's own value order,
:data:`~ascend_emu.quant.combined.NOPE_BYTE_ORDINALS`), ``|a - b|`` for int8 fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np

from ..errors import ShapeError, arg_error
from ..quant import ulp_distance
from ..quant.combined import NOPE_BYTE_ORDINALS
from .cache import Cache, map_bytes


@dataclass(frozen=True)
class FieldDiff:
    """What differs in one field of one slot."""

    field: str
    dtype: str
    bytes: int               #: differing bytes
    elements: list[int]      #: differing elements (field indices)
    max_ulp: int | None      #: floats: largest ulp distance (None if every pair has a NaN)
    max_int_delta: int | None  #: int8: largest |a - b|
    nan_mismatch: int        #: elements NaN on one side only


@dataclass(frozen=True)
class SlotDiff:
    """What differs in one slot (all heads)."""

    slot: int
    block: int
    row: int
    bytes: int
    fields: list[FieldDiff]
    expected: bool | None    #: in the expected slot set (None when none was given)


@dataclass(frozen=True)
class Diff:
    """Result of :func:`diff`.

    Attributes:
        changed: int64 ``[K]`` offsets of the differing bytes (sorted).
        slots: per differing slot, in slot order.
        heat: int64 ``[BlockNum, BlockSize]`` differing bytes per slot.
        nan_equal: element pairs that differ in bits but are both NaN (not reported as changes).
        summary: totals (see :meth:`to_dict`).
        expect_slots: the expected slots as given, sorted (None: none given); not in
            :meth:`to_dict` (its ``slots`` say which changed slots were expected).
    """

    changed: np.ndarray
    slots: list[SlotDiff]
    heat: np.ndarray
    nan_equal: int
    summary: dict
    cache: dict
    expect_slots: tuple[int, ...] | None = None

    @property
    def same(self) -> bool:
        """No byte differs (both-NaN pairs aside)."""
        return self.changed.size == 0

    def to_dict(self, max_bytes: int = 4096) -> dict:
        """Plain data; at most ``max_bytes`` changed offsets are listed (``summary.bytes`` counts all)."""
        return {"summary": self.summary, "cache": self.cache, "nan_equal": self.nan_equal,
                "changed_bytes": self.changed[:max_bytes].tolist(),
                "slots": [asdict(s) for s in self.slots]}


def diff(a: Cache, b: Cache, *, expect_slots: Iterable[int] | None = None) -> Diff:
    """Compare two caches byte by byte (both-NaN float elements equal).

    Args:
        a, b: caches with the same spec (mode, geometry, dtype, row format).
        expect_slots: slots that are expected to change (e.g. the op's ``cache_index``); the
            summary counts bytes changed outside them.

    Returns:
        A :class:`Diff`. ``summary``: ``bytes``, ``slots`` (differing slot list),
        ``max_ulp_bf16`` (largest ulp distance over bf16 fields), ``max_int8_delta``,
        ``scale_bytes`` (differing bytes in the fp32 scales of combined rows),
        ``outside_expected_bytes`` / ``outside_expected_slots`` (None with no expected set).

    Raises:
        ShapeError: the two specs differ.
    """
    if a.spec != b.spec:
        raise arg_error(ShapeError, "b", f"a cache of the same spec as a ({a.spec.describe()})", b.spec.describe())
    spec, lay = a.spec, a.layout
    n = lay.nbytes
    ra, rb = a.raw[:n], b.raw[:n]
    off = np.flatnonzero(ra != rb).astype(np.int64)  # [K]
    m = map_bytes(spec, off)
    start = off - m.byte  # first byte of each differing byte's element
    keep = np.ones(off.size, dtype=bool)
    nan_equal = 0
    ulp = np.full(off.size, -1, dtype=np.int64)
    nan_one = np.zeros(off.size, dtype=bool)
    delta = np.full(off.size, -1, dtype=np.int64)
    for i, f in enumerate(spec.fields):
        sel = np.flatnonzero(m.field == i)
        if not sel.size:
            continue
        idx = start[sel][:, None] + np.arange(f.size)[None, :]  # [k, size] bytes of each element
        va = ra[idx].view(f.dtype).reshape(-1)  # [k]
        vb = rb[idx].view(f.dtype).reshape(-1)  # [k]
        if f.is_float:
            fa, fb = f.values(ra[idx].reshape(-1)).astype(np.float32), f.values(rb[idx].reshape(-1)).astype(np.float32)
            both = np.isnan(fa) & np.isnan(fb)
            keep[sel[both]] = False
            nan_equal += int(np.unique(start[sel[both]]).size)
            one = np.isnan(fa) ^ np.isnan(fb)
            nan_one[sel] = one
            if f.element:  # HiF8 / FP8 k_nope: ulps of the element type (its value order)
                order = NOPE_BYTE_ORDINALS[f.element]
                dist = np.abs(order[ra[idx].reshape(-1)] - order[rb[idx].reshape(-1)])
            else:
                dist = ulp_distance(va, vb)
            ulp[sel] = np.where(one | both, -1, dist)
        else:
            delta[sel] = np.abs(va.astype(np.int64) - vb.astype(np.int64))
    off, start, ulp, delta, nan_one = off[keep], start[keep], ulp[keep], delta[keep], nan_one[keep]
    m = map_bytes(spec, off)
    expected = None if expect_slots is None else {int(s) for s in expect_slots}
    slots = []
    for slot in np.unique(m.slot):
        in_slot = m.slot == slot
        fields = []
        for i, f in enumerate(spec.fields):
            sel = in_slot & (m.field == i)
            if not sel.any():
                continue
            is_float = f.is_float
            u = ulp[sel][ulp[sel] >= 0]
            elems = np.unique(m.element[sel] + m.head[sel] * f.count)
            fields.append(FieldDiff(field=f.name, dtype=f.type_name, bytes=int(sel.sum()),
                                    elements=[int(e) for e in elems],
                                    max_ulp=int(u.max()) if is_float and u.size else None,
                                    max_int_delta=None if is_float else int(delta[sel].max()),
                                    nan_mismatch=int(np.unique(start[sel & nan_one]).size)))
        blk, row = divmod(int(slot), lay.block_size)
        slots.append(SlotDiff(slot=int(slot), block=blk, row=row, bytes=int(in_slot.sum()), fields=fields,
                              expected=None if expected is None else int(slot) in expected))
    heat = np.bincount(m.slot, minlength=lay.num_rows).reshape(lay.num_blocks, lay.block_size)
    bf16_ulps = [fd.max_ulp for s in slots for fd in s.fields if fd.dtype == "bfloat16" and fd.max_ulp is not None]
    int_deltas = [fd.max_int_delta for s in slots for fd in s.fields if fd.max_int_delta is not None]
    outside = [s for s in slots if s.expected is False]
    summary = {
        "bytes": int(off.size), "slots": [s.slot for s in slots],
        "max_ulp_bf16": max(bf16_ulps) if bf16_ulps else None,
        "max_int8_delta": max(int_deltas) if int_deltas else None,
        "scale_bytes": sum(fd.bytes for s in slots for fd in s.fields if fd.field == "scale"),
        "nan_mismatch": sum(fd.nan_mismatch for s in slots for fd in s.fields),
        "outside_expected_bytes": None if expected is None else sum(s.bytes for s in outside),
        "outside_expected_slots": None if expected is None else [s.slot for s in outside],
    }
    return Diff(changed=off, slots=slots, heat=heat, nan_equal=nan_equal, summary=summary, cache=spec.describe(),
                expect_slots=None if expected is None else tuple(sorted(expected)))
