"""npu_scatter_pa_kv_cache / npu_gather_pa_kv_cache against the loop references in
tests/reference/paged_cache.py: Norm and PA_NZ (4-D and vllm-ascend's 5-D view), fp16 / bf16 /
int8, k and v head sizes that differ, -1 slots, seq_offset and cumulative seq_lens, the torch_npu
drop-in with its ``_functional`` variants, and rejected calls that leave every array untouched."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, DuplicateSlotWarning, FormatError, IndexRangeError, ModeError, ShapeError
from ascend_emu.layouts import NZArray
from tests.helpers import assert_same_bytes, poisoned
from tests.reference import paged_cache as ref

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "int8": np.int8}
C0 = {"float16": 16, "bfloat16": 16, "int8": 32}


def _data(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    return rng.standard_normal(shape).astype(DTYPES[dtype])


def _caches(mode, dtype, nb, bs, n, dk, dv):
    c0 = C0[dtype]
    if mode == "Norm":
        shapes = (nb, bs, n, dk), (nb, bs, n, dv)
    else:
        shapes = (nb, n * dk // c0, bs, c0), (nb, n * dv // c0, bs, c0)
    return tuple(poisoned(s, DTYPES[dtype]) for s in shapes)


def _scatter_case(rng, mode, dtype, t=7, n=2, dk=64, dv=32, nb=3, bs=16, index="int32"):
    key, value = _data(rng, (t, n, dk), dtype), _data(rng, (t, n, dv), dtype)
    kc, vc = _caches(mode, dtype, nb, bs, n, dk, dv)
    slots = rng.choice(nb * bs, t, replace=False).astype(index)
    slots[1] = -1
    return key, value, kc, vc, slots


# ------------------------------------------------------------------------------------ scatter
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", ["Norm", "PA_NZ"])
@pytest.mark.parametrize("index", ["int32", "int64"])
def test_scatter_matches_reference(rng, mode, dtype, index):
    key, value, kc, vc, slots = _scatter_case(rng, mode, dtype, index=index)
    want_k, want_v = ref.scatter(key, value, kc, vc, slots, mode)
    # returns None, as torch_npu's does (in place)
    assert ops.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode=mode) is None  # type: ignore[func-returns-value]
    assert_same_bytes(kc, want_k, "key_cache")
    assert_same_bytes(vc, want_v, "value_cache")


def test_scatter_default_mode_is_pa_nz_and_none_is_norm(rng):
    key, value, kc, vc, slots = _scatter_case(rng, "PA_NZ", "float16")
    want = ref.scatter(key, value, kc, vc, slots, "PA_NZ")
    ops.npu_scatter_pa_kv_cache(key, value, kc, vc, slots)
    assert_same_bytes(kc, want[0], "key_cache")
    assert_same_bytes(vc, want[1], "value_cache")
    key, value, kc, vc, slots = _scatter_case(rng, "Norm", "bfloat16")
    want = ref.scatter(key, value, kc, vc, slots, "Norm")
    ops.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode=None)
    assert_same_bytes(kc, want[0], "key_cache")
    assert_same_bytes(vc, want[1], "value_cache")


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_scatter_pa_nz_5d_view_and_nz_cast_caches(rng, dtype):
    """vllm-ascend's ``_nz_5d_view`` ``[nb, N, D/C0, bs, C0]`` and FRACTAL_NZ-cast caches hold the
    4-D cache's bytes."""
    key, value, kc, vc, slots = _scatter_case(rng, "PA_NZ", dtype, n=2, dk=64, dv=64)
    want_k, want_v = ref.scatter(key, value, kc, vc, slots, "PA_NZ")
    c0 = C0[dtype]
    kc5, vc5 = (c.reshape(3, 2, 64 // c0, 16, c0) for c in (kc.copy(), vc.copy()))
    ops.npu_scatter_pa_kv_cache(key, value, kc5, vc5, slots)
    assert_same_bytes(kc5, want_k, "5-D key_cache")
    assert_same_bytes(vc5, want_v, "5-D value_cache")
    kcn, vcn = kc.copy().view(NZArray), vc.copy().view(NZArray)
    ops.npu_scatter_pa_kv_cache(key, value, kcn, vcn, slots)
    assert_same_bytes(kcn, want_k, "NZ key_cache")
    assert_same_bytes(vcn, want_v, "NZ value_cache")


def test_scatter_duplicate_slots_warn_and_last_token_wins(rng):
    key, value, kc, vc, slots = _scatter_case(rng, "Norm", "float16")
    slots[5] = slots[2]
    want_k, want_v = ref.scatter(key, value, kc, vc, slots, "Norm")
    with pytest.warns(DuplicateSlotWarning, match="slot_mapping"):
        ops.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode="Norm")
    assert_same_bytes(kc, want_k, "key_cache")
    assert_same_bytes(vc, want_v, "value_cache")


def _reject(call, arrays, err, match):
    before = [a.copy() for a in arrays]
    with pytest.raises(err, match=match):
        call()
    for a, b in zip(arrays, before, strict=True):
        assert_same_bytes(a, b, "array of a rejected call")


@pytest.mark.parametrize("bad, err, match", [
    (48, IndexRangeError, r"slot_mapping\[3\] = 48"),
    (-2, IndexRangeError, r"slot_mapping\[3\] = -2"),
])
@pytest.mark.parametrize("mode", ["Norm", "PA_NZ"])
def test_scatter_rejects_slots_before_writing(rng, mode, bad, err, match):
    key, value, kc, vc, slots = _scatter_case(rng, mode, "float16")
    slots[3] = bad
    _reject(lambda: ops.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode=mode), (kc, vc), err, match)


def _scatter_variants(rng):
    key, value, kc, vc, slots = _scatter_case(rng, "PA_NZ", "float16")
    nkc, nvc = _caches("Norm", "float16", 3, 16, 2, 64, 32)
    return [
        ({"cache_mode": "PA_BSND"}, ModeError, "cache_mode"),
        ({"seq_lens": np.array([7], np.int32)}, ModeError, "seq_lens"),
        ({"compress_lens": np.zeros(7, np.int32)}, ModeError, "compress_lens"),
        ({"compress_seq_offsets": np.zeros(7, np.int32)}, ModeError, "compress_seq_offsets"),
        ({"key": key.reshape(7, 1, 2, 64)}, ShapeError, "key"),
        ({"value": value[:6]}, ShapeError, "value"),
        ({"value": value.astype(np.float32)}, DTypeError, "value"),
        ({"slot_mapping": slots.astype(np.int16)}, DTypeError, "slot_mapping"),
        ({"slot_mapping": slots[:6]}, ShapeError, "slot_mapping"),
        ({"key_cache": kc.reshape(3, 4, 32, 16)}, ShapeError, "key_cache"),
        ({"value_cache": vc[:2]}, ShapeError, "value_cache"),
        ({"key": key.astype(np.float32), "value": value.astype(np.float32), "key_cache": kc.astype(np.float32),
          "value_cache": vc.astype(np.float32)}, DTypeError, "key"),
        ({"key_cache": nkc.view(NZArray), "value_cache": nvc, "cache_mode": "Norm"}, FormatError, "key_cache"),
        ({"key_cache": kc[..., ::-1]}, ShapeError, "key_cache"),
        ({"key": key[:, :, ::-1]}, ShapeError, "key"),
        ({"value_cache": kc}, ShapeError, "value_cache"),
        ({"key": kc.reshape(-1)[: key.size].reshape(key.shape)}, ShapeError, "key"),
    ], (key, value, kc, vc, slots)


def test_scatter_rejects_bad_arguments(rng):
    cases, (key, value, kc, vc, slots) = _scatter_variants(rng)
    base = dict(key=key, value=value, key_cache=kc, value_cache=vc, slot_mapping=slots)
    for change, err, match in cases:
        kw = dict(base, **change)
        arrays = [a for a in (kw["key_cache"], kw["value_cache"]) if a.flags.writeable]
        _reject(lambda kw=kw: ops.npu_scatter_pa_kv_cache(**kw), arrays, err, match)


@pytest.mark.parametrize("bs", [8, 24, 65536])
def test_scatter_pa_nz_block_size_is_whole_fractals(rng, bs):
    key, value = _data(rng, (2, 1, 32), "float16"), _data(rng, (2, 1, 32), "float16")
    kc, vc = _caches("PA_NZ", "float16", 2, bs, 1, 32, 32)
    _reject(lambda: ops.npu_scatter_pa_kv_cache(key, value, kc, vc, np.array([0, 1], np.int32)), (kc, vc),
            ShapeError, "block_size")


# ------------------------------------------------------------------------------------ gather
def _gather_case(rng, mode, dtype, lens=(5, 0, 19), nb=4, bs=16, n=2, dk=64, dv=32, offsets=True, cumsum=False):
    kc, vc = (_data(rng, c.shape, dtype) for c in _caches(mode, dtype, nb, bs, n, dk, dv))
    b = len(lens)
    seq_offset = (rng.integers(0, 2, b) * bs + rng.integers(0, bs, b)).astype(np.int32) if offsets else None
    table = rng.integers(0, nb, (b, 3)).astype(np.int32)
    seq_lens = np.array(np.cumsum((0,) + tuple(lens)) if cumsum else lens, np.int32)
    t = sum(lens)
    return kc, vc, table, seq_lens, (t, n, dk), (t, n, dv), seq_offset


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", ["Norm", "PA_NZ"])
@pytest.mark.parametrize("offsets, cumsum", [(False, False), (True, False), (True, True)])
def test_gather_matches_reference(rng, mode, dtype, offsets, cumsum):
    kc, vc, table, seq_lens, ks, vs, seq_offset = _gather_case(rng, mode, dtype, offsets=offsets, cumsum=cumsum)
    want_k, want_v = ref.gather(kc, vc, table, seq_lens, ks, vs, seq_offset, cumsum, mode)
    key, value = poisoned(ks, kc.dtype), poisoned(vs, vc.dtype)
    if mode == "PA_NZ":
        kc = kc.view(NZArray)
        key = key.reshape(ks[0], -1)  # the aclnn doc's [T, N*D]
    # returns None, as torch_npu's does (writes key and value)
    assert ops.npu_gather_pa_kv_cache(kc, vc, table, seq_lens, key, value, seq_offset=seq_offset,  # type: ignore[func-returns-value]
                                      is_seq_lens_cumsum=cumsum) is None
    assert_same_bytes(key, want_k, "key")
    assert_same_bytes(value, want_v, "value")


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_scatter_then_gather_round_trip(rng, dtype):
    n, dk, dv, nb, bs = 1, 64, 32, 4, 16
    table = np.array([[2, 0], [3, 1]], np.int32)
    lens = (20, 9)
    slots = np.array([table[0, j // bs] * bs + j % bs for j in range(lens[0])]
                     + [table[1, j // bs] * bs + j % bs for j in range(lens[1])], np.int64)
    key, value = _data(rng, (29, n, dk), dtype), _data(rng, (29, n, dv), dtype)
    for mode in ("Norm", "PA_NZ"):
        kc, vc = _caches(mode, dtype, nb, bs, n, dk, dv)
        ops.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode=mode)
        ko, vo = np.zeros_like(key), np.zeros_like(value)
        ops.npu_gather_pa_kv_cache(kc.view(NZArray) if mode == "PA_NZ" else kc, vc, table,
                                   np.array(lens, np.int32), ko, vo)
        assert_same_bytes(ko, key, f"{mode} key round trip")
        assert_same_bytes(vo, value, f"{mode} value round trip")


def test_gather_rejects_before_writing(rng):
    kc, vc, table, seq_lens, ks, vs, seq_offset = _gather_case(rng, "Norm", "float16")
    key, value = poisoned(ks, kc.dtype), poisoned(vs, vc.dtype)
    base = dict(key_cache=kc, value_cache=vc, block_tables=table, seq_lens=seq_lens, key=key, value=value,
                seq_offset=seq_offset)
    bad_table = table.copy()
    col = int(seq_offset[2]) // 16 + 1  # batch 2's second block (19 tokens)
    bad_table[2, col] = 4
    unused = table.copy()
    unused[1, :] = -7  # batch 1 reads nothing: its row is not checked
    cases = [
        ({"block_tables": bad_table}, IndexRangeError, rf"block_tables\[2, {col}\] = 4"),
        ({"seq_lens": np.array([5, 0, 49], np.int32), "key": poisoned((54, 2, 64), kc.dtype),
          "value": poisoned((54, 2, 32), kc.dtype)}, ShapeError, r"seq_lens\[2\]"),
        ({"seq_lens": np.array([5, -1, 19], np.int32)}, ShapeError, r"seq_lens\[1\]"),
        ({"seq_lens": seq_lens, "is_seq_lens_cumsum": True}, ShapeError, "seq_lens"),
        ({"seq_lens": seq_lens.astype(np.int64)}, DTypeError, "seq_lens"),
        ({"block_tables": table.astype(np.int64)}, DTypeError, "block_tables"),
        ({"seq_offset": np.array([0, -16, 0], np.int32)}, ShapeError, r"seq_offset\[1\]"),
        ({"seq_offset": seq_offset[:2]}, ShapeError, "seq_offset"),
        ({"key": poisoned((23, 2, 64), kc.dtype)}, ShapeError, "key"),
        ({"value": poisoned((24, 2, 64), kc.dtype)}, ShapeError, "value"),
        ({"value": poisoned(vs, np.float32)}, DTypeError, "value"),
        ({"value_cache": vc.view(NZArray)}, FormatError, "value_cache"),
        ({"value_cache": vc[:3]}, ShapeError, "value_cache"),
        ({"key": kc.reshape(-1)[: key.size].reshape(ks)}, ShapeError, "key_cache"),
        ({"is_seq_lens_cumsum": 1}, ModeError, "is_seq_lens_cumsum"),
    ]
    for change, err, match in cases:
        kw = dict(base, **change)
        _reject(lambda kw=kw: ops.npu_gather_pa_kv_cache(**kw), (kw["key"], kw["value"]), err, match)
    ok = dict(base, block_tables=unused)
    ops.npu_gather_pa_kv_cache(**ok)  # padding rows the tokens do not read are not validated


# ------------------------------------------------------------------------------------ drop-in
def test_drop_in_and_functional_variants(rng):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu import to_numpy, to_torch

    key, value, kc, vc, slots = _scatter_case(rng, "PA_NZ", "bfloat16")
    want_k, want_v = ref.scatter(key, value, kc, vc, slots, "PA_NZ")
    tk, tv = to_torch(key), to_torch(value)
    tkc, tvc = (torch_npu.npu_format_cast(to_torch(c.copy()), 29) for c in (kc, vc))
    out_k, out_v = torch_npu.npu_scatter_pa_kv_cache_functional(tk, tv, tkc, tvc, to_torch(slots))
    assert_same_bytes(to_numpy(tkc), kc, "functional: key_cache untouched")
    assert_same_bytes(to_numpy(out_k), want_k, "functional: key_cache copy")
    assert_same_bytes(to_numpy(out_v), want_v, "functional: value_cache copy")
    assert torch_npu.npu_scatter_pa_kv_cache(tk, tv, tkc, tvc, to_torch(slots)) is None
    assert_same_bytes(to_numpy(tkc), want_k, "in place: key_cache")
    assert_same_bytes(to_numpy(tvc), want_v, "in place: value_cache")

    table = torch.tensor([[0, 2], [1, 0]], dtype=torch.int32)
    lens = torch.tensor([0, 3, 20], dtype=torch.int32)
    want_gk, want_gv = ref.gather(want_k, want_v, table.numpy(), lens.numpy(), (20, 2, 64), (20, 2, 32), None,
                                  True, "PA_NZ")
    gk, gv = torch.zeros(20, 2, 64, dtype=torch.bfloat16), torch.zeros(20, 2, 32, dtype=torch.bfloat16)
    fk, fv = torch_npu.npu_gather_pa_kv_cache_functional(tkc, tvc, table, lens, gk, gv, is_seq_lens_cumsum=True)
    assert not gk.any() and not gv.any()
    assert_same_bytes(to_numpy(fk), want_gk, "functional: key")
    assert_same_bytes(to_numpy(fv), want_gv, "functional: value")
    torch_npu.npu_gather_pa_kv_cache(tkc, tvc, table, lens, gk, gv, is_seq_lens_cumsum=True)
    assert_same_bytes(to_numpy(gk), want_gk, "in place: key")
    assert_same_bytes(to_numpy(gv), want_gv, "in place: value")

    meta = torch.ops.npu.npu_scatter_pa_kv_cache_functional(
        *(torch.empty(s, dtype=torch.float16, device="meta") for s in ((3, 1, 32), (3, 1, 16), (2, 2, 16, 16),
                                                                          (2, 1, 16, 16))),
        torch.empty(3, dtype=torch.int32, device="meta"))
    assert [tuple(m.shape) for m in meta] == [(2, 2, 16, 16), (2, 1, 16, 16)]
    meta = torch.ops.npu.npu_gather_pa_kv_cache_functional(
        *(torch.empty(s, dtype=torch.float16, device="meta") for s in ((2, 16, 1, 32), (2, 16, 1, 16))),
        *(torch.empty(s, dtype=torch.int32, device="meta") for s in ((2, 1), (2,))),
        *(torch.empty(s, dtype=torch.float16, device="meta") for s in ((5, 1, 32), (5, 1, 16))))
    assert [tuple(m.shape) for m in meta] == [(5, 1, 32), (5, 1, 16)]
    before = to_numpy(tkc).copy()
    with pytest.raises(IndexRangeError, match="slot_mapping"):
        torch_npu.npu_scatter_pa_kv_cache_functional(tk, tv, tkc, tvc, to_torch(np.full(7, 48, np.int32)))
    assert_same_bytes(to_numpy(tkc), before)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch_npu.npu_scatter_pa_kv_cache(tk, tv, tkc, tvc, to_torch(slots))
