"""The per-call fast paths of the MLA prolog / MlaPreprocess contracts and backends against the
general code they replace: the in-order scatter against the reference layout code, the compiled
slot pass of ``slots_from_cache_index`` (values and error messages), and the memoised
contract path (second call of a signature) against the first call, byte for byte."""

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.emu.kernels import scatter_rows
from ascend_emu.errors import DTypeError, IndexRangeError
from ascend_emu.layouts import CacheLayout, slots_from_cache_index
from ascend_emu.ops import mla_prolog as prolog_contract
from tests.reference.kv_rmsnorm_rope_cache import scatter as ref_scatter

BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("mode, dim, itemsize", [("PA_NZ", 512, 2), ("PA_BSND", 64, 2), ("PA_NZ", 512, 1),
                                                 ("PA_BSND", 656, 1)])
def test_in_order_scatter_equals_reference(rng, mode, dim, itemsize):
    """Skipped tokens and a slot written by two tokens (the last wins), ND and NZ, bf16 and int8
    rows: the bytes the reference's layout code writes."""
    bs, nb, t = 16, 3, 9
    dtype = BF16 if itemsize == 2 else np.int8
    rows = rng.integers(-100, 100, (t, dim)).astype(dtype)  # [T, D]
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)  # [T]
    slots[2], slots[6] = -1, slots[4]  # a skip, a duplicate (token 6 wins)
    layout = CacheLayout.from_declared(mode, (nb, bs, 1, dim), itemsize)
    start = rng.integers(-100, 100, (nb, bs, 1, dim)).astype(dtype)  # [BlockNum, BlockSize, 1, D]
    want = ref_scatter(start, rows, slots, mode, bs)
    cache = start.copy()
    scatter_rows(cache, rows, slots, layout)
    assert cache.tobytes() == want.tobytes()


@pytest.mark.parametrize("index", [np.array([3, -1, 5, 3]), np.array([[0, 9]], np.int32), np.zeros(0, np.int64),
                                   np.array([1, 2], np.int16), np.array([[1, 2], [3, 4]])[:, ::-1]])
def test_slots_from_cache_index_good(index):
    """Good indices, on the compiled pass (int32 / int64) and the NumPy one (int16), 2-D and
    strided ones too: the int64 values, token-major."""
    got = slots_from_cache_index(index, 10, name="idx")
    assert got.dtype == np.int64 and got.tolist() == [int(v) for v in index.reshape(-1)]


@pytest.mark.parametrize("index, where", [(np.array([7, 10]), r"idx\[1\] = 10"), (np.array([-2]), r"idx\[0\] = -2"),
                                          (np.array([[1, 2], [3, 99]], np.int32), r"idx\[1, 1\] = 99")])
def test_slots_from_cache_index_bad(index, where):
    """A bad value on the compiled pass is reported as the NumPy check reports it: the first bad
    entry by its coordinates; a -1 is refused where skips are not allowed."""
    with pytest.raises(IndexRangeError, match=where):
        slots_from_cache_index(index, 10, name="idx")
    with pytest.raises(IndexRangeError, match=r"idx\[1\] = -1"):
        slots_from_cache_index(np.array([2, -1]), 10, name="idx", allow_skip=False)
    with pytest.raises(DTypeError):
        slots_from_cache_index(np.array([1.0, 2.0]), 10, name="idx")


def _prolog_case(rng, version):
    he, hcq, n = 7168, 1536, 2

    def randn(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)

    args = [randn(2, he), ops.npu_format_cast(randn(he, hcq, scale=he ** -0.5), 29),
            ops.npu_format_cast(randn(hcq, n * 192, scale=hcq ** -0.5), 29), randn(n, 128, 512, scale=128 ** -0.5),
            ops.npu_format_cast(randn(he, 576, scale=he ** -0.5), 29), randn(hcq), randn(512), randn(2, 64),
            randn(2, 64)]
    caches = (np.zeros((4, 16, 1, 512), BF16), np.zeros((4, 16, 1, 64), BF16))
    index = np.array([3, 40], np.int64)  # [T]

    def call(idx, kv, kr):
        if version == 3:
            return ops.npu_mla_prolog_v3(*args, kv, kr, cache_index=idx, cache_mode="PA_NZ", query_norm_flag=True)
        fn = ops.npu_mla_prolog if version == 1 else ops.npu_mla_prolog_v2
        return fn(*args, idx, kv, kr, cache_mode="PA_NZ")

    return call, index, caches


@pytest.mark.parametrize("version", [1, 2, 3])
def test_prolog_memoised_call_equals_first_call(rng, version):
    """The second call of a signature (memoised checks, trusted argument object) returns and
    writes the bytes the first (fully checked) call does; a bad index on the memoised path is
    rejected with the same message and writes nothing."""
    call, index, caches = _prolog_case(rng, version)
    prolog_contract._VALIDATED.clear()
    first = [c.copy() for c in caches]
    out1 = call(index, *first)
    second = [c.copy() for c in caches]
    out2 = call(index, *second)
    assert len(prolog_contract._VALIDATED) == 1
    for a, b in zip(out1 + tuple(first), out2 + tuple(second), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    bad = index.copy()
    bad[1] = 64  # BlockNum * BlockSize
    kept = [c.copy() for c in second]
    with pytest.raises(IndexRangeError, match=r"cache_index\[1\] = 64"):
        call(bad, *second)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(second, kept, strict=True))


def test_trusted_argument_object_needs_every_field():
    """The memoised paths build their argument objects without the dataclass ``__init__``: a field
    left out (or misspelt) is an error there, not an AttributeError in a backend later."""
    from ascend_emu.ops._check import trusted
    from ascend_emu.ops.mla_prolog import MlaPrologArgs

    with pytest.raises(TypeError, match="slots"):
        trusted(MlaPrologArgs, {f: None for f in MlaPrologArgs.__dataclass_fields__ if f != "slots"})
    with pytest.raises(TypeError, match="slotz"):
        trusted(MlaPrologArgs, {f: None for f in MlaPrologArgs.__dataclass_fields__ if f != "slots"}, slotz=None)
    args = trusted(MlaPrologArgs, {f: None for f in MlaPrologArgs.__dataclass_fields__})
    assert args.slots is None
