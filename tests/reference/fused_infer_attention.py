"""Reference fused infer attention (npu_fused_infer_attention_score, MLA subset): plain dense
softmax attention, a loop over requests, query tokens and heads, over the kv rows gathered from
the paged cache by its own block-table walk (or read from a non-paged TND key by its prefix sums).

Written from the formula (docs/sources.md#npu_fused_infer_attention_score; op-plugin's FIA golden gathers the pages the same
way), independently of the emulator: its own cache decoding for the three layouts
(``[nb, bs, KV_N*D]``, ``[nb, KV_N, bs, D]``, FRACTAL_NZ ``[nb, KV_N, D/C0, bs, C0]`` with
element ``d`` of row ``r`` at ``[.., d // C0, r, d % C0]``), its own causal limits and output
layouts. Evaluation: the dot products exactly in float64 then rounded to fp32, the scale as one
fp32 multiply, exp in float64 rounded to fp32, the exp sum sequential in fp32, P = the
unnormalised exp rounded to the query dtype (``p_rounding="unnormalised"``, the kernel) or the
normalised one (``"normalised"``, op-plugin's golden), P @ V exactly in float64 then fp32, the
division in fp32, one rounding of the output (ml_dtypes / NumPy casts, RNE). With inputs whose
products and sums are exact in fp32 (small integers, powers of two) the emulator's BLAS order
cannot differ, so the two agree bit for bit.
"""

from __future__ import annotations

import numpy as np

ROPE = 64


def cache_row(cache: np.ndarray, blk: int, h: int, r: int, kv_n: int) -> np.ndarray:
    """Row ``r`` of block ``blk``, kv head ``h``, of a paged cache (any of the three layouts)."""
    if cache.ndim == 3:
        d = cache.shape[2] // kv_n
        return cache[blk, r, h * d:(h + 1) * d]
    if cache.ndim == 4:
        return cache[blk, h, r]
    d1, c0 = cache.shape[2], cache.shape[4]
    return np.array([cache[blk, h, i // c0, r, i % c0] for i in range(d1 * c0)], dtype=cache.dtype)


def block_size_of(cache: np.ndarray) -> int:
    return cache.shape[{3: 1, 4: 2, 5: 3}[cache.ndim]]


LAYOUTS = {"BSND": ("BSND", "BSND"), "BNSD": ("BNSD", "BNSD"), "TND": ("TND", "TND"),
           "BSND_NBSD": ("BSND", "NBSD"), "BNSD_NBSD": ("BNSD", "NBSD"), "TND_NTD": ("TND", "NTD")}


def token_rows(input_layout, actual_seq_lengths, *per_token):
    """``(reqs, s1, rows)``: the token indices of each request (in the token-major order), S1 (None
    for TND) and each of ``per_token`` (arrays with query's leading dims) as ``[T, N, ...]``."""
    q_layout = LAYOUTS[input_layout][0]
    if q_layout == "TND":
        sums = [0] + [int(x) for x in actual_seq_lengths]
        return [list(range(sums[i], sums[i + 1])) for i in range(len(sums) - 1)], None, per_token
    first = per_token[0]
    b = first.shape[0]
    s1 = first.shape[2] if q_layout == "BNSD" else first.shape[1]
    n = first.shape[1] if q_layout == "BNSD" else first.shape[2]
    lens = [s1] * b if actual_seq_lengths is None else [int(x) for x in actual_seq_lengths]
    reqs = [[i * s1 + s for s in range(lens[i])] for i in range(b)]
    rows = []
    for x in per_token:
        x = x.transpose((0, 2, 1) + tuple(range(3, x.ndim))) if q_layout == "BNSD" else x
        rows.append(x.reshape(b * s1, n, *x.shape[3:]))
    return reqs, s1, rows


def lay_out(out, lse, input_layout, n_req, s1, dtype):
    """fp32 ``out`` ``[T, N, D]`` / ``lse`` ``[T, N]`` -> the op's attention_out (in ``dtype``) and lse."""
    q_layout, out_layout = LAYOUTS[input_layout]
    n, d = out.shape[1], out.shape[2]
    o = out.astype(dtype)
    if q_layout != "TND":
        o = o.reshape(n_req, s1, n, d)
        lse_out = lse.reshape(n_req, s1, n).transpose(0, 2, 1)[..., None]
    else:
        lse_out = lse[..., None]
    if out_layout == "BNSD":
        o = o.transpose(0, 2, 1, 3)
    elif out_layout == "NBSD":
        o = o.transpose(2, 0, 1, 3)
    elif out_layout == "NTD":
        o = o.transpose(1, 0, 2)
    return np.ascontiguousarray(o), np.ascontiguousarray(lse_out)


def reference(query, key, value, query_rope, key_rope, *, block_table, actual_seq_lengths_kv, num_heads,
              num_key_value_heads, scale, input_layout, actual_seq_lengths=None, sparse_mode=0,
              p_rounding="unnormalised"):
    """Returns ``(attention_out, softmax_lse)`` as the op lays them out (lse always computed):
    attention_out in query's dtype; lse fp32 ``[B, N, S1, 1]`` / ``[T, N, 1]``, +inf for rows
    without kv tokens (output 0 there)."""
    qdt = query.dtype
    n, kv_n = num_heads, num_key_value_heads
    g = n // kv_n
    paged = block_table is not None
    bs = block_size_of(key) if paged else None
    if paged:
        kv_lens = [int(x) for x in actual_seq_lengths_kv]
    else:  # TND prefix sums over key [T2, KV_N, D]
        kv_sums = [0] + [int(x) for x in actual_seq_lengths_kv]
        kv_lens = [kv_sums[i + 1] - kv_sums[i] for i in range(len(kv_sums) - 1)]
    reqs, s1, (q_tok, qr_tok) = token_rows(input_layout, actual_seq_lengths, query, query_rope)
    t_total, d = q_tok.shape[0], q_tok.shape[2]
    dv = d if paged else value.shape[2]  # the no-rope form: query / key D = 192, value D = 128
    out = np.zeros((t_total, n, dv), dtype=np.float32)
    lse = np.full((t_total, n), np.inf, dtype=np.float32)
    for bi, toks in enumerate(reqs):
        kv_len = kv_lens[bi]
        nq = len(toks)
        for s, t in enumerate(toks):
            limit = kv_len if sparse_mode == 0 else min(kv_len, kv_len - nq + s + 1)
            if limit <= 0:
                continue
            for head in range(n):
                h = head // g
                scores = np.empty(limit, dtype=np.float32)
                vrows = []
                for j in range(limit):
                    if paged:
                        blk, r = int(block_table[bi, j // bs]), j % bs
                        k = cache_row(key, blk, h, r, kv_n).astype(np.float64)
                        kr = cache_row(key_rope, blk, h, r, kv_n).astype(np.float64)
                        v_row = cache_row(value, blk, h, r, kv_n)
                    else:
                        t2 = kv_sums[bi] + j
                        k, v_row = key[t2, h].astype(np.float64), value[t2, h]
                        kr = None if key_rope is None else key_rope[t2, h].astype(np.float64)
                    dot = float(np.dot(q_tok[t, head].astype(np.float64), k)
                                + (0.0 if kr is None else np.dot(qr_tok[t, head].astype(np.float64), kr)))
                    scores[j] = np.float32(np.float32(dot) * np.float32(scale))
                    vrows.append(v_row.astype(np.float64))
                m = scores.max()
                e = np.exp((scores - m).astype(np.float64)).astype(np.float32)
                total = np.float32(0)
                for x in e:
                    total = np.float32(total + x)
                if p_rounding == "unnormalised":
                    p = e.astype(qdt).astype(np.float64)
                    o = (np.asarray(vrows).T @ p).astype(np.float32)
                    out[t, head] = (o / total).astype(np.float32)
                else:
                    p = (e / total).astype(np.float32).astype(qdt).astype(np.float64)
                    out[t, head] = (np.asarray(vrows).T @ p).astype(np.float32)
                lse[t, head] = np.float32(m + np.float32(np.log(np.float64(total))))
    return lay_out(out, lse, input_layout, len(reqs), s1, qdt)


def _f16(x) -> np.float32:
    """fp32 -> fp16 (RNE) -> fp32."""
    return np.float32(np.float16(np.float32(x)))


def reference_c8(query, key, value, query_rope, key_rope, dequant_scale_query, dequant_scale_key,
                 dequant_scale_value, *, block_table, actual_seq_lengths_kv, num_heads, scale, input_layout,
                 actual_seq_lengths=None, sparse_mode=0, kv_block=512):
    """The v2 C8 decode (int8 query / paged caches, KV_N = 1, bf16 rope), a plain loop per request,
    token, head and kv block of ``kv_block`` positions, from the kernel's chain
    (``incre_flash_attention_preload_mla.h`` / ``ifa_service_matmul_full_quant.h``):
    ``raw = (q . k as an int, through the fp32 bias 2**23 + 2**21) + q_rope . k_rope`` (float64 dot
    rounded to fp32), ``S = raw * fp32(fp32(qs * ks) * scale)``; per block: running max ``m``,
    ``e = fp32(exp(S - m))`` (each difference of fp32 values taken in fp32, as the vector unit
    subtracts, its exp in float64), ``l = l * exp(m_old - m) + sum e``, ``maxP = exp(local max - m) +
    2.2e-16``, ``P = int8(fp16(e * fp32(127 / maxP)))``, ``pv = fp16(int(P . V) / 1024)``,
    ``pv = fp16(pv * fp16(maxP))``, ``acc = fp16(fp16(acc * fp16(exp(m_old - m))) + pv)``; at the
    end ``out = bf16(fp32(fp32(acc) * 1024 / l) * fp32(vs / 127))``, ``lse = m + ln l``.
    Returns ``(attention_out, softmax_lse)`` as :func:`reference`."""
    out_dt = query_rope.dtype
    n = num_heads
    bs = block_size_of(key)
    kv_lens = [int(x) for x in actual_seq_lengths_kv]
    reqs, s1, (q_tok, qr_tok, qs_tok) = token_rows(input_layout, actual_seq_lengths, query, query_rope,
                                                   dequant_scale_query)
    ks = np.float32(np.asarray(dequant_scale_key).reshape(-1)[0])
    vs = np.float32(np.asarray(dequant_scale_value).reshape(-1)[0])
    t_total, d = q_tok.shape[0], q_tok.shape[2]
    out = np.zeros((t_total, n, d), dtype=np.float32)
    lse = np.full((t_total, n), np.inf, dtype=np.float32)
    for bi, toks in enumerate(reqs):
        kv_len = kv_lens[bi]
        nq = len(toks)
        rows = []
        for j in range(kv_len):
            blk, r = int(block_table[bi, j // bs]), j % bs
            rows.append((cache_row(key, blk, 0, r, 1).astype(np.int64), cache_row(key_rope, blk, 0, r, 1)
                         .astype(np.float64), cache_row(value, blk, 0, r, 1).astype(np.int64)))
        for s, t in enumerate(toks):
            limit = kv_len if sparse_mode == 0 else min(kv_len, kv_len - nq + s + 1)
            if limit <= 0:
                continue
            for head in range(n):
                deq = np.float32(np.float32(np.float32(qs_tok[t, head]) * ks) * np.float32(scale))
                qi = q_tok[t, head].astype(np.int64)
                qr = qr_tok[t, head].astype(np.float64)
                scores = []
                for j in range(limit):
                    k, kr, _ = rows[j]
                    dot = int(np.dot(qi, k))
                    biased = np.array([0x4B200000 + dot], dtype=np.int64).astype(np.int32).view(np.float32)[0]
                    nope = np.float32(biased - np.float32(10485760.0))
                    raw = np.float32(nope + np.float32(np.dot(qr, kr)))
                    scores.append(np.float32(raw * deq))
                m = np.float32(-np.inf)
                total = np.float32(0)
                acc = None
                for lo in range(0, limit, kv_block):
                    blk_s = scores[lo:min(lo + kv_block, limit)]
                    local = np.float32(max(blk_s))
                    m_new = max(m, local)
                    resc = np.float32(np.exp(np.float64(np.float32(m - m_new)))) if acc is not None else np.float32(0)
                    e = [np.float32(np.exp(np.float64(np.float32(x - m_new)))) for x in blk_s]  # fp32 S - m
                    ssum = np.float32(0)
                    for x in e:
                        ssum = np.float32(ssum + x)
                    total = np.float32(np.float32(resc * total) + ssum)
                    max_p = np.float32(np.float32(np.exp(np.float64(np.float32(local - m_new))))
                                       + np.float32(2.220446049250313e-16))
                    qscale = np.float32(np.float32(127.0) / max_p)
                    p = [int(np.rint(_f16(np.float32(x * qscale)))) for x in e]
                    pv = np.zeros(d, dtype=np.int64)
                    for i, pi in enumerate(p):
                        pv += pi * rows[lo + i][2]
                    pv16 = np.array([_f16(np.float32(x) * np.float32(2.0 ** -10)) for x in pv], dtype=np.float32)
                    pv16 = np.array([_f16(x * _f16(max_p)) for x in pv16], dtype=np.float32)
                    if acc is None:
                        acc = pv16
                    else:
                        r16 = _f16(resc)
                        acc = np.array([_f16(_f16(a * r16) + y) for a, y in zip(acc, pv16, strict=True)], dtype=np.float32)
                    m = m_new
                o = (acc * np.float32(1024.0)).astype(np.float32)
                o = (o / total).astype(np.float32)
                out[t, head] = (o * np.float32(vs * np.float32(1.0 / 127.0))).astype(np.float32)
                lse[t, head] = np.float32(m + np.float32(np.log(np.float64(total))))
    return lay_out(out, lse, input_layout, len(reqs), s1, out_dt)
