"""Every text view fits the terminal: ``inspect where|dump|grid|diff|blocks`` and the ``compare``
report at ``COLUMNS=80``, ``120`` and unset (80 for a pipe), no line wider, and the key facts
(offsets, bytes, values, field names, slots) all there, checked against the cache's own bytes and
tests/reference/layouts.py (element offsets by hand, docs/sources.md#paged_nz).

Each test sets ``COLUMNS`` itself (monkeypatch), so a suite-wide default width changes nothing.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ascend_emu import compare, inspect
from ascend_emu.cli import main
from ascend_emu.quant import BF16
from tests.reference import layouts as ref
from tests.reference import quant as qref

#: COLUMNS values tested; None: unset (stdout is not a terminal under pytest: 80 columns).
WIDTHS = ["80", "120", None]
#: A 512-wide bf16 PA_NZ kv_cache (the size that broke the views).
NZ = ("PA_NZ", (2, 16, 1, 512), "bfloat16")
HEX = re.compile(r"^(?:[0-9a-f]{2} )*[0-9a-f]{2}$")


def _run(monkeypatch, capsys, columns, argv, rc=0) -> str:
    """``ascend-emu ARGV`` at ``COLUMNS=columns``; asserts the exit status and that no line is wider."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert main(argv) == rc
    out = capsys.readouterr().out
    width = int(columns or 80)
    wide = [ln for ln in out.splitlines() if len(ln) > width]
    assert not wide, f"{len(wide)} line(s) wider than {width}: {wide[0]!r}"
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split("[│┃]", line)]


def _tables(out: str, key: str) -> list[dict]:
    """The tables of ``out``: ``{"header": [names], "rows": [{name: cell}]}``; a row spans lines
    until the next line whose ``key`` cell is not empty (wrapped cells joined with spaces)."""
    tables, header, rows = [], [], None
    for line in out.splitlines():
        if "┃" in line:
            cells = _cells(line)
            header = [f"{h} {c}".strip() for h, c in zip(header, cells, strict=True)] if header and rows is None else cells
            continue
        if line.startswith("━"):
            rows = []
            tables.append({"header": header, "rows": rows})
            continue
        if rows is None or "┼" in line:
            continue
        if "│" not in line:
            header, rows = [], None
            continue
        cells = dict(zip(header, _cells(line), strict=True))
        if cells.get(key) or not rows:
            rows.append(cells)
        else:
            for name, c in cells.items():
                rows[-1][name] = f"{rows[-1][name]} {c}".strip()
    return tables


def _dumped(out: str) -> dict[int, bytes]:
    """offset -> bytes of every row of an ``inspect dump`` table."""
    (table, *_) = _tables(out, "offset")
    got = {}
    for r in table["rows"]:
        assert HEX.match(r["bytes"]), r
        got[int(r["offset"])] = bytes.fromhex(r["bytes"])
    return got


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 512-wide NZ cache ``a``, ``b`` = ``a`` with bytes of slots 5 and 20 changed, and a cache of
    656-byte rows ``c`` (random parts packed by the reference struct format)."""
    tmp = tmp_path_factory.mktemp("views")
    rng = np.random.default_rng(80)
    mode, shape, dtype = NZ
    a = inspect.Cache.from_array(rng.standard_normal(shape).astype(BF16), mode)
    raw = a.raw.copy()
    changed = [ref.element_offset(mode, shape, 2, 0, 5, 0, d) * 2 + 1 for d in (100, 101, 300)]
    changed += [ref.element_offset(mode, shape, 2, 1, 4, 0, d) * 2 for d in range(0, 512, 3)]
    raw[changed] ^= 0x10
    b = inspect.Cache(spec=a.spec, raw=raw, shape=a.shape)
    rows = [qref.encode_row(rng.integers(-128, 128, qref.NOPE), rng.standard_normal(qref.ROPE).astype(BF16),
                            rng.random(qref.TILES).astype(np.float32) + 0.01) for _ in range(32)]
    c = inspect.Cache.from_array(np.frombuffer(b"".join(rows), np.int8).copy().reshape(2, 16, 1, 656), "PA_BSND")
    return {"a": inspect.save_cache(tmp / "a", a), "b": inspect.save_cache(tmp / "b", b),
            "c": inspect.save_cache(tmp / "c", c), "cache": a, "combined": c, "changed": changed}


@pytest.mark.parametrize("columns", WIDTHS)
def test_dump_of_a_512_wide_nz_slot(monkeypatch, capsys, files, columns):
    mode, shape, _ = NZ
    out = _run(monkeypatch, capsys, columns, ["inspect", "dump", files["a"], "--slot", "21"])
    got = _dumped(out)
    offsets = [ref.element_offset(mode, shape, 2, 1, 5, 0, d) * 2 for d in range(512)]  # slot 21 = block 1, row 5
    want = {o + k for o in offsets for k in (0, 1)}
    assert {o + k for o, b in got.items() for k in range(len(b))} == want  # every byte, each once
    assert sum(len(b) for b in got.values()) == len(want)
    raw = files["cache"].raw
    assert all(raw[o:o + len(b)].tobytes() == b for o, b in got.items())
    first = np.float32(files["cache"].rows()[21, 0, :4].astype(np.float32))
    assert all(f"{float(v):.4g}" in out for v in first)
    assert "element[0:" in out and "C0#31" in out


@pytest.mark.parametrize("columns", WIDTHS)
def test_dump_of_a_512_wide_nz_block_names_every_fractal_start(monkeypatch, capsys, files, columns):
    out = _run(monkeypatch, capsys, columns, ["inspect", "dump", files["a"], "--block", "1"])
    got = _dumped(out)
    raw = files["cache"].raw
    assert {o + k for o, b in got.items() for k in range(len(b))} == set(range(16 * 512 * 2, 32 * 512 * 2))
    assert all(raw[o:o + len(b)].tobytes() == b for o, b in got.items())
    (table, *_) = _tables(out, "offset")
    marks = [r["field [elements]"] for r in table["rows"] if ">" in r["field [elements]"]]
    assert [m.split("> ")[1] for m in marks] == [f"fractal 0 of C0 chunk {j}" for j in range(32)]
    for j, m in enumerate(marks):
        assert m.startswith(f"element[{16 * j}:") and m.split()[1:3] == [f"C0#{j}", "F0"]


@pytest.mark.parametrize("columns", WIDTHS)
def test_dump_of_combined_rows(monkeypatch, capsys, files, columns):
    out = _run(monkeypatch, capsys, columns, ["inspect", "dump", files["c"], "--slot", "3"])
    got = _dumped(out)
    row = files["combined"].raw[3 * 656:4 * 656].tobytes()
    assert b"".join(got[o] for o in sorted(got)) == row and min(got) == 3 * 656
    _, _, scales = qref.decode_row(row)
    for name in ("k_nope[0:", "k_rope[0:", "scale[0:", "per-tile scales"):
        assert name in out
    assert all(f"{float(s):.4g}" in out for s in scales)
    if "dequant" not in out.split("left out")[-1]:  # shown where it fits, else named as left out
        assert "tile 0:" in out


@pytest.mark.parametrize("file, args, most", [("c", ["--slot", "3"], 200), ("a", ["--slot", "21"], 300),
                                              ("a", ["--block", "1"], 8000)])
def test_dump_gets_no_taller_as_the_terminal_gets_wider(monkeypatch, capsys, files, file, args, most):
    """Each value, byte run and dequant cell stays on one line: a wider terminal shows as many or
    more bytes per row, never more lines (the dump of a 656-byte row took 142 lines at 80 columns
    and 273 at 120 when the value columns folded)."""
    heights = []
    for columns in ("80", "100", "120", "160", "200"):
        out = _run(monkeypatch, capsys, columns, ["inspect", "dump", files[file], *args])
        heights.append(len(out.splitlines()))
    assert heights == sorted(heights, reverse=True), heights
    assert heights[0] <= most and heights[-1] < heights[0], heights
    out = _run(monkeypatch, capsys, "200", ["inspect", "dump", files["c"], "--slot", "3"])
    assert "tile 0:" in out and "left out" not in out  # dequant shown at 200 columns


def test_dump_ranges_of_slots_blocks_and_dims(monkeypatch, capsys, files):
    out = _run(monkeypatch, capsys, "120", ["inspect", "dump", files["c"], "--slot", "3:5", "--dims", "0:8"])
    got = _dumped(out)
    raw = files["combined"].raw
    want = {}
    for slot in (3, 4):  # elements 0-7 of each field: k_nope bytes 0-7, k_rope 0-15, scales 0-15 (4 fp32)
        base = slot * 656
        for lo, hi in ((0, 8), (512, 528), (640, 656)):
            want.update({base + k: raw[base + k] for k in range(lo, hi)})
    assert {o + k: b for o, bs in got.items() for k, b in enumerate(bs)} == want
    assert "slots 3-4, elements [0, 8) of each field" in out
    out = _run(monkeypatch, capsys, "120", ["inspect", "dump", files["a"], "--block", "0:2"])
    assert set().union(*({o + k for k in range(len(b))} for o, b in _dumped(out).items())) == set(range(2 * 16 * 1024))
    assert main(["inspect", "dump", files["a"], "--slot", "30:40"]) == 2
    assert capsys.readouterr().err == ("ascend-emu: inspect dump: slot: expected a slot range start:stop within "
                                       "[0, 32], got 30:40\n")


@pytest.mark.parametrize("columns", WIDTHS)
def test_where_lists_every_c0_chunk(monkeypatch, capsys, files, columns):
    mode, shape, _ = NZ
    out = _run(monkeypatch, capsys, columns, ["inspect", "where", files["a"], "--slot", "21"])
    for j in range(32):
        start = ref.element_offset(mode, shape, 2, 1, 5, 0, 16 * j) * 2
        assert f"[{start}, {start + 32})" in out


@pytest.mark.parametrize("columns", WIDTHS)
def test_grid_of_a_512_wide_block_shows_every_cell(monkeypatch, capsys, files, columns):
    mode, shape, _ = NZ
    out = _run(monkeypatch, capsys, columns, ["inspect", "grid", files["a"], "--block", "1"])
    base = 16 * 512 * 2
    cells = {}  # (row, chunk) -> relative offset, read page by page
    for table in _tables(out, "row: slot"):
        for r in table["rows"]:
            m = re.match(r"(\d+): slot (\d+)$", r["row: slot"])
            assert int(m.group(2)) == 16 + int(m.group(1))
            for name, cell in r.items():
                if name.startswith("C0#"):
                    chunk = int(name.split()[0][3:])
                    assert name == f"C0#{chunk} [{16 * chunk}:{16 * chunk + 16}]"
                    cells[int(m.group(1)), chunk] = int(cell.lstrip("+"))
    assert len(cells) == 16 * 32
    for (r, j), off in cells.items():
        assert base + off == ref.element_offset(mode, shape, 2, 1, r, 0, 16 * j) * 2


@pytest.mark.parametrize("columns", WIDTHS)
def test_diff_table(monkeypatch, capsys, files, columns):
    out = _run(monkeypatch, capsys, columns, ["inspect", "diff", files["a"], files["b"], "--expect-slots", "20"],
               rc=1)
    assert f"{len(files['changed'])} differing byte(s) in 2 slot(s)" in out
    (table,) = _tables(out, "field")
    by_slot = {r["slot (row)"].split()[0]: r for r in table["rows"]}
    assert set(by_slot) == {"5", "20"}
    five, twenty = by_slot["5"], by_slot["20"]
    assert (five["block"], five["bytes"], five["elements"], five["expected"]) == ("0", "3", "100, 101, 300", "NO")
    assert (twenty["block"], twenty["bytes"], twenty["expected"]) == ("1", str(len(range(0, 512, 3))), "yes")
    assert twenty["elements"] == ", ".join(map(str, range(0, 24, 3))) + " ..."
    flat = " ".join(out.split())
    assert "outside the expected slots: 3 bytes in slots [5]" in flat


@pytest.mark.parametrize("columns", WIDTHS)
def test_blocks_table(monkeypatch, capsys, columns):
    table = "[[0,1,9,3],[2,1,0,4],[5,6,7,8]]"
    out = _run(monkeypatch, capsys, columns, ["inspect", "blocks", "--block-table", table, "--seq-lens", "50,17,64",
                                              "--block-size", "16", "--num-blocks", "12"])
    (table,) = _tables(out, "tokens")
    assert [(r["tokens"], r["block"], r["slots"]) for r in table["rows"]] == [
        ("[0, 16)", "0", "[0, 16)"), ("[16, 32)", "1", "[16, 32)"), ("[32, 48)", "9", "[144, 160)"),
        ("[48, 50)", "3", "[48, 50)"), ("[0, 16)", "2", "[32, 48)"), ("[16, 17)", "1", "[16, 17)"),
        ("[0, 16)", "5", "[80, 96)"), ("[16, 32)", "6", "[96, 112)"), ("[32, 48)", "7", "[112, 128)"),
        ("[48, 64)", "8", "[128, 144)")]
    assert "unused blocks: 4, 10, 11" in out and "shared blocks: 1" in out


def _report():
    e = np.zeros((2, 16, 1, 512), BF16)
    a = e.copy()
    a[1, 3, 0, 5:40] = 1
    x = np.linspace(-1, 1, 64).astype(BF16).reshape(8, 8)
    y = x.copy()
    y[2, 3] += 0.25
    call = compare.CallReport(0, "npu_kv_rmsnorm_rope_cache", "torch_npu.npu_kv_rmsnorm_rope_cache", "fail",
                              tensors=[compare.compare_tensor("kv_cache", a, e, role="cache", cache_mode="PA_BSND"),
                                       compare.compare_tensor("k_rope_out", y, x, role="output")])
    skipped = compare.CallReport(1, "npu_mla_prolog_v3", "torch_npu.npu_mla_prolog_v3", "not replayable",
                                 reason="no recorded inputs")
    return compare.Report([call, skipped])


@pytest.mark.parametrize("columns", WIDTHS)
def test_compare_report(monkeypatch, capsys, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    from ascend_emu.textview import console

    _report().render(console())
    out = capsys.readouterr().out
    width = int(columns or 80)
    assert max(len(ln) for ln in out.splitlines()) <= width
    (table,) = _tables(out, "call")
    shown = {name: [r[name] for r in table["rows"]] for name in table["header"]}
    assert shown["call"] == ["0", "0", "1"]
    assert shown["mismatched"] == ["35/16384", "1/64", ""]
    assert shown["status"] == ["fail", "fail", "not replayable"]
    assert shown["cosine"][1] == "0.99858"
    assert [t.replace(" ", "") for t in shown["tensor"]] == ["kv_cache(cache)", "k_rope_out(output)", "-"]
    assert [t.replace(" ", "") for t in shown["op"]] == ["npu_kv_rmsnorm_rope_cache"] * 2 + ["npu_mla_prolog_v3"]
    left_out = {"5/1000", "1/1000", "max rel", "bf16 ulps", "dtype"} - set(shown)
    assert bool(left_out) == (width < 160)
    if left_out:
        note = " ".join(out.split("left out at")[1].split())
        assert all(name in note for name in left_out)
    assert "block 1, row 3 (slot 19)" in " ".join(out.split())
    assert "torch_npu.npu_kv_rmsnorm_rope_cache" in out and "not replayable" in " ".join(out.split())


@pytest.mark.parametrize("columns, most_lines", [("80", 240), ("120", 160)])
def test_grid_of_a_model_weight_shows_a_window(monkeypatch, capsys, columns, most_lines):
    """A 7168 x 1536 bf16 weight (96 x 7168 cells): the first 64 rows and 16 C0 chunks, named as a
    window, in well under a second, not 160,000 lines; --rows / --chunks pick another window."""
    import time

    start = time.perf_counter()
    out = _run(monkeypatch, capsys, columns, ["inspect", "grid", "--weight-shape", "7168,1536", "--dtype", "bf16"])
    assert time.perf_counter() - start < 1.0
    assert len(out.splitlines()) < most_lines
    flat = " ".join(out.split())
    assert "window: rows [0, 64) of 7168, C0 chunks [0, 16) of 96; --rows START:STOP / --chunks START:STOP" in flat
    rows = {int(r["row: m"].split(":")[0]) for t in _tables(out, "row: m") for r in t["rows"]}
    assert rows == set(range(64))
    out = _run(monkeypatch, capsys, columns, ["inspect", "grid", "--weight-shape", "7168,1536", "--dtype", "bf16",
                                               "--rows", "7160:", "--chunks", "95"])
    cells = {int(r["row: m"].split(":")[0]): r["C0#95 [1520:1536]"] for t in _tables(out, "row: m") for r in t["rows"]}
    base = min(ref.nz_flat_offset((7168, 1536), 2, (m, 1520)) * 2 for m in range(7160, 7168))
    assert cells == {m: f"+{ref.nz_flat_offset((7168, 1536), 2, (m, 1520)) * 2 - base}" for m in range(7160, 7168)}
    assert f"offset from {base}" in " ".join(out.split())
