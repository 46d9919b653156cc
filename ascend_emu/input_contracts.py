"""Input contracts between a serving step and the kernels, each one a bug seen in the field:
warnings by default, errors in checked mode.

The rules (docs/inspect.md#input-contracts, per cache):

- ``cu_seqlens_non_decreasing``: ``cu_seqlens`` / ``query_start_loc`` / cumulative
  ``actual_seq_lengths`` never decrease (vllm-ascend #14122: a decreasing one made the kernel
  read out of bounds; the TND ops already reject it with an error).
- ``block_table_tail``: a block-table entry past its sequence's length (column ``j >=
  ceil(len / block_size)``) must not point at a block another request writes in the same step
  (or, in one op call, holds within its own length): a kernel or fallback that reads a whole
  table row, or the partial last block's neighbour, reads the other request's fresh rows.
- ``slot_mapping_padding``: slot-mapping entries of padding tokens (at or past the step's real
  token count) hold the documented pad value (``-1``, vllm-ascend's ``PAD_SLOT_ID``); real tokens
  never hold a negative other than it.
- ``state_block_zero``: in a DeepSeek-V4 compressor state table a block id 0 means "do not
  update" (docs/v4.md; the block is reserved): a request that has state rows to write in a
  column must not hold 0 there.
- ``block_written_twice``: one cache block is written by the tokens of one request only in a step
  (two requests sharing it overwrite each other's rows; vllm-ascend #10296's prefix-cache mix-up
  was of this kind).

Each violation names the argument, the position and the rule. :func:`report` warns
:class:`~ascend_emu.errors.InputContractWarning` (one per call, the first violations listed) or,
in checked mode (:mod:`ascend_emu.checked_mode`), raises
:class:`~ascend_emu.errors.InputContractError`. :func:`check_step` checks a whole step's
arguments; the paged attention ops call :func:`paged_read` on their own block table.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from . import checked_mode
from .errors import InputContractError, InputContractWarning
from .layouts.v4 import STATE_SKIP_BLOCK  # the block id a V4 state table reads as "do not update"

#: The pad value of slot mappings (vllm-ascend's PAD_SLOT_ID; the ops skip it).
PAD_SLOT = -1
#: Violations listed in one report before "+N more".
SHOWN = 3
#: The rules, by name: what each requires.
RULES = {
    "cu_seqlens_non_decreasing": "prefix sums (cu_seqlens, query_start_loc, TND actual_seq_lengths) never decrease",
    "block_table_tail": "a block-table entry past the sequence's length does not point at a block another request "
                        "writes (or holds) in the same step",
    "slot_mapping_padding": f"padding tokens' slots hold the pad value {PAD_SLOT}; real tokens hold no other negative",
    "state_block_zero": f"a V4 state-table entry a request writes is a real block, not {STATE_SKIP_BLOCK} "
                        "(0 means 'do not update')",
    "block_written_twice": "one cache block is written by one request only in a step",
}


class Violation(NamedTuple):
    """One broken contract: ``argument`` (with its position, ``name[i, j]``), ``value`` shown,
    ``rule`` (a key of :data:`RULES`), ``detail`` (why, in the step's terms)."""

    argument: str
    value: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.argument} = {self.value}: {self.detail} (rule {self.rule}: {RULES[self.rule]})"


def report(op: str, violations: list[Violation]) -> None:
    """Warn :class:`InputContractWarning` about ``violations`` (none: nothing), or raise
    :class:`InputContractError` in checked mode; the message starts with ``op``."""
    if not violations:
        return
    shown = "; ".join(str(v) for v in violations[:SHOWN])
    more = f"; +{len(violations) - SHOWN} more" if len(violations) > SHOWN else ""
    text = f"{op}: input contract broken: {shown}{more}"
    if checked_mode.enabled():
        raise InputContractError(text + " (checked mode)")
    warnings.warn(text + " (an error in checked mode)", InputContractWarning, stacklevel=3)


def _ints(x, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {a.dtype}")
    return a.astype(np.int64)


# ---------------------------------------------------------------------------------- the rules
def non_decreasing(values, name: str = "cu_seqlens") -> list[Violation]:
    """``cu_seqlens_non_decreasing``: the first entry below its predecessor (1-D)."""
    v = _ints(values, name).reshape(-1)
    bad = np.flatnonzero(np.diff(v) < 0)
    return [Violation(f"{name}[{int(i) + 1}]", str(int(v[i + 1])), "cu_seqlens_non_decreasing",
                      f"below {name}[{int(i)}] = {int(v[i])}") for i in bad[:1]]


def _needed_blocks(lens: np.ndarray, block_size: int) -> np.ndarray:
    return -(-np.maximum(lens, 0) // int(block_size))


def block_table_tails(block_table, seq_lens, block_size: int, written_by=None,
                      name: str = "block_table") -> list[Violation]:
    """``block_table_tail``: entries at column ``j >= ceil(seq_lens[i] / block_size)`` of row
    ``i`` (negative and 0 entries are padding) that point at a block request ``r != i`` writes
    (``written_by``: block id -> writing request) or, when ``written_by`` is None, holds within
    its own length."""
    table, lens = _ints(block_table, name), _ints(seq_lens, "seq_lens").reshape(-1)
    if table.ndim != 2 or table.size == 0 or lens.size < table.shape[0]:
        return []
    need = _needed_blocks(lens[:table.shape[0]], block_size)
    cols = np.arange(table.shape[1])[None, :]
    tail = (cols >= need[:, None]) & (table > 0)
    if not tail.any():  # the usual case: padding past every length
        return []
    rows = np.broadcast_to(np.arange(table.shape[0])[:, None], table.shape)
    if written_by is None:  # the requests holding each block within their lengths
        held = (cols < need[:, None]) & (table >= 0)
        blocks, holders = table[held], rows[held]
    else:
        blocks = np.fromiter(written_by.keys(), np.int64, len(written_by))
        holders = np.fromiter(written_by.values(), np.int64, len(written_by))
    size = int(max(table.max(), blocks.max(initial=0))) + 1
    first, last = np.full(size, -1, np.int64), np.full(size, -1, np.int64)
    last[blocks] = holders  # two holders of a block, from both ends: another request than i is seen
    first[blocks[::-1]] = holders[::-1]
    t_blocks, t_rows = table[tail], rows[tail]
    other = np.where(first[t_blocks] != t_rows, first[t_blocks], last[t_blocks])
    hit = (other >= 0) & (other != t_rows)
    if not hit.any():
        return []
    owner = np.full(table.shape, -1, np.int64)
    owner[tail] = np.where(hit, other, -1)
    bad = np.argwhere(owner >= 0)
    out = []
    for i, j in bad[:SHOWN]:
        i, j, blk = int(i), int(j), int(table[i, j])
        out.append(Violation(f"{name}[{i}, {j}]", str(blk), "block_table_tail",
                             f"past request {i}'s length {int(lens[i])} ({int(need[i])} blocks of {block_size}), "
                             f"and block {blk} is request {int(owner[i, j])}'s in this step"))
    return out


def slot_padding(slot_mapping, num_tokens: int, name: str = "slot_mapping", pad: int = PAD_SLOT) -> list[Violation]:
    """``slot_mapping_padding``: flat ``slot_mapping`` entries at or past ``num_tokens`` that are
    not ``pad``, and negative entries of real tokens other than ``pad``."""
    s = _ints(slot_mapping, name).reshape(-1)
    out = []
    tail = np.flatnonzero(s[num_tokens:] != pad)
    if tail.size:
        t = int(tail[0]) + num_tokens
        out.append(Violation(f"{name}[{t}]", str(int(s[t])), "slot_mapping_padding",
                             f"token {t} is padding (the step has {num_tokens} real tokens), so it must be {pad}"))
    neg = np.flatnonzero((s[:num_tokens] < 0) & (s[:num_tokens] != pad))
    if neg.size:
        t = int(neg[0])
        out.append(Violation(f"{name}[{t}]", str(int(s[t])), "slot_mapping_padding",
                             f"a negative slot other than the pad value {pad}"))
    return out


def state_block_zero(state_block_table, state_lens, state_block_size: int,
                     name: str = "state_block_table") -> list[Violation]:
    """``state_block_zero``: a V4 state-table entry ``[i, j]`` that is 0 while request ``i`` has
    state rows to write there (``j < ceil(state_lens[i] / state_block_size)``)."""
    table, lens = _ints(state_block_table, name), _ints(state_lens, "state_lens").reshape(-1)
    need = _needed_blocks(lens, state_block_size)
    out = []
    for i, n in enumerate(need):
        for j in np.flatnonzero(table[i, :int(n)] == STATE_SKIP_BLOCK)[:1]:
            out.append(Violation(f"{name}[{i}, {int(j)}]", str(STATE_SKIP_BLOCK), "state_block_zero",
                                 f"request {i} writes {int(lens[i])} state rows ({int(n)} blocks of "
                                 f"{state_block_size}), but block 0 is skipped by the kernel"))
    return out


def token_requests(query_start_loc, num_tokens: int) -> np.ndarray:
    """The request of each of ``num_tokens`` tokens from prefix sums ``query_start_loc`` ``[B + 1]``
    (from 0) or ``[B]`` (ends); tokens past the last end get -1."""
    q = _ints(query_start_loc, "query_start_loc").reshape(-1)
    ends = q[1:] if q.size and q[0] == 0 else q
    req = np.searchsorted(ends, np.arange(num_tokens), side="right")
    return np.where(req < ends.size, req, -1)


def blocks_written_twice(slot_mapping, requests, block_size: int, name: str = "slot_mapping") -> list[Violation]:
    """``block_written_twice``: the first token whose slot's block an earlier token of another
    request also writes (``requests``: the request of each token, -1 for padding; flat slots)."""
    s, req = _ints(slot_mapping, name).reshape(-1), np.asarray(requests).reshape(-1)
    first: dict[int, tuple[int, int]] = {}
    for t in range(min(s.size, req.size)):
        if s[t] < 0 or req[t] < 0:
            continue
        b = int(s[t]) // int(block_size)
        owner = first.setdefault(b, (int(req[t]), t))
        if owner[0] != req[t]:
            return [Violation(f"{name}[{t}]", str(int(s[t])), "block_written_twice",
                              f"token {t} of request {int(req[t])} writes block {b}, which token {owner[1]} of "
                              f"request {owner[0]} also writes")]
    return []


# ---------------------------------------------------------------------------------- entry points
def check_step(op: str = "step", *, block_size: int | None = None, block_table=None, seq_lens=None,
               slot_mapping=None, query_start_loc=None, num_tokens: int | None = None, cu_seqlens=None,
               state_block_table=None, state_lens=None, state_block_size: int | None = None) -> list[Violation]:
    """Check one step's inputs against every rule that the given arguments allow, then
    :func:`report` (warn, or raise in checked mode).

    Args:
        op: the name the report starts with.
        block_size: rows per cache block (for the table and slot rules).
        block_table: int ``[B, W]``; seq_lens: int ``[B]``, kv tokens per request after the step.
        slot_mapping: int ``[T]`` flat slots of the step's tokens (``-1`` padding).
        query_start_loc: int ``[B + 1]`` prefix sums of the step's tokens per request (from 0).
        num_tokens: the step's real token count (default: ``query_start_loc[-1]``).
        cu_seqlens: any other prefix sums the kernels take (checked non-decreasing).
        state_block_table, state_lens, state_block_size: a V4 compressor state table ``[B, W]``,
            the state rows each request writes, rows per state block.

    Returns:
        The violations (empty when none; a warning was issued otherwise).

    Raises:
        InputContractError: a violation, in checked mode.
    """
    found: list[Violation] = []
    for name, v in (("cu_seqlens", cu_seqlens), ("query_start_loc", query_start_loc)):
        if v is not None:
            found += non_decreasing(v, name)
    if any(v.argument.startswith("query_start_loc") for v in found):
        query_start_loc = None  # no request boundaries to check the rest against
    if num_tokens is None and query_start_loc is not None:
        num_tokens = int(_ints(query_start_loc, "query_start_loc").reshape(-1)[-1])
    writers: dict[int, int] | None = None
    if slot_mapping is not None and num_tokens is not None:
        found += slot_padding(slot_mapping, num_tokens)
        if query_start_loc is not None and block_size:
            req = token_requests(query_start_loc, _ints(slot_mapping, "slot_mapping").size)
            found += blocks_written_twice(slot_mapping, req, block_size)
            s = _ints(slot_mapping, "slot_mapping").reshape(-1)
            writers = {}
            for t in np.flatnonzero((s >= 0) & (req >= 0)):
                writers.setdefault(int(s[t]) // int(block_size), int(req[t]))
    if block_table is not None and seq_lens is not None and block_size:
        found += block_table_tails(block_table, seq_lens, block_size, writers)
    if state_block_table is not None and state_lens is not None and state_block_size:
        found += state_block_zero(state_block_table, state_lens, state_block_size)
    report(op, found)
    return found


def paged_read(op: str, block_table, kv_lens, block_size: int, name: str = "block_table") -> None:
    """The paged attention ops' hook (after validation): :data:`RULES` ``block_table_tail``
    within one call (a past-length entry pointing at a block another request of the call holds
    within its length); :func:`report`."""
    if block_table is None or kv_lens is None or not block_size:
        return
    report(op, block_table_tails(block_table, kv_lens, block_size, None, name))
