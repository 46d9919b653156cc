"""Properties of the shared emu kernels that the op tests cannot pin down on their own."""

import ml_dtypes
import numba
import numpy as np

from ascend_emu import ops
from ascend_emu.emu.kernels import SCATTER_BYTES_PER_THREAD, scatter_rows
from ascend_emu.layouts import CacheLayout
from tests.reference.kv_rmsnorm_rope_cache import scatter as ref_scatter

BF16 = ml_dtypes.bfloat16


def test_kv_rmsnorm_batched_tokens_equal_tokens_run_alone(rng):
    """A token's outputs do not depend on the tokens run with it: the bytes of a batch equal the
    same tokens computed one at a time."""
    b = 6
    kv = (8 * rng.standard_normal((b, 1, 1, 576)) - 10).astype(BF16)  # [B, 1, S, 576]
    gamma = rng.standard_normal(512).astype(BF16)  # [512]
    cos = rng.standard_normal((b, 1, 1, 64)).astype(BF16)  # [B, 1, S, 64]
    sin = rng.standard_normal((b, 1, 1, 64)).astype(BF16)

    def run(sel):
        k_cache = np.zeros((b, 16, 1, 64), BF16)  # [block_num, block_size, 1, 64]
        ckv_cache = np.zeros((b, 16, 1, 512), BF16)
        index = np.arange(len(sel), dtype=np.int64)
        return ops.npu_kv_rmsnorm_rope_cache(kv[sel], gamma, cos[sel], sin[sel], index, k_cache, ckv_cache,
                                             cache_mode="PA", is_output_kv=True)[3]  # y_out [B', 1, 1, 512]

    together = run(np.arange(b))
    for t in range(b):
        alone = run(np.array([t]))
        assert np.array_equal(together[t].view(np.uint16), alone[0].view(np.uint16)), t


def test_threaded_scatter_equals_reference_layout(rng):
    """A scatter large enough to run in several ranges (>= 2 x SCATTER_BYTES_PER_THREAD) writes
    the bytes the reference's NZ layout code writes, with 1 and 2 threads."""
    bs, nb = 128, 24
    t = 2 * SCATTER_BYTES_PER_THREAD // (512 * 2) + 5  # bf16 rows of 512: two ranges and a bit
    rows = rng.standard_normal((t, 512)).astype(BF16)  # [T, 512]
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)  # [T] distinct
    slots[3] = -1
    layout = CacheLayout.from_declared("PA_NZ", (nb, bs, 1, 512), 2)
    want = ref_scatter(np.zeros((nb, bs, 1, 512), BF16), rows, slots, "PA_NZ", bs)
    old = numba.get_num_threads()
    try:
        for n in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(n)
            cache = np.zeros((nb, bs, 1, 512), BF16)
            scatter_rows(cache, rows, slots, layout)
            assert np.array_equal(cache.view(np.uint16), want.view(np.uint16)), n
    finally:
        numba.set_num_threads(old)
