"""PNG pictures of inspect results (matplotlib, the ``[plot]`` extra).

- :func:`plot_grid`: an NZ block / weight's fractal grid, cells coloured by the logical row they
  hold, padding grey, 16-row fractals outlined.
- :func:`plot_diff`: blocks x rows heat map of the differing bytes per slot.
- :func:`plot_blocks`: blocks x rows occupancy of a block table, by sequence; shared rows red,
  unused white.
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
    path = os.fspath(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_grid(g: Grid, path) -> str:
    """Write the fractal grid ``g`` as a PNG at ``path``; returns the path.

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    plt = _pyplot()
    chunks, rows = g.shape
    data = np.ma.masked_less(g.logical_row.astype(float), 0)  # [chunks, rows]
    fig, ax = plt.subplots(figsize=(min(2 + 0.6 * chunks, 16), min(2 + 0.18 * rows, 14)))
    cmap = plt.get_cmap("viridis").with_extremes(bad="#d0d0d0")
    im = ax.imshow(data.T, cmap=cmap, aspect="auto", interpolation="nearest",
                   extent=(-0.5, chunks - 0.5, rows - 0.5, -0.5))
    for r in range(g.fractal_rows, rows, g.fractal_rows):
        ax.axhline(r - 0.5, color="white", lw=1.5)
    for j in range(1, chunks):
        ax.axvline(j - 0.5, color="white", lw=0.8)
    if chunks * rows <= 512:
        base = int(g.offset.min())
        who = "slot " if g.kind == "cache block" else "m "
        for j in range(chunks):
            for r in range(rows):
                lr = int(g.logical_row[j, r])
                label = ("pad" if lr < 0 else f"{who}{lr}") + f"  +{int(g.offset[j, r]) - base}"
                ax.text(j, r, label, ha="center", va="center", fontsize=6,
                        color="black" if lr < 0 else "white")
    ax.set_xticks(range(chunks), [f"{int(g.first_col[j, 0])}-{int(g.first_col[j, 0]) + g.c0 - 1}"
                                  for j in range(chunks)], rotation=90, fontsize=7)
    ax.set_xlabel(f"C0 chunk (dims / columns; {g.c0 * g.itemsize} bytes per cell)")
    ax.set_ylabel("row inside the fractals (16 per fractal)")
    ax.set_title(f"{g.title}\nmemory runs down each C0 column, then on to the next; cells show "
                 f"+byte offset from {int(g.offset.min())}", fontsize=8)
    fig.colorbar(im, ax=ax, label="slot" if g.kind == "cache block" else "ND row m")
    return _save(fig, path)


def plot_diff(d: Diff, path) -> str:
    """Write the blocks x rows heat map of ``d`` (differing bytes per slot) at ``path``.

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    plt = _pyplot()
    heat = d.heat  # [BlockNum, BlockSize]
    fig, ax = plt.subplots(figsize=(min(3 + 0.12 * heat.shape[1], 16), min(2 + 0.25 * heat.shape[0], 14)))
    data = np.ma.masked_equal(heat.astype(float), 0)
    cmap = plt.get_cmap("magma_r").with_extremes(bad="#f4f4f4")
    im = ax.imshow(data, cmap=cmap, aspect="auto", interpolation="nearest")
    ax.set_xlabel("row inside the block")
    ax.set_ylabel("block")
    if heat.shape[0] <= 64:
        ax.set_yticks(range(heat.shape[0]))
    s = d.summary
    ax.set_title(f"{s['bytes']} differing bytes in {len(s['slots'])} slot(s)"
                 + (f"; {s['outside_expected_bytes']} outside the expected slots"
                    if s["outside_expected_bytes"] is not None else ""), fontsize=9)
    fig.colorbar(im, ax=ax, label="differing bytes")
    return _save(fig, path)


def plot_blocks(m: BlockMap, path) -> str:
    """Write the blocks x rows occupancy of ``m`` at ``path`` (colour = sequence; red shared;
    white unused).

    Raises:
        ModuleNotFoundError: matplotlib missing.
    """
    plt = _pyplot()
    from matplotlib.colors import ListedColormap

    occ = m.occupancy  # [num_blocks, block_size]
    nseq = max(len(m.sequences), 1)
    base = plt.get_cmap("tab20")(np.arange(nseq) % 20)
    # colour index = occupancy - SHARED: 0 shared (red), 1 unused (white), 2 + b sequence b
    cmap = ListedColormap(np.vstack([[1, 0, 0, 1], [1, 1, 1, 1], base]))
    fig, ax = plt.subplots(figsize=(min(3 + 0.12 * m.block_size, 16), min(2 + 0.3 * max(m.num_blocks, 1), 14)))
    ax.imshow(occ - SHARED, cmap=cmap, vmin=0, vmax=nseq + 1, aspect="auto", interpolation="nearest")
    if m.num_blocks <= 64:
        shared, unused = set(m.shared_blocks), set(m.unused_blocks)
        ax.set_yticks(range(m.num_blocks), [f"{b}" + (" shared" if b in shared else " unused" if b in unused else "")
                                            for b in range(m.num_blocks)], fontsize=7)
    ax.set_xlabel("row inside the block")
    ax.set_ylabel("block")
    ax.set_title(f"block table: {len(m.sequences)} sequence(s), BlockSize {m.block_size}; "
                 f"{len(m.unused_blocks)} unused, {len(m.shared_blocks)} shared block(s)", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=base[i]) for i in range(min(nseq, 20))]
    handles += [plt.Rectangle((0, 0), 1, 1, color="red"), plt.Rectangle((0, 0), 1, 1, fc="white", ec="grey")]
    ax.legend(handles, [f"seq {i}" for i in range(min(nseq, 20))] + ["row read twice", "unused"], fontsize=6,
              loc="upper left", bbox_to_anchor=(1.01, 1))
    return _save(fig, path)
