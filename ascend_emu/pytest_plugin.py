"""A pytest plugin that runs a serving framework's unit tests against the emulated torch_npu on
the CPU, with data flowing through the ops instead of ``MagicMock``.

Opt in, per run or per test tree (it is never loaded on its own: ascend_emu declares no
``pytest11`` entry point)::

    pytest -p ascend_emu.pytest_plugin tests/
    # or, in a conftest.py:
    pytest_plugins = ["ascend_emu.pytest_plugin"]

pytest imports this module while it reads the command line or the conftest, before it collects
any test module, and importing it does for the whole session what ``import torch_npu`` does on an
NPU machine (:func:`ascend_emu.torch_npu.install`): ``import torch_npu`` (and ``torch_npu.npu``,
``torch_npu.testing``, ...) resolves to :mod:`ascend_emu.torch_npu`; ``torch.npu``, the ``npu``
device (``device="npu"``, ``.npu()``, ``torch.Generator(device="npu")``), ``torch_npu.<op>`` /
``torch.ops.npu.<op>`` for the emulated ops, the dtype codes (``torch_npu.hifloat8`` = 290,
``float8_e8m0fnu`` = 293, ``float4_e2m1fn_x2`` = 296, ...) and ``torch.version.cann`` exist.
What it replaces of vllm-ascend's mocked ``torch_npu`` (its ``tests/ut/conftest.py``) and what it
cannot: ``docs/pytest_plugin.md``.

A real torch_npu, if one is installed, is shadowed for the session (opting in means emulating;
``ascend-emu run`` asks for ``--force`` instead because there the choice is implicit).

Fixtures (factories: functions taking sizes; every random value comes from :func:`npu_generator`):

- :func:`npu_generator`: a seeded ``torch.Generator(device="npu")`` (seed :data:`SEED`).
- :func:`block_table`: a block table and slot mapping from sequence lengths.
- :func:`paged_cache`: a paged KV cache in a cache mode (``PA_BSND``, ``PA_NZ``, ...) holding
  given logical rows; :func:`cache_rows` reads one back whatever its mode.
- :func:`mla_caches`: the MLA pair (c_kv 512, k_rope 64) of one layer.
- :func:`v4_caches`: the caches of one DeepSeek-V4 layer (SWA, compressed, state, indexer; A2 / A3
  or Ascend 950) after a prefill of given tokens: compressed and state rows computed by the
  emulated ``compressor``, everything written by the emulated writers (:func:`make_v4_caches`).
- :func:`nz_weight`: a random weight cast to FRACTAL_NZ with ``npu_format_cast``.
- :func:`block_permutation`: re-run a step with every paged cache's physical blocks permuted and
  fail at the first output that changed (:mod:`ascend_emu.block_permutation`).
"""

from __future__ import annotations

import sys
from typing import NamedTuple, Sequence

import numpy as np
import pytest

from . import torch_npu as _drop_in
from .layouts import CacheLayout, V4LayerCaches, slots_from_block_table
from .mla import D_ROPE, HCKV
from .torch_npu._convert import to_numpy, to_torch
from .tracebacks import full_traceback_wanted, hidden_frames_hint, is_emulator_file

_drop_in.install()

import torch  # noqa: E402  (patched by the drop-in above)

#: Seed of :func:`npu_generator` (so of every fixture's random values).
SEED = 0
#: ``npu_format_cast`` code of FRACTAL_NZ.
ACL_FORMAT_FRACTAL_NZ = 29


def pytest_report_header(config) -> str:
    """One header line saying the session's torch_npu is the emulator."""
    return f"ascend_emu: torch_npu is the CPU emulator {_drop_in.__version__} (ascend_emu.pytest_plugin)"


def _check_still_installed(when: str) -> None:
    """Stop the session when something replaced the emulated torch_npu after the plugin installed
    it (vllm-ascend's ``tests/ut/conftest.py`` puts a MagicMock module in ``sys.modules`` when
    ``npu-smi`` is missing): tests would otherwise run against the mock, silently."""
    current = sys.modules.get("torch_npu")
    if current is not _drop_in:
        raise pytest.UsageError(
            f"torch_npu: expected the emulator (ascend_emu.torch_npu, installed by ascend_emu.pytest_plugin), "
            f"got {type(current).__name__} {getattr(current, '__name__', current)!r} {when}; a conftest.py that "
            f"mocks torch_npu must skip its mock when the plugin is loaded "
            f"('ascend_emu.pytest_plugin' in sys.modules)")


#: The pytest switch that shows every frame (pytest's own; it shows the emulator's frames too).
FULL_TRACE_SWITCH = "pytest --fulltrace"


def hide_emulator_frames(excinfo) -> int:
    """Stop ``excinfo``'s traceback (a ``pytest.ExceptionInfo``) at the last frame before the
    first one inside ascend_emu, as ``ascend-emu run`` does for a script, and add a note to the
    exception saying how many frames were hidden and how to see them
    (:func:`ascend_emu.tracebacks.hidden_frames_hint`). Returns that count (0: nothing hidden,
    e.g. an error raised by the test itself, or one raised in the emulator's first frame with no
    caller frame before it)."""
    last, tb = None, excinfo.tb  # the raw traceback: pytest's own views of it re-walk tb_next
    while tb is not None and not is_emulator_file(tb.tb_frame.f_code.co_filename):
        last, tb = tb, tb.tb_next
    if last is None or tb is None:  # nothing of the emulator's, or no caller frame before it
        return 0
    hidden = 0
    while tb is not None:
        hidden, tb = hidden + 1, tb.tb_next
    last.tb_next = None
    excinfo.traceback = type(excinfo.traceback)(excinfo.tb)
    note = hidden_frames_hint(hidden, FULL_TRACE_SWITCH)
    notes = getattr(excinfo.value, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        try:
            excinfo.value.__notes__ = notes
        except AttributeError:  # an exception type without a __dict__
            return hidden
    if note not in notes:
        notes.append(note)
    return hidden


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's traceback stops at its call into ascend_emu (:func:`hide_emulator_frames`)
    unless env ``ASCEND_EMU_TRACEBACK=1`` or ``--fulltrace`` asks for every frame."""
    if call.excinfo is not None and not full_traceback_wanted() and not item.config.getoption("fulltrace", False):
        hide_emulator_frames(call.excinfo)
    yield


def pytest_sessionstart(session) -> None:
    """The top-level conftest files have run: torch_npu must still be the emulator."""
    _check_still_installed("after the conftest files loaded")


def pytest_collection_finish(session) -> None:
    """Every conftest and test module is imported: torch_npu must still be the emulator."""
    _check_still_installed("after collection")


# ---------------------------------------------------------------------------------------- helpers
class BlockTable(NamedTuple):
    """Paged-attention metadata for a batch of sequences.

    Attributes:
        block_table: int32 ``[B, max_blocks]`` on the NPU: row ``b`` lists the blocks of sequence
            ``b`` in order (``ceil(seq_lens[b] / block_size)`` of them), then 0 padding (as vLLM's
            block tables pad).
        slot_mapping: int64 ``[sum(seq_lens)]`` on the NPU: the slot ``block * block_size + row``
            of every token, sequences concatenated (vLLM's ``slot_mapping`` of a prefill of the
            whole sequences; a decode step takes each sequence's last entry).
        slots: int64 ``[B, max(seq_lens)]`` host tensor, ``slots[b, p]`` = slot of position ``p``
            of sequence ``b``, -1 past ``seq_lens[b]``.
        seq_lens: int32 ``[B]`` on the NPU.
        num_blocks: blocks in the cache this table addresses.
        block_size: rows per block.
    """

    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    num_blocks: int
    block_size: int


def make_block_table(seq_lens: Sequence[int], block_size: int, *, num_blocks: int | None = None,
                     generator: torch.Generator | None = None) -> BlockTable:
    """A block table giving each sequence its own blocks, drawn shuffled (as an allocator leaves
    them) from ``num_blocks``.

    Args:
        seq_lens: tokens per sequence, each >= 0.
        block_size: rows per block, >= 1.
        num_blocks: blocks in the cache; default: exactly the blocks the sequences need.
        generator: draws the block order; None draws from torch's default generator.

    Returns:
        :class:`BlockTable`; its slots are those :func:`ascend_emu.layouts.slots_from_block_table`
        gives (the map the PA_BSND readers use).

    Raises:
        ValueError: a negative length, ``block_size < 1``, or fewer ``num_blocks`` than needed.
    """
    lens = [int(n) for n in seq_lens]
    if block_size < 1 or any(n < 0 for n in lens):
        raise ValueError(f"seq_lens: expected lengths >= 0 and block_size >= 1, got {lens} and {block_size}")
    need = [-(-n // block_size) for n in lens]
    total = sum(need) if num_blocks is None else int(num_blocks)
    if total < sum(need):
        raise ValueError(f"num_blocks: expected at least {sum(need)} for seq_lens {lens} "
                         f"(block_size {block_size}), got {total}")
    order = torch.randperm(total, generator=generator)
    table = torch.zeros(len(lens), max(need, default=0) or 1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(need):
        table[b, :n] = order[start:start + n].to(torch.int32)
        start += n
    slots = torch.from_numpy(slots_from_block_table(table.numpy(), lens, block_size, total))
    slot_mapping = torch.cat([slots[b, :n] for b, n in enumerate(lens)]) if lens else slots.reshape(0)
    return BlockTable(table.npu(), slot_mapping.to(torch.int64).npu(), slots,
                      torch.tensor(lens, dtype=torch.int32).npu(), total, block_size)


def make_paged_cache(num_blocks: int, block_size: int, dim: int, *, dtype: torch.dtype = torch.bfloat16,
                     mode: str = "PA_BSND", heads: int = 1, rows: torch.Tensor | str | None = None,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """A paged KV cache in its declared shape (``[num_blocks, block_size, heads, dim]``; head-major
    PA_BNSD / PA_BLK_BNSD ``[num_blocks, heads, block_size, dim]``) on the NPU, its bytes laid out
    as ``mode`` stores them (:meth:`ascend_emu.layouts.CacheLayout.from_rows`).

    ``PA_BSND`` / ``PA_BLK_BSND``: slot ``s`` is the contiguous row ``cache.view(-1, heads, dim)[s]``.
    ``PA_BNSD`` / ``PA_BLK_BNSD``: head ``h`` of slot ``s`` is ``cache[s // block_size, h, s % block_size]``.
    ``PA_NZ`` / ``PA_BLK_NZ``: each block holds ``[dim / C0, block_size, C0]`` with
    ``C0 = 32 bytes / itemsize`` (:class:`ascend_emu.layouts.CacheLayout`, docs/sources.md#paged_nz),
    so the tensor's own indexing does not show the rows: read them with :func:`cache_rows`.

    Args:
        num_blocks, block_size, dim, heads: the geometry (NZ modes: heads 1, dim a multiple of C0,
            block_size a multiple of 16, as :meth:`CacheLayout.from_shape` checks).
        dtype: bf16, fp16 or int8 (the cache dtypes of the MLA ops); fp32 is accepted too.
        mode: a cache mode of :data:`ascend_emu.layouts.CACHE_MODES` (aliases accepted).
        rows: the logical contents, ``[num_blocks * block_size, heads, dim]`` of ``dtype`` (row
            ``s`` = slot ``s``); ``"random"`` draws them (normal for floats, [-127, 127] for
            int8) from ``generator``; None: zeros.
        generator: for ``rows="random"``.

    Returns:
        The cache tensor (on the NPU, C-contiguous).

    Raises:
        ascend_emu.errors.ShapeError / ModeError: a geometry or mode the layout rejects.
        ValueError: ``rows`` of the wrong shape or dtype.
    """
    itemsize = torch.empty(0, dtype=dtype).element_size()
    layout = CacheLayout(mode=mode, num_blocks=int(num_blocks), block_size=int(block_size), dim=int(dim),
                         itemsize=itemsize, heads=int(heads))
    shape = layout.declared_shape()
    layout = CacheLayout.from_shape(mode, shape, itemsize, name="cache")  # the BlockSize rule, as before
    want = (layout.num_rows, layout.heads, layout.dim)
    if rows is None:
        values = torch.zeros(want, dtype=dtype)
    elif isinstance(rows, str):
        if rows != "random":
            raise ValueError(f"rows: expected a tensor, 'random' or None, got {rows!r}")
        if dtype.is_floating_point:
            values = torch.randn(want, generator=generator).to(dtype)
        else:
            values = torch.randint(-127, 128, want, generator=generator).to(dtype)
    else:
        values = rows.detach().cpu()
        if tuple(values.shape) != want or values.dtype != dtype:
            raise ValueError(f"rows: expected {dtype} {list(want)}, got {values.dtype} {list(values.shape)}")
    cache = torch.empty(shape, dtype=dtype)
    src = to_numpy(values.contiguous(), "rows")
    to_numpy(cache, "cache").reshape(-1).view(np.uint8)[:] = layout.from_rows(src)  # the mode's memory order
    return cache.npu()


def cache_rows(cache: torch.Tensor, mode: str) -> torch.Tensor:
    """The logical rows of a paged cache in any mode: ``[num_blocks * block_size, Nkv, D]`` host
    tensor of the cache's dtype, row ``s`` = slot ``s`` (:meth:`ascend_emu.layouts.CacheLayout.to_rows`).

    Args:
        cache: a cache tensor in its declared shape (or an NZ storage shape), C-contiguous.
        mode: its cache mode.

    Raises:
        ascend_emu.errors.ShapeError / ModeError: a shape or mode the layout rejects.
    """
    layout = CacheLayout.from_shape(mode, tuple(cache.shape), cache.element_size(), name="cache")
    return torch.from_numpy(layout.to_rows(to_numpy(cache.cpu().contiguous(), "cache").view(np.uint8))).view(
        cache.dtype)


def make_nz_weight(shape: Sequence[int], *, dtype: torch.dtype = torch.bfloat16,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """A random weight ``shape`` (``[..., K, N]``) on the NPU, cast to FRACTAL_NZ with
    ``torch_npu.npu_format_cast(w, 29)`` as weight loading does (vllm-ascend ``maybe_trans_nz``).

    Floats are normal scaled by ``K ** -0.5`` (activations keep their size through a matmul);
    int8 weights are uniform in [-127, 127]. The returned tensor shows its ND values (the drop-in
    keeps the NZ byte order out of sight) and ``torch_npu.get_npu_format`` gives 29.

    Raises:
        ValueError: fewer than 2 dims.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(f"shape: expected [..., K, N] (2-D or more), got {list(shape)}")
    if dtype.is_floating_point:
        w = (torch.randn(shape, generator=generator) * shape[-2] ** -0.5).to(dtype)
    else:
        w = torch.randint(-127, 128, shape, generator=generator).to(dtype)
    return _drop_in.npu_format_cast(w.npu(), ACL_FORMAT_FRACTAL_NZ)


class V4Caches(NamedTuple):
    """The caches of one DeepSeek-V4 layer and how they were filled (:func:`make_v4_caches`).

    Attributes:
        layer: the geometry (:class:`ascend_emu.layouts.V4LayerCaches`).
        caches: name -> cache tensor on the NPU (``swa``; ``compressed``, ``state``; CSA also
            ``indexer_key`` + ``indexer_scale`` (A2 / A3) or ``indexer_packed`` (950), ``indexer_state``).
        block_table: the SWA :class:`BlockTable` (its ``slot_mapping`` is where ``kv`` went).
        cmp_block_table: the compressed-cache :class:`BlockTable` over each request's completed rows
            (``seq_len // ratio``; its ``slot_mapping`` is where ``cmp_kv`` and ``indexer_k`` went);
            None in a SWA-only layer. The indexer caches share it.
        state_block_table: int32 ``[B, ceil(max(seq_lens) / state_bs)]`` on the NPU, indexed by
            position; 0 (block 0 is reserved: "do not update") except the columns holding live
            state (below); the indexer state shares it. None in a SWA-only layer.
        kv: bf16 ``[T, 512]`` host tensor, every request's tokens in order (what the SWA holds).
        hidden: bf16 ``[T, H]`` host tensor, the tokens' hidden states the compressors read (None:
            SWA layer).
        weights: the compressor weights used (None: SWA layer): ``{"cmp": {...}}`` and, CSA,
            ``"idx_cmp"``, each ``{"wkv", "wgate": bf16 [coff * D, H], "ape": fp32 [ratio, coff * D],
            "norm": [D] (bf16 on A2 / A3, fp32 on the 950)}`` host tensors.
        cmp_kv: bf16 ``[n, 512]`` host tensor, the compressed rows ``compressor`` returned, requests
            in order, padding rows dropped (None: SWA layer).
        indexer_k: bf16 ``[n, 128]`` host tensor, the indexer compressor's rows (CSA only).
        state_positions: int64 ``[m, 2]`` host tensor of ``(request, position)``: the positions
            whose state rows the compressor wrote (those whose state block-table entry is not 0:
            the blocks of each request's unfinished group and, with ``coff`` 2, of the group before it).
        state: fp32 ``[m, 2 * coff * 512]`` host tensor, those rows as the cache holds them (kv
            state then score state).
        indexer_state: fp32 ``[m, 2 * 2 * 128]`` host tensor (CSA only), the indexer state rows.
    """

    layer: V4LayerCaches
    caches: dict
    block_table: BlockTable
    cmp_block_table: BlockTable | None
    state_block_table: torch.Tensor | None
    kv: torch.Tensor
    hidden: torch.Tensor | None
    weights: dict | None
    cmp_kv: torch.Tensor | None
    indexer_k: torch.Tensor | None
    state_positions: torch.Tensor | None
    state: torch.Tensor | None
    indexer_state: torch.Tensor | None


#: Hidden size of the tokens :func:`make_v4_caches` draws (the compressor's smallest H; the model's is 4096).
V4_FIXTURE_HIDDEN = 1024
#: RMSNorm epsilon of the compressors (the reference model's).
V4_NORM_EPS = 1e-6
#: ``rotary_mode`` the compressors run with (2: interleaved pairs, the tables of
#: :func:`ascend_emu.layouts.v4_rope_tables`), as vllm-ascend calls them.
V4_ROTARY_MODE = 2


def _as_torch(given, name: str) -> torch.Tensor:
    return given.detach().cpu() if isinstance(given, torch.Tensor) else to_torch(np.array(given))  # bf16 via ml_dtypes


def _rows_or_random(given, shape: tuple[int, ...], dtype: torch.dtype, name: str, generator) -> torch.Tensor:
    if given is None:
        return torch.randn(shape, generator=generator).to(dtype)
    t = _as_torch(given, name)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    return t.to(dtype).contiguous()


def _compressor_weights(given, key: str, ratio: int, coff: int, d: int, h: int, norm_dtype: torch.dtype,
                        generator) -> dict:
    """One compressor's weights: the given ``given[key]`` (checked, cast) or drawn (bf16 matrices
    ``randn / sqrt(H)``, ape ``0.5 randn``, norm ``1 + 0.1 randn``)."""
    shapes = {"wkv": ((coff * d, h), torch.bfloat16), "wgate": ((coff * d, h), torch.bfloat16),
              "ape": ((ratio, coff * d), torch.float32), "norm": ((d,), norm_dtype)}
    if given is not None:
        if not isinstance(given, dict) or not isinstance(given.get(key), dict):
            raise ValueError(f"weights: expected a dict with a dict {key!r} of {sorted(shapes)}, got "
                             f"{type(given).__name__}{' keys ' + str(sorted(given)) if isinstance(given, dict) else ''}")
        missing = sorted(k for k in shapes if given[key].get(k) is None)
        if missing:
            raise ValueError(f"weights[{key!r}]: expected entries {sorted(shapes)}, missing {missing}")
        return {k: _rows_or_random(given[key][k], shape, dt, f"weights[{key!r}][{k!r}]", generator)
                for k, (shape, dt) in shapes.items()}
    w = {k: torch.randn(shape, generator=generator) for k, (shape, _) in shapes.items()}
    return {"wkv": (w["wkv"] * h ** -0.5).to(torch.bfloat16), "wgate": (w["wgate"] * h ** -0.5).to(torch.bfloat16),
            "ape": w["ape"] * 0.5, "norm": (1.0 + 0.1 * w["norm"]).to(norm_dtype)}


def _state_table(lens: Sequence[int], ratio: int, coff: int, sbs: int, generator) -> torch.Tensor:
    """int32 ``[B, ceil(max(lens) / sbs)]``: fresh blocks (1.., shuffled) at the columns holding
    each request's live positions (its unfinished group and, ``coff`` 2, the complete group before
    it: what the next ``compressor`` call reads), 0 ("do not update") elsewhere."""
    cols = []
    for n in lens:
        done = (n // ratio) * ratio
        lo = max(0, done - ratio) if coff == 2 else done
        cols.append(list(range(lo // sbs, -(-n // sbs))) if n > lo else [])
    need = sum(len(c) for c in cols)
    order = (torch.randperm(need, generator=generator) + 1).tolist()  # blocks 1..need; 0 reserved
    table = torch.zeros(len(lens), max((-(-n // sbs) for n in lens), default=0) or 1, dtype=torch.int32)
    for b, cs in enumerate(cols):
        for c in cs:
            table[b, c] = order.pop()
    return table


def make_v4_caches(soc: str, ratio: int, seq_lens: Sequence[int], *, block_size: int = 16,
                   cmp_block_size: int | None = None, kv=None, hidden=None, weights=None,
                   generator: torch.Generator | None = None) -> V4Caches:
    """The caches of one DeepSeek-V4 layer after a prefill of ``seq_lens`` tokens per request,
    computed and written by the emulated ops as vllm-ascend chains them (docs/pytest_plugin.md,
    "DeepSeek-V4 caches"; ``ascend_emu/demo_v4.py`` runs the same chain step by step).

    - SWA: the tokens' latents ``kv`` (given or drawn) at their slots: A2 / A3
      ``npu_scatter_nd_update_v2`` with ``[n, 2]`` (block, offset) rows; Ascend 950
      ``kv_compress_epilog`` (layout 1, quant_mode 2) with flat slots.
    - ratio > 1: ``compressor_metadata`` (rope rows and slots of each compressed row; ``[n, 2]``
      slots on A2 / A3, flat on the 950; rope tables of
      :func:`ascend_emu.layouts.v4_rope_tables` with the compressed layers' theta), then
      ``compressor`` (``cache_mode`` 1, ``rotary_mode`` 2, ``start_pos`` 0, ``coff`` 2 for c4) over
      ``hidden`` with the ``"cmp"`` weights: it returns the compressed rows and writes the state
      cache itself, at the positions whose state block-table entry is not 0; its rows go to the
      compressed cache through the same writer as the SWA (metadata slot -1 rows skipped).
    - CSA (ratio 4): a second ``compressor`` (D 128, the ``"idx_cmp"`` weights, the
      ``indexer_state`` cache, the same state table) gives the indexer keys (taken as it returns
      them: the caller's Hadamard rotation is left out); A2 / A3 ``npu_dynamic_quant`` (per-token
      int8) and two ``npu_scatter_nd_update_v2`` (int8 keys, fp16 scales); 950
      ``indexer_compress_epilog_v2`` (layout 2) into the packed cache.

    Blocks are drawn shuffled from ``generator``; block 0 of the state caches is never handed out
    (it means "do not update"): only the state blocks of each request's live positions (the
    unfinished group, and with ``coff`` 2 the group before it) are given.

    Args:
        soc: ``"a2a3"`` or ``"950"`` (the 950 writers need the emulated SoC to be an Ascend 950:
            the :func:`v4_caches` fixture sets it).
        ratio: 1 (SWA-only layer), 4 (CSA) or 128 (HCA).
        seq_lens: tokens each request holds, each >= 0.
        block_size: SWA tokens per block (vllm-ascend: 128 or 16).
        cmp_block_size: compressed rows per block (default ``block_size``).
        kv: ``[sum(seq_lens), 512]`` latents, a torch tensor or NumPy array (default: normal draws),
            written as bf16.
        hidden: ``[sum(seq_lens), H]`` hidden states (ratio > 1; H a multiple of 512 in
            1024..10240; default: normal draws with H :data:`V4_FIXTURE_HIDDEN`), used as bf16.
        weights: ``{"cmp": {"wkv", "wgate", "ape", "norm"}}`` and for CSA ``"idx_cmp"`` (shapes as
            :class:`V4Caches` ``weights``; cast to those dtypes); default: drawn.
        generator: for the draws and the block order.

    Returns:
        :class:`V4Caches`.

    Raises:
        ValueError: a tensor of the wrong shape, a missing weight, a negative length.
        ascend_emu.errors.ModeError: unknown ``soc`` / ``ratio``; a 950 writer on another SoC.
        ascend_emu.errors.ShapeError: what ``compressor`` rejects (e.g. H out of its range).
    """
    from . import ops
    from .layouts import (V4_CMP_ROPE_THETA, V4_COFF, V4_HEAD_DIM, V4_INDEXER_DIM, V4_ROPE_DIM, state_block_size,
                          v4_rope_tables)

    lens = [int(n) for n in seq_lens]
    probe = V4LayerCaches(soc, ratio, block_size=block_size, num_blocks=1)  # checks soc / ratio first
    bt = make_block_table(lens, block_size, num_blocks=max(sum(-(-n // block_size) for n in lens), 1),
                          generator=generator)
    total = sum(lens)
    kv_t = _rows_or_random(kv, (total, V4_HEAD_DIM), torch.bfloat16, "kv", generator)
    cbt = st_table = x_t = w_t = cmp_t = idx_t = st_pos = None
    cmp_nb = state_nb = 1
    cbs = block_size if cmp_block_size is None else int(cmp_block_size)
    if ratio > 1:
        cmp_lens = [n // ratio for n in lens]
        cbt = make_block_table(cmp_lens, cbs, num_blocks=max(sum(-(-n // cbs) for n in cmp_lens), 1),
                               generator=generator)
        cmp_nb = cbt.num_blocks
        h = V4_FIXTURE_HIDDEN if hidden is None else int(_as_torch(hidden, "hidden").shape[-1])
        x_t = _rows_or_random(hidden, (total, h), torch.bfloat16, "hidden", generator)
        coff, norm_dt = V4_COFF[ratio], torch.float32 if soc == "950" else torch.bfloat16
        w_t = {"cmp": _compressor_weights(weights, "cmp", ratio, coff, V4_HEAD_DIM, h, norm_dt, generator)}
        if ratio == 4:
            w_t["idx_cmp"] = _compressor_weights(weights, "idx_cmp", ratio, coff, V4_INDEXER_DIM, h, norm_dt,
                                                 generator)
        sbs = state_block_size(soc, ratio)
        st_table = _state_table(lens, ratio, coff, sbs, generator)
        state_nb = int(st_table.max()) + 1
        st_pos = torch.tensor([(b, p) for b, n in enumerate(lens) for p in range(n)
                               if int(st_table[b, p // sbs]) != 0], dtype=torch.int64).reshape(-1, 2)
    layer = V4LayerCaches(probe.soc, ratio, block_size=block_size, num_blocks=bt.num_blocks, cmp_block_size=cbs,
                          cmp_num_blocks=cmp_nb, state_num_blocks=state_nb)
    specs = layer.caches()
    tensors = {k: torch.zeros(c.shape, dtype=_TORCH_DTYPES[c.dtype]) for k, c in specs.items()}
    arrays = {k: to_numpy(t, k) for k, t in tensors.items()}  # views: the ops fill the tensors

    def pairs(slots: torch.Tensor, bs: int) -> np.ndarray:
        s = slots.cpu().numpy().astype(np.int64)
        return np.stack([s // bs, s % bs], axis=1) if s.size else np.zeros((0, 2), np.int64)

    def write_latent(name: str, rows: np.ndarray, slots: np.ndarray) -> None:
        """rows at ``slots`` (950: flat int32 ``[n]``; A2 / A3: ``[n, 2]`` (block, offset)); -1 skipped."""
        if soc == "950":
            ops.kv_compress_epilog(arrays[name].reshape(-1, 1, arrays[name].shape[-1]), rows,  # layout 1: [N, 1, 640] rows
                                   slots)
        else:
            ops.npu_scatter_nd_update_v2(arrays[name], slots, rows)

    swa_slots = bt.slot_mapping.cpu().numpy().astype(np.int32) if soc == "950" else pairs(bt.slot_mapping, block_size)
    write_latent("swa", to_numpy(kv_t.contiguous(), "kv"), swa_slots)
    cmp_rows = idx_rows = None
    if ratio > 1:
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        start = np.zeros(len(lens), np.int32)
        n_out = min(total, total // ratio + len(lens))
        cos, sin = v4_rope_tables(max(lens, default=0), V4_CMP_ROPE_THETA)
        fmt = 1 if soc == "950" else 2  # flat slots for kv_compress_epilog, [block, offset] for the scatter
        cos_r, sin_r, slots = ops.compressor_metadata(cos, sin, cu, start, to_numpy(cbt.block_table.cpu(), "cmp_table"),
                                                      cbs, fmt, ratio, n_out, len(lens))
        valid = (slots >= 0) if fmt == 1 else (slots[:, 0] >= 0)
        table = to_numpy(st_table, "state_block_table")
        x = to_numpy(x_t.contiguous(), "hidden")

        def compress(key: str, state_name: str) -> np.ndarray:
            w = {k: to_numpy(v.contiguous(), k) for k, v in w_t[key].items()}
            st = arrays[state_name]
            return ops.compressor(x, w["wkv"], w["wgate"], st.reshape(st.shape[0], st.shape[1], st.shape[3]),
                                  w["ape"], w["norm"], sin_r.reshape(n_out, V4_ROPE_DIM),
                                  cos_r.reshape(n_out, V4_ROPE_DIM), table, cu, None, start, V4_ROPE_DIM, ratio,
                                  V4_COFF[ratio], V4_NORM_EPS, V4_ROTARY_MODE, 1)

        cmp_rows = compress("cmp", "state")
        write_latent("compressed", cmp_rows, slots)
        cmp_t = to_torch(np.ascontiguousarray(cmp_rows[valid])).clone()
        if ratio == 4:
            idx_rows = compress("idx_cmp", "indexer_state")
            idx_t = to_torch(np.ascontiguousarray(idx_rows[valid])).clone()
            if soc == "950":
                ops.indexer_compress_epilog_v2(arrays["indexer_packed"], idx_rows, slots, layout=2)
            else:
                q, scale = ops.npu_dynamic_quant(np.ascontiguousarray(idx_rows[valid]))
                ops.npu_scatter_nd_update_v2(arrays["indexer_key"], slots[valid], np.ascontiguousarray(q))
                ops.npu_scatter_nd_update_v2(arrays["indexer_scale"], slots[valid],
                                             np.asarray(scale, np.float32).astype(np.float16).reshape(-1, 1))

    def state_rows(name: str):
        if st_pos is None or name not in tensors:
            return None
        sbs = layer.state_block_size
        pos = st_pos.numpy()
        blk = st_table.numpy()[pos[:, 0], pos[:, 1] // sbs].astype(np.int64)
        t = tensors[name]
        return t.reshape(-1, t.shape[-1])[torch.from_numpy(blk * sbs + pos[:, 1] % sbs)].clone()

    return V4Caches(layer, {k: t.npu() for k, t in tensors.items()}, bt, cbt,
                    st_table.npu() if st_table is not None else None, kv_t, x_t, w_t, cmp_t, idx_t, st_pos,
                    state_rows("state"), state_rows("indexer_state"))


_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                 "uint8": torch.uint8, "int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn}


# --------------------------------------------------------------------------------------- fixtures
@pytest.fixture
def npu_generator() -> torch.Generator:
    """A ``torch.Generator(device="npu")`` seeded with :data:`SEED`, fresh for each test (use it as
    ``torch.randn(..., generator=npu_generator)``)."""
    return torch.Generator(device="npu").manual_seed(SEED)


@pytest.fixture
def block_table(npu_generator):
    """Factory ``block_table(seq_lens, block_size, *, num_blocks=None) -> BlockTable``
    (:func:`make_block_table`, blocks drawn from :func:`npu_generator`)."""
    def factory(seq_lens: Sequence[int], block_size: int, *, num_blocks: int | None = None) -> BlockTable:
        return make_block_table(seq_lens, block_size, num_blocks=num_blocks, generator=npu_generator)
    return factory


@pytest.fixture
def paged_cache(npu_generator):
    """Factory ``paged_cache(num_blocks, block_size, dim, *, dtype=bf16, mode="PA_BSND", heads=1,
    rows=None)`` -> ``[num_blocks, block_size, heads, dim]`` cache (:func:`make_paged_cache`;
    ``rows="random"`` draws from :func:`npu_generator`)."""
    def factory(num_blocks: int, block_size: int, dim: int, **kwargs) -> torch.Tensor:
        return make_paged_cache(num_blocks, block_size, dim, generator=npu_generator, **kwargs)
    return factory


@pytest.fixture
def mla_caches(paged_cache):
    """Factory ``mla_caches(num_blocks, block_size, *, dtype=bf16, mode="PA_BSND")`` ->
    ``(ckv_cache, k_rope_cache)``: ``[num_blocks, block_size, 1, 512]`` and ``[.., 1, 64]``
    (:data:`ascend_emu.mla.HCKV`, :data:`~ascend_emu.mla.D_ROPE`), zeros, as vllm-ascend's MLA /
    SFA layers hold them (``kv_cache[0]`` = c_kv, ``kv_cache[1]`` = k_rope)."""
    def factory(num_blocks: int, block_size: int, *, dtype: torch.dtype = torch.bfloat16,
                mode: str = "PA_BSND") -> tuple[torch.Tensor, torch.Tensor]:
        return (paged_cache(num_blocks, block_size, HCKV, dtype=dtype, mode=mode),
                paged_cache(num_blocks, block_size, D_ROPE, dtype=dtype, mode=mode))
    return factory


@pytest.fixture
def v4_caches(npu_generator, monkeypatch):
    """Factory ``v4_caches(soc, ratio, seq_lens, *, block_size=16, cmp_block_size=None, kv=None,
    hidden=None, weights=None) -> V4Caches``: one DeepSeek-V4 layer's caches after a prefill of the
    given (or drawn) tokens, the compressed and state rows computed by the emulated ``compressor``
    and everything written by the emulated writers (:func:`make_v4_caches`). ``soc="950"`` sets the emulated SoC to an Ascend 950 for the test
    (``ASCEND_EMU_SOC_NAME``), as the 950 writers and readers need."""
    from .soc import ASCEND950_EXAMPLE, SOC_NAME_ENV, is_ascend950

    def factory(soc: str, ratio: int, seq_lens: Sequence[int], **kwargs) -> V4Caches:
        if soc == "950" and not is_ascend950():
            monkeypatch.setenv(SOC_NAME_ENV, ASCEND950_EXAMPLE)
        return make_v4_caches(soc, ratio, seq_lens, generator=npu_generator, **kwargs)
    return factory


@pytest.fixture
def nz_weight(npu_generator):
    """Factory ``nz_weight(shape, *, dtype=bf16)`` -> a random weight cast to FRACTAL_NZ
    (:func:`make_nz_weight`, drawn from :func:`npu_generator`)."""
    def factory(shape: Sequence[int], *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return make_nz_weight(shape, dtype=dtype, generator=npu_generator)
    return factory


@pytest.fixture
def block_permutation():
    """``block_permutation(step, caches, block_table, slot_mapping, *args, block_size=None,
    reserved=(0,), seed=0, **kwargs)``: run the user's step on its arguments and again with the
    physical blocks of every paged cache permuted (tables and slot mappings moved to match, block 0
    kept), and fail with the first output or cache element that differs and its logical
    coordinates (:func:`ascend_emu.block_permutation.check_block_permutation`; returns the first
    run's outputs). Catches a step that reads blocks in physical order instead of through the
    block table (docs/pytest_plugin.md#block-permutation)."""
    from .block_permutation import check_block_permutation

    return check_block_permutation
