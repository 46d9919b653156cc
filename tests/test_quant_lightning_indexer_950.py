"""npu_quant_lightning_indexer on an emulated Ascend 950: FP8 E4M3 and HiF8 query / key (and int8
there) against the plain-loop reference (tests/reference/quant_lightning_indexer.py, which decodes
the codes with tests/reference/formats_950.py); the 950 inputs rejected on A2 / A3 naming the SoC
with nothing written; the 950's dtype combinations and head counts; the drop-in and the framework
namespaces.

The inputs keep every dot product exact in fp32 in any order (element values in [1/8, 4] with at
most 3 mantissa bits, D = 128), so the reference's exact dots and the emulator's BLAS dots agree
and the selected indices must be identical.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, ModeError, ShapeError
from tests.reference.formats_950 import fp8_table, hif8_decode
from tests.reference.quant_lightning_indexer import quant_lightning_indexer as qli_ref

SOC_950 = "Ascend950PR_9599"
D = 128
CARRIER = {"int8": np.dtype(np.int8), "hifloat8": np.dtype(np.uint8),
           "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn)}
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def soc950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", SOC_950)


def _codes(rng, element, shape):
    """Codes (as the op takes them) of values with magnitude in [1/8, 4] (int8: [-8, 8]), by the
    reference decoders."""
    if element == "int8":
        return rng.integers(-8, 9, shape).astype(np.int8)
    vals = np.array([hif8_decode(c) for c in range(256)]) if element == "hifloat8" else fp8_table(element)
    with np.errstate(invalid="ignore"):
        ok = np.flatnonzero(np.isfinite(vals) & (np.abs(vals) >= 1 / 8) & (np.abs(vals) <= 4)).astype(np.uint8)
    return rng.choice(ok, shape).view(CARRIER[element])


def make_case(rng, element, weights_dtype, layout_q, layout_k, q_lens, kv_lens, *, n1=8, block_size=16):
    """Inputs and kwargs of one call; weights in [0, 1), scales in [0, 10) (the golden's)."""
    scale_dtype = np.float32 if weights_dtype == BF16 else np.float16
    b = len(q_lens)
    kw = dict(layout_query=layout_q, layout_key=layout_k, actual_seq_lengths_key=np.array(kv_lens, np.int32))
    if layout_q == "BSND":
        lead = (b, max(q_lens))
        kw["actual_seq_lengths_query"] = np.array(q_lens, np.int32)
    else:
        lead = (sum(q_lens),)
        kw["actual_seq_lengths_query"] = np.cumsum(q_lens).astype(np.int32)
    query = _codes(rng, element, (*lead, n1, D))
    weights = rng.uniform(0, 1, (*lead, n1)).astype(np.float32).astype(weights_dtype)
    qs = rng.uniform(0, 10, (*lead, n1)).astype(scale_dtype)
    if layout_k == "TND":
        key = _codes(rng, element, (sum(kv_lens), 1, D))
        kw["actual_seq_lengths_key"] = np.cumsum(kv_lens).astype(np.int32)
    else:
        need = [-(-n // block_size) for n in kv_lens]
        blocks = sum(need) + 1
        key = _codes(rng, element, (blocks, block_size, 1, D))
        perm = rng.permutation(blocks)
        table = np.full((b, max(need)), -1, np.int32)
        used = 0
        for i, n in enumerate(need):
            table[i, :n] = perm[used:used + n]
            used += n
        kw["block_table"] = table
    ks = rng.uniform(0, 10, key.shape[:-1]).astype(scale_dtype)
    if element == "hifloat8":
        kw.update(query_dtype=290, key_dtype=290)
    return [query, key, weights, qs, ks], kw


CASES = [("float8_e4m3fn", BF16), ("float8_e4m3fn", np.dtype(np.float16)), ("hifloat8", BF16),
         ("int8", np.dtype(np.float16))]


@pytest.mark.parametrize("layout", [("BSND", "PA_BSND"), ("TND", "TND")])
@pytest.mark.parametrize("element, weights_dtype", CASES, ids=[f"{e}-{np.dtype(w).name}" for e, w in CASES])
def test_matches_reference(soc950, element, weights_dtype, layout):
    rng = np.random.default_rng(21)
    inputs, kw = make_case(rng, element, weights_dtype, *layout, [3, 1], [40, 29], n1=24 if element == "hifloat8" else 8)
    before = [a.copy() for a in inputs]
    out = ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=16, sparse_mode=3, **kw)
    ref_kw = {k: v for k, v in kw.items() if k not in ("query_dtype", "key_dtype")}
    want, scores = qli_ref(*inputs, sparse_count=16, sparse_mode=3, element=element, **ref_kw)
    assert out.dtype == np.int32 and out.shape == want.shape
    np.testing.assert_array_equal(out, want)
    assert any(s is not None and len(s) > 16 for s in scores)  # the top-k had to choose
    for a, b in zip(inputs, before, strict=True):
        assert a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def test_no_fp16_staging_on_the_float_path(soc950):
    """op-plugin's 950 golden applies the int8 chain's 1/1024 and fp16 rounding to the fp32 dot
    too; the arch35 kernel stages only an int32 QK. On these inputs the two chains pick different
    indices, and the op follows the kernel."""
    rng = np.random.default_rng(5)
    inputs, kw = make_case(rng, "float8_e4m3fn", BF16, "TND", "TND", [4], [96], n1=8)
    out = ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=48, sparse_mode=0, **kw)
    want, _ = qli_ref(*inputs, sparse_count=48, sparse_mode=0, element="float8_e4m3fn", **kw)
    golden, _ = qli_ref(*inputs, sparse_count=48, sparse_mode=0, element="float8_e4m3fn", stage_s=True, **kw)
    np.testing.assert_array_equal(out, want)
    assert not np.array_equal(out, golden)


@pytest.mark.parametrize("weights_dtype", [BF16, np.dtype(np.float16)], ids=["bf16", "fp16"])
def test_weight_product_rounding_decides_the_indices(soc950, weights_dtype):
    """``w * qs`` rounded to fp16 for fp16 weights only (bf16 weights with fp32 scales stay fp32):
    1024 positions and half of them kept, so scores near the cut are close enough that the other
    rounding picks other indices (checked on the reference, then the op must give its own)."""
    rng = np.random.default_rng(31)
    inputs, kw = make_case(rng, "float8_e4m3fn", weights_dtype, "TND", "TND", [2, 2], [1024, 1024], n1=8)
    out = ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=512, sparse_mode=0, **kw)
    want, _ = qli_ref(*inputs, sparse_count=512, sparse_mode=0, element="float8_e4m3fn", **kw)
    other, _ = qli_ref(*inputs, sparse_count=512, sparse_mode=0, element="float8_e4m3fn",
                       stage_ws=weights_dtype == BF16, **kw)
    assert not np.array_equal(want, other)  # the data tells the two roundings apart
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("soc", ["Ascend910B2", "Ascend910_9391"])
@pytest.mark.parametrize("element, argument", [("float8_e4m3fn", "query"), ("hifloat8", "query_dtype")])
def test_950_inputs_rejected_on_a2_a3(monkeypatch, soc, element, argument):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    inputs, kw = make_case(np.random.default_rng(2), element, BF16, "TND", "TND", [1], [20])
    before = [a.copy() for a in inputs]
    with pytest.raises(ModeError, match=rf"^{argument}: When {argument} is .*not support on this soc version {soc}"):
        ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=8, **kw)
    for a, b in zip(inputs, before, strict=True):
        assert a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


@pytest.mark.parametrize("element, weights_dtype, change, error, fragment", [
    ("float8_e4m3fn", BF16, dict(n1=4), ShapeError, r"query: expected N1 in \[8, 16, 24, 32, 64\]"),
    ("int8", np.dtype(np.float16), dict(n1=12), ShapeError, r"query: expected N1 in \[8, 16, 24, 32, 64\]"),
    ("hifloat8", np.dtype(np.float16), {}, DTypeError, r"weights: expected dtype bfloat16"),
    ("float8_e4m3fn", BF16, dict(scales=np.float16), DTypeError, r"query_dequant_scale: expected dtype float32"),
    ("float8_e4m3fn", BF16, dict(query_dtype=292, key_dtype=292), ModeError, r"query_dtype: expected None or 290"),
    ("hifloat8", BF16, dict(key_dtype=None), ModeError, r"key_dtype: expected query_dtype's value"),
    ("int8", np.dtype(np.float16), dict(query_dtype=290, key_dtype=290), DTypeError,
     r"query: expected uint8 HiF8 codes with query_dtype=290"),
    ("hifloat8", BF16, dict(query_dtype=None, key_dtype=None), DTypeError, r"query: expected dtype int8"),
])
def test_950_argument_errors(soc950, element, weights_dtype, change, error, fragment):
    change = dict(change)
    inputs, kw = make_case(np.random.default_rng(3), element, weights_dtype, "TND", "TND", [2], [20],
                           n1=change.pop("n1", 8))
    if "scales" in change:
        inputs[3] = inputs[3].astype(change.pop("scales"))
    kw.update(change)
    before = [a.copy() for a in inputs]
    with pytest.raises(error, match=fragment):
        ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=8, **kw)
    for a, b in zip(inputs, before, strict=True):
        assert a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def test_drop_in_and_namespaces(soc950):
    """torch_npu.npu_quant_lightning_indexer with torch.float8_e4m3fn tensors and with uint8 HiF8
    codes tagged ``query_dtype=key_dtype=torch_npu.hifloat8``; torch.ops.custom's (recipes' schema
    with the tags) and torch.ops._C_ascend's (vllm-ascend's, FP8 by dtype); the fake kernel's
    shape. Same indices as the NumPy op."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    def t(a):
        if a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).npu()
        if a.dtype == CARRIER["float8_e4m3fn"]:
            return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn).npu()
        return torch.from_numpy(a).npu()

    rng = np.random.default_rng(8)
    for element in ("float8_e4m3fn", "hifloat8"):
        inputs, kw = make_case(rng, element, BF16, "BSND", "PA_BSND", [2, 1], [30, 17])
        want = ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=8, **kw)
        tin = [t(a) for a in inputs]
        tkw = {k: (t(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
        got = torch_npu.npu_quant_lightning_indexer(*tin, 0, 0, sparse_count=8, **tkw)
        np.testing.assert_array_equal(got.cpu().numpy(), want)
        got, values = torch.ops.custom.npu_quant_lightning_indexer(*tin, 0, 0, sparse_count=8, **tkw)
        np.testing.assert_array_equal(got.cpu().numpy(), want)
        mode = torch._subclasses.fake_tensor.FakeTensorMode()
        fin = [mode.from_tensor(x.cpu()) for x in tin]
        fkw = {k: (mode.from_tensor(v.cpu()) if isinstance(v, torch.Tensor) else v) for k, v in tkw.items()}
        with mode:
            fake = torch.ops.npu.npu_quant_lightning_indexer(*fin, 0, 0, sparse_count=8, **fkw)
        assert tuple(fake.shape) == want.shape
    inputs, kw = make_case(rng, "float8_e4m3fn", BF16, "BSND", "PA_BSND", [1, 1], [30, 17])
    want = ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=8, **kw)
    tkw = {k: (t(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items() if k != "layout_query"}
    got = torch.ops._C_ascend.npu_lightning_indexer_quant(*[t(a) for a in inputs], sparse_count=8, **tkw)
    np.testing.assert_array_equal(got.cpu().numpy(), want)
