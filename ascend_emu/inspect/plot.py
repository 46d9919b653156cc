"""PNG pictures of inspect results (matplotlib, the ``[plot]`` extra).

- :func:`plot_grid`: an NZ block / weight's fractal grid, cells coloured by the logical row they
  hold, padding grey, 16-row fractals outlined; small grids labelled cell by cell.
- :func:`plot_diff`: blocks x rows heat map of the differing bytes per slot (fixed log scale),
  expected slots and slots changed outside them outlined.
- :func:`plot_blocks`: blocks x rows occupancy of a block table, by sequence, each run labelled
  with its sequence and place in the block order; shared rows red, unused white.
"""

from __future__ import annotations

import os

import numpy as np

from ..install_hints import PLOT_HINT
from .blocks import SHARED, BlockMap
from .diff import Diff
from .grid import Grid


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"PNG output needs matplotlib; {PLOT_HINT}") from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> str:
    """Save ``fig`` at ``path`` (PNG) and close it."""
    path = os.fspath(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


#: Most cells :func:`plot_grid` writes a label into (slot / m and byte offset); a larger grid is
#: drawn as colour only, with thinned ticks (the text view and --json list every cell).
GRID_LABEL_CELLS = 256
#: Most ticks on a picture axis.
MAX_TICKS = 16


def _ticks(n: int) -> range:
    """At most :data:`MAX_TICKS` evenly spaced positions in ``[0, n)``, steps of a power of 2."""
    step = 1
    while n > step * MAX_TICKS:
        step *= 2
    return range(0, n, step)


def plot_grid(g: Grid, path) -> str:
    """Write :func:`grid_figure` of ``g`` as a PNG at ``path``; returns the path.

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    return _save(grid_figure(g), path)


def grid_figure(g: Grid):
    """The fractal grid ``g`` (or the window of it that ``g`` holds) as a matplotlib Figure.

    Each cell is one row's C0 chunk (``c0 * itemsize`` bytes). Cells are coloured by the fractal
    they belong to (16 rows x one C0 chunk, the unit the NZ layout stores contiguously), the
    colours following the fractals' order in memory, so the tiling shows at any size; padding is
    grey, fractal and C0 boundaries are white lines. Grids of at most :data:`GRID_LABEL_CELLS`
    cells carry the slot / row and byte offset in each cell; larger ones label each fractal with
    its first byte offset while there are at most :data:`GRID_LABEL_CELLS` fractals, and thin
    the ticks. Axis ticks are the grid's own row and chunk numbers (a window keeps them).

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    plt = _pyplot()
    chunks, rows = g.shape
    # a fractal (16 rows x C0) is contiguous in memory: its number in memory order colours it
    tile = g.offset // (g.fractal_rows * g.c0 * g.itemsize)  # [chunks, rows]
    data = np.ma.masked_where(g.logical_row < 0, (tile % 20).astype(float))  # [chunks, rows]
    labelled = chunks * rows <= GRID_LABEL_CELLS
    cell_w = 0.75 if labelled else 0.3
    fig, ax = plt.subplots(figsize=(min(3 + cell_w * chunks, 16), min(2 + (0.28 if labelled else 0.12) * rows, 14)))
    cmap = plt.get_cmap("tab20").with_extremes(bad="#d0d0d0")
    im = ax.imshow(data.T, cmap=cmap, vmin=0, vmax=20, aspect="auto", interpolation="nearest",
                   extent=(-0.5, chunks - 0.5, rows - 0.5, -0.5))
    for r in range(1, rows):
        if (g.row0 + r) % g.fractal_rows == 0:
            ax.axhline(r - 0.5, color="white", lw=1.5)
    for j in range(1, chunks):
        ax.axvline(j - 0.5, color="white", lw=0.8 if labelled or chunks <= 64 else 0.3)
    base = int(g.offset.min())
    who = "slot" if g.kind == "cache block" else "m"
    if labelled:
        for j in range(chunks):
            for r in range(rows):
                lr = int(g.logical_row[j, r])
                label = ("pad" if lr < 0 else f"{who} {lr}") + f"\n+{int(g.offset[j, r]) - base}"
                if 0 < g.valid_cols[j, r] < g.c0:
                    label += f"\n({int(g.valid_cols[j, r])} cols)"
                ink = "black" if lr < 0 else _ink(im.cmap(im.norm(data[j, r])))
                ax.text(j, r, label, ha="center", va="center", fontsize=6, color=ink)
    else:
        starts = [r for r in range(rows) if (g.row0 + r) % g.fractal_rows == 0 or r == 0]
        if chunks * len(starts) <= GRID_LABEL_CELLS:
            for j in range(chunks):
                for r in starts:
                    end = min(r + g.fractal_rows - (g.row0 + r) % g.fractal_rows, rows)
                    ax.text(j, (r + end - 1) / 2, f"+{int(g.offset[j, r]) - base}", ha="center", va="center",
                            fontsize=6 if chunks > 8 else 7, rotation=90 if chunks > 8 else 0, color="black")
    xt = range(chunks) if labelled else _ticks(chunks)
    ax.set_xticks(list(xt), [f"{int(g.first_col[j, 0])}-{int(g.first_col[j, 0]) + g.c0 - 1}" for j in xt],
                  rotation=90, fontsize=7)
    yt = range(rows) if rows <= 32 else _ticks(rows)
    ax.set_yticks(list(yt), [str(g.row0 + r) for r in yt], fontsize=7)
    ax.set_xlabel(f"C0 chunk (its dims / columns); chunks {g.chunk0}-{g.chunk0 + chunks - 1}")
    ax.set_ylabel(f"row of the block (fractals of {g.fractal_rows} rows)" if g.kind == "cache block"
                  else f"row m (fractals of {g.fractal_rows} rows)")
    cell = (f"one cell = one row's C0 chunk, {g.c0} elements = {g.c0 * g.itemsize} bytes; memory runs down each "
            f"C0 column, then on to the next; one colour = one fractal ({g.fractal_rows} rows x C0), in memory order")
    where = (f"cells show {who} and +byte offset from {base}" if labelled else
             f"{chunks} x {rows} cells; fractals labelled with their +byte offset from {base}; "
             "`ascend-emu inspect grid` (text / --json) lists every offset")
    window = "" if g.whole else (f"\nwindow: rows {g.row0}-{g.row0 + rows - 1} of {g.extent[1]}, C0 chunks "
                                 f"{g.chunk0}-{g.chunk0 + chunks - 1} of {g.extent[0]} (--rows / --chunks)")
    ax.set_title(f"{g.title}\n{cell}\n{where}{window}", fontsize=8)
    return fig


def plot_diff(d: Diff, path, *, title: str | None = None) -> str:
    """Write :func:`diff_figure` of ``d`` as a PNG at ``path``; returns the path.

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    return _save(diff_figure(d, title=title), path)


#: Most blocks a diff heat map shows when it crops to the blocks that differ.
DIFF_CROP_BLOCKS = 64
#: Most differing slots outlined one by one in a diff heat map.
DIFF_OUTLINED_SLOTS = 512


def diff_figure(d: Diff, *, title: str | None = None, crop: bool = True):
    """The blocks x rows heat map of ``d`` (differing bytes per slot) as a matplotlib Figure.

    The colour scale is fixed and logarithmic, from 1 byte to a whole slot (so one flipped byte
    and a fully rewritten slot are both plainly visible, whatever else changed); unchanged slots
    are light grey. With ``expect_slots`` the expected slots are outlined green and every slot
    that changed outside them red. ``title`` (e.g. the call and tensor) heads the picture.
    Every differing slot is outlined (up to :data:`DIFF_OUTLINED_SLOTS`) and every differing
    block marked with a red ``<`` beside the picture, so one byte in a large cache is seen; with
    ``crop`` (default) a cache of more than :data:`DIFF_CROP_BLOCKS` blocks, or one where at most
    that many differ, is shown as only the blocks that differ (at most that many), labelled by
    their block ids.

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    plt = _pyplot()
    from matplotlib.colors import ListedColormap, LogNorm
    from matplotlib.patches import Rectangle

    heat = d.heat  # [BlockNum, BlockSize]
    nb, bs = heat.shape
    slot_bytes = max(int(d.cache["nbytes"]) // max(nb * bs, 1), 1)
    differing = np.flatnonzero(heat.any(axis=1))  # blocks with a differing byte
    shown = np.arange(nb)
    if crop and 0 < differing.size < nb and (nb > DIFF_CROP_BLOCKS or differing.size <= DIFF_CROP_BLOCKS):
        shown = differing[:DIFF_CROP_BLOCKS]  # only the blocks that differ
    row_of = {int(b): i for i, b in enumerate(shown)}  # block -> picture row
    sub = heat[shown]  # [shown blocks, BlockSize]
    n = len(shown)
    fig, ax = plt.subplots(figsize=(min(4 + 0.3 * bs, 16), min(2.5 + 0.3 * n, 14)))
    data = np.ma.masked_equal(sub.astype(float), 0)
    cmap = ListedColormap(plt.get_cmap("magma_r")(np.linspace(0.22, 1.0, 256))).with_extremes(bad="#f0f0f0")
    im = ax.imshow(data, cmap=cmap, norm=LogNorm(vmin=1, vmax=max(slot_bytes, int(heat.max()), 2)), aspect="auto",
                   interpolation="nearest")
    ax.set_xlabel("row inside the block")
    ax.set_ylabel("block" + ("" if n == nb else " (only those that differ)"))
    xt = range(bs) if bs <= 32 else _ticks(bs)
    ax.set_xticks(list(xt), [str(r) for r in xt], fontsize=7)
    yt = range(n) if n <= 64 else _ticks(n)
    ax.set_yticks(list(yt), [str(int(shown[i])) for i in yt], fontsize=7)
    # every differing slot outlined (so one byte in a large cache is seen), and each differing
    # block marked beside the picture
    cells = np.argwhere(sub > 0)  # [k, 2] (picture row, row in block)
    if len(cells) <= DIFF_OUTLINED_SLOTS:
        for i, r in cells:
            ax.add_patch(Rectangle((r - 0.5, i - 0.5), 1, 1, fill=False, ec="#2b2b2b", lw=0.8))
    marked = [row_of[int(b)] for b in differing if int(b) in row_of]
    from matplotlib.transforms import blended_transform_factory

    ax.plot([1.02] * len(marked), marked, ls="", marker="<", color="#d62728", markersize=6, clip_on=False,
            transform=blended_transform_factory(ax.transAxes, ax.transData))  # right of the picture
    ax.set_xlim(-0.5, bs - 0.5)
    ax.set_ylim(n - 0.5, -0.5)
    s = d.summary
    handles = []
    if s["outside_expected_bytes"] is not None:
        for slot in d.expect_slots or ():
            b, r = divmod(slot, bs)
            if 0 <= slot < nb * bs and b in row_of:
                ax.add_patch(Rectangle((r - 0.5, row_of[b] - 0.5), 1, 1, fill=False, ec="#1a9850", lw=1.5, ls="--"))
        for slot in s["outside_expected_slots"]:
            b, r = divmod(slot, bs)
            if b in row_of:
                ax.add_patch(Rectangle((r - 0.45, row_of[b] - 0.45), 0.9, 0.9, fill=False, ec="red", lw=2.5))
                ax.text(r, row_of[b], "!", ha="center", va="center", color="red", fontsize=9, fontweight="bold")
        handles = [Rectangle((0, 0), 1, 1, fill=False, ec="#1a9850", lw=1.5, ls="--",
                             label="expected slot (--expect-slots)"),
                   Rectangle((0, 0), 1, 1, fill=False, ec="red", lw=2.5,
                             label=f"changed outside them ({len(s['outside_expected_slots'])} slot(s))")]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.12 - 0.02 * (n <= 8)),
                  ncol=2, frameon=False)
    what = (f"{s['bytes']} differing bytes in {len(s['slots'])} slot(s) of {differing.size} block(s)"
            + (f"; {s['outside_expected_bytes']} bytes in {len(s['outside_expected_slots'])} slot(s) outside the "
               f"expected ones" if s["outside_expected_bytes"] is not None else ""))
    if n < nb:
        what += (f"\nshowing the {n} block(s) that differ, of {nb}" +
                 (f" (the first {n}; --json lists all)" if n < differing.size else "")
                 + "; differing blocks marked < and slots outlined")
    ax.set_title((f"{title}\n" if title else "") + what, fontsize=9)
    cb = fig.colorbar(im, ax=ax)
    cb.set_label(f"differing bytes per slot (log scale; a slot is {slot_bytes} bytes)")
    return fig


def _seq_colours(plt, n: int) -> np.ndarray:
    """RGBA ``[n, 4]`` colours of ``n`` sequences: tab10 without its red (red marks rows read
    twice), then the light tab20 shades; they repeat past 18 sequences (each run is labelled)."""
    tab10, tab20 = plt.get_cmap("tab10").colors, plt.get_cmap("tab20").colors
    palette = [tab10[i] for i in (0, 1, 2, 4, 5, 6, 8, 9, 7)] + [tab20[i] for i in (1, 3, 5, 9, 11, 13, 17, 19, 15)]
    return np.array([(*palette[i % len(palette)], 1.0) for i in range(n)])


def _ink(rgba) -> str:
    """Black or white, whichever reads better on ``rgba``."""
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def plot_blocks(m: BlockMap, path) -> str:
    """Write :func:`blocks_figure` of ``m`` as a PNG at ``path``; returns the path.

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    return _save(blocks_figure(m), path)


def blocks_figure(m: BlockMap):
    """The blocks x rows occupancy of ``m`` as a matplotlib Figure: colour = sequence (red: a row read
    twice, white: unused); each run of a sequence's tokens is labelled with the sequence, its
    place in the sequence's block order (``#k`` = block_table column k) and its tokens, and the
    legend gives each sequence's block order (a label is drawn on a light box, so it reads on any
    colour).

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    plt = _pyplot()
    from matplotlib.colors import ListedColormap

    occ = m.occupancy  # [num_blocks, block_size]
    nseq = max(len(m.sequences), 1)
    base = _seq_colours(plt, nseq)
    # colour index = occupancy - SHARED: 0 shared (red), 1 unused (white), 2 + b sequence b
    cmap = ListedColormap(np.vstack([[0.85, 0.1, 0.1, 1], [1, 1, 1, 1], base]))
    fig, ax = plt.subplots(figsize=(min(6 + 0.15 * m.block_size, 16), min(2 + 0.32 * max(m.num_blocks, 1), 14)))
    ax.imshow(occ - SHARED, cmap=cmap, vmin=-0.5, vmax=nseq + 1.5, aspect="auto", interpolation="nearest")
    for b in range(1, m.num_blocks):
        ax.axhline(b - 0.5, color="#c0c0c0", lw=0.5)
    runs: dict[int, list[str]] = {}
    for seq in m.sequences:
        for run in seq.runs:
            last = run.last_token - 1
            runs.setdefault(run.block, []).append(f"s{seq.seq} #{run.column}: t{run.first_token}"
                                                  + (f"-{last}" if last > run.first_token else ""))
    if m.num_blocks <= 96:
        size = 7 if m.num_blocks <= 40 else 5
        for blk, labels in runs.items():
            ax.text(-0.4, blk, "  |  ".join(labels), ha="left", va="center", fontsize=size, color="black",
                    clip_on=True, bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.7))
    shared, unused = set(m.shared_blocks), set(m.unused_blocks)
    yt = range(m.num_blocks) if m.num_blocks <= 96 else _ticks(m.num_blocks)
    ax.set_yticks(list(yt), [f"{b}" + (" shared" if b in shared else " unused" if b in unused else "") for b in yt],
                  fontsize=7)
    xt = range(m.block_size) if m.block_size <= 32 else _ticks(m.block_size)
    ax.set_xticks(list(xt), [str(r) for r in xt], fontsize=7)
    ax.set_xlabel("row inside the block")
    ax.set_ylabel("block")
    ax.set_title(f"block table: {len(m.sequences)} sequence(s), BlockSize {m.block_size}; "
                 f"{len(m.unused_blocks)} unused, {len(m.shared_blocks)} shared block(s)\n"
                 f"label: s<seq> #<block_table column>: t<first>-<last token> of the run", fontsize=9)

    def order(seq) -> str:
        blocks = [str(r.block) for r in seq.runs]
        if len(blocks) > 8:
            blocks = blocks[:5] + ["..."] + blocks[-2:]
        return " > ".join(blocks) or "(empty)"

    handles = [plt.Rectangle((0, 0), 1, 1, color=base[i]) for i in range(len(m.sequences))]
    names = [f"seq {s.seq} ({s.length} tokens): blocks {order(s)}" for s in m.sequences]
    handles += [plt.Rectangle((0, 0), 1, 1, color=cmap(0)), plt.Rectangle((0, 0), 1, 1, fc="white", ec="grey")]
    names += ["row read twice (shared)", "unused"]
    if len(handles) > 40:
        handles, names = handles[:38] + handles[-2:], names[:38] + names[-2:]
    ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), title="block order",
              title_fontsize=7)
    return fig
