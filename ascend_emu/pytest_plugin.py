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
from .layouts import CacheLayout, slots_from_block_table
from .mla import D_ROPE, HCKV
from .torch_npu._convert import to_numpy
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
