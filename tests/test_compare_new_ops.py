"""compare / record / replay / inspect on npu_scatter_pa_kv_cache / npu_gather_pa_kv_cache (and
their _functional forms), npu_dynamic_quant, npu_interleave_rope and npu_rotary_mul: drop-in
calls recorded and replayed identical, a corrupted device result caught at its logical place,
msprobe dumps replayed, scatter-written caches inspected where the references put the bytes."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import compare, inspect, ops
from ascend_emu.compare.calls import cache_mode_of
from tests.reference import dynamic_quant as ref_dq
from tests.reference import paged_cache as ref_pc
from tests.reference import rope as ref_rope

BF16 = ml_dtypes.bfloat16
SLOTS = [3, -1, 20]  # token 1 skipped (vLLM's pad slot)
N, DK, DV, NB, BS = 2, 32, 16, 2, 16


def _bf16(torch, rng, shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)


def _np(t):
    from ascend_emu.compare.record import to_host

    return to_host(t)


def _cache_shapes(mode, five_d=False):
    if mode == "Norm":
        return (NB, BS, N, DK), (NB, BS, N, DV)
    if five_d:
        return (NB, N, DK // 16, BS, 16), (NB, N, DV // 16, BS, 16)
    return (NB, N * DK // 16, BS, 16), (NB, N * DV // 16, BS, 16)


def _as4(a, mode):
    """The reference's 4-D cache shape (a 5-D PA_NZ view holds the same bytes)."""
    return a if mode == "Norm" or a.ndim == 4 else a.reshape(a.shape[0], -1, *a.shape[3:])


def _record(fn):
    """Run ``fn(tnpu)`` with every emulated op of the drop-in recorded; the calls, through the
    record format and back."""
    import ascend_emu.torch_npu as tnpu
    from ascend_emu.compare.record import Recorder

    calls = []
    with Recorder(tnpu, calls.append):
        fn(tnpu)
    return calls


def _round_trip(calls, path):
    w = compare.RecordWriter(path)
    for c in calls:
        w(c)
    w.close()
    return compare.read_record(path)


# ----------------------------------------------------------------------------- scatter
SCATTER_CASES = [("Norm", False, False), ("PA_NZ", False, False), ("PA_NZ", True, False), ("Norm", False, True),
                 ("PA_NZ", True, True)]


@pytest.mark.parametrize("mode,five_d,functional", SCATTER_CASES,
                         ids=["norm", "pa_nz", "pa_nz_5d", "norm_functional", "pa_nz_5d_functional"])
def test_scatter_recorded_replays_identical_and_a_corrupt_byte_fails_at_its_slot(mode, five_d, functional, tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    key, value = _bf16(torch, rng, (3, N, DK)), _bf16(torch, rng, (3, N, DV))
    ks, vs = _cache_shapes(mode, five_d)
    kc, vc = _bf16(torch, rng, ks), _bf16(torch, rng, vs)  # old contents: kept outside the written slots
    before = (_np(kc), _np(vc))
    sm = torch.tensor(SLOTS, dtype=torch.int32)
    name = "npu_scatter_pa_kv_cache" + ("_functional" if functional else "")
    got = []
    (call,) = _record(lambda t: got.append(getattr(t, name)(key, value, kc, vc, sm, cache_mode=mode)))
    want = ref_pc.scatter(_np(key), _np(value), _as4(before[0], mode), _as4(before[1], mode), SLOTS, mode)
    device = [_np(x) for x in got[0]] if functional else [_np(kc), _np(vc)]
    for d, w in zip(device, want, strict=True):
        assert d.view(np.uint16).reshape(-1).tolist() == w.view(np.uint16).reshape(-1).tolist()
    (call,) = _round_trip([call], tmp_path / "rec")
    assert cache_mode_of(call) == {"Norm": "PA_BSND", "PA_NZ": "PA_NZ"}[mode]
    rep = compare.compare_call(call)
    assert rep.status == "identical", rep.to_dict()
    assert [(t.name, t.role, t.mismatched) for t in rep.tensors] == [("key_cache", "cache", 0),
                                                                     ("value_cache", "cache", 0)]

    # one element of token 2's value row (slot 20 = block 1, row 4) one bf16 ulp up on the device
    dev = call.outputs[1].array if functional else call.after["value_cache"]
    dev = np.array(dev, copy=True)
    at = {"Norm": (1, 4, 0, 5), "PA_NZ": (1, 0, 0, 4, 5) if five_d else (1, 0, 4, 5)}[mode]  # head 0, d 5
    dev.view(np.uint16)[at] += 1
    if functional:
        call.outputs[1] = compare.TensorValue(dev)
    else:
        call.after["value_cache"] = dev
    rep = compare.compare_call(call)
    bad = {t.name: t for t in rep.tensors}["value_cache"]
    assert rep.status == "fail" and bad.status == "fail"
    assert [(m["block"], m["row"], m["slot"], m["head"], m["elements"], m["expected_slot"])
            for m in bad.mismatches] == [(1, 4, 20, 0, [5], True if functional else None)]


def test_scatter_functional_copy_is_judged_outside_the_written_slots_too():
    """The _functional form returns clones of the caches (op-plugin ScatterPaKvCacheNpuOpApi.cpp:
    ``key_cache.clone`` then the scatter): rows it does not write hold the input's bytes, so a
    change there fails (listed as outside the expected slots)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    key, value = _bf16(torch, rng, (3, N, DK)), _bf16(torch, rng, (3, N, DV))
    kc, vc = (torch.zeros(s, dtype=torch.bfloat16) for s in _cache_shapes("Norm"))
    (call,) = _record(lambda t: t.npu_scatter_pa_kv_cache_functional(key, value, kc, vc,
                                                                     torch.tensor(SLOTS, dtype=torch.int32),
                                                                     cache_mode=None))
    assert cache_mode_of(call) == "PA_BSND"  # None is Norm, not the schema default PA_NZ
    dev = np.array(call.outputs[0].array, copy=True)
    dev[0, 0, 1, 7] = 1  # slot 0, never written
    call.outputs[0] = compare.TensorValue(dev)
    rep = compare.compare_call(call)
    bad = {t.name: t for t in rep.tensors}["key_cache"]
    assert rep.status == "fail" and bad.status == "fail"
    assert [(m["slot"], m["head"], m["elements"], m["expected_slot"]) for m in bad.mismatches] == [(0, 1, [7], False)]


# ----------------------------------------------------------------------------- gather
@pytest.mark.parametrize("functional", [False, True], ids=["inplace", "functional"])
def test_gather_recorded_replays_identical_and_exactly(functional, tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    kc, vc = (_bf16(torch, rng, s) for s in _cache_shapes("Norm"))
    bt = torch.tensor([[1, 0], [0, 1]], dtype=torch.int32)
    sl = torch.tensor([17, 3], dtype=torch.int32)
    k, v = torch.zeros(20, N, DK, dtype=torch.bfloat16), torch.zeros(20, N, DV, dtype=torch.bfloat16)
    name = "npu_gather_pa_kv_cache" + ("_functional" if functional else "")
    got = []
    (call,) = _record(lambda t: got.append(getattr(t, name)(kc, vc, bt, sl, k, v)))
    want = ref_pc.gather(_np(kc), _np(vc), bt.numpy(), sl.numpy(), (20, N, DK), (20, N, DV), None, False, "Norm")
    device = [_np(x) for x in got[0]] if functional else [_np(k), _np(v)]
    for d, w in zip(device, want, strict=True):
        assert d.view(np.uint16).tolist() == w.view(np.uint16).tolist()
    (call,) = _round_trip([call], tmp_path / "rec")
    rep = compare.compare_call(call)
    assert rep.status == "identical"
    assert [(t.name, t.criterion) for t in rep.tensors] == [("key", "exact (cache bytes, NaN-aware)"),
                                                            ("value", "exact (cache bytes, NaN-aware)")]
    # one ulp on one gathered element: within a bf16 output tolerance, still a failure (a copy)
    dev = np.array(call.outputs[0].array if functional else call.after["key"], copy=True)
    dev.view(np.uint16)[18, 1, 3] += 1
    if functional:
        call.outputs[0] = compare.TensorValue(dev)
    else:
        call.after["key"] = dev
    rep = compare.compare_call(call)
    bad = {t.name: t for t in rep.tensors}["key"]
    assert (rep.status, bad.status, bad.mismatches[0]["index"]) == ("fail", "fail", [18, 1, 3])


# ----------------------------------------------------------------------------- plain-output ops
def _plain_cases(torch, rng):
    x = _bf16(torch, rng, (4, 64))
    xr, c, s = _bf16(torch, rng, (2, 2, 1, 64)), _bf16(torch, rng, (2, 1, 1, 64)), _bf16(torch, rng, (2, 1, 1, 64))
    return {
        "npu_dynamic_quant": (lambda t: t.npu_dynamic_quant(x, dst_type=torch.int8),
                              lambda: ref_dq.dynamic_quant(_np(x)), ("y", "scale")),
        "npu_interleave_rope": (lambda t: t.npu_interleave_rope(xr, c, s),
                                lambda: (ref_rope.interleave_rope(_np(xr), _np(c), _np(s)),), ("y",)),
        "npu_rotary_mul": (lambda t: t.npu_rotary_mul(xr, c, s),
                           lambda: (ref_rope.rotary_mul(_np(xr), _np(c), _np(s), "half"),), ("y",)),
    }


@pytest.mark.parametrize("op", ["npu_dynamic_quant", "npu_interleave_rope", "npu_rotary_mul"])
def test_plain_output_ops_recorded_replay_identical_and_a_wrong_output_fails(op, tmp_path):
    torch = pytest.importorskip("torch")
    run, reference, names = _plain_cases(torch, np.random.default_rng(4))[op]
    (call,) = _round_trip(_record(run), tmp_path / "rec")
    assert call.op == op
    for out, want in zip(call.outputs, reference(), strict=True):
        assert np.array_equal(np.asarray(out.array).view(np.uint8), np.asarray(want).view(np.uint8))
    rep = compare.compare_call(call)
    assert rep.status == "identical" and [t.name for t in rep.tensors] == list(names)
    dev = np.array(call.outputs[0].array, copy=True)
    flat = dev.reshape(-1)
    flat[0] = flat[0] + 8 if dev.dtype == np.int8 else -flat[0] * 2 - 1
    call.outputs[0] = compare.TensorValue(dev)
    rep = compare.compare_call(call)
    assert rep.status == "fail" and rep.tensors[0].status == "fail" and rep.tensors[0].mismatches[0]["index"][-1] == 0


# ----------------------------------------------------------------------------- CLI on the stand-in
SCRIPT = """
import torch, torch_npu
g = torch.Generator().manual_seed(0)
bf = torch.bfloat16
key, value = torch.randn(3, 2, 32, generator=g).to(bf), torch.randn(3, 2, 16, generator=g).to(bf)
kc, vc = torch.zeros(2, 4, 16, 16, dtype=bf), torch.zeros(2, 2, 16, 16, dtype=bf)
torch_npu.npu_scatter_pa_kv_cache(key, value, kc, vc, torch.tensor([3, -1, 20], dtype=torch.int32))
kn, vn = torch.zeros(2, 16, 2, 32, dtype=bf), torch.zeros(2, 16, 2, 16, dtype=bf)
torch_npu.npu_scatter_pa_kv_cache(key, value, kn, vn, torch.tensor([5, 19, -1], dtype=torch.int32), cache_mode="Norm")
k, v = torch.zeros(4, 2, 32, dtype=bf), torch.zeros(4, 2, 16, dtype=bf)
torch_npu.npu_gather_pa_kv_cache(kn, vn, torch.tensor([[0, 1]], dtype=torch.int32),
                                 torch.tensor([4], dtype=torch.int32), k, v)
y, scale = torch_npu.npu_dynamic_quant(torch.randn(4, 64, generator=g).to(bf))
x, c = torch.randn(2, 2, 1, 64, generator=g).to(bf), torch.randn(2, 1, 1, 64, generator=g).to(bf)
torch_npu.npu_interleave_rope(x, c, c)
torch_npu.npu_rotary_mul(x, c, c)
"""


def test_record_then_replay_cli_on_the_standin(tmp_path, capsys):
    pytest.importorskip("torch")
    from ascend_emu.cli import main
    from tests.standin_torch_npu import standin

    script = tmp_path / "new_ops.py"
    script.write_text(SCRIPT)
    with standin():
        rc = main(["record", "-o", str(tmp_path / "rec"), str(script)])
    assert rc == 0, capsys.readouterr().err
    rc = main(["compare", "--replay", str(tmp_path / "rec"), "--json", str(tmp_path / "r.json")])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0, capsys.readouterr().out
    assert [c["op"] for c in rep["calls"]] == ["npu_scatter_pa_kv_cache", "npu_scatter_pa_kv_cache",
                                              "npu_gather_pa_kv_cache", "npu_dynamic_quant",
                                              "npu_interleave_rope", "npu_rotary_mul"]
    assert all(c["status"] == "identical" and c["tensors"] for c in rep["calls"]), rep["calls"]


# ----------------------------------------------------------------------------- msprobe dumps
def _dump(root, torch, entries):
    from tests.test_compare import _msprobe_dump

    return _msprobe_dump(root, torch, {k: (*v, ()) for k, v in entries.items()})


def test_msprobe_replay_scatter_and_dynamic_quant(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as tnpu
    from ascend_emu.cli import main

    rng = np.random.default_rng(5)
    key, value = _bf16(torch, rng, (3, N, DK)), _bf16(torch, rng, (3, N, DV))
    sm = torch.tensor(SLOTS, dtype=torch.int32)
    kc, vc = (_bf16(torch, rng, s) for s in _cache_shapes("PA_NZ", five_d=True))
    new_k, new_v = tnpu.npu_scatter_pa_kv_cache_functional(key, value, kc, vc, sm, cache_mode="PA_NZ")
    kn, vn = (torch.zeros(s, dtype=torch.bfloat16) for s in _cache_shapes("Norm"))
    inplace_before = [key, value, kn.clone(), vn.clone(), sm]
    tnpu.npu_scatter_pa_kv_cache(key, value, kn, vn, sm, cache_mode="Norm")
    x = _bf16(torch, rng, (4, 64))
    y, scale = tnpu.npu_dynamic_quant(x)
    bad_v = new_v.clone()
    bad_v.view(torch.int16)[1, 1, 0, 4, 3] += 1  # slot 20 (block 1, row 4), head 1, element 3, one ulp
    _dump(tmp_path / "dump", torch, {
        "NPU.npu_scatter_pa_kv_cache_functional.0.forward": ([key, value, kc, vc, sm], {"cache_mode": "PA_NZ"},
                                                              [new_k, new_v]),
        "NPU.npu_scatter_pa_kv_cache_functional.1.forward": ([key, value, kc, vc, sm], {"cache_mode": "PA_NZ"},
                                                              [new_k, bad_v]),
        "NPU.npu_scatter_pa_kv_cache.0.forward": (inplace_before, {"cache_mode": "Norm"}, []),
        "NPU.npu_dynamic_quant.0.forward": ([x], {}, [y, scale]),
    })
    rc = main(["replay", str(tmp_path / "dump"), "-o", str(tmp_path / "emu"), "-n", "1",
               "--json", str(tmp_path / "r.json")])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 1, capsys.readouterr().out
    good, bad, inplace, dq = rep["calls"]
    assert good["status"] == "identical" and [t["name"] for t in good["tensors"]] == ["key_cache", "value_cache"]
    assert bad["status"] == "fail"
    bad_t = {t["name"]: t for t in bad["tensors"]}["value_cache"]
    # the 5-D view [nb, N, Dv/C0, bs, C0] is one NZ row of N*Dv elements: head 1's element 3 is 16 + 3
    assert [(m["block"], m["row"], m["slot"], m["elements"]) for m in bad_t["mismatches"]] == [(1, 4, 20, [19])]
    assert inplace["status"] == "identical" and inplace["tensors"] == []  # the caches are not in the dump
    assert inplace["reason"].startswith("key_cache, value_cache: updated in place but not returned")
    assert dq["status"] == "identical" and [t["name"] for t in dq["tensors"]] == ["y", "scale"]
    emu = json.loads((tmp_path / "emu" / "step0" / "rank0" / "dump.json").read_text())
    out = emu["data"]["NPU.npu_scatter_pa_kv_cache_functional.0.forward"]["output"]
    assert [o["shape"] for o in out] == [list(new_k.shape), list(new_v.shape)]


# ----------------------------------------------------------------------------- inspect
@pytest.mark.parametrize("mode,five_d", [("Norm", False), ("PA_NZ", False), ("PA_NZ", True)],
                         ids=["norm", "pa_nz", "pa_nz_5d"])
def test_inspect_finds_each_scattered_token_where_the_reference_put_it(mode, five_d):
    rng = np.random.default_rng(6)
    key = rng.standard_normal((3, N, DK)).astype(BF16)
    value = rng.standard_normal((3, N, DV)).astype(BF16)
    ks, vs = _cache_shapes(mode, five_d)
    kc, vc = np.zeros(ks, BF16), np.zeros(vs, BF16)
    clean = inspect.Cache.from_array(kc.copy(), "PA_BSND" if mode == "Norm" else "PA_NZ")
    ops.npu_scatter_pa_kv_cache(key, value, kc, vc, np.array(SLOTS, np.int32), cache_mode=mode)
    want = ref_pc.scatter(key, value, _as4(np.zeros(ks, BF16), mode), _as4(np.zeros(vs, BF16), mode), SLOTS, mode)[0]
    cache = inspect.Cache.from_array(kc, "PA_BSND" if mode == "Norm" else "PA_NZ")
    assert (cache.layout.num_blocks, cache.layout.block_size) == (NB, BS)
    assert cache.layout.heads * cache.layout.dim == N * DK
    mem = want.reshape(-1).view(np.uint8)  # the reference cache's memory
    for t, slot in enumerate(SLOTS):
        if slot < 0:
            continue
        assert inspect.token_slot(cache, t, index=np.array(SLOTS)) == slot
        w = inspect.where(cache, slot)
        assert w.block == slot // BS and w.row == slot % BS and w.nbytes == N * DK * 2
        got = b"".join(mem[r.start:r.stop].tobytes() for r in w.ranges)
        assert got == key[t].tobytes()  # the token's N*Dk elements, in order
        last = w.ranges[-1]
        byte = inspect.what(cache, last.stop - 1)
        assert (byte.slot, byte.head * DK + byte.dim if mode == "Norm" else byte.dim) == (slot, N * DK - 1)
    d = inspect.diff(clean, cache, expect_slots=[s for s in SLOTS if s >= 0])
    assert d.summary["slots"] == [3, 20] and d.summary["outside_expected_bytes"] == 0
    if mode == "PA_NZ":
        assert inspect.grid(cache, block=1).c0 == 16


def test_inspect_cli_reads_a_5d_pa_nz_cache_file(tmp_path, capsys):
    from ascend_emu.cli import main

    rng = np.random.default_rng(7)
    key = rng.standard_normal((3, N, DK)).astype(BF16)
    value = rng.standard_normal((3, N, DV)).astype(BF16)
    kc, vc = (np.zeros(s, BF16) for s in _cache_shapes("PA_NZ", five_d=True))
    ops.npu_scatter_pa_kv_cache(key, value, kc, vc, np.array(SLOTS, np.int32))
    np.save(tmp_path / "kc.npy", kc.view(np.uint16))
    rc = main(["inspect", "where", str(tmp_path / "kc.npy"), "--cache-mode", "PA_NZ", "--dtype", "bfloat16",
               "--token", "2", "--index", json.dumps(SLOTS), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert (out["slot"], out["block"], out["row"]) == (20, 1, 4)
    mem = kc.reshape(-1).view(np.uint8)
    assert b"".join(mem[r["start"]:r["stop"]].tobytes() for r in out["ranges"]) == key[2].tobytes()


# ----------------------------------------------------------------------------- Ascend 950 casts
def test_950_casts_recorded_replay_identical_and_hifloat8_outputs_judged_in_hif8_ulps(tmp_path, monkeypatch):
    """npu_dtype_cast to hifloat8 (uint8 codes) and npu_dynamic_mx_quant on an emulated 950:
    record, replay identical; the cast's codes are compared as HiF8 values (a code one step up in
    value order is 1 HiF8 ulp, within a float output's tolerance), not as uint8 integers."""
    torch = pytest.importorskip("torch")
    from ascend_emu.soc import ASCEND950_EXAMPLE, SOC_NAME_ENV
    from tests.reference.formats_950 import hif8_decode

    monkeypatch.setenv(SOC_NAME_ENV, ASCEND950_EXAMPLE)
    x = _bf16(torch, np.random.default_rng(7), (4, 64))
    calls = _round_trip(_record(lambda t: (t.npu_dtype_cast(x, 290), t.npu_dynamic_mx_quant(x, dst_type=292))),
                        tmp_path / "rec")
    assert [c.op for c in calls] == ["npu_dtype_cast", "npu_dynamic_mx_quant"]
    for call in calls:
        rep = compare.compare_call(call)
        assert rep.status == "identical", [(t.name, t.status, t.note) for t in rep.tensors]
    cast = calls[0]
    codes = np.array(cast.outputs[0].array, copy=True)
    assert codes.dtype == np.uint8
    assert compare.compare_call(cast).tensors[0].dtype == "hifloat8"
    # one code to its neighbour in value order: 1 HiF8 ulp (0x07 and 0x7E-style jumps included)
    values = np.array([hif8_decode(c) for c in range(256)], dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(values))
    order = finite[np.argsort(values[finite], kind="stable")]
    pos = int(np.flatnonzero(order == codes.reshape(-1)[5])[0])
    codes.reshape(-1)[5] = order[pos + 1] if pos + 1 < order.size else order[pos - 1]
    cast.outputs[0] = compare.TensorValue(codes)
    t = compare.compare_call(cast).tensors[0]
    assert (t.status, t.dtype, t.mismatches[0]["index"]) == ("pass", "hifloat8", [0, 5])  # a float tolerance
    assert t.ulp_hist["1"] == 1 and sum(t.ulp_hist.values()) == 1  # as a uint8 integer: an exact-compare failure


def test_quant_and_rope_variants_recorded_replay_identical(tmp_path, monkeypatch):
    """npu_dynamic_quant_asymmetric (per token, and per channel on the 950),
    npu_dynamic_mx_quant_with_dual_axis, a TND npu_rotary_mul with rotate and the general
    npu_dtype_cast: record, replay identical."""
    torch = pytest.importorskip("torch")
    from ascend_emu.soc import ASCEND950_EXAMPLE, SOC_NAME_ENV

    rng = np.random.default_rng(9)
    x = _bf16(torch, rng, (4, 64))
    xt = _bf16(torch, rng, (3, 2, 64))
    rt = _bf16(torch, rng, (3, 1, 64))
    rot = _bf16(torch, rng, (64, 64))
    def run(t):
        t.npu_dynamic_quant_asymmetric(x)
        t.npu_rotary_mul(xt, rt, rt, "half", rot)
        t.npu_dtype_cast(x, torch.float16)
        monkeypatch.setenv(SOC_NAME_ENV, ASCEND950_EXAMPLE)
        t.npu_dynamic_quant_asymmetric(x, quant_mode="perchannel")
        t.npu_dynamic_mx_quant_with_dual_axis(x, dst_type=292)

    calls = _round_trip(_record(run), tmp_path / "rec")
    assert [c.op for c in calls] == ["npu_dynamic_quant_asymmetric", "npu_rotary_mul", "npu_dtype_cast",
                                     "npu_dynamic_quant_asymmetric", "npu_dynamic_mx_quant_with_dual_axis"]
    for k, call in enumerate(calls):  # replayed on the SoC each was recorded on (rotate: not on a 950)
        if k < 3:
            monkeypatch.delenv(SOC_NAME_ENV, raising=False)
        else:
            monkeypatch.setenv(SOC_NAME_ENV, ASCEND950_EXAMPLE)
        rep = compare.compare_call(call)
        assert rep.status == "identical", (call.op, [(t.name, t.status, t.note) for t in rep.tensors])
