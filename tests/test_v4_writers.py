"""DeepSeek-V4 cache writers (ascend_emu.ops.v4_writers) against tests/reference/v4_writers.py,
byte for byte over whole caches (bytes not written must stay as they were); the slot policy
(-1 skips, out of range rejected, duplicates: last wins with a warning); rejected calls leave
every cache byte-identical; SoC gating; both namespaces' schemas through torch."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import (DTypeError, DuplicateSlotWarning, IndexRangeError, ModeError, NonFiniteInputError,
                               ShapeError)
from tests.reference import v4_writers as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = {"float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn), "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}
A950 = "Ascend950PR_9599"


@pytest.fixture
def a950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)


def _x(seed: int, t: int, d: int, dtype=BF16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-10, 10, (t, d)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-12, 12, (t, 1)).astype(np.float32)
    x[0, :64] = 0  # a zero group (amax clamp / scale 0)
    return x.astype(dtype)


def _noise(shape, dtype, seed: int = 99) -> np.ndarray:
    """A cache full of random bytes: bytes the writer must not touch are visible."""
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(np.dtype(dtype)).reshape(shape)


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


SLOTS = np.array([5, -1, 0, 11, 3, -1, 7, 2, 9], np.int32)  # shuffled, with skips, several blocks


# ------------------------------------------------------------------------ kv_compress_epilog layout 1
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("round_scale", [True, False])
def test_kv_layout1_mode2(a950, name, group, round_scale):
    x = _x(1, SLOTS.size, 512)
    cache = _noise((12, 1, 640), FP8[name])
    want = ref.kv_layout1(_u8(cache).reshape(12, 640), x, SLOTS, name=name, group=group, round_scale=round_scale)
    ops.kv_compress_epilog(cache, x, SLOTS.astype(np.int64), quant_group_size=group, round_scale_flag=round_scale)
    np.testing.assert_array_equal(_u8(cache).reshape(12, 640), want)


@pytest.mark.parametrize("d", [256, 768])
def test_kv_layout1_other_widths(a950, d):
    """The golden's other head dims: rows of ceil((d - 64 + 128 + scales) / 128) * 128 bytes."""
    x = _x(2, SLOTS.size, d)
    w = {256: 384, 768: 896}[d]
    cache = _noise((12, w), FP8["float8_e4m3fn"])
    want = ref.kv_layout1(_u8(cache).reshape(12, w), x, SLOTS)
    ops.kv_compress_epilog(cache, x, SLOTS)
    np.testing.assert_array_equal(_u8(cache).reshape(12, w), want)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_kv_layout1_mode1(a950, name):
    x = _x(3, SLOTS.size, 512)
    cache = _noise((12, 640), FP8[name])
    want = ref.kv_layout1(_u8(cache).reshape(12, 640), x, SLOTS, quant_mode=1, name=name)
    ops.kv_compress_epilog(cache, x, SLOTS, quant_group_size=128, quant_mode=1)
    np.testing.assert_array_equal(_u8(cache).reshape(12, 640), want)


def test_kv_layout1_mode3_hifloat8(a950):
    x = _x(4, SLOTS.size, 512)
    cache = _noise((12, 512), np.uint8)
    want = ref.kv_layout1(cache, x, SLOTS, quant_mode=3, scale=0.5)
    ops.kv_compress_epilog(cache, x, SLOTS, quant_group_size=128, quant_mode=3, scale=0.5)
    np.testing.assert_array_equal(cache, want)


def test_skipped_rows_are_not_read(a950):
    """A -1 row may hold anything (graph-capture padding): NaN there is not an error."""
    x = _x(5, 3, 512)
    x[1] = np.nan
    cache = _noise((4, 1, 640), FP8["float8_e4m3fn"])
    slots = np.array([2, -1, 0], np.int32)
    want = ref.kv_layout1(_u8(cache).reshape(4, 640), x, slots)
    ops.kv_compress_epilog(cache, x, slots)
    np.testing.assert_array_equal(_u8(cache).reshape(4, 640), want)


def test_nan_in_the_rope_part_is_copied(a950):
    """The rope values are copied as bf16 bits, NaN included; only quantized values must be finite."""
    x = _x(16, 2, 512)
    x[0, 500] = np.nan
    cache = _noise((2, 640), FP8["float8_e4m3fn"])
    want = ref.kv_layout1(_u8(cache).reshape(2, 640), x, np.array([1, 0]))
    ops.kv_compress_epilog(cache, x, np.array([1, 0], np.int32))
    np.testing.assert_array_equal(_u8(cache).reshape(2, 640), want)


def test_duplicate_slots_last_row_wins_with_warning(a950):
    x = _x(6, 4, 512)
    slots = np.array([3, 1, 3, -1], np.int32)
    cache = _noise((4, 1, 640), FP8["float8_e4m3fn"])
    want = ref.kv_layout1(_u8(cache).reshape(4, 640), x, slots)  # in order: row 2 ends in slot 3
    with pytest.warns(DuplicateSlotWarning, match="slot 3"):
        ops.kv_compress_epilog(cache, x, slots)
    np.testing.assert_array_equal(_u8(cache).reshape(4, 640), want)


def test_many_rows_a_signature_seen_before_keeps_the_slot_policy(a950):
    """Above 32 live rows (the duplicate search sorts) and on a call signature already
    validated: a duplicate still warns and the last row wins, a slot past the cache and a NaN in
    a quantized value of row 40 are still rejected with the cache untouched, and a NaN in a
    skipped row is not read."""
    t = 48
    x = _x(17, t, 512)
    slots = np.random.default_rng(17).permutation(64)[:t].astype(np.int32)
    slots[5] = -1
    x[5] = np.nan
    cache = _noise((64, 1, 640), FP8["float8_e4m3fn"])
    want = ref.kv_layout1(_u8(cache).reshape(64, 640), x, slots)
    ops.kv_compress_epilog(cache, x, slots)  # the signature is now known
    np.testing.assert_array_equal(_u8(cache).reshape(64, 640), want)
    dup = slots.copy()
    dup[40] = dup[3]
    want = ref.kv_layout1(_u8(cache).reshape(64, 640), x, dup)
    with pytest.warns(DuplicateSlotWarning, match=f"slot {int(dup[3])}"):
        ops.kv_compress_epilog(cache, x, dup)
    np.testing.assert_array_equal(_u8(cache).reshape(64, 640), want)
    before = _u8(cache).copy()
    with pytest.raises(IndexRangeError, match=r"slot_mapping\[40\] = 64"):
        ops.kv_compress_epilog(cache, x, np.where(np.arange(t) == 40, 64, slots).astype(np.int32))
    bad = x.copy()
    bad[40, 7] = np.inf
    with pytest.raises(NonFiniteInputError, match=r"x\[40, 7\]"):
        ops.kv_compress_epilog(cache, bad, slots)
    np.testing.assert_array_equal(_u8(cache), before)


def test_strided_x_writes_the_same_bytes(a950):
    """x in Fortran order or as a column slice of a wider array (the compiled passes read any
    strides) writes what the C-contiguous x writes."""
    x = _x(18, SLOTS.size, 512)
    want = _noise((12, 1, 640), FP8["float8_e4m3fn"])
    got_f, got_s = want.copy(), want.copy()
    ops.kv_compress_epilog(want, x, SLOTS)
    ops.kv_compress_epilog(got_f, np.asfortranarray(x), SLOTS)
    ops.kv_compress_epilog(got_s, np.concatenate([x, x], axis=1)[:, :512], SLOTS)
    np.testing.assert_array_equal(_u8(got_f), _u8(want))
    np.testing.assert_array_equal(_u8(got_s), _u8(want))
    wide = _x(19, SLOTS.size, 256)
    ic, isc = _noise((12, 128), FP8["float8_e4m3fn"]), _noise((12, 1), np.float32, 7)
    want_c, want_s = ref.indexer_v1(_u8(ic).reshape(12, 128), _u8(isc).reshape(12, 4), wide[:, :128], SLOTS)
    ops.indexer_compress_epilog(ic, isc, wide[:, :128], SLOTS)
    np.testing.assert_array_equal(_u8(ic).reshape(12, 128), want_c)
    np.testing.assert_array_equal(_u8(isc).reshape(12, 4), want_s)


def test_all_rows_skipped_writes_nothing(a950):
    x = _x(7, 2, 512)
    cache = _noise((3, 640), FP8["float8_e4m3fn"])
    before = cache.copy()
    ops.kv_compress_epilog(cache, x, np.array([-1, -1], np.int32))
    np.testing.assert_array_equal(_u8(cache), _u8(before))


# ------------------------------------------------------------------------ kv_compress_epilog layout 2
@pytest.mark.parametrize("shape", [(3, 4, 1, 640), (3, 4, 584), (2, 8, 1, 600)])
@pytest.mark.parametrize("group", [64, 128])
def test_kv_layout2(a950, shape, group):
    blocks, bs = shape[0], shape[1]
    slots = np.array([s for s in (5, -1, 0, 11, 3, -1, 7, 2, 9) if s < blocks * bs or s == -1], np.int32)
    x = _x(8, slots.size, 512)
    cache = _noise(shape, FP8["float8_e4m3fn"])
    want = ref.kv_layout2(_u8(cache), x, slots, block_size=bs, block_stride=bs * shape[-1], group=group)
    ops.kv_compress_epilog(cache, x, slots, quant_group_size=group, layout=2)
    np.testing.assert_array_equal(_u8(cache), want)


# ------------------------------------------------------------------------ indexer writers
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("d", [128, 4096, 200])
def test_indexer_compress_epilog_mode1(a950, name, d):
    x = _x(9, SLOTS.size, d, np.float16 if d == 200 else BF16)
    n = -(-d // 128)
    cache, scale = _noise((12, d), FP8[name]), _noise((12, n), np.float32, 3)
    want_c, want_s = ref.indexer_v1(_u8(cache).reshape(12, d), _u8(scale).reshape(12, 4 * n), x, SLOTS, name=name)
    ops.indexer_compress_epilog(cache, scale, x, SLOTS)
    np.testing.assert_array_equal(_u8(cache).reshape(12, d), want_c)
    np.testing.assert_array_equal(_u8(scale).reshape(12, 4 * n), want_s)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("quant_mode, round_scale", [(1, True), (0, True), (0, False)])
def test_indexer_fp16_keys_every_finite_half(a950, name, quant_mode, round_scale):
    """Every finite fp16 magnitude (subnormals, zero, the largest), in rows of 128 neighbours so
    that each group's scale is set by values of its own size, every other one negated: the
    compiled widening of fp16 keys against the reference, fp32 (quant_mode 1) and E8M0 scales."""
    mags = np.arange(0x7C00, dtype=np.uint16).view(np.float16).reshape(-1, 128)  # [248, 128]
    x = np.where(np.arange(128) % 2 == 1, -mags, mags)
    t = x.shape[0]
    slots = np.random.default_rng(5).permutation(t).astype(np.int32)
    width = 4 if quant_mode == 1 else 1
    scale_dtype = np.float32 if quant_mode == 1 else ml_dtypes.float8_e8m0fnu
    cache, scale = _noise((t, 128), FP8[name]), _noise((t, 1), scale_dtype, 6)
    want_c, want_s = ref.indexer_v1(_u8(cache).reshape(t, 128), _u8(scale).reshape(t, width), x, slots,
                                    quant_mode=quant_mode, name=name, round_scale=round_scale)
    ops.indexer_compress_epilog(cache, scale, x, slots, quant_mode=quant_mode, round_scale=round_scale)
    np.testing.assert_array_equal(_u8(cache).reshape(t, 128), want_c)
    np.testing.assert_array_equal(_u8(scale).reshape(t, width), want_s)


@pytest.mark.parametrize("round_scale", [True, False])
def test_indexer_compress_epilog_mode0_mx(a950, round_scale):
    x = _x(10, SLOTS.size, 512)
    cache, scale = _noise((12, 512), FP8["float8_e4m3fn"]), _noise((12, 4), ml_dtypes.float8_e8m0fnu, 4)
    want_c, want_s = ref.indexer_v1(_u8(cache).reshape(12, 512), _u8(scale).reshape(12, 4), x, SLOTS, quant_mode=0,
                                    round_scale=round_scale)
    ops.indexer_compress_epilog(cache, scale, x, SLOTS, quant_mode=0, round_scale=round_scale)
    np.testing.assert_array_equal(_u8(cache).reshape(12, 512), want_c)
    np.testing.assert_array_equal(_u8(scale).reshape(12, 4), want_s)


@pytest.mark.parametrize("shape", [(3, 4, 1, 132), (2, 8, 1, 160)])
def test_indexer_compress_epilog_v2(a950, shape):
    blocks, bs = shape[0], shape[1]
    slots = np.array([s for s in SLOTS if s < blocks * bs or s == -1], np.int32)
    x = _x(11, slots.size, 128)
    cache = _noise(shape, np.uint8)
    want = ref.indexer_v2(_u8(cache), x, slots, block_size=bs, row_bytes=shape[-1])
    ops.indexer_compress_epilog_v2(cache, x.reshape(-1, 1, 128), slots)
    np.testing.assert_array_equal(_u8(cache), want)


# ------------------------------------------------------------------------ rejected calls
def _kv_case():
    return _noise((12, 1, 640), FP8["float8_e4m3fn"]), _x(12, SLOTS.size, 512), SLOTS.copy()


REJECTED_KV = [
    ("slot past the cache", lambda c, x, s: ops.kv_compress_epilog(c, x, np.where(s == 11, 12, s).astype(np.int32)),
     IndexRangeError, r"slot_mapping\[3\] = 12"),
    ("slot -2", lambda c, x, s: ops.kv_compress_epilog(c, x, np.where(s == 3, -2, s).astype(np.int32)),
     IndexRangeError, "-2"),
    ("x fp16", lambda c, x, s: ops.kv_compress_epilog(c, x.astype(np.float16), s), DTypeError, "x"),
    ("cache bf16", lambda c, x, s: ops.kv_compress_epilog(np.zeros((12, 1, 640), BF16), x, s), DTypeError,
     "kv_compress_cache"),
    ("row width 512", lambda c, x, s: ops.kv_compress_epilog(c.reshape(-1)[:12 * 512].reshape(12, 512), x, s),
     ShapeError, "kv_compress_cache"),
    ("paged cache in layout 1", lambda c, x, s: ops.kv_compress_epilog(c.reshape(3, 4, 1, 640), x, s), ShapeError,
     "view it"),
    ("slot_mapping length", lambda c, x, s: ops.kv_compress_epilog(c, x, s[:-1]), ShapeError, "slot_mapping"),
    ("slot_mapping float", lambda c, x, s: ops.kv_compress_epilog(c, x, s.astype(np.float32)), DTypeError,
     "slot_mapping"),
    ("group 32", lambda c, x, s: ops.kv_compress_epilog(c, x, s, quant_group_size=32), ModeError, "quant_group_size"),
    ("mode 1 group 64", lambda c, x, s: ops.kv_compress_epilog(c, x, s, quant_mode=1), ModeError, "quant_group_size"),
    ("mode 4", lambda c, x, s: ops.kv_compress_epilog(c, x, s, quant_mode=4), ModeError, "quant_mode"),
    ("layout 3", lambda c, x, s: ops.kv_compress_epilog(c, x, s, layout=3), ModeError, "layout"),
    ("layout 2 mode 1", lambda c, x, s: ops.kv_compress_epilog(c.reshape(3, 4, 1, 640), x, s, quant_mode=1,
                                                               quant_group_size=128, layout=2), ModeError, "layout"),
    ("round flag int", lambda c, x, s: ops.kv_compress_epilog(c, x, s, round_scale_flag=1), ModeError,
     "round_scale_flag"),
    ("scale outside mode 3", lambda c, x, s: ops.kv_compress_epilog(c, x, s, scale=0.5), ModeError, "scale"),
    ("mode 3 without scale", lambda c, x, s: ops.kv_compress_epilog(c, x, s, quant_mode=3), ModeError,
     "quant_mode"),
    ("group 128 with scale", lambda c, x, s: ops.kv_compress_epilog(c, x, s, quant_group_size=128, scale=1.0),
     ModeError, "quant_group_size"),
    ("layout 2 with scale", lambda c, x, s: ops.kv_compress_epilog(c.reshape(3, 4, 1, 640), x, s, layout=2,
                                                                   scale=1.0), ModeError, "layout"),
    ("NaN in a written row", lambda c, x, s: ops.kv_compress_epilog(c, np.where(np.arange(512) == 17, np.nan,
                                                                                  x.astype(np.float32)).astype(BF16), s),
     NonFiniteInputError, "x"),
    ("x inside the cache", lambda c, x, s: ops.kv_compress_epilog(c, c.reshape(-1)[:3 * 1024].view(BF16)
                                                                  .reshape(3, 512), s[:3]), ShapeError, "x"),
    ("layout 2 block too small", lambda c, x, s: ops.kv_compress_epilog(
        c.reshape(-1)[:12 * 500].reshape(3, 4, 500), x, np.where(s > 11, -1, s).astype(np.int32), layout=2),
     ShapeError, "kv_compress_cache"),
]


@pytest.mark.parametrize("what,call,exc,match", REJECTED_KV, ids=[r[0] for r in REJECTED_KV])
def test_rejected_kv_calls_leave_the_cache_untouched(a950, what, call, exc, match):
    cache, x, slots = _kv_case()
    before = _u8(cache).copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(exc, match=match):
            call(cache, x, slots)
    np.testing.assert_array_equal(_u8(cache), before)


def test_rejected_indexer_calls_leave_both_tensors_untouched(a950):
    x = _x(13, SLOTS.size, 256)
    cache, scale = _noise((12, 256), FP8["float8_e4m3fn"]), _noise((12, 2), np.float32, 5)
    packed = _noise((3, 4, 1, 264), np.uint8)
    saved = [_u8(a).copy() for a in (cache, scale, packed)]
    bad = np.where(SLOTS == 11, 12, SLOTS).astype(np.int32)
    cases = [
        (lambda: ops.indexer_compress_epilog(cache, scale, x, bad), IndexRangeError, "slot_mapping"),
        (lambda: ops.indexer_compress_epilog(cache, scale, x, SLOTS.astype(np.int64)), DTypeError, "slot_mapping"),
        (lambda: ops.indexer_compress_epilog(cache, scale, x, SLOTS, quant_mode=0), DTypeError,
         "indexer_compress_scale"),
        (lambda: ops.indexer_compress_epilog(cache, scale, x, SLOTS, quant_mode=2), ModeError, "quant_mode"),
        (lambda: ops.indexer_compress_epilog(cache, scale, x, SLOTS, scale=2.0), ModeError, "scale"),
        (lambda: ops.indexer_compress_epilog(cache, scale[:, :1], x, SLOTS), ShapeError, "indexer_compress_scale"),
        (lambda: ops.indexer_compress_epilog(cache, scale, x.astype(np.float32), SLOTS), DTypeError, "x"),
        (lambda: ops.indexer_compress_epilog(cache, scale, np.where(np.arange(256) == 5, np.inf, x.astype(np.float32))
                                             .astype(np.float16), SLOTS), NonFiniteInputError, r"x\[0, 5\]"),
        (lambda: ops.indexer_compress_epilog_v2(packed, x, bad), IndexRangeError, "slot_mapping"),
        (lambda: ops.indexer_compress_epilog_v2(packed, x, SLOTS, layout=1), ModeError, "layout"),
        (lambda: ops.indexer_compress_epilog_v2(packed.reshape(3, 4, 264), x, SLOTS), ShapeError,
         "indexer_compress_cache"),
        (lambda: ops.indexer_compress_epilog_v2(packed.reshape(-1)[:3 * 4 * 250].reshape(3, 4, 1, 250), x, SLOTS),
         ShapeError, "row_bytes"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()
        for a, b in zip((cache, scale, packed), saved, strict=True):
            np.testing.assert_array_equal(_u8(a), b)


@pytest.mark.parametrize("soc", ["Ascend910B2", "Ascend910_9391"])
def test_950_writers_rejected_on_a2_a3_before_any_write(monkeypatch, soc):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    cache, x, slots = _kv_case()
    icache, iscale = _noise((12, 128), FP8["float8_e4m3fn"]), _noise((12, 1), np.float32)
    packed = _noise((3, 4, 1, 132), np.uint8)
    saved = [_u8(a).copy() for a in (cache, icache, iscale, packed)]
    for op, call in (("kv_compress_epilog", lambda: ops.kv_compress_epilog(cache, x, slots)),
                     ("indexer_compress_epilog", lambda: ops.indexer_compress_epilog(icache, iscale, x[:, :128], slots)),
                     ("indexer_compress_epilog_v2", lambda: ops.indexer_compress_epilog_v2(packed, x[:, :128], slots))):
        with pytest.raises(ModeError, match=rf"{op}: .*{soc}.*ASCEND_EMU_SOC_NAME=Ascend950"):
            call()
    for a, b in zip((cache, icache, iscale, packed), saved, strict=True):
        np.testing.assert_array_equal(_u8(a), b)


# ------------------------------------------------------------------------ through torch (both namespaces)
def _torch():
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu  # noqa: F401  (registers the namespaces)
    return torch


def test_namespaces_registered():
    _torch()
    from ascend_emu.torch_npu import namespaces

    report = namespaces.report()
    for key in ("_C_ascend::kv_compress_epilog", "_C_ascend::indexer_compress_epilog_v2",
                "custom::kv_compress_epilog", "custom::indexer_compress_epilog"):
        assert report[key] == "registered", key


def test_kv_compress_epilog_as_vllm_ascend_and_the_recipes_call_it(a950):
    torch = _torch()
    x = _x(14, SLOTS.size, 512)
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    start = _noise((12, 640), np.uint8)
    want = ref.kv_layout1(start, x, SLOTS)
    swa = torch.from_numpy(start.copy()).view(torch.float8_e4m3fn).reshape(12, 1, 1, 640)
    # vllm-ascend's A5 dsa_kv_compress_scatter: cache.view(-1, 1, D'), keywords, layout 1
    torch.ops._C_ascend.kv_compress_epilog(kv_compress_cache=swa.view(-1, 1, swa.shape[-1]), x=xt,
                                           slot_mapping=torch.from_numpy(SLOTS), quant_group_size=64, quant_mode=2,
                                           round_scale_flag=True, layout=1)
    np.testing.assert_array_equal(swa.view(torch.uint8).reshape(12, 640).numpy(), want)
    # the recipes' golden: a 2-D cache, keyword-only ints
    c2 = torch.from_numpy(start.copy()).view(torch.float8_e4m3fn)
    torch.ops.custom.kv_compress_epilog(c2, xt, torch.from_numpy(SLOTS.astype(np.int64)), quant_group_size=64,
                                        quant_mode=2, round_scale_flag=True)
    np.testing.assert_array_equal(c2.view(torch.uint8).numpy(), want)
    with pytest.raises(Exception, match="positional"):  # custom's ints are keyword-only
        torch.ops.custom.kv_compress_epilog(c2, xt, torch.from_numpy(SLOTS), 64)
    before = c2.clone()
    with pytest.raises(ModeError, match="quant_group_size"):  # the recipes' kernel groups by 64 only
        torch.ops.custom.kv_compress_epilog(c2, xt, torch.from_numpy(SLOTS), quant_group_size=128)
    assert torch.equal(c2.view(torch.uint8), before.view(torch.uint8))
    # HiF8 (quant_mode 3, with scale) is the custom binding's only
    h = torch.zeros(12, 512, dtype=torch.uint8)
    torch.ops.custom.kv_compress_epilog(h, xt, torch.from_numpy(SLOTS), quant_group_size=128, quant_mode=3, scale=0.5)
    np.testing.assert_array_equal(h.numpy(), ref.kv_layout1(np.zeros((12, 512), np.uint8), x, SLOTS, quant_mode=3,
                                                              scale=0.5))
    before = h.clone()
    with pytest.raises(ModeError, match="quant_mode"):
        torch.ops._C_ascend.kv_compress_epilog(h, xt, torch.from_numpy(SLOTS), 128, 3, True, 1)
    assert torch.equal(h, before)


def test_indexer_writers_through_torch(a950):
    torch = _torch()
    x = _x(15, SLOTS.size, 128)
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    start = _noise((3, 4, 1, 132), np.uint8)
    full = torch.from_numpy(start.copy())
    torch.ops._C_ascend.indexer_compress_epilog_v2(indexer_compress_cache=full.view(torch.uint8), x=xt,
                                                   slot_mapping=torch.from_numpy(SLOTS), layout=2)
    np.testing.assert_array_equal(full.numpy().reshape(-1), ref.indexer_v2(start.reshape(-1), x, SLOTS, block_size=4,
                                                                            row_bytes=132))
    cache, scale = torch.zeros(12, 128, dtype=torch.float8_e4m3fn), torch.zeros(12, 1)
    torch.ops.custom.indexer_compress_epilog(cache, scale, xt, torch.from_numpy(SLOTS), quant_mode=1,
                                             round_scale=True)
    want_c, want_s = ref.indexer_v1(np.zeros((12, 128), np.uint8), np.zeros((12, 4), np.uint8), x, SLOTS)
    np.testing.assert_array_equal(cache.view(torch.uint8).numpy(), want_c)
    np.testing.assert_array_equal(scale.numpy().view(np.uint8), want_s)
    # quant_mode 0: E8M0 scales in a torch.float8_e8m0fnu tensor
    mx = torch.zeros(12, 1, dtype=torch.float8_e8m0fnu)
    torch.ops.custom.indexer_compress_epilog(cache, mx, xt, torch.from_numpy(SLOTS), quant_mode=0, round_scale=True)
    want_c, want_s = ref.indexer_v1(np.zeros((12, 128), np.uint8), np.zeros((12, 1), np.uint8), x, SLOTS, quant_mode=0)
    np.testing.assert_array_equal(cache.view(torch.uint8).numpy(), want_c)
    np.testing.assert_array_equal(mx.view(torch.uint8).numpy(), want_s)


def test_fake_kernels_write_nothing():
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        c = mode.from_tensor(torch.zeros(12, 1, 640, dtype=torch.float8_e4m3fn))
        x = mode.from_tensor(torch.zeros(9, 512, dtype=torch.bfloat16))
        s = mode.from_tensor(torch.zeros(9, dtype=torch.int32))
        assert torch.ops._C_ascend.kv_compress_epilog(c, x, s, 64, 2, True, 1) is None
        assert torch.ops.custom.kv_compress_epilog(c, x, s) is None
        p = mode.from_tensor(torch.zeros(3, 4, 1, 132, dtype=torch.uint8))
        assert torch.ops._C_ascend.indexer_compress_epilog_v2(p, x[:, :128], s) is None


def test_checked_mode_marks_written_slots_and_rejects_duplicates(a950):
    from ascend_emu import checked_mode
    from ascend_emu.errors import DuplicateSlotError

    cache, x, slots = _kv_case()
    with checked_mode.checked():
        ops.kv_compress_epilog(cache, x, slots)
        written = checked_mode.written_slots(cache)
        assert written is not None
        np.testing.assert_array_equal(np.flatnonzero(written), np.sort(SLOTS[SLOTS >= 0]))
        before = _u8(cache).copy()
        with pytest.raises(DuplicateSlotError):
            ops.kv_compress_epilog(cache, x, np.where(SLOTS == 11, 5, SLOTS).astype(np.int32))
        np.testing.assert_array_equal(_u8(cache), before)


def test_numba_hifloat8_rows_match_the_codec():
    """quant_mode 3's compiled HiF8 pass (a table of codes looked up by the upper 12 magnitude bits
    of the fp32 product) against quant.hifloat8.to_hif8 of ``fl32(x * scale)``:
    every bf16 x (NaN, Inf, both signs) times scales that fill the product's low bits, and every
    rounding boundary of HiF8 times 1 and its two fp32 neighbours."""
    from ascend_emu.emu.kv_compress_epilog import HIF8_INDEX_SHIFT, hif8_codes, hif8_rows
    from ascend_emu.quant.hifloat8 import _MIDPOINTS, to_hif8

    def run(x, scale):
        xbits = np.ascontiguousarray(x.astype(BF16)).view(np.uint16).reshape(1, -1)
        dst = np.zeros(xbits.size, np.uint8)
        hif8_rows(dst, xbits, np.zeros(1, np.int64), np.zeros(1, np.int64), xbits.size, np.float32(scale), hif8_codes())
        return dst

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16)
    mids = _MIDPOINTS.astype(np.float32)  # the table's premise: no boundary below its index bits
    assert np.array_equal(mids.astype(np.float64), _MIDPOINTS)
    assert not (mids.view(np.uint32) & np.uint32((1 << HIF8_INDEX_SHIFT) - 1)).any()
    mids = mids.astype(BF16)
    for x, scales in ((every, (1.0, 0.5, 1.0000001, 3.1415927, 1e-3, 7.7e4)),
                      (np.concatenate([mids, -mids]), (1.0, np.nextafter(np.float32(1), np.float32(2)),
                                                       np.nextafter(np.float32(1), np.float32(0))))):
        for scale in scales:
            with np.errstate(over="ignore", invalid="ignore"):
                want = to_hif8(x.astype(np.float32) * np.float32(scale))
            np.testing.assert_array_equal(run(x, scale), want, err_msg=f"scale {scale}")


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_numba_fp8_encoder_matches_the_codec(name):
    """The writers' compiled fp8 rounding against quant.fp8.to_fp8 (ml_dtypes): every bf16 value,
    random fp32 bit patterns, and every midpoint between neighbouring fp8 values (the ties)."""
    from ascend_emu.emu.kv_compress_epilog import FP8_FORMATS, f32_to_fp8_bits
    from ascend_emu.quant.fp8 import to_fp8
    from numba import njit

    @njit(cache=False)
    def encode(v, mant, bias, top, over):
        out = np.empty(v.shape[0], np.uint8)
        for i in range(v.shape[0]):
            out[i] = f32_to_fp8_bits(v[i], mant, bias, top, over)
        return out

    bf16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    rand = np.random.default_rng(3).integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    grid = np.arange(256, dtype=np.uint8).view(FP8[name]).astype(np.float32)
    grid = np.unique(np.abs(grid[np.isfinite(grid)]))
    mids = (grid[:-1] + grid[1:]) / 2
    v = np.concatenate([bf16, rand, mids, -mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)]).astype(np.float32)
    v = v[np.isfinite(v)]
    np.testing.assert_array_equal(encode(v, *FP8_FORMATS[name]), to_fp8(v, name).view(np.uint8))
