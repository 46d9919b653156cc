"""The fidelity statement: per op and per output, what the emulator's bytes can be relied on for.

One row per (op, output) with one of four statuses:

- ``exact``: byte for byte equal to an independent reference written from the op's documents,
  kernel sources and official goldens (``tests/reference/``); the named tests assert byte equality.
- ``bounded``: within a measured bound of such a reference (the bit-identical share, a ulp
  distance or the official dual-threshold criterion); the named tests assert the bound.
- ``differs``: known to differ from the hardware in a stated way (a kernel step not reproduced).
- ``unverified``: a value the sources do not settle (the hardware leaves it undefined or no
  source documents it); the emulator's choice is deterministic and documented.

None of it was measured on an NPU (docs/sources.md: "Nothing here was measured on an NPU"):
every reference is a reading of documents, kernel sources and goldens. ``ascend-emu fidelity``
prints this table and ``docs/fidelity.md`` is generated from it (:func:`render_markdown`;
``tests/test_fidelity.py`` fails when the page differs from the data, when a test a row names
does not exist, and when an ``exact`` row's op is not byte-equal to its reference on a small call).

Sources: docs/ops.md#fidelity-notes, docs/numerics.md#exact_and_bounded, docs/sources.md,
docs/v4.md; the measured shares in the tests named per row (``tests/helpers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The statuses, in the order the table explains them.
STATUSES = ("exact", "bounded", "differs", "unverified")
#: What a status means, one line each (printed under the table).
STATUS_MEANING = {
    "exact": "byte for byte equal to the reference (tests assert byte equality)",
    "bounded": "within the stated bound of the reference (tests assert the bound)",
    "differs": "known to differ from the hardware, for the stated reason",
    "unverified": "the sources do not settle these bytes; the emulator's deterministic choice is stated",
}
#: Against what every row was checked: no NPU output so far (docs/sources.md).
HARDWARE_NOTE = ("Nothing in this table was checked against real NPU output: every reference is a reading of "
                 "Ascend's documents, kernel sources and official goldens (docs/sources.md). Measure against "
                 "hardware with the hw backend (docs/compare.md).")


@dataclass(frozen=True)
class Row:
    """One (op, output) statement.

    Attributes:
        op: the op's torch_npu / namespace name (as in :mod:`ascend_emu.ops`).
        output: the output or cache, by its torch_npu name.
        status: one of :data:`STATUSES`.
        claim: for ``bounded`` the measured share / bound, for ``differs`` / ``unverified`` the
            reason, for ``exact`` what is covered.
        reference: what it was measured against (a file under ``tests/reference/`` or a golden).
        tests: pytest node ids (``tests/test_x.py::test_name``) that assert the claim; the
            command that measures it is ``python -m pytest -q <node id>``. Required for
            ``exact`` and ``bounded`` rows; a ``differs`` / ``unverified`` row may name none.
    """

    op: str
    output: str
    status: str
    claim: str
    reference: str
    tests: tuple[str, ...]


def _r(op, output, status, claim, reference, *tests) -> Row:
    return Row(op, output, status, claim, reference, tuple(tests))


_PROLOG = "tests/test_mla_prolog.py::"
_SFA = "tests/test_sparse_flash_attention.py::"
_FIA = "tests/test_fused_infer_attention_score.py::"
_FIA_MHA = "tests/test_fused_infer_attention_mha.py::"
_FIA_Q = "tests/test_fused_infer_attention_quant.py::"
_FIA_Q950 = "tests/test_fused_infer_attention_quant_950.py::"
_LI = "tests/test_lightning_indexer.py::"
_QLI = "tests/test_quant_lightning_indexer.py::"
_KV = "tests/test_kv_rmsnorm_rope_cache.py::"
_PRE = "tests/test_mla_preprocess.py::"
_V4 = "tests/test_v4_small_ops.py::"
_Q950 = "tests/test_quant_950_ops.py::"

#: The table. Keep it in step with docs/ops.md#fidelity-notes; regenerate docs/fidelity.md with
#: ``ascend-emu fidelity --markdown > docs/fidelity.md``.
ROWS: tuple[Row, ...] = (
    _r("npu_format_cast", "out (FRACTAL_NZ)", "exact", "every element's byte position, padding zero",
       "tests/reference/layouts.py (TransData loops)", "tests/test_layouts_nz.py::test_nd_to_nz_matches_references"),
    _r("npu_format_cast", "FRACTAL_NZ padding bytes", "unverified", "written as zeros; the hardware's padding "
       "content is not documented", "-", "tests/test_layouts_nz.py::test_padding_is_zero"),
    _r("npu_scatter_pa_kv_cache", "key_cache, value_cache", "exact", "byte copies, PA_BSND (Norm) and PA_NZ",
       "tests/reference/paged_cache.py (op-plugin golden)", "tests/test_paged_cache_ops.py::test_scatter_matches_reference"),
    _r("npu_scatter_pa_kv_cache", "a slot written by two tokens", "unverified", "undefined on hardware; "
       "DuplicateSlotWarning, the last token wins", "-",
       "tests/test_paged_cache_ops.py::test_scatter_duplicate_slots_warn_and_last_token_wins"),
    _r("npu_scatter_nd_update_v2 (also _sk, custom.scatter_nd_update_asc; DeepSeek-V4)", "var (in place)", "exact",
       "row copies of any dtype's bytes; padding rows skipped; strided caches written in place",
       "tests/reference/scatter_nd_update.py", "tests/test_scatter_nd_update.py::test_block_offset_rows_match_reference",
       "tests/test_scatter_nd_update.py::test_strided_var_is_written_in_place_padding_untouched"),
    _r("npu_scatter_nd_update_v2 (also _sk, custom.scatter_nd_update_asc; DeepSeek-V4)", "a row of var named twice",
       "unverified", "undefined on hardware unless the updates are identical; DuplicateSlotWarning, the last row wins",
       "-", "tests/test_scatter_nd_update.py::test_duplicates_warn_and_last_row_wins"),
    _r("npu_gather_pa_kv_cache", "key, value", "exact", "byte copies by block table and seq_offset",
       "tests/reference/paged_cache.py (op-plugin golden)", "tests/test_paged_cache_ops.py::test_gather_matches_reference"),
    _r("npu_dynamic_quant", "y, scale", "exact", "int8 / int4 codes and fp32 scales of the A2 / A3 kernel chain "
       "(multiplier 127 / amax, RNE)", "tests/reference/dynamic_quant.py (kernel reading)",
       "tests/test_dynamic_quant.py::test_matches_reference", "tests/test_dynamic_quant.py::test_moe_groups_match_reference"),
    _r("npu_dynamic_quant", "y, scale (rows longer than the double-buffered kernels' limit)", "differs",
       "those kernels store 1 / m as the scale; not modelled (1-2 fp32 ulps on the scale)", "-"),
    _r("npu_interleave_rope", "out", "exact", "fp32 compute, one RNE rounding", "tests/reference/rope.py",
       "tests/test_rope_ops.py::test_interleave_rope_matches_reference"),
    _r("npu_rotary_mul", "out", "exact", "'half' and 'interleave', fp32 compute, one RNE rounding",
       "tests/reference/rope.py", "tests/test_rope_ops.py::test_rotary_mul_matches_reference"),
    _r("npu_kv_rmsnorm_rope_cache", "k_cache, v_cache, k_rope, c_kv", "exact", "the kernels' 64-lane RmsNorm order; "
       "int8 caches included", "tests/reference/kv_rmsnorm_rope_cache.py", _KV + "test_paged_modes",
       _KV + "test_norm_mode", "tests/test_kv_rmsnorm_v_split.py::test_caches_and_outputs_byte_exact"),
    _r("npu_kv_rmsnorm_rope_cache", "k_rope, c_kv with is_output_kv=False", "unverified",
       "uninitialised on hardware; zeros here", "-", _KV + "test_is_output_kv_false_gives_zeros_and_same_caches"),
    _r("npu_mla_prolog_v3 (also npu_mla_prolog, _v2)", "query, query_rope, query_norm, kv_cache, kr_cache (bf16)",
       "bounded", "bit-identical share >= 0.999 per output, at most 1 bf16 ulp, dual-threshold 0.005 "
       "(fp32 BLAS sums vs the reference's order)", "tests/reference/mla_prolog.py", _PROLOG + "test_paged_modes",
       _PROLOG + "test_v3_scales_and_query_norm", "tests/test_rmsnorm_fidelity.py::test_v3_query_bit_identical_share"),
    _r("npu_mla_prolog_v3 non-quant on oneDNN's bf16 engine (torch loaded, T >= 16)",
       "query, query_rope, query_norm, kv_cache, kr_cache (bf16)", "bounded",
       "dual-threshold 0.005, every error within 2 bf16 ulps of its row's largest value, bit-identical share >= 0.95 "
       "on user-style weights (the same fp32 products summed in oneDNN's order; docs/numerics.md#accumulation)",
       "tests/reference/mla_prolog.py", "tests/test_bf16_engine.py::test_mla_prolog_non_quant_on_onednn"),
    _r("npu_mla_prolog_v3 (quantized scenarios)", "query (int8 / bf16), query_rope, dequant scales, int8 caches",
       "bounded", "bit-identical share >= 0.9985 (query, rope), >= 0.997 (query_rope), scales within 1e-6 relative",
       "tests/reference/mla_prolog.py (A2 / A3 kernel chain)", _PROLOG + "test_v3_quant_scenarios"),
    _r("npu_mla_prolog_v3 (all-zero row or tile)", "dequant scale, int8 codes", "unverified",
       "the kernels divide by zero; scale 0 and codes 0 here (docs/numerics.md#zero_groups)", "-",
       _PROLOG + "test_zero_rows_quantize_to_zero"),
    _r("npu_mla_preprocess", "kv_cache, kr_cache, q_out1", "bounded", "bit-identical share >= 0.9998 (bf16), "
       ">= 0.998 (fp16); int8 caches byte-exact", "tests/reference/mla_preprocess.py",
       _PRE + "test_matches_reference_in_place"),
    _r("npu_mla_preprocess", "q_out0 (int8)", "bounded", "at most 3 of 32,768 elements off by one (measured 0): "
       "quantized from the W^UK einsum's fp32 BLAS sums", "tests/reference/mla_preprocess.py",
       _PRE + "test_matches_reference_in_place"),
    _r("npu_sparse_flash_attention", "attention_out, softmax_max, softmax_sum", "bounded",
       "bit-identical share: the value measured per OpenBLAS kernel family less 0.005 (0.976-1.0 per sweep case "
       "with Haswell kernels, 0.969-1.0 with SkylakeX); no row further than 2^-6 of its largest magnitude; "
       "bit-identical where the scores are exact in any order", "tests/reference/sparse_attention.py",
       _SFA + "test_sweep_against_reference", _SFA + "test_bit_identical_share_over_sweep",
       _SFA + "test_exact_scores_bit_identical"),
    _r("npu_sparse_flash_attention", "attention_out (query-dtype roundings)", "differs",
       "RNE where the kernel's fp16 dequant cast is ties-away: differs on exact ties only", "-"),
    _r("npu_kv_quant_sparse_flash_attention", "attention_out", "bounded",
       "as npu_sparse_flash_attention (share per kernel family less 0.005); int8 k_nope dequantized exactly",
       "tests/reference/sparse_attention.py", _SFA + "test_sweep_against_reference",
       _SFA + "test_official_shape_decode_kv_quant"),
    _r("npu_sparse_flash_attention", "rows with no kv token", "unverified",
       "output 0, softmax_max the lowest fp32, softmax_sum 0 (the kernel sets the length to 0)", "-",
       _SFA + "test_rows_without_kv_tokens"),
    _r("npu_lightning_indexer", "sparse_indices, sparse_values", "exact",
       "where the scores are exact in any summation order (integer-valued inputs); ties lower index first",
       "tests/reference/lightning_indexer.py", _LI + "test_integer_scores_match_reference_exactly",
       _LI + "test_equal_scores_keep_lower_index_first"),
    _r("npu_lightning_indexer", "sparse_indices, sparse_values (random data)", "bounded",
       "fp32 BLAS dots: an index may swap with its neighbour where two scores are within the last bit",
       "tests/reference/lightning_indexer.py", _LI + "test_random_scores_match_reference"),
    _r("npu_lightning_indexer", "tie order of the top-k", "unverified",
       "the hardware's tie order is not documented; lower position first here", "-",
       _LI + "test_equal_scores_keep_lower_index_first"),
    _r("npu_quant_lightning_indexer", "sparse_indices", "exact",
       "the arch22 chain: exact int32 dot, fp16 staging of w * qs, head sum in order",
       "tests/reference/quant_lightning_indexer.py", _QLI + "test_matches_reference",
       _QLI + "test_64_heads_decode_matches_reference"),
    _r("npu_quant_lightning_indexer (Ascend 950)", "sparse_indices", "differs",
       "the arch35 kernel sums even and odd heads in two registers and may sort bf16-rounded scores; "
       "not emulated (ties and last-bit sums may differ)", "-"),
    _r("npu_fused_infer_attention_score (also _v2)", "attention_out, softmax_lse", "bounded",
       "bit-identical where the sums are exact, within one query-dtype rounding elsewhere",
       "tests/reference/fused_infer_attention.py", _FIA + "test_matches_reference",
       _FIA + "test_exact_inputs_match_bit_for_bit_and_p_is_rounded_unnormalised"),
    _r("npu_fused_infer_attention_score (also _v2)", "attention_out, softmax_lse (MHA / GQA form)", "bounded",
       "bit-identical where the sums are exact, within one query-dtype rounding elsewhere (every layout, masks, "
       "learnable_sink)", "tests/reference/fused_infer_attention.py (reference_mha)",
       _FIA_MHA + "test_b_first_layouts_match_the_reference_bit_for_bit",
       _FIA_MHA + "test_packed_layouts_match_the_reference"),
    _r("npu_fused_infer_attention_score (int8 full quant, MHA form)", "attention_out, softmax_lse", "exact",
       "the PFA int8 chain Q1-Q8 (FP19 BMM dequant to fp16, fp16 scores, AscendQuant of the unnormalised P, "
       "fp16 division by the sum) over one kv block", "tests/reference/fused_infer_attention.py (reference_full_quant)",
       _FIA_Q + "test_full_quant_fp16_output_matches_the_reference_bit_for_bit",
       _FIA_Q + "test_fp19_reading_of_the_dequant_scales_and_the_uint64_form"),
    _r("npu_fused_infer_attention_score (also _v2)", "attention_out (int8 output quant)", "exact",
       "AscendQuant of the output (fp16 steps, RNE, saturating), per tensor or per channel",
       "tests/reference/fused_infer_attention.py (reference_mha quant_out, reference_full_quant)",
       _FIA_Q + "test_output_quant_of_a_float_query_v1_and_v2",
       _FIA_Q + "test_full_quant_int8_output_with_offset_causal_and_lengths"),
    _r("npu_fused_infer_attention_score_v2 (out_dtype, Ascend 950)", "attention_out (FP8 E4M3FN / E5M2 output)",
       "exact", "the arch35 post-quant as read: fp32 multiply by the scale, fp32 add of the offset, one RNE cast, "
       "not saturating; unverified on hardware (whether an fp16 query's output is rounded to fp16 first)",
       "tests/reference/fused_infer_attention.py (reference_mha quant_out_type), tests/reference/formats_950.py",
       _FIA_Q950 + "test_8bit_output_matches_the_reference", _FIA_Q950 + "test_overflow_is_not_saturated"),
    _r("npu_fused_infer_attention_score_v2 (out_dtype, Ascend 950)", "attention_out (HiFloat8 output)", "unverified",
       "the kernel casts with CAST_HYBRID, a stochastic rounding: the emulation rounds to nearest, ties away, so a "
       "code may differ by one HiF8 step; the steps before the cast as the FP8 row",
       "tests/reference/fused_infer_attention.py (reference_mha quant_out_type), tests/reference/formats_950.py",
       _FIA_Q950 + "test_8bit_output_matches_the_reference"),
    _r("npu_fused_infer_attention_score (int8 full quant, MHA form)", "attention_out (rows longer than one tiling "
       "block)", "unverified", "the kernel's per-tile online softmax with its fp16 accumulator rescale is not "
       "reproduced (one block over the row)", "-"),
    _r("npu_fused_infer_attention_score (also _v2)", "attention_out (rows longer than one tiling block)",
       "differs", "the kernel's per-block online softmax rescale and flash-decode kv split are not reproduced "
       "(last-bit differences)", "-"),
    _r("npu_fused_infer_attention_score_v2 (C8 decode)", "attention_out", "exact",
       "the MLA full-quant chain C1-C7 (int8 P, fp16 accumulator, blocks of 512)",
       "tests/reference/fused_infer_attention.py (reference_c8)", _FIA + "test_c8_matches_reference_bit_for_bit"),
    _r("npu_fused_infer_attention_score_v2 (C8 decode)", "attention_out (flash decode)", "unverified",
       "block boundaries under flash decode and the sum order inside SoftmaxFlashV2 are not reproduced", "-",
       _FIA + "test_c8_is_close_to_the_dequantised_float_attention"),
    _r("npu_dtype_cast", "out (HiFloat8, FP8)", "exact", "every 16-bit source pattern, the documented rounding",
       "tests/reference/formats_950.py", _Q950 + "test_cast_to_hifloat8_matches_reference",
       _Q950 + "test_cast_to_fp8_matches_reference"),
    _r("npu_dynamic_mx_quant", "y, mxscale", "exact", "MX block scales (E8M0) and codes",
       "tests/reference/formats_950.py", _Q950 + "test_mx_quant_matches_reference"),
    _r("npu_rms_norm_dynamic_quant (DeepSeek-V4)", "y, scale", "exact", "int8 codes and fp32 scales",
       "tests/reference/v4_small.py", _V4 + "test_rms_norm_dynamic_quant_matches_reference"),
    _r("inplace_partial_rotary_mul (DeepSeek-V4)", "x (in place)", "exact", "the rotated slice; the rest untouched",
       "tests/reference/v4_small.py", _V4 + "test_partial_rotary_matches_reference"),
    _r("compressor_metadata (DeepSeek-V4)", "cos, sin, slot_mapping", "exact", "the golden's slot mappings",
       "tests/reference/v4_small.py", _V4 + "test_compressor_metadata_golden_slots",
       _V4 + "test_compressor_metadata_matches_reference"),
    _r("quant.v4.encode_kv_rows (DeepSeek-V4 codec)", "640-byte rows", "exact",
       "fp8 codes, E8M0 scales as the kernel's exponent masking", "tests/reference/v4_quant.py",
       "tests/test_v4_quant.py::test_mode2_matches_reference",
       "tests/test_v4_quant.py::test_mode2_exact_powers_of_two_follow_the_kernel"),
    _r("npu_kv_quant_sparse_attn_sharedkv (DeepSeek-V4, Ascend 950)", "out (bf16)", "bounded",
       "dual-threshold 0.005 vs float64 over the decoded 640-byte rows; bit-identical share measured 0.59-0.67, "
       "asserted in [0.55, 0.75] (P rounded to bf16 before P @ K); the same shares to three digits on sgemm and on "
       "oneDNN's fp32-output bf16 engine", "tests/reference/kv_quant_sparse_attn_sharedkv.py",
       "tests/test_kv_quant_sparse_attn_sharedkv.py::test_within_the_dual_criterion_with_the_measured_bit_identical_"
       "share"),
    _r("npu_sparse_attn_sharedkv on oneDNN's fp32-output bf16 engine (DeepSeek-V4; torch loaded, >= 16 rows)",
       "out (bf16)", "bounded",
       "dual-threshold 0.005 vs float64; bit-identical share in the range its own tests assert (0.628-0.640 "
       "measured, the same as sgemm's to three digits; 99.8-100 % of outputs equal to sgemm's: the same fp32 "
       "products summed in oneDNN's order, docs/numerics.md#accumulation)", "tests/reference/sparse_attn_sharedkv.py",
       "tests/test_bf16_engine.py::test_shared_kv_attention_through_the_f32_engine"),
    _r("npu_sparse_flash_attention / npu_kv_quant_sparse_flash_attention on oneDNN's fp32-output bf16 engine "
       "(bf16 query; torch loaded, >= 16 rows)", "attention_out", "bounded",
       "the official isclose criterion, no row further than 2^-6 of its largest magnitude, bit-identical share "
       "against float64 measured 0.9995-1.0 on an AVX-512 bf16 CPU (0.9986-1.0 on sgemm; 0.9978 against 0.9949 "
       "at a decode shape whose P reaches bf16's subnormals), asserted less 0.005 (the same fp32 products summed "
       "in oneDNN's order, P scaled by 2^64 and back, docs/numerics.md#accumulation)",
       "tests/reference/sparse_attention.py",
       "tests/test_bf16_engine.py::test_sparse_flash_attention_through_the_f32_engine",
       "tests/test_bf16_engine.py::test_kv_quant_sparse_flash_attention_decode_scales_p_onto_the_engine"),
    _r("npu_lightning_indexer on oneDNN's fp32-output bf16 engine (bf16; torch loaded, >= 16 rows)",
       "sparse_indices, sparse_values", "bounded",
       "exact on integer-valued inputs; random data: selected scores within the score tolerance, 99 % of indices "
       "equal (the same fp32 products summed in oneDNN's order)", "tests/reference/lightning_indexer.py",
       "tests/test_bf16_engine.py::test_lightning_indexer_through_the_f32_engine"),
    _r("npu_kv_quant_sparse_attn_sharedkv (DeepSeek-V4, Ascend 950)", "out: the sink's place in the online softmax",
       "unverified", "the running max starts at the sink as the 950 kernel's source reads; differs from the A2 / A3 "
       "order in rounding only, which no test here tells apart", "-"),
    _r("kv_compress_epilog (DeepSeek-V4, Ascend 950)", "kv_compress_cache (in place)", "exact",
       "every byte of the cache: the rows written (layouts 1 and 2, quant_mode 1 / 2 / 3), the rest untouched",
       "tests/reference/v4_writers.py", "tests/test_v4_writers.py::test_kv_layout1_mode2",
       "tests/test_v4_writers.py::test_kv_layout2"),
    _r("kv_compress_epilog layout 2 (DeepSeek-V4, Ascend 950)", "scale-part padding bytes", "unverified",
       "the kernel copies them out of unset local memory; written as zeros here", "-"),
    _r("indexer_compress_epilog / _v2 (DeepSeek-V4, Ascend 950)", "caches (in place)", "exact",
       "fp8 keys, fp32 / E8M0 scales, the packed v2 offsets; the rest untouched", "tests/reference/v4_writers.py",
       "tests/test_v4_writers.py::test_indexer_compress_epilog_mode1",
       "tests/test_v4_writers.py::test_indexer_compress_epilog_v2"),
)


def rows(status: str | None = None) -> list[Row]:
    """The rows, all or those of one ``status`` (one of :data:`STATUSES`).

    Raises:
        ValueError: ``status`` is not one of :data:`STATUSES`.
    """
    if status is not None and status not in STATUSES:
        raise ValueError(f"status: expected one of {', '.join(STATUSES)}, got {status!r}")
    return [r for r in ROWS if status is None or r.status == status]


def _checked_by(row: Row) -> str:
    return ", ".join(f"`{t}`" for t in row.tests)


def render_text(status: str | None = None) -> str:
    """The table as plain text, one block per row (what ``ascend-emu fidelity`` prints)."""
    lines = [HARDWARE_NOTE, ""]
    for r in rows(status):
        lines.append(f"{r.op}: {r.output}")
        lines.append(f"  {r.status}: {r.claim}")
        if r.reference != "-":
            lines.append(f"  reference: {r.reference}")
        if r.tests:
            lines.append("  measured by: python -m pytest -q " + " ".join(r.tests))
    lines.append("")
    lines += [f"{s}: {m}" for s, m in STATUS_MEANING.items()]
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    """``docs/fidelity.md``: the same rows as a Markdown table."""
    out = ["# Fidelity per op and output", "", "[Back to the README](../README.md)", "",
           "Generated from `ascend_emu/fidelity.py` by `ascend-emu fidelity --markdown` "
           "(`tests/test_fidelity.py` fails when this page differs from the data).", "",
           HARDWARE_NOTE, ""]
    out += [f"- **{s}**: {m}." for s, m in STATUS_MEANING.items()]
    out += ["", "A row's claim is measured by `python -m pytest -q` with the tests it names.", "",
            "| op | output | status | claim | reference | tests |", "|---|---|---|---|---|---|"]
    for r in ROWS:
        cells = (r.op, r.output, f"**{r.status}**", r.claim, r.reference, _checked_by(r))
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------- CLI
def add_fidelity_parser(sub) -> None:
    """Register ``ascend-emu fidelity [--status S] [--markdown]`` on the CLI's subparsers."""
    p = sub.add_parser("fidelity", help="per op and output: exact / bounded / differs / unverified, and against what",
                       description="Print the fidelity statement of every op and output: exact, bounded (the "
                                   "measured share and bound), known to differ from hardware (why) or not verified "
                                   "(why), the reference each was measured against and the tests that measure it. "
                                   "Nothing in it was checked against real NPU output.")
    p.add_argument("--status", choices=STATUSES, help="only the rows of this status")
    p.add_argument("--markdown", action="store_true", help="print docs/fidelity.md instead (the whole table)")
    p.set_defaults(func=cmd_fidelity)


def cmd_fidelity(ns) -> int:
    """``ascend-emu fidelity``: print the table (exit 0)."""
    import sys

    sys.stdout.write(render_markdown() if ns.markdown else render_text(ns.status))
    return 0
