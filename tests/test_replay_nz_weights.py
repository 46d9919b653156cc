"""FRACTAL_NZ weights missing from msprobe dumps (ascend_emu.compare.nz_weights): rebuilt for the
``npu_mla_prolog_v3`` calls of a synthetic dump (tests/synthetic_msprobe.py, ``prolog=True``) from
the dumped inputs of the ``npu_format_cast`` calls that made them (one weight set per layer, cast
in step 0, used in both steps), or from ``--weights`` with a name map; the report names each
source; a repro of a failing prolog call carries its rebuilt weights."""

from __future__ import annotations

import json
import runpy
import sys

import pytest

from tests.synthetic_msprobe import CAST_OP, NZ_WEIGHTS, PROLOG_OP, SFA_OP, prolog_weights, write_dump

torch = pytest.importorskip("torch")

LAYERS, STEPS = 2, 2
CORRUPT = {(1, 0, 1, PROLOG_OP), (0, 0, 0, SFA_OP)}


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("nz") / "dump"
    write_dump(root, layers=LAYERS, steps=STEPS, ranks=1, corrupt=CORRUPT, prolog=True, distinct_weights=True)
    return root


def _replay(dump, out, *extra):
    from ascend_emu.cli import main

    rc = main(["replay", str(dump), "-o", str(out), "-n", "1", "--json", f"{out}.json", *extra])
    return rc, json.loads(open(f"{out}.json").read())


def test_weights_rebuilt_from_the_casts_in_layer_order(dump, tmp_path, capsys, monkeypatch):
    """Every prolog call replays with its own layer's weights (a wrong layer's would fail it):
    only the corrupted calls fail, and each weight names the cast it came from. The failing
    prolog call's repro carries the rebuilt weights and, run as ``ascend-emu run`` runs it (the
    drop-in as torch_npu), gives the emulator's outputs byte for byte and exits 1."""
    import ascend_emu.torch_npu as drop_in

    rc, rep = _replay(dump, tmp_path / "emu", "--export-repro", str(tmp_path / "repro"))
    text = capsys.readouterr().out
    assert rc == 1
    failed = {(c["where"]["step"], c["where"]["rank"], c["where"]["layer"], c["op"])
              for c in rep["calls"] if c["status"] not in ("identical", "pass")}
    assert failed == CORRUPT
    prolog = [c for c in rep["calls"] if c["op"] == PROLOG_OP]
    assert len(prolog) == LAYERS * STEPS
    for c in prolog:
        layer = c["where"]["layer"]
        assert list(c["weights"]) == list(NZ_WEIGHTS)
        for i, arg in enumerate(NZ_WEIGHTS):
            assert c["weights"][arg].startswith(f"the input of step0/rank0 NPU.{CAST_OP}.{3 * layer + i}.forward ("), c
            assert f"number {layer} of {LAYERS} distinct ones" in c["weights"][arg]
    assert f"FRACTAL_NZ weights (not saved by msprobe): {3 * LAYERS * STEPS} rebuilt from the npu_format_cast" in text
    # the failing prolog call's repro loads its rebuilt weights and casts them to NZ
    (repro,) = (tmp_path / "repro").glob(f"step1_rank0_call*_{PROLOG_OP}")
    script = (repro / "repro.py").read_text()
    for i, arg in enumerate(NZ_WEIGHTS):
        name = f"NPU.{PROLOG_OP}.1.forward.input.{(1, 2, 4)[i]}.pt"
        assert f"load({name!r}, nz=True)" in script
        assert torch.equal(torch.load(repro / "tensors" / name, weights_only=True),
                           prolog_weights(torch, 0, 0, 1)[arg])
    monkeypatch.setitem(sys.modules, "torch_npu", drop_in)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(repro / "repro.py"), run_name="__main__")
    assert exit_.value.code == 1
    emu_data = tmp_path / "emu" / "step1" / "rank0" / "dump_tensor_data"
    result = torch.load(repro / "result_emu.pt", weights_only=True)
    assert len(result) == 5
    for j, t in enumerate(result):
        mine = torch.load(emu_data / f"NPU.{PROLOG_OP}.1.forward.output.{j}.pt", weights_only=True)
        assert t.dtype == mine.dtype and torch.equal(t, mine)


def test_weights_file_with_a_name_map(dump, tmp_path):
    """``--weights`` wins over the dump: weight_dq under a checkpoint's name, stored [out, in]
    (used transposed), the others under the default ``layers.{layer}.{arg}``."""
    state = {}
    for layer in range(LAYERS):
        w = prolog_weights(torch, 0, 0, layer)
        state[f"model.layers.{layer}.q_a_proj.weight"] = w["weight_dq"].T.contiguous()
        state[f"layers.{layer}.weight_uq_qr"] = w["weight_uq_qr"]
        state[f"layers.{layer}.weight_dkv_kr"] = w["weight_dkv_kr"]
    torch.save(state, tmp_path / "w.pt")
    (tmp_path / "map.json").write_text(json.dumps({"weight_dq": "model.layers.{layer}.q_a_proj.weight"}))
    rc, rep = _replay(dump, tmp_path / "emu", "--filter", PROLOG_OP, "--steps", "0", "--weights",
                      str(tmp_path / "w.pt"), "--weight-map", str(tmp_path / "map.json"))
    assert rc == 0 and [c["status"] for c in rep["calls"]] == ["identical"] * LAYERS
    for layer, c in enumerate(rep["calls"]):
        assert c["weights"] == {
            "weight_dq": f"--weights {tmp_path / 'w.pt'}[model.layers.{layer}.q_a_proj.weight] transposed",
            "weight_uq_qr": f"--weights {tmp_path / 'w.pt'}[layers.{layer}.weight_uq_qr]",
            "weight_dkv_kr": f"--weights {tmp_path / 'w.pt'}[layers.{layer}.weight_dkv_kr]"}


def test_an_ambiguous_or_absent_cast_is_not_chosen():
    from ascend_emu.compare.nz_weights import Cast, choose_cast

    node = {"shape": [4, 8], "dtype": "torch.bfloat16", "Max": None, "Min": None, "Mean": None, "Norm": None}
    casts = [Cast((4, 8), "torch.bfloat16", (float(i), 0.0, 0.0, 1.0), f"/w{i}.pt", f"c{i}") for i in range(3)]
    same = [Cast((4, 8), "torch.bfloat16", (1.0, 0.0, 0.0, 1.0), f"/w{i}.pt", f"c{i}") for i in range(3)]
    assert choose_cast(same, node, 1, 2)[0] is same[0]  # one tensor cast three times
    assert choose_cast(casts, node, 1, 3)[0] is casts[1]  # layer order
    cast, why = choose_cast(casts, node, 1, 2)
    assert cast is None and "3 distinct" in why and "ambiguous" in why and "--weights" in why
    cast, why = choose_cast(casts, {**node, "shape": [8, 4]}, 0, 1)
    assert cast is None and "no npu_format_cast(x, 29) of shape [8, 4] bfloat16" in why
