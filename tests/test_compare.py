"""ascend_emu.compare: metrics against plain-loop references, the record format, the CLI on the
test stand-in torch_npu (loopback: zero differences for every example), fault injection caught at
exact logical coordinates, msprobe dumps replayed."""

from __future__ import annotations

import json
import math
import pathlib

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import compare
from ascend_emu.compare import metrics
from ascend_emu.layouts import CacheLayout

BF16 = ml_dtypes.bfloat16
ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if "import torch_npu" in p.read_text())


# ----------------------------------------------------------------------------- references
def ref_msprobe(n, b):
    """msprobe's formulas, element by element (docs/sources.md#msprobe_metrics)."""
    n = [float(x) for x in np.asarray(n, np.float64).ravel()]
    b = [float(x) for x in np.asarray(b, np.float64).ravel()]
    eps = float(np.finfo(np.float32).eps)
    dot = sum(x * y for x, y in zip(n, b, strict=True))
    nn, nb = math.sqrt(sum(x * x for x in n)), math.sqrt(sum(y * y for y in b))
    rel = []
    for x, y in zip(n, b, strict=True):
        if y == 0:
            x, y = x + eps, y + eps
        rel.append(abs((x - y) / y))
    return {"cosine": dot / (nn * nb), "max_abs_err": max(abs(x - y) for x, y in zip(n, b, strict=True)),
            "max_rel_err": max(rel), "one_thousandth_ratio": sum(r < 0.001 for r in rel) / len(rel),
            "five_thousandths_ratio": sum(r < 0.005 for r in rel) / len(rel)}


def ref_rtol_fails(x, y, prec=0.005):
    """assertRtolEqual's dual threshold (docs/sources.md#assert_rtol_equal), with loops."""
    x, y = list(np.asarray(x, np.float64).ravel()), list(np.asarray(y, np.float64).ravel())
    n_rel = n_abs = 0
    for a, b in zip(x, y, strict=True):
        err = abs(a - b)
        n_abs += err > prec
        n_rel += err / (max(abs(a), abs(b)) + 1e-9) > prec
    return n_rel > len(x) * prec and n_abs > len(x) * prec


def test_msprobe_metrics_match_the_formulas(rng):
    b = rng.standard_normal(200).astype(np.float32)
    b[3] = 0.0
    n = b * (1 + rng.uniform(-0.01, 0.01, 200).astype(np.float32))
    got = metrics.msprobe_metrics(n, b)
    want = ref_msprobe(n, b)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-7), k


def test_cosine_edge_cases():
    assert metrics.msprobe_metrics(np.zeros(4), np.zeros(4))["cosine"] == 1.0
    assert math.isnan(metrics.msprobe_metrics(np.ones(4), np.zeros(4))["cosine"])


@pytest.mark.parametrize("share", [0.004, 0.02])
def test_dual_threshold_verdict(share, rng):
    """fp32 tensors: 0.4 % of elements 10 % off passes, 2 % fails (both counts exceed size * prec)."""
    y = rng.uniform(1, 2, 5000).astype(np.float32)
    x = y.copy()
    k = int(share * y.size)
    x[:k] *= 1.1
    assert metrics.rtol_equal(x, y, both_bf16=False) == (not ref_rtol_fails(x, y))
    assert metrics.rtol_equal(x, y, both_bf16=False) == (share < 0.005)


def test_bf16_allclose_verdict():
    """allclose(rtol=atol=0.005): one ulp at 1.0 (0.0078 <= 0.01) passes, one ulp at 2.0
    (0.0156 > 0.015) fails, whatever the other 99 elements."""
    for v, ok in ((1.0, True), (2.0, False)):
        y = np.full(100, v, BF16)
        x = y.copy()
        x.view(np.uint16)[0] += 1
        assert metrics.rtol_equal(x.astype(np.float32), y.astype(np.float32), both_bf16=True) == ok


def test_ulp_distance_bf16():
    a = np.array([1.0, 0.0, -1.0, 2.0], BF16)
    b = np.array([1.0078125, -0.0, -1.0078125, 1.9921875], BF16)
    assert metrics.ulp_distance(a, b).tolist() == [1, 0, 1, 1]


def test_compare_tensor_nan_aware_and_ulp_histogram():
    e = np.array([1.0, np.nan, 3.0, 4.0, 5.0], BF16)
    a = e.copy()
    a.view(np.uint16)[1] = 0x7FC1  # another NaN payload: equal
    assert compare.compare_tensor("x", a, e).status == "identical"
    a.view(np.uint16)[2] += 1  # one ulp
    a.view(np.uint16)[3] += 3
    a[4] = np.nan
    r = compare.compare_tensor("x", a, e)
    assert r.status == "fail" and r.nan_mismatch == 1 and r.mismatched == 3
    assert r.ulp_hist["1"] == 1 and r.ulp_hist["3-4"] == 1 and r.ulp_hist["nan"] == 1
    assert [m["index"] for m in r.mismatches] == [[2], [3], [4]]


@pytest.mark.filterwarnings("error")
def test_identical_lightning_indexer_scores_cosine_1_no_warnings(rng):
    """The indexer's values output pads with -inf past the selected keys: comparing it with
    itself is identical with cosine 1 and both ratios 1, and NumPy warns about nothing (-inf vs
    -inf counts as equal, like NaN vs NaN, and stays out of the metrics)."""
    from ascend_emu import ops

    bf = BF16
    query = rng.standard_normal((1, 2, 64, 128)).astype(bf)
    key = rng.standard_normal((1, 6, 1, 128)).astype(bf)
    weights = rng.standard_normal((1, 2, 64)).astype(bf)
    _, values = ops.npu_lightning_indexer(query, key, weights, sparse_count=8, sparse_mode=0, return_value=True)
    assert np.isneginf(values.astype(np.float32)).sum() == 2 * 2  # 6 keys of 8 per token: two -inf each
    r = compare.compare_tensor("sparse_values", values.copy(), values)
    assert (r.status, r.cosine, r.one_thousandth_ratio, r.five_thousandths_ratio) == ("identical", 1.0, 1.0, 1.0)
    assert (r.max_abs_err, r.max_rel_err, r.mismatched, r.inf_mismatch) == (0.0, 0.0, 0, 0)
    every = np.full(5, -np.inf, np.float32)
    r = compare.compare_tensor("all_masked", every, every.copy())
    assert (r.status, r.cosine, r.one_thousandth_ratio, r.max_abs_err) == ("identical", 1.0, 1.0, 0.0)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("dtype", [np.float32, BF16])
@pytest.mark.parametrize("other", [5.0, np.inf])
def test_infinity_on_one_side_fails(dtype, other):
    """-inf against a finite value or +inf fails the tensor (like NaN on one side), even where the
    dual threshold would let one element in 1000 through; the finite pairs keep their metrics."""
    e = np.ones(1000, np.float32)
    e[:3] = -np.inf
    a = e.copy()
    a[1] = other
    r = compare.compare_tensor("s", a.astype(dtype), e.astype(dtype))
    assert (r.status, r.inf_mismatch, r.nan_mismatch, r.mismatched) == ("fail", 1, 0, 1)
    assert (r.cosine, r.max_abs_err, r.one_thousandth_ratio) == (1.0, 0.0, 1.0)


def test_compare_tensor_integers_exact():
    e = np.arange(-5, 5, dtype=np.int8).reshape(2, 5)
    a = e.copy()
    a[1, 2] += 2
    r = compare.compare_tensor("q", a, e)
    assert (r.status, r.max_int_delta, r.mismatches[0]["index"]) == ("fail", 2, [1, 2])


def test_cache_mismatch_in_logical_coordinates():
    """One element of a PA_NZ bf16 cache changed: reported at its block, row, dim."""
    e = np.zeros((4, 16, 1, 64), BF16)
    layout = CacheLayout.from_declared("PA_NZ", e.shape, 2)
    a = e.copy()
    slot, dim = 37, 20
    off = int(layout.chunk_offsets(np.array([slot]))[0][dim // layout.c0]) + 2 * (dim % layout.c0)
    a.reshape(-1).view(np.uint8)[off + 1] = 0x3F  # high byte of element (slot 37, dim 20)
    r = compare.compare_tensor("kr_cache", a, e, role="cache", cache_mode="PA_NZ")
    assert r.status == "fail"
    # the changed element's bits, read back from the bytes written: 0x3F00 (0.5) against +0.0, both
    # non-negative, so the ulp distance is the difference of the bit patterns
    bits = int.from_bytes(a.reshape(-1).view(np.uint8)[off:off + 2].tobytes(), "little")
    assert bits == 0x3F00
    assert r.mismatches == [{"block": 2, "row": 5, "slot": 37, "head": 0, "field": "element", "elements": [20],
                             "bytes": 1, "max_ulp": bits - 0x0000, "max_int_delta": None,
                             "expected_slot": None}]


def test_cache_judged_on_written_slots_only():
    """A functional npu_mla_preprocess cache copy: bytes outside the written slots are noted, not judged."""
    e = np.zeros((2, 16, 1, 64), BF16)
    a = e.copy()
    a[1, 0, 0, 2] = 5  # slot 16, not written by the op
    r = compare.compare_tensor("c", a, e, role="cache", cache_mode="PA_BSND", expect_slots=[3],
                               judge_expected_only=True)
    assert (r.status, r.mismatches) == ("pass", []) and "2 byte(s) differ outside" in r.note
    a[0, 3, 0, 1] = 1  # slot 3, written
    r = compare.compare_tensor("c", a, e, role="cache", cache_mode="PA_BSND", expect_slots=[3],
                               judge_expected_only=True)
    assert r.status == "fail" and [(m["slot"], m["elements"]) for m in r.mismatches] == [(3, [1])]


def test_record_format_round_trip(tmp_path, rng):
    call = compare.Call(index=0, op="npu_kv_rmsnorm_rope_cache", api="torch_npu.npu_kv_rmsnorm_rope_cache",
                        args=[compare.TensorValue(rng.standard_normal((2, 3)).astype(BF16)),
                              compare.TensorValue(np.arange(6, dtype=np.int8).reshape(2, 3), 29)],
                        kwargs={"cache_mode": "PA_NZ", "epsilon": 1e-5, "v": None, "dt": {"dtype": "torch.int8"},
                                "lst": [1, compare.TensorValue(np.ones(2, np.float32))]},
                        arg_names=["kv", "gamma"], after={"k_cache": np.ones((2, 2), BF16)},
                        outputs=["=k_cache", compare.TensorValue(np.zeros(3, np.float32))])
    w = compare.RecordWriter(tmp_path / "rec", "2.14.0")
    w(call)
    n_files = len(list((tmp_path / "rec" / "tensors").iterdir()))
    w(compare.Call(index=1, op=call.op, api=call.api, args=[call.args[0]]))  # the same tensor again
    w.close()
    assert n_files == 5 and len(list((tmp_path / "rec" / "tensors").iterdir())) == n_files  # stored once
    back, again = compare.read_record(tmp_path / "rec")
    assert again.args[0].array.tobytes() == call.args[0].array.tobytes()
    assert back.args[0].array.dtype == BF16 and np.array_equal(back.args[0].array.view(np.uint16),
                                                                call.args[0].array.view(np.uint16))
    assert back.args[1].npu_format == 29 and np.array_equal(back.args[1].array, call.args[1].array)
    assert back.kwargs["cache_mode"] == "PA_NZ" and back.kwargs["v"] is None
    assert back.kwargs["dt"] == {"dtype": "torch.int8"} and back.kwargs["lst"][0] == 1
    assert back.outputs[0] == "=k_cache" and back.after["k_cache"].dtype == BF16
    assert json.loads((tmp_path / "rec" / "index.json").read_text())["ops"] == {"npu_kv_rmsnorm_rope_cache": 2}
    with pytest.raises(FileExistsError):
        compare.RecordWriter(tmp_path / "rec")


def test_unknown_op_not_replayable():
    rep = compare.compare_call(compare.Call(index=0, op="npu_lightning_indexer_x", api="x"))
    assert rep.status == "not replayable" and "does not exist" in rep.reason


# ----------------------------------------------------------------------------- CLI on the stand-in
def _cli(args, capsys):
    from ascend_emu.cli import main

    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def standin_module():
    pytest.importorskip("torch")
    from tests.standin_torch_npu import standin

    return standin


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_shadow_compare_loopback_identical(example, standin_module, tmp_path, capsys):
    """Every example script, shadowed on the stand-in device (loopback): zero differences."""
    with standin_module():
        rc, out, err = _cli(["compare", "--json", str(tmp_path / "r.json"), str(example)], capsys)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0, out + err
    assert rep["summary"]["calls"] >= 1 and rep["summary"]["identical"], rep["summary"]
    assert all(t["mismatched"] == 0 for c in rep["calls"] for t in c["tensors"])


def test_record_then_replay(standin_module, tmp_path, capsys):
    ex = ROOT / "examples" / "mla_prolog_v3_per_tile.py"
    with standin_module():
        rc, _, err = _cli(["record", "-o", str(tmp_path / "rec"), str(ex)], capsys)
    assert rc == 0, err
    rc, out, _ = _cli(["compare", "--replay", str(tmp_path / "rec"), "--csv", str(tmp_path / "r.csv")], capsys)
    assert rc == 0 and "identical" in out
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert rows[0].startswith("call,op,api") and len(rows) > 2


def _fault_report(standin_module, fault, example, tmp_path, capsys):
    with standin_module(fault):
        _cli(["record", "-o", str(tmp_path / "rec"), str(ROOT / "examples" / example)], capsys)  # the
        # script's own checks may fail on a faulty device: its exit status is not the point here
    calls = compare.read_record(tmp_path / "rec")
    rc, out, _ = _cli(["compare", "--replay", str(tmp_path / "rec"), "--json", str(tmp_path / "r.json")], capsys)
    return rc, calls, json.loads((tmp_path / "r.json").read_text())


def test_fault_row_one_slot_off(standin_module, tmp_path, capsys):
    """The device wrote token 0 one slot further: both slots reported, at their block / row."""
    rc, calls, rep = _fault_report(standin_module, "slot_off", "kv_rmsnorm_rope_cache.py", tmp_path, capsys)
    assert rc == 1
    slot = int(calls[0].args[4].array.reshape(-1)[0])  # the index the script passed
    bs = calls[0].args[5].array.shape[1]
    for name in ("k_cache", "ckv_cache"):
        t = next(t for t in rep["calls"][0]["tensors"] if t["name"] == name)
        assert t["status"] == "fail"
        assert {(m["block"], m["row"], m["slot"]) for m in t["mismatches"]} == {
            (slot // bs, slot % bs, slot), ((slot + 1) // bs, (slot + 1) % bs, slot + 1)}


def test_fault_scale_byte(standin_module, tmp_path, capsys):
    """One byte flipped in a 656-byte row's scale field: reported as field 'scale', its tile."""
    rc, calls, rep = _fault_report(standin_module, "scale_byte", "mla_prolog_v3_per_tile.py", tmp_path, capsys)
    assert rc == 1
    call = calls[0]
    slot = int(call.kwargs["cache_index"].array.reshape(-1)[0])
    bs = call.args[9].array.shape[1]
    t = next(t for t in rep["calls"][0]["tensors"] if t["name"] == "kv_cache")
    assert [(m["block"], m["row"], m["field"], m["elements"], m["bytes"]) for m in t["mismatches"]] == [
        (slot // bs, slot % bs, "scale", [0], 1)]  # byte 642 of the row: scale[0], byte 2


def test_fault_bf16_rounded_the_other_way(standin_module, tmp_path, capsys):
    """query[0...] one ulp off: listed at its index, ulp histogram {1: 1}, judged by allclose."""
    rc, _, rep = _fault_report(standin_module, "round_bf16", "mla_prolog_v3.py", tmp_path, capsys)
    t = next(t for t in rep["calls"][0]["tensors"] if t["name"] == "query")
    assert t["mismatched"] == 1 and t["ulp_hist"]["1"] == 1
    m = t["mismatches"][0]
    assert m["index"] == [0] * len(t["shape"])
    within = abs(m["actual"] - m["expected"]) <= 0.005 + 0.005 * abs(m["expected"])
    assert t["status"] == ("pass" if within else "fail") and rc == (0 if within else 1)


def test_fault_skipped_nz_cast(standin_module, tmp_path, capsys):
    """The weights reached the device without npu_format_cast: the replay names the weight."""
    rc, _, rep = _fault_report(standin_module, "skip_nz", "mla_prolog_v3.py", tmp_path, capsys)
    assert rc == 1
    assert rep["calls"][0]["status"] == "emu error" and "weight_dq" in rep["calls"][0]["reason"]


def test_record_needs_torch_npu(tmp_path, capsys, monkeypatch):
    import importlib.util
    import sys

    if importlib.util.find_spec("torch_npu") is not None or "torch_npu" in sys.modules:
        pytest.skip("a torch_npu is importable here")
    rc, _, err = _cli(["record", "-o", str(tmp_path / "r"), str(EXAMPLES[0])], capsys)
    assert rc == 2 and "no torch_npu is installed" in err
    assert not (tmp_path / "r").exists()  # no empty recording left behind
    rc, _, err = _cli(["compare", str(EXAMPLES[0])], capsys)
    assert rc == 2 and "no torch_npu is installed" in err


def test_replay_of_an_empty_recording_fails_with_the_reason(tmp_path, capsys):
    compare.RecordWriter(tmp_path / "rec").close()  # what a run calling no emulated op leaves
    rc, out, err = _cli(["compare", "--replay", str(tmp_path / "rec")], capsys)
    assert rc == 2 and f"{tmp_path / 'rec'} holds no recorded call" in err
    assert ("called none of the emulated ops (npu_dtype_cast, npu_dynamic_mx_quant, "
            "npu_dynamic_mx_quant_with_dual_axis, npu_dynamic_quant, npu_dynamic_quant_asymmetric, ") in err


def test_a_run_calling_no_op_records_and_compares_nothing(standin_module, tmp_path, capsys):
    script = tmp_path / "no_ops.py"
    script.write_text("import torch, torch_npu\nprint(torch.ones(2))\n")
    with standin_module():
        rc, _, err = _cli(["record", "-o", str(tmp_path / "rec"), str(script)], capsys)
        assert rc == 1 and "record: no call recorded in" in err and "called none of the emulated ops" in err
        rc, _, err = _cli(["compare", str(script)], capsys)
        assert rc == 1 and "compare: nothing compared: the script called none" in err


@pytest.mark.parametrize("argv, option", [
    (["compare", "{script}", "--png-dir", "d"], "--png-dir"),
    (["compare", "{script}", "x", "--json=r.json"], "--json"),
    (["compare", "{script}", "--replay", "d"], "--replay"),
    (["record", "{script}", "-o", "rec"], "-o"),
])
def test_own_option_after_the_script_is_refused(argv, option, tmp_path, capsys, monkeypatch):
    """An option of compare / record after SCRIPT would silently go to the script: exit 2 naming
    it, before anything runs or is written."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit('script ran')\n")
    rc, out, err = _cli([a.format(script=script) for a in argv], capsys)
    assert rc == 2, err
    assert f"{argv[0]}: {option} comes after the script name" in err and f"put {option} before the script name" in err
    assert "script ran" not in out + err and not (tmp_path / "rec").exists() and not (tmp_path / "d").exists()


def test_script_arguments_after_double_dash_reach_the_script(standin_module, tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("import sys, json\nprint(json.dumps(sys.argv[1:]))\nimport torch_npu\n")
    with standin_module():
        rc, out, err = _cli(["compare", str(script), "--", "--png-dir", "d"], capsys)
    assert '["--png-dir", "d"]' in out and "comes after the script name" not in err
    assert rc == 1 and "nothing compared" in err  # the script calls no op


def test_heatmap_png(tmp_path, monkeypatch):
    """One heat map per mismatching cache, titled with the call, its API and the tensor."""
    from ascend_emu.inspect import plot

    e = np.zeros((2, 16, 1, 64), BF16)
    a = e.copy()
    a[1, 3, 0, 5] = 1
    rep = compare.CallReport(4, "npu_mla_prolog_v3", "torch_npu.npu_mla_prolog_v3", "fail",
                             tensors=[compare.compare_tensor("kr_cache", a, e, role="cache", cache_mode="PA_BSND")])
    titles = []
    figure = plot.diff_figure

    def recording(d, **kw):
        titles.append(kw["title"])
        return figure(d, **kw)

    monkeypatch.setattr(plot, "diff_figure", recording)
    (png,) = compare.Report([rep]).heatmaps(tmp_path)
    assert pathlib.Path(png).read_bytes()[:4] == b"\x89PNG"
    (title,) = titles
    assert title.startswith("call 4 torch_npu.npu_mla_prolog_v3\nkr_cache (cache, bfloat16 [2, 16, 1, 64]): fail")


# ----------------------------------------------------------------------------- msprobe dumps
def _msprobe_dump(root: pathlib.Path, torch, entries):
    """Write an msprobe task-'tensor' dump (docs/sources.md#msprobe_dump) of ``entries``: key -> (args, kwargs, outputs)."""
    rank = root / "step0" / "rank0"
    data_dir = rank / "dump_tensor_data"
    data_dir.mkdir(parents=True)

    def node(v, name, save=True):
        if isinstance(v, torch.Tensor):
            f = v.float()
            if save:
                torch.save(v.clone(), data_dir / name)
            return {"type": "torch.Tensor", "dtype": str(v.dtype), "shape": list(v.shape),
                    "Max": float(f.max()) if save else None, "Min": float(f.min()) if save else None,
                    "Mean": float(f.mean()) if save else None, "Norm": float(f.norm()) if save else None,
                    "requires_grad": False, "data_name": name}
        if v is None:
            return None
        return {"type": type(v).__name__, "value": v}

    data = {}
    for key, (args, kwargs, outs, nz) in entries.items():
        data[key] = {"input_args": [node(v, f"{key}.input.{i}.pt", i not in nz) for i, v in enumerate(args)],
                     "input_kwargs": {k: node(v, f"{key}.kwargs.{k}.pt") for k, v in kwargs.items()},
                     "output": [node(v, f"{key}.output.{i}.pt") for i, v in enumerate(outs)]}
    (rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch",
                                                "dump_data_dir": str(data_dir), "data": data}))
    return rank


def test_msprobe_replay(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as tnpu

    g = torch.Generator().manual_seed(0)
    b, s = 2, 1
    kv = torch.randn(b, 1, s, 576, generator=g).to(torch.bfloat16)
    gamma = torch.ones(512, dtype=torch.bfloat16)
    cos = torch.randn(b, 1, s, 64, generator=g).to(torch.bfloat16)
    sin = torch.randn(b, 1, s, 64, generator=g).to(torch.bfloat16)
    index = torch.tensor([3, 17], dtype=torch.int64)
    k_cache = torch.zeros(4, 16, 1, 64, dtype=torch.bfloat16)
    ckv_cache = torch.zeros(4, 16, 1, 512, dtype=torch.bfloat16)
    before = [kv, gamma, cos, sin, index, k_cache.clone(), ckv_cache.clone()]
    outs = tnpu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, cache_mode="PA_NZ",
                                          is_output_kv=True)
    prolog_args = [torch.zeros(2, 7168, dtype=torch.bfloat16)] * 11  # weights 1, 2, 4 are NZ: not saved
    _msprobe_dump(tmp_path / "dump", torch, {
        "NPU.npu_kv_rmsnorm_rope_cache.0.forward": (before, {"cache_mode": "PA_NZ", "is_output_kv": True},
                                                    [o.clone() for o in outs], ()),
        "NPU.npu_mla_prolog_v3.0.forward": (prolog_args, {}, [torch.zeros(1)], (1, 2, 4)),
        "Torch.matmul.0.forward": ([kv], {}, [kv], ()),
    })
    rc, out, err = _cli(["replay", str(tmp_path / "dump"), "-o", str(tmp_path / "emu"), "-n", "1", "--allow-skipped",
                         "--json", str(tmp_path / "r.json")], capsys)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0, out + err
    by_op = {c["op"]: c for c in rep["calls"]}
    assert by_op["npu_kv_rmsnorm_rope_cache"]["status"] == "identical"
    assert {t["name"] for t in by_op["npu_kv_rmsnorm_rope_cache"]["tensors"]} == {
        "k_cache", "ckv_cache", "k_embed_out", "y_out"}
    assert by_op["npu_mla_prolog_v3"]["status"] == "not replayable"
    assert "weight_dq" in by_op["npu_mla_prolog_v3"]["reason"] and "FRACTAL_NZ" in by_op["npu_mla_prolog_v3"]["reason"]
    emu_rank = tmp_path / "emu" / "step0" / "rank0"
    emu = json.loads((emu_rank / "dump.json").read_text())
    assert list(emu["data"]) == ["NPU.npu_kv_rmsnorm_rope_cache.0.forward"]
    o0 = emu["data"]["NPU.npu_kv_rmsnorm_rope_cache.0.forward"]["output"][0]
    assert o0["dtype"] == "torch.bfloat16" and o0["shape"] == [4, 16, 1, 64]
    back = torch.load(emu_rank / "dump_tensor_data" / o0["data_name"], map_location="cpu", weights_only=True)
    assert torch.equal(back.view(torch.int16), outs[0].view(torch.int16))


def _kv_undefined_dump(tmp_path, torch, *, corrupt_written=False):
    """An msprobe dump of npu_kv_rmsnorm_rope_cache (in place) and its v2 functional form, both with
    is_output_kv=False, as the device returns them: k_embed_out / y_out and the functional caches'
    rows outside the written slots hold random bytes (uninitialised memory). PA mode: slot s is
    row s of the cache seen as [blocks * block_size, D]."""
    import ascend_emu.torch_npu as tnpu

    g = torch.Generator().manual_seed(5)
    b, s = 2, 1
    kv = torch.randn(b, 1, s, 576, generator=g).to(torch.bfloat16)
    gamma = torch.ones(512, dtype=torch.bfloat16)
    cos = torch.randn(b, 1, s, 64, generator=g).to(torch.bfloat16)
    sin = torch.randn(b, 1, s, 64, generator=g).to(torch.bfloat16)
    index = torch.tensor([3, 17], dtype=torch.int64)

    def caches():
        return torch.zeros(4, 16, 1, 64, dtype=torch.bfloat16), torch.zeros(4, 16, 1, 512, dtype=torch.bfloat16)

    def garbage(t):
        return torch.randint(-2**15, 2**15, t.shape, generator=g, dtype=torch.int16).view(torch.bfloat16)

    kc, cc = caches()
    before = [kv, gamma, cos, sin, index, kc.clone(), cc.clone()]
    kw = {"cache_mode": "PA", "is_output_kv": False}
    k_out, c_out, k_embed, y = tnpu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, kc, cc, **kw)
    inplace_outs = [k_out.clone(), c_out.clone(), garbage(k_embed), garbage(y)]
    kc2, cc2 = caches()
    k_embed2, y2, k_new, c_new = tnpu.npu_kv_rmsnorm_rope_cache_v2_functional(kv, gamma, cos, sin, index, kc2, cc2,
                                                                            **kw)
    func_outs = [garbage(k_embed2), garbage(y2)]
    for new in (k_new, c_new):
        dev = garbage(new)
        rows, new_rows = dev.view(-1, new.shape[-1]), new.reshape(-1, new.shape[-1])
        for slot in index.tolist():
            rows[slot] = new_rows[slot]
        func_outs.append(dev)
    if corrupt_written:  # one written element of the functional ckv cache off by one ulp
        func_outs[3].view(torch.int16).view(-1, 512)[17, 5] += 1
    _msprobe_dump(tmp_path / "dump", torch, {
        "NPU.npu_kv_rmsnorm_rope_cache.0.forward": (before, kw, inplace_outs, ()),
        "NPU.npu_kv_rmsnorm_rope_cache_v2_functional.0.forward": (before[:5] + list(caches()), kw, func_outs, ()),
    })


def test_msprobe_replay_leaves_undefined_outputs_uncompared(tmp_path, capsys):
    """is_output_kv=False outputs and a functional form's rows outside the written slots are
    undefined on the device: random content there passes, listed as not compared."""
    torch = pytest.importorskip("torch")
    _kv_undefined_dump(tmp_path, torch)
    rc, out, err = _cli(["replay", str(tmp_path / "dump"), "-o", str(tmp_path / "emu"), "-n", "1",
                         "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")], capsys)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0, out + err
    inplace, func = rep["calls"]
    assert inplace["op"] == "npu_kv_rmsnorm_rope_cache" and inplace["status"] == "identical"
    assert func["op"] == "npu_kv_rmsnorm_rope_cache_v2_functional" and func["status"] == "pass"
    for c in (inplace, func):
        assert set(c["not_compared"]) == {"k_embed_out", "y_out"}
        assert "is_output_kv=False" in c["not_compared"]["y_out"]
        assert not {"k_embed_out", "y_out"} & {t["name"] for t in c["tensors"]}
    caches = {t["name"]: t for t in func["tensors"]}
    assert set(caches) == {"k_cache", "ckv_cache"}
    assert all("outside the written slots" in t["note"] for t in caches.values())
    assert "not compared" in out
    rows = [r for r in (tmp_path / "r.csv").read_text().splitlines() if ",not compared," in r]
    assert len(rows) == 4


def test_msprobe_replay_functional_written_rows_still_judged(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    _kv_undefined_dump(tmp_path, torch, corrupt_written=True)
    rc, out, err = _cli(["replay", str(tmp_path / "dump"), "-o", str(tmp_path / "emu"), "-n", "1",
                         "--json", str(tmp_path / "r.json")], capsys)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 1
    func = rep["calls"][1]
    bad = {t["name"]: t for t in func["tensors"]}["ckv_cache"]
    assert func["status"] == "fail" and bad["status"] == "fail"
    assert [(m["slot"], m["elements"]) for m in bad["mismatches"]] == [(17, [5])]


# ----------------------------------------------------------------------------- wrapped drop-in ops (msprobe)
def _kv_inputs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    b, s = 2, 3

    def bf16(shape, lo=-1.0, hi=1.0):
        return torch.from_numpy(rng.uniform(lo, hi, shape).astype(np.float32)).to(torch.bfloat16)

    return torch, (bf16((b, 1, s, 576)), bf16((512,), 0.5, 1.5), bf16((b, 1, s, 64)), bf16((b, 1, s, 64)),
                   torch.tensor([3, 40, -1, 7, 33, 64], dtype=torch.int64))


def test_wrapped_module_attribute_does_not_change_the_op(monkeypatch):
    """A (*args, **kwargs) wrapper on the module attribute (as msprobe's PrecisionDebugger
    installs) gives the same bytes as the bare op, positional and keyword calls alike."""
    torch, (kv, gamma, cos, sin, index) = _kv_inputs()
    import ascend_emu.torch_npu as tnpu

    def caches():
        return (torch.zeros((3, 32, 1, 64), dtype=torch.bfloat16), torch.zeros((3, 32, 1, 512), dtype=torch.bfloat16))

    bare = tnpu.npu_kv_rmsnorm_rope_cache
    kc, cc = caches()
    want = bare(kv, gamma, cos, sin, index, kc, cc, cache_mode="PA", is_output_kv=True)
    seen = []

    def wrapper(*args, **kwargs):
        seen.append(len(args))
        return bare(*args, **kwargs)

    monkeypatch.setattr(tnpu, "npu_kv_rmsnorm_rope_cache", wrapper)
    for call in (lambda k, c: tnpu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k, c, cache_mode="PA",
                                                             is_output_kv=True),
                 lambda k, c: tnpu.npu_kv_rmsnorm_rope_cache(kv=kv, gamma=gamma, cos=cos, sin=sin, index=index,
                                                             k_cache=k, ckv_cache=c, cache_mode="PA",
                                                             is_output_kv=True)):
        k2, c2 = caches()
        got = call(k2, c2)
        for x, y in zip(want, got, strict=True):
            assert torch.equal(x.view(torch.int16), y.view(torch.int16))
        assert torch.equal(k2.view(torch.int16), kc.view(torch.int16))
        assert torch.equal(c2.view(torch.int16), cc.view(torch.int16))
    assert seen == [7, 0]


def test_replay_kv_quant_value_recorded_as_a_copy_of_key():
    """A recording keeps values, not identity: a KV-quant call whose recorded ``value`` is a copy of
    the key replays with the output of ``value=key``."""
    from ascend_emu import ops
    from ascend_emu.compare.calls import Call, TensorValue
    from tests.test_sparse_flash_attention import SCALE, make_case

    case = make_case(np.random.default_rng(4), quant=True, layout_query="BSND", layout_kv="PA_BSND",
                     dtype="bfloat16", sbs=4)
    kw = dict(case["kw"], sparse_mode=3, attention_mode=2)
    want = ops.npu_kv_quant_sparse_flash_attention(case["query"], case["key"], case["key"], case["sparse_indices"],
                                                   SCALE, 2, 2, **kw)
    call = Call(index=0, op="npu_kv_quant_sparse_flash_attention", api="torch_npu.npu_kv_quant_sparse_flash_attention",
                args=[TensorValue(case["query"].copy()), TensorValue(case["key"].copy()),
                      TensorValue(case["key"].copy()), TensorValue(case["sparse_indices"].copy()), SCALE, 2, 2],
                kwargs={k: TensorValue(v.copy()) if isinstance(v, np.ndarray) else v for k, v in kw.items()})
    got = compare.replay(call)
    assert got.error is None and got.unavailable is None
    assert np.array_equal(got.outputs[0].array.view(np.uint16), want.view(np.uint16))

# ---------------------------------------------------------------------- quiet text report
def _many_calls_report(n: int, failing: tuple[int, ...]):
    """A report of ``n`` calls of one long-named op, each one fp32 output: identical, except the
    ``failing`` ones (one element off by 1.0, far outside the criterion)."""
    from ascend_emu.compare.calls import CallReport
    from ascend_emu.compare.metrics import compare_tensor
    from ascend_emu.compare.report import Report

    expected = np.arange(8, dtype=np.float32)
    calls = []
    for i in range(n):
        actual = expected.copy()
        if i in failing:
            actual[3] += 1.0
        t = compare_tensor("attention_out", actual, expected)
        calls.append(CallReport(index=i, op="npu_kv_quant_sparse_flash_attention",
                                api=f"NPU.npu_kv_quant_sparse_flash_attention.{i}.forward",
                                status="fail" if i in failing else "identical", tensors=[t]))
    return Report(calls=calls)


@pytest.mark.parametrize("columns", [80, 120])
def test_text_report_lists_only_the_calls_that_did_not_pass(columns, capsys, monkeypatch):
    """A 488-call report with every call passing but two: a summary and the two failing calls
    (first divergence first), not a line per call; --verbose lists every call. Op names are
    never split across lines at 120 columns."""
    from ascend_emu.textview import console

    monkeypatch.setenv("COLUMNS", str(columns))
    report = _many_calls_report(488, failing=(300, 17))
    report.render(console())
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) < 30, out
    rows = [ln for ln in lines if "│" in ln and ln.split("│")[0].strip().isdigit()]
    assert [int(r.split("│")[0]) for r in rows] == [17, 300], out  # in call order: the first divergence first
    flat = " ".join(out.split())  # the note folds at 80 columns
    assert "not listed: 486 call(s) identical or within the criterion (-v / --verbose lists every call" in flat
    assert lines[-1] == "488 call(s): 486 identical, 2 fail"
    if columns >= 120:
        assert all("npu_kv_quant_sparse_flash_attention" in r for r in rows)  # whole op names
    report.render(console(), verbose=True)
    verbose = capsys.readouterr().out
    listed = {int(ln.split("│")[0]) for ln in verbose.splitlines() if "│" in ln and ln.split("│")[0].strip().isdigit()}
    assert listed == set(range(488)) and "not listed" not in verbose


def test_text_report_caps_the_failing_calls_it_lists(capsys, monkeypatch):
    from ascend_emu.compare.report import LISTED_CALLS
    from ascend_emu.textview import console

    monkeypatch.setenv("COLUMNS", "120")
    report = _many_calls_report(LISTED_CALLS + 30, failing=tuple(range(LISTED_CALLS + 30)))
    report.render(console())
    out = capsys.readouterr().out
    assert "not listed: 30 more call(s) that did not pass (-v / --verbose lists every call" in " ".join(out.split())
    listed = {int(ln.split("│")[0]) for ln in out.splitlines() if "│" in ln and ln.split("│")[0].strip().isdigit()}
    assert listed == set(range(LISTED_CALLS))


def test_compare_and_replay_take_verbose():
    from ascend_emu.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["compare", "--replay", "d", "-v"]).verbose
    assert parser.parse_args(["replay", "d", "-o", "o", "--verbose"]).verbose
    assert not parser.parse_args(["replay", "d", "-o", "o"]).verbose


def test_replay_describes_read_caches_with_the_contract_layout_and_a_diff_in_block_row_head_dim():
    """Replay describes each cache an op reads with the CacheLayout its contract's ``cache_reads()``
    gives it (the object a written cache gets from its writer); a read cache whose emulator copy
    no longer matches the recorded input is listed with (block, row, head, dim) coordinates."""
    from ascend_emu.compare.calls import Call, TensorValue
    from tests.test_sparse_flash_attention import SCALE, make_case

    case = make_case(np.random.default_rng(6), quant=False, layout_query="BSND", layout_kv="PA_BSND",
                     dtype="bfloat16", sbs=1)
    kw = dict(case["kw"], sparse_mode=3, attention_mode=2, query_rope=case["query_rope"], key_rope=case["key_rope"])
    call = Call(index=0, op="npu_sparse_flash_attention", api="torch_npu.npu_sparse_flash_attention",
                args=[TensorValue(case[n].copy()) for n in ("query", "key", "value", "sparse_indices")] + [SCALE],
                kwargs={k: TensorValue(v.copy()) if isinstance(v, np.ndarray) else v for k, v in kw.items()})
    emu = compare.replay(call)
    assert emu.error is None and emu.unavailable is None
    nb, bs = case["key"].shape[:2]  # PA_BSND [block_num, block_size, N2=1, D]
    want = {name: CacheLayout(mode="PA_BSND", num_blocks=nb, block_size=bs, dim=dim, itemsize=2)
            for name, dim in (("key", 512), ("key_rope", 64), ("value", 512))}
    assert emu.layouts == want and sorted(emu.reads) == sorted(want)
    rep = compare.compare_call(call, emu)
    assert rep.status == "identical" and rep.tensors == []  # read caches unchanged: not listed
    # the emulator's key_rope copy changed at block 3, row 1, head 0, dim 10: listed as a read cache
    emu.reads["key_rope"] = emu.reads["key_rope"].copy()
    emu.reads["key_rope"].view(np.uint16)[3, 1, 0, 10] ^= 1
    rep = compare.compare_call(call, emu)
    bad = {t.name: t for t in rep.tensors}["key_rope"]
    assert (rep.status, bad.role, bad.status) == ("fail", "read cache", "fail")
    m = bad.mismatches[0]
    assert (m["block"], m["row"], m["head"], m["elements"], m["slot"]) == (3, 1, 0, [10], 3 * bs + 1)
