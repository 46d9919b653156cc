"""ascend_emu.block_permutation: a step re-run with the paged caches' physical blocks permuted.

A step that reads through its block table passes; one that reads blocks in physical order (as
vllm-ascend #14013's shared-KV attention did) fails with the first differing output and its
logical coordinates. The permutation moves caches, tables and slot mappings consistently and keeps
block 0 (the reserved null block) in place. Also: the ``run --permute-blocks`` option, the
decorator, the pytest fixture and the torch tensors of the drop-in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ascend_emu.block_permutation import (ENV_PERMUTE_BLOCKS, BlockPermutationError, block_permutation,
                                          check_block_permutation, permutation_checked, permute_blocks)

ROOT = Path(__file__).resolve().parents[1]
NB, BS, D = 8, 4, 2
SEQ_LENS = (6, 5)  # tokens already cached per request; the step appends one each


def _case():
    rng = np.random.default_rng(11)
    cache = rng.standard_normal((NB, BS, 1, D)).astype(np.float32)
    table = np.array([[3, 5, 0], [7, 2, 0]], np.int32)  # 0: the null block pads the table
    pos = np.array(SEQ_LENS)
    slots = np.array([table[i, p // BS] * BS + p % BS for i, p in enumerate(pos)] + [-1], np.int32)  # -1: a pad token
    new_kv = rng.standard_normal((3, 1, D)).astype(np.float32)
    return cache, table, slots, new_kv


def _step(caches, block_table, slot_mapping, new_kv, *, physical_order=False):
    """Append one token per request (scatter by slot), then a position-weighted sum of every
    request's kv read through its block table (``physical_order``: the table's blocks sorted,
    the bug)."""
    cache = caches["kv"]
    flat = cache.reshape(-1, 1, D)
    for t, s in enumerate(slot_mapping):
        if s >= 0:
            flat[s] = new_kv[t]
    outs = []
    for i, n in enumerate(np.array(SEQ_LENS) + 1):
        blocks = block_table[i][: -(-n // BS)]
        if physical_order:
            blocks = np.sort(blocks)
        rows = cache[blocks].reshape(-1, D)[:n]
        outs.append((rows * np.arange(1, n + 1)[:, None]).sum(0))
    return np.stack(outs), cache[block_table[:, 0]].sum()


def test_a_step_reading_through_the_block_table_passes():
    cache, table, slots, new_kv = _case()
    before = cache.copy()
    out = check_block_permutation(_step, {"kv": cache}, table, slots, new_kv, block_size=BS)
    want = _step({"kv": before.copy()}, table, slots, new_kv)
    np.testing.assert_array_equal(out[0], want[0])
    assert not np.array_equal(cache, before)  # the caller's cache got the step's writes


def test_a_step_reading_blocks_in_physical_order_fails_with_coordinates():
    cache, table, slots, new_kv = _case()
    with pytest.raises(BlockPermutationError) as e:
        check_block_permutation(lambda *a: _step(*a, physical_order=True), {"kv": cache}, table, slots, new_kv,
                                block_size=BS)
    msg = str(e.value)
    assert msg.startswith("output[0][0, ") and "differs when only the physical block placement changed" in msg
    assert "blocks moved" in msg and "reserved [0]" in msg


def test_a_write_by_physical_block_fails_naming_the_cache_and_request():
    """A step that writes the new token into the request's highest block id (not the table's)."""
    def step(caches, block_table, slot_mapping, new_kv):
        for i in range(block_table.shape[0]):
            caches["kv"][block_table[i].max(), 0, 0] = new_kv[i, 0]
        return None

    cache, table, slots, new_kv = _case()
    with pytest.raises(BlockPermutationError, match=r"caches\['kv'\]\[\d, 0, 0, 0\] \(block \d, held by "
                                                    r"block_table\[\d, \d\] \(request \d, block-table column \d\)"):
        check_block_permutation(step, {"kv": cache}, table, slots, new_kv, block_size=BS)


def test_permutation_moves_tables_slots_and_caches_consistently():
    cache, table, slots, _ = _case()
    perm = block_permutation(NB, seed=3)
    assert perm[0] == 0 and sorted(perm) == list(range(NB)) and (perm[1:] != np.arange(1, NB)).all()
    (moved,), t2, s2 = permute_blocks((cache,), table, slots, perm, block_size=BS)
    assert (t2[:, 2] == 0).all() and s2[-1] == -1  # padding kept
    np.testing.assert_array_equal(moved[0], cache[0])  # the reserved block stays
    for b in range(1, NB):
        np.testing.assert_array_equal(moved[perm[b]], cache[b])
    np.testing.assert_array_equal(moved.reshape(-1, 1, D)[s2[:2]], cache.reshape(-1, 1, D)[slots[:2]])
    pairs = np.stack([slots[:2] // BS, slots[:2] % BS], -1)
    (_,), _, p2 = permute_blocks((cache,), None, pairs, perm)
    np.testing.assert_array_equal(p2[:, 0] * BS + p2[:, 1], s2[:2])


def test_bad_arguments_are_named():
    cache, table, slots, new_kv = _case()
    with pytest.raises(ValueError, match="slot_mapping: a flat slot mapping needs block_size"):
        check_block_permutation(_step, {"kv": cache}, table, slots, new_kv)
    with pytest.raises(ValueError, match=r"block_table: expected block ids below the caches' 8 blocks, got block_table\[0, 0\] = 9"):
        check_block_permutation(_step, {"kv": cache}, table + 6, slots, new_kv, block_size=BS)
    with pytest.raises(ValueError, match=r"caches\[1\]: expected 8 blocks"):
        permute_blocks((cache, cache[:4]), table, None, block_permutation(NB))


def test_decorator_is_a_no_op_until_switched_on(monkeypatch):
    broken = permutation_checked(lambda *a: _step(*a, physical_order=True), block_size=BS)
    cache, table, slots, new_kv = _case()
    monkeypatch.delenv(ENV_PERMUTE_BLOCKS, raising=False)
    broken({"kv": cache}, table, slots, new_kv)
    monkeypatch.setenv(ENV_PERMUTE_BLOCKS, "1")
    with pytest.raises(BlockPermutationError):
        broken({"kv": cache}, table, slots, new_kv)


SCRIPT = """
import numpy as np
from ascend_emu.block_permutation import permutation_checked

@permutation_checked(block_size=4)
def step(caches, block_table, slot_mapping):
    blocks = np.sort(block_table[0]) if {broken} else block_table[0]
    return caches[blocks].reshape(-1) * np.arange(8)

cache = np.arange(4 * 4, dtype=np.float32).reshape(4, 4)
step(cache, np.array([[3, 1]], np.int32), np.array([-1], np.int32))
print("done")
"""


@pytest.mark.parametrize("broken", [False, True])
def test_run_permute_blocks_option(tmp_path, broken):
    script = tmp_path / "step.py"
    script.write_text(SCRIPT.format(broken=broken))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(ENV_PERMUTE_BLOCKS, None)
    plain = subprocess.run([sys.executable, "-m", "ascend_emu", "run", str(script)], env=env, capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0 and "done" in plain.stdout, plain.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "ascend_emu", "run", "--permute-blocks", str(script)], env=env,
                         capture_output=True, text=True, timeout=300)
    if broken:
        assert run.returncode == 1 and "BlockPermutationError: output[" in run.stderr, run.stderr[-2000:]
    else:
        assert run.returncode == 0 and "done" in run.stdout, run.stderr[-2000:]


def test_pytest_fixture_with_the_drop_in_ops(tmp_path):
    """The fixture over torch tensors: npu_scatter_pa_kv_cache then npu_gather_pa_kv_cache through
    the block table pass; the same gather over the sorted table fails."""
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        import pytest
        import torch
        import torch_npu

        def step(caches, block_table, slot_mapping, key, seq_lens, sort=False):
            k, v = caches
            torch_npu.npu_scatter_pa_kv_cache(key, key.clone(), k, v, slot_mapping, cache_mode="Norm")
            table = torch.sort(block_table, dim=1).values if sort else block_table
            key_out = torch.zeros(int(seq_lens.sum()), 1, 32, dtype=k.dtype)
            value_out = torch.zeros_like(key_out)
            torch_npu.npu_gather_pa_kv_cache(k, v, table, seq_lens, key_out, value_out)
            return key_out, value_out

        def args():
            g = torch.Generator().manual_seed(0)
            k = torch.randn(6, 16, 1, 32, generator=g).to(torch.bfloat16)
            table = torch.tensor([[4, 2], [5, 1]], dtype=torch.int32)
            seq_lens = torch.tensor([20, 17], dtype=torch.int32)
            slots = torch.tensor([2 * 16 + 3, 1 * 16 + 0], dtype=torch.int32)
            key = torch.randn(2, 1, 32, generator=g).to(torch.bfloat16)
            return (k, k.clone()), table, slots, key, seq_lens

        def test_correct(block_permutation):
            block_permutation(step, *args(), block_size=16)

        def test_sorted_table_is_caught(block_permutation):
            with pytest.raises(AssertionError, match=r"output\\[0\\]\\[\\d+, 0, \\d+\\] differs"):
                block_permutation(step, *args(), block_size=16, sort=True)
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "ascend_emu.pytest_plugin", "test_user.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_out_buffers_are_not_shared_between_runs():
    """A step writing into an out= buffer it returns: each run gets its own copy, so the broken
    step is still caught (a shared buffer would compare with itself)."""
    def step(caches, block_table, slot_mapping, *, out):
        out[:] = caches[np.sort(block_table[0])].reshape(-1)
        return out

    cache = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)
    with pytest.raises(BlockPermutationError):
        check_block_permutation(step, cache, np.array([[4, 1]], np.int32), None, out=np.zeros(4, np.float32))
