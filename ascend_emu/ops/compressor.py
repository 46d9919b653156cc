"""DeepSeek-V4's ``compressor`` on NumPy arrays: the contract (family ``compressor``).

The compressor pools each group of ``cmp_ratio`` consecutive tokens of a request into one KV row
(docs/v4.md "The compressor"). Per token at position ``p``:

- ``kv_p = x_p @ wkv^T`` and ``score_p = x_p @ wgate^T + ape[p % cmp_ratio]``, fp32 ``[coff * D]``;
- the group ``g`` (positions ``g * r .. g * r + r - 1``, ``r = cmp_ratio``) is complete when its
  last position is among this call's tokens; its row is
  ``sum_k softmax_k(score_k) * kv_k`` (the softmax per column, over the group's rows), where the
  rows are, for ``coff == 1``, the group's ``r`` tokens (all ``D`` columns); for ``coff == 2``
  (CSA's overlapping groups) the previous group's ``r`` tokens with their first ``D`` columns and
  the group's own ``r`` tokens with their last ``D`` columns (2r rows; for ``g == 0`` the previous
  group's rows are kv 0, score -inf);
- then ``RMSNorm`` over ``D`` with ``norm_weight`` and ``norm_eps``, and RoPE on the last
  ``rope_head_dim`` values with the output row's ``rope_sin`` / ``rope_cos`` row
  (``rotary_mode`` 1: half, pairs ``(i, i + 32)``; 2: interleave, pairs ``(2i, 2i + 1)``):
  ``out = v * cos + rotate(v) * sin``; one rounding to x's dtype.

The state cache (``cache_mode`` 1, contiguous): fp32 ``[blocks, block_size, 2 * coff * D]``, one
row per token position ``p`` of a request at block ``state_block_table[b, p // block_size]``,
row ``p % block_size``: ``kv_p`` (``coff * D``) then ``score_p`` with ``ape`` added
(``coff * D``). Every token of the call writes its row (``[start_pos, start_pos + used)``),
except where the table entry is 0 (block 0 is reserved: "do not update"). Tokens of a completed
group that precede ``start_pos`` are read back from their state rows (through an entry 0 too:
the kernel reads block 0 as it is; the emulator also reports the input contract
``state_block_zero``, an :class:`~ascend_emu.errors.InputContractWarning`, an error in checked
mode). In checked mode the state rows written are tracked (:mod:`ascend_emu.checked_mode`): a
read of a row never written raises before anything is written. All reads see the state as it
was before the call.

Output: TH (x ``[T, H]``): ``[min(T, T // r + B), D]``, the completed groups of request 0, then
of request 1, ..., then padding rows (zero here; the NPU leaves them unwritten); BSH (x
``[B, S, H]``): ``[B, ceil(S / r), D]``, each request's groups then its padding rows. The rope
tables have the output's rows: output row ``j`` uses rope row ``j``.

``cache_mode`` 2 (the Ascend 950's ring: one state block per request, ``state_block_table [B]``,
row ``p % block_size``, every entry written, only the positions from
``(start_pos + used) // r * r - (coff - 1) * r`` on): Ascend 950 only.

Checks (stricter than the kernels where their docs are, never looser): x bf16 / fp16, H in
1024..10240 and a multiple of 512; wkv / wgate x's dtype ``[coff * D, H]``; D (``norm_weight``'s
length) 128 or 512; ``rope_head_dim`` 64; ``cmp_ratio`` a power of two in 2..128 (the arch35 and
arch32 tilings; the README's scenarios C4A / C4Li / C128A are among them); ``coff`` 1 or 2;
``rotary_mode`` 1 or 2; ``cache_mode`` 1 (2 on the 950); ``norm_eps`` finite and >= 0; ape fp32
``[cmp_ratio, coff * D]``; norm_weight of x's dtype (A2 / A3: the arch32 tiling) or fp32 (Ascend
950: arch35); rope tables of one dtype and shape, x's dtype or fp32 (A2 / A3) or fp32 (950);
state fp32 3-D with rows and values contiguous (its block stride may be larger: a padded page);
with cache_mode 2 a block of at least ``coff * cmp_ratio`` rows and at least B blocks;
``state_block_table`` int32 (required); ``cu_seqlens`` int32 ``[B + 1]`` (TH: required; BSH:
must be None) starting at 0, non-decreasing, at most T; ``seqused`` int32 ``[B]`` within each
request's tokens; ``start_pos`` int32 ``[B]`` >= 0 (None: 0); every block-table
column a touched position needs exists and every entry read or written names a block of the
cache. All of it before anything is written.

Sources: vllm-project/vllm-ascend ``csrc/attention/compressor/README.md`` (formulas, shapes,
constraints), ``op_host/arch32|arch35/compressor_tiling.*`` (accepted values, the cache modes),
``op_kernel/arch32/compressor_block_vec_perf.h`` and ``op_kernel/arch35/compressor_block_vec.h``
(state row layout, which rows are read and written, the block-0 skip, the ring), ``rope.h``,
``csrc/torch_binding.cpp`` (``compressor``: schema, output shape),
``vllm_ascend/models/deepseek_v4/compressor.py`` (the call); hicann/cann-recipes-infer
``ops/ascendc/docs/custom-npu_compressor.md`` (``custom.compressor``) and
``models/deepseek_v4_flash_tilelang_and_inductor_af/model.py`` (``Compressor``, the model's
semantics) (docs/v4.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

from .. import checked_mode, input_contracts, soc
from ..layouts import CacheLayout, slot_of_block_row
from ..input_contracts import STATE_SKIP_BLOCK, Violation
from ..errors import IndexRangeError, ModeError, ShapeError, arg_error, describe
from ._backend import get_backend
from ._check import (MAX_CALL_BYTES, check_cu_seqlens, check_disjoint, check_dtype, check_float, check_int,
                     dtype_name, optional, required)

#: x / wkv / wgate dtypes (the op definition).
X_DTYPES = ("bfloat16", "float16")
#: Head dims D the tilings accept (``HEAD_DIM``).
HEAD_DIMS = (128, 512)
#: The rope width the kernels take (``ROPE_HEAD_DIM``).
ROPE_HEAD_DIM = 64
#: Compression ratios (arch35 / arch32 ``CMP_RATIO`` outside the day-0 scope; the README's 4 and 128).
CMP_RATIOS = (2, 4, 8, 16, 32, 64, 128)
COFFS = (1, 2)
#: rotary_mode: 1 half, 2 interleave.
ROTARY_HALF, ROTARY_INTERLEAVE = 1, 2
ROTARY_MODES = (ROTARY_HALF, ROTARY_INTERLEAVE)
#: cache_mode: 1 contiguous (block table per position), 2 the 950's ring (one block per request).
CACHE_CONTINUOUS, CACHE_CYCLE = 1, 2
CACHE_MODES = (CACHE_CONTINUOUS, CACHE_CYCLE)
#: Hidden size H: 1K..10K, 512-aligned (the tilings' ``MIN/MAX_HIDDEN_SIZE``, ``ALIGN_FACTOR``).
MIN_HIDDEN, MAX_HIDDEN, HIDDEN_ALIGN = 1024, 10240, 512
#: Largest state block size (the README: block_size <= 1024).
MAX_STATE_BLOCK = 1024
#: Bound on B (requests).
MAX_BATCH = 65536


@dataclass(frozen=True)
class StateRows:
    """The rows one ``compressor`` call reads and writes (derived by the contract from the
    lengths and the state block table).

    Attributes:
        group_tok: int64 ``[n, coff * r]``: per completed group, the token row of each of its
            rows (-1: not from this call).
        group_blk, group_off: int64 ``[n, coff * r]``: where rows with ``group_tok == -1`` are read
            in the state (block -1: the empty rows of group 0's overlap half).
        group_out: int64 ``[n]``: the output row (flat over the leading dims) of each group.
        write_tok, write_blk, write_off: int64 ``[m]``: state rows written, from which token row.
    """

    group_tok: np.ndarray
    group_blk: np.ndarray
    group_off: np.ndarray
    group_out: np.ndarray
    write_tok: np.ndarray
    write_blk: np.ndarray
    write_off: np.ndarray


@dataclass(frozen=True, kw_only=True)
class CompressorArgs(StateRows):
    """Validated arguments of ``compressor`` and the rows it reads and writes (all derived here;
    the rows: :class:`StateRows`).

    Attributes:
        x: ``[T, H]`` token rows (a BSH x reshaped ``[B * S, H]``), bf16 / fp16.
        wkv, wgate: ``[coff * D, H]``, x's dtype.
        ape: fp32 ``[r, coff * D]``.
        norm_weight: ``[D]``, x's dtype (A2 / A3) or fp32 (Ascend 950).
        rope_sin, rope_cos: ``[R, 64]`` (R = output rows), x's dtype or fp32 (A2 / A3), fp32 (950).
        state_cache: the caller's fp32 ``[blocks, block_size, 2 * coff * D]`` (written in place).
        cmp_ratio, coff, head_dim, rotary_mode: ints as checked. norm_eps: Python float.
        out_shape: the output's shape (``[R, D]`` or ``[B, ceil(S / r), D]``); out_dtype: x's.
        token_pos: int64 ``[T]``: each token row's position (-1: not used by the call).
    """

    x: np.ndarray
    wkv: np.ndarray
    wgate: np.ndarray
    ape: np.ndarray
    norm_weight: np.ndarray
    rope_sin: np.ndarray
    rope_cos: np.ndarray
    state_cache: np.ndarray
    cmp_ratio: int
    coff: int
    head_dim: int
    rotary_mode: int
    norm_eps: float
    out_shape: tuple
    out_dtype: np.dtype
    token_pos: np.ndarray


class CompressorOutputs(NamedTuple):
    """What a backend returns for ``compressor``.

    Attributes:
        cmp_kv: ``out_shape``, x's dtype (the state cache is written in place).
    """

    cmp_kv: np.ndarray


def _int(value, name: str, allowed: tuple, why: str) -> int:
    v = check_int(value, name)
    if v not in allowed:
        raise arg_error(ModeError, name, f"one of {allowed} ({why})", describe(value))
    return v


def _array(a, name: str, dtypes: tuple, ndim: int) -> np.ndarray:
    a = required(a, name)
    check_dtype(a, name, dtypes)
    if a.ndim != ndim:
        raise arg_error(ShapeError, name, f"a {ndim}-D tensor", f"shape {list(a.shape)}")
    return a


def _shape(a: np.ndarray, name: str, shape: tuple, what: str) -> None:
    if tuple(a.shape) != tuple(shape):
        raise arg_error(ShapeError, name, f"shape {list(shape)} ({what})", f"shape {list(a.shape)}")


def _int32_1d(a, name: str, length: int, what: str) -> np.ndarray | None:
    a = optional(a, name)
    if a is None:
        return None
    check_dtype(a, name, ("int32",))
    if a.ndim != 1 or a.shape[0] != length:
        raise arg_error(ShapeError, name, f"a 1-D int32 tensor [{length}] ({what})", f"shape {list(a.shape)}")
    return a.astype(np.int64)


def _state(state_cache, coff: int, d: int) -> np.ndarray:
    s = _array(state_cache, "state_cache", ("float32",), 3)
    blocks, bs, width = s.shape
    if width != 2 * coff * d or blocks < 1 or not 1 <= bs <= MAX_STATE_BLOCK:
        raise arg_error(ShapeError, "state_cache", f"shape [blocks >= 1, block_size in 1..{MAX_STATE_BLOCK}, "
                        f"2 * coff * D = {2 * coff * d}] (kv state then score state)", f"shape {list(s.shape)}")
    item = s.itemsize
    if s.strides[2] != item or s.strides[1] != width * item or s.strides[0] < bs * width * item:
        raise arg_error(ShapeError, "state_cache", "rows and values contiguous, blocks not overlapping "
                        "(only the block stride may be larger: a padded page)", f"strides {s.strides}")
    if not s.flags.writeable:
        raise arg_error(ShapeError, "state_cache", "a writable tensor (updated in place)", "a read-only array")
    return s


def _lengths(x: np.ndarray, cu_seqlens, seqused, start_pos) -> tuple:
    """Per request: first token row, tokens given, tokens used, start position (int64 arrays)."""
    if x.ndim == 3:
        b, s = x.shape[0], x.shape[1]
        if cu_seqlens is not None:
            raise arg_error(ShapeError, "cu_seqlens", "None for a 3-D x [B, S, H] (BSH)", describe(cu_seqlens))
        first = np.arange(b, dtype=np.int64) * s
        given = np.full(b, s, np.int64)
    else:
        t = x.shape[0]
        cu = required(cu_seqlens, "cu_seqlens") if cu_seqlens is not None else None
        if cu is None:
            raise arg_error(ShapeError, "cu_seqlens", "an int32 [B + 1] prefix sum (required for a 2-D x [T, H])",
                            "None")
        check_dtype(cu, "cu_seqlens", ("int32",))
        if cu.ndim != 1 or not 2 <= cu.shape[0] <= MAX_BATCH + 1:
            raise arg_error(ShapeError, "cu_seqlens", f"a 1-D int32 tensor [B + 1] with 1 <= B <= {MAX_BATCH}",
                            f"shape {list(cu.shape)}")
        cu = cu.astype(np.int64)
        steps = check_cu_seqlens(cu, "cu_seqlens", IndexRangeError, at_most=t)
        b = cu.size - 1
        first, given = cu[:-1], steps
    used = _int32_1d(seqused, "seqused", b, "tokens used per request")
    if used is None:
        used = given.copy()
    bad = (used < 0) | (used > given)
    if bad.any():
        i = int(np.argmax(bad))
        raise arg_error(IndexRangeError, f"seqused[{i}]", f"in [0, {int(given[i])}] (the request's tokens)",
                        int(used[i]))
    start = _int32_1d(start_pos, "start_pos", b, "each request's first position")
    if start is None:
        start = np.zeros(b, np.int64)
    if (start < 0).any():
        i = int(np.argmax(start < 0))
        raise arg_error(IndexRangeError, f"start_pos[{i}]", ">= 0", int(start[i]))
    return first, given, used, start


def _first_bad_entry(table: np.ndarray, req: np.ndarray, pos: np.ndarray, bs: int, blocks: int, what: str,
                     stage: int) -> tuple:
    """Block ids of the positions ``pos`` of requests ``req`` (cache_mode 1; both in request order),
    and the first error as ``(request, stage, error)`` (a missing table column at ``stage``, a
    block id out of range at ``stage + 1``: the order in which a request's entries are checked),
    or None."""
    cols = pos // bs
    width = table.shape[1]
    miss = cols >= width
    ids = table[req, np.minimum(cols, width - 1)].astype(np.int64) if width else np.zeros(pos.size, np.int64)
    bad = ~miss & ((ids < 0) | (ids >= blocks))
    found = []
    if miss.any():
        k = int(np.argmax(miss))
        b, p = int(req[k]), int(pos[k])
        found.append((b, stage, arg_error(IndexRangeError, "state_block_table", f"a column for position {p} of "
                                          f"request {b} ({what}: column {p // bs}, block_size {bs})",
                                          f"shape {list(table.shape)}")))
    if bad.any():
        k = int(np.argmax(bad))
        b = int(req[k])
        found.append((b, stage + 1, arg_error(IndexRangeError, f"state_block_table[{b}, {int(cols[k])}]",
                                              f"a block id in [0, {blocks}) ({what} position {int(pos[k])}; "
                                              "0: not updated)", int(ids[k]))))
    return ids, min(found, key=lambda f: f[:2]) if found else None


def _per_request(counts: np.ndarray) -> tuple:
    """``(request, index)`` of each of ``counts.sum()`` items listed request after request."""
    req = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    return req, np.arange(req.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


@dataclass(frozen=True, kw_only=True)
class _Plan(StateRows):
    """The rows one call reads and writes (:class:`StateRows`); ``group_req`` / ``group_pos``:
    request and position of each group row (position -1: not read from the state);
    ``zero_reads``: the input-contract violation of a row read through a table entry 0 (at most
    one)."""

    zero_reads: list
    group_req: np.ndarray
    group_pos: np.ndarray


def _plan(first, used, start, table, state: np.ndarray, r: int, coff: int, cache_mode: int,
          per_batch: int | None) -> _Plan:
    """The rows the call reads and writes (module doc), all requests at once; raises before
    anything is written, the first bad table entry in request order (a request's reads before
    its writes)."""
    blocks, bs = state.shape[0], state.shape[1]
    # completed groups g0 .. g1 - 1 of each request, request after request
    g0, g1 = start // r, (start + used) // r
    req, idx = _per_request(g1 - g0)
    own = (g0[req] + idx)[:, None] * r + np.arange(r, dtype=np.int64)
    # positions of each group's rows: the overlap half (previous group) then its own
    pos = np.concatenate([own - r, own], axis=1) if coff == 2 else own
    s = start[req][:, None]
    tok = np.where(pos >= s, first[req][:, None] + pos - s, -1)
    need = (pos < s) & (pos >= 0)
    g_req = np.broadcast_to(req[:, None], pos.shape)
    blk = np.full(pos.shape, -1, np.int64)
    off = np.where(need, pos % bs, 0)
    # every used token writes its row
    w_req, w_idx = _per_request(used)
    w_pos = start[w_req] + w_idx
    zero_reads: list[Violation] = []
    if cache_mode == CACHE_CONTINUOUS:
        p, p_req = pos[need], g_req[need]
        ids, read_bad = _first_bad_entry(table, p_req, p, bs, blocks, "read", 0)
        w_ids, write_bad = _first_bad_entry(table, w_req, w_pos, bs, blocks, "written", 2)
        bad = [f for f in (read_bad, write_bad) if f is not None]
        if bad:
            raise min(bad, key=lambda f: f[:2])[2]
        blk[need] = ids
        zero = ids == STATE_SKIP_BLOCK
        if zero.any():
            k = int(np.argmax(zero))
            b, q = int(p_req[k]), int(p[k])
            zero_reads.append(Violation(
                f"state_block_table[{b}, {q // bs}]", str(STATE_SKIP_BLOCK), "state_block_zero",
                f"request {b} reads the state row of position {q} (a group completed by this call), "
                f"but block {STATE_SKIP_BLOCK} is never written: the row read is stale"))
        keep = w_ids != 0
    else:
        blk[need] = table[g_req[need]]
        keep = w_pos >= np.maximum(g1[w_req] * r - (coff - 1) * r, 0)
        w_ids = table[w_req].astype(np.int64)
    g_out = np.arange(req.size, dtype=np.int64) if per_batch is None else req * per_batch + idx
    return _Plan(group_tok=tok, group_blk=blk, group_off=off, group_out=g_out,
                 write_tok=(first[w_req] + w_idx)[keep], write_blk=w_ids[keep], write_off=(w_pos % bs)[keep],
                 zero_reads=zero_reads, group_req=np.ascontiguousarray(g_req), group_pos=np.where(need, pos, -1))


def _check_no_read_write_alias(g_blk, g_off, w_blk, w_off, blocks: int, bs: int) -> None:
    """A state row the call both reads (an earlier token of a group) and writes (a token of the
    call) makes the result depend on the kernel's order (its cores save before they read): such
    a call (a block id in two places of the table, or a ring shorter than the rows a call needs)
    is rejected."""
    need = g_blk >= 0
    if not need.any() or w_blk.size == 0:
        return
    read = slot_of_block_row(g_blk[need], g_off[need], bs)
    written = np.zeros(blocks * bs, bool)  # one byte per state row (a row is 2 * coff * D fp32)
    written[slot_of_block_row(w_blk, w_off, bs)] = True
    both = read[written[read]]
    if both.size:
        slot = int(both.min())
        raise arg_error(IndexRangeError, "state_block_table", "tables whose state rows read by the call (the "
                        "earlier tokens of its groups) are not also written by it (a block id used twice, or a "
                        "ring block shorter than the rows the call needs)",
                        f"block {slot // bs} row {slot % bs} both read and written")


def compressor(x, wkv, wgate, state_cache, ape, norm_weight, rope_sin, rope_cos, state_block_table, cu_seqlens,
               seqused, start_pos, rope_head_dim, cmp_ratio, coff=1, norm_eps=1e-6, rotary_mode=1,
               cache_mode=1) -> np.ndarray:
    """``torch.ops._C_ascend.compressor`` / ``torch.ops.custom.compressor``: DeepSeek-V4's KV
    compressor (module doc: formulas, state cache, output rows, checks).

    Args:
        x: bf16 / fp16 ``[T, H]`` (TH, with ``cu_seqlens``) or ``[B, S, H]`` (BSH).
        wkv, wgate: ``[coff * D, H]``, x's dtype (for coff 2: the overlap half's D rows first).
        state_cache: fp32 ``[blocks, block_size, 2 * coff * D]``, updated in place.
        ape: fp32 ``[cmp_ratio, coff * D]``: the score's bias by position within the group.
        norm_weight: ``[D]`` (D 128 or 512), x's dtype (A2 / A3) or fp32 (Ascend 950).
        rope_sin, rope_cos: ``[min(T, T // r + B), 64]`` (TH) or ``[B, ceil(S / r), 64]`` (BSH),
            x's dtype or fp32 (A2 / A3), fp32 (Ascend 950): one row per output row.
        state_block_table: int32 ``[B, W]`` (cache_mode 1: block of each position's
            ``position // block_size``; 0 = not updated) or ``[B]`` (cache_mode 2).
        cu_seqlens: int32 ``[B + 1]`` prefix sums (TH; None for BSH).
        seqused: None, or int32 ``[B]``: tokens of each request that take part (its first ones).
        start_pos: None (0), or int32 ``[B]``: position of each request's first token.
        rope_head_dim: 64. cmp_ratio: 2, 4, ..., 128. coff: 1, or 2 (overlapping groups).
        norm_eps: RMSNorm epsilon. rotary_mode: 1 half, 2 interleave. cache_mode: 1, or 2 (950).

    Returns:
        cmp_kv: x's dtype, ``[min(T, T // r + B), D]`` (TH) or ``[B, ceil(S / r), D]`` (BSH);
        padding rows zero.

    Raises:
        ShapeError / DTypeError / ModeError / IndexRangeError: naming the argument, before the
        state cache is touched.

    Source: module doc (vllm-ascend ``csrc/attention/compressor/``; cann-recipes-infer
    ``custom-npu_compressor.md``).
    """
    r = _int(cmp_ratio, "cmp_ratio", CMP_RATIOS, "the tilings' compression ratios")
    coff = _int(coff, "coff", COFFS, "1: no overlap, 2: overlapping groups")
    _int(rope_head_dim, "rope_head_dim", (ROPE_HEAD_DIM,), "the only rope width the kernels take")
    rotary = _int(rotary_mode, "rotary_mode", ROTARY_MODES, "1 half, 2 interleave")
    cache_mode = _int(cache_mode, "cache_mode", CACHE_MODES, "1 contiguous, 2 ring")
    if cache_mode == CACHE_CYCLE:
        soc.require_ascend950("cache_mode", cache_mode, "the ring state cache")
    eps = check_float(norm_eps, "norm_eps", nonnegative=True)
    x = required(x, "x")
    check_dtype(x, "x", X_DTYPES)
    if x.ndim not in (2, 3):
        raise arg_error(ShapeError, "x", "a 2-D [T, H] or 3-D [B, S, H] tensor", f"shape {list(x.shape)}")
    h = int(x.shape[-1])
    if not MIN_HIDDEN <= h <= MAX_HIDDEN or h % HIDDEN_ALIGN:
        raise arg_error(ShapeError, "x", f"H (last dim) in {MIN_HIDDEN}..{MAX_HIDDEN}, a multiple of {HIDDEN_ALIGN}",
                        f"shape {list(x.shape)}")
    xd = dtype_name(x.dtype)
    a950 = soc.is_ascend950()
    # the arch35 tiling (950) takes fp32 norm_weight and rope tables only; arch32 (A2 / A3)
    # norm_weight of x's dtype, rope tables of x's dtype or fp32
    norm_weight = _array(norm_weight, "norm_weight", ("float32",) if a950 else (xd,), 1)
    d = int(norm_weight.shape[0])
    if d not in HEAD_DIMS:
        raise arg_error(ShapeError, "norm_weight", f"[D] with D one of {HEAD_DIMS}", f"shape {list(norm_weight.shape)}")
    wkv = _array(wkv, "wkv", (xd,), 2)
    wgate = _array(wgate, "wgate", (xd,), 2)
    _shape(wkv, "wkv", (coff * d, h), "[coff * D, H]")
    _shape(wgate, "wgate", (coff * d, h), "[coff * D, H]")
    ape = _array(ape, "ape", ("float32",), 2)
    _shape(ape, "ape", (r, coff * d), "[cmp_ratio, coff * D]")
    state = _state(state_cache, coff, d)
    table = required(state_block_table, "state_block_table") if state_block_table is not None else None
    if table is None:
        raise arg_error(ShapeError, "state_block_table", "an int32 tensor (the kernels require it)", "None")
    check_dtype(table, "state_block_table", ("int32",))
    first, given, used, start = _lengths(x, cu_seqlens, seqused, start_pos)
    nb = first.size
    if cache_mode == CACHE_CONTINUOUS:
        if table.ndim != 2 or table.shape[0] != nb:
            raise arg_error(ShapeError, "state_block_table", f"a 2-D int32 tensor [B = {nb}, W]",
                            f"shape {list(table.shape)}")
    elif table.shape not in ((nb,), (nb, 1)):
        raise arg_error(ShapeError, "state_block_table", f"an int32 tensor [B = {nb}] or [B, 1] (cache_mode 2: one "
                        "block per request, read at flat index b)", f"shape {list(table.shape)}")
    else:
        table = table.reshape(nb)
        if state.shape[0] < nb:
            raise arg_error(ShapeError, "state_cache", f"at least B = {nb} blocks with cache_mode 2 (one per request)",
                            f"shape {list(state.shape)}")
        if state.shape[1] < coff * r:
            raise arg_error(ShapeError, "state_cache", f"block_size >= coff * cmp_ratio = {coff * r} with cache_mode 2 "
                            "(the ring holds the rows of a group and of its overlap)", f"shape {list(state.shape)}")
        bad = (table < 0) | (table >= state.shape[0])
        if bad.any():
            i = int(np.argmax(bad))
            raise arg_error(IndexRangeError, f"state_block_table[{i}]", f"a block id in [0, {state.shape[0]})",
                            int(table[i]))
    if x.ndim == 3:
        per_batch = -(-int(x.shape[1]) // r)
        out_shape = (nb, per_batch, d)
        rope_shape = (nb, per_batch, ROPE_HEAD_DIM)
        what = "[B, ceil(S / cmp_ratio), 64]"
    else:
        t = int(x.shape[0])
        per_batch = None
        out_shape = (min(t, t // r + nb), d)
        rope_shape = (out_shape[0], ROPE_HEAD_DIM)
        what = "[min(T, T // cmp_ratio + B), 64]"
    rope_sin = _array(rope_sin, "rope_sin", ("float32",) if a950 else (xd, "float32"), len(rope_shape))
    rope_cos = _array(rope_cos, "rope_cos", (dtype_name(rope_sin.dtype),), len(rope_shape))
    _shape(rope_sin, "rope_sin", rope_shape, what)
    _shape(rope_cos, "rope_cos", rope_shape, what)
    tokens = int(np.prod(x.shape[:-1]))
    nbytes = 4 * tokens * (2 * coff * d) * 3 + 4 * tokens * 2 * coff * d * 2 + 4 * int(np.prod(out_shape)) * 4
    if nbytes > MAX_CALL_BYTES:
        raise arg_error(ShapeError, "x", f"at most {MAX_CALL_BYTES >> 30} GiB of working copies",
                        f"shape {list(x.shape)}, {nbytes / (1 << 30):.1f} GiB")
    check_disjoint([("state_cache", state)], [("x", x), ("wkv", wkv), ("wgate", wgate), ("ape", ape),
                                              ("norm_weight", norm_weight), ("rope_sin", rope_sin),
                                              ("rope_cos", rope_cos), ("state_block_table", table)])
    plan = _plan(first, used, start, table, state, r, coff, cache_mode, per_batch)
    g_blk, g_off, w_blk, w_off = plan.group_blk, plan.group_off, plan.write_blk, plan.write_off
    g_req, g_pos = plan.group_req, plan.group_pos
    _check_no_read_write_alias(g_blk, g_off, w_blk, w_off, state.shape[0], state.shape[1])
    input_contracts.report("compressor", plan.zero_reads)  # an error in checked mode: before any write
    layout = CacheLayout(mode="PA_BSND", num_blocks=state.shape[0], block_size=state.shape[1],
                         dim=state.shape[2], itemsize=4)
    bs = state.shape[1]

    def reads() -> checked_mode.CacheReads:
        need = g_blk >= 0
        req, pos = g_req[need], g_pos[need]
        return checked_mode.CacheReads((("state_cache", state, layout),),
                                       slot_of_block_row(g_blk[need], g_off[need], bs),
                                       lambda i: f"request {int(req[i])}, position {int(pos[i])} (a group's "
                                                 f"earlier token)")

    checked_mode.read("compressor", reads)  # rows never written: an error in checked mode
    checked_mode.will_write((state if state.flags.c_contiguous else None, layout))
    token_pos = np.full(tokens, -1, np.int64)
    t_req, t_idx = _per_request(used)
    token_pos[first[t_req] + t_idx] = start[t_req] + t_idx
    args = CompressorArgs(x=x.reshape(tokens, h), wkv=wkv, wgate=wgate, ape=ape, norm_weight=norm_weight,
                          rope_sin=rope_sin.reshape(-1, ROPE_HEAD_DIM), rope_cos=rope_cos.reshape(-1, ROPE_HEAD_DIM),
                          state_cache=state, cmp_ratio=r, coff=coff, head_dim=d, rotary_mode=rotary, norm_eps=eps,
                          out_shape=out_shape, out_dtype=x.dtype, token_pos=token_pos,
                          **{f.name: getattr(plan, f.name) for f in fields(StateRows)})
    out = get_backend().compressor(args).cmp_kv
    checked_mode.wrote("compressor", slot_of_block_row(w_blk, w_off, bs), [(state, layout)], (("cmp_kv", out),))
    return out


__all__ = ["CompressorArgs", "CompressorOutputs", "StateRows", "compressor"]
