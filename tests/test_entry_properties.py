"""Property: every call through the drop-in's entry points either gives the reference result or
is rejected naming the argument, with nothing written.

Hypothesis draws an entry point (``torch_npu.<op>``, ``torch.ops.npu.<op>``, a ``_functional``
form, the ``.out`` / ``_v2.out`` forms, ``torch.ops.custom`` / ``torch.ops._C_ascend``), a valid base call of it and one
mutation of one argument from these categories:

- ``meta``: every tensor meta (the fake kernel: meta outputs of the reference's shapes and dtypes),
  or one tensor meta beside real ones (rejected naming it);
- ``overlap``: an input moved into the memory of an output or cache the call writes, holding the
  same values, or two written tensors sharing memory (rejected naming one of the pair);
- ``huge`` / ``broadcast``: a 2^31-row stride-0 view (rejected naming it), or a small stride-0 /
  strided view holding the same values (the reference result, or rejected naming it);
- ``kind``: a value of another kind (list, float, str, an int past int64), or a tensor view with
  a lazy negative bit (rejected naming it).

Rejected: an ascend_emu error whose message starts with the argument's name, and every real
tensor of the call byte-identical to before. Accepted: each output equals the independent
reference (``tests/reference``) bit for bit, and no tensor the call does not write changed.
The examples are derandomized and few (``max_examples`` 40), so the suite stays deterministic and
cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import ascend_emu.torch_npu as tnpu  # noqa: E402
from ascend_emu.errors import AscendEmuError  # noqa: E402
from ascend_emu.torch_npu import to_numpy, to_torch  # noqa: E402
from tests.reference import dynamic_quant as dq_ref  # noqa: E402
from tests.reference import paged_cache as pc_ref  # noqa: E402
from tests.reference import rope as rope_ref  # noqa: E402
from tests.reference.fused_infer_attention import reference as fia_ref  # noqa: E402
from tests.test_fused_infer_attention_score import make_case  # noqa: E402

HUGE = 1 << 31


@dataclass
class Entry:
    """One entry point's valid base call.

    ``call(**args)`` runs it; ``tensors``: the tensor arguments (schema kinds ``Tensor``),
    ``scalars``: the other arguments by schema kind; ``written``: the tensors it writes
    (caches, out=); ``want``: the reference, by output index (returned outputs) or by written
    tensor name; ``huge``: the arguments whose 2^31-row broadcast must be refused by the size
    bound; ``shaped``: the arguments a stride-0 view of equal values may replace.
    """

    name: str
    call: Callable
    args: dict
    tensors: tuple[str, ...]
    scalars: dict = field(default_factory=dict)
    written: tuple[str, ...] = ()
    want: dict = field(default_factory=dict)
    huge: tuple[str, ...] = ()
    shaped: tuple[str, ...] = ()


def _np(t):
    return to_numpy(t).copy()


def _dynamic_quant(route):
    x = torch.tensor(np.random.default_rng(1).standard_normal((4, 16)), dtype=torch.float16)
    smooth = torch.full((16,), 1.25, dtype=torch.float16)  # one value: a stride-0 view holds the same
    y, scale = dq_ref.dynamic_quant(_np(x), _np(smooth))
    op = tnpu.npu_dynamic_quant if route == "torch_npu" else torch.ops.npu.npu_dynamic_quant
    return Entry(f"{route}.npu_dynamic_quant", lambda **a: op(a.pop("input"), **a),
                 {"input": x, "smooth_scales": smooth}, ("input", "smooth_scales"), {}, (), {0: y, 1: scale},
                 huge=("input",), shaped=("smooth_scales",))


def _rotary_mul(route):
    rng = np.random.default_rng(2)
    x = torch.tensor(rng.standard_normal((2, 3, 4, 8)), dtype=torch.float16)
    r1 = torch.tensor(np.repeat(rng.standard_normal((1, 1, 4, 8)), 3, axis=1).repeat(2, axis=0), dtype=torch.float16)
    r2 = torch.tensor(np.repeat(rng.standard_normal((1, 1, 4, 8)), 3, axis=1).repeat(2, axis=0), dtype=torch.float16)
    want = rope_ref.rotary_mul(_np(x), _np(r1), _np(r2), "half")
    op = tnpu.npu_rotary_mul if route == "torch_npu" else torch.ops.npu.npu_rotary_mul
    return Entry(f"{route}.npu_rotary_mul", lambda **a: op(a.pop("self"), a.pop("r1"), a.pop("r2"), **a),
                 {"self": x, "r1": r1, "r2": r2}, ("self", "r1", "r2"), {"rotary_mode": "str"}, (), {0: want},
                 huge=("self", "r1", "r2"), shaped=("r1", "r2"))


def _scatter(route):
    rng = np.random.default_rng(3)
    key = torch.tensor(rng.standard_normal((3, 2, 16)), dtype=torch.float16)
    value = torch.tensor(rng.standard_normal((3, 2, 16)), dtype=torch.float16)
    kc, vc = torch.full((4, 16, 2, 16), 7.0, dtype=torch.float16), torch.full((4, 16, 2, 16), 5.0, dtype=torch.float16)
    slots = torch.tensor([5, 17, 40], dtype=torch.int32)
    wk, wv = pc_ref.scatter(_np(key), _np(value), _np(kc), _np(vc), _np(slots), "Norm")
    op = tnpu.npu_scatter_pa_kv_cache if route == "torch_npu" else torch.ops.npu.npu_scatter_pa_kv_cache
    return Entry(f"{route}.npu_scatter_pa_kv_cache",
                 lambda **a: op(a.pop("key"), a.pop("value"), a.pop("key_cache"), a.pop("value_cache"),
                                a.pop("slot_mapping"), **a),
                 {"key": key, "value": value, "key_cache": kc, "value_cache": vc, "slot_mapping": slots,
                  "cache_mode": "Norm"},
                 ("key", "value", "key_cache", "value_cache", "slot_mapping"), {"cache_mode": "str"},
                 ("key_cache", "value_cache"), {"key_cache": wk, "value_cache": wv})


def _scatter_functional(route):
    base = _scatter(route)
    op = (tnpu.npu_scatter_pa_kv_cache_functional if route == "torch_npu"
          else torch.ops.npu.npu_scatter_pa_kv_cache_functional)
    return Entry(f"{route}.npu_scatter_pa_kv_cache_functional",
                 lambda **a: op(a.pop("key"), a.pop("value"), a.pop("key_cache"), a.pop("value_cache"),
                                a.pop("slot_mapping"), **a),
                 base.args, base.tensors, base.scalars, (), {0: base.want["key_cache"], 1: base.want["value_cache"]})


_FIA = {}


def _fia_case():
    if not _FIA:
        q, k, v, kw = make_case(np.random.default_rng(4), "BSND", 4, ml_dtypes.bfloat16, n=8, exact=True)
        r = {n: x for n, x in kw.items() if n not in ("query_rope", "key_rope", "block_size", "atten_mask")}
        out, lse = fia_ref(q, k, v, kw["query_rope"], kw["key_rope"], **r)
        _FIA.update(q=q, k=k, kw=kw, out=out, lse=lse)
    return _FIA


def _fia(form):
    c = _fia_case()
    kw = c["kw"]
    t = to_torch
    tensors = {"query": t(c["q"].copy()), "key": t(c["k"].copy()), "query_rope": t(kw["query_rope"].copy()),
               "key_rope": t(kw["key_rope"].copy()), "block_table": t(kw["block_table"].copy())}
    out = torch.full(tuple(c["out"].shape), 3.0, dtype=torch.bfloat16)
    lse = torch.full(tuple(c["lse"].shape), 3.0, dtype=torch.float32)
    if form == "v2.out":
        names = dict(num_query_heads=8, softmax_scale=kw["scale"], actual_seq_kvlen=kw["actual_seq_lengths_kv"],
                     return_softmax_lse=True)
        op = tnpu.npu_fused_infer_attention_score_v2.out
        scalars = {"num_query_heads": "int", "softmax_scale": "float", "actual_seq_kvlen": "List[int]",
                   "return_softmax_lse": "bool", "input_layout": "str"}
    else:
        names = dict(num_heads=8, scale=kw["scale"], actual_seq_lengths_kv=kw["actual_seq_lengths_kv"],
                     softmax_lse_flag=True)
        op = tnpu.npu_fused_infer_attention_score.out
        scalars = {"num_heads": "int", "scale": "float", "actual_seq_lengths_kv": "List[int]",
                   "softmax_lse_flag": "bool", "input_layout": "str"}

    def call(**a):
        return op(a.pop("query"), a.pop("key"), a.pop("value"), workspace=None,
                  out=[a.pop("attention_out"), a.pop("softmax_lse")], **a)

    args = {**tensors, "value": tensors["key"], "attention_out": out, "softmax_lse": lse, **names,
            "num_key_value_heads": 1, "input_layout": "BSND", "block_size": 16}
    return Entry(f"npu_fused_infer_attention_score{'_v2' if form == 'v2.out' else ''}.out", call, args,
                 (*tensors, "attention_out", "softmax_lse"), scalars, ("attention_out", "softmax_lse"),
                 {"attention_out": c["out"], "softmax_lse": c["lse"]})


def _indexer(ns):
    """Scores without ties: key position s holds s + 1 in dim 0, the query and weights are ones
    there, so the top 4 are the last four positions of each batch."""
    from tests.reference.lightning_indexer import lightning_indexer as indexer_ref

    q = np.zeros((2, 1, 64, 128), ml_dtypes.bfloat16)
    q[..., 0] = 1
    k = np.zeros((2, 8, 1, 128), ml_dtypes.bfloat16)
    k[:, :, 0, 0] = np.arange(1, 9)
    w = np.ones((2, 1, 64), ml_dtypes.bfloat16)
    want = indexer_ref(q, k, w, sparse_count=4, sparse_mode=3)[0]
    op = getattr(torch.ops, ns).npu_lightning_indexer
    return Entry(f"torch.ops.{ns}.npu_lightning_indexer", lambda **a: op(a.pop("query"), a.pop("key"), a.pop("weights"), **a),
                 {"query": to_torch(q), "key": to_torch(k), "weights": to_torch(w), "sparse_count": 4},
                 ("query", "key", "weights"), {"sparse_count": "int"}, (), {0: want})


ENTRIES = {
    "dynamic_quant": lambda: _dynamic_quant("torch_npu"), "dynamic_quant_ops": lambda: _dynamic_quant("torch.ops"),
    "rotary_mul": lambda: _rotary_mul("torch_npu"), "rotary_mul_ops": lambda: _rotary_mul("torch.ops"),
    "scatter": lambda: _scatter("torch_npu"), "scatter_ops": lambda: _scatter("torch.ops"),
    "scatter_functional": lambda: _scatter_functional("torch_npu"),
    "fia.out": lambda: _fia("out"), "fia_v2.out": lambda: _fia("v2.out"),
    "indexer_custom": lambda: _indexer("custom"), "indexer_c_ascend": lambda: _indexer("_C_ascend"),
}

#: Values of the wrong kind per schema kind.
WRONG = {"Tensor": ([1.5, 2.5], "x", 1.5, 1 << 63), "int": (2.5, "x", 1 << 63, [1]), "float": ("x", [1.0]),
         "bool": (2.5, "x"), "str": (1, [1]), "List[int]": ([1.5, 2.0], 1 << 63, "x", [1, 1 << 63])}


def _bytes(t: torch.Tensor) -> bytes:
    """The bytes of ``t``'s whole storage (a stride-0 view: its one row)."""
    if t.device.type != "cpu":
        return b""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy().tobytes()


def _same_memory_view(target: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A view into ``target``'s storage with ``like``'s shape, dtype and values (``target`` must
    hold enough bytes)."""
    flat = target.view(-1).view(torch.uint8)[:like.numel() * like.element_size()]
    view = flat.view(like.dtype).view(like.shape)
    view.copy_(like)
    return view


def _mutations(entry: Entry):
    """Every mutation of ``entry``'s base call: ``(label, names it may be rejected by, expect, change)``;
    expect is ``"reject"``, ``"meta"`` or ``"either"``; change(args) mutates them in place (and may
    return the expectation instead)."""
    out = [("meta all", (), "meta",
            lambda a: a.update({n: v.to("meta") for n, v in a.items() if isinstance(v, torch.Tensor)}))]
    for n in entry.tensors:
        out.append((f"meta {n}", (n,), "reject", lambda a, n=n: a.update({n: a[n].to("meta")})))
        for w in WRONG["Tensor"]:
            out.append((f"kind {n}={w!r:.20}", (n,), "reject", lambda a, n=n, w=w: a.update({n: w})))
        out.append((f"negative bit {n}", (n,), "reject", lambda a, n=n: a.update({n: a[n]._neg_view()})))
    for n, kind in entry.scalars.items():
        for w in WRONG[kind]:
            out.append((f"kind {n}={w!r:.20}", (n,), "reject", lambda a, n=n, w=w: a.update({n: w})))
    reads = [n for n in entry.tensors if n not in entry.written]
    for wn in entry.written:
        for rn in reads:
            def inside(a, rn=rn, wn=wn):
                if a[wn].nbytes < a[rn].nbytes:
                    return "either"  # too small to hold it: the base call, unchanged
                a[rn] = _same_memory_view(a[wn], a[rn])
                return "reject"
            out.append((f"overlap {rn} in {wn}", (rn, wn), "either", inside))
    if len(entry.written) == 2:
        a_name, b_name = entry.written

        def shared(a):
            small, big = sorted((a_name, b_name), key=lambda n: a[n].nbytes)
            a[small] = a[big].view(-1).view(torch.uint8)[:a[small].nbytes].view(a[small].dtype).view(a[small].shape)
        out.append(("overlap outputs", entry.written, "reject", shared))
    if entry.huge:
        def huge(a):
            for n in entry.huge:  # together, so the shapes still fit each other
                a[n] = a[n][:1].expand(HUGE, *a[n].shape[1:])
        out.append((f"huge {entry.huge}", entry.huge[:1], "reject", huge))
    for n in entry.shaped:
        def broadcast(a, n=n):
            a[n] = a[n].reshape(-1)[:1].expand(a[n].numel()).view(a[n].shape) if a[n].dim() == 1 else \
                a[n][:1].expand(a[n].shape)
        out.append((f"broadcast {n}", (n,), "either", broadcast))
    for n in reads:
        def strided(a, n=n):
            wide = torch.zeros((*a[n].shape[:-1], 2 * a[n].shape[-1]), dtype=a[n].dtype)
            wide[..., ::2] = a[n]
            a[n] = wide[..., ::2]
        out.append((f"strided {n}", (n,), "either", strided))
    return out


def _check_result(entry: Entry, got, args):
    outs = got if isinstance(got, (tuple, list)) else (got,)
    for key, want in entry.want.items():
        value = args[key] if isinstance(key, str) else outs[key]
        np.testing.assert_array_equal(to_numpy(value).view(np.uint8), np.ascontiguousarray(want).view(np.uint8),
                                      err_msg=f"{entry.name}: {key}")


def _run(entry_key: str, index: int):
    entry = ENTRIES[entry_key]()
    mutations = _mutations(entry)
    label, names, expect, change = mutations[index % len(mutations)]
    args = dict(entry.args)
    expect = change(args) or expect
    real = {n: v for n, v in args.items() if isinstance(v, torch.Tensor) and v.device.type == "cpu"}
    real.update({n: v for n, v in entry.args.items() if n in entry.written})  # the caller's outputs
    before = {n: _bytes(v) for n, v in real.items()}
    try:
        got = entry.call(**dict(args))
    except AscendEmuError as error:
        assert expect in ("reject", "either"), f"{entry.name} [{label}]: rejected: {error}"
        msg = str(error)
        assert any(msg.startswith(f"{n}: ") or msg.startswith(f"{n}[") for n in names), \
            f"{entry.name} [{label}]: the error does not name {names}: {msg[:300]}"
        assert len(msg) < 600 and "\n" not in msg, msg[:600]
        changed = [n for n, v in real.items() if _bytes(v) != before[n]]
        assert not changed, f"{entry.name} [{label}]: rejected after writing {changed}"
        return
    except Exception as error:  # noqa: BLE001  (anything else is an error that is not ascend_emu's)
        raise AssertionError(f"{entry.name} [{label}]: {type(error).__name__}: {str(error)[:300]}") from None
    assert expect in ("meta", "either"), f"{entry.name} [{label}]: accepted"
    if expect == "meta":
        outs = got if isinstance(got, (tuple, list)) else (got,)
        for key, want in entry.want.items():
            if isinstance(key, int):
                assert outs[key].is_meta and tuple(outs[key].shape) == want.shape, (entry.name, key)
        return
    _check_result(entry, got, args)
    for n, v in real.items():
        if n not in entry.written and not any(v.untyped_storage().data_ptr() == args[w].untyped_storage().data_ptr()
                                              for w in entry.written):
            assert _bytes(v) == before[n], f"{entry.name} [{label}]: {n} changed"


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(entry=st.sampled_from(sorted(ENTRIES)), index=st.integers(0, 200))
def test_every_call_is_the_reference_or_rejected_naming_the_argument(entry, index):
    _run(entry, index)


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_every_mutation_of_one_entry(entry):
    """Each mutation of each entry once (the exhaustive form of the property above)."""
    for index in range(len(_mutations(ENTRIES[entry]()))):
        _run(entry, index)
