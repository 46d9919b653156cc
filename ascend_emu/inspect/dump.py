"""Annotated hexdump of a slot, a block or a byte range of a cache.

Each line is at most 32 bytes (:data:`~ascend_emu.inspect.cache.LINE_BYTES`: one NZ fractal row
of C0 elements) of one field of one head's row, with the decoded values beside the bytes; k_nope
lines of 656-byte rows also carry the dequantised values (``int8 * scale`` of the tile,
docs/sources.md#per_tile_rows, as :meth:`~ascend_emu.quant.CombinedRowFormat.dequantize`; the Ascend 950's
HiF8 / FP8 k_nope bytes are shown decoded, and dequantised the same way). NZ lines carry
their C0 chunk and fractal, and marks where a new one starts (docs/sources.md#paged_nz).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field as dc_field

import numpy as np

from ..errors import IndexRangeError, ShapeError, arg_error
from ..layouts import NZ_BLOCK_ROWS
from .address import where
from .cache import LINE_BYTES, Cache, map_bytes


@dataclass(frozen=True)
class DumpLine:
    """One dump line: bytes ``[offset, offset + len(hex bytes))`` of elements ``[first, last)``
    of ``field`` of (slot, head)."""

    offset: int
    hex: str
    block: int
    row: int
    slot: int
    head: int
    field: str
    dtype: str
    first: int
    last: int
    values: list                      #: decoded elements (float / int; NaN / inf as floats)
    dequant: list | None = None       #: k_nope of combined rows: element * scale of the tile
    tile: int | None = None           #: k_nope of combined rows: the tile of the line
    c0_chunk: int | None = None       #: NZ only
    fractal: int | None = None        #: NZ only: row // 16
    marks: list = dc_field(default_factory=list)  #: boundaries that start at this line


@dataclass(frozen=True)
class TileInfo:
    """One per-tile quantisation group of a combined row."""

    slot: int
    tile: int
    scale: float
    first: int
    last: int
    dequant_min: float
    dequant_max: float


@dataclass(frozen=True)
class Dump:
    """Result of :func:`dump`."""

    what: str
    start: int
    stop: int
    lines: list[DumpLine]
    tiles: list[TileInfo]
    cache: dict

    def to_dict(self) -> dict:
        """Plain data (JSON-ready apart from NaN / inf floats)."""
        return asdict(self)


#: Most bytes one dump covers (slot / block ranges); pick narrower ranges (or --dims) for more.
MAX_DUMP_BYTES = 1 << 20


def _span(value, total: int, name: str) -> tuple[int, int]:
    """``(start, stop)`` of an index or a ``(start, stop)`` pair, checked against ``[0, total)``."""
    if isinstance(value, (tuple, list)):
        start, stop = (int(v) for v in value)
    else:
        start = int(value)
        stop = start + 1
    if not 0 <= start < stop <= total:
        what = f"a {name} in [0, {total})" if stop == start + 1 else f"a {name} range start:stop within [0, {total}]"
        raise arg_error(IndexRangeError, name, what, start if stop == start + 1 else f"{start}:{stop}")
    return start, stop


def dump(cache: Cache, *, slot: int | tuple[int, int] | None = None, block: int | tuple[int, int] | None = None,
         start: int | None = None, stop: int | None = None, dims: tuple[int, int] | None = None) -> Dump:
    """Annotated hexdump of exactly one of: slots, blocks, or a byte range.

    Args:
        cache: the cache with its bytes.
        slot: every byte of this slot (all heads, all fields), in element order; or a
            ``(start, stop)`` range of slots, one after the other.
        block: every byte of this block, in memory order (NZ: C0 chunk by chunk, 16-row
            fractals marked); or a ``(start, stop)`` range of blocks.
        start, stop: bytes ``[start, stop)`` in memory order, widened to whole elements; ``stop``
            defaults to ``start + 32``.
        dims: only elements ``[dims[0], dims[1])`` of each field (the columns of a row).

    Returns:
        A :class:`Dump`; ``tiles`` lists the per-tile scales and dequantised k_nope range of
        every combined row the dump touches.

    Raises:
        ShapeError: not exactly one of slot / block / start given; more than
            :data:`MAX_DUMP_BYTES` bytes; ``dims`` leaving no byte.
        IndexRangeError: slot, block or bytes outside the cache.
    """
    spec, lay = cache.spec, cache.layout
    chosen = [n for n, v in (("slot", slot), ("block", block), ("start", start)) if v is not None]
    if len(chosen) != 1:
        raise arg_error(ShapeError, "slot/block/start", "exactly one of them", chosen or None)
    if slot is not None:
        s0, s1 = _span(slot, lay.num_blocks * lay.block_size, "slot")
        if (s1 - s0) * lay.heads * lay.row_bytes > MAX_DUMP_BYTES:
            raise arg_error(ShapeError, "slot", f"at most {MAX_DUMP_BYTES} bytes of slots",
                            f"{s1 - s0} slots of {lay.heads * lay.row_bytes} bytes")
        offsets = np.concatenate([np.arange(r.start, r.stop) for s in range(s0, s1)
                                  for r in where(spec, s).ranges])  # [row bytes]
        title = f"slot {s0}" if s1 == s0 + 1 else f"slots {s0}-{s1 - 1}"
    elif block is not None:
        b0, b1 = _span(block, lay.num_blocks, "block")
        span = lay.block_size * lay.row_bytes  # a block is contiguous in every mode
        if (b1 - b0) * span > MAX_DUMP_BYTES:
            raise arg_error(ShapeError, "block", f"at most {MAX_DUMP_BYTES} bytes of blocks",
                            f"{b1 - b0} blocks of {span} bytes")
        offsets = np.arange(b0 * span, b1 * span)
        title = f"block {b0}" if b1 == b0 + 1 else f"blocks {b0}-{b1 - 1}"
    else:
        start = int(start)
        stop = start + LINE_BYTES if stop is None else int(stop)
        if not 0 <= start < stop <= lay.nbytes:
            raise arg_error(IndexRangeError, "start/stop", f"0 <= start < stop <= {lay.nbytes}", (start, stop))
        lo = start - int(map_bytes(spec, start).byte)
        last = map_bytes(spec, stop - 1)
        hi = stop - 1 - int(last.byte) + spec.fields[int(last.field)].size
        if hi - lo > MAX_DUMP_BYTES:
            raise arg_error(ShapeError, "start/stop", f"at most {MAX_DUMP_BYTES} bytes", f"{hi - lo} bytes")
        offsets = np.arange(lo, hi)
        title = f"bytes [{lo}, {hi})"
    if dims is not None:
        d0, d1 = (int(v) for v in dims)
        element = map_bytes(spec, offsets).element  # [bytes]
        keep = offsets[(element >= d0) & (element < d1)]
        if not 0 <= d0 < d1 or keep.size == 0:
            raise arg_error(ShapeError, "dims", "a range start:stop of elements the dump holds", f"{d0}:{d1}")
        offsets = keep
        title += f", elements [{d0}, {d1}) of each field"
    lines = _lines(cache, offsets)
    slots = sorted({ln.slot for ln in lines})
    tiles = _tiles(cache, slots) if spec.row_format is not None else []
    return Dump(what=title, start=int(offsets.min()), stop=int(offsets.max()) + 1, lines=lines, tiles=tiles,
                cache=spec.describe())


def _lines(cache: Cache, offsets: np.ndarray) -> list[DumpLine]:
    spec, lay = cache.spec, cache.layout
    m = map_bytes(spec, offsets)
    rowbyte = m.dim * lay.itemsize + (offsets % lay.itemsize)  # byte inside the head's row
    n = offsets.size
    brk = np.ones(n, dtype=bool)
    if n > 1:
        brk[1:] = ((offsets[1:] != offsets[:-1] + 1) | (m.slot[1:] != m.slot[:-1]) | (m.head[1:] != m.head[:-1])
                   | (m.field[1:] != m.field[:-1]) | (rowbyte[1:] % LINE_BYTES == 0))
    starts = np.flatnonzero(brk)
    ends = np.append(starts[1:], n)
    scales = _row_scales(cache, np.unique(m.slot)) if spec.row_format is not None else {}
    out = []
    for s, e in zip(starts, ends, strict=True):
        f = spec.fields[int(m.field[s])]
        raw = cache.raw[offsets[s]: offsets[s] + (e - s)]
        vals = f.values(raw)
        values = [v.item() if vals.dtype.kind in "iu" else float(v) for v in vals]
        slot, row, first = int(m.slot[s]), int(m.row[s]), int(m.element[s])
        dequant = tile = None
        if spec.row_format is not None and f.name == "k_nope":
            tile = first // spec.row_format.tile_size
            dequant = [float(v) for v in vals.astype(np.float32) * scales[slot][tile]]
        chunk = fractal = None
        marks = []
        if lay.nz:
            chunk, fractal = int(m.dim[s]) // lay.c0, row // NZ_BLOCK_ROWS
            if row % NZ_BLOCK_ROWS == 0:
                marks.append(f"fractal {fractal} of C0 chunk {chunk} (rows {row}-{row + NZ_BLOCK_ROWS - 1}, "
                             f"dims {chunk * lay.c0}-{(chunk + 1) * lay.c0 - 1})")
        if first == 0 and int(m.byte[s]) == 0:
            marks.append(f"{f.name} of slot {slot} starts")
        out.append(DumpLine(offset=int(offsets[s]), hex=raw.tobytes().hex(" "), block=int(m.block[s]), row=row,
                            slot=slot, head=int(m.head[s]), field=f.name, dtype=f.type_name, first=first,
                            last=first + len(values), values=values, dequant=dequant, tile=tile,
                            c0_chunk=chunk, fractal=fractal, marks=marks))
    return out


def _row_scales(cache: Cache, slots) -> dict[int, np.ndarray]:
    """fp32 scales of each combined row in ``slots``."""
    fmt = cache.spec.row_format
    out = {}
    for slot in slots:
        base = cache.layout.byte_offset(int(slot), 0)
        out[int(slot)] = cache.raw[base + fmt.scale_offset: base + fmt.row_bytes].view(np.float32).copy()
    return out


def _tiles(cache: Cache, slots) -> list[TileInfo]:
    """Per-tile scale and dequantised k_nope range of each combined row (MLA_ROW.dequantize)."""
    fmt = cache.spec.row_format
    out = []
    for slot in slots:
        base = cache.layout.byte_offset(slot, 0)
        deq, _, scales = fmt.dequantize(cache.raw[base: base + fmt.row_bytes])  # [512], [64], [4]
        for t in range(fmt.num_tiles):
            part = deq[t * fmt.tile_size:(t + 1) * fmt.tile_size]  # [tile]
            out.append(TileInfo(slot=slot, tile=t, scale=float(scales[t]), first=t * fmt.tile_size,
                                last=(t + 1) * fmt.tile_size, dequant_min=float(np.nanmin(part)) if part.size else 0.0,
                                dequant_max=float(np.nanmax(part)) if part.size else 0.0))
    return out
