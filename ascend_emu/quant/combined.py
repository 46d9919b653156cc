"""Combined per-tile cache rows: ``[d_nope int8 | d_rope bf16 | d_nope/tile_size fp32 scales]``.

Source: docs/sources.md#per_tile_rows (npu_mla_prolog_v3 ``kv_cache_quant_mode=3``, written by
``RmsNormAndScatterCkv`` / ``RopeAndScatterKr``) and docs/sources.md#npu_kv_quant_sparse_flash_attention (the same bytes are what
npu_kv_quant_sparse_flash_attention reads: rope at byte 512, scales at byte 640).

For MLA (512 / 64 / 128) one token row is 656 bytes, little-endian:

======  ==============================================================
bytes   content
======  ==============================================================
0-511   512 x int8 k_nope; tile j covers bytes 128j .. 128j+127
512-639 64 x bf16 k_rope, de-interleaved ("half") order (docs/sources.md#rope)
640-655 4 x fp32 dequant scales, tile 0..3 (``x ~= q * scale``)
======  ==============================================================

DeepSeek FlashMLA's 656-byte FP8 row orders the parts nope | scales | rope; the two are not
byte-compatible.

The Ascend 950 keeps this row and changes only the element type of bytes 0-511
(:data:`NOPE_ELEMENTS`): ``int8``, ``hifloat8`` or ``float8_e4m3fn`` codes, one byte each, at the
same offsets, with the same 64 query-dtype rope values and 4 fp32 tile scales, value
``decode(byte) * scale`` (op-plugin ``docs/zh/custom_APIs/torch_npu/
torch_npu-npu_kv_quant_sparse_flash_attention.md``: key / value dtypes ``int8`` / ``hifloat8`` /
``float8_e4m3fn``, "KV_D 仅支持656，即nope+rope*2+dequant_scale*4=512+64*2+4*4"; its 950 golden
``test_npu_kv_quant_sparse_flash_attention_hif8`` concatenates HiF8 codes, bf16 rope bytes and
fp32 scales in this order; vllm-ascend ``vllm_ascend/attention/sfa_v1.py`` ``custom_kv_rmsnorm_rope``
builds the A5 row from float8_e4m3fn k_nope and fp32 per-128 scales). A cache of such rows is
carried as int8 (int8 elements), uint8 (HiF8: torch_npu has no hifloat8 tensor dtype) or
ml_dtypes ``float8_e4m3fn`` (:data:`NOPE_CACHE_DTYPES`); :data:`MLA_ROWS` has one
:class:`CombinedRowFormat` per element type.

The byte offsets of the MLA row are the constants :data:`NOPE_OFFSET` (0), :data:`ROPE_OFFSET`
(512), :data:`SCALE_OFFSET` (640) and :data:`ROW_BYTES` (656). :func:`read_combined_cache` reads
rows back out of a whole cache (PA_BSND, BSND or TND).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import ml_dtypes

from ..errors import DTypeError, IndexRangeError, ModeError, ShapeError, arg_error
from .hifloat8 import HIF8_VALUES
from .rounding import BF16

from ..mla import D_ROPE as ROPE_DIM
from ..mla import HCKV as NOPE_DIM
from ..mla import TILE_SIZE

BF16_BYTES = 2
FP32_BYTES = 4

#: Element types of the k_nope bytes of a combined row (int8: Atlas A2 / A3 and Ascend 950;
#: hifloat8 / float8_e4m3fn: Ascend 950 only).
NOPE_ELEMENTS = ("int8", "hifloat8", "float8_e4m3fn")
#: The array dtype a cache of each element type is carried as (HiF8 codes as uint8, as torch_npu).
NOPE_CACHE_DTYPES = {"int8": np.dtype(np.int8), "hifloat8": np.dtype(np.uint8),
                     "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn)}


def _byte_values(element: str) -> np.ndarray:
    """fp32 ``[256]``: the value of each byte ``0x00 .. 0xFF`` read as ``element`` (exact)."""
    codes = np.arange(256, dtype=np.uint8)
    if element == "hifloat8":
        table = HIF8_VALUES.copy()
    else:
        table = codes.view(NOPE_CACHE_DTYPES[element]).astype(np.float32)
    table.flags.writeable = False
    return table


#: fp32 value of each byte of the k_nope part, per element type, indexed by the byte as uint8.
NOPE_BYTE_VALUES = {element: _byte_values(element) for element in NOPE_ELEMENTS}


def _byte_ordinals(element: str) -> np.ndarray:
    """int64 ``[256]``: each byte's place in value order (``sign * rank of |value|`` among the
    type's non-negative magnitudes, Inf included; the zeros 0), so two bytes are ``|a - b|`` of
    the type's own ulps apart; NaN bytes get 0 (callers mask NaNs)."""
    vals = NOPE_BYTE_VALUES[element].astype(np.float64)
    mags = np.unique(np.abs(vals[~np.isnan(vals)]))  # sorted, 0 first
    with np.errstate(invalid="ignore"):
        rank = np.searchsorted(mags, np.abs(np.nan_to_num(vals, nan=0.0)))
    out = np.where(np.signbit(vals), -rank, rank).astype(np.int64)
    out.flags.writeable = False
    return out


#: Place in value order of each byte, per element type (:func:`_byte_ordinals`): the ulp distance
#: of HiF8 codes (whose bit patterns are not in value order), FP8 and int8 alike.
NOPE_BYTE_ORDINALS = {element: _byte_ordinals(element) for element in NOPE_ELEMENTS}


@dataclass(frozen=True, kw_only=True)
class CombinedRowFormat:
    """Byte layout of one combined row: ``[d_nope int8 | d_rope bf16 | num_tiles fp32]``.

    Attributes:
        d_nope: one-byte k_nope elements (Hckv).
        d_rope: bf16 k_rope elements (Dr).
        tile_size: nope elements per fp32 scale.
        nope_element: the k_nope element type, one of :data:`NOPE_ELEMENTS` (default int8).

    Raises:
        ShapeError: ``tile_size`` is not a positive divisor of ``d_nope``.
        ModeError: an unknown ``nope_element``.
    """

    d_nope: int = NOPE_DIM
    d_rope: int = ROPE_DIM
    tile_size: int = TILE_SIZE
    nope_element: str = "int8"

    def __post_init__(self):
        if self.tile_size <= 0 or self.d_nope % self.tile_size:
            raise arg_error(ShapeError, "tile_size", f"a positive divisor of d_nope={self.d_nope}",
                            self.tile_size)
        if self.nope_element not in NOPE_ELEMENTS:
            raise arg_error(ModeError, "nope_element", f"one of {list(NOPE_ELEMENTS)}", repr(self.nope_element))

    @property
    def cache_dtype(self) -> np.dtype:
        """The dtype a cache of these rows is carried as (int8, uint8 for HiF8, float8_e4m3fn)."""
        return NOPE_CACHE_DTYPES[self.nope_element]

    def decode_nope(self, codes) -> np.ndarray:
        """fp32 values of k_nope bytes (exact): ``codes`` any array of one-byte items (int8,
        uint8, float8_e4m3fn), read as :attr:`nope_element`; new array of ``codes``' shape."""
        codes = np.asarray(codes)
        if codes.dtype.itemsize != 1:
            raise arg_error(DTypeError, "codes", "one-byte k_nope codes", codes.dtype)
        return NOPE_BYTE_VALUES[self.nope_element][np.ascontiguousarray(codes).view(np.uint8)]

    @property
    def nope_offset(self) -> int:
        """First byte of k_nope (0)."""
        return 0

    @property
    def rope_offset(self) -> int:
        """First byte of k_rope (512)."""
        return self.d_nope

    @property
    def scale_offset(self) -> int:
        """First byte of the scales (640)."""
        return self.d_nope + self.d_rope * BF16_BYTES

    @property
    def num_tiles(self) -> int:
        """Scales per row (4)."""
        return self.d_nope // self.tile_size

    @property
    def row_bytes(self) -> int:
        """Bytes per row (656)."""
        return self.scale_offset + self.num_tiles * FP32_BYTES

    def field_of_byte(self, byte: int) -> tuple[str, int, int]:
        """``(field, element, byte_in_element)`` of byte ``byte`` of a row.

        ``field`` is ``"k_nope"``, ``"k_rope"`` or ``"scale"``; ``element`` is the k_nope / k_rope
        element or, for a scale, the tile index; ``byte_in_element`` counts little-endian bytes
        (0 for k_nope, 0-1 for k_rope, 0-3 for a scale). MLA row: bytes 0-511 -> k_nope,
        512-639 -> k_rope 0-63, 640-655 -> scale 0-3.

        Raises:
            ShapeError: byte outside ``[0, row_bytes)``.
        """
        b = int(byte)
        if not 0 <= b < self.row_bytes:
            raise arg_error(ShapeError, "byte", f"a byte in [0, {self.row_bytes})", b)
        if b < self.rope_offset:
            return ("k_nope", b, 0)
        if b < self.scale_offset:
            e, k = divmod(b - self.rope_offset, BF16_BYTES)
            return ("k_rope", e, k)
        e, k = divmod(b - self.scale_offset, FP32_BYTES)
        return ("scale", e, k)

    # ------------------------------------------------------------------ pack / unpack
    def pack(self, k_nope, k_rope, scales) -> np.ndarray:
        """Build rows from their parts.

        Args:
            k_nope: ``[..., d_nope]`` of :attr:`cache_dtype` (int8 for the int8 row).
            k_rope: bf16 ``[..., d_rope]``.
            scales: fp32 ``[..., d_nope / tile_size]`` dequant scales.

        Returns:
            ``[..., row_bytes]`` of :attr:`cache_dtype`.

        Raises:
            DTypeError / ShapeError: a part of the wrong dtype or shape.
        """
        k_nope = self._part(k_nope, "k_nope", self.cache_dtype, self.d_nope)
        k_rope = self._part(k_rope, "k_rope", BF16, self.d_rope)
        scales = self._part(scales, "scales", np.float32, self.num_tiles)
        lead = k_nope.shape[:-1]
        if k_rope.shape[:-1] != lead or scales.shape[:-1] != lead:
            raise arg_error(ShapeError, "k_rope/scales", f"leading dims {lead} like k_nope",
                            (k_rope.shape[:-1], scales.shape[:-1]))
        rows = np.empty((*lead, self.row_bytes), dtype=self.cache_dtype)  # [..., 656]
        u8 = rows.view(np.uint8)
        u8[..., : self.rope_offset] = np.ascontiguousarray(k_nope).view(np.uint8)
        u8[..., self.rope_offset: self.scale_offset] = np.ascontiguousarray(k_rope).view(np.uint8)
        u8[..., self.scale_offset:] = np.ascontiguousarray(scales).view(np.uint8)
        return rows

    def unpack(self, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Split rows into ``(k_nope [..., d_nope] of cache_dtype, k_rope bf16 [..., d_rope],
        scales fp32 [..., num_tiles])`` (copies).

        Raises:
            DTypeError / ShapeError: rows not int8 / uint8 / cache_dtype ``[..., row_bytes]``.
        """
        rows = np.asarray(rows)
        if rows.dtype not in (np.int8, np.uint8, self.cache_dtype):
            raise arg_error(DTypeError, "rows", f"combined rows as int8, uint8 or {self.cache_dtype.name}",
                            rows.dtype)
        if rows.shape[-1:] != (self.row_bytes,):
            raise arg_error(ShapeError, "rows", f"last dim {self.row_bytes}", rows.shape)
        u8 = np.ascontiguousarray(rows).view(np.uint8)
        k_nope = u8[..., : self.rope_offset].copy().view(self.cache_dtype)
        k_rope = u8[..., self.rope_offset: self.scale_offset].copy().view(BF16)
        scales = u8[..., self.scale_offset:].copy().view(np.float32)
        return k_nope, k_rope, scales

    def dequantize(self, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unpack rows and dequantize k_nope (docs/sources.md#per_tile_rows, docs/sources.md#npu_kv_quant_sparse_flash_attention).

        Args:
            rows: int8 / uint8 ``[..., row_bytes]``.

        Returns:
            ``(k_nope, k_rope, scales)``: fp32 ``[..., d_nope]`` = ``fp32(element) * scale`` of
            its tile (one fp32 multiply, exact widening of the int8 / HiF8 / FP8 element), bf16
            ``[..., d_rope]``, fp32 ``[..., num_tiles]``.

        Raises:
            DTypeError / ShapeError: as :meth:`unpack`.
        """
        k_nope, k_rope, scales = self.unpack(rows)
        lead = k_nope.shape[:-1]
        deq = (self.decode_nope(k_nope).reshape(*lead, self.num_tiles, self.tile_size)
               * scales[..., None]).reshape(*lead, self.d_nope)
        return deq, k_rope, scales

    @staticmethod
    def _part(a, name: str, dtype, last: int) -> np.ndarray:
        a = np.asarray(a)
        if a.dtype != np.dtype(dtype):
            raise arg_error(DTypeError, name, np.dtype(dtype).name, a.dtype)
        if a.shape[-1:] != (last,):
            raise arg_error(ShapeError, name, f"last dim {last}", a.shape)
        return a


#: The MLA row: 512 int8 | 64 bf16 | 4 fp32 = 656 bytes.
MLA_ROW = CombinedRowFormat()
#: First byte of k_nope in an MLA row.
NOPE_OFFSET = MLA_ROW.nope_offset  # 0
#: First byte of k_rope in an MLA row.
ROPE_OFFSET = MLA_ROW.rope_offset  # 512
#: First byte of the fp32 scales in an MLA row.
SCALE_OFFSET = MLA_ROW.scale_offset  # 640
#: Bytes per MLA row.
ROW_BYTES = MLA_ROW.row_bytes  # 656
#: Scales per MLA row.
NUM_TILES = MLA_ROW.num_tiles  # 4
#: The MLA row per k_nope element type (the Ascend 950's hifloat8 / float8_e4m3fn rows: same bytes).
MLA_ROWS = {element: CombinedRowFormat(nope_element=element) for element in NOPE_ELEMENTS}


def read_combined_cache(kv_cache, *, slot: int | None = None, block: int | None = None,
                        row_format: CombinedRowFormat = MLA_ROW
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read combined rows back out of a per-tile int8 KV cache, dequantized.

    The cache is what ``npu_mla_prolog_v3`` writes with ``kv_cache_quant_mode=3`` and what
    ``npu_kv_quant_sparse_flash_attention`` reads as ``key`` / ``value`` (docs/sources.md#per_tile_rows,
    docs/sources.md#npu_kv_quant_sparse_flash_attention). Rows are addressed by slot = ``block * BlockSize + row`` (PA_BSND: the
    ``cache_index`` value; BSND: ``b * S + s``; TND: ``t``).

    Args:
        kv_cache: ``row_format.cache_dtype`` (int8 for :data:`MLA_ROW`; uint8 / float8_e4m3fn for
            the 950's HiF8 / FP8 rows, :data:`MLA_ROWS`)
            ``[BlockNum, BlockSize, 1, row_bytes]`` (PA_BSND), ``[B, S, 1, row_bytes]``
            (BSND) or ``[T, 1, row_bytes]`` (TND); row_bytes is 656 for :data:`MLA_ROW`. Any
            strides.
        slot: read the one row at this slot, in ``[0, BlockNum * BlockSize)`` (TND: ``[0, T)``).
        block: read every row of this block (PA_BSND) / batch (BSND), in ``[0, BlockNum)``;
            not for a TND cache. At most one of ``slot`` and ``block`` may be given.
        row_format: the row layout.

    Returns:
        ``(k_nope, k_rope, scales)``: k_nope dequantized, fp32 ``[..., d_nope]``
        (``element * scale`` of its tile); k_rope bf16 ``[..., d_rope]``; scales fp32
        ``[..., num_tiles]``. ``...`` is the cache's shape without its last dim, minus the
        indexed dims: whole cache ``[BlockNum, BlockSize, 1]`` / ``[B, S, 1]`` / ``[T, 1]``;
        one block ``[BlockSize, 1]``; one slot ``[1]``. New arrays; the cache is not modified.

    Raises:
        DTypeError: ``kv_cache`` is not of ``row_format.cache_dtype``.
        ShapeError: not a 3-D / 4-D cache with Nkv = 1 and last dim ``row_bytes``.
        ModeError: both ``slot`` and ``block`` given, or ``block`` for a 3-D TND cache.
        IndexRangeError: ``slot`` or ``block`` out of range.
    """
    kv_cache = np.asarray(kv_cache)
    if kv_cache.dtype != row_format.cache_dtype:
        raise arg_error(DTypeError, "kv_cache", f"an {row_format.cache_dtype.name} combined-row cache "
                        f"({row_format.nope_element} k_nope)", kv_cache.dtype)
    if kv_cache.ndim not in (3, 4) or kv_cache.shape[-1] != row_format.row_bytes or kv_cache.shape[-2] != 1:
        raise arg_error(ShapeError, "kv_cache",
                        f"[BlockNum, BlockSize, 1, {row_format.row_bytes}] (PA_BSND), "
                        f"[B, S, 1, {row_format.row_bytes}] (BSND) or [T, 1, {row_format.row_bytes}] (TND)",
                        list(kv_cache.shape))
    if slot is not None and block is not None:
        raise arg_error(ModeError, "slot/block", "at most one of slot and block", (slot, block))
    rows = kv_cache  # [..., 1, row_bytes]
    if block is not None:
        if kv_cache.ndim == 3:
            raise arg_error(ModeError, "block", "None for a 3-D TND cache [T, 1, row_bytes] (use slot)",
                            block)
        block = int(block)
        if not 0 <= block < kv_cache.shape[0]:
            raise arg_error(IndexRangeError, "block", f"a block in [0, {kv_cache.shape[0]})", block)
        rows = kv_cache[block]  # [BlockSize, 1, row_bytes]
    elif slot is not None:
        slot = int(slot)
        lead = kv_cache.shape[:-2]  # [BlockNum, BlockSize] or [T]
        num_rows = int(np.prod(lead))
        if not 0 <= slot < num_rows:
            raise arg_error(IndexRangeError, "slot", f"a slot in [0, {num_rows})", slot)
        rows = kv_cache[np.unravel_index(slot, lead)]  # [1, row_bytes]
    return row_format.dequantize(rows)
