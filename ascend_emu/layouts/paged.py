"""Paged / block KV-cache layouts: where each token's row lives, byte by byte.

Sources: ops_reference §1.4 (paged NZ), §2.3 (mla_prolog cache modes and index meanings), §4
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
slot (:meth:`CacheLayout.place`) all come from it.

How an op's index tensor becomes slots differs between ops (ops_reference §6 gotcha 5):

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
from numba import njit

from ..errors import DTypeError, IndexRangeError, ModeError, ShapeError, arg_error
from .nz import M0

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
#: Bytes in one NZ fractal row; C0 = NZ_ROW_BYTES // itemsize.
NZ_ROW_BYTES = 32
#: The index value that means "do not write this token".
SKIP_INDEX = -1
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
    ``[BlockNum, D/C0, BlockSize, C0]``, ops_reference §1.4, §2.3).

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

        Declared shapes (ops_reference §2.3, §4): PA token-major modes ``[BlockNum, BlockSize,
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
    def nz(self) -> bool:
        """True for PA_NZ / PA_BLK_NZ."""
        return self.mode in ("PA_NZ", "PA_BLK_NZ")

    @property
    def paged(self) -> bool:
        """True for the PA_* modes (a pool of blocks read through a block table or written at
        slots ``block * block_size + row``)."""
        return self.mode in PAGED_MODES

    @property
    def page_indexed(self) -> bool:
        """True for PA_BLK_* modes: the writer's index lists whole pages (:func:`slots_from_pages`)."""
        return self.mode in PAGE_INDEXED_MODES

    @property
    def index_kind(self) -> str:
        """What a writer's index tensor holds for this mode (module docstring): ``"slot"``
        (PA_BSND / PA_BNSD / PA_NZ: :func:`slots_from_cache_index`), ``"pages"`` (PA_BLK_*:
        :func:`slots_from_pages`), ``"position"`` (Norm: :func:`slots_from_positions`) or
        ``"own"`` (BSND / TND: tokens sit at their own position)."""
        if self.page_indexed:
            return "pages"
        if self.paged:
            return "slot"
        return "position" if self.mode == "Norm" else "own"

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

        NZ modes re-order each block ``[D/C0, BlockSize, C0]`` to ``[BlockSize, D]`` (ops_reference
        §1.4), head-major ones each block ``[Nkv, BlockSize, ..]`` to ``[BlockSize, Nkv, ..]``;
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

    # ------------------------------------------------------------------ forward map
    def element_offset(self, slot: int, d: int, head: int = 0) -> int:
        """Offset in elements of element ``d`` of ``head`` of ``slot``.

        ND modes: ``(slot * Nkv + head) * D + d``; head-major ND: ``((blk*Nkv + head)*bs + r)*D +
        d``. NZ modes (§1.4): ``blk*bs*Nkv*D + head*bs*D + (d // C0)*bs*C0 + r*C0 + d % C0``
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
        a = np.asarray(cache).reshape(self.storage_shape())
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
        a = np.asarray(cache).reshape(self.storage_shape())
        if self.nz:
            tiles = a[blk, head] if self.head_major else a[blk]  # [L, D/C0, bs, C0]
            return tiles[np.arange(slots.size), :, r].reshape(slots.size, self.dim)
        return a[blk, head, r]

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

    def slot_of(self, loc: CacheLocation) -> int:
        """Global slot ``block * block_size + row`` of a location."""
        return loc.block * self.block_size + loc.row

    def slot(self, block: int, row: int) -> int:
        """Global slot ``block * block_size + row`` of row ``row`` of block ``block``."""
        return int(block) * self.block_size + int(row)

    def block_row(self, slot: int) -> tuple[int, int]:
        """``(block, row)`` of a global slot (``divmod(slot, block_size)``)."""
        return divmod(int(slot), self.block_size)

    def _check_coords(self, slot: int, d: int, head: int) -> None:
        if not 0 <= slot < self.num_rows:
            raise arg_error(IndexRangeError, "slot", f"a slot in [0, {self.num_rows})", slot)
        if not 0 <= head < self.heads:
            raise arg_error(IndexRangeError, "head", f"a head in [0, {self.heads})", head)
        if not 0 <= d < self.dim:
            raise arg_error(IndexRangeError, "d", f"an element in [0, {self.dim})", d)


# ---------------------------------------------------------------------- index -> slot maps
def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def _at(name: str, coord: tuple[int, ...]) -> str:
    return f"{name}[{', '.join(map(str, coord))}]" if coord else name


def _check_integer(values: np.ndarray, name: str) -> None:
    if values.dtype.kind not in "iu":
        raise arg_error(DTypeError, name, "an integer index tensor", values.dtype)


def check_index_range(values: np.ndarray, lo: int, hi: int, *, name: str, what: str,
                      allow_skip: bool = True) -> None:
    """Raise unless every value is in ``[lo, hi)`` (or ``-1`` when ``allow_skip``).

    Other negative values are errors too, even where the kernel would skip them (stricter than
    the hardware, DESIGN.md "Errors and safety").

    Args:
        values: integer array of any shape (an empty array passes).
        lo, hi: the valid half-open range.
        name: argument name for the message.
        what: what a value means, e.g. ``"slot"`` or ``"block id"``.
        allow_skip: accept :data:`SKIP_INDEX` (-1).

    Raises:
        DTypeError: ``values`` is not an integer array.
        IndexRangeError: a value is out of range; the message names the first offending
            coordinate and value (e.g. ``cache_index[3, 1] = 9000``) and the count of bad values.
    """
    values = np.asarray(values)
    _check_integer(values, name)
    if values.size == 0:
        return
    ok = (values >= lo) & (values < hi)
    if allow_skip:
        ok |= values == SKIP_INDEX
    if not ok.all():
        bad = np.logical_not(ok)
        coord = _first_bad(bad)
        skip = f"{SKIP_INDEX} (skip) or " if allow_skip else ""
        raise IndexRangeError(
            f"{_at(name, coord)} = {int(values[coord])}: expected {skip}{what} in [{lo}, {hi}); "
            f"{int(bad.sum())} value(s) out of range")


def slots_from_cache_index(cache_index: np.ndarray, num_rows: int, *, name: str = "cache_index",
                           allow_skip: bool = True) -> np.ndarray:
    """PA_BSND / PA_NZ (and MlaPreprocess ``slotmapping``): the index *is* the global slot.

    Source: ops_reference §2.3 (PA_BSND / PA_NZ), §3 (slotMapping), §4 (PA / PA_NZ).

    Args:
        cache_index: integer ``[T]`` or ``[B, S]``; values in ``[0, num_rows)`` or -1 (skip).
        num_rows: BlockNum * BlockSize.
        name: argument name for errors.
        allow_skip: accept -1.

    Returns:
        int64 ``[T]`` slots, token-major (``[B, S]`` flattened), -1 kept for skipped tokens.

    Raises:
        DTypeError: not an integer tensor.
        IndexRangeError: a value out of range (the message names its coordinates).
    """
    idx = np.asarray(cache_index)
    if idx.dtype in _FAST_TABLE_DTYPES:  # one compiled pass; a bad value goes the NumPy way for its message
        ok, slots = _index_slots(idx.reshape(-1), int(num_rows), allow_skip)
        if ok:
            return slots
    check_index_range(idx, 0, num_rows, name=name, what="slot", allow_skip=allow_skip)
    return idx.reshape(-1).astype(np.int64)


@njit(cache=True)
def _index_slots(idx, num_rows, allow_skip):
    """One pass of :func:`slots_from_cache_index` for an int32 / int64 ``[T]`` index: ``(True, int64
    copy)`` when every value is in ``[0, num_rows)`` (or -1 with ``allow_skip``), else ``(False,
    empty)`` at the first bad value (the caller then raises with :func:`check_index_range`)."""
    out = np.empty(idx.shape[0], np.int64)  # [T]
    for i in range(idx.shape[0]):
        v = np.int64(idx[i])
        if (v < 0 or v >= num_rows) and not (allow_skip and v == SKIP_INDEX):
            return False, np.empty(0, np.int64)
        out[i] = v
    return True, out


def slots_from_pages(pages: np.ndarray, seq_lens: Sequence[int], block_size: int, num_blocks: int, *,
                     page_offsets: bool, name: str) -> np.ndarray:
    """PA_BLK_BSND / PA_BLK_NZ: every batch's tokens fill its listed blocks from row 0.

    Source: ops_reference §2.3 (npu_mla_prolog_v3: block ids), §4 (npu_kv_rmsnorm_rope_cache:
    page start offsets), §6 gotcha 5.

    Token ``p`` (0-based within batch ``b``) goes to page ``pages[off_b + p // block_size]``,
    row ``p % block_size``, where ``off_b = sum(ceil(seq_lens[i] / block_size) for i < b)``.

    Args:
        pages: integer ``[sum(ceil(S_b / block_size))]`` (merged) or ``[B, ceil(S / block_size)]``
            (non-merged, equal S), read in row-major order. With ``page_offsets=False``
            (npu_mla_prolog_v3 ``cache_index``) values are block ids in ``[0, num_blocks)``; with
            ``page_offsets=True`` (npu_kv_rmsnorm_rope_cache ``index``) they are token offsets of
            page starts, ``block_id * block_size``, in ``[0, num_blocks * block_size)``. -1 skips
            the whole page.
        seq_lens: tokens per batch ``[B]`` (lengths, not prefix sums), each >= 0.
        block_size: rows per block, >= 1.
        num_blocks: blocks in the cache.
        page_offsets: which of the two index meanings ``pages`` has.
        name: argument name for errors.

    Returns:
        int64 ``[sum(seq_lens)]`` slots ``block_id * block_size + row``, batch-major; -1 for the
        tokens of skipped pages.

    Raises:
        DTypeError: ``pages`` not an integer tensor.
        ShapeError: ``pages`` has the wrong number of entries, a negative ``seq_lens`` value, or
            ``block_size < 1``.
        IndexRangeError: a page out of range, or (page offsets) not a multiple of block_size;
            the message names the coordinates in ``pages``.
    """
    pages_nd = np.asarray(pages)
    _check_integer(pages_nd, name)
    if int(block_size) < 1:
        raise arg_error(ShapeError, "block_size", "an integer >= 1", block_size)
    seq_lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
    if (seq_lens < 0).any():
        i = int(np.argmax(seq_lens < 0))
        raise arg_error(ShapeError, f"seq_lens[{i}]", "a token count >= 0", int(seq_lens[i]))
    per_batch = -(-seq_lens // block_size)  # [B]
    if pages_nd.size != int(per_batch.sum()):
        raise arg_error(ShapeError, name,
                        f"{int(per_batch.sum())} page entries (sum of ceil(S_b/{block_size}) over "
                        f"seq_lens {seq_lens.tolist()})", f"{pages_nd.size} (shape {list(pages_nd.shape)})")
    if page_offsets:
        check_index_range(pages_nd, 0, num_blocks * block_size, name=name, what="page start offset")
        misaligned = (pages_nd >= 0) & (pages_nd % block_size != 0)
        if misaligned.any():
            coord = _first_bad(misaligned)
            raise IndexRangeError(f"{_at(name, coord)} = {int(pages_nd[coord])}: expected a page start "
                                  f"offset, a multiple of block_size={block_size} (block_id * block_size), "
                                  f"or -1")
    else:
        check_index_range(pages_nd, 0, num_blocks, name=name, what="block id")
    flat = pages_nd.reshape(-1).astype(np.int64)  # [P]
    block_ids = np.where(flat >= 0, flat // block_size, SKIP_INDEX) if page_offsets else flat
    total = int(seq_lens.sum())
    batch = np.repeat(np.arange(seq_lens.size), seq_lens)  # [T]
    starts = np.concatenate(([0], np.cumsum(seq_lens)[:-1])).astype(np.int64)  # [B]
    page_starts = np.concatenate(([0], np.cumsum(per_batch)[:-1])).astype(np.int64)  # [B]
    pos = np.arange(total, dtype=np.int64) - starts[batch]  # [T] position within batch
    blk = block_ids[page_starts[batch] + pos // block_size]  # [T]
    return np.where(blk >= 0, blk * block_size + pos % block_size, SKIP_INDEX).astype(np.int64)


def slots_from_block_table(block_table: np.ndarray, kv_lens: Sequence[int], block_size: int, num_blocks: int, *,
                           name: str = "block_table") -> np.ndarray:
    """PA_BSND reads (sparse attention, lightning indexer): kv token ``p`` of batch ``b`` lives in
    block ``block_table[b, p // block_size]``, row ``p % block_size``.

    Source: ops_reference §5.1 (``block_table`` int32 ``[B, >= ceil(max_s2 / block_size)]``);
    vLLM's paged attention uses the same map.

    Only the entries that cover a batch's ``kv_lens[b]`` tokens are read and checked; the rest of
    a row (padding, often 0 or -1) is ignored, as the kernels ignore it.

    Args:
        block_table: integer ``[B, max_blocks]``.
        kv_lens: kv tokens per batch ``[B]`` (lengths, not prefix sums), each >= 0.
        block_size: rows per block, >= 1.
        num_blocks: blocks in the cache.
        name: argument name for errors.

    Returns:
        int64 ``[B, max(kv_lens)]`` slots ``block * block_size + row``; -1 at positions past
        ``kv_lens[b]``.

    Raises:
        DTypeError: ``block_table`` not an integer tensor.
        ShapeError: not 2-D, fewer rows than ``kv_lens`` has batches, too few columns for the
            longest sequence, a negative length, or ``block_size < 1``.
        IndexRangeError: a needed entry outside ``[0, num_blocks)``; the message names its
            coordinates ``block_table[b, j]`` and value.
    """
    table = np.asarray(block_table)
    if table.ndim == 2 and table.dtype in _FAST_TABLE_DTYPES and isinstance(block_size, (int, np.integer)):
        lens = np.asarray(kv_lens, dtype=np.int64).reshape(-1)  # [B]
        ok, slots = _block_table_slots(table, lens, int(block_size), int(num_blocks))
        if ok:
            return slots
    return _block_table_slots_checked(table, kv_lens, block_size, num_blocks, name)


def blocks_from_block_table(block_table: np.ndarray, kv_lens: Sequence[int], block_size: int, num_blocks: int, *,
                            name: str = "block_table") -> np.ndarray:
    """The blocks a block-table reader reads: the entries of ``block_table`` that cover each
    batch's ``kv_lens[b]`` rows, checked (the map of :func:`slots_from_block_table`, one entry per
    block instead of one per row).

    Args:
        block_table: integer ``[B, max_blocks]``.
        kv_lens: rows per batch ``[B]`` (lengths, not prefix sums), each >= 0.
        block_size: rows per block, >= 1.
        num_blocks: blocks in the cache.
        name: argument name for errors.

    Returns:
        int64 ``[B, max(ceil(kv_lens / block_size))]``: block ids in ``[0, num_blocks)``, -1 past
        the blocks batch ``b`` needs.

    Raises:
        As :func:`slots_from_block_table` (the same checks and messages).
    """
    table = np.asarray(block_table)
    lens = np.asarray(kv_lens, dtype=np.int64).reshape(-1)  # [B]
    bs = int(block_size) if isinstance(block_size, (int, np.integer)) else 0
    ok = table.ndim == 2 and table.dtype.kind in "iu" and bs >= 1 and not (lens < 0).any() \
        and table.shape[0] == lens.size
    if ok:
        need = -(-lens // bs)  # [B]
        max_need = int(need.max()) if lens.size else 0
        ok = table.shape[1] >= max_need
    if ok:
        used = np.arange(max_need)[None, :] < need[:, None]  # [B, max_need]
        blocks = table[:, :max_need].astype(np.int64)
        ok = not (used & ((blocks < 0) | (blocks >= num_blocks))).any()
    if not ok:
        _block_table_slots_checked(table, kv_lens, block_size, num_blocks, name)  # raises, naming the entry
        raise arg_error(ShapeError, name, "a valid block table", f"shape {list(table.shape)}")
    return np.where(used, blocks, SKIP_INDEX)


#: block_table dtypes the one-pass kernel takes (every value compares exactly with int64); others
#: go through :func:`_block_table_slots_checked`.
_FAST_TABLE_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


@njit(cache=True)
def _block_table_slots(table, kv_lens, block_size, num_blocks):
    """One pass of :func:`slots_from_block_table` for a 2-D int32 / int64 table: every check it
    makes, each needed entry checked before it is used.

    Returns:
        ``(True, slots)`` when every check passes; ``(False, empty)`` at the first failure (the
        caller then runs :func:`_block_table_slots_checked` for the error and its message).
    """
    fail = np.empty((0, 0), np.int64)
    b = kv_lens.shape[0]
    if block_size < 1:
        return False, fail
    max_len = 0
    for i in range(b):
        if kv_lens[i] < 0:
            return False, fail
        max_len = max(max_len, kv_lens[i])
    if table.shape[0] != b or table.shape[1] < (max_len + block_size - 1) // block_size:
        return False, fail
    slots = np.empty((b, max_len), np.int64)  # [B, S2]
    for i in range(b):
        n = kv_lens[i]
        for j in range((n + block_size - 1) // block_size):
            blk = np.int64(table[i, j])
            if blk < 0 or blk >= num_blocks:
                return False, fail
            p0 = j * block_size
            for r in range(min(block_size, n - p0)):
                slots[i, p0 + r] = blk * block_size + r
        for p in range(n, max_len):
            slots[i, p] = SKIP_INDEX
    return True, slots


def _block_table_slots_checked(table: np.ndarray, kv_lens, block_size, num_blocks: int, name: str) -> np.ndarray:
    """:func:`slots_from_block_table` with NumPy: the errors and their messages (the first
    offending entry, the count of bad ones), and tables :func:`_block_table_slots` does not take."""
    _check_integer(table, name)
    if int(block_size) < 1:
        raise arg_error(ShapeError, "block_size", "an integer >= 1", block_size)
    kv_lens = np.asarray(kv_lens, dtype=np.int64).reshape(-1)  # [B]
    if (kv_lens < 0).any():
        i = int(np.argmax(kv_lens < 0))
        raise arg_error(ShapeError, f"kv_lens[{i}]", "a token count >= 0", int(kv_lens[i]))
    b = kv_lens.size
    need = -(-kv_lens // block_size)  # [B] blocks each batch reads
    max_need = int(need.max()) if b else 0
    if table.ndim != 2 or table.shape[0] != b or table.shape[1] < max_need:
        raise arg_error(ShapeError, name, f"a 2-D [B={b}, >= {max_need}] table (ceil(max kv length / "
                        f"block_size={block_size}) columns)", f"shape {list(table.shape)}")
    used = np.arange(table.shape[1])[None, :] < need[:, None]  # [B, max_blocks]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bad.any():
        coord = _first_bad(bad)
        raise IndexRangeError(f"{_at(name, coord)} = {int(table[coord])}: expected a block id in "
                              f"[0, {num_blocks}) (the entry covers kv tokens [{coord[1] * block_size}, "
                              f"{min((coord[1] + 1) * block_size, int(kv_lens[coord[0]]))}) of batch {coord[0]}); "
                              f"{int(bad.sum())} needed entries out of range")
    max_len = int(kv_lens.max()) if b else 0
    pos = np.arange(max_len, dtype=np.int64)  # [S2]
    blocks = table[:, :max(max_need, 0)].astype(np.int64)[:, pos // block_size] if max_len else \
        np.zeros((b, 0), np.int64)  # [B, S2]
    slots = blocks * block_size + pos % block_size  # [B, S2]
    return np.where(pos[None, :] < kv_lens[:, None], slots, SKIP_INDEX)


def slots_from_positions(index: np.ndarray, cache_length: int, *, name: str = "index") -> np.ndarray:
    """Norm mode of npu_kv_rmsnorm_rope_cache: ``index[b, s]`` is a position inside batch b.

    Source: ops_reference §4 (``cache[b, 0, index[b, s]]``; -1 skips).

    Args:
        index: integer ``[B, S]``; values in ``[0, cache_length)`` or -1 (skip).
        cache_length: rows per batch in the ``[B, 1, cache_length, D]`` cache.
        name: argument name for errors.

    Returns:
        int64 ``[B*S]`` slots ``b * cache_length + index[b, s]`` (-1 kept).

    Raises:
        DTypeError: not an integer tensor.
        ShapeError: ``index`` is not 2-D.
        IndexRangeError: a value out of range (the message names its coordinates).
    """
    idx = np.asarray(index)
    if idx.ndim != 2:
        raise arg_error(ShapeError, name, "a 2-D [B, S] tensor", f"shape {list(idx.shape)}")
    check_index_range(idx, 0, cache_length, name=name, what="position")
    idx = idx.astype(np.int64)
    b = np.arange(idx.shape[0], dtype=np.int64)[:, None]  # [B, 1]
    return np.where(idx >= 0, b * cache_length + idx, SKIP_INDEX).reshape(-1)


def duplicate_slots(slots: np.ndarray) -> dict[int, list[int]]:
    """Slots written by more than one token.

    Args:
        slots: integer slots of any shape, read flattened; negative values (skips) are ignored.

    Returns:
        ``{slot: [token, token, ...]}`` in increasing slot order, tokens (flat indices) in
        increasing order; empty when every slot is written at most once.
    """
    slots = np.asarray(slots).reshape(-1)
    live = np.flatnonzero(slots >= 0)  # [L] token ids
    if live.size < 2:
        return {}
    order = live[np.argsort(slots[live], kind="stable")]  # tokens sorted by slot, then token
    sorted_slots = slots[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_slots[1:] != sorted_slots[:-1])))
    counts = np.diff(np.append(starts, sorted_slots.size))
    multi = counts > 1  # only repeated slots reach the Python loop
    return {int(sorted_slots[s]): order[s:s + c].tolist() for s, c in zip(starts[multi], counts[multi])}
