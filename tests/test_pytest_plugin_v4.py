"""The pytest plugin's DeepSeek-V4 cache fixture: the caches of one layer hold, at the rows the
independent arithmetic below names, the bytes the independent reference encoders
(tests/reference/v4_quant.py) give for the tokens written; state block 0 is never handed out.

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


def _state_rows(r, sbs):
    table = r.state_block_table.cpu().numpy()
    return [int(table[b, p // sbs]) * sbs + p % sbs for b, p in r.state_positions.tolist()]


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
    sbs = 8 if ratio == 4 else 32
    rows = _state_rows(r, sbs)
    assert 0 not in r.state_block_table.cpu().numpy()[r.state_positions[:, 0], r.state_positions[:, 1] // sbs]
    st = _np(r.caches["state"]).reshape(-1, 2 * (2 if ratio == 4 else 1) * 512)
    assert (st[rows] == _np(r.state)).all() and not st[:sbs].any()  # block 0 untouched
    if ratio == 4:
        key = _np(r.caches["indexer_key"]).reshape(-1, 128)
        scale = _np(r.caches["indexer_scale"]).reshape(-1)
        for i, s in enumerate(cflat):
            want_q, want_s = ref.indexer_int8_row(_np(r.indexer_k)[i])
            assert (key[s] == want_q).all() and scale[s] == want_s[0]
        ist = _np(r.caches["indexer_state"]).reshape(-1, 512)
        assert (ist[rows] == _np(r.indexer_state)).all()


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
    assert r.caches["swa"].dtype == torch.float8_e4m3fn and tuple(r.caches["state"].shape) == (r.layer.state_num_blocks, 8, 1, 2048)


def test_swa_only_layer_and_given_tokens(v4_caches):
    kv = torch.arange(3 * 512, dtype=torch.float32).reshape(3, 512) / 512
    r = v4_caches("a2a3", 1, [3], kv=kv)
    assert list(r.caches) == ["swa"] and r.cmp_kv is None and r.state is None
    slots = r.block_table.slot_mapping.cpu()
    assert torch.equal(r.caches["swa"].cpu().reshape(-1, 512)[slots], kv.to(torch.bfloat16))
    given = ml_dtypes.bfloat16(1.5) * np.ones((3, 512), ml_dtypes.bfloat16)  # NumPy rows work too
    r2 = v4_caches("a2a3", 1, [3], kv=given)
    assert (r2.caches["swa"].cpu().float().reshape(-1, 512)[r2.block_table.slot_mapping.cpu()] == 1.5).all()
    with pytest.raises(ValueError, match="kv"):
        v4_caches("a2a3", 1, [3], kv=torch.zeros(2, 512))
'''


@pytest.mark.slow
def test_v4_cache_fixtures(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "test_v4_fixtures.py").write_text(V4_CHECKS)
    _passed(_pytest(tmp_path, "-p", "ascend_emu.pytest_plugin"), 4)
