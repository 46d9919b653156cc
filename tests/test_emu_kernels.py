"""Properties of the shared emu kernels that the op tests cannot pin down on their own."""

import ml_dtypes
import numpy as np

from ascend_emu import ops
from ascend_emu.emu.kernels import square_sums4

BF16 = ml_dtypes.bfloat16


def _sequential_square_sum(x: np.ndarray) -> np.float32:
    """Element-order fp32 accumulation of x*x (an independent plain loop)."""
    s = np.float32(0.0)
    for v in x:
        s = np.float32(s + np.float32(v * v))
    return s


def test_square_sums4_is_bit_identical_to_four_sequential_sums(rng):
    rows = (rng.standard_normal((4, 512)) * rng.uniform(0.1, 100, (4, 1))).astype(np.float32)  # [4, 512]
    got = square_sums4(rows[0], rows[1], rows[2], rows[3])
    for j in range(4):
        assert np.float32(got[j]).view(np.uint32) == _sequential_square_sum(rows[j]).view(np.uint32)


def test_kv_rmsnorm_grouped_tokens_equal_tokens_run_alone(rng):
    """The kernel sums four tokens' squares together when it can: outputs must be the bytes of
    the same tokens computed one at a time."""
    b = 6  # one group of four, then two tokens on the single-row path
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
