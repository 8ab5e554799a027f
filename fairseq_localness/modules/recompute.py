"""Attention with learned additive biases that keeps nothing of size ``Tq x Tk`` for the
backward pass: the energies, biases and distributions are recomputed there, one block
of queries at a time (the recomputation of flash attention, Dao et al. 2022, in plain
matrix products; on a CPU torch has no fused kernel that returns the gradient of an
additive mask, and ``scaled_dot_product_attention`` with a mask that needs one takes
its reference path, which keeps the ``B x H x Tq x Tk`` mask, energies and
distributions).

Shape notation as in :mod:`.attention`; R = number of relative-position buckets.

Per query block ``I`` (rows ``i0 .. i1 - 1``) the forward pass computes::

    S_I  = q_I k^T * scale + sum_t bias_t(I)             (masked keys: -inf)
    P_I  = softmax(S_I)                                  (float32)
    O_I  = P_I v [+ bucket_sum(P_I) W^V]                 (Shaw et al. 2018, eq. 3)

and keeps ``q, k, v, O`` and the small tensors the biases are
made of (per query: a centre and a width; per query and bucket: ``q a^K``). Shaw et
al.'s buckets ``clip(j - i, -K, K) + K`` are expanded to and summed from a block by
one ``where`` or two masked sums for the clipped buckets and 2K - 1 diagonals for the
others (:func:`expand_buckets`, :func:`reduce_buckets`), not by a gather or scatter
over ``Tq x Tk`` indices. The
backward pass recomputes ``P_I`` from them (one more product ``q_I k^T`` and softmax
per block) and applies the softmax's gradient
``dS = P (dP - rowsum(dO * O))`` (``dP = dO v^T`` [+ the value term's]); the biases'
gradients come from autograd on the recomputed block bias with ``dS`` as its
gradient, so a bias is written once, as a function of its small inputs.

Bias terms: ``(fn, inputs)`` with ``fn(inputs, i0, i1)`` returning the bias of query
rows ``i0 .. i1 - 1`` (broadcastable to ``B x H x (i1 - i0) x Tk``, float32 or
float64) from the tensors ``inputs`` (the only tensors through which the bias gets a
gradient). Rows whose keys are all masked get an all-zero output and zero gradients,
as in the reference path. No attention dropout (the callers take this path only
without it).
"""
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

BiasFn = Callable[[Sequence[Tensor], int, int], Tensor]
BiasTerm = Tuple[BiasFn, Tuple[Tensor, ...]]

# Elements of one block's B x H x rows x Tk temporaries (float32: 16 MiB).
BLOCK_ELEMENTS = 1 << 22


def block_rows(bsz: int, heads: int, tgt_len: int, src_len: int) -> int:
    """Query rows per block: as many as keep a block's energies within
    :data:`BLOCK_ELEMENTS` (at least 16, at most Tq)."""
    return max(16, min(tgt_len, BLOCK_ELEMENTS // max(1, bsz * heads * src_len)))


class _RecomputedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, blocked, fns, counts, rel_k, key_emb, value_emb, *inputs):
        # B x H x T x Dh views of the projections (heads split from T x B x C) would be
        # copied by every batched product: copied once here instead (the backward pass
        # keeps these copies, and the projections' outputs are then free)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        bsz, heads, tgt_len, _ = q.shape
        src_len = k.size(2)
        offset = src_len - tgt_len
        rows = block_rows(bsz, heads, tgt_len, src_len)
        dt = torch.float64 if q.dtype == torch.float64 else torch.float32
        out = q.new_empty(bsz, heads, tgt_len, v.size(-1))
        per_bucket = None if value_emb is None else q.new_empty(bsz, heads, tgt_len, value_emb.size(0), dtype=dt)
        groups = _split(inputs, counts)
        rel_key = None if key_emb is None else _relative_key(q, key_emb, scale, dt)
        for i0 in range(0, tgt_len, rows):
            i1 = min(tgt_len, i0 + rows)
            with torch.no_grad():
                scores, _ = _block_scores(q, k, scale, fns, groups, i0, i1, dt)
                if rel_key is not None:
                    scores = scores + expand_buckets(rel_key[:, :, i0:i1], i0, i1, src_len, offset, rel_k)
                probs, empty = _softmax_block(scores, blocked, i0, i1)
                o = torch.matmul(probs.to(v.dtype), v)
                if value_emb is not None:
                    sums = reduce_buckets(probs, i0, i1, offset, rel_k)
                    per_bucket[:, :, i0:i1] = sums if empty is None else sums.masked_fill(empty, 0.0)
                    o = o + torch.matmul(sums, value_emb.to(dt)).to(v.dtype)
                if empty is not None:
                    o = o.masked_fill(empty, 0.0)
            out[:, :, i0:i1] = o
        ctx.scale, ctx.fns, ctx.counts, ctx.rows, ctx.dt, ctx.rel_k = scale, fns, counts, rows, dt, rel_k
        ctx.has = (blocked is not None, key_emb is not None, value_emb is not None)
        ctx.save_for_backward(q, k, v, out, blocked, key_emb, value_emb, per_bucket, *inputs)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, blocked, key_emb, value_emb, per_bucket, *inputs = ctx.saved_tensors
        has_blocked, has_key_emb, has_value = ctx.has
        blocked = blocked if has_blocked else None
        key_emb = key_emb if has_key_emb else None
        value_emb = value_emb if has_value else None
        dt, scale, rows, fns, rel_k = ctx.dt, ctx.scale, ctx.rows, ctx.fns, ctx.rel_k
        tgt_len, src_len = q.size(2), k.size(2)
        offset = src_len - tgt_len
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
        groups = _split(leaves, ctx.counts)
        grad_out = grad_out.to(dt)
        delta = (grad_out * out.to(dt)).sum(-1, keepdim=True)  # B x H x Tq x 1
        grad_q = torch.zeros_like(q, dtype=dt)
        grad_k = torch.zeros_like(k, dtype=dt)
        grad_v = torch.zeros_like(v, dtype=dt)
        rel_key = None if key_emb is None else _relative_key(q, key_emb, scale, dt)
        grad_rel_key = None if rel_key is None else torch.zeros_like(rel_key)
        grad_value_emb = None
        kd, vd = k.to(dt), v.to(dt)
        for i0 in range(0, tgt_len, rows):
            i1 = min(tgt_len, i0 + rows)
            qd = q[:, :, i0:i1].to(dt)
            with torch.enable_grad():
                scores, bias = _block_scores(q, k, scale, fns, groups, i0, i1, dt)
            masked = scores.detach()
            if rel_key is not None:
                masked = masked + expand_buckets(rel_key[:, :, i0:i1], i0, i1, src_len, offset, rel_k)
            probs, empty = _softmax_block(masked, blocked, i0, i1)
            go = grad_out[:, :, i0:i1]
            if empty is not None:
                go = go.masked_fill(empty, 0.0)  # the forward pass zeroed these rows
            grad_probs = torch.matmul(go, vd.transpose(-1, -2))
            if value_emb is not None:
                per_value = torch.matmul(go, value_emb.to(dt).t())  # B x H x rows x R
                grad_probs = grad_probs + expand_buckets(per_value, i0, i1, src_len, offset, rel_k)
            grad_scores = probs * (grad_probs - delta[:, :, i0:i1])
            grad_v += torch.matmul(probs.transpose(-1, -2), go)
            grad_q[:, :, i0:i1] = torch.matmul(grad_scores, kd) * scale
            grad_k += torch.matmul(grad_scores.transpose(-1, -2), qd) * scale
            if rel_key is not None:
                grad_rel_key[:, :, i0:i1] = reduce_buckets(grad_scores, i0, i1, offset, rel_k)
            if bias is not None and bias.requires_grad:
                torch.autograd.backward(bias, _sum_to(grad_scores, bias.shape))
        flat = lambda t: t.reshape(-1, t.size(-1))  # noqa: E731
        grad_key_emb = None
        if key_emb is not None:  # rel_key = q W^K^T * scale
            grad_rel_key = grad_rel_key * scale
            grad_q += torch.matmul(grad_rel_key, key_emb.to(dt))
            grad_key_emb = flat(grad_rel_key).t().matmul(flat(q.to(dt))).to(key_emb.dtype)
        if value_emb is not None:
            grad_value_emb = flat(per_bucket).t().matmul(flat(grad_out)).to(value_emb.dtype)
        grads = [None if not leaf.requires_grad else leaf.grad for leaf in leaves]
        return (grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None, None, None, None,
                grad_key_emb, grad_value_emb, *grads)


def _relative_key(q: Tensor, key_emb: Tensor, scale: float, dt) -> Tensor:
    """Shaw et al.'s ``q_i w^K_r * scale`` per query and bucket, ``B x H x Tq x R``:
    recomputed from ``q`` in the backward pass rather than kept (R multiply-adds per
    query and channel)."""
    return torch.matmul(q, key_emb.to(q.dtype).t()).to(dt) * scale


def _split(inputs: Sequence[Tensor], counts: Sequence[int]) -> List[Tuple[Tensor, ...]]:
    groups, at = [], 0
    for n in counts:
        groups.append(tuple(inputs[at : at + n]))
        at += n
    return groups


def _rows(mask: Tensor, i0: int, i1: int) -> Tensor:
    """Query rows i0..i1 of a mask that may be broadcast over the queries."""
    return mask if mask.size(-2) == 1 else mask[..., i0:i1, :]


def _sum_to(grad: Tensor, shape) -> Tensor:
    """``grad`` summed over the dimensions a bias of ``shape`` was broadcast along."""
    dims = [d for d, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


def _block_scores(q, k, scale, fns, groups, i0, i1, dt):
    """Energies of query rows i0..i1 (float32 or float64) and their summed bias."""
    scores = torch.matmul(q[:, :, i0:i1], k.transpose(-1, -2)).to(dt) * scale
    bias = None
    for fn, group in zip(fns, groups):
        term = fn(group, i0, i1)
        bias = term if bias is None else bias + term
    return (scores if bias is None else scores + bias), bias


def _softmax_block(scores: Tensor, blocked: Optional[Tensor], i0: int, i1: int):
    """Masked float softmax of a block and its empty rows (None on a CPU when there is
    none); empty rows are unblocked (their output is zeroed)."""
    empty = None
    if blocked is not None:
        blocked_i = _rows(blocked, i0, i1)
        empty = blocked_i.all(-1, keepdim=True)
        scores = scores.masked_fill(blocked_i & ~empty, float("-inf"))
        if empty.device.type == "cpu" and not bool(empty.any()):
            empty = None  # the common case: no repair (no host sync on accelerators)
    return torch.softmax(scores, -1), empty


def _far_masks(i0: int, i1: int, src_len: int, offset: int, k: int, device):
    """``rows x Tk`` masks of the keys with ``j - i' <= -K`` and ``>= K`` (the clipped
    buckets 0 and 2K), ``i' = offset + i`` the key index of query i."""
    pos = torch.arange(offset + i0, offset + i1, device=device).unsqueeze(1)
    dist = torch.arange(src_len, device=device).unsqueeze(0) - pos
    return dist <= -k, dist >= k


def _diagonals(i0: int, i1: int, src_len: int, offset: int, k: int):
    """For each unclipped distance d (``|d| < K``): the bucket ``d + K``, the offset of
    its diagonal in a block of query rows i0..i1 (``j = offset + i + d``) and the rows
    ``r0 .. r1 - 1`` of the block that diagonal covers."""
    rows = i1 - i0
    for d in range(1 - k, k):
        diag = offset + i0 + d
        r0, r1 = max(0, -diag), min(rows, src_len - diag)
        if r1 > r0:
            yield d + k, diag, r0, r1


def expand_buckets(per_bucket: Tensor, i0: int, i1: int, src_len: int, offset: int, k: int) -> Tensor:
    """``x_ij = per_bucket[i, clip(j - i', -K, K) + K]`` for query rows i0..i1
    (``per_bucket``: ``... x rows x (2K + 1)``): the clipped buckets by one ``where``
    over the block, the 2K - 1 others along their diagonals (no gather)."""
    far_left, _ = _far_masks(i0, i1, src_len, offset, k, per_bucket.device)
    out = torch.where(far_left, per_bucket[..., :1], per_bucket[..., -1:])
    for r, diag, r0, r1 in _diagonals(i0, i1, src_len, offset, k):
        out.diagonal(diag, -2, -1).copy_(per_bucket[..., r0:r1, r])
    return out


def reduce_buckets(x: Tensor, i0: int, i1: int, offset: int, k: int) -> Tensor:
    """``sum_j x_ij [clip(j - i', -K, K) + K = r]``: ``... x rows x (2K + 1)`` (the
    transpose of :func:`expand_buckets`), by two masked sums and 2K - 1 diagonals (no
    scatter)."""
    far_left, far_right = _far_masks(i0, i1, x.size(-1), offset, k, x.device)
    out = x.new_zeros(x.shape[:-1] + (2 * k + 1,))
    out[..., 0] = (x * far_left).sum(-1)
    out[..., -1] = (x * far_right).sum(-1)
    for r, diag, r0, r1 in _diagonals(i0, i1, x.size(-1), offset, k):
        out[..., r0:r1, r] = x.diagonal(diag, -2, -1)
    return out


def recomputed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    blocked: Optional[Tensor] = None,
    bias_terms: Sequence[BiasTerm] = (),
    relative_k: int = 0,
    key_embeddings: Optional[Tensor] = None,
    value_embeddings: Optional[Tensor] = None,
) -> Tensor:
    """``softmax(q k^T * scale + bias, masked by blocked) (v + a^V)``, ``B x H x Tq x
    Dh`` (see the module docstring). ``blocked``: boolean, broadcastable to
    ``B x H x Tq x Tk``, True = masked. ``bias``: the sum of the ``bias_terms`` and of
    Shaw et al.'s key term ``q_i w^K_{clip(j - i', -K, K) + K} * scale``
    (``key_embeddings``: ``w^K``, ``(2K + 1) x Dh``, K = ``relative_k``);
    ``value_embeddings`` (``(2K + 1) x Dh``): Shaw et al.'s value term, or None.
    Queries are bottom-right aligned (``i' = Tk - Tq + i``)."""
    fns = tuple(fn for fn, _ in bias_terms)
    counts = tuple(len(inputs) for _, inputs in bias_terms)
    inputs = [x for _, group in bias_terms for x in group]
    return _RecomputedAttention.apply(
        q, k, v, scale, blocked, fns, counts, relative_k, key_embeddings, value_embeddings, *inputs)
