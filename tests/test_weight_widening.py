"""``emu.matmul.matmul_weight``: weights widened a block of columns at a time into a bounded
per-thread scratch, with the bits of one sgemm on the whole widened weight; FRACTAL_NZ weights
kept widened only while the kept total stays within ``ASCEND_EMU_WEIGHT_KEEP_MIB``.

The reference is the plain scheme the ops used before (``np.matmul`` of the input and the whole
weight widened exactly to fp32, ``widen_f32``), at the MLA prolog's real shapes: ``x @ W_dq``,
``x @ W_dkv_kr``, ``q @ W_uq_qr`` for N = 8 and 32, and ``q_nope @ W_uk`` per head, at T = 1, 2,
3 and 16 (T = 2 and 3 put the column blocks near OpenBLAS's small-matrix bound).
"""

from __future__ import annotations

import threading
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.emu import matmul

BF16 = np.dtype(ml_dtypes.bfloat16)
#: (T, K, N): the prolog's bf16 products (He 7168, Hcq 1536, N * 192 columns of W_uq_qr, 576).
SHAPES = [(1, 7168, 1536), (2, 7168, 1536), (16, 7168, 1536), (1, 7168, 576), (2, 7168, 576), (3, 7168, 576),
          (1, 1536, 8 * 192), (2, 1536, 32 * 192), (3, 1536, 32 * 192), (16, 1536, 32 * 192)]


def _bf16(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)


@pytest.fixture
def keep_none(monkeypatch):
    """No widened weight kept: every product widens blocks."""
    monkeypatch.setenv(matmul.KEEP_ENV, "0")


@pytest.mark.parametrize("t,k,n", SHAPES)
def test_blocked_product_bit_identical_to_whole_widening(rng, keep_none, t, k, n):
    w = ops.npu_format_cast(_bf16(rng, k, n, scale=k ** -0.5), 29)  # [K, N] NZ
    a = _bf16(rng, t, k).astype(np.float32)  # [T, K]
    assert matmul.block_width(t, k, n) < n  # several blocks
    want = np.matmul(a, matmul.widen_f32(np.asarray(w)))
    got = matmul.matmul_weight(a, w)
    assert got.tobytes() == want.tobytes()
    assert vars(w) == {}  # nothing kept on the weight


@pytest.mark.parametrize("blas_threads", [1, 2])
@pytest.mark.parametrize("t", [1, 16])
def test_per_head_product_bit_identical_to_batched(rng, monkeypatch, t, blas_threads):
    """Per-head products of at most SMALL_PRODUCT_MACS multiply-adds give the bits of one batched
    sgemm on one OpenBLAS thread, whatever the process's thread count (OpenBLAS's kernels for a
    thread's share of columns may sum in another order: Haswell's do); with 2 OpenBLAS threads the
    heads are split between 2 Python threads."""
    from threadpoolctl import threadpool_limits

    assert t * 128 * 512 <= matmul.SMALL_PRODUCT_MACS
    w_uk = _bf16(rng, 32, 128, 512, scale=0.1)  # [N, D, Hckv] ND
    q = _bf16(rng, 32, t, 128).astype(np.float32)  # [N, T, D]
    q_strided = _bf16(rng, t, 32, 192).astype(np.float32)[:, :, :128].transpose(1, 0, 2)  # MlaPreprocess's view
    with threadpool_limits(1, user_api="blas"):
        want = np.matmul(q, matmul.widen_f32(w_uk))
        want_strided = np.matmul(q_strided, matmul.widen_f32(w_uk))
    ranges = []
    heads_range = matmul._heads_range

    def spy(a, w, out, h0, h1):
        ranges.append((threading.get_ident(), h0, h1))
        heads_range(a, w, out, h0, h1)

    monkeypatch.setattr(matmul, "_heads_range", spy)
    with threadpool_limits(blas_threads, user_api="blas"):
        got = matmul.matmul_weight_heads(q, w_uk)
        first_call = len(ranges)
        got_strided = matmul.matmul_weight_heads(q_strided, w_uk)
    assert got.tobytes() == want.tobytes()
    assert got_strided.tobytes() == want_strided.tobytes()
    if blas_threads == 2 and matmul._threads.BLAS_THREADS:
        assert sorted((h0, h1) for _, h0, h1 in ranges) == [(0, 16), (0, 16), (16, 32), (16, 32)]
        caller = threading.get_ident()
        for call in (ranges[:first_call], ranges[first_call:]):  # each call: the caller and one pool thread
            idents = {ident for ident, _, _ in call}  # (the pool may hold more workers, from earlier splits)
            assert len(idents) == 2 and caller in idents, call
    elif blas_threads == 1:
        assert [(h0, h1) for _, h0, h1 in ranges] == [(0, 32), (0, 32)]


def test_block_width_rules():
    cap = matmul.SCRATCH_BYTES
    assert matmul.block_width(1, 128, 512) == 512  # fits the scratch whole
    for t, k, n in SHAPES:
        width = matmul.block_width(t, k, n)
        assert width % matmul.BLOCK_ALIGN == 0 and n % width == 0 and width * k * 4 <= cap
        if t > 1:
            assert t * width * k > matmul.BLAS_SMALL_MNK
    assert matmul.block_width(1, 7168, 1000) == 1000  # no aligned divisor: the whole weight (a temporary)


def test_memory_bounded_by_the_scratch(rng, keep_none):
    """A 22 MB bf16 weight (44 MB in fp32): the call allocates its output and at most one scratch,
    in this thread and in another one, and keeps nothing but the scratch."""
    w = ops.npu_format_cast(_bf16(rng, 7168, 1536), 29)
    a = _bf16(rng, 1, 7168).astype(np.float32)
    want = np.matmul(a, matmul.widen_f32(np.asarray(w)))
    peaks = []

    def call():
        tracemalloc.start()
        try:
            got = matmul.matmul_weight(a, w)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert got.tobytes() == want.tobytes()

    call()  # the scratch of this thread exists already or is made here
    worker = threading.Thread(target=call)
    worker.start()
    worker.join()
    assert len(peaks) == 2 and max(peaks) <= matmul.SCRATCH_BYTES + (1 << 20)
    assert vars(w) == {}


def test_nz_weights_kept_widened_up_to_the_limit_and_released_with_them(rng, monkeypatch):
    """Within the limit a FRACTAL_NZ weight's fp32 widening is kept on it (the same bits as the
    blocked product); a weight that would pass the limit is not kept; a kept copy's bytes are
    released when its weight goes; the limit's variable is checked."""
    import gc

    a = _bf16(rng, 2, 7168).astype(np.float32)  # [T, K]
    w1, w2 = (ops.npu_format_cast(_bf16(rng, 7168, 576, scale=0.01), 29) for _ in range(2))  # 16.5 MB fp32 each
    monkeypatch.setenv(matmul.KEEP_ENV, "0")
    blocked = matmul.matmul_weight(a, w1)
    assert vars(w1) == {}
    gc.collect()
    before = matmul.kept_bytes()  # what other tests' live weights keep
    monkeypatch.setenv(matmul.KEEP_ENV, str(-(-before >> 20) + 20))  # MiB: room for one of the two
    assert matmul.matmul_weight(a, w1).tobytes() == blocked.tobytes()
    (kept,) = vars(w1).values()
    assert kept.dtype == np.float32 and not kept.flags.writeable and matmul.kept_bytes() == before + kept.nbytes
    assert matmul.matmul_weight(a, w1).tobytes() == blocked.tobytes()  # from the kept copy
    matmul.matmul_weight(a, w2)
    assert vars(w2) == {} and matmul.kept_bytes() == before + kept.nbytes  # past the limit: blocks
    del w1, kept
    gc.collect()
    assert matmul.kept_bytes() == before
    for bad in ("-1", "lots"):
        monkeypatch.setenv(matmul.KEEP_ENV, bad)
        with pytest.raises(ValueError, match=f"ASCEND_EMU_WEIGHT_KEEP_MIB: expected an int >= 0 \\(MiB\\), got '{bad}'"):
            matmul.matmul_weight(a, w2)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "bf16-strided"])
def test_per_head_runs_of_heads_bit_identical_to_batched(rng, monkeypatch, dtype):
    """Heads widened a run at a time (runs of 5 heads: 5, 5, 2 on one thread, 5, 1 and 5, 1 on
    two), fp16 / fp32 / strided weights: the bits of one batched product on the whole widened
    weight."""
    from threadpoolctl import threadpool_limits

    w_uk = _bf16(rng, 12, 128, 512, scale=0.1)  # [N, D, Hckv]
    if dtype == "f16":
        w_uk = w_uk.astype(np.float16)
    elif dtype == "f32":
        w_uk = w_uk.astype(np.float32)
    elif dtype == "bf16-strided":
        w_uk = _bf16(rng, 12, 512, 128, scale=0.1).transpose(0, 2, 1)  # [N, D, Hckv] view, not C-contiguous
    q = _bf16(rng, 12, 3, 128).astype(np.float32)  # [N, T, D]
    with threadpool_limits(1, user_api="blas"):
        want = np.matmul(q, w_uk.astype(np.float32))
    monkeypatch.setattr(matmul, "HEAD_RUN_BYTES", 5 * 128 * 512 * 4)
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            assert matmul.matmul_weight_heads(q, w_uk).tobytes() == want.tobytes()
