"""Block-placement checks for a user's own serving step: re-run it with every paged cache's
physical blocks permuted and require the same outputs.

A step that reads its kv through the block table gives the same bytes whichever physical blocks
the allocator handed out; one that reads blocks in physical order (sorting the table, assuming
consecutive ids, a fallback that walks the cache from block 1) does not. vllm-ascend #14013 was
such a bug: the shared-KV attention's output changed when only the physical order of the
compressed-KV blocks changed.

The step is any callable ``step(caches, block_table, slot_mapping, *args, **kwargs) -> outputs``:

- ``caches``: a paged cache, or a dict / list / tuple of them; the first dim of every cache is
  the physical block id (PA_BSND ``[nb, bs, N, D]``, PA_BNSD ``[nb, N, bs, D]``, PA_NZ
  ``[nb, N*D/C0, bs, C0]``, the V4 state caches), all with the same ``nb``.
- ``block_table``: int ``[B, W]`` (or None, or a dict / list / tuple of such tables); entries
  below 0 and the ``reserved`` block ids (default block 0, the null block vllm-ascend pads
  tables with) are padding and stay as they are.
- ``slot_mapping``: int ``[T]`` flat slots ``block * block_size + row`` (``-1`` skips a token),
  or ``[T, 2]`` ``[block, row]`` pairs (or None, or a dict / list / tuple).
- ``outputs``: an array / tensor, a tuple / list / dict of them, or None.

NumPy arrays and CPU torch tensors are both taken. :func:`check_block_permutation` runs the step
once on the caller's own arguments (so its writes land as usual), then on copies whose blocks
are moved by a permutation ``perm``, the free blocks reversed (every pair of them swaps its
physical order) and then shuffled (block ``b``'s bytes go to block ``perm[b]``; tables and slot
mappings rewritten to match; reserved blocks fixed), then compares every output byte for byte and
every cache after un-moving its blocks. The first difference raises
:class:`BlockPermutationError` naming the output (or cache), its logical coordinates, and for a
cache the request and block-table column that own the block.

Entry points: :func:`check_block_permutation`; the decorator :func:`permutation_checked` (a no-op
unless ``ascend-emu run --permute-blocks`` or ``ASCEND_EMU_PERMUTE_BLOCKS=1``); the pytest
fixture ``block_permutation`` (:mod:`ascend_emu.pytest_plugin`). Documented in
docs/pytest_plugin.md#block-permutation and docs/cli.md.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

import numpy as np

#: Environment variable that turns :func:`permutation_checked` steps into checked ones (``1``);
#: ``ascend-emu run --permute-blocks`` sets it.
ENV_PERMUTE_BLOCKS = "ASCEND_EMU_PERMUTE_BLOCKS"
#: Block ids that are never moved by default: block 0, vllm-ascend's null block.
RESERVED_BLOCKS = (0,)


class BlockPermutationError(AssertionError):
    """A step's output or cache changed when only the physical placement of the blocks changed."""


# ------------------------------------------------------------------------------ array helpers
def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _np_int(x, name: str) -> np.ndarray:
    """An int index array (block table, slot mapping) as int64 NumPy."""
    a = x.detach().cpu().numpy() if _is_torch(x) else np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {a.dtype}")
    return a.astype(np.int64)


def _like(values: np.ndarray, original):
    """``values`` in ``original``'s kind and dtype (a torch tensor for a tensor)."""
    if _is_torch(original):
        import torch

        return torch.from_numpy(np.ascontiguousarray(values)).to(original.dtype)
    return values.astype(np.asarray(original).dtype)


def _copy(x):
    return x.clone() if _is_torch(x) else np.array(x, copy=True)


def _move_blocks(cache, perm: np.ndarray):
    """A copy of ``cache`` whose block ``b`` is at ``perm[b]``."""
    out = _copy(cache)
    if _is_torch(cache):
        import torch

        out[torch.from_numpy(perm)] = cache
    else:
        out[perm] = cache
    return out


def _unmove_blocks(cache, perm: np.ndarray):
    """Block ``b`` of the result is block ``perm[b]`` of ``cache`` (undoes :func:`_move_blocks`)."""
    if _is_torch(cache):
        import torch

        return cache[torch.from_numpy(perm)]
    return np.asarray(cache)[perm]


def _bits(x) -> np.ndarray:
    """``x``'s elements as unsigned integers of the same width (NumPy), shape kept."""
    if _is_torch(x):
        import torch

        t = x.detach().cpu().contiguous()
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.view(ints).numpy()
    a = np.ascontiguousarray(x)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a.view(np.uint8)


def _flatten(value, name: str) -> list[tuple[str, Any]]:
    """``(name, leaf)`` of every array / tensor in a nested dict / list / tuple."""
    if value is None:
        return []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _flatten(v, f"{name}[{k!r}]")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _flatten(v, f"{name}[{i}]")]
    return [(name, value)]


def _rebuild(value, fn: Callable[[str, Any], Any], name: str):
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _rebuild(v, fn, f"{name}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(v, fn, f"{name}[{i}]") for i, v in enumerate(value))
    return fn(name, value)


# ------------------------------------------------------------------------------ the permutation
def block_permutation(num_blocks: int, *, reserved: Sequence[int] = RESERVED_BLOCKS, seed: int | None = 0
                      ) -> np.ndarray:
    """A permutation ``perm`` (int64 ``[num_blocks]``) of the block ids that fixes the
    ``reserved`` ones and moves the others: with ``seed`` None, the free blocks in reverse order
    (every pair of free blocks swaps its physical order); else a random order from NumPy's
    ``default_rng(seed)`` shifted by one (no free block keeps its id)."""
    perm = np.arange(num_blocks, dtype=np.int64)
    free = np.array([b for b in range(num_blocks) if b not in set(reserved)], np.int64)
    if seed is None:
        perm[free] = free[::-1]
    elif free.size > 1:
        order = free[np.random.default_rng(seed).permutation(free.size)]
        perm[order] = np.roll(order, 1)
    return perm


def permute_blocks(caches, block_table, slot_mapping, perm: np.ndarray, *, block_size: int | None = None):
    """``(caches, block_table, slot_mapping)`` with block ``b`` moved to ``perm[b]``: new caches
    (copies), tables and slot mappings rewritten to point at the moved blocks; padding (entries
    below 0) and blocks ``perm`` fixes are unchanged. Structures as the module doc says.

    Raises:
        ValueError: a table or slot entry past the caches' block count, caches with different
            block counts, a flat slot mapping without ``block_size``.
    """
    nb = perm.size

    def moved(name, a):
        if (a >= nb).any():
            at = [int(i) for i in np.argwhere(a >= nb)[0]]
            raise ValueError(f"{name}: expected block ids below the caches' {nb} blocks, got {name}{at} = "
                             f"{int(a[tuple(at)])}")
        return np.where(a >= 0, perm[np.clip(a, 0, nb - 1)], a)

    def table(name, t):
        return _like(moved(name, _np_int(t, name)), t)

    def slots(name, s):
        a = _np_int(s, name)
        if a.ndim == 2 and a.shape[-1] == 2:  # [block, row] pairs
            return _like(np.stack([moved(name, a[:, 0]), a[:, 1]], axis=-1), s)
        if block_size is None:
            raise ValueError(f"{name}: a flat slot mapping needs block_size (slot = block * block_size + row)")
        blk, row = np.divmod(np.where(a >= 0, a, 0), int(block_size))
        if (blk >= nb).any():
            raise ValueError(f"{name}: expected slots below {nb} * {block_size}, got {int(a.max())}")
        return _like(np.where(a >= 0, perm[blk] * int(block_size) + row, a), s)

    def cache(name, c):
        if int(c.shape[0]) != nb:
            raise ValueError(f"{name}: expected {nb} blocks in dim 0 (as the other caches), got shape {list(c.shape)}")
        return _move_blocks(c, perm)

    return (_rebuild(caches, cache, "caches"), _rebuild(block_table, table, "block_table"),
            _rebuild(slot_mapping, slots, "slot_mapping"))


# ------------------------------------------------------------------------------ the check
def _first_difference(a, b) -> tuple[int, ...] | None:
    x, y = _bits(a), _bits(b)
    if x.shape != y.shape:
        return ()
    diff = x != y
    if not diff.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))


def _value(x, at: tuple[int, ...]) -> str:
    v = x[at]
    return str(v.item() if hasattr(v, "item") else v)


def _owner(tables: list[tuple[str, np.ndarray]], block: int) -> str:
    for name, t in tables:
        hit = np.argwhere(t == block)
        if hit.size:
            i, j = (int(v) for v in hit[0][-2:]) if t.ndim >= 2 else (0, int(hit[0][0]))
            return f"{name}[{i}, {j}] (request {i}, block-table column {j})"
    return "no block-table entry"


def _compare(want_out, got_out, caches, moved_caches, perm, tables, reserved) -> None:
    """Raise :class:`BlockPermutationError` at the first output, then cache, that differs."""
    nb = perm.size
    shown = ", ".join(f"{b}->{int(perm[b])}" for b in range(nb) if perm[b] != b)
    shown = shown if len(shown) < 120 else shown[:117] + "..."
    tail = f" (blocks moved {shown}; reserved {list(reserved)})"
    if [n for n, _ in want_out] != [n for n, _ in got_out]:
        raise BlockPermutationError(f"the step returned {len(got_out)} outputs after the blocks moved, "
                                    f"{len(want_out)} before{tail}")
    for (name, w), (_, g) in zip(want_out, got_out, strict=True):
        at = _first_difference(w, g)
        if at is not None:
            values = (f": shape {list(w.shape)} before, {list(g.shape)} after" if at == ()
                      else f": {_value(w, at)} before, {_value(g, at)} after")
            raise BlockPermutationError(f"{name}{list(at)} differs when only the physical block placement "
                                        f"changed{values}{tail}; the step depends on where the blocks are, "
                                        f"not only on the block table")
    for (name, w), (_, g) in zip(caches, moved_caches, strict=True):
        at = _first_difference(w, _unmove_blocks(g, perm))
        if at is not None:
            raise BlockPermutationError(f"{name}{list(at)} (block {at[0]}, held by {_owner(tables, at[0])}; "
                                        f"physical block {int(perm[at[0]])} in the permuted run) differs after "
                                        f"the step when only the block placement changed{tail}")


def check_block_permutation(step: Callable, caches, block_table=None, slot_mapping=None, *args,
                            block_size: int | None = None, reserved: Sequence[int] = RESERVED_BLOCKS,
                            seed: int = 0, **kwargs):
    """Run ``step(caches, block_table, slot_mapping, *args, **kwargs)`` three times: on the
    caller's arguments, then on copies with every block not in ``reserved`` moved, once in
    reverse order and once in a random order (:func:`block_permutation` with None and ``seed``),
    and require byte-identical outputs and caches (un-moved).

    Args:
        step: the user's step (module doc).
        caches, block_table, slot_mapping: as the step takes them (module doc).
        block_size: rows per block; needed when a slot mapping is flat.
        reserved: block ids never moved (default ``(0,)``).
        seed: the permutation's seed.

    Returns:
        The outputs of the run on the caller's own arguments (whose caches it wrote).

    Raises:
        BlockPermutationError: the first output (in the order returned) or cache element that
            differs, with its logical coordinates and the permutation's first moves.
        ValueError: as :func:`permute_blocks`.
    """
    leaves = _flatten(caches, "caches")
    if not leaves:
        raise ValueError("caches: expected at least one paged cache, got none")
    nb = int(leaves[0][1].shape[0])
    perms = [block_permutation(nb, reserved=reserved, seed=None), block_permutation(nb, reserved=reserved, seed=seed)]
    runs = [(perm, permute_blocks(caches, block_table, slot_mapping, perm, block_size=block_size),
             tuple(_copy(a) if hasattr(a, "shape") else a for a in args),
             {k: _copy(a) if hasattr(a, "shape") else a for k, a in kwargs.items()}) for perm in perms]
    want = step(caches, block_table, slot_mapping, *args, **kwargs)
    want_out = _flatten(want, "output")
    tables = [(n, _np_int(t, n)) for n, t in _flatten(block_table, "block_table")]
    for perm, moved, moved_args, moved_kwargs in runs:  # arrays copied: out= buffers are not shared
        got = step(*moved, *moved_args, **moved_kwargs)
        _compare(want_out, _flatten(got, "output"), leaves, _flatten(moved[0], "caches"), perm, tables, reserved)
    return want


def permutation_checked(step: Callable | None = None, *, block_size: int | None = None,
                        reserved: Sequence[int] = RESERVED_BLOCKS, seed: int = 0):
    """Decorator: while ``ascend-emu run --permute-blocks`` (env :data:`ENV_PERMUTE_BLOCKS` =
    ``1``) is on, every call of the step goes through :func:`check_block_permutation`; otherwise
    the step runs as written. Use bare (``@permutation_checked``) or with the keyword arguments
    of :func:`check_block_permutation`."""
    def wrap(fn):
        @functools.wraps(fn)
        def checked_step(caches, block_table=None, slot_mapping=None, *args, **kwargs):
            if os.environ.get(ENV_PERMUTE_BLOCKS, "") != "1":
                return fn(caches, block_table, slot_mapping, *args, **kwargs)
            return check_block_permutation(fn, caches, block_table, slot_mapping, *args, block_size=block_size,
                                           reserved=reserved, seed=seed, **kwargs)
        return checked_step
    return wrap(step) if step is not None else wrap
