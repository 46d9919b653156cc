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


# ---------------------------------------------------------------------- the MHA / GQA form (no rope)
def _q_rows(query, layout, n):
    """Query as a dict ``(request, position) -> [N, D]`` rows source: returns a function
    ``row(b, s, head)`` and ``(B or None, S1)`` read straight from the given layout."""
    if layout == "BSH":
        d = query.shape[2] // n
        return lambda b, s, h: query[b, s, h * d:(h + 1) * d]
    if layout == "BSND":
        return lambda b, s, h: query[b, s, h]
    if layout == "BNSD":
        return lambda b, s, h: query[b, h, s]
    if layout == "NSD":
        return lambda b, s, h: query[h, s]
    raise ValueError(layout)


def _kv_row(x, layout, kv_n, b, j, h, block_table, bs):
    """Row of kv position ``j`` of request ``b``, head ``h`` (dense in the query's layout, or paged)."""
    if block_table is not None:
        blk, r = int(block_table[b, j // bs]), j % bs
        if x.ndim == 3:
            d = x.shape[2] // kv_n
            return x[blk, r, h * d:(h + 1) * d]
        return x[blk, h, r]
    if layout == "BSH":
        d = x.shape[2] // kv_n
        return x[b, j, h * d:(h + 1) * d]
    if layout == "BSND":
        return x[b, j, h]
    if layout == "BNSD":
        return x[b, h, j]
    if layout == "NSD":
        return x[h, j]
    raise ValueError(layout)


MHA_IO = {"BSH": ("BSH", "BSH"), "BSND": ("BSND", "BSND"), "BNSD": ("BNSD", "BNSD"), "TND": ("TND", "TND"),
          "NTD": ("NTD", "NTD"), "BNSD_BSND": ("BNSD", "BSND"), "BSH_BNSD": ("BSH", "BNSD"),
          "BSND_BNSD": ("BSND", "BNSD"), "BSH_NBSD": ("BSH", "NBSD"), "BSND_NBSD": ("BSND", "NBSD"),
          "BNSD_NBSD": ("BNSD", "NBSD"), "TND_NTD": ("TND", "NTD"), "NTD_TND": ("NTD", "TND"), "NSD": ("NSD", "NSD")}


def reference_mha(query, key, value, *, input_layout, num_heads, num_key_value_heads=0, scale=1.0,
                  actual_seq_lengths=None, actual_seq_lengths_kv=None, block_table=None, sparse_mode=0,
                  atten_mask=None, learnable_sink=None, p_rounding="unnormalised", key_antiquant=None,
                  value_antiquant=None, quant_out=None, pre_tokens=2147483647, next_tokens=2147483647,
                  quant_out_type="int8"):
    """The MHA / GQA form (no rope), a plain loop per request, query token, head and kv position,
    from the doc's formula ``softmax(scale * q . k + mask) . v`` with its layout table, its
    ``actual_seq_lengths`` rules (B-first: per request, one value for all, None = the S dims; TND /
    NTD: prefix sums; paged: per-request kv lengths) and sparse modes (0 / 1: the mask, 1 masks out;
    2: ``j <= s``; 3: ``j <= kv - q + s``; 4: ``kv - q + s - pre_tokens <= j <= kv - q + s +
    next_tokens``; a decode (Q_S = 1, B-first) ignores 2 / 3 / 4; a row seeing no position: output 0,
    lse +inf). Evaluation as
    :func:`reference` (float64 dots rounded to fp32, fp32 scale, exp in float64 rounded to fp32,
    sequential fp32 sum, P rounded to the query dtype). ``learnable_sink``: per head, one more
    softmax entry (max over the scores and the sink, its exp added to the sum last).
    ``key_antiquant`` / ``value_antiquant``: ``(scale, offset or None)`` of an int8 or int32 key /
    value (int32: 8 int4 nibbles, the lowest first, two's complement): each element
    ``scale * (x + offset)``, step by step in fp16 for an fp16 query, in fp32 then bf16 for bf16
    (Ascend C's AscendAntiQuant); scale one value or ``KV_N * D`` values (channel ``h * D + d``).
    ``quant_out``: ``(scale, offset or None)``, the int8 output quant of each fp32 output element
    (:func:`ascend_quant`; one value or ``N * D`` values, channel ``n * D + d``);
    ``quant_out_type`` ``'float8_e4m3fn'`` / ``'float8_e5m2'`` / ``'hifloat8'``: the Ascend 950's
    8-bit float output instead (:func:`post_quant_8bit`; uint8 codes returned).

    Returns ``(attention_out, softmax_lse)`` laid out as the op (lse always computed; +inf for
    rows without kv tokens, output 0 there)."""
    qdt = query.dtype
    n = num_heads
    kv_n = num_key_value_heads or n
    g = n // kv_n
    q_layout, out_layout = MHA_IO[input_layout]
    packed = q_layout in ("TND", "NTD")
    if key_antiquant is not None:  # a paged cache's channels: [nb, bs, KV_N*D] as BSH, [nb, KV_N, bs, D] as BNSD
        lay = q_layout if block_table is None else ("BSH" if key.ndim == 3 else "BNSD")
        key = _dequant(key, key_antiquant, kv_n, lay, qdt)
        value = _dequant(value, value_antiquant, kv_n, lay, qdt)
    if packed:
        q_tnd = query if q_layout == "TND" else query.transpose(1, 0, 2)
        sums = [0] + [int(x) for x in actual_seq_lengths]
        reqs = [list(range(sums[i], sums[i + 1])) for i in range(len(sums) - 1)]
        b = len(reqs)
        t_total = q_tnd.shape[0]
        if block_table is None:
            k_tnd = key if q_layout == "TND" else key.transpose(1, 0, 2)
            v_tnd = value if q_layout == "TND" else value.transpose(1, 0, 2)
            ksums = [0] + [int(x) for x in actual_seq_lengths_kv]
            kv_lens = [ksums[i + 1] - ksums[i] for i in range(b)]
        else:
            kv_lens = [int(x) for x in actual_seq_lengths_kv]
        s1 = None
    else:
        if q_layout == "NSD":
            b, s1 = 1, query.shape[1]
        elif q_layout == "BNSD":
            b, s1 = query.shape[0], query.shape[2]
        else:
            b, s1 = query.shape[0], query.shape[1]

        def per_req(lens, full):
            if lens is None:
                return [full] * b
            lens = [int(x) for x in lens]
            return lens * b if len(lens) == 1 else lens[:b]
        q_lens = per_req(actual_seq_lengths, s1)
        if block_table is None:
            s2 = key.shape[{"BSH": 1, "BSND": 1, "BNSD": 2, "NSD": 1}[q_layout]]
        else:
            s2 = block_table.shape[1] * (key.shape[1] if key.ndim == 3 else key.shape[2])
        kv_lens = per_req(actual_seq_lengths_kv, s2)
        reqs = [[bi * s1 + s for s in range(q_lens[bi])] for bi in range(b)]
        t_total = b * s1
        qrow = _q_rows(query, q_layout, n)
    bs = None if block_table is None else (key.shape[1] if key.ndim == 3 else key.shape[2])
    dv = None
    out = None
    lse = np.full((t_total, n), np.inf, dtype=np.float32)
    rule = {0: "all", 1: "all", 2: "top_left", 3: "bottom_right", 4: "band"}[sparse_mode]
    if not packed and s1 == 1:
        rule = "all"
    mask = None if (atten_mask is None or sparse_mode in (2, 3, 4)) else np.asarray(atten_mask).astype(bool)
    for bi, toks in enumerate(reqs):
        kv_len, nq = kv_lens[bi], len(toks)
        for s, t in enumerate(toks):
            lim = {"all": kv_len, "top_left": min(kv_len, s + 1), "bottom_right": min(kv_len, kv_len - nq + s + 1),
                   "band": min(kv_len, kv_len - nq + s + next_tokens + 1)}[rule]
            first = max(0, kv_len - nq + s - pre_tokens) if rule == "band" else 0
            for head in range(n):
                h = head // g
                if packed:
                    q = q_tnd[t, head]
                else:
                    q = qrow(bi, s, head)
                scores, vrows = [], []
                for j in range(first, max(lim, 0)):
                    if mask is not None:
                        if mask.ndim == 2 and mask.shape[0] == b and s1 == 1 and mask.shape[0] != s1:
                            mv = mask[bi, j]
                        elif mask.ndim == 2:
                            mv = mask[s, j]
                        elif mask.ndim == 3:
                            mv = mask[0, s, j]
                        else:
                            mv = mask[bi if mask.shape[0] > 1 else 0, 0, s, j]
                        if mv:
                            continue
                    if packed and block_table is None:
                        k, vr = k_tnd[ksums[bi] + j, h], v_tnd[ksums[bi] + j, h]
                    else:
                        k = _kv_row(key, q_layout, kv_n, bi, j, h, block_table, bs)
                        vr = _kv_row(value, q_layout, kv_n, bi, j, h, block_table, bs)
                    dot = float(np.dot(q.astype(np.float64), k.astype(np.float64)))
                    scores.append(np.float32(np.float32(dot) * np.float32(scale)))
                    vrows.append(vr.astype(np.float64))
                if out is None:
                    dv = (value.shape[-1] // kv_n) if (q_layout == "BSH" or (block_table is not None
                                                                              and value.ndim == 3)) \
                        else value.shape[-1]
                    out = np.zeros((t_total, n, dv), dtype=np.float32)
                if not scores:
                    continue
                scores = np.asarray(scores, dtype=np.float32)
                m = scores.max()
                sink = None
                if learnable_sink is not None:
                    sink = np.float32(np.asarray(learnable_sink[head]).astype(np.float32))
                    m = max(m, sink)
                e = np.exp((scores - m).astype(np.float64)).astype(np.float32)
                total = np.float32(0)
                for x in e:
                    total = np.float32(total + x)
                if sink is not None:
                    total = np.float32(total + np.float32(np.exp(np.float64(np.float32(sink - m)))))
                if p_rounding == "unnormalised":
                    p = e.astype(qdt).astype(np.float64)
                    o = (np.asarray(vrows).T @ p).astype(np.float32)
                    out[t, head] = (o / total).astype(np.float32)
                else:
                    p = (e / total).astype(np.float32).astype(qdt).astype(np.float64)
                    out[t, head] = (np.asarray(vrows).T @ p).astype(np.float32)
                lse[t, head] = np.float32(m + np.float32(np.log(np.float64(total))))
    if out is None:  # no row computed at all
        dv = value.shape[-1] // kv_n if (q_layout == "BSH" or (block_table is not None and value.ndim == 3)) \
            else value.shape[-1]
        out = np.zeros((t_total, n, dv), dtype=np.float32)
    if quant_out is None:
        o = out.astype(qdt)
    elif quant_out_type == "int8":
        o = _quant_rows(out, *quant_out)
    else:
        o = post_quant_8bit(out, *quant_out, quant_out_type)
    if packed:
        lse_out = lse[..., None]
        o = o.transpose(1, 0, 2) if out_layout == "NTD" else o
    else:
        o = o.reshape(b, s1, n, dv)
        lse_out = lse.reshape(b, s1, n).transpose(0, 2, 1)[..., None]
        if out_layout == "BSH":
            o = o.reshape(b, s1, n * dv)
        elif out_layout == "BNSD":
            o = o.transpose(0, 2, 1, 3)
        elif out_layout == "NBSD":
            o = o.transpose(2, 0, 1, 3)
        elif out_layout == "NSD":
            o = o[0].transpose(1, 0, 2)
    return np.ascontiguousarray(o), np.ascontiguousarray(lse_out)


def _unpack_int4(words):
    """int32 ``[..., W]`` -> int ``[..., 8 W]``, nibble ``j`` of each word the value ``8 w + j``."""
    out = np.zeros(words.shape[:-1] + (words.shape[-1] * 8,), dtype=np.int64)
    u = words.astype(np.int64) & 0xFFFFFFFF
    for j in range(8):
        nib = (u >> (4 * j)) & 0xF
        out[..., j::8] = np.where(nib >= 8, nib - 16, nib)
    return out


def _dequant(x, antiquant, kv_n, q_layout, qdt):
    """An int8 / int32 key or value in its layout -> qdt values of the same layout (D unpacked)."""
    scale, offset = antiquant
    ints = _unpack_int4(x) if x.dtype == np.int32 else x.astype(np.int64)
    d_total = ints.shape[-1] * (1 if q_layout == "BSH" else kv_n)  # channels: KV_N * D
    sc = np.broadcast_to(np.asarray(scale).reshape(-1), (d_total,)) if np.asarray(scale).size == 1 else \
        np.asarray(scale).reshape(-1)
    of = None if offset is None else (np.broadcast_to(np.asarray(offset).reshape(-1), (d_total,))
                                      if np.asarray(offset).size == 1 else np.asarray(offset).reshape(-1))
    out = np.empty(ints.shape, dtype=qdt)
    d = d_total // kv_n
    for idx in np.ndindex(*ints.shape):
        if q_layout == "BSH":
            ch = idx[-1]
        elif q_layout == "BNSD":
            ch = idx[1] * d + idx[-1]
        elif q_layout == "BSND":
            ch = idx[2] * d + idx[-1]
        else:  # NSD
            ch = idx[0] * d + idx[-1]
        v = int(ints[idx])
        if qdt == np.float16:
            r = np.float16(v)
            if of is not None:
                r = np.float16(r + np.float16(of[ch]))
            out[idx] = np.float16(r * np.float16(sc[ch]))
        else:
            r = np.float32(v)
            if of is not None:
                r = np.float32(r + np.float32(of[ch]))
            out[idx] = np.float32(r * np.float32(sc[ch]))
    return out


# ---------------------------------------------------------------------- int8 quant of the MHA form
def fp19_value(scale) -> float:
    """A per-tensor BMM dequant scale as the fixpipe reads it (op-plugin's npu_trans_quant_param
    doc: the fp32's top 19 bits, sign, exponent and 10 mantissa bits): fp32 -> its bits; uint64 ->
    bits 0-31; the low 13 bits dropped."""
    x = np.asarray(scale).reshape(-1)
    word = int(x[0]) & 0xFFFFFFFF if x.dtype == np.uint64 else int(x.view(np.uint32)[0])
    word = (word >> 13) << 13
    return float(np.frombuffer(word.to_bytes(4, "little"), dtype=np.float32)[0])


def _int8_rne(v: float) -> int:
    """RNE (Python's ``round``) then saturation to [-128, 127]."""
    return max(-128, min(127, round(float(v))))


def f16_half_away(t: float) -> np.float16:
    """The fp16 nearest ``t``, ties away from zero (CAST_ROUND)."""
    a = np.float16(t)
    toward = np.float16(np.inf) if float(a) < t else np.float16(-np.inf)
    b = np.nextafter(a, toward)
    da, db = abs(float(a) - t), abs(float(b) - t)
    if db < da or (db == da and abs(float(b)) > abs(float(a))):
        return b
    return a


def ascend_quant(x: float, scale: float, offset) -> int:
    """Ascend C's AscendQuant on one value: ``int8(fp16(fp16(fp16(x) * fp16(scale)) + fp16(offset)))``,
    RNE throughout, saturating (ascendc ``ascend_quant_pre_impl.h``: Cast to half, Muls, Adds, Cast
    to int8)."""
    y = np.float16(np.float64(np.float16(x)) * np.float64(np.float16(scale)))
    if offset is not None:
        y = np.float16(np.float64(y) + np.float64(np.float16(offset)))
    return _int8_rne(y)


def post_quant_8bit(out, scale, offset, name):
    """The Ascend 950's post-quant of fp32 ``[T, N, D]`` to an 8-bit float, per element from the
    arch35 kernel's steps (a multiply by the scale rounded to fp32, an add of the offset rounded to
    fp32, one cast): FP8 by :func:`tests.reference.formats_950.fp8_encode` (ties to even, not
    saturating), HiFloat8 by :func:`tests.reference.formats_950.hif8_encode` (ties away). Scale /
    offset: one value or ``N * D`` values (channel ``n * D + d``). Returns uint8 codes."""
    from tests.reference.formats_950 import fp8_encode, hif8_encode

    t_total, n, d = out.shape
    sc = np.asarray(scale, dtype=np.float32).reshape(-1)
    of = None if offset is None else np.asarray(offset, dtype=np.float32).reshape(-1)
    y = np.zeros(out.shape, dtype=np.float32)
    for idx in np.ndindex(*out.shape):
        ch = 0 if sc.size == 1 else idx[1] * d + idx[2]
        v = np.float32(np.float64(out[idx]) * np.float64(sc[ch]))
        if of is not None:
            v = np.float32(np.float64(v) + np.float64(of[ch]))
        y[idx] = v
    return hif8_encode(y) if name == "hifloat8" else fp8_encode(y, name, saturate=False).reshape(out.shape)


def _quant_rows(out, scale, offset):
    """fp32 ``[T, N, D]`` -> int8 by :func:`ascend_quant` per element."""
    t_total, n, d = out.shape
    sc = np.asarray(scale, dtype=np.float32).reshape(-1)
    of = None if offset is None else np.asarray(offset, dtype=np.float32).reshape(-1)
    res = np.zeros(out.shape, dtype=np.int8)
    for idx in np.ndindex(*out.shape):
        ch = 0 if sc.size == 1 else idx[1] * d + idx[2]
        res[idx] = ascend_quant(float(out[idx]), float(sc[ch]), None if of is None else float(of[ch]))
    return res


def reference_full_quant(query, key, value, dequant_scale1, quant_scale1, dequant_scale2, *, input_layout,
                         num_heads, num_key_value_heads=0, scale=1.0, actual_seq_lengths=None,
                         actual_seq_lengths_kv=None, sparse_mode=0, quant_out=None, pre_tokens=2147483647,
                         next_tokens=2147483647):
    """v1's int8 full quant (int8 query / key / value, dense B-first layouts), a plain loop per
    request, query token, head and kv position, from the PFA kernel's int8 chain
    (``prompt_flash_attention_s1s2_bns1_x910*.h``: compute type fp16): ``s = fp16(int(q . k) *
    fp19(dequant_scale1))``, ``S = fp16(s * fp16(scale))``; ``m = max S``; ``e = fp32(exp(fp32(S - m)))``
    (exp in float64), ``l`` their sequential fp32 sum; ``P = int8(fp16(fp16(e) * fp16(quant_scale1)))``
    (AscendQuant); ``o = fp16(int(P . v) * fp19(dequant_scale2))``; ``out = fp16(o / fp16(l))``, the sum
    rounded ties away (CAST_ROUND); ``lse = fp32(m + ln l)``. sparse_mode 0, 3 or 4 (the rows of
    :func:`reference_mha`). ``quant_out``: ``(scale, offset)`` as
    in :func:`reference_mha` (int8 output), else fp16. Returns ``(attention_out, softmax_lse)`` laid
    out as the op."""
    n = num_heads
    kv_n = num_key_value_heads or n
    g = n // kv_n
    q_layout, out_layout = MHA_IO[input_layout]
    ds1, ds2 = fp19_value(dequant_scale1), fp19_value(dequant_scale2)
    qs1 = float(np.asarray(quant_scale1).reshape(-1)[0])
    sc16 = float(np.float16(scale))
    if q_layout == "BNSD":
        b, s1 = query.shape[0], query.shape[2]
    else:
        b, s1 = query.shape[0], query.shape[1]
    s2 = key.shape[2] if q_layout == "BNSD" else key.shape[1]
    q_lens = [s1] * b if actual_seq_lengths is None else [int(x) for x in actual_seq_lengths]
    kv_lens = [s2] * b if actual_seq_lengths_kv is None else [int(x) for x in actual_seq_lengths_kv]
    qrow = _q_rows(query, q_layout, n)
    d = query.shape[-1] if q_layout != "BSH" else query.shape[2] // n
    out = np.zeros((b * s1, n, d), dtype=np.float32)
    lse = np.full((b * s1, n), np.inf, dtype=np.float32)
    for bi in range(b):
        nq, kv_len = q_lens[bi], kv_lens[bi]
        for s in range(nq):
            diag = kv_len - nq + s
            lim = {0: kv_len, 3: min(kv_len, diag + 1), 4: min(kv_len, diag + next_tokens + 1)}[sparse_mode]
            first = max(0, diag - pre_tokens) if sparse_mode == 4 else 0
            if lim <= first:
                continue
            t = bi * s1 + s
            for head in range(n):
                h = head // g
                q = [int(x) for x in qrow(bi, s, head)]
                ks = [_kv_row(key, q_layout, kv_n, bi, j, h, None, None) for j in range(first, lim)]
                vs = [_kv_row(value, q_layout, kv_n, bi, j, h, None, None) for j in range(first, lim)]
                scores = []
                for k in ks:
                    dot = sum(a * int(c) for a, c in zip(q, k, strict=True))
                    s16 = np.float16(dot * ds1)
                    scores.append(np.float16(float(s16) * sc16))
                m = np.float32(max(float(x) for x in scores))
                e = [np.float32(np.exp(np.float64(np.float32(np.float32(x) - m)))) for x in scores]
                total = np.float32(0)
                for x in e:
                    total = np.float32(total + x)
                p8 = [_int8_rne(np.float16(float(np.float16(x)) * float(np.float16(qs1)))) for x in e]
                l16 = float(f16_half_away(float(total)))
                for c in range(d):
                    pv = sum(p * int(v[c]) for p, v in zip(p8, vs, strict=True))
                    o16 = np.float16(pv * ds2)
                    out[t, head, c] = np.float32(np.float16(float(o16) / l16))
                lse[t, head] = np.float32(m + np.float32(np.log(np.float64(total))))
    o = out.astype(np.float16) if quant_out is None else _quant_rows(out, *quant_out)
    o = o.reshape(b, s1, n, d)
    if out_layout == "BSH":
        o = o.reshape(b, s1, n * d)
    elif out_layout == "BNSD":
        o = o.transpose(0, 2, 1, 3)
    lse_out = lse.reshape(b, s1, n).transpose(0, 2, 1)[..., None]
    return np.ascontiguousarray(o), np.ascontiguousarray(lse_out)
