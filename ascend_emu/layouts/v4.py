"""DeepSeek-V4 caches: the geometry of every cache one V4 attention layer owns, described once.

Sources (facts; docs/v4.md "The V4 caches" states them with their origin): vllm-ascend
``vllm_ascend/models/layer/attention/layer.py`` (``DSV4_BLOCK_SIZES``: SWA block 128 or 16 tokens;
the compressor state blocks 8 for c4 and 32 for c128 on A2 / A3, 8 and 16 on the Ascend 950),
``vllm_ascend/models/deepseek_v4/compressor.py`` (state cache fp32 ``[blocks, state_bs, 1,
2 * coff * D]``, kv state then score state; ``coff`` 2 for c4, 1 for c128),
``vllm_ascend/models/deepseek_v4/indexer.py`` (indexer: c4 only, 128-wide key; a compressed block
holds ``block_size`` compressed rows, ``block_size * ratio`` original tokens),
``csrc/attention/compressor/README.md`` (state block table ``[B, ceil(Smax / state_bs)]`` indexed
by token position; an entry 0 means "do not update"), and for the Ascend 950
``kv_compress_epilog`` (640-byte fp8 rows, float8_e4m3fn cache) and ``indexer_compress_epilog_v2`` (one
packed uint8 cache ``[blocks, bs, 1, 132]``: per block all fp8 key rows, then all fp32 scales).

Every cache is a one-head paged ``PA_BSND`` cache ``[num_blocks, block_size, 1, W]`` and so a
:class:`~ascend_emu.layouts.paged.CacheLayout` (``ratio`` = original tokens per row). What a row's
bytes mean (the 640-byte row's rope / fp8 / E8M0 / pad fields, the packed indexer offsets) is the
codec's, :mod:`ascend_emu.quant.v4`; this module says which row a token's data lands in:

- SWA (window 128): token ``p`` of a request in row ``p`` of its block-table walk,
  ``block_table[p // bs] * bs + p % bs`` (one row per token);
- compressed caches (c4 of a CSA layer, c128 of an HCA layer; also the c4 indexer key caches):
  compressed row ``c = p // ratio`` holds original tokens ``[c * ratio, (c + 1) * ratio)`` and,
  with ``coff`` 2, draws on the previous group ``[(c - 1) * ratio, c * ratio)`` too; it is written
  when its last token arrives, at ``block_table[c // bs] * bs + c % bs``;
- state caches: token ``p``'s kv and score state rows sit at ``state_block_table[p // sbs] * sbs
  + p % sbs``; a block-table entry 0 means the compressor does not update that block (block 0 is
  reserved), so such a token has no state row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import DTypeError, IndexRangeError, ModeError, ShapeError, arg_error, describe
from .paged import CacheLayout

#: The two V4 cache families: Atlas A2 / A3 (bf16 caches, int8 indexer keys with fp16 scales)
#: and the Ascend 950 (640-byte fp8 rows in float8_e4m3fn caches, one packed uint8 indexer cache).
V4_SOCS = ("a2a3", "950")
#: Latent width D of the shared K/V (448 nope + 64 rope).
V4_HEAD_DIM = 512
#: The rope part of a latent row.
V4_ROPE_DIM = 64
#: Bytes of one Ascend 950 row (``kv_compress_epilog`` layout 1, quant_mode 2, D 512): 128 bytes of
#: bf16 rope, 448 fp8, 7 E8M0 scales, zero padding (equal to ``quant.v4.kv_row_bytes(512)``).
V4_FP8_ROW_BYTES = 640
#: Width of the indexer key (the c4 indexer's compressed key).
V4_INDEXER_DIM = 128
#: Bytes per row of the packed Ascend 950 indexer cache's declared shape: 128 fp8 key bytes + one
#: fp32 scale (the declared last dim; the bytes are laid out per block, not per row).
V4_INDEXER_PACKED_ROW = V4_INDEXER_DIM + 4
#: The sliding window of every V4 layer (tokens).
V4_WINDOW = 128
#: Layer kinds by compression ratio: 1 SWA only, 4 CSA (SWA + top-k of c4), 128 HCA (SWA + all c128).
V4_LAYER_KINDS = {1: "SWA", 4: "CSA", 128: "HCA"}
#: ``coff`` of each compressor ratio (2: the overlapping c4 compressor; 1: c128).
V4_COFF = {4: 2, 128: 1}
#: State block sizes (rows) per SoC family and ratio (vllm-ascend ``DSV4_BLOCK_SIZES``).
V4_STATE_BLOCK_SIZES = {"a2a3": {4: 8, 128: 32}, "950": {4: 8, 128: 16}}
#: SWA block sizes vllm-ascend runs (tokens per block).
DSV4_BLOCK_SIZES = (128, 16)
#: The state block-table entry that means "do not update this block".
STATE_SKIP_BLOCK = 0

#: RoPE bases of the reference model: SWA-only layers, compressed (CSA / HCA) layers.
V4_ROPE_THETA = 10000.0
V4_CMP_ROPE_THETA = 40000.0


def v4_rope_tables(positions: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The rope tables V4's ops read (``compressor_metadata``, ``inplace_partial_rotary_mul`` in
    interleave mode, ``compressor`` with ``rotary_mode`` 2): fp32 cos / sin ``[positions, 64]``,
    row ``p`` = angles ``p * theta ** (-2i / 64)``, each frequency twice (``[c0, c0, c1, c1, ...]``);
    no YaRN.

    Raises:
        ShapeError: positions < 0 or above 2**20.

    Source: the reference model's ``precompute_freqs_cis`` (docs/v4.md "The V4 decode step").
    """
    n = _pos_int("positions", positions, 0)
    if n > 1 << 20:
        raise arg_error(ShapeError, "positions", "at most 2**20 rope rows", n)
    inv = 1.0 / float(theta) ** (np.arange(0, V4_ROPE_DIM, 2, dtype=np.float64) / V4_ROPE_DIM)
    ang = np.repeat(np.arange(n, dtype=np.float64)[:, None] * inv, 2, axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


#: Cache names of one layer, in the order :meth:`V4LayerCaches.caches` lists them.
V4_CACHE_NAMES = ("swa", "compressed", "state", "indexer_key", "indexer_scale", "indexer_packed", "indexer_state")


def _pos_int(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < low:
        raise arg_error(ShapeError, name, f"an integer >= {low}", describe(value))
    return int(value)


def check_soc(soc: str, *, name: str = "soc") -> str:
    """``soc`` if it names a V4 cache family (:data:`V4_SOCS`), else ModeError naming it."""
    if soc not in V4_SOCS:
        raise arg_error(ModeError, name, f"one of {list(V4_SOCS)}", repr(soc))
    return soc


def state_block_size(soc: str, ratio: int) -> int:
    """Rows per state block of the ``ratio`` compressor on ``soc`` (:data:`V4_STATE_BLOCK_SIZES`).

    Raises:
        ModeError: unknown ``soc`` or a ratio with no compressor (only 4 and 128 have one).
    """
    table = V4_STATE_BLOCK_SIZES[check_soc(soc)]
    if ratio not in table:
        raise arg_error(ModeError, "ratio", f"a compressed layer's ratio, one of {sorted(table)}", ratio)
    return table[ratio]


def state_width(coff: int, dim: int) -> int:
    """Elements of one state row: ``2 * coff * dim`` (kv state, then score state)."""
    return 2 * _pos_int("coff", coff) * _pos_int("D", dim)


@dataclass(frozen=True)
class V4Cache:
    """One cache of a V4 layer: its role, dtype and :class:`CacheLayout` (``PA_BSND``, one head).

    Attributes:
        name: one of :data:`V4_CACHE_NAMES`.
        soc: ``"a2a3"`` or ``"950"``.
        layout: the geometry; ``layout.ratio`` original tokens per row (1 for SWA and state rows).
        dtype: NumPy dtype name of the cache tensor (``"bfloat16"``, ``"float8_e4m3fn"``, ``"uint8"``,
            ``"int8"``, ``"float16"``, ``"float32"``): the 950's SWA / compressed caches are
            float8_e4m3fn (a uint8 view of the same bytes is accepted by :meth:`check`), its packed
            indexer cache uint8.
        fields: ``(name, first, stop)`` element ranges of a row: the state's ``kv_state`` and
            ``score_state`` halves; empty where the row's meaning is the codec's.
    """

    name: str
    soc: str
    layout: CacheLayout
    dtype: str
    fields: tuple[tuple[str, int, int], ...] = field(default=())

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The declared shape ``[num_blocks, block_size, 1, W]``."""
        lay = self.layout
        return (lay.num_blocks, lay.block_size, 1, lay.dim)

    @property
    def ratio(self) -> int:
        """Original tokens per row."""
        return self.layout.ratio

    @property
    def block_size(self) -> int:
        """Rows per block."""
        return self.layout.block_size

    @property
    def num_blocks(self) -> int:
        """Blocks in the cache."""
        return self.layout.num_blocks

    def np_dtype(self) -> np.dtype:
        """The cache's NumPy dtype (bfloat16 and float8_e4m3fn through ml_dtypes)."""
        if self.dtype in ("bfloat16", "float8_e4m3fn"):
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, self.dtype))
        return np.dtype(self.dtype)

    def new(self) -> np.ndarray:
        """A zero-filled cache of :attr:`shape` and :attr:`dtype`."""
        return np.zeros(self.shape, self.np_dtype())

    def check(self, cache, *, name: str | None = None) -> None:
        """Raise unless ``cache`` has this cache's declared shape and an element type of its size and kind.

        Args:
            cache: NumPy array (or anything ``np.asarray`` takes).
            name: the argument name for errors (default :attr:`name`).

        Raises:
            DTypeError: another element type (any one-byte type for a one-byte cache: the 950's
                fp8 caches are often handled as uint8 views, and the reverse).
            ShapeError: another shape.
        """
        name = name or self.name
        arr = np.asarray(cache)
        want = self.np_dtype()
        ok = arr.dtype == want
        if not ok and want.itemsize == 1:
            ok = arr.dtype.itemsize == 1 and (arr.dtype.kind in "iu" or "float8" in arr.dtype.name)
        if not ok:
            raise arg_error(DTypeError, name, f"{self.dtype} elements for the {self.soc} {self.name} cache", arr.dtype)
        if tuple(arr.shape) != self.shape:
            raise arg_error(ShapeError, name, f"shape {list(self.shape)} ([num_blocks, block_size, 1, {self.layout.dim}])",
                            list(arr.shape))

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        return {"name": self.name, "soc": self.soc, "dtype": self.dtype, "shape": list(self.shape),
                "ratio": self.ratio, "row_bytes": self.layout.row_bytes,
                "fields": [list(f) for f in self.fields]}


def _cache(name: str, soc: str, num_blocks: int, block_size: int, width: int, dtype: str, ratio: int = 1,
           fields: tuple = ()) -> V4Cache:
    itemsize = {"bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1, "int8": 1, "float8_e4m3fn": 1}[dtype]
    lay = CacheLayout(mode="PA_BSND", num_blocks=num_blocks, block_size=block_size, dim=width, itemsize=itemsize,
                      ratio=ratio)
    return V4Cache(name=name, soc=soc, layout=lay, dtype=dtype, fields=tuple(fields))


def latent_cache(name: str, soc: str, num_blocks: int, block_size: int, ratio: int = 1) -> V4Cache:
    """A SWA (``ratio`` 1) or compressed latent cache: bf16 ``[nb, bs, 1, 512]`` on A2 / A3,
    float8_e4m3fn ``[nb, bs, 1, 640]`` on the 950 (the dtype vllm-ascend allocates and
    ``kv_compress_epilog`` takes; each row's bytes are the 640-byte row).

    Raises:
        ModeError: unknown ``soc``. ShapeError: sizes below 1 (``num_blocks`` may be 0).
    """
    soc = check_soc(soc)
    if soc == "950":
        return _cache(name, soc, num_blocks, block_size, V4_FP8_ROW_BYTES, "float8_e4m3fn", ratio)
    return _cache(name, soc, num_blocks, block_size, V4_HEAD_DIM, "bfloat16", ratio)


def state_cache(name: str, soc: str, num_blocks: int, ratio: int, dim: int = V4_HEAD_DIM,
                block_size: int | None = None) -> V4Cache:
    """A compressor state cache: fp32 ``[nb, state_bs, 1, 2 * coff * dim]`` (kv state then score
    state), ``state_bs`` from :func:`state_block_size` unless given.

    Raises:
        ModeError: unknown ``soc`` or ``ratio``.
    """
    coff = V4_COFF.get(ratio)
    sbs = state_block_size(soc, ratio) if block_size is None else _pos_int("state_block_size", block_size)
    half = coff * _pos_int("D", dim)
    return _cache(name, soc, num_blocks, sbs, 2 * half, "float32", 1,
                  (("kv_state", 0, half), ("score_state", half, 2 * half)))


@dataclass(frozen=True)
class Place:
    """Where one row lives: ``block``, ``row`` in it and the flat ``slot`` (``block * bs + row``);
    ``column`` is the block-table column that names the block."""

    column: int
    block: int
    row: int
    slot: int


@dataclass(frozen=True)
class TokenPlaces:
    """The answer of :meth:`V4LayerCaches.token_places` for one token of one request.

    Attributes:
        position: the token's position in its request.
        swa: its SWA row.
        compressed_row: its compressed row ``c = position // ratio`` (None in a SWA-only layer).
        covers: original tokens ``[first, stop)`` of that row's own group.
        overlap: with ``coff`` 2, the previous group ``[first, stop)`` the row also draws on (None at
            row 0 or with ``coff`` 1).
        complete: whether the row is written once the request holds ``seq_len`` tokens (its last
            token has arrived).
        compressed: where the compressed row lives (None when the block table given does not reach it).
        indexer: where the row's indexer key lives (CSA layers; None otherwise).
        state: the token's state row (None: SWA-only layer, no state block table, or its entry is 0,
            "do not update").
        state_skipped: True when the state block-table entry is 0.
    """

    position: int
    swa: Place
    compressed_row: int | None = None
    covers: tuple[int, int] | None = None
    overlap: tuple[int, int] | None = None
    complete: bool | None = None
    compressed: Place | None = None
    indexer: Place | None = None
    state: Place | None = None
    state_skipped: bool = False

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        from dataclasses import asdict

        return asdict(self)


def place_of(row: int, block_table_row, block_size: int, num_blocks: int, *, name: str) -> Place:
    """The block, row and slot of logical row ``row`` of a request: ``block_table_row[row // bs]``.

    Args:
        row: logical row (a position for SWA / state caches, a compressed row index otherwise), >= 0.
        block_table_row: the request's integer block-table row ``[max_blocks]``.
        block_size: rows per block.
        num_blocks: blocks in the cache (the entry must be in ``[0, num_blocks)``).
        name: the block table's argument name for errors.

    Raises:
        IndexRangeError: ``row`` < 0, a column past the table, or an entry outside the cache.
    """
    table = np.asarray(block_table_row).reshape(-1)
    if table.dtype.kind not in "iu":
        raise arg_error(DTypeError, name, "an integer block table", table.dtype)
    row = int(row)
    if row < 0:
        raise arg_error(IndexRangeError, "position", "a position >= 0", row)
    col, r = divmod(row, block_size)
    if col >= table.size:
        raise arg_error(IndexRangeError, name, f"at least {col + 1} columns to reach row {row} (block size "
                        f"{block_size})", f"{table.size} columns")
    blk = int(table[col])
    if not 0 <= blk < num_blocks:
        raise arg_error(IndexRangeError, f"{name}[{col}]", f"a block id in [0, {num_blocks})", blk)
    return Place(column=col, block=blk, row=r, slot=blk * block_size + r)


@dataclass(frozen=True)
class V4LayerCaches:
    """The caches of one DeepSeek-V4 attention layer: SWA always; a compressed cache and its state
    for CSA (ratio 4) and HCA (ratio 128) layers; for CSA also the indexer caches (A2 / A3: int8
    keys + fp16 scales; 950: one packed uint8 cache) and the indexer compressor's state.

    Attributes:
        soc: ``"a2a3"`` or ``"950"``.
        ratio: 1 (SWA-only layer), 4 (CSA) or 128 (HCA).
        block_size: SWA tokens per block (vllm-ascend: 128 or 16).
        num_blocks: SWA blocks.
        cmp_block_size: compressed rows per block (default ``block_size``); the indexer caches use it too.
        cmp_num_blocks: compressed (and indexer) blocks (default ``num_blocks``).
        state_num_blocks: state blocks (default ``num_blocks``; block 0 is reserved: entry 0 of a
            state block table means "do not update").
        state_block_size: state rows per block (default :func:`state_block_size`).

    Raises:
        ModeError: unknown ``soc`` or ``ratio``. ShapeError: sizes below 1.
    """

    soc: str
    ratio: int
    block_size: int = 128
    num_blocks: int = 4
    cmp_block_size: int | None = None
    cmp_num_blocks: int | None = None
    state_num_blocks: int | None = None
    state_block_size: int | None = None

    def __post_init__(self):
        check_soc(self.soc)
        if self.ratio not in V4_LAYER_KINDS:
            raise arg_error(ModeError, "ratio", f"one of {sorted(V4_LAYER_KINDS)} (SWA, CSA, HCA)", self.ratio)
        _pos_int("block_size", self.block_size)
        _pos_int("num_blocks", self.num_blocks, 0)
        for attr, low, default in (("cmp_block_size", 1, self.block_size), ("cmp_num_blocks", 0, self.num_blocks),
                                   ("state_num_blocks", 0, self.num_blocks)):
            value = getattr(self, attr)
            object.__setattr__(self, attr, default if value is None else _pos_int(attr, value, low))
        if self.ratio > 1:
            sbs = state_block_size(self.soc, self.ratio) if self.state_block_size is None else \
                _pos_int("state_block_size", self.state_block_size)
            object.__setattr__(self, "state_block_size", sbs)

    @property
    def kind(self) -> str:
        """``"SWA"``, ``"CSA"`` or ``"HCA"``."""
        return V4_LAYER_KINDS[self.ratio]

    @property
    def coff(self) -> int | None:
        """The compressor's ``coff`` (None in a SWA-only layer)."""
        return V4_COFF.get(self.ratio)

    def caches(self) -> dict[str, V4Cache]:
        """Every cache of the layer by name (:data:`V4_CACHE_NAMES` order, absent ones left out)."""
        out = {"swa": latent_cache("swa", self.soc, self.num_blocks, self.block_size)}
        if self.ratio == 1:
            return out
        out["compressed"] = latent_cache("compressed", self.soc, self.cmp_num_blocks, self.cmp_block_size, self.ratio)
        out["state"] = state_cache("state", self.soc, self.state_num_blocks, self.ratio,
                                   block_size=self.state_block_size)
        if self.ratio == 4:
            nb, bs = self.cmp_num_blocks, self.cmp_block_size
            if self.soc == "a2a3":
                out["indexer_key"] = _cache("indexer_key", self.soc, nb, bs, V4_INDEXER_DIM, "int8", 4)
                out["indexer_scale"] = _cache("indexer_scale", self.soc, nb, bs, 1, "float16", 4)
            else:
                out["indexer_packed"] = _cache("indexer_packed", self.soc, nb, bs, V4_INDEXER_PACKED_ROW, "uint8", 4)
            out["indexer_state"] = state_cache("indexer_state", self.soc, self.state_num_blocks, 4,
                                               dim=V4_INDEXER_DIM, block_size=self.state_block_size)
        return out

    def new(self) -> dict[str, np.ndarray]:
        """Zero-filled arrays of every cache (:meth:`caches`)."""
        return {k: c.new() for k, c in self.caches().items()}

    def check(self, arrays: Mapping[str, object]) -> None:
        """Raise unless ``arrays`` holds exactly this layer's caches, each of its shape and dtype.

        Raises:
            ModeError: a missing or unexpected cache name. DTypeError / ShapeError: as :meth:`V4Cache.check`.
        """
        want = self.caches()
        if set(arrays) != set(want):
            raise arg_error(ModeError, "caches", f"the caches {list(want)} of a {self.soc} {self.kind} layer",
                            sorted(arrays))
        for k, c in want.items():
            c.check(arrays[k], name=k)

    def compressed_rows(self, seq_len: int) -> int:
        """Completed compressed rows of a request holding ``seq_len`` tokens: ``seq_len // ratio``
        (0 in a SWA-only layer)."""
        return _pos_int("seq_len", seq_len, 0) // self.ratio if self.ratio > 1 else 0

    def token_places(self, position: int, block_table_row, *, cmp_block_table_row=None,
                     state_block_table_row=None, indexer_block_table_row=None,
                     seq_len: int | None = None) -> TokenPlaces:
        """Where token ``position`` of one request lives in each cache of the layer.

        Args:
            position: the token's position in its request (>= 0).
            block_table_row: the request's SWA block-table row (integers).
            cmp_block_table_row: its compressed-cache block-table row (default: ``block_table_row``).
            state_block_table_row: its state block-table row (None: no state answer).
            indexer_block_table_row: its indexer block-table row (default: the compressed one).
            seq_len: tokens the request holds (default ``position + 1``), for :attr:`TokenPlaces.complete`.

        Returns:
            :class:`TokenPlaces` (module docstring: the rules).

        Raises:
            IndexRangeError: a negative position, a block table too short for the SWA or state row,
                or an entry outside its cache (the compressed row of a table too short is None).
        """
        pos = int(position)
        swa = place_of(pos, block_table_row, self.block_size, self.num_blocks, name="block_table")
        if self.ratio == 1:
            return TokenPlaces(position=pos, swa=swa)
        r = self.ratio
        c = pos // r
        held = pos + 1 if seq_len is None else _pos_int("seq_len", seq_len, 0)
        covers = (c * r, (c + 1) * r)
        overlap = ((c - 1) * r, c * r) if self.coff == 2 and c > 0 else None
        cmp_table = block_table_row if cmp_block_table_row is None else cmp_block_table_row
        cmp = self._row_place(c, cmp_table, "cmp_block_table")
        idx = None
        if self.ratio == 4:
            idx_table = cmp_table if indexer_block_table_row is None else indexer_block_table_row
            idx = self._row_place(c, idx_table, "indexer_block_table")
        state, skipped = None, False
        if state_block_table_row is not None:
            table = np.asarray(state_block_table_row).reshape(-1)
            col = pos // self.state_block_size
            if col < table.size and int(table[col]) == STATE_SKIP_BLOCK:
                skipped = True
            else:
                state = place_of(pos, table, self.state_block_size, self.state_num_blocks, name="state_block_table")
        return TokenPlaces(position=pos, swa=swa, compressed_row=c, covers=covers, overlap=overlap,
                           complete=covers[1] <= held, compressed=cmp, indexer=idx, state=state,
                           state_skipped=skipped)

    def _row_place(self, c: int, table, name: str) -> Place | None:
        t = np.asarray(table).reshape(-1)
        if c // self.cmp_block_size >= t.size:
            return None
        return place_of(c, t, self.cmp_block_size, self.cmp_num_blocks, name=name)

    def to_dict(self) -> dict:
        """Plain data (JSON-ready): the layer's parameters and every cache's description."""
        return {"soc": self.soc, "ratio": self.ratio, "kind": self.kind, "block_size": self.block_size,
                "num_blocks": self.num_blocks, "cmp_block_size": self.cmp_block_size,
                "cmp_num_blocks": self.cmp_num_blocks, "state_block_size": self.state_block_size,
                "state_num_blocks": self.state_num_blocks, "coff": self.coff,
                "caches": {k: c.to_dict() for k, c in self.caches().items()}}


def swa_slots(positions: Sequence[int], block_table_row, block_size: int, num_blocks: int, *,
              name: str = "block_table") -> np.ndarray:
    """Flat SWA slots (int64 ``[n]``) of positions ``positions`` of one request
    (``block_table_row[p // bs] * bs + p % bs``), every entry checked (:func:`place_of`).

    Raises:
        As :func:`place_of`.
    """
    return np.array([place_of(p, block_table_row, block_size, num_blocks, name=name).slot for p in positions],
                    dtype=np.int64)


__all__ = [
    "DSV4_BLOCK_SIZES", "STATE_SKIP_BLOCK", "V4_CACHE_NAMES", "V4_COFF", "V4_FP8_ROW_BYTES", "V4_HEAD_DIM",
    "V4_INDEXER_DIM", "V4_INDEXER_PACKED_ROW", "V4_LAYER_KINDS", "V4_ROPE_DIM", "V4_SOCS", "V4_STATE_BLOCK_SIZES",
    "V4_WINDOW", "Place", "TokenPlaces", "V4Cache", "V4LayerCaches", "check_soc", "latent_cache", "place_of",
    "state_block_size", "state_cache", "state_width", "swa_slots",
]
