"""DeepSeek-V4 cache views: one 640-byte row decoded, where a request's token lives in each cache
of a layer, and the block view of a layer's SWA, compressed and state caches.

Built on :mod:`ascend_emu.layouts.v4` (which row: :class:`~ascend_emu.layouts.V4LayerCaches`) and
:mod:`ascend_emu.quant.v4` (what the row's bytes mean: :func:`~ascend_emu.quant.v4.split_kv_rows`,
:func:`~ascend_emu.quant.v4.decode_kv_rows`). Sources: docs/v4.md ("The V4 caches", "The 640-byte
row").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from ..errors import IndexRangeError, ModeError, ShapeError, arg_error, describe
from ..layouts import V4_FP8_ROW_BYTES, V4_HEAD_DIM, TokenPlaces, V4LayerCaches
from ..layouts.v4 import STATE_SKIP_BLOCK, place_of
from ..quant import v4 as qv4
from .blocks import BlockMap, blocks


@dataclass(frozen=True)
class V4Row:
    """One decoded 640-byte row (``kv_compress_epilog`` layout 1, quant_mode 2, D 512).

    Attributes:
        fields: ``(name, first_byte, stop_byte)`` of ``rope`` (bf16), ``values`` (fp8 E4M3FN),
            ``scales`` (E8M0) and ``pad``.
        rope: the 64 rope values (bf16 read exactly as floats).
        scale_bytes: the 7 E8M0 bytes; ``scale_exponents`` their ``byte - 127``; ``scales`` the
            factors ``2**(byte - 127)`` (NaN for 0xFF).
        values_fp8: the 448 fp8 values as floats (before the scale).
        values: the 448 values dequantized: ``fp8 * scale`` of their group of 64.
        pad: the padding bytes; ``pad_zero`` whether all are zero (as every writer leaves them).
    """

    fields: list[tuple[str, int, int]]
    rope: list[float]
    scale_bytes: list[int]
    scale_exponents: list[int]
    scales: list[float]
    values_fp8: list[float]
    values: list[float]
    pad: list[int]
    pad_zero: bool

    def to_dict(self) -> dict:
        """Plain data (JSON-ready; NaN as None)."""
        out = asdict(self)
        for key in ("rope", "scales", "values_fp8", "values"):
            out[key] = [None if v != v else v for v in out[key]]
        out["fields"] = [list(f) for f in self.fields]
        return out


def v4_row(row) -> V4Row:
    """Decode one 640-byte V4 cache row: rope, fp8 values with their E8M0 scales, padding.

    Args:
        row: 640 bytes (float8_e4m3fn, uint8 or another one-byte type; any shape holding 640 elements).

    Returns:
        A :class:`V4Row`.

    Raises:
        ShapeError / DTypeError: not 640 one-byte elements.
    """
    arr = np.asarray(row)
    if arr.size != V4_FP8_ROW_BYTES or arr.dtype.itemsize != 1:
        raise arg_error(ShapeError, "row", f"{V4_FP8_ROW_BYTES} one-byte elements (one V4 fp8 row)", describe(arr))
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).reshape(1, V4_FP8_ROW_BYTES)
    rope, values, scales, pad = qv4.split_kv_rows(raw, V4_HEAD_DIM, quant_mode=2)
    decoded = qv4.decode_kv_rows(raw, V4_HEAD_DIM, quant_mode=2)  # [1, 512]
    q = V4_HEAD_DIM - qv4.KV_ROPE_DIM
    n = scales.shape[1]
    sb = scales[0].astype(np.int64)
    factors = np.where(sb == 0xFF, np.nan, np.ldexp(1.0, sb - 127))
    rope_end = qv4.KV_ROPE_BYTES
    fields = [("rope", 0, rope_end), ("values", rope_end, rope_end + q), ("scales", rope_end + q, rope_end + q + n),
              ("pad", rope_end + q + n, V4_FP8_ROW_BYTES)]
    return V4Row(fields=fields, rope=rope[0].astype(np.float64).tolist(), scale_bytes=sb.tolist(),
                 scale_exponents=(sb - 127).tolist(), scales=factors.tolist(),
                 values_fp8=values[0].astype(np.float64).tolist(), values=decoded[0, :q].astype(np.float64).tolist(),
                 pad=pad[0].tolist(), pad_zero=bool(not pad.any()))


def v4_cache_row(cache, slot: int) -> V4Row:
    """Decode the row at flat ``slot`` of a 950 SWA or compressed cache ``[nb, bs, 1, 640]``
    (float8_e4m3fn, or its bytes as uint8, or those bytes flat as a cache file holds them).

    Raises:
        ShapeError: a cache whose rows are not 640 bytes. IndexRangeError: ``slot`` outside the cache.
    """
    arr = np.asarray(cache)
    if arr.dtype.itemsize != 1 or arr.size % V4_FP8_ROW_BYTES or (arr.ndim > 1 and arr.shape[-1] != V4_FP8_ROW_BYTES):
        raise arg_error(ShapeError, "cache", f"a one-byte cache of {V4_FP8_ROW_BYTES}-byte rows ([nb, bs, 1, "
                        f"{V4_FP8_ROW_BYTES}], or its bytes flat)", describe(arr))
    rows = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).reshape(-1, V4_FP8_ROW_BYTES)
    if not 0 <= int(slot) < rows.shape[0]:
        raise arg_error(IndexRangeError, "slot", f"a slot in [0, {rows.shape[0]})", slot)
    return v4_row(rows[int(slot)])


def v4_token(layer: V4LayerCaches, position: int, block_table_row, **tables) -> TokenPlaces:
    """Where token ``position`` of a request lives in each cache of ``layer``: its SWA slot, its
    compressed row (and the original tokens that row covers), its indexer row and its state row.
    Keyword arguments as :meth:`ascend_emu.layouts.V4LayerCaches.token_places`."""
    return layer.token_places(position, block_table_row, **tables)


@dataclass(frozen=True)
class StateRun:
    """Positions ``[first, stop)`` of one request in rows ``[row, row + stop - first)`` of state
    block ``block`` (table column ``column``); ``block`` None: entry 0, not updated."""

    column: int
    block: int | None
    first: int
    stop: int
    row: int


@dataclass(frozen=True)
class V4Blocks:
    """The three caches of one layer as block views (:func:`v4_blocks`).

    Attributes:
        layer: the layer's description (:meth:`V4LayerCaches.to_dict`).
        swa: the SWA cache: every token of every request.
        compressed: the compressed cache: each request's completed rows (``seq_len // ratio``);
            None in a SWA-only layer.
        state: per request, its state block-table columns as :class:`StateRun` (entries 0 skipped);
            None without state block tables.
    """

    layer: dict
    swa: BlockMap
    compressed: BlockMap | None
    state: list[list[StateRun]] | None

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        return {"layer": self.layer, "swa": self.swa.to_dict(),
                "compressed": self.compressed.to_dict() if self.compressed is not None else None,
                "state": [[asdict(r) for r in runs] for runs in self.state] if self.state is not None else None}


def v4_blocks(layer: V4LayerCaches, block_table, seq_lens: Sequence[int], *, cmp_block_table=None,
              state_block_table=None) -> V4Blocks:
    """Block views of one layer's SWA, compressed and state caches.

    Args:
        layer: the layer (SoC, ratio, block sizes, block counts).
        block_table: SWA block table ``[B, max_blocks]``.
        seq_lens: tokens each request holds ``[B]``.
        cmp_block_table: compressed-cache block table (default ``block_table``).
        state_block_table: state block table ``[B, columns]`` (column ``j`` holds positions
            ``[j * sbs, (j + 1) * sbs)``; entry 0: not updated); None: no state view.

    Raises:
        ModeError: a compressed or state table for a SWA-only layer.
        DTypeError / ShapeError / IndexRangeError: as :func:`ascend_emu.inspect.blocks`; a state
            entry outside the state cache.
    """
    lens = [int(x) for x in np.asarray(seq_lens).reshape(-1)]
    swa = blocks(block_table, lens, layer.block_size, layer.num_blocks)
    if layer.ratio == 1:
        if cmp_block_table is not None or state_block_table is not None:
            raise arg_error(ModeError, "cmp_block_table/state_block_table", "none for a SWA-only layer (ratio 1)",
                            "a table")
        return V4Blocks(layer=layer.to_dict(), swa=swa, compressed=None, state=None)
    cmp_table = block_table if cmp_block_table is None else cmp_block_table
    cmp = blocks(cmp_table, [x // layer.ratio for x in lens], layer.cmp_block_size, layer.cmp_num_blocks)
    state = None
    if state_block_table is not None:
        table = np.asarray(state_block_table)
        if table.ndim != 2 or table.shape[0] != len(lens):
            raise arg_error(ShapeError, "state_block_table", f"[{len(lens)}, columns]", describe(table))
        sbs = layer.state_block_size
        state = []
        for b, length in enumerate(lens):
            runs = []
            for col in range(min(table.shape[1], -(-length // sbs))):
                first, stop = col * sbs, min((col + 1) * sbs, length)
                if int(table[b, col]) == STATE_SKIP_BLOCK:
                    runs.append(StateRun(column=col, block=None, first=first, stop=stop, row=0))
                    continue
                place = place_of(first, table[b], sbs, layer.state_num_blocks, name=f"state_block_table[{b}]")
                runs.append(StateRun(column=col, block=place.block, first=first, stop=stop, row=place.row))
            state.append(runs)
    return V4Blocks(layer=layer.to_dict(), swa=swa, compressed=cmp, state=state)


__all__ = ["StateRun", "V4Blocks", "V4Row", "v4_blocks", "v4_cache_row", "v4_row", "v4_token"]
