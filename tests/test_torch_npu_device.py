"""What ``tensor.device`` reports on the emulated NPU (the real ``npu`` device, the default:
:class:`~ascend_emu.torch_npu._npu_tensor.NPUTensor`), ``torch.Generator(device="npu")``, and
``torch.save`` / ``torch.load`` of NPU tensors with their format (torch_npu saves an NPU
tensor's values in ND order plus its format as metadata, and restores both when the load puts
it back on the NPU; a load mapped to the CPU gives a plain host tensor)."""

from __future__ import annotations

import copy
import io
import pickle
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.emu.matmul import weight_f32  # noqa: E402
from ascend_emu.layouts import NZArray, nd_to_nz  # noqa: E402
from ascend_emu.torch_npu._convert import to_numpy  # noqa: E402

NPU0 = torch.device("npu", 0)
CPU = torch.device("cpu")


# ------------------------------------------------------------------------------ tensor.device
def test_device_reports_npu_for_tensors_on_the_npu():
    host = torch.arange(6.0).reshape(2, 3)
    on_npu = [host.npu(), host.to("npu"), host.to(device="npu:0"), torch.zeros(2, device="npu"),
              torch.randn(2, device=torch.device("npu")), host.new_ones(3, device="npu"),
              torch_npu.npu_format_cast(host.npu(), 2), torch.nn.Parameter(host.npu())]
    for t in on_npu:
        assert t.device == NPU0 and t.device.type == "npu" and t.is_npu and not t.is_cpu
    assert isinstance(on_npu[-1], torch.nn.Parameter)
    assert host.device == CPU and host.npu().cpu().device == CPU and host.npu().to("cpu").device == CPU
    assert type(host.npu().cpu()) is torch.Tensor and not host.npu().cpu().is_npu
    assert "device='npu:0'" in repr(host.npu()) and "device=" not in repr(host)
    # an all-CPU call of an NPU op keeps working and stays on the CPU (the pytest plugin and CPU unit tests)
    assert torch_npu.npu_format_cast(host, 2).device == CPU


def test_results_views_detach_state_dict_and_grads_are_on_the_npu():
    x = torch.arange(4.0).npu()
    for t in (x + 1, x[1:], x.detach(), x.view(2, 2).T, torch.empty_like(x), x.abs().half(), x.sum()):
        assert t.device == NPU0 and t.is_npu
    assert torch.nn.Linear(2, 2).to("npu").state_dict()["weight"].device == NPU0
    w = torch.ones(3).npu().requires_grad_()
    (w * 2).sum().backward()
    assert w.grad.device == NPU0 and w.grad.cpu().tolist() == [2.0] * 3
    torch.testing.assert_close(x.npu() + 1, (torch.arange(4.0) + 1).npu())
    with pytest.raises(AssertionError, match="device"):  # a golden left on the host: a mismatch, as on the NPU
        torch.testing.assert_close(x + 1, torch.arange(4.0) + 1)


def test_device_idioms_keep_working():
    x = torch.arange(4.0).npu()
    z = torch.zeros(3, device=x.device)
    assert z.device == NPU0 and torch.equal(z, torch.zeros(3).npu())
    host = torch.ones(2)
    moved = host.to(x.device)
    assert moved.device == NPU0 and moved.data_ptr() != host.data_ptr()
    back = x.to(host.device)
    assert back.device == CPU and back.data_ptr() != x.data_ptr() and torch.equal(back, torch.arange(4.0))
    assert torch.empty_like(x).device == NPU0 and torch.empty_like(host).device == CPU


def _train(device, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = torch.linspace(-1, 1, 32).reshape(4, 8).to(device)
    for _ in range(steps):
        opt.zero_grad()
        model(data).square().mean().backward()
        opt.step()
    return model, opt


def test_module_to_npu_trains_like_the_host_and_round_trips_through_save():
    model, opt = _train("npu")
    ref, _ = _train("cpu")
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert p.device == NPU0 and p.grad.device == NPU0
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-6, atol=1e-7)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf)
    model2, opt2 = _train("npu", steps=0)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    for p, q in zip(model2.parameters(), model.parameters(), strict=True):
        assert p.device == NPU0 and torch.equal(p, q)


class _Scale(torch.nn.Module):
    def forward(self, x, w):
        return (x @ w).relu() + torch.ones(1, device=x.device), x.device.type


def test_compile_fullgraph_with_npu_inputs():
    x = torch.linspace(-1, 1, 32).reshape(4, 8).npu()
    w = torch.linspace(1, -1, 24).reshape(8, 3).to("npu")
    torch._dynamo.reset()
    got, kind = torch.compile(_Scale(), backend="aot_eager", fullgraph=True)(x, w)
    want, eager_kind = _Scale()(x, w)
    assert torch.equal(got, want)
    # compiled code sees the device the tensors are on
    assert (kind, eager_kind) == ("npu", "npu") and got.device == NPU0


# ------------------------------------------------------------------------------ torch.Generator
def test_generator_on_npu_is_a_seeded_cpu_generator():
    g = torch.Generator(device="npu")
    assert isinstance(g, torch.Generator) and isinstance(g, torch._C.Generator) and g.device == NPU0
    assert isinstance(torch.default_generator, torch.Generator) and type(torch.Generator()) is torch._C.Generator
    assert torch.Generator("cpu").device == CPU
    assert g.manual_seed(7) is g
    got = torch.randn(5, generator=g, device="npu")
    want = torch.randn(5, generator=torch._C.Generator().manual_seed(7))
    assert got.device == NPU0 and torch.equal(got.cpu(), want)
    state = g.get_state()
    a = torch.rand(3, generator=g)
    g.set_state(state)
    assert torch.equal(torch.rand(3, generator=g), a)
    g.set_state(state)
    for twin in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):
        assert twin.device == NPU0 and torch.equal(torch.rand(3, generator=twin), a)
    with pytest.raises(ValueError, match="index in"):
        torch.Generator(device="npu:1")


# ------------------------------------------------------------------------------ torch.save / load
def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def _stored_bytes(buf: io.BytesIO) -> bytes:
    """The one storage record of a ``torch.save`` archive, as written."""
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        (name,) = [n for n in z.namelist() if "/data/" in n]
        return z.read(name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int8])
def test_nz_tensor_saves_nd_values_and_reloads_as_nz(dtype):
    nd = (torch.arange(48 * 40) % 251 - 125).reshape(48, 40).to(dtype)
    nz = torch_npu.npu_format_cast(nd.npu(), 29)
    buf = _saved(nz)
    stored = _stored_bytes(buf)
    assert stored == nd.contiguous().view(torch.uint8).numpy().tobytes()  # ND order, as torch_npu's D2H copy
    assert stored != nd_to_nz(to_numpy(nd)).tobytes()  # (the shape is one where NZ order differs)
    for weights_only in (True, False):
        buf.seek(0)
        back = torch.load(buf, weights_only=weights_only)
        assert torch_npu.get_npu_format(back) == 29 and back.device == NPU0 and torch.equal(back.cpu(), nd)
        arr = to_numpy(back)
        assert isinstance(arr, NZArray) and arr.ctypes.data == back.data_ptr()
        np.testing.assert_array_equal(weight_f32(arr), nd.float().numpy())


@pytest.mark.parametrize("map_location", ["cpu", torch.device("cpu"), {"npu:0": "cpu"}])
def test_load_mapped_to_cpu_gives_plain_host_tensors(map_location):
    nd = torch.linspace(-2, 2, 32 * 16).reshape(32, 16)
    buf = _saved({"w": torch_npu.npu_format_cast(nd.npu(), 29), "x": nd.npu()})
    back = torch.load(buf, map_location=map_location)
    for t in back.values():
        assert t.device == CPU and not t.is_npu and torch_npu.get_npu_format(t) == 2 and torch.equal(t, nd)
        assert not isinstance(to_numpy(t), NZArray)


def test_callable_map_location_loads_host_tensors_and_refuses_npu_ones():
    """Documented difference: an NPU tensor is saved as torch saves a PrivateUse1 tensor without
    storage, whose load torch refuses under a callable ``map_location`` (host tensors load)."""
    nd = torch.linspace(-2, 2, 8)
    assert torch.equal(torch.load(_saved(nd), map_location=lambda storage, loc: storage), nd)
    with pytest.raises(RuntimeError, match="Callable map_location not supported"):
        torch.load(_saved(nd.npu()), map_location=lambda storage, loc: storage)


def test_load_keeps_locations_and_other_formats_and_maps_everything_to_npu_on_request():
    nd = torch.rand(2, 3, 4, 4)
    buf = _saved([torch_npu.npu_format_cast(nd.npu(), 3), nd.npu(), nd])
    fmt, on_npu, host = torch.load(buf)
    assert torch_npu.get_npu_format(fmt) == 3 and fmt.device == NPU0 and torch.equal(fmt.cpu(), nd)
    assert on_npu.device == NPU0 and torch_npu.get_npu_format(on_npu) == 2
    assert host.device == CPU and not host.is_npu and torch.equal(host, nd)
    buf.seek(0)
    loaded = torch.load(buf, map_location="npu:0")  # every storage restored on the NPU
    assert [t.device for t in loaded] == [NPU0] * 3 and torch_npu.get_npu_format(loaded[0]) == 3
    buf.seek(0)
    model = torch.load(_saved(torch.nn.Linear(2, 2)), map_location=torch.device("npu"), weights_only=False)
    assert model.weight.device == NPU0


def test_nz_parameter_save_and_load_state_dict_into_nz_parameter():
    layer = torch.nn.Linear(32, 16, bias=False).to("npu")
    layer.weight.data = torch_npu.npu_format_cast(layer.weight.data.to(torch.bfloat16), 29)
    trained = layer.weight.detach().clone()
    param = torch.load(_saved(layer.weight))
    assert isinstance(param, torch.nn.Parameter) and torch_npu.get_npu_format(param) == 29
    assert torch.equal(param, trained) and param.device == NPU0

    fresh = torch.nn.Linear(32, 16, bias=False).to("npu")
    fresh.weight.data = torch_npu.npu_format_cast(torch.zeros(16, 32, dtype=torch.bfloat16).npu(), 29)
    stale = weight_f32(to_numpy(fresh.weight))  # widening of the zeros, cached on the NZArray
    fresh.load_state_dict(torch.load(_saved(layer.state_dict())))
    assert torch_npu.get_npu_format(fresh.weight) == 29 and fresh.weight.device == NPU0
    assert torch.equal(fresh.weight, trained) and not np.array_equal(stale, trained.float().cpu().numpy())
    np.testing.assert_array_equal(weight_f32(to_numpy(fresh.weight)), trained.float().cpu().numpy())

    whole = torch.load(_saved(layer), weights_only=False)
    assert torch_npu.get_npu_format(whole.weight) == 29 and torch.equal(whole.weight, trained)


def test_copies_keep_format_and_device():
    nd = torch.rand(32, 16, dtype=torch.float16)
    nz = torch_npu.npu_format_cast(nd.npu(), 29)
    for c in (copy.deepcopy(nz), copy.copy(nz), pickle.loads(pickle.dumps(nz))):
        assert torch_npu.get_npu_format(c) == 29 and c.device == NPU0 and torch.equal(c.cpu(), nd)
        assert to_numpy(c).ctypes.data == c.data_ptr()
    assert copy.deepcopy(nz).data_ptr() != nz.data_ptr()
