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

#: The C8 decode tests against the reference, bit for bit (outputs and lse).
C8 = ("tests/test_fused_infer_attention_score.py::test_c8_online_softmax_across_blocks_is_bit_exact",
      "tests/test_fused_infer_attention_score.py::test_c8_value_and_key_scales_are_bit_exact",
      "tests/test_fused_infer_attention_score.py::test_c8_matches_reference_bit_for_bit")

#: The 950 sparse attention test with sinks above the max score (softmax max / sum and output exact).
SINKS = "tests/test_sparse_flash_attention_950.py::test_sinks_above_the_max_score_many_picks"

#: The 950 quant lightning indexer test whose indices depend on the weight product's rounding.
QLI_WS = "tests/test_quant_lightning_indexer_950.py::test_weight_product_rounding_decides_the_indices"

#: The compressor's steps (prefill, decode, chunked prefill) against the float64 reference.
COMPRESSOR_STEPS = "tests/test_compressor.py::test_prefill_then_decode_across_group_boundaries"

#: The 950 mla prolog v3 test of per-tensor kv quant saturation.
PROLOG_SAT = "tests/test_mla_prolog_950.py::test_950_per_tensor_kv_quant_saturates"

#: The namespace test pinning the defaults to the upstream schemas.
NS_DEFAULTS = "tests/test_namespaces.py::test_defaults_pinned_to_the_upstream_schemas"

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ layouts
    Mutant("nz_offset_chunk_order", "ascend_emu/layouts/nz.py",
           "coords = (*bidx, n // c0, m // M0, m % M0, n % c0)",
           "coords = (*bidx, m // M0, n // c0, m % M0, n % c0)",
           ("tests/test_layouts_nz.py",), "nz_offset: fractal row index before the C0 chunk index"),
    Mutant("paged_nz_element_row_stride", "ascend_emu/layouts/paged.py",
           "return (blk * self.heads + head) * bs * self.dim + (d // c0) * bs * c0 + r * c0 + d % c0",
           "return (blk * self.heads + head) * bs * self.dim + (d // c0) * c0 + r * self.dim + d % c0",
           ("tests/test_layouts_paged.py",), "PA_NZ element offset laid out as ND rows inside a block"),
    Mutant("paged_nz_chunk_row_stride", "ascend_emu/layouts/paged.py",
           "base = blk * (self.block_size * self.row_bytes) + r * self.chunk_bytes  # [T]",
           "base = blk * (self.block_size * self.row_bytes) + r * self.row_bytes  # [T]",
           ("tests/test_layouts_paged.py",), "chunk_offsets: a whole row, not one fractal row, per in-block row"),
    Mutant("scatter_nz_chunk_stride", "ascend_emu/emu/kernels.py",
           "dst = base + j * block_size * chunk",
           "dst = base + j * chunk",
           (SCATTER,), "NZ scatter: C0 chunks of a row side by side"),
    Mutant("paged_block_table_block_index", "ascend_emu/layouts/slots.py",
           "blk = np.int64(table[i, j])",
           "blk = np.int64(table[i, min(j + 1, (n + block_size - 1) // block_size - 1)])",
           ("tests/test_layouts_paged.py",), "block_table slots: the next block's id"),
    Mutant("paged_block_table_in_block_offset", "ascend_emu/layouts/slots.py",
           "slots[i, p0 + r] = blk * block_size + r",
           "slots[i, p0 + r] = blk * block_size + (r + 1) % block_size",
           ("tests/test_layouts_paged.py",), "block_table slots: in-block row off by one"),
    Mutant("paged_pages_in_block_offset", "ascend_emu/layouts/slots.py",
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
           "            x = np.float32(row[g] / tg[g])\n            row[g] = bf16_bits_to_f32",
           "            x = np.float32(row[g] * (np.float32(1.0) / tg[g]))\n"
           "            row[g] = bf16_bits_to_f32",
           ("tests/test_sparse_flash_attention.py",), "P = e * (1 / l) instead of e / l (bf16)"),
    Mutant("sfa_exp_float32", "ascend_emu/emu/sparse_flash_attention.py",
           "row[g] = np.float32(_exp_f64(row[g] - mg[g]))",
           "row[g] = np.exp(np.float32(row[g] - mg[g]))",
           ("tests/test_sparse_flash_attention.py",), "exp evaluated in float32"),
    Mutant("sfa_one_head_scaled", "ascend_emu/emu/sparse_flash_attention.py",
           "            x = row[g] * scale\n",
           "            x = row[g] * (scale * np.float32(1.05) if g0 + g == 0 else scale)\n",
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
           "if not is_ascend950(name):\n        what =", "if False:\n        what =",
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
           "    if _cpu_has_int8_dot() and _torch_loaded():\n", "    if _torch_loaded():\n",
           ("tests/test_int8_matmul.py::test_default_int8_engine_follows_cpu_and_torch",),
           "int8 engine: oneDNN chosen on a CPU without int8 dot-product instructions"),
    # ------------------------------------------------------------------ FIA C8 decode across kv blocks
    Mutant("fia_c8_sum_not_rescaled", "ascend_emu/emu/fused_infer_attention_score.py",
           "            tot = np.float32(np.float32(ed * tot) + s)",
           "            tot = np.float32(tot + s)",
           C8, "C8 online softmax: the running sum not rescaled when the max rises"),
    Mutant("fia_c8_acc_not_rescaled", "ascend_emu/emu/fused_infer_attention_score.py",
           "                acc[r, c] = _f16(_f16(acc[r, c] * e) + x)",
           "                acc[r, c] = _f16(acc[r, c] + x)",
           C8, "C8 online softmax: the fp16 accumulator not rescaled when the max rises"),
    Mutant("fia_c8_eps_dropped", "ascend_emu/emu/fused_infer_attention_score.py",
           "            mp = np.float32(np.float32(_exp_f64(lm - mnf)) + eps)",
           "            mp = np.float32(_exp_f64(lm - mnf))",
           C8, "C8 P quant: maxP without FLOAT_EPS (127 / 0 in a block whose exp underflows)"),
    # (FLOAT_EPS changed to another small value, 1e-12, survives these tests: no input found tells
    # it apart, see test_c8_online_softmax_across_blocks_is_bit_exact's docstring; not listed)
    Mutant("fia_c8_dequant_order", "ascend_emu/emu/fused_infer_attention_score.py",
           "    d1 = ((qs.astype(np.float32) * ks).astype(np.float32) * np.float32(args.scale)).astype(np.float32)",
           "    d1 = (qs.astype(np.float32) * np.float32(ks * np.float32(args.scale))).astype(np.float32)",
           C8, "C8 scores: qs * (ks * scale) instead of (qs * ks) * scale"),
    Mutant("fia_c8_value_scale_divides", "ascend_emu/emu/fused_infer_attention_score.py",
           "    v_scale = np.float32(vs * np.float32(1.0 / C8_P_RANGE))",
           "    v_scale = np.float32(vs / np.float32(C8_P_RANGE))",
           C8, "C8 output: vs / 127 instead of vs * fp32(1 / 127)"),
    Mutant("fia_lse_one_rounding", "ascend_emu/emu/fused_infer_attention_score.py",
           "    ln = np.log(total[live].astype(np.float64)).astype(np.float32)\n",
           "    ln = np.log(total[live].astype(np.float64))\n",
           C8, "lse = fp32(m + ln l) in one rounding, not fp32(m + fp32(ln l)) (1 ulp)"),
    Mutant("fia_rejection_python_type_error", "ascend_emu/ops/_fused_infer_attention_args.py",
           '        raise arg_error(ModeError, name, f"{want!r} ({op} in ascend_emu takes only {want!r} for "',
           '        raise TypeError(f"{op}() got an unexpected keyword argument \'{name}\'")\n'
           '        raise arg_error(ModeError, name, f"{want!r} ({op} in ascend_emu takes only {want!r} for "',
           ("tests/test_fused_infer_attention_score.py::test_rejected_arguments_are_named",),
           "FIA: a not-emulated argument rejected with Python's own unexpected-keyword TypeError"),
    # ------------------------------------------------------------------ FIA MHA / GQA form
    Mutant("fia_mha_mask_ignored", "ascend_emu/emu/fused_infer_attention_score.py",
           "    has_mask = masked.shape[0] > 0\n", "    has_mask = False\n",
           ("tests/test_fused_infer_attention_mha.py::test_explicit_masks",),
           "FIA MHA: an explicit atten_mask's 1 entries not dropped"),
    Mutant("fia_mha_sink_not_summed", "ascend_emu/emu/fused_infer_attention_score.py",
           "            tot = np.float32(tot + np.float32(_exp_f64(sinks[r] - mxf)))",
           "            tot = tot",
           ("tests/test_fused_infer_attention_mha.py::test_learnable_sink",),
           "FIA MHA: the learnable sink's exp left out of the softmax sum"),
    Mutant("fia_mha_top_left_off_by_one", "ascend_emu/ops/_fused_infer_attention_args.py",
           "        hi = np.minimum(s + 1, kv_len)", "        hi = np.minimum(s + 2, kv_len)",
           ("tests/test_fused_infer_attention_mha.py::test_causal_modes_and_decode_ignores_them",),
           "FIA MHA: sparse_mode 2 (leftUpCausal) lets token s see position s + 1"),
    Mutant("fia_mha_bsh_heads_swapped", "ascend_emu/emu/fused_infer_attention_score.py",
           "        return x.reshape(x.shape[0] * x.shape[1], heads, x.shape[2] // heads)",
           "        return x.reshape(x.shape[0] * x.shape[1], x.shape[2] // heads, heads).transpose(0, 2, 1)",
           ("tests/test_fused_infer_attention_mha.py::test_b_first_layouts_match_the_reference_bit_for_bit",),
           "FIA MHA: a BSH query / key read with D and N swapped"),
    # ------------------------------------------------------------------ paged cache
    Mutant("paged_dup_value_first_wins", "ascend_emu/emu/paged_cache.py",
           "            dst = _chunks(cache, layout)\n            offsets",
           "            dst = _chunks(cache, layout)\n"
           "            if cache is args.value_cache:  # the first token of a duplicate slot\n"
           "                tokens = np.sort(np.unique(args.slots, return_index=True)[1])\n"
           "                tokens = tokens[args.slots[tokens] >= 0]\n"
           "            offsets",
           ("tests/test_paged_cache_ops.py",), "scatter: value_cache keeps a duplicate slot's first token"),
    # ------------------------------------------------------------------ Ascend 950 sinks, indexer, prolog
    Mutant("sfa_sink_not_in_max", "ascend_emu/emu/sparse_flash_attention.py",
           "            mg[g] = sg[g] if sg[g] > mg[g] else mg[g]",
           "            mg[g] = mg[g]",
           (SINKS,), "sparse attention: the sink left out of the max"),
    Mutant("sfa_sink_after_sum", "ascend_emu/emu/sparse_flash_attention.py",
           "            tg[g] = np.float32(_exp_f64(sg[g] - mg[g]))\n"
           "    for i in range(off, off + length):\n"
           "        row = scores[i, g0:g1]\n"
           "        for g in range(row.shape[0]):\n"
           "            tg[g] += row[g]\n",
           "            tg[g] = 0.0\n"
           "    for i in range(off, off + length):\n"
           "        row = scores[i, g0:g1]\n"
           "        for g in range(row.shape[0]):\n"
           "            tg[g] += row[g]\n"
           "    if sinks.size:\n"
           "        sg, mg = sinks[g0:g1], m[g0:g1]\n"
           "        for g in range(tg.shape[0]):\n"
           "            tg[g] += np.float32(_exp_f64(sg[g] - mg[g]))\n",
           (SINKS,), "sparse attention: the sink's exp added after the kv sum, not first"),
    Mutant("qli_bf16_weights_rounded", "ascend_emu/emu/quant_lightning_indexer.py",
           "        if ia.weights.dtype == np.float16:\n            ws = ws.astype(np.float16)",
           "        if True:\n            ws = ws.astype(np.float16)",
           (QLI_WS,), "quant indexer: bf16 weights x fp32 scales rounded to fp16"),
    Mutant("qli_fp16_weights_not_rounded", "ascend_emu/emu/quant_lightning_indexer.py",
           "        if ia.weights.dtype == np.float16:\n            ws = ws.astype(np.float16)",
           "        if False:\n            ws = ws.astype(np.float16)",
           (QLI_WS,), "quant indexer: fp16 weights x fp16 scales not rounded to fp16"),
    Mutant("prolog_v3_fp8_kv_not_saturated", "ascend_emu/emu/mla_prolog.py",
           "    return to_fp8(y, element, saturate=True)", "    return to_fp8(y, element)",
           (PROLOG_SAT,), "mla prolog v3 (950): FP8 kv quant without saturation (NaN past 448)"),
    Mutant("prolog_v3_hif8_kv_not_saturated", "ascend_emu/emu/mla_prolog.py",
           "        return to_hif8(np.clip(y, -HIF8_MAX, HIF8_MAX))", "        return to_hif8(y)",
           (PROLOG_SAT,), "mla prolog v3 (950): HiF8 kv quant without saturation (Inf past 40960)"),
    # ------------------------------------------------------------------ DeepSeek-V4 compressor
    Mutant("cmp_overlap_halves_swapped", "ascend_emu/emu/compressor.py",
           "            c0 = 0 if coff == 1 or k < r else d\n", "            c0 = 0 if coff == 1 or k >= r else d\n",
           (COMPRESSOR_STEPS,), "compressor: coff 2 takes the own group's first kv half, the previous group's last"),
    Mutant("cmp_ape_off_by_one", "ascend_emu/emu/compressor.py",
           "a.ape[a.token_pos[need] % r]", "a.ape[(a.token_pos[need] + 1) % r]",
           (COMPRESSOR_STEPS,), "compressor: ape of the next position in the group"),
    Mutant("cmp_block_zero_written", "ascend_emu/ops/compressor.py",
           "keep = w_ids != 0", "keep = w_ids >= 0",
           ("tests/test_compressor.py::test_block_table_zero_skips_the_state_write",),
           "compressor: a state block-table entry 0 written (block 0 is 'do not update')"),
    Mutant("cmp_state_not_read", "ascend_emu/emu/compressor.py",
           "_weigh(e[i, k], s, state[b, g_off[i, k], c0:c0 + d], c)", "_weigh(e[i, k], s, zeros, c)",
           (COMPRESSOR_STEPS,), "compressor: a group's earlier tokens' kv not read back from the state"),
    Mutant("cmp_ring_writes_every_token", "ascend_emu/ops/compressor.py",
           "keep = w_pos >= np.maximum(g1[w_req] * r - (coff - 1) * r, 0)", "keep = w_pos >= 0",
           ("tests/test_compressor.py::test_ring_state_cache_on_the_950",),
           "compressor: cache_mode 2 writes every token's row, not only the tail the next call reads"),
    # ------------------------------------------------------------------ kernel cache, namespaces, plugin
    Mutant("kernel_cache_key_lengths_only", "ascend_emu/_kernel_cache.py",
           "        h.update(data)\n", "",
           ("tests/test_kernel_cache.py::test_editing_an_inlined_helper_recompiles_the_kernel",),
           "kernel cache key: the sources' paths and lengths, not their bytes"),
    Mutant("ns_sfa_sparse_mode_default", "ascend_emu/torch_npu/namespaces.py",
           "\"str layout_query='BSND', str layout_kv='BSND', int sparse_mode=3, \"\n"
           "        'int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, '\n"
           "        'int attention_mode=2, bool return_softmax_lse=False'",
           "\"str layout_query='BSND', str layout_kv='BSND', int sparse_mode=0, \"\n"
           "        'int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, '\n"
           "        'int attention_mode=2, bool return_softmax_lse=False'",
           (NS_DEFAULTS,), "_C_ascend.npu_sparse_flash_attention: sparse_mode default 0, not 3"),
    Mutant("ns_li_sparse_count_default", "ascend_emu/torch_npu/namespaces.py",
           "'int sparse_count=2048, int sparse_mode=3, int pre_tokens=9223372036854775807, '\n"
           "        'int next_tokens=9223372036854775807, bool return_value=False'",
           "'int sparse_count=1024, int sparse_mode=3, int pre_tokens=9223372036854775807, '\n"
           "        'int next_tokens=9223372036854775807, bool return_value=False'",
           (NS_DEFAULTS,), "_C_ascend.npu_lightning_indexer: sparse_count default 1024, not 2048"),
    Mutant("ns_prolog_functional_cache_mode_default", "ascend_emu/torch_npu/namespaces.py",
           "str cache_mode='PA_BSND', \"\n"
           "        \"bool query_norm_flag=False, int weight_quant_mode=0, int kv_cache_quant_mode=0, \"\n"
           "        \"int query_quant_mode=0, int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, \"\n"
           "        \"int tile_size=128, float qc_qr_scale=1.0",
           "str cache_mode='PA_NZ', \"\n"
           "        \"bool query_norm_flag=False, int weight_quant_mode=0, int kv_cache_quant_mode=0, \"\n"
           "        \"int query_quant_mode=0, int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, \"\n"
           "        \"int tile_size=128, float qc_qr_scale=1.0",
           (NS_DEFAULTS,), "custom.npu_mla_prolog_v3_functional: cache_mode default PA_NZ, not PA_BSND"),
    Mutant("ns_scatter_pa_kv_cache_default_pa_nz", "ascend_emu/torch_npu/namespaces.py",
           "Tensor slot_mapping, *, str cache_mode='Norm', str scatter_mode='None') -> ()\"",
           "Tensor slot_mapping, *, str cache_mode='PA_NZ', str scatter_mode='None') -> ()\"",
           ("tests/test_v4_scatter_namespaces.py::test_c_ascend_scatter_pa_kv_cache_defaults_to_norm",),
           "_C_ascend.npu_scatter_pa_kv_cache: cache_mode default PA_NZ (torch_npu's), not Norm"),
    Mutant("ns_mla_prolog_v3_uint8_untagged", "ascend_emu/torch_npu/_registry.py",
           "        for name in untagged:  # 8-bit data", "        for name in ():  # 8-bit data",
           ("tests/test_v4_scatter_namespaces.py::test_c_ascend_mla_prolog_v3_rejects_untagged_uint8",),
           "_C_ascend.npu_mla_prolog_v3: uint8 inputs reach the op without their dtype tags"),
    # ------------------------------------------------------------------ the V4 writers' index policy, row scatters
    Mutant("writer_index_skips_any_offset", "ascend_emu/layouts/slots.py",
           "        skip &= inside[:, 1] | (v[:, 1] == SKIP_INDEX)\n", "        pass\n",
           ("tests/test_scatter_nd_update.py",), "a [-1, offset past the block] row skipped, not rejected"),
    Mutant("writer_index_live_row_negative_offset", "ascend_emu/layouts/slots.py",
           "    bad = ~(inside.all(axis=1) | skip)  # [n]", "    bad = ~(inside[:, 0] | skip)  # [n]",
           ("tests/test_scatter_nd_update.py",), "a live row's offset not checked ([b, -1] / [b, bs] written)"),
    Mutant("writer_index_compiled_offset_past_block", "ascend_emu/layouts/slots.py",
           "            o_ok = 0 <= o < d1", "            o_ok = 0 <= o <= d1",
           ("tests/test_scatter_nd_update.py",), "the compiled index pass: offset block_size accepted"),
    Mutant("duplicate_search_table_misses", "ascend_emu/layouts/slots.py",
           "            if seen[live[a]]:", "            if seen[live[a]] and a < 0:",
           ("tests/test_layouts_paged.py",), "the compiled duplicate search, over 32 slots: a repeat not noticed"),
    Mutant("scatter_first_duplicate_wins", "ascend_emu/emu/scatter_nd_update.py",
           "    for i in range(slots.shape[0]):\n        s = slots[i]",
           "    for i in range(slots.shape[0] - 1, -1, -1):\n        s = slots[i]",
           ("tests/test_scatter_nd_update.py",), "duplicate rows: the first written, not the last"),
    # ------------------------------------------------------------------ the V4 epilog writers
    Mutant("kv_epilog_layout2_scale_row_off_by_one", "ascend_emu/emu/kv_compress_epilog.py",
           'block_stride, geo["scale_base"],\n',
           'block_stride, geo["scale_base"] + geo["scale_row"],\n',
           ("tests/test_v4_writers.py",), "kv_compress_epilog layout 2: a token's scale part one row late"),
    Mutant("kv_epilog_e8m0_divisor_off_by_two", "ascend_emu/emu/kv_compress_epilog.py",
           "np.uint32(253 - exp)", "np.uint32(252 - exp)",
           ("tests/test_v4_writers.py",), "kv_compress_epilog quant_mode 2: values divided by half the scale"),
    Mutant("fp8_encoder_ties_up", "ascend_emu/emu/kv_compress_epilog.py",
           "    normal = ((np.int64(a) + ((np.int64(1) << (drop - 1)) - 1) + ((np.int64(a) >> drop) & 1)) >> drop)",
           "    normal = ((np.int64(a) + (np.int64(1) << (drop - 1))) >> drop)",
           ("tests/test_v4_writers.py",), "the writers' fp8 rounding: ties away from zero, not to even"),
    Mutant("epilog_first_duplicate_wins", "ascend_emu/ops/_v4_writers.py",
           "        keep = np.sort(s.size - 1 - first_from_end)",
           "        keep = np.sort(np.unique(s, return_index=True)[1])",
           ("tests/test_v4_writers.py",), "epilog writers: a repeated slot keeps the first row, not the last"),
    Mutant("epilog_plan_misses_duplicates", "ascend_emu/ops/_v4_writers.py",
           "    if has_duplicate_slots(slots[:n]):", "    if False:",
           ("tests/test_v4_writers.py",), "epilog writers: a repeated slot not noticed"),
    Mutant("epilog_plan_skips_finite_check", "ascend_emu/ops/_v4_writers.py",
           "            bad |= (xr[c] & exp_mask) == exp_mask", "            bad |= (xr[c] & exp_mask) == 0xFFFF",
           ("tests/test_v4_writers.py",), "epilog writers: NaN / Inf in a quantized value not rejected"),
    Mutant("indexer_mx_fp16_read_as_bf16", "ascend_emu/emu/kv_compress_epilog.py",
           "geo[15], geo[16] != 0", "geo[15], geo[16] < 0",
           ("tests/test_v4_writers.py",), "indexer_compress_epilog MX: fp16 keys widened as bf16 bits"),
    Mutant("kv_mode1_rope_misplaced", "ascend_emu/emu/kv_compress_epilog.py",
           "q, width - (q + rope + 4 * n)", "q + 4, width - (q + rope + 4 * n)",
           ("tests/test_v4_writers.py",), "kv_compress_epilog quant_mode 1: the rope part 4 bytes late"),
    Mutant("kv_mode1_padding_left", "ascend_emu/emu/kv_compress_epilog.py",
           "q, width - (q + rope + 4 * n)", "q, 0",
           ("tests/test_v4_writers.py",), "kv_compress_epilog quant_mode 1: the row's padding not zeroed"),
    Mutant("kv_hif8_negative_zero_code", "ascend_emu/emu/kv_compress_epilog.py",
           "signed = np.uint32(code != np.uint32(0)) & ", "signed = np.uint32(code != np.uint32(0x80)) | ",
           ("tests/test_v4_writers.py",), "kv_compress_epilog quant_mode 3: -0 (and what rounds to it) as 0x80, the NaN"),
    Mutant("epilog_no_soc_gate", "ascend_emu/soc.py",
           "if not is_ascend950(name):\n        raise ModeError(f\"{op}:", "if False:\n        raise ModeError(f\"{op}:",
           ("tests/test_v4_writers.py",), "epilog writers run on A2 / A3"),
    Mutant("indexer_e5m2_uses_e4m3_constant", "ascend_emu/emu/indexer_compress_epilog.py",
           '    inv = codec.INDEXER_INV_FP8_MAX if name == "float8_e4m3fn" else',
           '    inv = codec.INDEXER_INV_FP8_MAX if True else',
           ("tests/test_v4_writers.py",), "indexer_compress_epilog E5M2: scale with 1/448"),
    Mutant("plugin_drops_int4_code", "ascend_emu/torch_npu/_dtypes.py",
           "    **NPU_DTYPE_CODES, **{alias: NPU_DTYPE_CODES[name]",
           '    **{k: v for k, v in NPU_DTYPE_CODES.items() if k != "int4"}, **{alias: NPU_DTYPE_CODES[name]',
           ("tests/test_pytest_plugin.py",), "torch_npu.int4 (285) not exported"),
    Mutant("plugin_drops_float4_e1m2_code", "ascend_emu/torch_npu/_dtypes.py",
           "    **NPU_DTYPE_CODES, **{alias: NPU_DTYPE_CODES[name]",
           '    **{k: v for k, v in NPU_DTYPE_CODES.items() if k != "float4_e1m2fn_x2"}, **{alias: NPU_DTYPE_CODES[name]',
           ("tests/test_pytest_plugin.py",), "torch_npu.float4_e1m2fn_x2 (297) not exported"),
    Mutant("plugin_misses_module_mock", "ascend_emu/pytest_plugin.py",
           '    _check_still_installed("after collection")', "    pass",
           ("tests/test_pytest_plugin.py",), "pytest plugin: a test module mocking torch_npu at import not detected"),
    Mutant("plugin_misses_conftest_mock", "ascend_emu/pytest_plugin.py",
           '    _check_still_installed("after the conftest files loaded")', "    pass",
           ("tests/test_pytest_plugin.py",), "pytest plugin: a conftest mocking torch_npu caught only after collection"),
    Mutant("plugin_block_table_pads_minus_one", "ascend_emu/pytest_plugin.py",
           "    table = torch.zeros(len(lens), max(need, default=0) or 1, dtype=torch.int32)",
           "    table = torch.full((len(lens), max(need, default=0) or 1), -1, dtype=torch.int32)",
           ("tests/test_pytest_plugin.py",), "pytest plugin: block tables padded with -1 instead of 0"),
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
