"""The fidelity statement (ascend_emu.fidelity) stays true: docs/fidelity.md is generated from it,
every test a row names exists (collected by node id), exact rows are byte-equal to their reference
on a small call, and ``ascend-emu fidelity`` prints it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import fidelity, ops
from ascend_emu.cli import main
from tests.helpers import assert_same_bytes
from tests.reference import dynamic_quant as ref_dq
from tests.reference import fused_infer_attention as ref_fia
from tests.reference import layouts as ref_layouts
from tests.reference import paged_cache as ref_paged
from tests.reference import rope as ref_rope
from tests.reference import scatter_nd_update as ref_scatter_nd
from tests.reference import v4_small as ref_v4

ROOT = Path(__file__).resolve().parents[1]
BF16 = np.dtype(ml_dtypes.bfloat16)


def _op_name(row) -> str:
    return row.op.split(" ")[0]


def test_page_is_generated_from_the_data():
    page = (ROOT / "docs" / "fidelity.md").read_text()
    assert page == fidelity.render_markdown(), "docs/fidelity.md is stale: ascend-emu fidelity --markdown > docs/fidelity.md"


def test_rows_are_well_formed():
    for row in fidelity.ROWS:
        assert row.status in fidelity.STATUSES, row
        if row.status in ("exact", "bounded"):
            assert row.tests, f"{row.op} / {row.output}: an {row.status} row names the tests that assert it"
            assert row.reference.startswith("tests/reference/"), row
        name = _op_name(row)
        assert hasattr(ops, name) or name.startswith("quant.v4."), f"{name}: not an op of ascend_emu.ops"
        for t in row.tests:
            assert (ROOT / t.split("::")[0]).is_file(), t
    assert {r.status for r in fidelity.ROWS} == set(fidelity.STATUSES)


def test_every_named_test_is_collected():
    """Collect every node id the table names in one pytest run: an unknown id fails collection."""
    ids = sorted({t for r in fidelity.ROWS for t in r.tests})
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = {line.split("[")[0] for line in proc.stdout.splitlines() if "::" in line}
    missing = [t for t in ids if "::" in t and t not in collected]
    assert not missing, f"named in ascend_emu/fidelity.py but not collected: {missing}"


#: What a test that asserts byte equality calls: the helpers' byte comparisons, NumPy's exact
#: equality, or a module helper run with ``exact=True``.
EQUALITY = ("assert_same_bytes", "_same(", "assert_array_equal", "array_equal", "exact=True", "check(")


def _test_source(node_id: str) -> str:
    path, _, name = node_id.partition("::")
    src = (ROOT / path).read_text()
    fn = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert fn, f"{node_id}: no such test function"
    return ast.get_source_segment(src, fn[0]) or ""


def test_exact_rows_name_tests_that_assert_equality():
    """Each test an exact row names compares for equality (not a share or a tolerance)."""
    weak = [t for r in fidelity.rows("exact") for t in r.tests
            if not any(m in _test_source(t) for m in EQUALITY) or "allclose" in _test_source(t)]
    assert not weak, f"exact rows name tests without an equality assertion: {weak}"


# ------------------------------------------------------------------ exact rows: a small call each
def _format_cast(rng):
    x = rng.standard_normal((33, 40)).astype(np.float16)
    got = ops.npu_format_cast(x, 29).storage()
    assert_same_bytes(got, ref_layouts.nd_to_nz_transdata(x), "npu_format_cast")


def _scatter(rng):
    key, value = rng.standard_normal((5, 1, 32)).astype(BF16), rng.standard_normal((5, 1, 16)).astype(BF16)
    kc, vc = np.zeros((3, 16, 1, 32), BF16), np.zeros((3, 16, 1, 16), BF16)
    slots = np.array([3, 17, -1, 40, 0], np.int32)
    want = ref_paged.scatter(key, value, kc, vc, slots, "Norm")
    ops.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode="Norm")
    assert_same_bytes(kc, want[0], "key_cache")
    assert_same_bytes(vc, want[1], "value_cache")


def _dynamic_quant(rng):
    x = (rng.standard_normal((4, 32)) * 3).astype(BF16)
    for g, w in zip(ops.npu_dynamic_quant(x), ref_dq.dynamic_quant(x), strict=True):
        assert_same_bytes(g, w, "npu_dynamic_quant")


def _interleave_rope(rng):
    x = rng.standard_normal((1, 2, 3, 64)).astype(BF16)
    cos, sin = rng.standard_normal((1, 1, 3, 64)).astype(BF16), rng.standard_normal((1, 1, 3, 64)).astype(BF16)
    assert_same_bytes(ops.npu_interleave_rope(x, cos, sin), ref_rope.interleave_rope(x, cos, sin), "interleave_rope")


def _rotary_mul(rng):
    x = rng.standard_normal((2, 3, 5, 16)).astype(np.float16)
    r1, r2 = rng.standard_normal((1, 1, 5, 16)).astype(np.float16), rng.standard_normal((1, 1, 5, 16)).astype(np.float16)
    assert_same_bytes(ops.npu_rotary_mul(x, r1, r2, "half"), ref_rope.rotary_mul(x, r1, r2, "half"), "rotary_mul")


def _rms_norm_dynamic_quant(rng):
    x, gamma = rng.uniform(-10, 10, (3, 128)).astype(BF16), rng.uniform(0, 1, 128).astype(BF16)
    got = ops.npu_rms_norm_dynamic_quant(x, gamma)
    for g, w in zip(got, ref_v4.rms_norm_dynamic_quant(x, gamma, None, None, 1e-6), strict=True):
        assert_same_bytes(g, w, "npu_rms_norm_dynamic_quant")


def _partial_rotary(rng):
    x = rng.uniform(1, 10, (2, 1, 2, 512)).astype(BF16)
    cos, sin = rng.uniform(-1, 1, (2, 1, 1, 64)).astype(BF16), rng.uniform(-1, 1, (2, 1, 1, 64)).astype(BF16)
    want = ref_v4.partial_rotary(x, cos, sin, 448, 512)
    ops.inplace_partial_rotary_mul(x, cos, sin, "interleave", [448, 512])
    assert_same_bytes(x, want, "inplace_partial_rotary_mul")


def _scatter_nd(rng):
    cache = rng.standard_normal((3, 8, 1, 16)).astype(BF16)
    idx, update = np.array([[2, 7], [-1, 7], [0, 0]], np.int32), rng.standard_normal((3, 1, 16)).astype(BF16)
    want = ref_scatter_nd.scatter_nd_update(cache, idx, update)
    ops.npu_scatter_nd_update_v2(cache, idx, update)
    assert_same_bytes(cache, want, "var")


#: One small byte-exact call per op with an exact row (the heavier exact rows are checked by the
#: tests they name; listed in HEAVY).
SMOKE = {"npu_format_cast": _format_cast, "npu_scatter_pa_kv_cache": _scatter, "npu_dynamic_quant": _dynamic_quant,
         "npu_interleave_rope": _interleave_rope, "npu_rotary_mul": _rotary_mul,
         "npu_rms_norm_dynamic_quant": _rms_norm_dynamic_quant, "inplace_partial_rotary_mul": _partial_rotary}
SMOKE["npu_scatter_nd_update_v2"] = _scatter_nd


def _fia_full_quant(rng):
    q = rng.integers(-9, 10, size=(1, 2, 2, 32)).astype(np.int8)  # BNSD
    k = rng.integers(-9, 10, size=(1, 2, 12, 32)).astype(np.int8)
    scales = [np.array([x], np.float32) for x in (0.0123456, 100.3, 0.0041)]
    qs2, qo2 = np.array([40.0], np.float32), np.array([3.0], np.float32)
    got = ops.npu_fused_infer_attention_score(q, k, k, dequant_scale1=scales[0], quant_scale1=scales[1],
                                              dequant_scale2=scales[2], quant_scale2=qs2, quant_offset2=qo2,
                                              num_heads=2, input_layout="BNSD", scale=0.3)[0]
    want = ref_fia.reference_full_quant(q, k, k, *scales, input_layout="BNSD", num_heads=2, scale=0.3,
                                        quant_out=(qs2, qo2))[0]
    assert_same_bytes(got, want, "npu_fused_infer_attention_score")


SMOKE["npu_fused_infer_attention_score"] = _fia_full_quant
HEAVY = {"npu_gather_pa_kv_cache", "npu_kv_rmsnorm_rope_cache", "npu_lightning_indexer", "npu_quant_lightning_indexer",
         "npu_fused_infer_attention_score_v2", "npu_dtype_cast", "npu_dynamic_mx_quant", "compressor_metadata",
         "quant.v4.encode_kv_rows", "kv_compress_epilog", "indexer_compress_epilog"}


def test_every_exact_op_has_a_small_call_or_named_tests():
    exact = {_op_name(r) for r in fidelity.rows("exact")}
    assert exact <= set(SMOKE) | HEAVY, exact - set(SMOKE) - HEAVY
    assert set(SMOKE) <= exact


@pytest.mark.parametrize("op", sorted(SMOKE))
def test_exact_row_is_byte_exact_on_a_small_call(op):
    SMOKE[op](np.random.default_rng(7))


def test_exact_smoke_can_fail(monkeypatch):
    """A one-ulp change to the op's output is caught by its small call."""
    real = ops.npu_rotary_mul

    def off_by_one(*a, **k):
        out = real(*a, **k).copy()
        out.reshape(-1).view(np.uint16)[0] ^= 1
        return out

    monkeypatch.setattr(ops, "npu_rotary_mul", off_by_one)
    with pytest.raises(AssertionError, match="bytes differ"):
        SMOKE["npu_rotary_mul"](np.random.default_rng(7))


# ------------------------------------------------------------------ the command
def test_cli_prints_the_table(capsys):
    assert main(["fidelity"]) == 0
    out = capsys.readouterr().out
    assert "Nothing in this table was checked against real NPU output" in out
    for row in fidelity.ROWS:
        assert f"{row.op}: {row.output}" in out
    assert main(["fidelity", "--status", "differs"]) == 0
    out = capsys.readouterr().out
    assert "differs:" in out and "exact:" not in out.split("\n\n")[1]


def test_readme_says_what_was_checked_on_hardware():
    first = (ROOT / "README.md").read_text().split("\n\n")[1]
    assert "real NPU" in first and "fidelity" in first
