"""Checked mode (docs/inspect.md#checked-mode): uninitialised reads by the sparse-attention ops and the indexer,
duplicate slots as errors, NaN outputs, off by default, ``ascend-emu run --checked``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import ascend_emu
from ascend_emu import checked_mode, ops
from ascend_emu.errors import DuplicateSlotError, DuplicateSlotWarning, NonFiniteOutputError, UninitializedReadError
from ascend_emu.mla import D_QK, D_ROPE, HCKV
from ascend_emu.quant import ROW_BYTES
from tests.helpers import BF16

SCALE = 0.0625
BS, BLOCKS = 16, 4


@pytest.fixture(autouse=True)
def _fresh_maps():
    checked_mode.reset()
    yield
    checked_mode.reset()


def _bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(BF16)


def _rmsnorm_write(rng, slots, k_cache, ckv_cache):
    """npu_kv_rmsnorm_rope_cache (PA_BSND) writing one token per entry of ``slots``."""
    t = len(slots)
    kv = _bf16(rng, (1, 1, t, 576))  # [B=1, 1, S=T, 576]
    cos, sin = _bf16(rng, (1, 1, t, 64)), _bf16(rng, (1, 1, t, 64))
    return ops.npu_kv_rmsnorm_rope_cache(kv, np.ones(HCKV, BF16), cos, sin, np.asarray(slots, np.int64), k_cache,
                                         ckv_cache, cache_mode="PA_BNSD")


def _sfa_case(rng, written):
    """bf16 PA_BSND caches with ``written`` slots written by npu_kv_rmsnorm_rope_cache; block_table
    [[2, 0]], one batch of 20 kv tokens, one query token reading kv tokens 0..5."""
    k_cache = np.zeros((BLOCKS, BS, 1, D_ROPE), BF16)
    ckv_cache = np.zeros((BLOCKS, BS, 1, HCKV), BF16)
    with ascend_emu.checked():  # writes are recorded only in checked mode
        _rmsnorm_write(rng, written, k_cache, ckv_cache)
    table = np.array([[2, 0]], np.int32)
    q, q_rope = _bf16(rng, (1, 1, 4, HCKV)), _bf16(rng, (1, 1, 4, D_ROPE))
    idx = np.array([[[[0, 1, 2, 3, 4, 5]]]], np.int32)  # [B, S1, N2, K]
    kw = dict(block_table=table, actual_seq_lengths_kv=np.array([20], np.int32), layout_kv="PA_BSND",
              query_rope=q_rope, key_rope=k_cache, attention_mode=2)
    return q, ckv_cache, idx, kw


def _slot(p, table=((2, 0),)):
    return table[0][p // BS] * BS + p % BS


def test_sparse_flash_attention_uninitialised_read():
    rng = np.random.default_rng(0)
    written = [_slot(p) for p in (0, 1, 2, 3, 5)]  # kv token 4 (block 2, row 4, slot 36) never written
    q, ckv, idx, kw = _sfa_case(rng, written)
    with ascend_emu.checked():
        with pytest.raises(UninitializedReadError) as err:
            ops.npu_sparse_flash_attention(q, ckv, ckv, idx, SCALE, **kw)
    msg = str(err.value)
    assert msg.startswith("npu_sparse_flash_attention: key read before written: batch 0, query token 0, kv head 0, "
                          "sparse_indices[0, 0, 0, 4] = 4 -> kv token 4 at block 2, row 4 (slot 36); 1 unwritten")
    # the same call outside checked mode runs (reads whatever the slot holds)
    ops.npu_sparse_flash_attention(q, ckv, ckv, idx, SCALE, **kw)


def test_sparse_flash_attention_key_rope_unwritten_named():
    rng = np.random.default_rng(1)
    q, ckv, idx, kw = _sfa_case(rng, [_slot(p) for p in range(6)])
    checked_mode.mark_written(ckv)  # key declared, key_rope of a fresh cache not
    kw["key_rope"] = np.zeros_like(kw["key_rope"])
    with ascend_emu.checked(), pytest.raises(UninitializedReadError, match=r"key_rope read before written: .* "
                                                                           r"kv token 0 at block 2, row 0"):
        ops.npu_sparse_flash_attention(q, ckv, ckv, idx, SCALE, **kw)


def test_no_error_when_all_read_slots_written():
    rng = np.random.default_rng(2)
    q, ckv, idx, kw = _sfa_case(rng, [_slot(p) for p in range(6)])
    plain = ops.npu_sparse_flash_attention(q, ckv, ckv, idx, SCALE, **kw)
    with ascend_emu.checked():
        out = ops.npu_sparse_flash_attention(q, ckv, ckv, idx, SCALE, **kw)
    assert np.array_equal(out[0].view(np.uint16), plain[0].view(np.uint16))


def _prolog_v3(rng, kv_cache, cache_index):
    b, s = cache_index.shape
    n, he, hcq = 4, 7168, 1536
    ang = rng.uniform(-3, 3, (b, s, D_ROPE))
    return ops.npu_mla_prolog_v3(
        _bf16(rng, (b, s, he)), ops.npu_format_cast(_bf16(rng, (he, hcq), he ** -0.5), 29),
        ops.npu_format_cast(rng.integers(-127, 128, (hcq, n * 192)).astype(np.int8), 29),
        _bf16(rng, (n, 128, HCKV), 128 ** -0.5),
        ops.npu_format_cast(_bf16(rng, (he, D_QK), he ** -0.5), 29), np.ones(hcq, BF16), np.ones(HCKV, BF16),
        np.sin(ang).astype(BF16), np.cos(ang).astype(BF16), kv_cache, np.empty(0, BF16), cache_index=cache_index,
        dequant_scale_w_uq_qr=np.full((1, n * 192), 1e-3, np.float32), k_nope_clip_alpha=np.ones(1, np.float32),
        cache_mode="PA_BSND", weight_quant_mode=1, kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1)


def test_kv_quant_sparse_flash_attention_uninitialised_read_after_mla_prolog_v3():
    rng = np.random.default_rng(3)
    kv_cache = np.zeros((BLOCKS, BS, 1, ROW_BYTES), np.int8)
    cache_index = np.array([[_slot(p) for p in (0, 1, 2, 4)]], np.int64)  # kv token 3 (slot 35) not written
    with ascend_emu.checked(poison=True):
        q, q_rope, *_ = _prolog_v3(rng, kv_cache, cache_index)
        assert (kv_cache.reshape(-1, ROW_BYTES)[35] == -1).all()  # poisoned, never written
        query = np.concatenate([q, q_rope], axis=-1)[:, -1:]  # [1, 1, 4, 576]: the last token
        kw = dict(block_table=np.array([[2, 0]], np.int32), actual_seq_lengths_kv=np.array([5], np.int32),
                  layout_kv="PA_BSND")
        ok = np.array([[[[0, 1, 2, 4]]]], np.int32)
        out = ops.npu_kv_quant_sparse_flash_attention(query, kv_cache, kv_cache, ok, SCALE, 2, 2, attention_mode=2,
                                                      **kw)
        assert np.isfinite(np.asarray(out, np.float32)).all()
        bad = np.array([[[[4, 3, -1, -1]]]], np.int32)
        with pytest.raises(UninitializedReadError) as err:
            ops.npu_kv_quant_sparse_flash_attention(query, kv_cache, kv_cache, bad, SCALE, 2, 2, attention_mode=2,
                                                    **kw)
    assert str(err.value).startswith(
        "npu_kv_quant_sparse_flash_attention: key read before written: batch 0, query token 0, kv head 0, "
        "sparse_indices[0, 0, 0, 1] = 3 -> kv token 3 at block 2, row 3 (slot 35)")


def test_lightning_indexer_uninitialised_read():
    rng = np.random.default_rng(4)
    key = np.zeros((BLOCKS, BS, 1, 128), BF16)
    table = np.array([[1, 3]], np.int32)
    # a user's own scatter of kv tokens 0..19 except 17 (block 3, row 1), declared to checked mode
    checked_mode.mark_written(key, [table[0, p // BS] * BS + p % BS for p in range(20) if p != 17])
    query, weights = _bf16(rng, (1, 2, 64, 128)), _bf16(rng, (1, 2, 64))
    kw = dict(block_table=table, actual_seq_lengths_key=np.array([20], np.int32), layout_key="PA_BSND",
              actual_seq_lengths_query=np.array([2], np.int32))
    with ascend_emu.checked(), pytest.raises(UninitializedReadError) as err:
        ops.npu_lightning_indexer(query, key, weights, sparse_count=8, sparse_mode=3, **kw)
    # causal: query token 0 sees kv tokens 0..18 and reads token 17 first
    assert str(err.value).startswith("npu_lightning_indexer: key read before written: batch 0, query token 0, "
                                     "kv token 17 at block 3, row 1 (slot 49); 2 unwritten reads")
    checked_mode.mark_written(key, [49])
    with ascend_emu.checked():
        ops.npu_lightning_indexer(query, key, weights, sparse_count=8, sparse_mode=3, **kw)


def test_duplicates_become_errors_and_cache_untouched():
    rng = np.random.default_rng(5)
    k_cache = np.zeros((BLOCKS, BS, 1, D_ROPE), BF16)
    ckv_cache = np.zeros((BLOCKS, BS, 1, HCKV), BF16)
    with pytest.warns(DuplicateSlotWarning):
        _rmsnorm_write(rng, [3, 3], k_cache.copy(), ckv_cache.copy())
    with ascend_emu.checked(), pytest.raises(DuplicateSlotError, match=r"index: 1 cache slot\(s\) .* slot 3 <- "
                                                                       r"tokens \[0, 1\]"):
        _rmsnorm_write(rng, [3, 3], k_cache, ckv_cache)
    assert not k_cache.view(np.uint16).any() and not ckv_cache.view(np.uint16).any()


def test_nan_output_reported():
    rng = np.random.default_rng(6)
    q, ckv, idx, kw = _sfa_case(rng, [_slot(p) for p in range(6)])
    q = q.copy()
    q[0, 0, 2, 7] = np.nan
    ops.npu_sparse_flash_attention(q, ckv, ckv, idx, SCALE, **kw)  # off: no check
    with ascend_emu.checked(), pytest.raises(NonFiniteOutputError,
                                             match=r"npu_sparse_flash_attention: attention_out\[0, 0, 2, 0\]"):
        ops.npu_sparse_flash_attention(q, ckv, ckv, idx, SCALE, **kw)


def test_off_by_default():
    assert not checked_mode.enabled()
    rng = np.random.default_rng(7)
    q, ckv, idx, kw = _sfa_case(rng, [0])  # reads unwritten slots: no error when off
    ops.npu_sparse_flash_attention(q, ckv, ckv, idx, SCALE, **kw)
    k_cache, ckv_cache = np.zeros((BLOCKS, BS, 1, D_ROPE), BF16), np.zeros((BLOCKS, BS, 1, HCKV), BF16)
    _rmsnorm_write(rng, [5], k_cache, ckv_cache)
    assert checked_mode.written_slots(ckv_cache) is None  # nothing recorded when off
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DuplicateSlotWarning):
            _rmsnorm_write(rng, [3, 3], np.zeros((BLOCKS, BS, 1, D_ROPE), BF16), np.zeros((BLOCKS, BS, 1, HCKV), BF16))
    with ascend_emu.checked():
        assert checked_mode.enabled()
    assert not checked_mode.enabled()


def test_run_checked_cli(tmp_path):
    script = tmp_path / "uninit.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, ml_dtypes
        from ascend_emu import ops
        bf = ml_dtypes.bfloat16
        ckv = np.zeros((2, 16, 1, 512), bf); kr = np.zeros((2, 16, 1, 64), bf)
        q = np.ones((1, 1, 4, 512), bf); qr = np.ones((1, 1, 4, 64), bf)
        out = ops.npu_sparse_flash_attention(q, ckv, ckv, np.array([[[[0, 1]]]], np.int32), 0.1,
                                             block_table=np.array([[1]], np.int32), query_rope=qr, key_rope=kr,
                                             actual_seq_lengths_kv=np.array([2], np.int32), layout_kv="PA_BSND",
                                             attention_mode=2)
        print("ran")
    """))
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    env.pop(checked_mode.ENV_CHECKED, None)
    plain = subprocess.run([sys.executable, "-m", "ascend_emu", "run", str(script)], capture_output=True, text=True,
                           env=env)
    assert plain.returncode == 0 and "ran" in plain.stdout, plain.stderr
    res = subprocess.run([sys.executable, "-m", "ascend_emu", "run", "--checked", str(script)], capture_output=True,
                         text=True, env=env)
    assert res.returncode != 0
    assert ("UninitializedReadError: npu_sparse_flash_attention: key read before written: batch 0, query token 0, "
            "kv head 0, sparse_indices[0, 0, 0, 0] = 0 -> kv token 0 at block 1, row 0 (slot 16)") in res.stderr
    by_env = subprocess.run([sys.executable, "-m", "ascend_emu", "run", str(script)], capture_output=True, text=True,
                            env=dict(env, **{checked_mode.ENV_CHECKED: "1"}))
    assert by_env.returncode != 0 and "UninitializedReadError" in by_env.stderr


def test_poison_and_mark_written():
    cache = np.zeros((2, 16, 1, 64), BF16)
    checked_mode.mark_written(cache)
    assert checked_mode.written_slots(cache).all()
    checked_mode.poison(cache)
    assert (cache.view(np.uint16) == 0xFFFF).all() and np.isnan(cache.astype(np.float32)).all()
    assert not checked_mode.written_slots(cache).any() and checked_mode.written_slots(cache).size == 32
    checked_mode.mark_written(cache, [3, -1, 17])
    assert np.flatnonzero(checked_mode.written_slots(cache)).tolist() == [3, 17]


def test_torch_drop_in_maps_persist_across_calls():
    """torch tensors reach the ops as per-call NumPy views: the written-slot map still follows the
    tensor's memory from the writer call to the reader call."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    rng = np.random.default_rng(8)
    k_cache = torch.zeros((BLOCKS, BS, 1, D_ROPE), dtype=torch.bfloat16)
    ckv_cache = torch.zeros((BLOCKS, BS, 1, HCKV), dtype=torch.bfloat16)

    def t(a):
        return torch.from_numpy(np.asarray(a, np.float32)).to(torch.bfloat16)

    written = [_slot(p) for p in (0, 1, 2, 3, 5)]
    with ascend_emu.checked():
        kv, cos, sin = (t(rng.standard_normal((1, 1, 5, d))) for d in (576, 64, 64))
        torch_npu.npu_kv_rmsnorm_rope_cache(kv, torch.ones(HCKV, dtype=torch.bfloat16), cos, sin,
                                            torch.tensor(written, dtype=torch.int64), k_cache, ckv_cache,
                                            cache_mode="PA_BNSD")
        kw = dict(block_table=torch.tensor([[2, 0]], dtype=torch.int32), layout_kv="PA_BSND", attention_mode=2,
                  actual_seq_lengths_kv=torch.tensor([20], dtype=torch.int32), key_rope=k_cache,
                  query_rope=t(rng.standard_normal((1, 1, 4, D_ROPE))))
        q = t(rng.standard_normal((1, 1, 4, HCKV)))
        good = torch.tensor([[[[0, 1, 2, 3, 5]]]], dtype=torch.int32)
        torch_npu.npu_sparse_flash_attention(q, ckv_cache, ckv_cache, good, SCALE, **kw)
        with pytest.raises(UninitializedReadError, match=r"kv token 4 at block 2, row 4 \(slot 36\)"):
            torch_npu.npu_sparse_flash_attention(q, ckv_cache, ckv_cache,
                                                 torch.tensor([[[[0, 4]]]], dtype=torch.int32), SCALE, **kw)


def test_mark_written_accepts_torch_tensors():
    """``ascend_emu.mark_written`` on the drop-in's caches (torch tensors), as under ``ascend-emu
    run --checked``: the declared slots read clean, the others still raise; slots as a tensor."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    rng = np.random.default_rng(9)

    def t(a):
        return torch.from_numpy(np.asarray(a, np.float32)).to(torch.bfloat16)

    k_cache = t(rng.standard_normal((BLOCKS, BS, 1, D_ROPE)))  # filled by the user's own code
    ckv_cache = t(rng.standard_normal((BLOCKS, BS, 1, HCKV)))
    filled = torch.tensor([_slot(p) for p in range(4)], dtype=torch.int64)
    ascend_emu.mark_written(ckv_cache, filled)
    ascend_emu.mark_written(k_cache, filled.tolist())
    assert np.flatnonzero(ascend_emu.checked_mode.written_slots(ckv_cache)).tolist() == sorted(filled.tolist())
    kw = dict(block_table=torch.tensor([[2, 0]], dtype=torch.int32), layout_kv="PA_BSND", attention_mode=2,
              actual_seq_lengths_kv=torch.tensor([20], dtype=torch.int32), key_rope=k_cache,
              query_rope=t(rng.standard_normal((1, 1, 4, D_ROPE))))
    q = t(rng.standard_normal((1, 1, 4, HCKV)))
    with ascend_emu.checked():
        torch_npu.npu_sparse_flash_attention(q, ckv_cache, ckv_cache, torch.tensor([[[[0, 1, 2, 3]]]],
                                                                                   dtype=torch.int32), SCALE, **kw)
        with pytest.raises(UninitializedReadError, match=r"kv token 4 at block 2, row 4 \(slot 36\)"):
            torch_npu.npu_sparse_flash_attention(q, ckv_cache, ckv_cache,
                                                 torch.tensor([[[[0, 4]]]], dtype=torch.int32), SCALE, **kw)
    ascend_emu.poison(k_cache)
    assert (k_cache.view(torch.int16) == -1).all() and not ascend_emu.checked_mode.written_slots(k_cache).any()
    with pytest.raises(ascend_emu.errors.DTypeError, match="cache: expected a NumPy array or a CPU torch tensor"):
        ascend_emu.mark_written([[0.0]])


def test_torch_tensors_reach_checked_mode_through_the_drop_in_only():
    """checked_mode imports nothing above it: it sees torch tensors through the view the drop-in
    registers at its import, so before that import a tensor is refused with a message saying so,
    and after it the same call poisons the tensor's own memory."""
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import torch, ascend_emu
        from ascend_emu.errors import DTypeError
        t = torch.zeros((2, 16, 1, 64))
        try:
            ascend_emu.poison(t)
        except DTypeError as exc:
            print(exc)
        import ascend_emu.torch_npu
        ascend_emu.poison(t)
        print(bool(torch.isnan(t).all()))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        "cache: expected a NumPy array, or a CPU torch tensor once ascend_emu.torch_npu is imported, got Tensor",
        "True"]


def test_checked_mode_does_not_import_torch():
    code = "import sys, numpy as np, ascend_emu; ascend_emu.mark_written(np.zeros((2, 16, 1, 64))); " \
           "print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert proc.stdout.strip() == "False", proc.stderr


def test_generic_read_hook_over_cache_layout_and_slots():
    """The one read hook: any (cache, CacheLayout, slots) a contract states; the message names the
    argument, the contract's coordinates and the slot's block / row from the layout; off, the
    contract's reads are never computed."""
    from ascend_emu.layouts import CacheLayout

    cache = np.zeros((4, 2, 16, 8), BF16)  # head-major PA_BNSD [nb, N=2, bs, D]: 64 slots
    layout = CacheLayout.from_declared("PA_BNSD", cache.shape, 2)
    other = np.zeros((64, 1, 8), BF16)  # a TND cache of the same slot count
    tnd = CacheLayout.from_declared("TND", other.shape, 2)
    slots = np.array([3, 40, 41, 63], np.int64)
    calls = []

    def reads():
        calls.append(1)
        return checked_mode.CacheReads((("key", cache, layout), ("rope", None, layout), ("value", other, tnd)),
                                       slots, lambda i: f"read {i}")

    checked_mode.read("op", reads)
    assert calls == []  # off: one global test
    checked_mode.mark_written(cache, [3, 41, 63], num_slots=64)
    checked_mode.mark_written(other, [3, 40, 41])
    with ascend_emu.checked():
        with pytest.raises(UninitializedReadError) as err:
            checked_mode.read("op", reads)
        assert str(err.value).startswith("op: key read before written: read 1 at block 2, row 8 (slot 40); "
                                         "1 unwritten reads")
        checked_mode.mark_written(cache, [40], num_slots=64)
        with pytest.raises(UninitializedReadError, match=r"^op: value read before written: read 3 at slot 63; 1 "):
            checked_mode.read("op", reads)
        checked_mode.mark_written(other, [63])
        checked_mode.read("op", reads)  # every read slot written
        checked_mode.read("op", lambda: checked_mode.CacheReads(((("key", cache, layout)),), np.zeros(0, np.int64),
                                                                  lambda i: ""))
