"""``ascend-emu inspect where|what|dump|grid|diff|blocks`` and its alias ``ascend-emu locate``.

Parses arguments, calls the pure functions of :mod:`ascend_emu.inspect` and renders their results:
text (rich tables that fit the terminal, :mod:`ascend_emu.textview`), ``--json`` (one JSON object; NaN / inf as strings) or ``--png PATH``
(:mod:`ascend_emu.inspect.plot`). Exit status: 0 on success, 2 on a usage or input error (the
message names the argument); ``diff`` exits 1 when bytes differ outside the expected slots (all
differing bytes without ``--expect-slots``), like ``diff(1)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..textview import Col, fits, print_table
from .files import jsonable

#: Bytes per dump row, widest first: the text view shows the widest that fits the terminal (every
#: dump line of 32 bytes is split into rows of that many bytes, each with its own offset).
ROW_BYTES = (32, 16, 8, 4)


def _err(msg: str) -> None:
    print(f"ascend-emu: {msg}", file=sys.stderr)


def _print_json(obj) -> None:
    print(json.dumps(jsonable(obj)))


def _console():
    from ..textview import console

    return console()


# ---------------------------------------------------------------------------------------- argument types
def parse_shape(text: str) -> tuple[int, ...]:
    """``4,16,1,64`` (or ``4x16x1x64``) -> (4, 16, 1, 64); argparse type."""
    try:
        shape = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 4,16,1,64, got {text!r}") from None
    if not shape or any(v <= 0 for v in shape):
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return shape


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _byte_range(text: str) -> tuple[int, int | None]:
    """``START`` or ``START:STOP``."""
    try:
        lo, _, hi = text.partition(":")
        return int(lo), (int(hi) if hi else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START or START:STOP byte offsets, got {text!r}") from None


def _span(text: str) -> tuple[int | None, int | None]:
    """``START:STOP`` (either end may be left out: ``:64``, ``128:``) or one index ``I`` (``I:I+1``)."""
    try:
        lo, sep, hi = text.partition(":")
        if not sep:
            return int(lo), int(lo) + 1
        return (int(lo) if lo.strip() else None), (int(hi) if hi.strip() else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:STOP (either may be left out) or one index, got {text!r}") from None


# ---------------------------------------------------------------------------------------- cache arguments
def _add_geometry(p: argparse.ArgumentParser, *, file: str | None) -> None:
    from ..layouts import CACHE_MODE_ALIASES, CACHE_MODES
    from .cache import CACHE_DTYPES, DTYPE_ALIASES, canonical_dtype_name

    if file == "one":
        p.add_argument("file", nargs="?", help="cache file: .npz (ascend_emu.inspect.save_cache), .pt (torch.save "
                                               "of the cache), .npy or raw .bin")
    elif file == "two":
        p.add_argument("file_a", help="first cache file")
        p.add_argument("file_b", help="second cache file")
    p.add_argument("--cache-mode", choices=list(CACHE_MODES) + list(CACHE_MODE_ALIASES),
                   help="cache layout (required without an .npz file)" if file else "cache layout (required)")
    p.add_argument("--shape", type=parse_shape,
                   help="declared shape (PA_* [BlockNum, BlockSize, Nkv, D]; BSND [B, S, Nkv, D]; TND [T, Nkv, D]; "
                        "Norm [B, 1, cache_length, D]) or NZ storage shape [BlockNum, D/C0, BlockSize, C0]")
    p.add_argument("--dtype", type=canonical_dtype_name, choices=list(CACHE_DTYPES),
                   help=f"cache dtype (or the short name {', '.join(DTYPE_ALIASES)})")
    p.add_argument("--combined", action="store_true", default=None,
                   help="cache of 656-byte rows (512 k_nope | 64 bf16 k_rope | 4 fp32 scales; k_nope int8, or "
                        "on the Ascend 950 HiF8 (--dtype uint8) / float8_e4m3fn); automatic for such ND caches "
                        "with D = 656")


def _spec(ns, name: str = "--shape"):
    """CacheSpec from --cache-mode --shape --dtype (no file)."""
    from ..errors import ShapeError, arg_error
    from .cache import CacheSpec

    missing = [f"--{k.replace('_', '-')}" for k in ("cache_mode", "shape", "dtype") if getattr(ns, k) is None]
    if missing:
        raise arg_error(ShapeError, "/".join(missing), "a value (or a cache file)", None)
    return CacheSpec.from_shape(ns.cache_mode, ns.shape, ns.dtype, combined=ns.combined, name=name)


def _load(ns, path: str | None):
    from .files import load_cache

    if path is None:  # dump / diff read bytes: the geometry alone is not enough
        raise _usage("FILE: expected a cache file to read the bytes from (--cache-mode / --shape / --dtype "
                     "only describe it), got none")

    return load_cache(path, cache_mode=ns.cache_mode, shape=ns.shape, dtype=ns.dtype, combined=ns.combined)


def _cache_or_spec(ns):
    return _load(ns, ns.file) if getattr(ns, "file", None) else _spec(ns)


def _describe(info: dict) -> str:
    parts = [f"{info['cache_mode']} {info['dtype']}", f"{info['num_blocks']} x {info['block_size']} rows",
             f"Nkv {info['heads']}", f"D {info['dim']}", f"storage {info['storage_shape']}"]
    if "C0" in info:
        parts.append(f"C0 {info['C0']}")
    if "row_format" in info:
        parts.append(f"656-byte rows (tile {info['row_format']['tile_size']})")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------- where / what
def cmd_where(ns) -> int:
    """``inspect where``: logical -> bytes."""
    from .address import token_slot, where

    target = _cache_or_spec(ns)
    spec = getattr(target, "spec", target)
    if getattr(ns, "token", None) is not None:
        index = None if ns.index is None else _int_array(ns.index, "--index")
        ns.slot = token_slot(target, ns.token, index=index, seq_lens=ns.seq_lens, page_index=ns.page_index)
    elif getattr(ns, "index", None) is not None:
        raise _usage("--index goes with --token")
    res = where(target, ns.slot, head=ns.head, dim=ns.dim, field=ns.field, element=ns.element)
    lay = spec.layout
    info = res.to_dict()
    info["chunk_bytes"] = lay.chunk_bytes
    info["chunks"] = [{"elements": [r.first, r.last], "byte_offset": r.start, "bytes": r.stop - r.start,
                       "field": r.field, "head": r.head} for r in res.ranges]
    if getattr(ns, "token", None) is not None:
        info["token"] = ns.token
    if ns.dim is not None:
        off = lay.byte_offset(ns.slot, ns.dim, ns.head or 0)
        info.update(head=ns.head or 0, dim=ns.dim, byte_offset=off, element_offset=off // lay.itemsize)
    if ns.json:
        _print_json(info)
        return 0
    con = _console()
    con.print(_describe(info["cache"]))
    what = f"slot {res.slot} = block {res.block}, row {res.row}"
    if getattr(ns, "token", None) is not None:
        what = f"token {ns.token} -> {what}"
    if ns.dim is not None:
        what += f", head {ns.head or 0}, dim {ns.dim}"
    elif ns.field is not None:
        what += f", {ns.field}" + (f"[{ns.element}]" if ns.element is not None else "")
    print_table(con, f"{what}: {len(res.ranges)} contiguous range(s), {res.nbytes} bytes",
                [Col("bytes"), Col("head"), Col("field"), Col("elements"), Col("C0 chunk")],
                [[f"[{r.start}, {r.stop})", str(r.head), r.field, f"[{r.first}, {r.last})",
                  "" if r.c0_chunk is None else str(r.c0_chunk)] for r in res.ranges])
    if ns.dim is not None and spec.row_format is not None:
        con.print(f"656-byte row byte {ns.dim} -> bytes [{info['byte_offset']}, {info['byte_offset'] + 1})")
    return 0


def cmd_what(ns) -> int:
    """``inspect what``: byte -> logical."""
    from .address import what, what_weight

    if getattr(ns, "weight_shape", None) is not None:
        if ns.dtype is None:
            raise _usage("--weight-shape needs --dtype")
        w = what_weight(ns.weight_shape, _np_dtype(ns.dtype), ns.byte)
        if ns.json:
            _print_json(w.to_dict())
        else:
            where_ = "padding" if w.padding else f"element {w.index}, byte {w.byte_in_element}"
            _console().print(f"FRACTAL_NZ weight {list(ns.weight_shape)} {ns.dtype}, storage {w.storage_shape}\n"
                             f"byte {w.byte_offset} -> {where_}; storage index {w.storage_index} (C0 chunk "
                             f"{w.c0_chunk}, fractal {w.fractal})")
        return 0
    res = what(_cache_or_spec(ns), ns.byte)
    if ns.json:
        _print_json(res.to_dict())
        return 0
    con = _console()
    con.print(_describe(res.cache))
    if res.unused:
        con.print(f"byte {res.byte_offset}: unused (past the cache's {res.cache['nbytes']} bytes)")
        return 0
    text = f"byte {res.byte_offset} -> block {res.block}, row {res.row} (slot {res.slot}), head {res.head}, "
    if res.field == "element":
        text += f"dim {res.dim}, byte {res.byte_in_element} of the element"
    else:
        nope = res.cache.get("row_format", {}).get("nope_element", "int8")
        text += (f"656-byte row byte {res.dim}: {res.field}[{res.field_element}], byte {res.field_byte} of the "
                 f"{nope if res.field == 'k_nope' else 'bf16' if res.field == 'k_rope' else 'fp32'}")
    if res.c0_chunk is not None:
        text += f"\n  NZ: C0 chunk {res.c0_chunk}, fractal {res.fractal} of the block"
    con.print(text)
    return 0


# ---------------------------------------------------------------------------------------- dump
def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _values(vals) -> str:
    return " ".join(_fmt(v) for v in vals)


def _dump_rows(res, cache, per_row: int, one_slot: bool) -> tuple[list[list[str]], list[int]]:
    """Rows of the dump table with ``per_row`` bytes each (a 32-byte dump line split into
    several), and the indices of the rows that start a new NZ fractal (their field cell names it
    on a second line, ``> fractal F of C0 chunk J``)."""
    combined, nz = cache.spec.row_format is not None, cache.layout.nz
    rows, sections = [], []
    for ln in res.lines:
        if nz and any(m.startswith("fractal") for m in ln.marks) and ln is not res.lines[0]:
            sections.append(len(rows))
        hexb = ln.hex.split()
        size = len(hexb) // len(ln.values)  # bytes per element
        step = max(per_row // size, 1)  # elements per row
        for p in range(0, len(ln.values), step):
            first, last = ln.first + p, min(ln.first + p + step, ln.last)
            label = f"{ln.field}[{first}:{last}]" + (f" h{ln.head}" if cache.layout.heads > 1 else "")
            if ln.c0_chunk is not None:
                label += f" C0#{ln.c0_chunk} F{ln.fractal}"
            if not p and nz:
                label += "".join(f"\n> {m.split(' (')[0]}" for m in ln.marks if m.startswith("fractal"))
            row = [str(ln.offset + p * size)] + ([] if one_slot else [f"{ln.slot} ({ln.block},{ln.row})"])
            row += [label, " ".join(hexb[p * size:(p + step) * size]), _values(ln.values[p:p + step])]
            if combined:
                row.append("" if ln.dequant is None else
                           (f"tile {ln.tile}: " if ln.tile is not None else "") + _values(ln.dequant[p:p + step]))
            rows.append(row)
    return rows, sections


def _closed(span):
    """A --slot / --block span for :func:`~ascend_emu.inspect.dump.dump`: one index, or
    ``(start, stop)`` (an open end: from 0 / one past start)."""
    if span is None:
        return None
    lo, hi = span
    lo = 0 if lo is None else lo
    return lo if hi is None or hi == lo + 1 else (lo, hi)


def cmd_dump(ns) -> int:
    """``inspect dump``: annotated hexdump."""
    from .dump import dump

    cache = _load(ns, ns.file)
    start, stop = ns.bytes if ns.bytes is not None else (None, None)
    res = dump(cache, slot=_closed(ns.slot), block=_closed(ns.block), start=start, stop=stop,
               dims=None if ns.dims is None else (ns.dims[0] or 0, ns.dims[1] if ns.dims[1] is not None else 1 << 62))
    if ns.json:
        _print_json(res.to_dict())
        return 0
    con = _console()
    con.print(_describe(res.cache))
    combined = cache.spec.row_format is not None
    slots = sorted({(ln.slot, ln.block, ln.row) for ln in res.lines})
    one_slot = len(slots) == 1
    # values and dequant never fold: each on one line per row. Bytes per row: the most with which
    # every column fits; if none, the fewest (dequant left out, named) when there is a dequant
    # column (so a wider terminal never shows fewer bytes per row), else the most with which the
    # rest fits. So the dump never gets taller as the terminal gets wider.
    cols = ([Col("offset", justify="right")] + ([] if one_slot else [Col("slot (b,r)", wrap=True, min=8)])
            + [Col("field [elements]", wrap=True, min=16), Col("bytes"), Col("values")]
            + ([Col("dequant", drop=1)] if combined else []))
    chosen = None
    for per_row in ROW_BYTES:
        rows, sections = _dump_rows(res, cache, per_row, one_slot)
        if fits(cols, rows, con.width, optional=True):
            break
        if chosen is None and not combined and fits(cols, rows, con.width):
            chosen = (per_row, rows, sections)
    else:
        per_row, rows, sections = chosen if chosen is not None else (per_row, rows, sections)
    where_ = f" of slot {slots[0][0]} (block {slots[0][1]}, row {slots[0][2]})" if one_slot else ""
    print_table(con, f"{res.what}: bytes [{res.start}, {res.stop}){where_}, {len(rows)} row(s) of up to {per_row} "
                     f"bytes", cols, rows, sections=sections)
    if res.tiles:
        nope = res.cache["row_format"]["nope_element"]
        print_table(con, f"per-tile scales (k_nope ~= {nope} * scale)",
                    [Col("slot"), Col("tile"), Col("k_nope elements"), Col("scale"), Col("dequant min"),
                     Col("dequant max")],
                    [[str(t.slot), str(t.tile), f"[{t.first}, {t.last})", _fmt(t.scale), _fmt(t.dequant_min),
                      _fmt(t.dequant_max)] for t in res.tiles])
    return 0


# ---------------------------------------------------------------------------------------- grid
#: A grid of more cells than this is shown through a window unless --rows / --chunks pick one.
GRID_TEXT_CELLS = 4096
#: The default window of such a grid: its first rows (4 fractals) and C0 chunks.
GRID_WINDOW_ROWS, GRID_WINDOW_CHUNKS = 64, 16


def _grid_window(ns, extent: tuple[int, int]) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """The (rows, chunks) window of ``inspect grid``: --rows / --chunks as given (``START:STOP``,
    either end optional), the rest of a grid over :data:`GRID_TEXT_CELLS` cells limited to the
    default window."""
    n_chunks, n_rows = extent
    big = n_chunks * n_rows > GRID_TEXT_CELLS

    def pick(given, total, default):
        if given is not None:
            lo, hi = given
            return (0 if lo is None else lo, total if hi is None else hi)
        return (0, min(total, default)) if big else None

    return pick(ns.rows, n_rows, GRID_WINDOW_ROWS), pick(ns.chunks, n_chunks, GRID_WINDOW_CHUNKS)


def cmd_grid(ns) -> int:
    """``inspect grid``: NZ fractal grid of a cache block or a weight (a window of a large one)."""
    from .grid import grid, grid_extent, weight_grid

    if ns.weight_shape is not None:
        if ns.dtype is None:
            raise _usage("--weight-shape needs --dtype")
        rows, chunks = _grid_window(ns, grid_extent(weight_shape=ns.weight_shape, dtype=_np_dtype(ns.dtype)))
        g = weight_grid(ns.weight_shape, _np_dtype(ns.dtype), batch=ns.batch, rows=rows, chunks=chunks)
    else:
        spec = _cache_or_spec(ns)
        rows, chunks = _grid_window(ns, grid_extent(spec))
        g = grid(spec, ns.block, rows=rows, chunks=chunks)
    if ns.png:
        from ..progress import busy
        from .plot import plot_grid

        with busy(f"drawing {ns.png}"):
            plot_grid(g, ns.png)
    if ns.json:
        _print_json(g.to_dict())
        return 0
    con = _console()
    chunks, rows = g.shape
    who = "slot" if g.kind == "cache block" else "m"
    base = int(g.offset.min())
    cols = [Col("row")] + [Col(f"C0#{g.chunk0 + j}\n[{int(g.first_col[j, 0])}:{int(g.first_col[j, 0]) + g.c0}]")
                           for j in range(chunks)]
    table = []
    for r in range(rows):
        held = {int(v) for v in g.logical_row[:, r] if v >= 0}
        label = f"{g.row0 + r}: " + (f"{who} {held.pop()}" if len(held) == 1 else "pad" if not held else
                                     f"{who} {sorted(held)}")
        cells = []
        for j in range(chunks):
            cell = "pad" if g.logical_row[j, r] < 0 else f"+{int(g.offset[j, r]) - base}"
            if 0 < g.valid_cols[j, r] < g.c0:
                cell += f" ({int(g.valid_cols[j, r])} cols)"
            cells.append(cell)
        table.append([label, *cells])
    window = ""
    if not g.whole:
        n_chunks, n_rows = g.extent
        window = (f"\nwindow: rows [{g.row0}, {g.row0 + rows}) of {n_rows}, C0 chunks [{g.chunk0}, {g.chunk0 + chunks})"
                  f" of {n_chunks}; --rows START:STOP / --chunks START:STOP pick another")
    print_table(con, f"{g.title}\ncell = the {g.c0 * g.itemsize} bytes of one row's C0 chunk, shown as its byte "
                     f"offset from {base}; memory runs down each C0 column, then on to the next{window}",
                [Col(f"row: {who}")] + cols[1:], table,
                sections=[r for r in range(1, rows) if (g.row0 + r) % g.fractal_rows == 0])
    if ns.png:
        con.print(f"picture: {ns.png}")
    return 0


def _np_dtype(name: str):
    from .cache import CACHE_DTYPES

    import numpy as np

    return CACHE_DTYPES[name] if name in CACHE_DTYPES else np.dtype(name)


# ---------------------------------------------------------------------------------------- diff
def cmd_diff(ns) -> int:
    """``inspect diff A B``."""
    from .diff import diff

    a, b = _load(ns, ns.file_a), _load(ns, ns.file_b)
    res = diff(a, b, expect_slots=ns.expect_slots)
    if ns.png:
        from ..progress import busy
        from .plot import plot_diff

        with busy(f"drawing {ns.png}"):
            plot_diff(res, ns.png)
    s = res.summary
    bad = s["bytes"] if s["outside_expected_bytes"] is None else s["outside_expected_bytes"]
    if ns.json:
        _print_json(res.to_dict())
        return 1 if bad else 0
    con = _console()
    con.print(_describe(res.cache))
    if res.same:
        con.print(f"no differing bytes ({res.nan_equal} element(s) NaN in both, bits differing, counted equal)")
        return 0
    rows = []
    for sd in res.slots[:ns.max_slots]:
        for k, fd in enumerate(sd.fields):
            elems = ", ".join(map(str, fd.elements[:8])) + (" ..." if len(fd.elements) > 8 else "")
            rows.append([str(sd.block) if k == 0 else "", f"{sd.slot} ({sd.row})" if k == 0 else "", fd.field,
                         str(fd.bytes), elems, "" if fd.max_ulp is None else str(fd.max_ulp),
                         "" if fd.max_int_delta is None else str(fd.max_int_delta),
                         "" if sd.expected is None else ("yes" if sd.expected else "NO")])
    cols = [Col("block"), Col("slot (row)", wrap=True), Col("field"), Col("bytes"), Col("elements", wrap=True),
            Col("max ulp", wrap=True), Col("max |int delta|", wrap=True), Col("expected", wrap=True)]
    print_table(con, f"{s['bytes']} differing byte(s) in {len(s['slots'])} slot(s)", cols, rows)
    if len(res.slots) > ns.max_slots:
        con.print(f"... {len(res.slots) - ns.max_slots} more slot(s) (--max-slots, or --json for all)")
    lines = [f"summary: {s['bytes']} bytes, slots {', '.join(map(str, s['slots'][:32]))}"
             f"{' ...' if len(s['slots']) > 32 else ''}",
             "  " + ", ".join(f"{name}: {value}" for name, value in (
                 ("max ulp (bf16)", s["max_ulp_bf16"]), ("max int8 delta", s["max_int8_delta"]),
                 ("scale bytes", s["scale_bytes"]), ("NaN on one side", s["nan_mismatch"]),
                 ("NaN on both (equal)", res.nan_equal)) if value is not None)]  # none that does not apply
    if s["outside_expected_bytes"] is not None:
        lines.append(f"  outside the expected slots: {s['outside_expected_bytes']} bytes in slots "
                     f"{s['outside_expected_slots']}")
    if ns.png:
        lines.append(f"picture: {ns.png}")
    from rich.text import Text

    con.print(Text("\n".join(lines)))
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------- blocks
#: File names an integer-array option (``--block-table``, ``--index``) reads as a file.
INT_ARRAY_FILES = (".json", ".npy", ".pt", ".pth")


def _int_array(text: str, option: str):
    """An integer array from an option's text: a JSON list (``[[0,1],[2,3]]``), or a file holding
    one: ``.json`` (the same list), ``.npy`` (``numpy.save``) or ``.pt`` / ``.pth``
    (``torch.save`` of a tensor; needs torch).

    Raises:
        ShapeError: no such file, a file or text that is no integer array, naming ``option``.
        ModuleNotFoundError: a ``.pt`` file without torch (with the install hint).
    """
    import numpy as np

    from ..errors import ShapeError, arg_error

    kind = os.path.splitext(text)[1].lower()
    if kind in INT_ARRAY_FILES and not os.path.isfile(text):
        raise arg_error(ShapeError, option, f"an existing {kind} file (or a JSON list like [[0,1],[2,3]])",
                        f"{text!r}: no such file")
    try:
        if kind in (".pt", ".pth"):
            value = _torch_load(text, option).numpy()
        elif kind == ".npy":
            value = np.load(text, allow_pickle=False)
        else:
            if kind == ".json" or os.path.isfile(text):
                with open(text, encoding="utf-8") as f:
                    text_value = f.read()
            else:
                text_value = text
            value = json.loads(text_value)
        arr = np.asarray(value)
        if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and arr.size and np.all(arr == np.round(arr))):
            raise TypeError(f"{arr.dtype} values")
        return arr.astype(np.int64)
    except (json.JSONDecodeError, ValueError, TypeError) as exc:
        raise arg_error(ShapeError, option, "an integer array: a JSON list like [[0,1],[2,3]] or a .json / .npy / "
                        ".pt file holding one", f"{text!r} ({str(exc).splitlines()[0][:80]})") from None


def _torch_load(path: str, what: str):
    """``torch.load`` of a tensor file (``weights_only``), or ModuleNotFoundError with the hint."""
    from .files import torch_or_hint

    torch = torch_or_hint(f"{what} {path!r} (a torch.save file)")
    return torch.load(path, map_location="cpu", weights_only=True)


def _block_map_rows(res) -> list[list[str]]:
    rows = []
    shared = set(res.shared_blocks)
    for seq in res.sequences:
        for k, run in enumerate(seq.runs):
            n = run.last_token - run.first_token
            others = [s for s in res.owners[run.block] if s != seq.seq]
            rows.append([str(seq.seq) if k == 0 else "", f"[{run.first_token}, {run.last_token})", str(run.block),
                         str(run.column), f"[0, {n})", f"[{run.first_slot}, {run.first_slot + n})",
                         (f"shared with {', '.join(map(str, others))}" if others else "read twice")
                         if run.block in shared else ""])
        if not seq.runs:
            rows.append([str(seq.seq), "(empty)", "", "", "", "", ""])
    return rows


def _print_block_map(con, res, title: str, unit: str = "tokens") -> None:
    from rich.text import Text

    print_table(con, title, [Col("seq"), Col(unit), Col("block"), Col("table column", wrap=True), Col("rows"),
                             Col("slots"), Col("note", wrap=True)], _block_map_rows(res))
    con.print(Text(f"unused blocks: {', '.join(map(str, res.unused_blocks)) or 'none'}\n"
                   f"shared blocks: {', '.join(map(str, res.shared_blocks)) or 'none'}"))


def _v4_layer(ns):
    from ..layouts import V4LayerCaches

    return V4LayerCaches(ns.soc, ns.v4_ratio, block_size=ns.block_size,
                         num_blocks=ns.num_blocks if ns.num_blocks is not None else 1 + _max_entry(ns.block_table),
                         cmp_block_size=ns.cmp_block_size, cmp_num_blocks=ns.cmp_num_blocks,
                         state_num_blocks=ns.state_num_blocks)


def _max_entry(text: str) -> int:
    arr = _int_array(text, "--block-table")
    return int(arr.max()) if arr.size else 0


def cmd_blocks(ns) -> int:
    """``inspect blocks``: block-table view (with ``--v4-ratio``: the SWA, compressed and state caches
    of one DeepSeek-V4 layer)."""
    if ns.v4_ratio is not None:
        return _cmd_v4_blocks(ns)
    if ns.cmp_block_table or ns.state_block_table:
        raise _usage("inspect blocks: --cmp-block-table / --state-block-table go with --v4-ratio")
    from .blocks import blocks

    if ns.block_size is None:
        raise _usage("inspect blocks: --block-size: expected rows per block, got none")
    res = blocks(_int_array(ns.block_table, "--block-table"), ns.seq_lens, ns.block_size, ns.num_blocks)
    if ns.png:
        from .plot import plot_blocks

        plot_blocks(res, ns.png)
    if ns.json:
        _print_json(res.to_dict())
        return 0
    con = _console()
    _print_block_map(con, res, f"block table: BlockSize {res.block_size}, {res.num_blocks} block(s)")
    if ns.png:
        con.print(f"picture: {ns.png}")
    return 0


def _cmd_v4_blocks(ns) -> int:
    from .v4 import v4_blocks

    if ns.block_size is None:
        ns.block_size = 128
    layer = _v4_layer(ns)
    res = v4_blocks(layer, _int_array(ns.block_table, "--block-table"), ns.seq_lens,
                    cmp_block_table=_int_array(ns.cmp_block_table, "--cmp-block-table") if ns.cmp_block_table else None,
                    state_block_table=_int_array(ns.state_block_table, "--state-block-table")
                    if ns.state_block_table else None)
    pictures = []
    if ns.png:
        from .plot import plot_blocks

        stem, ext = os.path.splitext(ns.png)
        for name, m in (("swa", res.swa), ("compressed", res.compressed)):
            if m is not None:
                pictures.append(plot_blocks(m, f"{stem}_{name}{ext or '.png'}"))
    if ns.json:
        _print_json(res.to_dict())
        return 0
    con = _console()
    caches = layer.caches()
    desc = "; ".join(f"{k} {list(c.shape)} {c.dtype}" for k, c in caches.items())
    con.print(f"DeepSeek-V4 {layer.kind} layer ({layer.soc}, ratio {layer.ratio}): {desc}")
    _print_block_map(con, res.swa, f"SWA cache: {layer.block_size} tokens per block, {layer.num_blocks} block(s)")
    if res.compressed is not None:
        _print_block_map(con, res.compressed, f"compressed cache (c{layer.ratio}): {layer.cmp_block_size} rows of "
                         f"{layer.ratio} tokens per block ({layer.cmp_block_size * layer.ratio} tokens), "
                         f"{layer.cmp_num_blocks} block(s); rows = completed groups",
                         unit="compressed rows")
    if res.state is not None:
        rows = []
        for b, runs in enumerate(res.state):
            for k, run in enumerate(runs):
                n = run.stop - run.first
                where_ = "not updated (entry 0)" if run.block is None else \
                    f"block {run.block}, rows [{run.row}, {run.row + n})"
                rows.append([str(b) if k == 0 else "", str(run.column), f"[{run.first}, {run.stop})", where_])
        print_table(con, f"state cache: {layer.state_block_size} positions per block, {layer.state_num_blocks} "
                    f"block(s); kv state then score state, {2 * layer.coff} x D wide",
                    [Col("seq"), Col("table column", wrap=True), Col("positions"), Col("rows", wrap=True)], rows)
    for path in pictures:
        con.print(f"picture: {path}")
    return 0


def _v4_table_row(text: str | None, option: str):
    if text is None:
        return None
    arr = _int_array(text, option)
    if arr.ndim != 1:
        from ..errors import ShapeError, arg_error

        raise arg_error(ShapeError, option, "one request's block-table row (a 1-D list)", list(arr.shape))
    return arr


def cmd_v4_token(ns) -> int:
    """``inspect v4-token``: where a request's token lives in each cache of a V4 layer."""
    layer = _v4_layer(ns)
    res = layer.token_places(ns.position, _v4_table_row(ns.block_table, "--block-table"),
                             cmp_block_table_row=_v4_table_row(ns.cmp_block_table, "--cmp-block-table"),
                             state_block_table_row=_v4_table_row(ns.state_block_table, "--state-block-table"),
                             seq_len=ns.seq_len)
    if ns.json:
        _print_json({"layer": layer.to_dict(), "token": res.to_dict()})
        return 0
    con = _console()

    def at(p):
        return "beyond the block table given" if p is None else \
            f"block {p.block}, row {p.row} (slot {p.slot}; table column {p.column})"

    rows = [["SWA", at(res.swa)]]
    if res.compressed_row is not None:
        held = ns.seq_len if ns.seq_len is not None else ns.position + 1
        covers = f"tokens [{res.covers[0]}, {res.covers[1]})"
        if res.overlap is not None:
            covers += f", overlapping [{res.overlap[0]}, {res.overlap[1]})"
        state = "not updated (state block-table entry 0)" if res.state_skipped else \
            ("no --state-block-table" if res.state is None else at(res.state))
        rows += [[f"compressed row {res.compressed_row}", f"{at(res.compressed)}; {covers}; "
                  + ("written" if res.complete else f"not written yet (needs token {res.covers[1] - 1}, holds {held})")]]
        if res.indexer is not None:
            rows.append(["indexer key", at(res.indexer)])
        rows.append(["state", state])
    print_table(con, f"token {ns.position} of a DeepSeek-V4 {layer.kind} layer ({layer.soc})",
                [Col("cache"), Col("where", wrap=True)], rows)
    return 0


def _load_v4_array(path: str):
    import numpy as np

    kind = os.path.splitext(path)[1].lower()
    if kind == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return z["data"]
    if kind == ".npy":
        return np.load(path, allow_pickle=False)
    if kind in (".pt", ".pth"):
        t = _torch_load(path, "FILE")
        import torch

        return t.view(torch.uint8).numpy() if t.element_size() == 1 else t.numpy()
    return np.fromfile(path, dtype=np.uint8)


def cmd_v4_row(ns) -> int:
    """``inspect v4-row``: decode one 640-byte row of a 950 SWA / compressed cache."""
    from .v4 import v4_cache_row

    res = v4_cache_row(_load_v4_array(ns.file), ns.slot)
    if ns.json:
        _print_json(res.to_dict())
        return 0
    con = _console()
    print_table(con, f"slot {ns.slot}: one 640-byte DeepSeek-V4 row",
                [Col("bytes"), Col("field"), Col("what", wrap=True)],
                [[f"[{a}, {b})", name, {"rope": "64 rope values, bf16", "values": "448 fp8 E4M3FN values, 7 groups of 64",
                                        "scales": "one E8M0 scale per group", "pad": "zero padding"}[name]]
                 for name, a, b in res.fields])
    rows = []
    for g, (byte, exp) in enumerate(zip(res.scale_bytes, res.scale_exponents, strict=True)):
        vals = res.values[g * 64:(g + 1) * 64]
        rows.append([str(g), f"{byte} (2^{exp})", ", ".join(_fmt(v) for v in vals[:ns.show]) + (" ..." if len(vals) > ns.show else "")])
    print_table(con, "values dequantized (fp8 * 2^(byte - 127))", [Col("group"), Col("scale"), Col("values", wrap=True)],
                rows)
    con.print("rope: " + ", ".join(_fmt(v) for v in res.rope[:ns.show]) + (" ..." if len(res.rope) > ns.show else ""))
    con.print(f"pad: {len(res.pad)} byte(s), " + ("all zero" if res.pad_zero else "NOT all zero"))
    return 0


# ---------------------------------------------------------------------------------------- parsers
def _add_where_what(p: argparse.ArgumentParser, *, which: str) -> None:
    _add_geometry(p, file="one")
    if which == "where":
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--slot", type=int, help="global slot (block * BlockSize + row)")
        which.add_argument("--token", type=int, help="flat token b*S + s of an op call, mapped through --index")
        p.add_argument("--index", help="with --token: the op's index (cache_index / index) as "
                                                        "JSON or a .json / .npy / .pt file; none for BSND / TND")
        p.add_argument("--seq-lens", type=_int_list, help="with --token, PA_BLK_*: tokens per batch")
        p.add_argument("--page-index", choices=["block_ids", "page_offsets"], default="block_ids",
                       help="PA_BLK_* index values: block ids (npu_mla_prolog_v3, default) or page start "
                            "offsets block_id*BlockSize (npu_kv_rmsnorm_rope_cache)")
        p.add_argument("--dim", type=int, help="element of the row (the row's byte for 656-byte rows)")
        p.add_argument("--head", type=int, help="kv head (default: all; 0 with --dim)")
        p.add_argument("--field", help="element / k_nope / k_rope / scale")
        p.add_argument("--element", type=int, help="with --field: one element of it (tile for scale)")
    else:
        p.add_argument("--byte", type=int, required=True, help="byte offset from the start of the cache")
        p.add_argument("--weight-shape", type=parse_shape,
                       help="instead of a cache: a FRACTAL_NZ weight of this ND shape [.., M, N] (with --dtype)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_v4_layer(p: argparse.ArgumentParser, *, ratio_required: bool = False) -> None:
    from ..layouts import V4_LAYER_KINDS, V4_SOCS

    p.add_argument("--v4-ratio", type=int, choices=sorted(V4_LAYER_KINDS), required=ratio_required,
                   help="DeepSeek-V4 layer: 1 SWA, 4 CSA (c4 + indexer), 128 HCA (c128)")
    p.add_argument("--soc", choices=list(V4_SOCS), default="a2a3", help="V4 cache family (default a2a3)")
    p.add_argument("--cmp-block-table", help="compressed-cache block table (default: the SWA one)")
    p.add_argument("--state-block-table", help="state block table (entry 0: not updated)")
    p.add_argument("--cmp-block-size", type=int, help="compressed rows per block (default: --block-size)")
    p.add_argument("--cmp-num-blocks", type=int, help="compressed blocks (default: --num-blocks)")
    p.add_argument("--state-num-blocks", type=int, help="state blocks (default: --num-blocks)")


def add_inspect_parser(sub) -> None:
    """Register ``inspect`` (with its eight commands) on the ``ascend-emu`` subparsers ``sub``."""
    ins = sub.add_parser("inspect", help="bit-level cache debugging: where, what, dump, grid, diff, blocks, v4-token, v4-row",
                         description="Inspect KV caches byte by byte (ascend_emu.inspect). Caches come from "
                                     "--cache-mode/--shape/--dtype (address maps only) or a file: .npz written "
                                     "by ascend_emu.inspect.save_cache, a torch.save .pt dump, .npy, or raw .bin "
                                     "(with --shape --dtype --cache-mode).")
    cmds = ins.add_subparsers(dest="inspect_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("where", help="slot / dim / field -> byte offsets")
    _add_where_what(p, which="where")
    p.set_defaults(func=_guard(cmd_where, "inspect where"))

    p = cmds.add_parser("what", help="byte offset -> block, row, head, dim, field")
    _add_where_what(p, which="what")
    p.set_defaults(func=_guard(cmd_what, "inspect what"))

    p = cmds.add_parser("dump", help="annotated hexdump of a slot, a block or a byte range")
    _add_geometry(p, file="one")
    sel = p.add_mutually_exclusive_group(required=True)
    sel.add_argument("--slot", type=_span, metavar="SLOT[:STOP]", help="one slot (or a range), all fields")
    sel.add_argument("--block", type=_span, metavar="BLOCK[:STOP]", help="one block (or a range), in memory order")
    sel.add_argument("--bytes", type=_byte_range, help="START[:STOP] byte range (STOP default START+32)")
    p.add_argument("--dims", type=_span, metavar="START:STOP", help="only these elements of each field")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_guard(cmd_dump, "inspect dump"))

    p = cmds.add_parser("grid", help="fractal grid of an NZ cache block or NZ weight")
    _add_geometry(p, file="one")
    p.add_argument("--block", type=int, default=0, help="block id (default 0)")
    p.add_argument("--weight-shape", type=parse_shape, help="instead: FRACTAL_NZ weight of this ND shape [.., M, N]")
    p.add_argument("--batch", type=int, default=0, help="with --weight-shape: flat batch matrix index")
    p.add_argument("--rows", type=_span, metavar="START:STOP",
                   help=f"rows (m / block rows) shown; default all, or the first {GRID_WINDOW_ROWS} of a grid over "
                        f"{GRID_TEXT_CELLS} cells")
    p.add_argument("--chunks", type=_span, metavar="START:STOP",
                   help=f"C0 chunks (column groups) shown; default all, or the first {GRID_WINDOW_CHUNKS} of a grid "
                        f"over {GRID_TEXT_CELLS} cells")
    p.add_argument("--png", metavar="PATH", help="write a picture (of the window shown)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_guard(cmd_grid, "inspect grid"))

    p = cmds.add_parser("diff", help="NaN-aware byte diff of two caches, by block / slot / field")
    _add_geometry(p, file="two")
    p.add_argument("--expect-slots", type=_int_list, help="slots expected to change, e.g. 3,17,40")
    p.add_argument("--max-slots", type=int, default=64, help="slots listed in text output (default 64)")
    p.add_argument("--png", metavar="PATH", help="write a blocks x rows heat map")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_guard(cmd_diff, "inspect diff"))

    p = cmds.add_parser("blocks", help="block table: which block and row each token lives in (--v4-ratio: the "
                                       "SWA, compressed and state caches of one DeepSeek-V4 layer)")
    p.add_argument("--block-table", required=True,
                   help="JSON [[...], ...] or a .json / .npy / .pt file holding it, [B, max_blocks]")
    p.add_argument("--seq-lens", type=_int_list, required=True, help="tokens per sequence, e.g. 20,5")
    p.add_argument("--block-size", type=int, help="rows per block (--v4-ratio: SWA tokens per block, default 128)")
    p.add_argument("--num-blocks", type=int, help="blocks in the cache (default: largest entry + 1)")
    _add_v4_layer(p)
    p.add_argument("--png", metavar="PATH", help="write a picture (--v4-ratio: PATH_swa.png and "
                                                 "PATH_compressed.png, one per cache)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_guard(cmd_blocks, "inspect blocks"))

    p = cmds.add_parser("v4-token", help="DeepSeek-V4: a request's token -> its SWA slot, compressed row (and "
                                         "the tokens it covers), indexer row, state row")
    p.add_argument("--position", type=int, required=True, help="the token's position in its request")
    p.add_argument("--block-table", required=True, help="the request's SWA block-table row, JSON [..] or a file")
    p.add_argument("--block-size", type=int, default=128, help="SWA tokens per block (default 128)")
    p.add_argument("--num-blocks", type=int, help="SWA blocks (default: largest entry + 1)")
    p.add_argument("--seq-len", type=int, help="tokens the request holds (default position + 1)")
    _add_v4_layer(p, ratio_required=True)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_guard(cmd_v4_token, "inspect v4-token"))

    p = cmds.add_parser("v4-row", help="DeepSeek-V4: decode one 640-byte row (rope, fp8 * E8M0 scale, pad)")
    p.add_argument("file", help="a 950 SWA / compressed cache [nb, bs, 1, 640]: .npz (save_cache), .npy, .pt or raw")
    p.add_argument("--slot", type=int, required=True, help="flat slot block * block_size + row")
    p.add_argument("--show", type=int, default=8, help="values shown per group (default 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object (every value)")
    p.set_defaults(func=_guard(cmd_v4_row, "inspect v4-row"))


def add_locate_parser(sub) -> None:
    """Register ``locate``: an alias of ``inspect where`` (``--slot``) / ``inspect what`` (``--byte``)."""
    loc = sub.add_parser("locate", help="alias of `inspect where` (--slot) / `inspect what` (--byte)",
                         description="Forward / reverse address map of a KV cache: `inspect where` with --slot, "
                                     "`inspect what` with --byte.")
    _add_geometry(loc, file=None)
    which = loc.add_mutually_exclusive_group(required=True)
    which.add_argument("--byte", type=int, help="reverse map: byte offset from the start of the cache")
    which.add_argument("--slot", type=int, help="forward map: global slot (block * BlockSize + row)")
    loc.add_argument("--dim", type=int, help="with --slot: element of the row (byte of the row with --combined)")
    loc.add_argument("--head", type=int, help="with --slot --dim: kv head (default 0)")
    loc.add_argument("--json", action="store_true", help="print one JSON object")
    loc.set_defaults(func=_guard(cmd_locate, "locate"), field=None, element=None)


def cmd_locate(ns) -> int:
    """``ascend-emu locate``: ``inspect where`` / ``inspect what``."""
    if ns.byte is not None and (ns.dim is not None or ns.head is not None):
        _err("locate: --dim / --head go with --slot, not --byte")
        return 2
    if ns.dim is None and ns.head is not None:
        _err("locate: --head needs --dim")
        return 2
    return cmd_what(ns) if ns.byte is not None else cmd_where(ns)


def _usage(message: str):
    """A usage error, reported like the house errors (exit 2)."""
    from ..errors import ModeError

    return ModeError(message)


def _guard(fn, name: str):
    """Run ``fn``; report house errors (and missing optional packages) as ``ascend-emu: NAME: msg``, exit 2."""
    def run(ns) -> int:
        from ..errors import AscendEmuError

        try:
            return fn(ns)
        except (AscendEmuError, ModuleNotFoundError, OSError) as exc:
            _err(f"{name}: {exc}")
            return 2

    run.__doc__ = fn.__doc__
    return run
