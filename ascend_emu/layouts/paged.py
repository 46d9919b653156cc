"""Paged / block KV-cache layouts: where each token's row lives, byte by byte.

Sources: docs/sources.md#paged_nz (paged NZ), docs/sources.md#cache_index (mla_prolog cache modes and index meanings), docs/sources.md#npu_kv_rmsnorm_rope_cache
(npu_kv_rmsnorm_rope_cache cache modes and index meanings).

A cache is raw memory. Whatever shape it is declared with, the op writes bytes where the NPU
would. Tokens are first mapped to a **slot** (a global row number ``block * BlockSize + row``),
then a slot and an element to a byte offset:

- ND token-major modes (``PA_BSND``, ``PA_BLK_BSND``, ``BSND``, ``TND``, ``Norm``): row ``slot``
  is contiguous, at ``slot * Nkv * D`` elements (``[..., BlockSize, Nkv, D]`` order).
- ND head-major modes (``PA_BNSD``, ``PA_BLK_BNSD``; torch_npu's meaning): each block is stored
  ``[Nkv, BlockSize, D]``; head ``h`` of slot ``blk * bs + r`` at ``((blk*Nkv + h)*bs + r)*D``.
  With Nkv = 1 (every MLA writer) the bytes are PA_BSND's.
- NZ modes (``PA_NZ``, ``PA_BLK_NZ``): each block (and head, when head-major) is stored
  ``[D / C0, BlockSize, C0]`` with ``C0 = 32 bytes / itemsize`` (16 for bf16 / fp16, 32 for
  int8); element ``d`` of slot ``blk * bs + r`` sits at ``blk*bs*D + (d // C0)*bs*C0 + r*C0 + d % C0``
  (Nkv = 1); a head-major NZ cache ``[nb, Nkv, D/C0, bs, C0]`` adds ``h*bs*D`` inside block
  ``blk`` (``blk*Nkv*bs*D``).

:class:`CacheLayout` is the one description of a cache for the ops that write it and the ops that
read it (fused_infer_attention_score's three paged layouts, the sparse attention and indexer
caches): offsets, the blocks and slots a block table reads (:meth:`CacheLayout.read_blocks`,
:meth:`CacheLayout.read_rows`, :meth:`CacheLayout.slots_of_blocks`) and the words that name a
slot (:meth:`CacheLayout.place`) all come from it. What a mode name means (paged, NZ,
head-major, how a batch's tokens sit, the declared rank, the index kind) is stated once, in
:func:`cache_mode_traits`; no module outside this package compares a cache layout with a mode
name (docs/layouts.md, "Layout names").

How an op's index tensor becomes slots differs between ops (docs/sources.md#cache_index):

- ``PA_BSND`` / ``PA_NZ``: the index *is* the slot (:func:`slots_from_cache_index`).
- ``npu_mla_prolog_v3`` ``PA_BLK_*``: the index holds **block ids** (:func:`slots_from_pages`
  with ``page_offsets=False``).
- ``npu_kv_rmsnorm_rope_cache`` ``PA_BLK_*``: the index holds **token offsets of page starts**,
  ``block_id * BlockSize`` (:func:`slots_from_pages` with ``page_offsets=True``).
- In both PA_BLK flavours a batch's tokens start at row 0 of its first listed block.
- ``-1`` means "skip this token" (or, for PA_BLK, this page) everywhere it is accepted; other
  negative values, which the kernels would also skip, are rejected (stricter than the hardware).
- Slots are validated here, before any kernel sees them (:func:`check_index_range`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Sequence

import numpy as np

from ..errors import IndexRangeError, ModeError, ShapeError, arg_error
from .nz import M0
from .slots import SKIP_INDEX, slots_from_block_table

CacheMode = Literal["PA_BSND", "PA_NZ", "PA_BLK_BSND", "PA_BLK_NZ", "PA_BNSD", "PA_BLK_BNSD", "BSND", "TND", "Norm"]

#: Canonical cache-mode names.
CACHE_MODES: tuple[str, ...] = ("PA_BSND", "PA_NZ", "PA_BLK_BSND", "PA_BLK_NZ", "PA_BNSD", "PA_BLK_BNSD", "BSND",
                                "TND", "Norm")
#: Other spellings the seeds use for the same layouts.
CACHE_MODE_ALIASES = {"PA": "PA_BSND"}
#: Head-major ND modes: each block ``[Nkv, BlockSize, D]`` (torch_npu's PA_BNSD).
HEAD_MAJOR_MODES = ("PA_BNSD", "PA_BLK_BNSD")
#: Paged modes (a slot is ``block * BlockSize + row`` of a block pool); the PA_BLK_* ones index
#: whole pages (:func:`slots_from_pages`).
PAGED_MODES = ("PA_BSND", "PA_NZ", "PA_BLK_BSND", "PA_BLK_NZ", "PA_BNSD", "PA_BLK_BNSD")
PAGE_INDEXED_MODES = ("PA_BLK_BSND", "PA_BLK_NZ", "PA_BLK_BNSD")
#: npu_scatter_pa_kv_cache / npu_gather_pa_kv_cache cache modes (None: the op's Norm) -> the
#: CacheLayout mode of their caches: a Norm cache [num_blocks, block_size, N, D] is PA_BSND with N
#: heads; a PA_NZ cache holds each token's N*D elements as one NZ row (ops.paged_cache module doc).
PAGED_KV_LAYOUT_MODES = {"Norm": "PA_BSND", "PA_NZ": "PA_NZ", None: "PA_BSND"}


@dataclass(frozen=True)
class CacheModeTraits:
    """What a cache-mode name means for the geometry: the one place outside which no module
    interprets a mode name (ops ask :func:`cache_mode_traits` or a :class:`CacheLayout`).

    Attributes:
        paged: a pool of blocks (PA_*): a slot is ``block * BlockSize + row`` of any block, reached
            through slots or a block table.
        page_indexed: PA_BLK_*: a writer's index lists whole pages (:func:`slots_from_pages`).
        nz: PA_NZ / PA_BLK_NZ: each block stored ``[D/C0, BlockSize, C0]``.
        head_major: PA_BNSD / PA_BLK_BNSD: each block stored ``[Nkv, BlockSize, D]`` (an NZ cache
            may be head-major too: :attr:`CacheLayout.head_major`).
        sequences: how a batch's tokens sit in the cache: ``"blocks"`` (paged: through a block
            table or slots), ``"per_batch"`` (block ``b`` is batch ``b``, its rows the positions:
            BSND ``[B, S, Nkv, D]``, Norm ``[B, 1, cache_length, D]``) or ``"packed"`` (one block
            holding every batch's tokens one after the other, cut by prefix sums: TND
            ``[T, Nkv, D]``).
        declared_rank: rank of the declared shape (:meth:`CacheLayout.from_declared`): 3 for TND,
            else 4.
        index_kind: what a writer's index holds (:attr:`CacheLayout.index_kind`).
    """

    paged: bool
    page_indexed: bool
    nz: bool
    head_major: bool
    sequences: str
    declared_rank: int
    index_kind: str


def _traits(mode: str) -> CacheModeTraits:
    paged = mode in PAGED_MODES
    page_indexed = mode in PAGE_INDEXED_MODES
    sequences = "blocks" if paged else ("packed" if mode == "TND" else "per_batch")
    kind = "pages" if page_indexed else "slot" if paged else "position" if mode == "Norm" else "own"
    return CacheModeTraits(paged=paged, page_indexed=page_indexed, nz=mode in ("PA_NZ", "PA_BLK_NZ"),
                           head_major=mode in HEAD_MAJOR_MODES, sequences=sequences,
                           declared_rank=3 if mode == "TND" else 4, index_kind=kind)


#: :class:`CacheModeTraits` of every canonical mode.
CACHE_MODE_TRAITS: dict[str, CacheModeTraits] = {m: _traits(m) for m in CACHE_MODES}


def cache_mode_traits(mode: str, *, allowed: Sequence[str] | None = None,
                      name: str = "cache_mode") -> CacheModeTraits:
    """What ``mode`` means for the geometry (:class:`CacheModeTraits`), aliases accepted.

    Args:
        mode: a cache-mode string as a seed spells it.
        allowed: the spellings the calling op accepts (aliases included); default all.
        name: argument name for the error message.

    Raises:
        ModeError: unknown mode, or one ``allowed`` does not list.
    """
    return CACHE_MODE_TRAITS[canonical_cache_mode(mode, allowed=allowed, name=name)]


#: Bytes in one NZ fractal row; C0 = NZ_ROW_BYTES // itemsize.
NZ_ROW_BYTES = 32
#: BlockSize of an NZ paged cache (PA_NZ, PA_BLK_NZ) is a multiple of this many rows: one
#: fractal's rows, M0 = 16. npu_mla_prolog_v3 (BlockSize 16..1024, multiples of 16, any cache
#: dtype), npu_kv_rmsnorm_rope_cache (32 bytes / itemsize: 16 for bf16 / fp16, 32 for int8, a
#: stricter op-specific rule) and MlaPreprocess (BlockSize 128) all satisfy it; no op writes an
#: NZ cache whose BlockSize breaks it. ND modes have no alignment rule (MlaPreprocess takes
#: BlockSize 1..128 or 256).
NZ_BLOCK_ROWS = M0


def check_block_size(mode: str, block_size: int, *, name: str = "BlockSize") -> None:
    """Raise unless ``block_size`` is one some op accepts for ``mode``.

    The rule (:data:`NZ_BLOCK_ROWS`): NZ modes need a positive multiple of 16 rows; every other
    mode any block_size >= 1. Sources: npu_mla_prolog_v3 doc (BlockSize 16-1024, multiple of
    16), aclnnKvRmsNormRopeCache (BlockSize aligned to 32 bytes), MlaPreprocess (128).

    Args:
        mode: cache mode (aliases accepted).
        block_size: rows per block.
        name: argument name for the error.

    Raises:
        ModeError: unknown mode.
        ShapeError: a BlockSize no op accepts for the mode.
    """
    mode = canonical_cache_mode(mode)
    bs = int(block_size)
    if mode in ("PA_NZ", "PA_BLK_NZ") and (bs < 1 or bs % NZ_BLOCK_ROWS):
        raise arg_error(ShapeError, name, f"a positive multiple of {NZ_BLOCK_ROWS} (whole fractals of "
                        f"{NZ_BLOCK_ROWS} rows) for cache_mode {mode}", bs)
    if bs < 1:
        raise arg_error(ShapeError, name, "an integer >= 1", bs)


def canonical_cache_mode(mode: str, *, allowed: Sequence[str] | None = None,
                         name: str = "cache_mode") -> str:
    """Canonical name of ``mode`` (the alias PA resolved to PA_BSND; PA_BNSD and PA_BLK_BNSD are
    head-major modes of their own).

    Args:
        mode: a cache-mode string as a seed spells it.
        allowed: the spellings the calling op accepts (aliases included); default all.
        name: argument name for the error message.

    Raises:
        ModeError: unknown mode, or one ``allowed`` does not list.
    """
    choices = tuple(allowed) if allowed is not None else CACHE_MODES + tuple(CACHE_MODE_ALIASES)
    if not isinstance(mode, str) or mode not in choices:
        raise arg_error(ModeError, name, f"one of {list(choices)}", repr(mode))
    return CACHE_MODE_ALIASES.get(mode, mode)


def is_nz_mode(mode: str) -> bool:
    """True for the paged FRACTAL_NZ modes ``PA_NZ`` and ``PA_BLK_NZ`` (aliases accepted).

    Raises:
        ModeError: unknown mode.
    """
    return canonical_cache_mode(mode) in ("PA_NZ", "PA_BLK_NZ")


class CacheLocation(NamedTuple):
    """Logical meaning of one cache byte (see :meth:`CacheLayout.locate`).

    For a combined-row cache (int8, D = 656 bytes) ``dim`` is the byte inside the row;
    ``ascend_emu.quant.MLA_ROW.field_of_byte(dim)`` names its field (k_nope / k_rope / scale).
    """

    block: int   #: block (PA_*: block id; BSND / Norm: batch b; TND: 0)
    row: int     #: row inside the block (PA_*: row; BSND: s; Norm: position; TND: token t)
    head: int    #: kv head in [0, Nkv) (Nkv = 1 in every MLA op)
    dim: int     #: element index d in [0, D) inside the head's row
    byte: int    #: byte inside that element, in [0, itemsize) (always 0 for int8)


@dataclass(frozen=True, kw_only=True)
class CacheLayout:
    """Geometry of one KV cache tensor in one cache mode: the one description of a cache for the
    ops that write it and the ops that read it.

    A **slot** is a global row number ``block * block_size + row``: the PA_BSND / PA_NZ
    ``cache_index`` value, ``b * S + s`` for BSND, ``t`` for TND, ``b * cache_length + pos``
    for Norm. Offsets are counted from the start of the cache's memory, whatever its declared
    shape (a PA_NZ cache declared ``[BlockNum, BlockSize, 1, D]`` holds
    ``[BlockNum, D/C0, BlockSize, C0]``, docs/sources.md#paged_nz, docs/sources.md#cache_index).

    The caches it describes (memory order; ``N`` = :attr:`heads`, ``C0 = 32 / itemsize``):

    - ``[nb, bs, N*D]`` / ``[nb, bs, N, D]``: PA_BSND (token-major; fused_infer_attention_score's
      3-D cache, the Norm caches of npu_scatter_pa_kv_cache);
    - ``[nb, N, bs, D]``: PA_BNSD, ``head_major`` (torch_npu's meaning; N = 1 gives PA_BSND's bytes);
    - ``[nb, N, D/C0, bs, C0]``: PA_NZ with ``head_major`` (N = 1: the MLA writers' PA_NZ,
      ``[nb, D/C0, bs, C0]``);
    - rows of bytes: an int8 cache with ``dim`` the row's bytes (the V3.2 656-byte combined rows,
      :data:`ascend_emu.quant.MLA_ROW`; DeepSeek-V4's 640-byte fp8 rows fit the same way);
    - fp32 state caches ``[blocks, state_block_size, 1, 2*coff*D]``: PA_BSND, itemsize 4,
      ``dim = 2*coff*D``;
    - compressed caches whose block holds ``block_size`` rows of ``ratio`` tokens each: ``ratio``
      (:attr:`tokens_per_block`). Offsets, slots and block reads count rows; the token -> row
      rule of a compressed cache belongs to the op that compresses it.

    Attributes:
        mode: canonical cache mode (the alias PA resolved to PA_BSND).
        num_blocks: blocks (PA_*: BlockNum; BSND / Norm: B; TND: 1).
        block_size: rows per block (PA_*: BlockSize; BSND: S; Norm: cache_length; TND: T).
        dim: elements per row and head, D (512, 64, 576; 656 for int8 combined rows).
        itemsize: bytes per element: 1 (int8), 2 (bf16 / fp16) or 4.
        heads: kv heads Nkv (must be 1 for Norm, and for NZ unless head-major).
        head_major: each block stores its heads one after the other (``[N, bs, D]``, NZ
            ``[N, D/C0, bs, C0]``) rather than each row's heads together. Always True for
            PA_BNSD / PA_BLK_BNSD; may be set for NZ modes; False for every other mode.
        ratio: tokens per row (1; a compressed cache's compression ratio).

    Raises:
        ModeError: unknown mode, or ``head_major`` for a mode that has no head-major form.
        ShapeError: negative sizes (D, Nkv and ratio must be >= 1), an itemsize other than
            1 / 2 / 4, or an NZ cache whose D is not a multiple of C0 or that has several heads
            without being head-major.
    """

    mode: str
    num_blocks: int
    block_size: int
    dim: int
    itemsize: int
    heads: int = 1
    head_major: bool = False
    ratio: int = 1

    def __post_init__(self):
        object.__setattr__(self, "mode", canonical_cache_mode(self.mode))
        for name, value, low in (("num_blocks", self.num_blocks, 0), ("block_size", self.block_size, 0),
                                 ("D", self.dim, 1), ("Nkv", self.heads, 1), ("ratio", self.ratio, 1)):
            if not isinstance(value, (int, np.integer)) or value < low:
                raise arg_error(ShapeError, name, f"an integer >= {low}", value)
        if self.itemsize not in (1, 2, 4):
            raise arg_error(ShapeError, "itemsize", "1, 2 or 4 bytes", self.itemsize)
        if self.mode in HEAD_MAJOR_MODES:
            object.__setattr__(self, "head_major", True)
        elif self.head_major and not self.nz:
            raise arg_error(ModeError, "head_major", f"False for cache_mode {self.mode} (head-major ND caches are "
                            f"{' / '.join(HEAD_MAJOR_MODES)}; NZ modes may be head-major)", True)
        object.__setattr__(self, "head_major", bool(self.head_major))
        if self.nz:
            if self.dim % self.c0:
                raise arg_error(ShapeError, "D", f"a multiple of C0={self.c0} for an NZ cache", self.dim)
            if self.heads != 1 and not self.head_major:
                raise arg_error(ShapeError, "Nkv", "1 for an NZ cache that is not head-major", self.heads)
        if self.mode == "Norm" and self.heads != 1:
            raise arg_error(ShapeError, "N", "1 for a Norm cache [B, 1, cache_length, D]", self.heads)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_declared(cls, mode: str, shape: Sequence[int], itemsize: int, *,
                      name: str = "cache") -> "CacheLayout":
        """Layout of a cache from its declared shape.

        Declared shapes (docs/sources.md#cache_index, docs/sources.md#npu_kv_rmsnorm_rope_cache): PA token-major modes ``[BlockNum, BlockSize,
        Nkv, D]`` (NZ modes too: the declared shape stays ND); PA_BNSD / PA_BLK_BNSD
        ``[BlockNum, Nkv, BlockSize, D]``; ``BSND`` ``[B, S, Nkv, D]``; ``TND`` ``[T, Nkv, D]``;
        ``Norm`` ``[B, 1, cache_length, D]``. An NZ cache declared by its memory
        shape ``[BlockNum, D/C0, BlockSize, C0]`` (MlaPreprocess cacheMode 2 / 3) is not
        recognised here; :meth:`from_shape` recognises both.

        Args:
            mode: cache mode (aliases accepted).
            shape: the cache tensor's declared shape.
            itemsize: bytes per element of the cache dtype.
            name: argument name for errors.

        Raises:
            ModeError: unknown mode.
            ShapeError: wrong rank, or a geometry :class:`CacheLayout` rejects.
        """
        mode = canonical_cache_mode(mode)
        shape = tuple(int(s) for s in shape)
        if mode == "TND":
            if len(shape) != 3:
                raise arg_error(ShapeError, name, "a 3-D [T, Nkv, D] tensor for cache_mode TND", shape)
            t, n, d = shape
            return cls(mode=mode, num_blocks=1, block_size=t, dim=d, itemsize=itemsize, heads=n)
        if len(shape) != 4:
            want = {"Norm": "[B, 1, cache_length, D]", "PA_BNSD": "[BlockNum, Nkv, BlockSize, D]",
                    "PA_BLK_BNSD": "[BlockNum, Nkv, BlockSize, D]"}.get(mode, "[BlockNum, BlockSize, Nkv, D]")
            raise arg_error(ShapeError, name, f"a 4-D {want} tensor for cache_mode {mode}", shape)
        if mode == "Norm" or mode in HEAD_MAJOR_MODES:
            nb, n, bs, d = shape
            return cls(mode=mode, num_blocks=nb, block_size=bs, dim=d, itemsize=itemsize, heads=n)
        nb, bs, n, d = shape
        return cls(mode=mode, num_blocks=nb, block_size=bs, dim=d, itemsize=itemsize, heads=n)

    @classmethod
    def from_single_head(cls, mode: str, shape: Sequence[int], itemsize: int, *,
                         name: str = "cache") -> "CacheLayout":
        """Layout of a one-kv-head cache declared ``[BlockNum, BlockSize, 1, D]`` in every PA mode,
        as the MLA writers declare theirs (npu_kv_rmsnorm_rope_cache): in PA_BNSD / PA_BLK_BNSD
        that is head-major ``[BlockNum, 1, BlockSize, D]``, the same bytes. Other shapes and modes:
        :meth:`from_declared`.

        Raises:
            As :meth:`from_declared`.
        """
        shape = tuple(int(s) for s in shape)
        if canonical_cache_mode(mode) in HEAD_MAJOR_MODES and len(shape) == 4 and shape[2] == 1:
            shape = (shape[0], 1, shape[1], shape[3])
        return cls.from_declared(mode, shape, itemsize, name=name)

    @classmethod
    def from_shape(cls, mode: str, shape: Sequence[int], itemsize: int, *,
                   name: str = "cache") -> "CacheLayout":
        """Layout of a cache given in its declared shape **or** its storage shape.

        Besides the declared shapes of :meth:`from_declared`, an NZ-mode cache is recognised by
        its memory shape ``[BlockNum, D/C0, BlockSize, C0]`` (MlaPreprocess cacheMode 2 / 3,
        :meth:`storage_shape`), ``[BlockNum, D/C0, BlockSize, 1, C0]`` (the layout
        aclnnKvRmsNormRopeCache documents) or ``[BlockNum, N, Dh/C0, BlockSize, C0]`` (the 5-D
        PA_NZ view aclnnScatterPaKvCache takes, the same bytes as ``[BlockNum, N*Dh/C0,
        BlockSize, C0]``: a token's ``N*Dh`` elements are one row, D = N*Dh, Nkv 1), with
        ``C0 = 32 bytes / itemsize``. A 4-D shape is
        read as declared ``[BlockNum, BlockSize, 1, D]`` when it fits that reading under
        :func:`check_block_size`, else as storage. A PA_BNSD / PA_BLK_BNSD shape ``[BlockNum,
        BlockSize, 1, D]`` is the one-head cache the writers declare (:meth:`from_single_head`),
        any other ``[BlockNum, N, BlockSize, D]``. Unlike :meth:`from_declared` the BlockSize
        rule of :func:`check_block_size` is applied.

        Args:
            mode: cache mode (aliases accepted).
            shape: the tensor's shape.
            itemsize: bytes per element.
            name: argument name for errors.

        Raises:
            ModeError: unknown mode.
            ShapeError: neither reading fits, or a geometry :class:`CacheLayout` or
                :func:`check_block_size` rejects.
        """
        mode = canonical_cache_mode(mode)
        shape = tuple(int(s) for s in shape)
        c0 = NZ_ROW_BYTES // itemsize if itemsize in (1, 2, 4) else 0
        if mode in ("PA_NZ", "PA_BLK_NZ") and c0:
            storage = None
            if len(shape) == 5 and shape[3] == 1 and shape[4] == c0:
                storage = (shape[0], shape[1], shape[2])
            elif len(shape) == 5 and shape[4] == c0:  # [BlockNum, N, Dh/C0, BlockSize, C0]
                storage = (shape[0], shape[1] * shape[2], shape[3])
            elif len(shape) == 4 and shape[3] == c0 and not (shape[2] == 1 and shape[1] % NZ_BLOCK_ROWS == 0
                                                                and shape[1] > 0):
                storage = (shape[0], shape[1], shape[2])
            if storage is not None:
                nb, d1, bs = storage
                at = 3 if len(shape) == 5 and shape[3] != 1 else 2
                check_block_size(mode, bs, name=f"{name} BlockSize (storage shape dim {at})")
                return cls(mode=mode, num_blocks=nb, block_size=bs, dim=d1 * c0, itemsize=itemsize)
        layout = cls.from_single_head(mode, shape, itemsize, name=name)
        if layout.paged:
            check_block_size(mode, layout.block_size, name=f"{name} BlockSize (shape[1])")
        return layout

    # ------------------------------------------------------------------ geometry
    @property
    def traits(self) -> CacheModeTraits:
        """What this layout's mode means (:func:`cache_mode_traits`)."""
        return CACHE_MODE_TRAITS[self.mode]

    @property
    def nz(self) -> bool:
        """True for PA_NZ / PA_BLK_NZ."""
        return self.traits.nz

    @property
    def paged(self) -> bool:
        """True for the PA_* modes (a pool of blocks read through a block table or written at
        slots ``block * block_size + row``)."""
        return self.traits.paged

    @property
    def page_indexed(self) -> bool:
        """True for PA_BLK_* modes: the writer's index lists whole pages (:func:`slots_from_pages`)."""
        return self.traits.page_indexed

    @property
    def index_kind(self) -> str:
        """What a writer's index tensor holds for this mode (module docstring): ``"slot"``
        (PA_BSND / PA_BNSD / PA_NZ: :func:`slots_from_cache_index`), ``"pages"`` (PA_BLK_*:
        :func:`slots_from_pages`), ``"position"`` (Norm: :func:`slots_from_positions`) or
        ``"own"`` (BSND / TND: tokens sit at their own position)."""
        return self.traits.index_kind

    @property
    def sequences(self) -> str:
        """How a batch's tokens sit in the cache: ``"blocks"``, ``"per_batch"`` or ``"packed"``
        (:class:`CacheModeTraits`)."""
        return self.traits.sequences

    @property
    def declared_rank(self) -> int:
        """Rank of the declared shape (:meth:`declared_shape`): 3 for TND, else 4."""
        return self.traits.declared_rank

    @property
    def c0(self) -> int:
        """Elements per NZ fractal row: 32 bytes / itemsize."""
        return NZ_ROW_BYTES // self.itemsize

    @property
    def num_rows(self) -> int:
        """Total slots: num_blocks * block_size."""
        return self.num_blocks * self.block_size

    @property
    def tokens_per_block(self) -> int:
        """Tokens one block covers: block_size * ratio."""
        return self.block_size * self.ratio

    @property
    def row_bytes(self) -> int:
        """Bytes of one slot (all heads)."""
        return self.heads * self.dim * self.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the whole cache."""
        return self.num_rows * self.row_bytes

    @property
    def chunk_bytes(self) -> int:
        """Bytes that stay contiguous when one row is written: the row (ND token-major), one
        head's row (head-major ND) or 32 (NZ)."""
        if self.nz:
            return NZ_ROW_BYTES
        return self.dim * self.itemsize if self.head_major else self.row_bytes

    def storage_shape(self) -> tuple[int, ...]:
        """Shape that shows the memory order: ``[BlockNum, D/C0, BlockSize, C0]`` (NZ),
        ``[BlockNum, Nkv, D/C0, BlockSize, C0]`` (head-major NZ), ``[num_blocks, Nkv, block_size,
        D]`` (head-major ND) or ``[num_blocks, block_size, Nkv, D]`` (ND)."""
        if self.nz:
            inner = (self.dim // self.c0, self.block_size, self.c0)
            return (self.num_blocks, self.heads, *inner) if self.head_major else (self.num_blocks, *inner)
        if self.head_major:
            return (self.num_blocks, self.heads, self.block_size, self.dim)
        return (self.num_blocks, self.block_size, self.heads, self.dim)

    def to_rows(self, buffer) -> np.ndarray:
        """The cache's rows in logical order, whatever the mode: ``[num_rows, Nkv, D]``.

        NZ modes re-order each block ``[D/C0, BlockSize, C0]`` to ``[BlockSize, D]`` (docs/sources.md#paged_nz), head-major ones each block ``[Nkv, BlockSize, ..]`` to ``[BlockSize, Nkv, ..]``;
        ND token-major modes are a reshape. The bytes are not interpreted: element ``[slot, h, d]``
        of the result is element ``d`` of head ``h`` of ``slot``, in ``buffer``'s dtype.

        Args:
            buffer: NumPy array holding exactly the cache's bytes (any shape, e.g. the declared
                or the storage shape; any dtype of this layout's itemsize, uint8 included when
                itemsize is 1), C-contiguous.

        Returns:
            A new ``[num_rows, Nkv, D]`` array of ``buffer``'s dtype (uint8 buffers of a wider
            itemsize give ``[num_rows, Nkv, D * itemsize]`` bytes).

        Raises:
            ShapeError: ``buffer`` does not hold ``nbytes`` bytes or is not C-contiguous.
        """
        arr = np.asarray(buffer)
        if arr.nbytes != self.nbytes or not arr.flags.c_contiguous:
            raise arg_error(ShapeError, "buffer", f"a C-contiguous array of {self.nbytes} bytes",
                            f"{arr.nbytes} bytes, shape {list(arr.shape)}")
        raw = arr.reshape(-1).view(np.uint8)  # [nbytes]
        head_bytes = self.dim * self.itemsize
        if self.nz:
            blocks = raw.reshape(self.num_blocks, self.heads, self.dim // self.c0, self.block_size, NZ_ROW_BYTES)
            rows = blocks.transpose(0, 3, 1, 2, 4).reshape(self.num_rows, self.heads, head_bytes)
        elif self.head_major:
            blocks = raw.reshape(self.num_blocks, self.heads, self.block_size, head_bytes)
            rows = blocks.transpose(0, 2, 1, 3).reshape(self.num_rows, self.heads, head_bytes)
        else:
            rows = raw.reshape(self.num_rows, self.heads, head_bytes)  # [rows, Nkv, D*s]
        rows = np.ascontiguousarray(rows)
        return rows if arr.dtype == np.uint8 else rows.view(arr.dtype)

    def declared_shape(self) -> tuple[int, ...]:
        """The shape the ops declare this cache with (:meth:`from_declared` reads it back): PA
        token-major and NZ modes ``[BlockNum, BlockSize, Nkv, D]`` (head-major NZ: its storage
        shape), PA_BNSD / PA_BLK_BNSD ``[BlockNum, Nkv, BlockSize, D]``, BSND ``[B, S, Nkv, D]``,
        TND ``[T, Nkv, D]``, Norm ``[B, 1, cache_length, D]``."""
        nb, bs, n, d = self.num_blocks, self.block_size, self.heads, self.dim
        if self.mode == "TND":
            return (bs, n, d)
        if self.mode == "Norm" or (self.head_major and not self.nz):
            return (nb, n, bs, d)
        if self.nz and self.head_major:
            return self.storage_shape()
        return (nb, bs, n, d)

    def from_rows(self, rows) -> np.ndarray:
        """The cache's bytes in memory order from its logical rows (the inverse of :meth:`to_rows`).

        Args:
            rows: ``[num_rows, Nkv, D]`` of an itemsize-byte dtype (row ``s`` = slot ``s``).

        Returns:
            uint8 ``[nbytes]`` (a new array).

        Raises:
            ShapeError: ``rows`` does not hold ``nbytes`` bytes.
        """
        arr = np.ascontiguousarray(rows)
        if arr.nbytes != self.nbytes:
            raise arg_error(ShapeError, "rows", f"[{self.num_rows}, {self.heads}, {self.dim}] elements of "
                            f"{self.itemsize} bytes ({self.nbytes} bytes)", f"shape {list(arr.shape)}")
        raw = arr.reshape(-1).view(np.uint8)
        head_bytes = self.dim * self.itemsize
        if self.nz:
            tiles = raw.reshape(self.num_blocks, self.block_size, self.heads, self.dim // self.c0, NZ_ROW_BYTES)
            raw = tiles.transpose(0, 2, 3, 1, 4)
        elif self.head_major:
            raw = raw.reshape(self.num_blocks, self.block_size, self.heads, head_bytes).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(raw).reshape(-1)

    # ------------------------------------------------------------------ forward map
    def element_offset(self, slot: int, d: int, head: int = 0) -> int:
        """Offset in elements of element ``d`` of ``head`` of ``slot``.

        ND modes: ``(slot * Nkv + head) * D + d``; head-major ND: ``((blk*Nkv + head)*bs + r)*D +
        d``. NZ modes (docs/sources.md#paged_nz): ``blk*bs*Nkv*D + head*bs*D + (d // C0)*bs*C0 + r*C0 + d % C0``
        (``blk, r = divmod(slot, bs)``).

        Raises:
            IndexRangeError: slot, head or d out of range.
        """
        self._check_coords(slot, d, head)
        blk, r = divmod(slot, self.block_size)
        bs = self.block_size
        if self.nz:
            c0 = self.c0
            return (blk * self.heads + head) * bs * self.dim + (d // c0) * bs * c0 + r * c0 + d % c0
        if self.head_major:
            return ((blk * self.heads + head) * bs + r) * self.dim + d
        return (slot * self.heads + head) * self.dim + d

    def byte_offset(self, slot: int, d: int, head: int = 0) -> int:
        """Offset in bytes of the first byte of element ``d`` of ``head`` of ``slot``
        (:meth:`element_offset` times itemsize).

        Raises:
            IndexRangeError: slot, head or d out of range.
        """
        return self.element_offset(slot, d, head) * self.itemsize

    def chunk_offsets(self, slots: np.ndarray) -> np.ndarray:
        """Byte offsets of every contiguous chunk of each slot's row (what scatter / gather
        kernels copy: one whole row for ND token-major modes, one per head for head-major ND,
        ``Nkv * D / C0`` 32-byte fractal rows for NZ).

        Args:
            slots: integer ``[T]`` slots, each in ``[0, num_rows)``; not checked here (validate
                them first, e.g. with :func:`slots_from_cache_index`).

        Returns:
            int64 ``[T, row_bytes // chunk_bytes]``; chunk ``j`` of row ``t`` holds row bytes
            ``[j*chunk_bytes, (j+1)*chunk_bytes)`` (the row's bytes in head, element order) and
            starts at ``out[t, j]`` in the cache.
        """
        slots = np.asarray(slots, dtype=np.int64)
        if not self.nz and not self.head_major:
            return (slots * self.row_bytes)[:, None]  # [T, 1]
        blk, r = np.divmod(slots, self.block_size)  # [T], [T]
        nchunk = self.row_bytes // self.chunk_bytes
        base = blk * (self.block_size * self.row_bytes) + r * self.chunk_bytes  # [T]
        return base[:, None] + np.arange(nchunk, dtype=np.int64)[None, :] * (self.block_size * self.chunk_bytes)

    # ------------------------------------------------------------------ reads
    def read_blocks(self, cache: np.ndarray, blocks: np.ndarray, head: int = 0) -> np.ndarray:
        """Head ``head`` of every row of the blocks ``blocks``, in order: ``[len(blocks) *
        block_size, D]`` in the cache's dtype (a new array). What a block table's reader gathers.

        Args:
            cache: the cache's elements (any shape holding this layout's ``nbytes``, C-contiguous
                for a view; another array is copied by the reshape), dtype of this itemsize.
            blocks: integer ``[n]`` block ids in ``[0, num_blocks)``; not checked here (the
                contract validates them, e.g. :func:`blocks_from_block_table`).
            head: kv head in ``[0, Nkv)``.
        """
        a = self._storage_view(cache)
        if self.nz:
            tiles = a[blocks, head] if self.head_major else a[blocks]  # [n, D/C0, bs, C0]
            return tiles.transpose(0, 2, 1, 3).reshape(-1, self.dim)
        rows = a[blocks, head] if self.head_major else a[blocks, :, head]  # [n, bs, D]
        return rows.reshape(-1, self.dim)

    def read_rows(self, cache: np.ndarray, slots: np.ndarray, head: int = 0) -> np.ndarray:
        """Head ``head`` of the rows ``slots``: ``[len(slots), D]`` in the cache's dtype (a new
        array). ``slots`` int ``[L]`` in ``[0, num_rows)`` (not checked here); ``cache`` as
        :meth:`read_blocks`."""
        slots = np.asarray(slots, dtype=np.int64)
        if not self.nz and not self.head_major:
            return np.asarray(cache).reshape(self.num_rows, self.heads, self.dim)[slots, head]
        blk, r = np.divmod(slots, self.block_size)
        a = self._storage_view(cache)
        if self.nz:
            tiles = a[blk, head] if self.head_major else a[blk]  # [L, D/C0, bs, C0]
            return tiles[np.arange(slots.size), :, r].reshape(slots.size, self.dim)
        return a[blk, head, r]

    def _storage_view(self, cache) -> np.ndarray:
        """``cache`` in :meth:`storage_shape` (as given when it already has that shape: a strided
        view is not copied)."""
        a = np.asarray(cache)
        shape = self.storage_shape()
        return a if a.shape == shape else a.reshape(shape)

    def slots_of_blocks(self, blocks: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The slots ``block * block_size + row`` of the first ``lengths[b]`` rows read through
        ``blocks[b]``: int64 ``[B, max(lengths)]``, -1 past each length.

        Args:
            blocks: integer ``[B, max_blocks]`` block ids (the entries ``lengths`` need valid).
            lengths: rows read per batch ``[B]``, each <= ``max_blocks * block_size``.
        """
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        width = int(lengths.max()) if lengths.size else 0
        pos = np.arange(width, dtype=np.int64)  # [W]
        bs = self.block_size
        blk = np.asarray(blocks, dtype=np.int64)[:, pos // bs] if width else np.zeros((lengths.size, 0), np.int64)
        return np.where(pos[None, :] < lengths[:, None], blk * bs + pos % bs, SKIP_INDEX)

    def sequence_slots(self, lengths, block_table=None, *, name: str = "block_table") -> np.ndarray:
        """The slot of every position of every sequence a reader reads: int64 ``[B, max(lengths)]``,
        ``-1`` past ``lengths[b]``.

        - paged: kv position ``p`` of batch ``b`` in block ``block_table[b, p // block_size]``, row
          ``p % block_size`` (:func:`slots_from_block_table`: the entries it needs checked);
        - per-batch (BSND, Norm): ``b * block_size + p``;
        - packed (TND): ``sum(lengths[:b]) + p``.

        Args:
            lengths: rows per batch ``[B]`` (lengths, not prefix sums), each >= 0; per-batch: each
                <= block_size, packed: their sum <= block_size (the caller checks them).
            block_table: integer ``[B, max_blocks]`` (paged modes only; not read otherwise).
            name: the block table's argument name for errors.

        Raises:
            As :func:`slots_from_block_table` (paged modes).
        """
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)  # [B]
        if self.paged:
            return slots_from_block_table(block_table, lengths, self.block_size, self.num_blocks, name=name)
        if self.sequences == "per_batch":
            first = np.arange(lengths.size, dtype=np.int64) * self.block_size  # [B]
        else:
            first = np.cumsum(lengths) - lengths  # [B]
        width = int(lengths.max()) if lengths.size else 0
        pos = np.arange(width, dtype=np.int64)  # [W]
        return np.where(pos[None, :] < lengths[:, None], first[:, None] + pos[None, :], SKIP_INDEX)

    def place(self, slot: int) -> str:
        """Words for where ``slot`` is: ``block b, row r (slot s)`` in a paged cache, else
        ``slot s`` (the uninitialised-read messages of checked mode)."""
        if not self.paged:
            return f"slot {slot}"
        blk, r = divmod(int(slot), self.block_size)
        return f"block {blk}, row {r} (slot {slot})"

    # ------------------------------------------------------------------ reverse map
    def locate(self, byte_offset: int) -> CacheLocation:
        """Which logical element a cache byte belongs to (reverse of :meth:`byte_offset`).

        Every byte of a cache in these layouts belongs to exactly one (block, row, head, dim,
        byte): NZ modes require D to be a multiple of C0, so no byte is padding or unused.

        Args:
            byte_offset: byte from the start of the cache's memory.

        Returns:
            A :class:`CacheLocation`; ``slot_of`` gives its slot.

        Raises:
            IndexRangeError: ``byte_offset`` outside ``[0, nbytes)``.
        """
        off = int(byte_offset)
        if not 0 <= off < self.nbytes:
            raise arg_error(IndexRangeError, "byte_offset", f"a byte in [0, {self.nbytes})", off)
        elem, byte = divmod(off, self.itemsize)
        if self.nz or self.head_major:
            blk, rem = divmod(elem, self.block_size * self.heads * self.dim)
            head, rem = divmod(rem, self.block_size * self.dim)
            if self.nz:
                d1, rem = divmod(rem, self.block_size * self.c0)
                r, d0 = divmod(rem, self.c0)
                return CacheLocation(blk, r, head, d1 * self.c0 + d0, byte)
            r, d = divmod(rem, self.dim)
            return CacheLocation(blk, r, head, d, byte)
        slot, rem = divmod(elem, self.heads * self.dim)
        head, d = divmod(rem, self.dim)
        blk, r = divmod(slot, self.block_size)
        return CacheLocation(blk, r, head, d, byte)

    def locate_many(self, byte_offsets) -> tuple[np.ndarray, ...]:
        """:meth:`locate` of many bytes at once: int64 arrays ``(block, row, head, dim, byte)`` of
        ``byte_offsets``' shape. The offsets must lie in ``[0, nbytes)`` (not checked here)."""
        elem, byte = np.divmod(np.asarray(byte_offsets, dtype=np.int64), self.itemsize)
        if self.nz or self.head_major:
            blk, rem = np.divmod(elem, self.block_size * self.heads * self.dim)
            head, rem = np.divmod(rem, self.block_size * self.dim)
            if self.nz:
                d1, rem = np.divmod(rem, self.block_size * self.c0)
                row, d0 = np.divmod(rem, self.c0)
                return blk, row, head, d1 * self.c0 + d0, byte
            row, dim = np.divmod(rem, self.dim)
            return blk, row, head, dim, byte
        slot, rem = np.divmod(elem, self.heads * self.dim)
        head, dim = np.divmod(rem, self.dim)
        blk, row = np.divmod(slot, self.block_size) if self.block_size else (slot, slot)
        return blk, row, head, dim, byte

    def slot_of(self, loc: CacheLocation) -> int:
        """Global slot ``block * block_size + row`` of a location."""
        return loc.block * self.block_size + loc.row

    def slots_at(self, blocks, rows) -> np.ndarray:
        """Global slots ``block * block_size + row`` (int64, broadcast) of rows ``rows`` of blocks
        ``blocks`` (integers or integer arrays; not checked)."""
        return np.asarray(blocks, dtype=np.int64) * self.block_size + np.asarray(rows, dtype=np.int64)

    def block_rows(self, slots) -> tuple[np.ndarray, np.ndarray]:
        """``(block, row)`` of global slots (``divmod(slots, block_size)``, int64, any shape)."""
        return np.divmod(np.asarray(slots, dtype=np.int64), self.block_size)

    def _check_coords(self, slot: int, d: int, head: int) -> None:
        if not 0 <= slot < self.num_rows:
            raise arg_error(IndexRangeError, "slot", f"a slot in [0, {self.num_rows})", slot)
        if not 0 <= head < self.heads:
            raise arg_error(IndexRangeError, "head", f"a head in [0, {self.heads})", head)
        if not 0 <= d < self.dim:
            raise arg_error(IndexRangeError, "d", f"an element in [0, {self.dim})", d)
