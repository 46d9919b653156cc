"""Only ``ascend_emu/layouts/`` knows what a cache-mode name means (docs/layouts.md, "Layout names").

Outside it no module compares a cache layout against a mode name (``cache_mode == "PA_NZ"``,
``mode == "Norm"``, ``layout_kv in ("BSND", "TND")``) or computes ``block * block_size + row``:
the ops ask :class:`ascend_emu.layouts.CacheLayout` / :func:`ascend_emu.layouts.cache_mode_traits`.
Acceptance checks against a named tuple constant (``mode not in SCATTER_CACHE_MODES``) are not
comparisons with a literal and pass. Query / output tensor layouts (BSND / TND of a query,
FIA's input_layout) are not caches: comparisons on a query's layout are not flagged.
"""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from ascend_emu.layouts import CACHE_MODE_ALIASES, CACHE_MODES, CacheLayout, cache_mode_traits

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ascend_emu"
#: Mode names that only ever name a cache (a comparison with them is flagged whatever the operand).
CACHE_ONLY_NAMES = frozenset(CACHE_MODES) - {"BSND", "TND"} | set(CACHE_MODE_ALIASES)
#: Names shared with query layouts: flagged when the other operand names a cache / key / kv layout.
SHARED_NAMES = frozenset({"BSND", "TND"})
#: Operand names that hold a cache's layout (for the shared names).
CACHE_OPERAND_WORDS = ("cache", "kv", "key", "mode")
#: Names of a block size in ``block * block_size + row`` (and the per-batch ``b * S2 + p``).
BLOCK_SIZE_NAMES = frozenset({"block_size", "bs", "BlockSize", "s2", "S2", "cache_length"})
#: (module relative to ascend_emu, source text of the line) pairs allowed to compare: none today.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def _operand_name(node: ast.AST) -> str:
    """The identifier an operand reads (``layout_kv``, ``args.cache_mode`` -> ``cache_mode``), or ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _operand_name(node.value)
    return ""


def _literals(node: ast.AST) -> set[str]:
    """The string literals ``node`` is (a constant, or a tuple / list / set of constants)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def mode_name_branches(source: str) -> list[tuple[int, str]]:
    """``(line, why)`` of every comparison of a cache layout with a mode-name literal and every
    ``x * block_size + y`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = set().union(*(_literals(o) for o in operands))
            others = [_operand_name(o) for o in operands if not _literals(o)]
            if names & CACHE_ONLY_NAMES:
                found.append((node.lineno, f"compares with {sorted(names & CACHE_ONLY_NAMES)}"))
            elif names & SHARED_NAMES and any(w in o.lower() for o in others for w in CACHE_OPERAND_WORDS):
                found.append((node.lineno, f"compares a cache layout ({others}) with {sorted(names & SHARED_NAMES)}"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            for side, other in ((node.left, node.right), (node.right, node.left)):
                if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult) and \
                        not isinstance(other, ast.Constant) and \
                        not any(isinstance(f, ast.Constant) for f in (side.left, side.right)) and \
                        {_operand_name(side.left), _operand_name(side.right)} & BLOCK_SIZE_NAMES:
                    found.append((node.lineno, "computes block * block_size + row"))
    return found


def test_no_module_outside_layouts_branches_on_a_cache_mode_name():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("layouts/"):
            continue
        text = path.read_text()
        lines = text.splitlines()
        for line, why in mode_name_branches(text):
            if (rel, lines[line - 1].strip()) not in ALLOWED:
                bad.append(f"ascend_emu/{rel}:{line}: {why}: {lines[line - 1].strip()}")
    assert not bad, "ask CacheLayout / cache_mode_traits instead:\n" + "\n".join(bad)


@pytest.mark.parametrize("source", [
    'if cache_mode == "PA_NZ": pass',
    'x = mode != "Norm"',
    'ok = args.cache_mode in ("PA_BLK_BSND", "PA_BLK_NZ")',
    'k = 3 if layout_kv == "TND" else 4',
    'paged = layout_key == "PA_BSND"',
    'slot = blk * block_size + r',
    'slot = r + blk * self.block_size',
    'm = np.arange(b)[:, None] * s2 + p',
])
def test_the_scan_flags_each_kind_of_branch(source):
    assert mode_name_branches(source), source


@pytest.mark.parametrize("source", [
    'if layout_query == "BSND": pass',
    'if mode not in SCATTER_CACHE_MODES: pass',
    'q = 3 if q_layout == "TND" else 4',
    'n = blk * block_size',
    'y = a * b + c',
    'w = 4 + 0.3 * bs',
])
def test_the_scan_passes_query_layouts_and_acceptance_tuples(source):
    assert not mode_name_branches(source), source


# ---------------------------------------------------------------------- what the ops ask instead
# Expected values written out by hand from the layout definitions (docs/layouts.md).
TRAITS = {  # mode: (paged, page_indexed, nz, head_major, sequences, declared rank, index_kind)
    "PA_BSND": (True, False, False, False, "blocks", 4, "slot"),
    "PA": (True, False, False, False, "blocks", 4, "slot"),
    "PA_NZ": (True, False, True, False, "blocks", 4, "slot"),
    "PA_BNSD": (True, False, False, True, "blocks", 4, "slot"),
    "PA_BLK_BSND": (True, True, False, False, "blocks", 4, "pages"),
    "PA_BLK_NZ": (True, True, True, False, "blocks", 4, "pages"),
    "PA_BLK_BNSD": (True, True, False, True, "blocks", 4, "pages"),
    "BSND": (False, False, False, False, "per_batch", 4, "own"),
    "TND": (False, False, False, False, "packed", 3, "own"),
    "Norm": (False, False, False, False, "per_batch", 4, "position"),
}


@pytest.mark.parametrize("mode", sorted(TRAITS))
def test_cache_mode_traits(mode):
    t = cache_mode_traits(mode)
    assert (t.paged, t.page_indexed, t.nz, t.head_major, t.sequences, t.declared_rank, t.index_kind) == TRAITS[mode]
    shape = (3, 4, 5) if mode == "TND" else (2, 1, 4, 16) if mode in ("Norm", "PA_BNSD", "PA_BLK_BNSD") else (2, 4, 1, 16)
    layout = CacheLayout.from_declared(mode, shape, 2)
    assert (layout.paged, layout.page_indexed, layout.nz, layout.sequences, layout.declared_rank,
            layout.index_kind) == (t.paged, t.page_indexed, t.nz, t.sequences, t.declared_rank, t.index_kind)
    assert len(layout.declared_shape()) == t.declared_rank


def test_sequence_slots_per_mode():
    lengths = [2, 0, 3]
    # BSND [B=3, S=4, 1, D]: batch b's position p at b * 4 + p
    bsnd = CacheLayout.from_declared("BSND", (3, 4, 1, 8), 2).sequence_slots(lengths)
    np.testing.assert_array_equal(bsnd, [[0, 1, -1], [-1, -1, -1], [8, 9, 10]])
    # TND [T=5, 1, D]: the batches' tokens packed
    tnd = CacheLayout.from_declared("TND", (5, 1, 8), 2).sequence_slots(lengths)
    np.testing.assert_array_equal(tnd, [[0, 1, -1], [-1, -1, -1], [2, 3, 4]])
    # PA_BSND, block_size 2: through the block table
    table = np.array([[3, 0], [1, 1], [2, 0]], np.int32)
    pa = CacheLayout.from_declared("PA_BSND", (4, 2, 1, 8), 2).sequence_slots(lengths, table)
    np.testing.assert_array_equal(pa, [[6, 7, -1], [-1, -1, -1], [4, 5, 0]])
