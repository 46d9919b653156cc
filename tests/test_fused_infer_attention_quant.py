"""npu_fused_infer_attention_score / _v2, the MHA / GQA form's int8 quant: v1's full quant
(``dequant_scale1``, ``quant_scale1``, ``dequant_scale2``; fp16 or int8 output) against the
plain-loop ``reference_full_quant``, and the int8 output quant of a float query (v1
``quant_scale2`` / ``quant_offset2``, v2 ``quant_scale_out`` / ``quant_offset_out``) against
``reference_mha(quant_out=...)`` (tests/reference/fused_infer_attention.py); the uint64 scale
form and its FP19 reading; op-plugin's fullquant call through the drop-in; each rejected
combination names its argument and writes nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import AscendEmuError, DTypeError, ModeError, ShapeError
from tests.reference.fused_infer_attention import fp19_value, reference_full_quant, reference_mha
from tests.test_fused_infer_attention_mha import _lay, make_dense

BF16 = ml_dtypes.bfloat16
FIA = ops.npu_fused_infer_attention_score
FIA2 = ops.npu_fused_infer_attention_score_v2
V2 = {"actual_seq_lengths": "actual_seq_qlen", "actual_seq_lengths_kv": "actual_seq_kvlen",
      "num_heads": "num_query_heads", "scale": "softmax_scale", "softmax_lse_flag": "return_softmax_lse"}


def _f32(x):
    return np.array([x], dtype=np.float32)


def _int8_case(rng, input_layout, *, b=2, s1=3, s2=40, n=4, kv_n=2, d=32, lo=-9, hi=10, **lens):
    """int8 ``(query, key, value, kwargs)`` in a B-first layout, values in [lo, hi)."""
    q = rng.integers(lo, hi, size=(b, s1, n, d)).astype(np.int8)
    k = rng.integers(lo, hi, size=(b, s2, kv_n, d)).astype(np.int8)
    v = rng.integers(lo, hi, size=(b, s2, kv_n, d)).astype(np.int8)
    lay = input_layout.split("_")[0]
    kw = dict(num_heads=n, num_key_value_heads=kv_n, scale=0.3, input_layout=input_layout, **lens)
    return _lay(q, lay), _lay(k, lay), _lay(v, lay), kw


#: dequant_scale1 with low mantissa bits set (the FP19 reading drops them), quant_scale1 giving
#: fractional P values before the int8 rounding, dequant_scale2.
SCALES = dict(dequant_scale1=_f32(0.0123456), quant_scale1=_f32(100.3), dequant_scale2=_f32(0.0041))


@pytest.mark.parametrize("input_layout", ["BSH", "BSND", "BNSD", "BNSD_BSND"])
def test_full_quant_fp16_output_matches_the_reference_bit_for_bit(rng, input_layout):
    q, k, v, kw = _int8_case(rng, input_layout)
    out, lse = FIA(q, k, v, **SCALES, **kw, softmax_lse_flag=True)
    want, want_lse = reference_full_quant(q, k, v, *SCALES.values(), **kw)
    assert out.dtype == np.float16 and out.shape == want.shape
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(lse, want_lse)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("sparse", [dict(sparse_mode=3), dict(sparse_mode=4, pre_tokens=6, next_tokens=2)])
def test_full_quant_int8_output_with_offset_causal_and_lengths(rng, per_channel, sparse):
    q, k, v, kw = _int8_case(rng, "BNSD", s1=5, actual_seq_lengths=[5, 5], actual_seq_lengths_kv=[40, 23])
    n, d = 4, 32
    shape = (n, d) if per_channel else (1,)
    qs2 = rng.uniform(20, 90, size=shape).astype(np.float32)
    qo2 = rng.uniform(-30, 30, size=shape).astype(np.float32)
    out, _ = FIA(q, k, v, **SCALES, quant_scale2=qs2, quant_offset2=qo2, **sparse, **kw)
    want, _ = reference_full_quant(q, k, v, *SCALES.values(), quant_out=(qs2, qo2), **sparse, **kw)
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, want)
    assert np.abs(out.astype(int)).max() == 127 or len(np.unique(out)) > 20  # saturation or a spread of codes


def test_fp19_reading_of_the_dequant_scales_and_the_uint64_form(rng, monkeypatch):
    q, k, v, kw = _int8_case(rng, "BSND")
    ds1 = SCALES["dequant_scale1"]
    bits = int(ds1.view(np.uint32)[0])
    assert bits & 0x1FFF  # the scale has bits the FP19 drops
    as_u64 = dict(SCALES, dequant_scale1=np.array([bits | 1 << 46], np.uint64),
                  dequant_scale2=np.array([int(SCALES["dequant_scale2"].view(np.uint32)[0])], np.uint64))
    a, _ = FIA(q, k, v, **SCALES, **kw)
    b, _ = FIA(q, k, v, **as_u64, **kw)
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
    c, _ = FIA(q, k, v, **dict(SCALES, dequant_scale1=_f32(fp19_value(ds1))), **kw)
    np.testing.assert_array_equal(a.view(np.uint16), c.view(np.uint16))
    # the reading is observable: the chain with the full fp32 scales gives other outputs here
    import tests.reference.fused_infer_attention as ref
    monkeypatch.setattr(ref, "fp19_value", lambda s: float(np.asarray(s, np.float32).reshape(-1)[0]))
    other = reference_full_quant(q, k, v, *SCALES.values(), **kw)[0]
    assert not np.array_equal(a.view(np.uint16), other.view(np.uint16))


def test_op_plugin_fullquant_call_through_the_drop_in():
    """op-plugin's ``test_npu_fused_infer_attention_score_v3_fullquant``: all-ones int8 q / k / v,
    unit scales: every P is exp(0) = 1, P @ V = 2048, divided by the sum 2048: int8 ones, equal to
    its fp32 golden of ones."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    q = torch.ones(1, 32, 2, 128, dtype=torch.int8)
    k = torch.ones(1, 32, 2048, 128, dtype=torch.int8)
    one = torch.ones(1)
    out, lse = torch_npu.npu_fused_infer_attention_score(
        q, k, k, dequant_scale1=one, dequant_scale2=one, quant_scale1=one, quant_scale2=one, num_heads=32,
        input_layout="BNSD", scale=128.0, pre_tokens=65535, next_tokens=65535, softmax_lse_flag=False)
    assert out.dtype == torch.int8 and out.shape == (1, 32, 2, 128)
    assert out.equal(torch.ones(1, 32, 2, 128))
    fp16, _ = torch_npu.npu_fused_infer_attention_score(
        q, k, k, dequant_scale1=one, dequant_scale2=one, quant_scale1=one, num_heads=32, input_layout="BNSD",
        scale=128.0)
    assert fp16.dtype == torch.float16 and bool((fp16 == 1).all())


@pytest.mark.parametrize("dtype,scale_dtype", [(np.float16, np.float32), (BF16, np.float32), (BF16, BF16)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_output_quant_of_a_float_query_v1_and_v2(rng, dtype, scale_dtype, per_channel):
    q, k, v, kw = make_dense(rng, "BSND", dtype=dtype)
    n, d = 4, 32
    shape = (1, 1, n, d) if per_channel else (1,)
    qs = rng.uniform(30, 120, size=shape).astype(scale_dtype)
    qo = rng.uniform(-5, 5, size=shape).astype(scale_dtype)
    out, _ = FIA(q, k, v, quant_scale2=qs, quant_offset2=qo, **kw)
    want, _ = reference_mha(q, k, v, quant_out=(qs.astype(np.float32), qo.astype(np.float32)), **kw)
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, want)
    v2 = {V2.get(key, key): val for key, val in kw.items()}
    out2, _ = FIA2(q, k, v, quant_scale_out=qs, quant_offset_out=qo, **v2)
    np.testing.assert_array_equal(out2, out)
    no_off, _ = FIA(q, k, v, quant_scale2=qs, **kw)
    np.testing.assert_array_equal(no_off, reference_mha(q, k, v, quant_out=(qs.astype(np.float32), None), **kw)[0])


def test_infer_output_and_out_form_with_quant(rng):
    q, k, v, kw = _int8_case(rng, "BSND")
    ao, lo = ops._npu_fused_infer_attention_score_infer_output(
        q, v, input_layout="BSND", quant_scale2=_f32(50), num_heads=4, num_key_value_heads=2,
        softmax_lse_flag=True)
    assert ao.dtype == np.int8
    got = FIA(q, k, v, **SCALES, quant_scale2=_f32(50), **kw, softmax_lse_flag=True, workspace=np.zeros(0, np.uint8),
              attention_out=ao, softmax_lse=lo)
    assert got[0] is ao
    np.testing.assert_array_equal(ao, FIA(q, k, v, **SCALES, quant_scale2=_f32(50), **kw)[0])


def _rejects(call, exc, name, outs=()):
    before = [o.copy() for o in outs]
    with pytest.raises(exc, match=name) as info:
        call()
    assert isinstance(info.value, AscendEmuError)
    for o, b in zip(outs, before, strict=True):
        np.testing.assert_array_equal(o, b)


def test_full_quant_rejections_name_the_argument_and_write_nothing(rng):
    q, k, v, kw = _int8_case(rng, "BSND")
    ao, lo = np.full((2, 3, 4, 32), 7, np.float16), np.zeros(0, np.float32)
    outs = dict(attention_out=ao, softmax_lse=lo)
    run = lambda **x: (lambda: FIA(q, k, v, **{**SCALES, **kw, **outs, **x}))  # noqa: E731
    _rejects(run(quant_scale1=None), ModeError, "quant_scale1", [ao])
    _rejects(run(dequant_scale2=None), ModeError, "dequant_scale2", [ao])
    _rejects(run(dequant_scale1=np.ones(2, np.float32)), ShapeError, "dequant_scale1", [ao])
    _rejects(run(dequant_scale1=np.ones(1, np.float16)), DTypeError, "dequant_scale1", [ao])
    _rejects(run(quant_scale1=_f32(np.inf)), DTypeError, "quant_scale1", [ao])
    _rejects(run(dequant_scale2=np.array([1 << 37 | 0x3F800000], np.uint64)), ModeError, "dequant_scale2", [ao])
    _rejects(run(quant_offset2=_f32(1)), ModeError, "quant_offset2", [ao])
    _rejects(run(quant_scale2=np.ones(5, np.float32)), ShapeError, "quant_scale2", [ao])
    _rejects(run(quant_scale2=np.ones(1, BF16)), DTypeError, "quant_scale2", [ao])
    _rejects(run(key_antiquant_scale=np.ones(1, np.float16), value_antiquant_scale=np.ones(1, np.float16)),
             ModeError, "key_antiquant_scale", [ao])
    _rejects(lambda: FIA(q, k.astype(np.float16), v, **SCALES, **kw), DTypeError, "key")
    # Q_S = 1: the doc's decode takes no full int8 query / key / value
    q1 = np.ascontiguousarray(q[:, :1])
    _rejects(lambda: FIA(q1, k, v, **SCALES, **kw), ShapeError, "query")
    # layouts and paged caches outside the quant
    qt = rng.integers(-9, 10, size=(6, 4, 128)).astype(np.int8)
    kt = rng.integers(-9, 10, size=(80, 2, 128)).astype(np.int8)
    _rejects(lambda: FIA(qt, kt, kt, **SCALES, **dict(kw, input_layout="TND", actual_seq_lengths=[3, 6],
                                                        actual_seq_lengths_kv=[40, 80])), ModeError, "dequant_scale1")
    # the output quant's offset where a row takes no part (padding rows past actual_seq_lengths)
    _rejects(run(quant_scale2=_f32(10), quant_offset2=_f32(1), actual_seq_lengths=[3, 2]), ModeError,
             "quant_offset2", [ao])
    # sparse_mode 4 with a negative pre_tokens / next_tokens and an int8 output
    _rejects(run(quant_scale2=_f32(10), sparse_mode=4, pre_tokens=-1, next_tokens=5), ModeError, "pre_tokens", [ao])
    # per-channel output quant with the lse
    _rejects(lambda: FIA(q, k, v, **SCALES, **kw, quant_scale2=np.ones((4, 32), np.float32), softmax_lse_flag=True),
             ModeError, "quant_scale2")
    # v2 takes no int8 query in the MHA form (full quant is v1's), the MLA form takes no output quant
    v2 = {V2.get(key, key): val for key, val in kw.items()}
    _rejects(lambda: FIA2(q, k, v, **v2), AscendEmuError, "query")


def test_float_query_rejects_the_bmm_scales(rng):
    q, k, v, kw = make_dense(rng, "BNSD")
    for name in ("dequant_scale1", "quant_scale1", "dequant_scale2"):
        _rejects(lambda name=name: FIA(q, k, v, **{name: _f32(1)}, **kw), ModeError, name)
    _rejects(lambda: FIA2(q, k, v, quant_offset_out=_f32(1), **{V2.get(a, a): b for a, b in kw.items()}),
             ModeError, "quant_offset_out")
    _rejects(lambda: FIA(q, k, v, quant_scale2=np.ones(1, BF16), **kw), DTypeError, "quant_scale2")


def test_full_quant_row_chunks_change_nothing(rng, monkeypatch):
    """The emu backend takes the query rows in chunks (bounded temporaries): chunks of one row give
    the same bytes."""
    from ascend_emu.emu import fused_infer_attention_score as emu_fia

    q, k, v, kw = _int8_case(rng, "BSND", s1=6)
    whole, lse = FIA(q, k, v, **SCALES, **kw, sparse_mode=3, softmax_lse_flag=True)
    monkeypatch.setattr(emu_fia, "FULL_QUANT_CHUNK", 1)
    rows, lse1 = FIA(q, k, v, **SCALES, **kw, sparse_mode=3, softmax_lse_flag=True)
    np.testing.assert_array_equal(rows.view(np.uint16), whole.view(np.uint16))
    np.testing.assert_array_equal(lse1, lse)


def test_int4_antiquant_takes_no_output_quant(rng):
    from ascend_emu.quant import pack_int4_to_int32

    q = rng.standard_normal((1, 2, 3, 128)).astype(np.float16)
    kv = pack_int4_to_int32(rng.integers(-8, 8, (1, 2, 5, 128)).astype(np.int8))
    s = np.ones((2, 128), np.float16)
    _rejects(lambda: FIA(q, kv, kv, num_heads=2, input_layout="BNSD", key_antiquant_scale=s, value_antiquant_scale=s,
                         quant_scale2=_f32(10)), ModeError, "quant_scale2")
