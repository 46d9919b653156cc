"""Independent float64 reference of one DeepSeek-V4 attention layer (plain torch).

Written from the V4 reference model (hicann/cann-recipes-infer ``models/deepseek_v4*/model.py``,
DeepSeek's ``inference/model.py`` adapted: ``Compressor``, ``Indexer``, ``Attention``,
``get_window_topk_idxs``, ``get_compress_topk_idxs``; docs/sources.md). Imports nothing from
``ascend_emu``: it is what the emulated decode step (``ascend_emu.demo_v4``) is checked against.

One layer of one request, tokens given in order (a prefill chunk, then decode tokens one by one);
the state (every kv row, the compressor's unfinished groups, the compressed rows) carries over
between :meth:`V4AttentionRef.forward` calls. Per token at position ``p`` (all in float64):

- ``qr = rms(x @ wq_a^T) * q_norm``; ``q = (qr @ wq_b^T)`` as ``[H, 512]``, each head divided by
  its own RMS (no weight), RoPE on its last 64 dims;
- ``kv = rms(x @ wkv^T) * kv_norm``, RoPE on its last 64 dims (the shared K and V row);
- ratio > 1: the compressor (:class:`CompressorRef`) takes the token; when ``(p + 1) % ratio ==
  0`` it emits compressed row ``(p + 1) // ratio - 1``;
- rows attended: the window (positions ``max(0, p - 127) .. p``), then for HCA (ratio 128) every
  compressed row ``c < (p + 1) // ratio``, for CSA (ratio 4) the indexer's top-``min(512, n)`` of
  those ``n`` rows (:meth:`V4AttentionRef._indexer`);
- ``o_h = sum_r softmax_r(q_h . kv_r * 512^-0.5, with exp(sink_h) added to the denominator)
  * kv_r``; inverse RoPE on the last 64 dims of ``o_h``;
- ``out = wo_b(concat_g(wo_a[g] @ o[g]))`` with the 64 heads in 8 groups of 8 (``o_groups``).

What this reference leaves out, as the A2 / A3 path does: the model's quantization-aware
simulations (``act_quant`` fp8 of the kv rows, ``fp4_act_quant`` in the indexer) and the bf16
casts between its steps. With ``fp8_kv`` (the Ascend 950 path, whose caches hold 640-byte fp8
rows) it keeps the model's fp8 simulation of the window and compressed kv rows (:func:`fp8_nope`). RoPE uses ``theta ** (-2i / 64)`` without YaRN; the tables are built
here from ``theta``. The Hadamard rotation of the indexer is the normalized Sylvester
Walsh-Hadamard matrix (``scale = 128 ** -0.5``).
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64
HEAD_DIM = 512
ROPE_DIM = 64
WINDOW = 128
INDEX_HEADS = 64
INDEX_DIM = 128
INDEX_TOPK = 512
EPS = 1e-6


def t64(a) -> torch.Tensor:
    """float64 tensor of any array / tensor (bf16 numpy arrays via float32, exactly)."""
    if isinstance(a, torch.Tensor):
        return a.detach().to(F64)
    import numpy as np
    return torch.from_numpy(np.asarray(a).astype(np.float32).astype(np.float64))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim."""
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def rope_angles(pos: int | torch.Tensor, theta: float, dim: int = ROPE_DIM) -> torch.Tensor:
    """Angles ``pos * theta ** (-2i / dim)`` for the ``dim // 2`` pairs, float64."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=F64) / dim))
    return torch.as_tensor(pos, dtype=F64).reshape(-1, 1) * inv


def rope(x: torch.Tensor, pos: int, theta: float, inverse: bool = False) -> torch.Tensor:
    """RoPE on the last ``ROPE_DIM`` dims of x (interleaved pairs ``(2i, 2i + 1)``), new tensor."""
    ang = rope_angles(pos, theta).reshape(-1)
    c, s = torch.cos(ang), torch.sin(ang)
    if inverse:
        s = -s
    out = x.clone()
    a, b = x[..., -ROPE_DIM::2], x[..., -ROPE_DIM + 1::2]
    out[..., -ROPE_DIM::2] = a * c - b * s
    out[..., -ROPE_DIM + 1::2] = b * c + a * s
    return out


def fp8_nope(row: torch.Tensor) -> torch.Tensor:
    """The model's fp8 simulation of a kv row (``act_quant(kv[..., :-64], 64, "ue8m0")``) on the row
    rounded to bf16 (the model's kv dtype; the rope part is kept as that bf16): each group of 64
    non-rope values divided by ``s = 2 ** ceil(log2(max(amax, 1e-4) / 448))``, rounded to
    float8_e4m3fn (RNE) and multiplied back; the rope part unchanged. New tensor."""
    row = row.to(torch.bfloat16).to(F64)  # the model's kv rows are bf16 when act_quant reads them
    out = row.clone()
    g = row[..., :-ROPE_DIM].reshape(*row.shape[:-1], -1, 64)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (g / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(F64) * s
    out[..., :-ROPE_DIM] = q.reshape(*row.shape[:-1], -1)
    return out


def hadamard(n: int) -> torch.Tensor:
    """Normalized Sylvester Walsh-Hadamard matrix ``[n, n]`` (n a power of two)."""
    h = torch.ones(1, 1, dtype=F64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


class CompressorRef:
    """The model's ``Compressor`` in decode form, one token at a time (float64).

    ``coff = 2`` (overlap) exactly when ``ratio == 4``: the state holds ``2 * ratio`` rows of
    ``2 * d`` values, the previous group's rows first. Token at position ``p`` with
    ``kv = x @ wkv^T``, ``score = x @ wgate^T + ape[p % ratio]`` goes to state row ``ratio + p %
    ratio`` (overlap) or ``p % ratio``. When ``(p + 1) % ratio == 0``: the pooled row is
    ``sum_rows(kv * softmax_rows(score))`` over (overlap) the previous group's first ``d`` values
    and the current group's last ``d``, or over the group; then ``rms(.) * norm``, RoPE at
    position ``p + 1 - ratio`` on the last 64 dims, and (indexer) the Hadamard rotation. The
    state starts as kv 0, score -inf (the first group's missing predecessor weighs nothing).
    """

    def __init__(self, w: dict, ratio: int, d: int, theta: float, rotate: bool = False, fp8: bool = False):
        self.fp8 = fp8
        self.wkv, self.wgate = t64(w["wkv"]), t64(w["wgate"])
        self.ape, self.norm = t64(w["ape"]), t64(w["norm"])
        self.ratio, self.d, self.theta, self.rotate = ratio, d, theta, rotate
        self.overlap = ratio == 4
        coff = 2 if self.overlap else 1
        if self.wkv.shape[0] != coff * d or self.ape.shape != (ratio, coff * d):
            raise ValueError(f"compressor weights: wkv {tuple(self.wkv.shape)}, ape {tuple(self.ape.shape)} for "
                             f"ratio {ratio}, d {d}")
        self.kv_state = torch.zeros(coff * ratio, coff * d, dtype=F64)
        self.score_state = torch.full((coff * ratio, coff * d), float("-inf"), dtype=F64)

    def step(self, kv: torch.Tensor, score: torch.Tensor, pos: int) -> torch.Tensor | None:
        """Take one token's projections (``kv``, ``score`` without ape); the new row or None."""
        r, d = self.ratio, self.d
        score = score + self.ape[pos % r]
        row = r + pos % r if self.overlap else pos % r
        self.kv_state[row] = kv
        self.score_state[row] = score
        if (pos + 1) % r:
            return None
        if self.overlap:
            kv_s = torch.cat([self.kv_state[:r, :d], self.kv_state[r:, d:]], 0)
            sc_s = torch.cat([self.score_state[:r, :d], self.score_state[r:, d:]], 0)
        else:
            kv_s, sc_s = self.kv_state, self.score_state
        out = (kv_s * torch.softmax(sc_s, dim=0)).sum(0)
        if self.overlap:
            self.kv_state[:r] = self.kv_state[r:].clone()
            self.score_state[:r] = self.score_state[r:].clone()
        out = rope(rms_norm(out, self.norm), pos + 1 - r, self.theta)
        if self.rotate:
            out = out @ hadamard(d).T
        return fp8_nope(out) if self.fp8 else out

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x @ wkv^T, x @ wgate^T)`` for tokens ``x [S, hidden]``."""
        return x @ self.wkv.T, x @ self.wgate.T


class V4AttentionRef:
    """One attention layer (module doc) with its state; ``ratio`` 0 (SWA), 4 (CSA) or 128 (HCA).

    ``w`` holds the weights as arrays of any float dtype (converted to float64 once):
    ``wq_a [q_rank, hidden]``, ``q_norm [q_rank]``, ``wq_b [H * 512, q_rank]``,
    ``wkv [512, hidden]``, ``kv_norm [512]``, ``wo_a [groups * o_rank, H * 512 / groups]``,
    ``wo_b [hidden, groups * o_rank]``, ``sink [H]``; ratio > 1: ``cmp`` = {``wkv``, ``wgate``
    ``[coff * 512, hidden]``, ``ape [ratio, coff * 512]``, ``norm [512]``}; ratio 4 also
    ``idx_wq_b [64 * 128, q_rank]``, ``idx_weights [64, hidden]`` and ``idx_cmp`` (the
    indexer's compressor, d 128).
    """

    def __init__(self, w: dict, ratio: int, *, heads: int = 64, groups: int = 8, theta: float = 10000.0,
                 cmp_theta: float = 40000.0, fp8_kv: bool = False):
        if ratio not in (0, 4, 128):
            raise ValueError(f"ratio: expected 0, 4 or 128, got {ratio}")
        self.ratio, self.heads, self.groups = ratio, heads, groups
        self.theta = cmp_theta if ratio else theta  # the model: compressed layers use compress_rope_theta
        self.w = {k: t64(v) for k, v in w.items() if not isinstance(v, dict)}
        self.kv_rows: list[torch.Tensor] = []
        self.cmp_rows: list[torch.Tensor] = []
        self.idx_rows: list[torch.Tensor] = []
        self.fp8_kv = fp8_kv
        self.compressor = CompressorRef(w["cmp"], ratio, HEAD_DIM, self.theta, fp8=fp8_kv) if ratio else None
        self.idx_compressor = (CompressorRef(w["idx_cmp"], ratio, INDEX_DIM, self.theta, rotate=True)
                               if ratio == 4 else None)
        self.selected: list[torch.Tensor] = []  # CSA: each token's selected compressed rows, in order

    @property
    def pos(self) -> int:
        """Tokens seen so far (the next token's position)."""
        return len(self.kv_rows)

    def _indexer(self, qr: torch.Tensor, x: torch.Tensor, p: int) -> torch.Tensor:
        """CSA: the top-``min(512, n)`` compressed rows for the token at ``p`` (n = visible rows)."""
        w = self.w
        q = (qr @ w["idx_wq_b"].T).reshape(INDEX_HEADS, INDEX_DIM)
        q = rope(q, p, self.theta) @ hadamard(INDEX_DIM).T
        weights = (x @ w["idx_weights"].T) * (INDEX_DIM ** -0.5 * INDEX_HEADS ** -0.5)
        n = (p + 1) // self.ratio
        if n == 0:
            return torch.empty(0, dtype=torch.long)
        keys = torch.stack(self.idx_rows[:n])  # [n, 128]
        score = (torch.relu(q @ keys.T) * weights[:, None]).sum(0)  # [n]
        return torch.topk(score, min(INDEX_TOPK, n)).indices

    def forward(self, x) -> torch.Tensor:
        """Tokens ``x [S, hidden]`` at the next S positions -> the layer's output ``[S, hidden]``."""
        x = t64(x)
        w, h = self.w, self.heads
        qr = rms_norm(x @ w["wq_a"].T, w["q_norm"])
        q = rms_norm((qr @ w["wq_b"].T).reshape(x.shape[0], h, HEAD_DIM), None)
        kv = rms_norm(x @ w["wkv"].T, w["kv_norm"])
        if self.compressor is not None:
            ckv, cscore = self.compressor.project(x)
        if self.idx_compressor is not None:
            ikv, iscore = self.idx_compressor.project(x)
        outs = []
        for s in range(x.shape[0]):
            p = self.pos
            row = rope(kv[s], p, self.theta)
            self.kv_rows.append(fp8_nope(row) if self.fp8_kv else row)
            if self.compressor is not None:
                row = self.compressor.step(ckv[s], cscore[s], p)
                if row is not None:
                    self.cmp_rows.append(row)
            if self.idx_compressor is not None:
                row = self.idx_compressor.step(ikv[s], iscore[s], p)
                if row is not None:
                    self.idx_rows.append(row)
            rows = self.kv_rows[max(0, p - WINDOW + 1):p + 1]
            if self.ratio == 128:
                rows = rows + self.cmp_rows[:(p + 1) // self.ratio]
            elif self.ratio == 4:
                sel = self._indexer(qr[s], x[s], p)
                self.selected.append(sel)
                rows = rows + [self.cmp_rows[int(i)] for i in sel]
            k = torch.stack(rows)  # [R, 512]
            qs = rope(q[s], p, self.theta)  # [H, 512]
            logits = qs @ k.T * HEAD_DIM ** -0.5  # [H, R]
            sink = w["sink"][:, None]
            m = torch.maximum(logits.max(-1, keepdim=True).values, sink)
            e = torch.exp(logits - m)
            prob = e / (e.sum(-1, keepdim=True) + torch.exp(sink - m))
            o = rope(prob @ k, p, self.theta, inverse=True)  # [H, 512]
            g = self.groups
            wo_a = w["wo_a"].reshape(g, -1, h * HEAD_DIM // g)  # [G, o_rank, 4096]
            og = torch.einsum("gd,grd->gr", o.reshape(g, -1), wo_a)
            outs.append(og.reshape(-1) @ w["wo_b"].T)
        return torch.stack(outs)


def hc_pre(h: torch.Tensor, hc_fn, hc_scale, hc_base, *, iters: int = 20, eps: float = EPS,
           hc_eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's ``Block.hc_pre`` (with ``hc_split_sinkhorn``) in float64: ``h [T, 4, D]`` ->
    ``(y [T, D], post [T, 4], comb [T, 4, 4])``.

    ``m = (flat(h) @ hc_fn^T) * rsqrt(mean(flat(h)^2) + eps)``; ``pre = sigmoid(m[:4] * s0 + b[:4])
    + hc_eps``; ``post = 2 sigmoid(m[4:8] * s1 + b[4:8])``; ``comb = softmax_rows(m[8:] * s2 +
    b[8:]) + hc_eps``, divided by its column sums (+ hc_eps), then ``iters - 1`` times by its row
    and column sums (+ hc_eps); ``y = sum_j pre[j] h[j]``.
    """
    h = t64(h)
    t, hc, d = h.shape
    flat = h.reshape(t, hc * d)
    m = (flat @ t64(hc_fn).T) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)
    s, b = t64(hc_scale), t64(hc_base)
    pre = torch.sigmoid(m[:, :hc] * s[0] + b[:hc]) + hc_eps
    post = 2 * torch.sigmoid(m[:, hc:2 * hc] * s[1] + b[hc:2 * hc])
    c = torch.softmax((m[:, 2 * hc:] * s[2] + b[2 * hc:]).reshape(t, hc, hc), dim=-1) + hc_eps
    c = c / (c.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + hc_eps)
        c = c / (c.sum(-2, keepdim=True) + hc_eps)
    return (pre[..., None] * h).sum(1), post, c


def hc_post(x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """The model's ``Block.hc_post``: ``out[i] = post[i] * x + sum_j comb[j, i] * residual[j]``."""
    return post[..., None] * x[:, None, :] + torch.einsum("tji,tjd->tid", comb, t64(residual))


class V4BlockRef:
    """The attention half of a V4 block: ``hc_pre`` -> RMSNorm (``attn_norm``) -> the attention layer
    -> ``hc_post``, on ``h [T, 4, hidden]`` (the model's ``Block.forward`` without the FFN half)."""

    def __init__(self, w: dict, hc: dict, ratio: int, **kwargs):
        self.attn = V4AttentionRef(w, ratio, **kwargs)
        self.hc = {k: t64(v) for k, v in hc.items()}

    def forward(self, h) -> torch.Tensor:
        h = t64(h)
        y, post, comb = hc_pre(h, self.hc["hc_fn"], self.hc["hc_scale"], self.hc["hc_base"])
        a = self.attn.forward(rms_norm(y, self.hc["attn_norm"]))
        return hc_post(a, h, post, comb)
