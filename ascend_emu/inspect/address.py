"""``where`` (logical -> bytes) and ``what`` (byte -> logical) for every cache mode.

Sources: docs/sources.md#paged_nz (paged NZ: element ``d`` of slot ``blk*bs + r`` at element
``blk*bs*D + (d//C0)*bs*C0 + r*C0 + d%C0``), docs/sources.md#cache_index / docs/sources.md#npu_kv_rmsnorm_rope_cache (ND modes: rows contiguous), docs/sources.md#per_tile_rows
(656-byte combined rows: k_nope bytes 0-511, k_rope 512-639, scales 640-655).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field as dc_field

import numpy as np

from ..errors import IndexRangeError, ShapeError, arg_error
from ..layouts import NZ_BLOCK_ROWS, nz_coords, nz_shape
from .cache import Cache, CacheSpec, map_bytes


@dataclass(frozen=True)
class ByteRange:
    """Contiguous cache bytes ``[start, stop)`` holding elements ``[first, last)`` of one field
    of one head's row."""

    start: int
    stop: int
    head: int
    field: str
    first: int
    last: int
    c0_chunk: int | None = None  #: NZ: which C0 chunk of the row (dims [j*C0, (j+1)*C0))


@dataclass(frozen=True)
class Where:
    """Result of :func:`where`: the bytes of a slot (or of one element or field of it)."""

    slot: int
    block: int
    row: int
    ranges: list[ByteRange]
    cache: dict = dc_field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes in all ranges."""
        return sum(r.stop - r.start for r in self.ranges)

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        return asdict(self)


@dataclass(frozen=True)
class What:
    """Result of :func:`what`: the logical meaning of one byte, or ``unused``."""

    byte_offset: int
    unused: bool = False
    block: int | None = None
    row: int | None = None
    slot: int | None = None
    head: int | None = None
    dim: int | None = None          #: element of the head's row (row byte for combined rows)
    byte_in_element: int | None = None
    field: str | None = None        #: "element", or "k_nope" / "k_rope" / "scale"
    field_element: int | None = None
    field_byte: int | None = None
    c0_chunk: int | None = None     #: NZ: dim // C0
    fractal: int | None = None      #: NZ: row // 16 (which 16-row fractal of the block)
    cache: dict = dc_field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        return asdict(self)


def _spec(cache: Cache | CacheSpec) -> CacheSpec:
    return cache.spec if isinstance(cache, Cache) else cache


def where(cache: Cache | CacheSpec, slot: int, *, head: int | None = None, dim: int | None = None,
          field: str | None = None, element: int | None = None) -> Where:
    """The bytes of a slot, of one field of it, or of one element.

    Args:
        cache: the cache (or its spec; no bytes are read).
        slot: global slot ``block * BlockSize + row`` (PA_* ``cache_index`` value; BSND
            ``b*S + s``; TND ``t``; Norm ``b*cache_length + pos``).
        head: kv head; default all heads (only with no ``dim`` / ``element``; else 0).
        dim: element ``d`` of the head's row; for combined rows the row's byte (as ``locate
            --combined``): the field element holding it is returned.
        field: a field name of :attr:`CacheSpec.fields` (``element``; ``k_nope`` / ``k_rope`` /
            ``scale``); alone it selects the whole field.
        element: with ``field``: one element of it (tile index for ``scale``).

    Returns:
        A :class:`Where`; ``ranges`` in increasing element order (one per NZ C0 chunk, per
        field, per head), ``stop - start`` bytes each.

    Raises:
        IndexRangeError: slot, head, dim or element out of range.
        ShapeError: an unknown field, or ``dim`` together with ``field`` / ``element``, or
            ``element`` without ``field``.
    """
    spec = _spec(cache)
    lay = spec.layout
    slot = int(slot)
    if not 0 <= slot < lay.num_rows:
        raise arg_error(IndexRangeError, "slot", f"a slot in [0, {lay.num_rows})", slot)
    if dim is not None and (field is not None or element is not None):
        raise arg_error(ShapeError, "dim", "dim alone, or field [+ element]", (dim, field, element))
    if element is not None and field is None:
        raise arg_error(ShapeError, "element", "a field name with it", element)
    heads = range(lay.heads) if head is None else [int(head)]
    for h in heads:
        if not 0 <= h < lay.heads:
            raise arg_error(IndexRangeError, "head", f"a head in [0, {lay.heads})", h)
    fields = spec.fields
    if dim is not None:
        dim = int(dim)
        if not 0 <= dim < lay.dim:
            raise arg_error(IndexRangeError, "dim", f"an element in [0, {lay.dim})", dim)
        m = map_bytes(spec, lay.byte_offset(slot, dim, heads[0]))
        f = fields[int(m.field)]
        pieces = [(f, int(m.element), int(m.element) + 1)]
    elif field is not None:
        f = spec.field(field)
        if element is None:
            pieces = [(f, 0, f.count)]
        else:
            element = int(element)
            if not 0 <= element < f.count:
                raise arg_error(IndexRangeError, "element", f"a {f.name} element in [0, {f.count})", element)
            pieces = [(f, element, element + 1)]
    else:
        pieces = [(f, 0, f.count) for f in fields]
    ranges = []
    for h in heads:
        for f, lo, hi in pieces:
            ranges += _field_ranges(spec, slot, h, f, lo, hi)
    blk, row = divmod(slot, lay.block_size)
    return Where(slot=slot, block=blk, row=row, ranges=ranges, cache=spec.describe())


def _field_ranges(spec: CacheSpec, slot: int, head: int, f, lo: int, hi: int) -> list[ByteRange]:
    """Contiguous byte ranges of elements [lo, hi) of field ``f`` of (slot, head)."""
    lay = spec.layout
    first_byte, last_byte = f.offset + lo * f.size, f.offset + hi * f.size  # inside the head's row
    if not lay.nz:
        base = lay.byte_offset(slot, 0, head)
        return [ByteRange(base + first_byte, base + last_byte, head, f.name, lo, hi)]
    out = []
    b = first_byte
    while b < last_byte:  # split at the 32-byte C0 chunks of the NZ row
        j = b // (lay.c0 * lay.itemsize)
        end = min(last_byte, (j + 1) * lay.c0 * lay.itemsize)
        start = lay.byte_offset(slot, b // lay.itemsize, head) + b % lay.itemsize
        out.append(ByteRange(start, start + end - b, head, f.name, (b - f.offset) // f.size,
                             (end - f.offset) // f.size, c0_chunk=j))
        b = end
    return out


#: What the values of an op's PA_BLK index are (docs/sources.md#cache_index): block ids
#: (npu_mla_prolog_v3 ``cache_index``) or page start offsets ``block_id * BlockSize``
#: (npu_kv_rmsnorm_rope_cache ``index``).
PAGE_INDEX_KINDS = ("block_ids", "page_offsets")


def token_slot(cache: Cache | CacheSpec, token: int, *, index=None, seq_lens=None,
               page_index: str = "block_ids") -> int:
    """The slot an op wrote token ``token`` to, from the op's index tensor.

    Args:
        cache: the cache (or its spec): its mode says how to read ``index``.
        token: flat token number ``t`` (batch-major: ``b * S + s``).
        index: the op's index tensor. PA_BSND / PA_NZ: slots ``[T]`` / ``[B, S]``
            (:func:`~ascend_emu.layouts.slots_from_cache_index`); PA_BLK_*: pages
            (:func:`~ascend_emu.layouts.slots_from_pages`, see ``page_index``); Norm: positions
            ``[B, S]`` (:func:`~ascend_emu.layouts.slots_from_positions`); BSND / TND: None (a token
            is written at its own position).
        seq_lens: PA_BLK_* only: tokens per batch ``[B]``.
        page_index: PA_BLK_* only: one of :data:`PAGE_INDEX_KINDS`.

    Returns:
        The slot ``block * BlockSize + row``.

    Raises:
        ShapeError: a missing or extra ``index`` / ``seq_lens``, or an unknown ``page_index``.
        IndexRangeError: ``token`` out of range, skipped (index -1), or an index value outside the
            cache (validated by the ``slots_from_*`` map).
    """
    from ..layouts import slots_from_cache_index, slots_from_pages, slots_from_positions

    lay = _spec(cache).layout
    mode, kind = lay.mode, lay.index_kind
    if kind == "own":
        if index is not None:
            raise arg_error(ShapeError, "index", f"None for cache_mode {mode} (tokens sit at their own position)",
                            "an index")
        slots = np.arange(lay.num_rows, dtype=np.int64)
    elif index is None:
        raise arg_error(ShapeError, "index", f"the op's index tensor for cache_mode {mode}", None)
    elif kind == "slot":
        slots = slots_from_cache_index(np.asarray(index), lay.num_rows, name="index")
    elif kind == "position":
        slots = slots_from_positions(np.asarray(index), lay.block_size, name="index")
    else:
        if page_index not in PAGE_INDEX_KINDS:
            raise arg_error(ShapeError, "page_index", f"one of {list(PAGE_INDEX_KINDS)}", repr(page_index))
        if seq_lens is None:
            raise arg_error(ShapeError, "seq_lens", f"tokens per batch for cache_mode {mode}", None)
        slots = slots_from_pages(np.asarray(index), seq_lens, lay.block_size, lay.num_blocks,
                                 page_offsets=page_index == "page_offsets", name="index")
    t = int(token)
    if not 0 <= t < slots.size:
        raise arg_error(IndexRangeError, "token", f"a token in [0, {slots.size})", t)
    if slots[t] < 0:
        raise arg_error(IndexRangeError, "token", "a token the op writes (its index entry is -1: skipped)", t)
    return int(slots[t])


def what(cache: Cache | CacheSpec, byte_offset: int) -> What:
    """The logical meaning of one cache byte.

    Args:
        cache: the cache (or its spec). With a :class:`Cache` whose bytes run past the layout
            (a raw file with a tail), those bytes are reported ``unused``.
        byte_offset: from the start of the cache's memory.

    Returns:
        A :class:`What`. Every byte of a paged / ND cache belongs to exactly one element
        (``unused`` is only for bytes past the layout).

    Raises:
        IndexRangeError: ``byte_offset`` negative, or past the cache (its bytes when given).
    """
    spec = _spec(cache)
    lay = spec.layout
    off = int(byte_offset)
    size = cache.raw.size if isinstance(cache, Cache) else lay.nbytes
    if not 0 <= off < max(size, lay.nbytes):
        raise arg_error(IndexRangeError, "byte_offset", f"a byte in [0, {max(size, lay.nbytes)})", off)
    if off >= lay.nbytes:
        return What(byte_offset=off, unused=True, cache=spec.describe())
    m = map_bytes(spec, off)
    nz = lay.nz
    return What(byte_offset=off, block=int(m.block), row=int(m.row), slot=int(m.slot), head=int(m.head),
                dim=int(m.dim), byte_in_element=off % lay.itemsize, field=spec.fields[int(m.field)].name,
                field_element=int(m.element), field_byte=int(m.byte),
                c0_chunk=int(m.dim) // lay.c0 if nz else None,
                fractal=int(m.row) // NZ_BLOCK_ROWS if nz else None, cache=spec.describe())


@dataclass(frozen=True)
class WeightByte:
    """Result of :func:`what_weight`: one byte of a FRACTAL_NZ weight's storage."""

    byte_offset: int
    padding: bool
    index: list[int] | None     #: logical ND index of the element, None for padding
    byte_in_element: int
    storage_index: list[int]    #: index into the storage ``[..., N/C0, M_pad/16, 16, C0]``
    c0_chunk: int               #: storage dim -4: which C0 column block
    fractal: int                #: storage dim -3: which 16-row fractal
    storage_shape: list[int]

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        return asdict(self)


def what_weight(shape, dtype, byte_offset: int) -> WeightByte:
    """The logical element (or padding) behind one byte of a FRACTAL_NZ weight (``npu_format_cast(w,
    29)``, docs/sources.md#fractal_nz: storage ``[..., ceil(N/C0), ceil(M/16), 16, C0]``, zero padded).

    Args:
        shape: the weight's logical ND shape.
        dtype: bf16 / fp16 / fp32 / int32 / int8.
        byte_offset: byte of the storage.

    Raises:
        DTypeError: a dtype without FRACTAL_NZ.
        IndexRangeError: ``byte_offset`` outside the storage.
    """
    dt = np.dtype(dtype)
    st = nz_shape(shape, dt)
    nbytes = int(np.prod(st)) * dt.itemsize
    off = int(byte_offset)
    if not 0 <= off < nbytes:
        raise arg_error(IndexRangeError, "byte_offset", f"a byte in [0, {nbytes}) of NZ storage {list(st)}", off)
    elem, byte = divmod(off, dt.itemsize)
    idx = nz_coords(shape, dt, elem)
    storage = [int(v) for v in np.unravel_index(elem, st)]
    return WeightByte(byte_offset=off, padding=idx is None, index=None if idx is None else list(idx),
                      byte_in_element=byte, storage_index=storage, c0_chunk=storage[-4], fractal=storage[-3],
                      storage_shape=list(st))


def claimed_bytes(spec: CacheSpec) -> np.ndarray:
    """How many logical elements claim each byte: int ``[nbytes]`` built from :func:`where` over
    every slot and field (1 everywhere for a well-formed layout; 0 = unused)."""
    lay = spec.layout
    count = np.zeros(lay.nbytes, dtype=np.int64)
    for slot in range(lay.num_rows):
        for r in where(spec, slot).ranges:
            count[r.start:r.stop] += 1
    return count
