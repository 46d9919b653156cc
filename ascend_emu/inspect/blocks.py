"""Block-table view: which block and row each token of each sequence lives in.

Source: docs/sources.md#npu_kv_quant_sparse_flash_attention (``block_table`` int32 ``[B, >= ceil(max_s2 / BlockSize)]``: kv token
``p`` of batch ``b`` lives in block ``block_table[b, p // BlockSize]``, row ``p % BlockSize``), as
:func:`ascend_emu.layouts.slots_from_block_table` maps it (which also validates the table).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from ..errors import ShapeError, arg_error
from ..layouts import slots_from_block_table

#: ``occupancy`` value of a row no sequence uses.
UNUSED = -1
#: ``occupancy`` value of a row used by more than one token.
SHARED = -2


@dataclass(frozen=True)
class BlockRun:
    """Tokens ``[first_token, last_token)`` of one sequence, in rows ``[0, last_token - first_token)``
    of a block: slots ``[first_slot, first_slot + last_token - first_token)``."""

    block: int
    column: int        #: block_table column
    first_token: int
    last_token: int
    first_slot: int = 0  #: the slot of the block's row 0 (:func:`ascend_emu.layouts.slots_from_block_table`)


@dataclass(frozen=True)
class SequenceBlocks:
    """Where one sequence's tokens live."""

    seq: int
    length: int
    runs: list[BlockRun]


@dataclass(frozen=True)
class BlockMap:
    """Result of :func:`blocks`.

    Attributes:
        block_size, num_blocks: the cache geometry.
        sequences: per batch entry, its runs of tokens per block.
        owners: per used block, the sequences that read it (sorted).
        unused_blocks: blocks no sequence reads.
        shared_blocks: blocks read by more than one sequence, or twice by one (prefix sharing,
            or a bug: shown either way).
        occupancy: int64 ``[num_blocks, block_size]``: the sequence reading each row,
            :data:`UNUSED` or :data:`SHARED`.
        slots: int64 ``[B, max(seq_lens)]`` the slot of each token (-1 past its length).
    """

    block_size: int
    num_blocks: int
    sequences: list[SequenceBlocks]
    owners: dict[int, list[int]]
    unused_blocks: list[int]
    shared_blocks: list[int]
    occupancy: np.ndarray
    slots: np.ndarray

    def to_dict(self) -> dict:
        """Plain data (JSON-ready; dict keys as strings)."""
        return {"block_size": self.block_size, "num_blocks": self.num_blocks,
                "sequences": [asdict(s) for s in self.sequences],
                "owners": {str(k): v for k, v in self.owners.items()},
                "unused_blocks": self.unused_blocks, "shared_blocks": self.shared_blocks,
                "occupancy": self.occupancy.tolist(), "slots": self.slots.tolist()}


def blocks(block_table, seq_lens: Sequence[int], block_size: int, num_blocks: int | None = None) -> BlockMap:
    """Map every token of every sequence to its block and row; flag unused and shared blocks.

    Args:
        block_table: integer ``[B, max_blocks]``; only the entries covering ``seq_lens[b]``
            tokens are read (the rest is padding, as the kernels ignore it).
        seq_lens: tokens per sequence ``[B]`` (lengths, not prefix sums).
        block_size: rows per block, >= 1.
        num_blocks: blocks in the cache; default: the largest needed entry + 1.

    Returns:
        A :class:`BlockMap`.

    Raises:
        DTypeError / ShapeError / IndexRangeError: as
            :func:`ascend_emu.layouts.slots_from_block_table` (entries outside ``[0, num_blocks)``).
    """
    table = np.asarray(block_table)
    lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)  # [B]
    bs = int(block_size)
    if bs < 1:
        raise arg_error(ShapeError, "block_size", "an integer >= 1", bs)
    if num_blocks is None:
        need = -(-lens // bs)  # [B] entries each sequence reads
        used = [int(table[b, j]) for b in range(lens.size) for j in range(int(need[b]))
                if table.ndim == 2 and b < table.shape[0] and j < table.shape[1]]
        num_blocks = max(max(used) + 1, 0) if used else 0
    slots = slots_from_block_table(table, lens, bs, int(num_blocks))  # [B, S2], validated
    occupancy = np.full(int(num_blocks) * bs, UNUSED, dtype=np.int64)
    readers: dict[int, list[int]] = {}
    sequences = []
    for b, length in enumerate(lens.tolist()):
        runs = []
        for j in range(-(-length // bs)):
            blk = int(table[b, j])
            runs.append(BlockRun(block=blk, column=j, first_token=j * bs, last_token=min((j + 1) * bs, length),
                                 first_slot=int(slots[b, j * bs])))
            readers.setdefault(blk, []).append(b)
        sequences.append(SequenceBlocks(seq=b, length=int(length), runs=runs))
        s = slots[b, :length]  # [length]
        clash = occupancy[s] != UNUSED
        occupancy[s] = np.where(clash, SHARED, b)
    shared = sorted(k for k, v in readers.items() if len(v) > 1)
    return BlockMap(block_size=bs, num_blocks=int(num_blocks), sequences=sequences,
                    owners={k: sorted(set(v)) for k, v in sorted(readers.items())},
                    unused_blocks=[k for k in range(int(num_blocks)) if k not in readers], shared_blocks=shared,
                    occupancy=occupancy.reshape(int(num_blocks), bs), slots=slots)
