"""The pytest plugin's DeepSeek-V4 cache fixture: the caches of one layer hold, at the rows the
independent arithmetic below names, the bytes the independent reference encoders
(tests/reference/v4_quant.py) give for the tokens written; the compressed rows are what
``ops.compressor`` returns for the same tokens and weights (and within the dual criterion of the
float64 compressor of tests/reference/compressor.py); the state rows are the positions the state
table gives, holding the reference projections (kv, then score + ape); state block 0 is never
handed out.

Like tests/test_pytest_plugin.py, the checks run in a child pytest under ``-p
ascend_emu.pytest_plugin`` (the plugin replaces ``torch_npu`` for its whole process)."""

from __future__ import annotations

import pytest

from tests.test_pytest_plugin import _passed, _pytest

V4_CHECKS = '''
import ml_dtypes
import numpy as np
import pytest
import torch

from ascend_emu import ops
from tests.helpers import dual_threshold_ok
from tests.reference import compressor as cref
from tests.reference import v4_quant as ref


def _np(t):
    t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _slots(table, lens, bs):
    """slot of every position of every request, by hand: table[b, p // bs] * bs + p % bs."""
    return [[int(table[b, p // bs]) * bs + p % bs for p in range(n)] for b, n in enumerate(lens)]


def _rope_row(p):
    """cos / sin at position p, by hand: angle p * 40000 ** (-2i / 64), each frequency twice."""
    ang = np.repeat(p * 40000.0 ** (-np.arange(0, 64, 2) / 64.0), 2)
    return np.cos(ang), np.sin(ang)


def _check_compressor_rows(r, lens, ratio, key, rows, d):
    """rows (the fixture's, requests in order) == ops.compressor on the same tokens (fresh state),
    and within the dual criterion of the float64 reference."""
    coff = 2 if ratio == 4 else 1
    w = {k: _np(v) for k, v in r.weights[key].items()}
    x = _np(r.hidden)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    groups = [(b, g) for b, n in enumerate(lens) for g in range(n // ratio)]
    n_out = min(x.shape[0], x.shape[0] // ratio + len(lens))
    cos = np.ones((n_out, 64), np.float32)
    sin = np.zeros((n_out, 64), np.float32)
    for i, (b, g) in enumerate(groups):
        cos[i], sin[i] = _rope_row(g * ratio)
    state = np.zeros((2, 8, 2 * coff * d), np.float32)
    table = np.zeros((len(lens), -(-max(lens) // 8)), np.int32)  # every entry 0: no state written
    out = ops.compressor(x, w["wkv"], w["wgate"], state, w["ape"], w["norm"], sin, cos, table, cu, None,
                         np.zeros(len(lens), np.int32), 64, ratio, coff, 1e-6, 2, 1)
    assert rows.shape == (len(groups), d)
    assert (_np(rows).view(np.int16) == np.asarray(out)[:len(groups)].view(np.int16)).all()
    for b, n in enumerate(lens):
        mine = [i for i, (bb, _) in enumerate(groups) if bb == b]
        if mine:
            gs = [groups[i][1] for i in mine]
            want = cref.group_rows(x[cu[b]:cu[b + 1]], w["wkv"], w["wgate"], w["ape"], w["norm"], gs, sin[mine],
                                   cos[mine], r=ratio, coff=coff, eps=1e-6, rotary_mode=2)
            assert dual_threshold_ok(_np(rows)[mine], want, 0.005)


def _check_state(r, lens, ratio, name, key, sbs):
    """State rows: written exactly at the positions whose table entry is not 0, holding the
    reference projections (kv, then score + ape); every other row (block 0 too) zero."""
    table = r.state_block_table.cpu().numpy()
    want_pos = [(b, p) for b, n in enumerate(lens) for p in range(n) if table[b, p // sbs] != 0]
    assert r.state_positions.tolist() == [list(bp) for bp in want_pos]
    assert 0 not in table[r.state_positions[:, 0], r.state_positions[:, 1] // sbs]
    w = {k: _np(v) for k, v in r.weights[key].items()}
    x = _np(r.hidden)
    cu = np.concatenate([[0], np.cumsum(lens)])
    st = _np(r.caches[name]).reshape(-1, _np(r.caches[name]).shape[-1])
    rows = [int(table[b, p // sbs]) * sbs + p % sbs for b, p in want_pos]
    written = np.zeros(st.shape[0], bool)
    written[rows] = True
    assert not st[~written].any() and not st[:sbs].any()  # nothing else, block 0 untouched
    assert (st[rows] == _np(getattr(r, name))).all()
    for b, n in enumerate(lens):
        kv, score = cref.projections(x[cu[b]:cu[b + 1]], w["wkv"], w["wgate"], w["ape"], ratio)
        mine = [i for i, (bb, _) in enumerate(want_pos) if bb == b]
        if mine:
            ps = [want_pos[i][1] for i in mine]
            want = np.concatenate([kv[ps], score[ps]], axis=1)
            assert dual_threshold_ok(st[[rows[i] for i in mine]], want, 0.005)


@pytest.mark.parametrize("ratio", [4, 128])
def test_a2a3_layer(v4_caches, ratio):
    lens = [130, 7] if ratio == 128 else [21, 6]
    r = v4_caches("a2a3", ratio, lens, block_size=16)
    swa = _np(r.caches["swa"]).reshape(-1, 512)
    flat = [s for row in _slots(r.block_table.block_table.cpu().numpy(), lens, 16) for s in row]
    assert (swa[flat].view(np.int16) == _np(r.kv).view(np.int16)).all()
    cmp_lens = [n // ratio for n in lens]
    cflat = [s for row in _slots(r.cmp_block_table.block_table.cpu().numpy(), cmp_lens, 16) for s in row]
    cmp = _np(r.caches["compressed"]).reshape(-1, 512)
    assert len(cflat) == r.cmp_kv.shape[0] and (cmp[cflat].view(np.int16) == _np(r.cmp_kv).view(np.int16)).all()
    written = np.zeros(cmp.shape[0], bool)
    written[cflat] = True
    assert not cmp[~written].view(np.int16).any()  # nothing else written
    _check_compressor_rows(r, lens, ratio, "cmp", r.cmp_kv, 512)
    sbs = 8 if ratio == 4 else 32
    _check_state(r, lens, ratio, "state", "cmp", sbs)
    if ratio == 4:
        _check_compressor_rows(r, lens, ratio, "idx_cmp", r.indexer_k, 128)
        key = _np(r.caches["indexer_key"]).reshape(-1, 128)
        scale = _np(r.caches["indexer_scale"]).reshape(-1)
        for i, s in enumerate(cflat):
            want_q, want_s = ref.indexer_int8_row(_np(r.indexer_k)[i])
            assert (key[s] == want_q).all() and scale[s] == want_s[0]
        _check_state(r, lens, ratio, "indexer_state", "idx_cmp", sbs)


def test_950_csa_layer(v4_caches):
    lens = [9, 4]
    r = v4_caches("950", 4, lens, block_size=16, cmp_block_size=16)
    swa = _np(r.caches["swa"]).reshape(-1, 640)
    flat = [s for row in _slots(r.block_table.block_table.cpu().numpy(), lens, 16) for s in row]
    for i, s in enumerate(flat):
        assert (swa[s] == ref.kv_row_mode2(_np(r.kv)[i])).all()
    cflat = [s for row in _slots(r.cmp_block_table.block_table.cpu().numpy(), [2, 1], 16) for s in row]
    cmp = _np(r.caches["compressed"]).reshape(-1, 640)
    packed = _np(r.caches["indexer_packed"]).reshape(-1)
    for i, s in enumerate(cflat):
        assert (cmp[s] == ref.kv_row_mode2(_np(r.cmp_kv)[i])).all()
        values, scales = ref.indexer_fp8_row(_np(r.indexer_k)[i])
        v_off, s_off = ref.indexer_v2_offsets(s, 128, 16, 132)
        assert (packed[v_off:v_off + 128] == values).all()
        assert (packed[s_off:s_off + 4].view("<f4") == np.asarray(scales, np.float32)).all()
    _check_compressor_rows(r, lens, 4, "cmp", r.cmp_kv, 512)
    _check_compressor_rows(r, lens, 4, "idx_cmp", r.indexer_k, 128)
    _check_state(r, lens, 4, "state", "cmp", 8)
    assert r.weights["cmp"]["norm"].dtype == torch.float32  # the 950's compressor takes an fp32 norm weight
    assert r.caches["swa"].dtype == torch.float8_e4m3fn and tuple(r.caches["state"].shape) == (r.layer.state_num_blocks, 8, 1, 2048)


def test_swa_only_layer_and_given_tokens(v4_caches):
    kv = torch.arange(3 * 512, dtype=torch.float32).reshape(3, 512) / 512
    r = v4_caches("a2a3", 1, [3], kv=kv)
    assert list(r.caches) == ["swa"] and r.cmp_kv is None and r.state is None and r.hidden is None
    slots = r.block_table.slot_mapping.cpu()
    assert torch.equal(r.caches["swa"].cpu().reshape(-1, 512)[slots], kv.to(torch.bfloat16))
    given = ml_dtypes.bfloat16(1.5) * np.ones((3, 512), ml_dtypes.bfloat16)  # NumPy rows work too
    r2 = v4_caches("a2a3", 1, [3], kv=given)
    assert (r2.caches["swa"].cpu().float().reshape(-1, 512)[r2.block_table.slot_mapping.cpu()] == 1.5).all()
    with pytest.raises(ValueError, match="kv"):
        v4_caches("a2a3", 1, [3], kv=torch.zeros(2, 512))


def test_given_hidden_and_weights(v4_caches):
    """Given tokens and weights are what the compressor reads: the same inputs, the same rows."""
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(8, 1536, generator=g)
    weights = {"cmp": {"wkv": torch.randn(512, 1536, generator=g) / 40, "wgate": torch.randn(512, 1536, generator=g) / 40,
                       "ape": torch.randn(128, 512, generator=g), "norm": torch.ones(512)}}
    r = v4_caches("a2a3", 128, [130, 3], hidden=torch.randn(133, 1536, generator=g), weights=weights)
    assert r.hidden.shape == (133, 1536) and r.weights["cmp"]["norm"].dtype == torch.bfloat16
    _check_compressor_rows(r, [130, 3], 128, "cmp", r.cmp_kv, 512)
    with pytest.raises(ValueError, match="hidden"):
        v4_caches("a2a3", 128, [3], hidden=hidden)
    with pytest.raises(ValueError, match="missing"):
        v4_caches("a2a3", 128, [8], hidden=hidden, weights={"cmp": {"wkv": weights["cmp"]["wkv"]}})
'''


@pytest.mark.slow
def test_v4_cache_fixtures(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "test_v4_fixtures.py").write_text(V4_CHECKS)
    _passed(_pytest(tmp_path, "-p", "ascend_emu.pytest_plugin"), 5)
