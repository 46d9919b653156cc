"""The inspector and the comparer on the Ascend 950's element types: a 656-byte row with HiF8
(uint8 cache) or FP8 E4M3 (float8_e4m3fn cache) k_nope shows its elements decoded and dequantised
(values from tests/reference/formats_950.py's bit-field decoders), and distances are counted in
the element type's own ulps (its values in order, not its bit patterns).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.compare.metrics import compare_tensor
from ascend_emu.errors import ModeError
from ascend_emu.inspect.cache import Cache
from ascend_emu.inspect.diff import diff
from ascend_emu.inspect.dump import dump
from tests.helpers import BF16
from tests.reference.formats_950 import fp8_table, hif8_decode

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
#: Value neighbours whose bit patterns are far apart: HiF8's largest denormal 2**-16 (0x07) and
#: smallest normal 2**-15 (0x7E, dot 11, E = -15).
HIF8_NEIGHBOURS = (0x07, 0x7E)


def _row(rng, element):
    """One 656-byte row as uint8: 512 random finite codes, 64 bf16 rope, 4 fp32 scales; and the
    reference values of its k_nope."""
    vals = np.array([hif8_decode(c) for c in range(256)]) if element == "hifloat8" else fp8_table(element)
    finite = np.flatnonzero(np.isfinite(vals)).astype(np.uint8)
    nope = rng.choice(finite, 512).astype(np.uint8)
    rope = rng.uniform(-2, 2, 64).astype(np.float32).astype(BF16).view(np.uint8)
    scales = np.float32([0.5, 2.0, -1.0, 0.25]).view(np.uint8)
    return np.concatenate([nope, rope, scales]), vals[nope]


@pytest.mark.parametrize("element, dtype", [("hifloat8", np.dtype(np.uint8)), ("float8_e4m3fn", FP8)])
def test_dump_decodes_950_rows(element, dtype):
    rng = np.random.default_rng(1)
    cache = np.zeros((2, 16, 1, 656), np.uint8)
    row, want = _row(rng, element)
    cache[1, 5, 0] = row
    c = Cache.from_array(cache.view(dtype), "PA_BSND")
    assert c.spec.describe()["row_format"]["nope_element"] == element
    d = dump(c, slot=21)
    nope = [ln for ln in d.lines if ln.field == "k_nope"]
    assert {ln.dtype for ln in nope} == {element}
    got = np.concatenate([ln.values for ln in nope])
    np.testing.assert_array_equal(got, want)
    deq = np.concatenate([ln.dequant for ln in nope])
    np.testing.assert_array_equal(deq, (want * np.repeat([0.5, 2.0, -1.0, 0.25], 128)).astype(np.float32))
    rope = np.concatenate([ln.values for ln in d.lines if ln.field == "k_rope"])
    np.testing.assert_array_equal(rope, row[512:640].view(BF16).astype(np.float64))
    assert [t.scale for t in d.tiles] == [0.5, 2.0, -1.0, 0.25]


def test_diff_counts_hif8_ulps_in_value_order():
    cache = np.zeros((1, 16, 1, 656), np.uint8)
    cache[0, 2, 0, :512] = HIF8_NEIGHBOURS[0]
    other = cache.copy()
    other[0, 2, 0, 7] = HIF8_NEIGHBOURS[1]
    other[0, 2, 0, 9] = 0x08  # 1.0: far from 2**-16 in value order
    a, b = Cache.from_array(cache, "PA_BSND"), Cache.from_array(other, "PA_BSND")
    (slot,) = diff(a, b).slots
    (field,) = slot.fields
    assert field.field == "k_nope" and field.dtype == "hifloat8" and field.elements == [7, 9]
    # reference ulps: places apart among HiF8's finite magnitudes in order
    mags = sorted({abs(hif8_decode(c)) for c in range(256) if np.isfinite(hif8_decode(c))})
    assert mags.index(2.0 ** -15) - mags.index(2.0 ** -16) == 1
    assert field.max_ulp == mags.index(1.0) - mags.index(2.0 ** -16)


def test_compare_tensor_uses_element_ulps():
    a = np.array([HIF8_NEIGHBOURS[0], 0x08, 0x80], np.uint8)
    b = np.array([HIF8_NEIGHBOURS[1], 0x08, 0x80], np.uint8)
    r = compare_tensor("y", a, b, element="hifloat8")
    assert r.dtype == "hifloat8" and r.mismatched == 1 and r.ulp_hist["1"] == 1
    assert r.mismatches[0]["expected"] == 2.0 ** -15 and r.mismatches[0]["actual"] == 2.0 ** -16
    plain = compare_tensor("y", a, b)  # without the hint: integers, delta in codes
    assert plain.max_int_delta == HIF8_NEIGHBOURS[1] - HIF8_NEIGHBOURS[0] and plain.ulp_hist is None
    x = np.float32([1.0, 2.0, 448.0]).astype(FP8)
    y = np.float32([1.0, 2.5, 384.0]).astype(FP8)  # 2 -> 2.5: 2 ulps; 448 -> 384: 2 ulps
    r = compare_tensor("y", x, y)
    assert r.ulp_hist["2"] == 2 and r.mismatched == 2
    with pytest.raises(ModeError, match="element"):
        compare_tensor("y", a.astype(np.int8), b.astype(np.int8), element="hifloat8")


def test_cli_dump_json_of_a_hif8_cache(tmp_path, capsys):
    from ascend_emu.cli import main

    rng = np.random.default_rng(2)
    cache = np.zeros((1, 16, 1, 656), np.uint8)
    row, want = _row(rng, "hifloat8")
    cache[0, 0, 0] = row
    path = tmp_path / "hif8.npy"
    np.save(path, cache)
    assert main(["inspect", "dump", str(path), "--cache-mode", "PA_BSND", "--slot", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    nope = [ln for ln in out["lines"] if ln["field"] == "k_nope"]
    assert nope[0]["dtype"] == "hifloat8" and nope[0]["values"] == [float(v) for v in want[:len(nope[0]["values"])]]
