"""npu_kv_quant_sparse_flash_attention on an emulated Ascend 950: HiF8 / FP8 E4M3 / int8 656-byte
rows, 48 query heads and sinks, against the plain-loop reference (tests/reference/sparse_attention.py,
which decodes the elements with tests/reference/formats_950.py); each 950 mode rejected on A2 / A3
naming the SoC with the inputs untouched; the drop-in (torch_npu and torch.ops._C_ascend).

Exactness: :func:`test_exact_inputs_bit_identical` builds inputs whose scores and ``P @ V`` sums
are exact in fp32 whatever the summation order (small dyadic values, a power-of-two scale_value,
rows of similar weight), so the op and the reference must agree to the bit, sinks included.
:func:`test_golden_style_inputs` uses op-plugin's golden value ranges and the official criterion.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, ModeError, ShapeError
from ascend_emu.mla import D_ROPE, HCKV
from tests.helpers import BF16, raw
from tests.reference.formats_950 import fp8_table, hif8_decode, hif8_encode
from tests.reference.sparse_attention import reference

SOC_950 = "Ascend950PR_9599"
ELEMENTS = ("hifloat8", "float8_e4m3fn", "int8")
HIF8_K = 2048  # the only sparse_size with HiF8 keys
#: Official pass criterion (op-plugin goldens): share within isclose(rtol, atol).
RTOL, ATOL, CLOSE_SHARE = 5e-3, 1e-4, 0.99


@pytest.fixture
def soc950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", SOC_950)


def _codes_in(element: str, lo: float, hi: float) -> np.ndarray:
    """uint8 codes whose value (reference decoders) has magnitude in [lo, hi]."""
    if element == "int8":
        vals = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float64)
    elif element == "hifloat8":
        vals = np.array([hif8_decode(c) for c in range(256)])
    else:
        vals = fp8_table(element)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(vals) & (np.abs(vals) >= lo) & (np.abs(vals) <= hi)
    return np.flatnonzero(ok).astype(np.uint8)


def _key(element: str, nope_u8, rope, scales):
    """656-byte rows ``[.., 656]`` as the op takes them (int8 / uint8 HiF8 / float8_e4m3fn)."""
    rows = np.concatenate([nope_u8, rope.view(np.uint8), scales.astype(np.float32).view(np.uint8)], axis=-1)
    return rows.view({"int8": np.int8, "hifloat8": np.uint8, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}[element])


def _dtype_kw(element):
    return dict(key_dtype=290, value_dtype=290) if element == "hifloat8" else {}


def _indices(rng, lead, act_kv, picks, k):
    """int32 ``[*lead, 1, k]``: ``picks`` distinct positions per token, then -1."""
    idx = np.full((*lead, 1, k), -1, np.int32)
    flat = idx.reshape(-1, k)
    for row, kv in zip(flat, act_kv, strict=True):
        row[:picks] = rng.permutation(kv)[:picks]
    return idx


def _exact_case(rng, element, n1=48, b=2, s2=24, picks=6):
    """BSND inputs whose scores and P @ V are exact in fp32 in any summation order: query
    integers in [-4, 4]; k_nope values in [1/8, 2] (int8: [-32, 32] x 1/16) times tile scales
    1/2, 1 or 2; rope quarters; scale_value 2**-12 (so |S| < 2 and every P >= 2**-6)."""
    query = rng.integers(-4, 5, (b, 1, n1, 576)).astype(np.float32).astype(BF16)
    if element == "int8":
        nope = rng.integers(-32, 33, (b, s2, 1, HCKV)).astype(np.int8).view(np.uint8)
        scales = np.full((b, s2, 1, 4), 1 / 16, np.float32)
    else:
        nope = rng.choice(_codes_in(element, 1 / 8, 2), (b, s2, 1, HCKV)).astype(np.uint8)
        scales = rng.choice(np.float32([0.5, 1, 2]), (b, s2, 1, 4))
    rope = (rng.integers(-8, 9, (b, s2, 1, D_ROPE)) / 4).astype(np.float32).astype(BF16)
    key = _key(element, nope, rope, scales)
    k = HIF8_K if element == "hifloat8" else 8
    return query, key, _indices(rng, (b, 1), [s2] * b, picks, k)


@pytest.mark.parametrize("with_sinks", [False, True], ids=["nosinks", "sinks"])
@pytest.mark.parametrize("element", ELEMENTS)
def test_exact_inputs_bit_identical(soc950, element, with_sinks):
    rng = np.random.default_rng(7)
    query, key, idx = _exact_case(rng, element)
    sinks = rng.uniform(-1, 1, 48).astype(np.float32) if with_sinks else None
    before = raw(key).tobytes()
    out = ops.npu_kv_quant_sparse_flash_attention(query, key, key, idx, 2.0 ** -12, 2, 2, attention_mode=2,
                                                  sparse_mode=0, sinks=sinks, **_dtype_kw(element))
    gold, _, _, valid = reference(query, key, key, idx, 2.0 ** -12, quant=True, sparse_mode=0, element=element,
                                  sinks=sinks)
    assert valid.all() and out.shape == (2, 1, 48, HCKV) and out.dtype == BF16
    assert raw(out).tobytes() == raw(gold).tobytes()
    assert raw(key).tobytes() == before
    if with_sinks:  # the sinks take weight: the output differs from the call without them
        plain = ops.npu_kv_quant_sparse_flash_attention(query, key, key, idx, 2.0 ** -12, 2, 2, attention_mode=2,
                                                        sparse_mode=0, **_dtype_kw(element))
        assert raw(plain).tobytes() != raw(out).tobytes()


def _softmax_stats(monkeypatch) -> dict:
    """Have npu_kv_quant_sparse_flash_attention's backend also return softmax_max / softmax_sum
    (the quant op returns only attention_out; the non-quant op returns both with
    ``return_softmax_lse``): they land in the returned dict as ``"max"`` / ``"sum"``."""
    import dataclasses

    from ascend_emu.ops import sparse_flash_attention as sfa

    got: dict = {}
    real = sfa.get_backend

    class Spy:
        def sparse_flash_attention(self, args):
            result = real().sparse_flash_attention(dataclasses.replace(args, return_softmax_lse=True))
            got["max"], got["sum"] = result.softmax_max, result.softmax_sum
            return result

    monkeypatch.setattr(sfa, "get_backend", Spy)
    return got


@pytest.mark.parametrize("element", ["int8", "float8_e4m3fn"])
def test_sinks_above_the_max_score_many_picks(soc950, monkeypatch, element):
    """Sinks above every score of their head (so the sink is the max, and ``exp(sink - m) = 1``
    starts the sum, the kv exps added to it one by one), three tokens, 200 picks each: the
    softmax max and sum bit for bit against the golden softmax of the reference, and the output
    too (the scores are exact in fp32; so is ``P @ V`` here: P has 8 significant bits and 200
    terms, V at most 4 bits times a power of two, with the sum's few binades). A sink left out of
    the max changes every max; one added after the kv sum rounds the sum differently."""
    rng = np.random.default_rng(23)
    b, s2, picks = 3, 256, 200
    query, key, _ = _exact_case(rng, element, b=b, s2=s2, picks=2)
    idx = _indices(rng, (b, 1), [s2] * b, picks, s2)
    kw = dict(attention_mode=2, sparse_mode=0)
    _, plain_max, _, _ = reference(query, key, key, idx, 2.0 ** -12, quant=True, sparse_mode=0, element=element)
    top = plain_max.max(axis=0).reshape(-1)  # [48] each head's largest score over the tokens
    sinks = (top + rng.uniform(0.25, 3.0, 48)).astype(np.float32)
    sinks[::8] = top[::8] - 0.5  # and a few heads whose sink is below their max
    stats = _softmax_stats(monkeypatch)
    out = ops.npu_kv_quant_sparse_flash_attention(query, key, key, idx, 2.0 ** -12, 2, 2, sinks=sinks, **kw)
    gold, smax, ssum, valid = reference(query, key, key, idx, 2.0 ** -12, quant=True, sparse_mode=0,
                                        element=element, sinks=sinks)
    assert valid.all() and (smax.reshape(b, 48) >= sinks).all()
    assert (smax.reshape(b, 48)[:, 1:8] == sinks[1:8]).all()  # the sink is the max where above
    np.testing.assert_array_equal(stats["max"].reshape(-1).view(np.uint32), smax.reshape(-1).view(np.uint32))
    np.testing.assert_array_equal(stats["sum"].reshape(-1).view(np.uint32), ssum.reshape(-1).view(np.uint32))
    np.testing.assert_array_equal(raw(out), raw(gold))


@pytest.mark.parametrize("layout", [("BSND", "BSND"), ("TND", "PA_BSND")])
@pytest.mark.parametrize("element", ["hifloat8", "float8_e4m3fn"])
def test_golden_style_inputs(soc950, element, layout):
    """op-plugin's 950 goldens' ranges (query U(-10, 10), keys U(-5, 10) encoded, scales
    U(-100, 100), sinks U(-1, 200)), causal mode 3, fp16 and bf16 queries: more than 99 % within
    isclose (the golden's test) and bit-identical shares at their measured 0.9999-1.0 less 0.005."""
    rng = np.random.default_rng(11)
    layout_query, layout_kv = layout
    n1, act_q, act_kv, bs = 48, (2, 1), (40, 23), 16
    qdt = BF16 if element == "hifloat8" else np.dtype(np.float16)
    b = len(act_q)
    if layout_query == "BSND":
        lead, asq = (b, max(act_q)), np.asarray(act_q, np.int32)
    else:
        lead, asq = (sum(act_q),), np.cumsum(act_q).astype(np.int32)
    query = rng.uniform(-10, 10, (*lead, n1, 576)).astype(np.float32).astype(qdt)
    kw = dict(actual_seq_lengths_query=asq, layout_query=layout_query, layout_kv=layout_kv, sparse_mode=3,
              attention_mode=2)
    if layout_kv == "PA_BSND":
        nblocks = sum(-(-a // bs) for a in act_kv) + 1
        shape = (nblocks, bs, 1)
        perm = rng.permutation(nblocks).astype(np.int32)
        table = np.stack([perm[:3], np.r_[perm[3:5], perm[5]]]).astype(np.int32)  # 3 + 2 blocks used
        kw.update(block_table=table, actual_seq_lengths_kv=np.asarray(act_kv, np.int32))
    else:
        shape = (b, max(act_kv), 1)
        kw.update(actual_seq_lengths_kv=np.asarray(act_kv, np.int32))
    kf = rng.uniform(-5, 10, (*shape, HCKV)).astype(np.float32)
    nope = hif8_encode(kf) if element == "hifloat8" else kf.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    rope = rng.uniform(-10, 10, (*shape, D_ROPE)).astype(np.float32).astype(qdt)
    key = _key(element, nope, rope, rng.uniform(-100, 100, (*shape, 4)))
    tok_kv = [act_kv[bb] for bb in range(b) for _ in range(lead[1] if layout_query == "BSND" else act_q[bb])]
    idx = _indices(rng, lead, tok_kv, 20, HIF8_K if element == "hifloat8" else 32)
    sinks = rng.uniform(-1, 200, n1).astype(np.float32)
    out = ops.npu_kv_quant_sparse_flash_attention(query, key, key, idx, 0.041666666666666664, 2, 2, sinks=sinks,
                                                  **kw, **_dtype_kw(element))
    gold, _, _, valid = reference(query, key, key, idx, 0.041666666666666664, quant=True, element=element,
                                  sinks=sinks, **{k: v for k, v in kw.items() if k != "attention_mode"})
    a, g = out.astype(np.float32), gold.astype(np.float32)
    assert valid.any()
    assert np.isclose(a, g, rtol=RTOL, atol=ATOL).mean() > CLOSE_SHARE
    assert (raw(out) == raw(gold)).mean() >= 0.9999 - 0.005


# ---------------------------------------------------------------------- rejections
def _small(rng, element, n1=8, k=None):
    query, key, idx = _exact_case(rng, element, n1=n1, s2=8, picks=3)
    return query, key, idx


@pytest.mark.parametrize("soc", ["Ascend910B2", "Ascend910_9391"])
@pytest.mark.parametrize("mode, argument", [
    ("hifloat8", "key_dtype"), ("float8_e4m3fn", "key"), ("sinks", "sinks"),
])
def test_950_modes_rejected_on_a2_a3(monkeypatch, soc, mode, argument):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    rng = np.random.default_rng(3)
    element = mode if mode != "sinks" else "int8"
    query, key, idx = _small(rng, element)
    extra = dict(sinks=np.zeros(8, np.float32)) if mode == "sinks" else _dtype_kw(element)
    before = [raw(x).tobytes() for x in (query, key, idx)]
    with pytest.raises(ModeError, match=rf"^{argument}: When {argument} is .*not support on this soc version {soc}"):
        ops.npu_kv_quant_sparse_flash_attention(query, key, key, idx, 0.5, 2, 2, attention_mode=2, **extra)
    assert [raw(x).tobytes() for x in (query, key, idx)] == before


def test_48_heads_rejected_on_a2(monkeypatch):
    monkeypatch.delenv("ASCEND_EMU_SOC_NAME", raising=False)
    query, key, idx = _small(np.random.default_rng(4), "int8", n1=48)
    with pytest.raises(ShapeError, match=r"query: expected N1 in \[1, 2, 4, 8, 16, 32, 64, 128\] \(48: Ascend 950 only\)"):
        ops.npu_kv_quant_sparse_flash_attention(query, key, key, idx, 0.5, 2, 2, attention_mode=2)


@pytest.mark.parametrize("change, error, fragment", [
    (dict(sparse_block_size=2), ModeError, r"sparse_block_size: expected 1 \(the only value on the Ascend 950\)"),
    (dict(key_dtype=292, value_dtype=292), ModeError, r"key_dtype: expected None or 290 \(hifloat8\)"),
    (dict(key_dtype=290, value_dtype=None), ModeError, r"value_dtype: expected key_dtype's value"),
    ("hif8_k", ShapeError, r"sparse_indices: expected .*K = 2048"),
    ("uint8_without_code", DTypeError, r"key: expected dtype int8, or on the Ascend 950 float8_e4m3fn or uint8"),
    ("int8_with_code", DTypeError, r"key: expected uint8 HiF8 codes with key_dtype=290"),
    ("value_dtype", ModeError, r"value: expected key itself \(or a copy\), or an uint8"),
    (dict(sinks=np.zeros(7, np.float32)), ShapeError, r"sinks: expected \[N1\] = \[8\]"),
    (dict(sinks=np.zeros(8, np.float64)), DTypeError, r"sinks: expected dtype float32"),
    (dict(sinks=np.r_[np.zeros(7), np.nan].astype(np.float32)), DTypeError, r"sinks\[7\] = nan"),
])
def test_950_argument_errors(soc950, change, error, fragment):
    rng = np.random.default_rng(5)
    element = "int8" if change in ("uint8_without_code", "int8_with_code") else "hifloat8"
    query, key, idx = _small(rng, element)
    value, kw = key, dict(_dtype_kw(element), attention_mode=2)
    if change == "hif8_k":
        idx = np.ascontiguousarray(idx[..., :16])
    elif change == "uint8_without_code":
        key = value = key.view(np.uint8)
    elif change == "int8_with_code":
        kw.update(key_dtype=290, value_dtype=290)
    elif change == "value_dtype":
        value = key.view(np.int8)
    else:
        kw.update(change)
    before = [raw(x).tobytes() for x in (query, key, idx)]
    with pytest.raises(error, match=fragment):
        ops.npu_kv_quant_sparse_flash_attention(query, key, value, idx, 0.5, 2, 2, **kw)
    assert [raw(x).tobytes() for x in (query, key, idx)] == before


# ---------------------------------------------------------------------- drop-in
def test_drop_in_fp8_hif8_and_sinks(soc950):
    """torch_npu.npu_kv_quant_sparse_flash_attention with a torch.float8_e4m3fn key, and with uint8
    HiF8 codes tagged ``key_dtype=torch_npu.hifloat8`` (290) and sinks; torch.ops._C_ascend's
    binding (vllm-ascend's schema, no key_dtype / sinks) with the fp8 key; the fake kernel's
    shape. Same bytes as the NumPy op."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    assert torch_npu.hifloat8 == 290
    rng = np.random.default_rng(9)
    sinks = rng.uniform(-1, 1, 48).astype(np.float32)
    for element in ("float8_e4m3fn", "hifloat8"):
        query, key, idx = _exact_case(rng, element)
        kw = dict(sparse_mode=0, attention_mode=2, sinks=sinks, **_dtype_kw(element))
        want = ops.npu_kv_quant_sparse_flash_attention(query, key, key, idx, 2.0 ** -12, 2, 2, **kw)
        tq = torch.from_numpy(query.view(np.int16)).view(torch.bfloat16).npu()
        tk = (torch.from_numpy(key.view(np.uint8)).view(torch.float8_e4m3fn) if element == "float8_e4m3fn"
              else torch.from_numpy(key)).npu()
        ti = torch.from_numpy(idx).npu()
        tkw = dict(kw, sinks=torch.from_numpy(sinks).npu())
        got = torch_npu.npu_kv_quant_sparse_flash_attention(tq, tk, tk, ti, 2.0 ** -12, 2, 2, **tkw)
        assert got.dtype == torch.bfloat16 and got.cpu().view(torch.int16).numpy().tobytes() == raw(want).tobytes()
        mode = torch._subclasses.fake_tensor.FakeTensorMode()
        fq, fk, fi, fs = (mode.from_tensor(x.cpu()) for x in (tq, tk, ti, tkw["sinks"]))
        with mode:
            fake = torch.ops.npu.npu_kv_quant_sparse_flash_attention(fq, fk, fk, fi, 2.0 ** -12, 2, 2,
                                                                     **dict(tkw, sinks=fs))
        assert tuple(fake.shape) == (2, 1, 48, HCKV)
    # vllm-ascend's _C_ascend binding: fp8 key, dtype from the tensor
    query, key, idx = _exact_case(rng, "float8_e4m3fn")
    want = ops.npu_kv_quant_sparse_flash_attention(query, key, key, idx, 2.0 ** -12, 2, 2, sparse_mode=0,
                                                   attention_mode=2)
    tk = torch.from_numpy(key.view(np.uint8)).view(torch.float8_e4m3fn).npu()
    out = torch.ops._C_ascend.npu_kv_quant_sparse_flash_attention(
        torch.from_numpy(query.view(np.int16)).view(torch.bfloat16).npu(), tk, tk, torch.from_numpy(idx).npu(), 2.0 ** -12,
        key_quant_mode=2, value_quant_mode=2, sparse_mode=0)
    assert out[0].cpu().view(torch.int16).numpy().tobytes() == raw(want).tobytes()


def test_drop_in_rejects_sinks_on_a2(monkeypatch):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    monkeypatch.delenv("ASCEND_EMU_SOC_NAME", raising=False)
    query, key, idx = _small(np.random.default_rng(6), "int8")
    tk = torch.from_numpy(key).npu()
    before = tk.cpu().clone()
    with pytest.raises(ModeError, match=r"sinks: When sinks is .*not support on this soc version Ascend910B2"):
        torch_npu.npu_kv_quant_sparse_flash_attention(
            torch.from_numpy(query.view(np.int16)).view(torch.bfloat16).npu(), tk, tk, torch.from_numpy(idx).npu(), 0.5, 2, 2,
            attention_mode=2, sinks=torch.zeros(8, dtype=torch.float32).npu())
    assert torch.equal(tk.cpu(), before)
