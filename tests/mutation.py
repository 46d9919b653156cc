"""Mutation check of the test suite: does each curated defect make its tests fail?

Each mutant is one deliberate defect of the kind the tests exist to catch (a wrong NZ offset, a
rounding mode, a softmax order, an off-by-one slot). For each one, ``ascend_emu/`` and ``tests/``
are copied into a temporary directory, the mutant's old text is replaced there (it must occur
exactly once in its file, or the run stops), and ``python -m pytest -x -q <its test files>`` runs
in a subprocess with ``PYTHONPATH`` set to that directory and a fresh ``NUMBA_CACHE_DIR`` (Numba
does not notice edits to inlined helpers, so a warm cache would hide the defect). Verdicts:

- ``killed``: the tests failed (what they are for);
- ``survived``: the tests passed with the defect in place (a gap in the tests);
- ``error``: pytest could not run them (exit status 2-5: collection error, no tests, usage) or
  the run timed out.

A table and the score (killed / mutants) are printed; the exit status is 1 if any mutant
survived or errored. Not a pytest module (no ``test_`` prefix) and not run by CI: a development
check, minutes per run.

Usage: ``python -m tests.mutation [--only NAME ...] [--list] [--timeout SECONDS]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    """One defect: in ``path`` (relative to the repository root), ``old`` (exactly once) becomes
    ``new``; ``tests`` are the test files that should fail because of it."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  #: test files, or node ids (file::test) where one test of a big file suffices
    what: str


#: The kv_rmsnorm_rope_cache test of exact int8 ties and saturation (one kernel to compile, not the
#: whole file's).
QUANT_TIES = "tests/test_kv_rmsnorm_rope_cache.py::test_quant_saturates_and_rounds_half_even"

#: The scatter test against the reference's layout code (its file's other test compiles a whole op).
SCATTER = "tests/test_emu_kernels.py::test_threaded_scatter_equals_reference_layout"

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ layouts
    Mutant("nz_offset_chunk_order", "ascend_emu/layouts/nz.py",
           "coords = (*bidx, n // c0, m // M0, m % M0, n % c0)",
           "coords = (*bidx, m // M0, n // c0, m % M0, n % c0)",
           ("tests/test_layouts_nz.py",), "nz_offset: fractal row index before the C0 chunk index"),
    Mutant("paged_nz_element_row_stride", "ascend_emu/layouts/paged.py",
           "return blk * self.block_size * self.dim + (d // c0) * self.block_size * c0 + r * c0 + d % c0",
           "return blk * self.block_size * self.dim + (d // c0) * c0 + r * self.dim + d % c0",
           ("tests/test_layouts_paged.py",), "PA_NZ element offset laid out as ND rows inside a block"),
    Mutant("paged_nz_chunk_row_stride", "ascend_emu/layouts/paged.py",
           "base = blk * (self.block_size * self.row_bytes) + r * NZ_ROW_BYTES",
           "base = blk * (self.block_size * self.row_bytes) + r * self.row_bytes",
           ("tests/test_layouts_paged.py",), "chunk_offsets: a whole row, not one fractal row, per in-block row"),
    Mutant("scatter_nz_chunk_stride", "ascend_emu/emu/kernels.py",
           "dst = base + j * block_size * chunk",
           "dst = base + j * chunk",
           (SCATTER,), "NZ scatter: C0 chunks of a row side by side"),
    Mutant("paged_block_table_block_index", "ascend_emu/layouts/paged.py",
           "blk = np.int64(table[i, j])",
           "blk = np.int64(table[i, min(j + 1, (n + block_size - 1) // block_size - 1)])",
           ("tests/test_layouts_paged.py",), "block_table slots: the next block's id"),
    Mutant("paged_block_table_in_block_offset", "ascend_emu/layouts/paged.py",
           "slots[i, p0 + r] = blk * block_size + r",
           "slots[i, p0 + r] = blk * block_size + (r + 1) % block_size",
           ("tests/test_layouts_paged.py",), "block_table slots: in-block row off by one"),
    Mutant("paged_pages_in_block_offset", "ascend_emu/layouts/paged.py",
           "return np.where(blk >= 0, blk * block_size + pos % block_size, SKIP_INDEX).astype(np.int64)",
           "return np.where(blk >= 0, blk * block_size + (block_size - 1 - pos % block_size), SKIP_INDEX)"
           ".astype(np.int64)",
           ("tests/test_layouts_paged.py",), "slots_from_pages: rows of a page in reverse"),
    # ------------------------------------------------------------------ quant
    Mutant("quant_int8_half_away", "ascend_emu/quant/rounding.py",
           'if rounding == "half_even":\n        return saturate_int8(round_half_even(x))',
           'if rounding == "half_even":\n        return saturate_int8(round_half_away(x))',
           ("tests/test_quant.py",), "f32_to_int8 half_even rounds half away from zero"),
    Mutant("quant_int8_symmetric_saturation", "ascend_emu/quant/rounding.py",
           "return np.clip(x, INT8_MIN, INT8_MAX).astype(np.int8)",
           "return np.clip(x, INT8_MIN + 1, INT8_MAX).astype(np.int8)",
           ("tests/test_quant.py",), "saturate_int8 to [-127, 127]"),
    Mutant("quant_bf16_half_up", "ascend_emu/quant/rounding.py",
           "return np.uint16((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16))",
           "return np.uint16((u + np.uint32(0x8000)) >> np.uint32(16))",
           ("tests/test_quant.py",), "fp32 -> bf16 ties rounded up, not to even"),
    # ------------------------------------------------------------------ kernels
    Mutant("kernel_round_to_int8_truncates", "ascend_emu/emu/kernels.py",
           "    r = np.rint(x)\n    if r > INT8_MAX:",
           "    r = np.trunc(x)\n    if r > INT8_MAX:",
           (QUANT_TIES,), "round_to_int8 truncates"),
    # (a bound of INT8_MAX + 1 survives even the test's 127.5 and 128: in the compiled kernel the
    # float -> int8 conversion of 128 gave 127, not the -128 a plain np.int8(128.0) gives)
    Mutant("kernel_round_to_int8_symmetric", "ascend_emu/emu/kernels.py",
           "    if r < INT8_MIN:\n        return np.int8(INT8_MIN)",
           "    if r < INT8_MIN:\n        return np.int8(INT8_MIN + 1)",
           (QUANT_TIES,), "round_to_int8 saturates to -127"),
    Mutant("scatter_slot_off_by_one", "ascend_emu/emu/kernels.py",
           "    slots = np.asarray(slots).reshape(-1)  # [T]\n    geometry",
           "    slots = np.asarray(slots).reshape(-1)  # [T]\n"
           "    slots = np.where(slots >= 0, (slots + 1) % layout.num_rows, slots)\n    geometry",
           (SCATTER,), "scatter_rows writes each token one slot on"),
    # ------------------------------------------------------------------ RmsNorm orders
    Mutant("rms_in_order_32_lanes", "ascend_emu/emu/kernels.py",
           "                lanes[l] = q + lanes[l]\n        base = reps * LANES",
           "                lanes[l % 32] = q + lanes[l % 32]\n        base = reps * LANES",
           ("tests/test_rmsnorm_fidelity.py",), "square_sum in order: 32 lanes instead of 64"),
    Mutant("rms_tree_halves", "ascend_emu/emu/kernels.py",
           "lanes[i] = lanes[2 * i] + lanes[2 * i + 1]",
           "lanes[i] = lanes[i] + lanes[i + w]",
           ("tests/test_rmsnorm_fidelity.py",), "lane_tree_sum folds halves, not neighbours"),
    Mutant("rms_reciprocal_divides", "ascend_emu/emu/kernels.py",
           "out[i] = x[i] * f * gamma[i] * scale",
           "out[i] = x[i] / rms * gamma[i] * scale",
           ("tests/test_rmsnorm_fidelity.py",), "rms_norm_row: x / rms where the kernel multiplies by 1/rms"),
    Mutant("prolog_rms_prescale", "ascend_emu/emu/mla_prolog.py",
           "_RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL = MLA_PROLOG_RMS",
           "_RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL = MLA_PROLOG_RMS._replace(prescale=True)",
           ("tests/test_mla_prolog.py::test_rmsnorm_order_non_quant",),
           "MLA prolog RmsNorm: each square times 1/H before the sum (the kernel scales the sum)"),
    Mutant("prolog_rms_reciprocal", "ascend_emu/emu/mla_prolog.py",
           "_RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL = MLA_PROLOG_RMS",
           "_RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL = MLA_PROLOG_RMS._replace(reciprocal=True)",
           ("tests/test_mla_prolog.py::test_rmsnorm_order_non_quant",),
           "MLA prolog RmsNorm: x * (1/rms) where the kernel divides"),
    Mutant("mlapo_kv_rms_pairwise_lanes", "ascend_emu/emu/mla_preprocess.py",
           "_KV_LANES, _KV_PRESCALE, _KV_RECIPROCAL = MLAPO_KV_RMS",
           "_KV_LANES, _KV_PRESCALE, _KV_RECIPROCAL = MLAPO_KV_RMS._replace(lanes=LANES_PAIRWISE)",
           ("tests/test_mla_preprocess.py::test_rmsnorm_orders",),
           "MlaPreprocess kv RmsNorm: pairwise blocks instead of 64 lanes over the repeats"),
    Mutant("mlapo_quant_rms_divides", "ascend_emu/emu/mla_preprocess.py",
           "_QUANT_LANES, _QUANT_PRESCALE, _QUANT_RECIPROCAL = MLAPO_QUANT_RMS",
           "_QUANT_LANES, _QUANT_PRESCALE, _QUANT_RECIPROCAL = MLAPO_QUANT_RMS._replace(reciprocal=False)",
           ("tests/test_mla_preprocess.py::test_rmsnorm_orders",),
           "MlaPreprocess RmsNormQuant: x / rms where the kernel multiplies by 1/rms"),
    Mutant("mlapo_quant_rms_no_prescale", "ascend_emu/emu/mla_preprocess.py",
           "_QUANT_LANES, _QUANT_PRESCALE, _QUANT_RECIPROCAL = MLAPO_QUANT_RMS",
           "_QUANT_LANES, _QUANT_PRESCALE, _QUANT_RECIPROCAL = MLAPO_QUANT_RMS._replace(prescale=False)",
           ("tests/test_mla_preprocess.py::test_rmsnorm_orders",),
           "MlaPreprocess RmsNormQuant: squares summed, then times 1/H (the kernel scales each square)"),
    # ------------------------------------------------------------------ sparse attention softmax
    Mutant("sfa_softmax_reciprocal", "ascend_emu/emu/sparse_flash_attention.py",
           "            x = np.float32(scores[i, g] / total[g])\n            scores[i, g] = bf16_bits_to_f32",
           "            x = np.float32(scores[i, g] * (np.float32(1.0) / total[g]))\n"
           "            scores[i, g] = bf16_bits_to_f32",
           ("tests/test_sparse_flash_attention.py",), "P = e * (1 / l) instead of e / l (bf16)"),
    Mutant("sfa_exp_float32", "ascend_emu/emu/sparse_flash_attention.py",
           "scores[i, g] = np.float32(_exp_f64(scores[i, g] - m[g]))",
           "scores[i, g] = np.exp(np.float32(scores[i, g] - m[g]))",
           ("tests/test_sparse_flash_attention.py",), "exp evaluated in float32"),
    Mutant("sfa_one_head_scaled", "ascend_emu/emu/sparse_flash_attention.py",
           "            x = scores[i, g] * scale\n",
           "            x = scores[i, g] * (scale * np.float32(1.05) if g == 0 else scale)\n",
           ("tests/test_sparse_flash_attention.py",), "head 0's scores scaled by 1.05"),
    # ------------------------------------------------------------------ Ascend 950 formats
    Mutant("hif8_ties_toward_zero", "ascend_emu/quant/hifloat8.py",
           '_TIE_SIDE = {"half_away": "right"}', '_TIE_SIDE = {"half_away": "left"}',
           ("tests/test_formats_950.py::test_hif8_encode_tie_points_against_exact_nearest",),
           "HiF8 encode: a value on a midpoint goes to the smaller magnitude"),
    Mutant("hif8_negative_zero_nan", "ascend_emu/quant/hifloat8.py",
           "negative = np.signbit(x64) & (codes != 0x00)", "negative = np.signbit(x64)",
           ("tests/test_formats_950.py::test_hif8_encode_specials_and_thresholds",),
           "HiF8 encode: -0 and negatives that round to zero get the sign bit (0x80, the NaN code)"),
    Mutant("mx_scale_alg1_always_up", "ascend_emu/quant/mx.py",
           "(exp < 254) & (mant > 0)", "(exp < 254)",
           ("tests/test_formats_950.py::test_mx_scale_bytes_edges",),
           "MX scale_alg 1: the exponent rounded up even when S is a power of two"),
    Mutant("mx_scale_pairs_not_interleaved", "ascend_emu/quant/mx.py",
           "np.moveaxis(stored, -2, ax)",
           "np.moveaxis(stored.reshape(stored.shape[:-2] + (2, pairs)).swapaxes(-1, -2), -2, ax)",
           ("tests/test_formats_950.py::test_mx_scale_pair_layout_byte_exact",),
           "MX scales: pairs (j, j + half) instead of (2k, 2k + 1)"),
    # ------------------------------------------------------------------ Ascend 950 ops and SoC gating
    Mutant("soc_950_gate_open", "ascend_emu/soc.py",
           "if not is_ascend950(name):", "if False:",
           ("tests/test_soc.py", "tests/test_quant_950_ops.py"),
           "the Ascend 950 modes run on an A2 / A3 SoC"),
    Mutant("dtype_cast_fp8_saturates", "ascend_emu/emu/quant_950.py",
           "to_fp8(args.x, args.dst)", "to_fp8(args.x, args.dst, saturate=True)",
           ("tests/test_quant_950_ops.py",), "npu_dtype_cast to FP8 clips to +-max instead of NaN / Inf"),
    Mutant("dtype_cast_fp8_bytes_as_e4m3", "ascend_emu/emu/quant_950.py",
           "x = x.view(FP8_DTYPES[src])", 'x = x.view(FP8_DTYPES["float8_e4m3fn"])',
           ("tests/test_quant_950_ops.py",), "npu_dtype_cast reads E5M2 bytes (input_dtype 291) as E4M3FN"),
    Mutant("mx_quant_scale_alg_dropped", "ascend_emu/emu/quant_950.py",
           "scale_alg=args.scale_alg)", "scale_alg=0)",
           ("tests/test_quant_950_ops.py",), "npu_dynamic_mx_quant ignores scale_alg"),
    Mutant("format_cast_950_c0_16", "ascend_emu/layouts/nz.py",
           "return FRACTAL_ROW_BYTES // min(dtype.itemsize, 2)",
           "return FRACTAL_ROW_BYTES // min(dtype.itemsize, 2) if dtype.itemsize > 1 else 16",
           ("tests/test_quant_950_ops.py", "tests/test_layouts_nz.py"),
           "FRACTAL_NZ C0 of a 1-byte type 16 instead of 32 bytes / 1"),
    # ------------------------------------------------------------------ int8 products
    Mutant("int8_sgemm_chunk_2048", "ascend_emu/emu/matmul.py",
           "SGEMM_EXACT_K = 1024", "SGEMM_EXACT_K = 2048",
           ("tests/test_int8_matmul.py::test_matmul_int8_exact_on_every_engine",),
           "int8 sgemm engine: K-chunks of 2048, whose fp32 partial sums can pass 2**24"),
    Mutant("int8_sgemm_keeps_last_chunk", "ascend_emu/emu/matmul.py",
           "out[:, lo:lo + width] += part.astype(np.int32)", "out[:, lo:lo + width] = part.astype(np.int32)",
           ("tests/test_int8_matmul.py::test_matmul_int8_exact_on_every_engine",),
           "int8 sgemm engine: each K-chunk overwrites the sum instead of adding to it"),
    Mutant("widen_blocks_below_small_bound", "ascend_emu/emu/matmul.py",
           "        if n % width == 0 and (not big or m * width * k > BLAS_SMALL_MNK):\n            best = width\n",
           "        if n % width == 0:\n            return width\n",
           ("tests/test_weight_widening.py",),
           "weights widened in the narrowest column blocks, below OpenBLAS's small-matrix bound (another summation)"),
    Mutant("int8_max_k_one_too_many", "ascend_emu/emu/matmul.py",
           "INT8_MAX_K = (2**31 - 1) // (128 * 128)", "INT8_MAX_K = (2**31 - 1) // (128 * 128) + 1",
           ("tests/test_int8_matmul.py::test_matmul_int8_longest_contraction",),
           "matmul_int8 accepts a K whose int32 sum can wrap"),
    Mutant("int8_onednn_ignores_nk", "ascend_emu/emu/matmul.py",
           "tw.T if w_nk else tw", "tw",
           ("tests/test_int8_matmul.py::test_matmul_int8_nk_weight_and_nz_weight",),
           "int8 oneDNN engine: an [N, K] weight used as [K, N]"),
    Mutant("int8_onednn_without_vnni", "ascend_emu/emu/matmul.py",
           "    if _cpu_has_int8_dot():\n", "    if True:\n",
           ("tests/test_int8_matmul.py::test_default_int8_engine_follows_cpu_and_torch",),
           "int8 engine: oneDNN chosen on a CPU without int8 dot-product instructions"),
)


def mutated(mutant: Mutant, text: str) -> str:
    """``text`` (the mutant's file) with the mutant's old text replaced.

    Raises:
        SystemExit: the old text does not occur exactly once (the mutant is stale: fix the list).
    """
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(f"mutant {mutant.name}: expected its old text exactly once in {mutant.path}, "
                         f"found it {count} time(s): {mutant.old!r}")
    return text.replace(mutant.old, mutant.new)


def run(mutant: Mutant, timeout: float) -> tuple[str, float, str]:
    """Copy the tree, apply ``mutant``, run its tests; return (verdict, seconds, last output line)."""
    with tempfile.TemporaryDirectory(prefix=f"mutant_{mutant.name}_") as tmp:
        tmp_root = Path(tmp)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc")
        for sub in ("ascend_emu", "tests"):
            shutil.copytree(ROOT / sub, tmp_root / sub, ignore=ignore)
        for extra in ("examples", "pyproject.toml"):  # read by some tests relative to the root
            src = ROOT / extra
            if src.is_dir():
                shutil.copytree(src, tmp_root / extra, ignore=ignore)
            elif src.exists():
                shutil.copy2(src, tmp_root / extra)
        target = tmp_root / mutant.path
        target.write_text(mutated(mutant, target.read_text()))
        cache = tmp_root / "numba_cache"
        cache.mkdir()
        env = dict(os.environ, PYTHONPATH=str(tmp_root), NUMBA_CACHE_DIR=str(cache))
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                   *mutant.tests], cwd=tmp_root, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return "error", time.perf_counter() - start, f"timed out after {timeout:.0f} s"
        seconds = time.perf_counter() - start
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    verdict = {0: "survived", 1: "killed"}.get(proc.returncode, "error")
    return verdict, seconds, last


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--timeout", type=float, default=900, help="seconds per mutant before it counts as an error")
    a = p.parse_args(argv)
    if a.list:
        for m in MUTANTS:
            print(f"{m.name:34s} {m.path:44s} {' '.join(m.tests):40s} {m.what}")
        return 0
    chosen = MUTANTS
    if a.only:
        known = {m.name for m in MUTANTS}
        unknown = [n for n in a.only if n not in known]
        if unknown:
            p.error(f"--only: unknown mutant(s) {unknown}; --list shows them")
        chosen = tuple(m for m in MUTANTS if m.name in a.only)
    for m in chosen:  # every selected mutant still applies, before anything runs
        mutated(m, (ROOT / m.path).read_text())
    rows = []
    for m in chosen:
        verdict, seconds, last = run(m, a.timeout)
        rows.append((m, verdict, seconds, last))
        print(f"{verdict:8s} {seconds:6.0f} s  {m.name:34s} {' '.join(m.tests)}  [{last}]", flush=True)
    killed = sum(v == "killed" for _, v, _, _ in rows)
    print()
    print(f"{'mutant':34s} {'verdict':8s} {'s':>5s}  tests")
    for m, verdict, seconds, _ in rows:
        print(f"{m.name:34s} {verdict:8s} {seconds:5.0f}  {' '.join(m.tests)}")
    print(f"score: {killed} / {len(rows)} killed")
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
