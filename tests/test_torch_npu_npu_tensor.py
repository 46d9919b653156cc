"""The ``npu`` device as a real torch device (:class:`ascend_emu.torch_npu._npu_tensor.NPUTensor`):
torch ops on NPU tensors give NPU tensors over the same CPU memory, a cpu / npu mix is rejected
as on the NPU, the emulated ops read the NPU tensors' memory without copies, ``torch.save`` /
``torch.load`` and ``torch.compile`` keep working."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.errors import AscendEmuError, DTypeError  # noqa: E402
from ascend_emu.torch_npu import _npu_tensor  # noqa: E402
from ascend_emu.torch_npu._npu_tensor import NPUTensor, to_npu  # noqa: E402

_npu_tensor.register_device()
NPU0 = torch.device("npu", 0)


def test_torch_ops_on_npu_tensors_return_npu_tensors():
    x = torch.arange(12.0).reshape(3, 4)
    torch.testing.assert_close(to_npu(x.clone()) + 1, to_npu(x + 1))
    n = to_npu(x.clone())
    for out in (n + 1, n.abs(), n.to(torch.float16), n[0], n.T, torch.empty_like(n), n.sum(), n.view(4, 3)):
        assert isinstance(out, NPUTensor) and out.device == NPU0
    host = n.cpu()
    assert type(host) is torch.Tensor and host.device.type == "cpu"
    np.testing.assert_array_equal(host.numpy(), x.numpy())
    with pytest.raises(AssertionError, match="device"):  # a golden left on the host is a mismatch, as on the NPU
        torch.testing.assert_close(n + 1, x + 1)


def test_views_and_in_place_ops_write_the_same_memory():
    x = torch.zeros(2, 3)
    n = to_npu(x)
    n[1].add_(5)
    assert x[1].tolist() == [5.0, 5.0, 5.0] and x[0].tolist() == [0.0, 0.0, 0.0]


def test_mixing_cpu_and_npu_tensors_raises_the_device_mismatch():
    n = to_npu(torch.ones(4))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*npu:0 and cpu"):
        n + torch.ones(4)
    assert (n + torch.tensor(2.0)).device == NPU0  # a 0-dim host tensor is a scalar, as torch allows
    n.copy_(torch.full((4,), 3.0))  # host -> device copy
    assert n.cpu().tolist() == [3.0] * 4


def test_emulated_op_names_the_host_argument_and_reads_npu_memory_in_place():
    w = torch.randn(32, 32).to(torch.bfloat16)
    nz = torch.ops.npu.npu_format_cast(to_npu(w.clone()), 29)
    assert isinstance(nz, NPUTensor) and torch_npu.get_npu_format(nz._elem) == 29
    with pytest.raises(RuntimeError, match="self: expected a tensor on npu:0.*got a tensor on cpu") as exc:
        torch.ops.npu.npu_format_cast(w, nz)  # the host weight is the forgotten .npu()
    assert isinstance(exc.value, DTypeError) and isinstance(exc.value, AscendEmuError)
    x = torch.randn(4, 32).to(torch.bfloat16)
    y, scale = torch.ops.npu.npu_dynamic_quant(to_npu(x))
    y_ref, scale_ref = torch.ops.npu.npu_dynamic_quant(x)  # an all-CPU call keeps working
    assert y.device == scale.device == NPU0
    torch.testing.assert_close(y, to_npu(y_ref), rtol=0, atol=0)
    torch.testing.assert_close(scale, to_npu(scale_ref), rtol=0, atol=0)


def test_save_load_and_compile_keep_the_device():
    n = to_npu(torch.arange(6.0))
    buf = io.BytesIO()
    torch.save(n, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back.device == NPU0
    torch.testing.assert_close(back.cpu(), torch.arange(6.0))
    compiled = torch.compile(lambda t: t * 2 + 1, backend="aot_eager")
    out = compiled(n)
    assert isinstance(out, NPUTensor) and out.device == NPU0
    torch.testing.assert_close(out, to_npu(torch.arange(6.0) * 2 + 1))


def test_compiled_emulated_op_on_npu_tensors_matches_eager():
    """``torch.compile`` (fake tensors through ``__tensor_flatten__``, the op's fake kernel) of an
    emulated op on NPU tensors: outputs on the npu device, equal to the eager call's."""
    x = to_npu(torch.randn(4, 32).to(torch.bfloat16))
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: torch_npu.npu_dynamic_quant(t * 2), backend="aot_eager", fullgraph=True)
    y, scale = compiled(x)
    y_eager, scale_eager = torch_npu.npu_dynamic_quant(x * 2)
    assert isinstance(y, NPUTensor) and y.device == NPU0 and scale.device == NPU0
    torch.testing.assert_close(y, y_eager, rtol=0, atol=0)
    torch.testing.assert_close(scale, scale_eager, rtol=0, atol=0)


def _kv_args(block_num=4, block_size=16):
    g = torch.Generator().manual_seed(3)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    inputs = (randn(2, 1, 1, 576), randn(512), randn(2, 1, 1, 64), randn(2, 1, 1, 64), torch.tensor([5, 17]))
    caches = (randn(block_num, block_size, 1, 64), randn(block_num, block_size, 1, 512))
    return inputs, caches


@pytest.mark.parametrize("by_keyword", [False, True])
def test_eager_call_on_npu_tensors_returns_the_caches_and_new_npu_outputs(by_keyword):
    """``torch_npu.<op>`` on NPU tensors (the eager path, arguments by position or keyword): the
    caches written in place come back as the caller's NPU tensor objects, the new outputs are NPU
    tensors, and every byte equals the same call on CPU tensors."""
    inputs, caches = _kv_args()
    host_caches = tuple(c.clone() for c in caches)
    npu_inputs = tuple(to_npu(t.clone()) for t in inputs)
    npu_caches = tuple(to_npu(c.clone()) for c in caches)
    if by_keyword:
        out = torch_npu.npu_kv_rmsnorm_rope_cache(*npu_inputs[:4], index=npu_inputs[4], k_cache=npu_caches[0],
                                                  ckv_cache=npu_caches[1], cache_mode="PA_NZ", is_output_kv=True)
    else:
        out = torch_npu.npu_kv_rmsnorm_rope_cache(*npu_inputs, *npu_caches, cache_mode="PA_NZ", is_output_kv=True)
    ref = torch_npu.npu_kv_rmsnorm_rope_cache(*inputs, *host_caches, cache_mode="PA_NZ", is_output_kv=True)
    assert out[0] is npu_caches[0] and out[1] is npu_caches[1]
    assert all(type(o) is NPUTensor and o.device == NPU0 for o in out)
    assert all(type(r) is torch.Tensor and r.device.type == "cpu" for r in ref)
    for got, want in zip(out, ref, strict=True):
        assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
        assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("host", ["kv", "index", "ckv_cache"])
def test_eager_call_mixing_devices_names_the_host_argument_and_writes_nothing(host):
    inputs, caches = _kv_args()
    names = ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")
    args = {n: (t.clone() if n == host else to_npu(t.clone())) for n, t in zip(names, (*inputs, *caches), strict=True)}
    before = [args[n].cpu().clone() for n in ("k_cache", "ckv_cache")]
    positional = [args.pop(n) for n in names[:4]]
    with pytest.raises(RuntimeError, match=f"{host}: expected a tensor on npu:0.*got a tensor on cpu") as exc:
        torch_npu.npu_kv_rmsnorm_rope_cache(*positional, **args, cache_mode="PA_NZ")
    assert isinstance(exc.value, DTypeError)
    after = [args[n] for n in ("k_cache", "ckv_cache")]
    for b, a in zip(before, after, strict=True):
        assert torch.equal(b.view(torch.int16), a.cpu().view(torch.int16))


def test_new_outputs_keep_strides_and_storage_offset_of_their_memory():
    base = torch.arange(24.0).reshape(4, 6)
    views = (base[1:], base.T, base[:, ::2])  # an offset, a transposed and a strided view
    wrapped = _npu_tensor.wrap_outputs(views, {})
    for view, npu in zip(views, wrapped, strict=True):
        assert type(npu) is NPUTensor and npu.device == NPU0 and npu._elem is view
        assert npu.shape == view.shape and npu.stride() == view.stride()
        assert npu.storage_offset() == view.storage_offset()
        torch.testing.assert_close(npu.cpu(), view)
    n = to_npu(torch.ones(3))
    assert _npu_tensor.wrap_outputs((n._elem, [n._elem]), {"x": n}) == (n, [n])  # an argument's memory: the argument


_TENSOR_MODEL_SCRIPT = r"""
import torch
import torch_npu

x = torch.arange(12.0).reshape(3, 4)
torch.testing.assert_close(x.npu() + 1, (x + 1).npu())
for t in (x.npu(), x.to("npu"), x.to(device="npu:0"), torch.zeros(2, device="npu"), x.npu().abs(),
          x.npu().to(torch.float16), torch_npu.npu_format_cast(x.bfloat16().npu(), 29)):
    assert t.device == torch.device("npu", 0), t.device
assert x.npu().cpu().device.type == "cpu" and x.npu().to("cpu").device.type == "cpu"
try:
    x.npu() + x
except RuntimeError as exc:
    assert "Expected all tensors to be on the same device" in str(exc)
else:
    raise AssertionError("a cpu / npu mix must raise")
w = x.bfloat16().npu()
nz = torch_npu.npu_format_cast(w, 29)
assert torch_npu.get_npu_format(nz) == 29
try:
    torch_npu.npu_format_cast(x.bfloat16(), nz)
except RuntimeError as exc:
    assert "self: expected a tensor on npu:0" in str(exc), exc
else:
    raise AssertionError("a forgotten .npu() must raise")
q = torch.randn(4, 32).bfloat16()
y, scale = torch_npu.npu_dynamic_quant(q.npu())
y_cpu, scale_cpu = torch_npu.npu_dynamic_quant(q)  # an all-CPU call keeps working, on the CPU
assert y.device.type == "npu" and y_cpu.device.type == "cpu"
torch.testing.assert_close(y, y_cpu.npu(), rtol=0, atol=0)
m = torch.nn.Linear(4, 2).npu()
assert m.weight.device.type == "npu" and m(x.npu()).device.type == "npu"
import io
buf = io.BytesIO()
torch.save({"x": x.npu(), "nz": nz}, buf)
buf.seek(0)
back = torch.load(buf)  # weights_only: the file holds host values and "npu:0", as torch saves PrivateUse1
assert back["x"].device.type == "npu" and torch_npu.get_npu_format(back["nz"]) == 29
torch.testing.assert_close(back["nz"].cpu(), w.cpu(), rtol=0, atol=0)
buf.seek(0)
assert torch.load(buf, map_location="cpu")["x"].device.type == "cpu"
print("tensor model ok")
"""


def test_tensor_device_model_through_ascend_emu_run(tmp_path):
    """The default device model (``ASCEND_EMU_NPU_DEVICE`` unset): ``.npu()`` / ``.to("npu")`` / ``device="npu"`` /
    ``Module.npu()`` give :class:`NPUTensor`\\ s, and an unmodified torch_npu-style script meets a
    real device (``assert_close(x.npu() + 1, (x + 1).npu())``, a forgotten ``.npu()`` raising)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "tensor_model.py"
    script.write_text(_TENSOR_MODEL_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_EMU_NPU_DEVICE"}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", "run", str(script)], capture_output=True,
                          text=True, env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tensor model ok" in proc.stdout


def test_mark_model_is_still_selectable(tmp_path):
    """``ASCEND_EMU_NPU_DEVICE=mark``: the earlier model (CPU tensors marked as on the NPU; torch
    ops give host tensors; no mix rejected)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "mark_model.py"
    script.write_text("import torch, torch_npu\nx = torch.arange(4.0).npu()\n"
                      "assert type(x) is torch.Tensor and x.device.type == 'npu'\n"
                      "assert (x + 1).device.type == 'cpu' and (x + torch.ones(4)).device.type == 'cpu'\n"
                      "print('mark model ok')\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "ASCEND_EMU_NPU_DEVICE": "mark"}
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", "run", str(script)], capture_output=True,
                          text=True, env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mark model ok" in proc.stdout


def test_checked_mode_flags_an_all_cpu_call_of_an_npu_op():
    import warnings

    from ascend_emu import checked_mode
    from ascend_emu.errors import HostTensorWarning

    x = torch.randn(4, 32).to(torch.bfloat16)
    with checked_mode.checked():
        with pytest.warns(HostTensorWarning, match="npu_dynamic_quant: every tensor argument is on the CPU"):
            torch_npu.npu_dynamic_quant(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error", HostTensorWarning)
            torch_npu.npu_dynamic_quant(x.npu())  # on the NPU (either device model): no report
            torch_npu.npu_dynamic_quant(to_npu(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostTensorWarning)
        torch_npu.npu_dynamic_quant(x)  # checked mode off: nothing


_REAL_TORCH_NPU_SCRIPT = r"""
import sys, types
import torch
fake = types.ModuleType("torch_npu")  # stands for the real package: it brings its own device
torch.npu = types.SimpleNamespace(is_available=lambda: True)
sys.modules["torch_npu"] = fake
from ascend_emu.hw import runtime
_, mod = runtime()
assert mod is fake
assert "ascend_emu.torch_npu" not in sys.modules, "the drop-in was imported"
assert torch._C._get_privateuse1_backend_name() == "privateuseone", torch._C._get_privateuse1_backend_name()
print("real torch_npu left alone")
"""


def test_emulated_device_not_installed_with_the_real_torch_npu(tmp_path):
    """The ``hw`` backend takes the real torch_npu: nothing of the emulated device (no drop-in
    import, PrivateUse1 not renamed) is installed beside it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _REAL_TORCH_NPU_SCRIPT], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "real torch_npu left alone" in proc.stdout
