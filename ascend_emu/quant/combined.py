"""Combined per-tile cache rows: ``[d_nope int8 | d_rope bf16 | d_nope/tile_size fp32 scales]``.

Source: ops_reference §2.2 (npu_mla_prolog_v3 ``kv_cache_quant_mode=3``, written by
``RmsNormAndScatterCkv`` / ``RopeAndScatterKr``) and §5.1 (the same bytes are what
npu_kv_quant_sparse_flash_attention reads: rope at byte 512, scales at byte 640).

For MLA (512 / 64 / 128) one token row is 656 bytes, little-endian:

======  ==============================================================
bytes   content
======  ==============================================================
0-511   512 x int8 k_nope; tile j covers bytes 128j .. 128j+127
512-639 64 x bf16 k_rope, de-interleaved ("half") order (§1.1)
640-655 4 x fp32 dequant scales, tile 0..3 (``x ~= q * scale``)
======  ==============================================================

DeepSeek FlashMLA's 656-byte FP8 row orders the parts nope | scales | rope; the two are not
byte-compatible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError, ShapeError, arg_error
from .rounding import BF16

NOPE_DIM = 512
ROPE_DIM = 64
TILE_SIZE = 128
BF16_BYTES = 2
FP32_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class CombinedRowFormat:
    """Byte layout of one combined row.

    Attributes:
        d_nope: int8 k_nope elements (Hckv).
        d_rope: bf16 k_rope elements (Dr).
        tile_size: nope elements per fp32 scale.
    """

    d_nope: int = NOPE_DIM
    d_rope: int = ROPE_DIM
    tile_size: int = TILE_SIZE

    def __post_init__(self):
        if self.tile_size <= 0 or self.d_nope % self.tile_size:
            raise arg_error(ShapeError, "tile_size", f"a positive divisor of d_nope={self.d_nope}",
                            self.tile_size)

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

        ``field`` is ``"k_nope"``, ``"k_rope"`` or ``"scale"``; for a scale the element is the
        tile index.

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
            k_nope: int8 ``[..., d_nope]``.
            k_rope: bf16 ``[..., d_rope]``.
            scales: fp32 ``[..., d_nope / tile_size]`` dequant scales.

        Returns:
            int8 ``[..., row_bytes]``.

        Raises:
            DTypeError / ShapeError: a part of the wrong dtype or shape.
        """
        k_nope = self._part(k_nope, "k_nope", np.int8, self.d_nope)
        k_rope = self._part(k_rope, "k_rope", BF16, self.d_rope)
        scales = self._part(scales, "scales", np.float32, self.num_tiles)
        lead = k_nope.shape[:-1]
        if k_rope.shape[:-1] != lead or scales.shape[:-1] != lead:
            raise arg_error(ShapeError, "k_rope/scales", f"leading dims {lead} like k_nope",
                            (k_rope.shape[:-1], scales.shape[:-1]))
        rows = np.empty((*lead, self.row_bytes), dtype=np.int8)  # [..., 656]
        u8 = rows.view(np.uint8)
        u8[..., : self.rope_offset] = k_nope.view(np.uint8)
        u8[..., self.rope_offset: self.scale_offset] = np.ascontiguousarray(k_rope).view(np.uint8)
        u8[..., self.scale_offset:] = np.ascontiguousarray(scales).view(np.uint8)
        return rows

    def unpack(self, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Split rows into ``(k_nope int8 [..., d_nope], k_rope bf16 [..., d_rope],
        scales fp32 [..., num_tiles])`` (copies).

        Raises:
            DTypeError / ShapeError: rows not int8 / uint8 ``[..., row_bytes]``.
        """
        rows = np.asarray(rows)
        if rows.dtype not in (np.int8, np.uint8):
            raise arg_error(DTypeError, "rows", "int8 combined rows", rows.dtype)
        if rows.shape[-1:] != (self.row_bytes,):
            raise arg_error(ShapeError, "rows", f"last dim {self.row_bytes}", rows.shape)
        u8 = np.ascontiguousarray(rows).view(np.uint8)
        k_nope = u8[..., : self.rope_offset].copy().view(np.int8)
        k_rope = u8[..., self.rope_offset: self.scale_offset].copy().view(BF16)
        scales = u8[..., self.scale_offset:].copy().view(np.float32)
        return k_nope, k_rope, scales

    def dequantize(self, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(k_nope fp32 = int8 * scale of its tile, k_rope bf16, scales fp32)`` of rows."""
        k_nope, k_rope, scales = self.unpack(rows)
        lead = k_nope.shape[:-1]
        deq = (k_nope.astype(np.float32).reshape(*lead, self.num_tiles, self.tile_size)
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
ROW_BYTES = MLA_ROW.row_bytes
ROPE_OFFSET = MLA_ROW.rope_offset
SCALE_OFFSET = MLA_ROW.scale_offset
