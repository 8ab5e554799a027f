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

and keeps ``q, k, v, O``, the row log-sum-exp and the small tensors the biases are
made of (per query: a centre and a width; per query and bucket: ``q a^K``). The
backward pass recomputes ``P_I`` from them and applies the softmax's gradient
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
    def forward(ctx, q, k, v, scale, blocked, fns, counts, bucket, value_emb, *inputs):
        # B x H x T x Dh views of the projections (heads split from T x B x C) would be
        # copied by every batched product: copied once here instead (the backward pass
        # keeps these copies, and the projections' outputs are then free)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        bsz, heads, tgt_len, _ = q.shape
        src_len = k.size(2)
        rows = block_rows(bsz, heads, tgt_len, src_len)
        dt = torch.float64 if q.dtype == torch.float64 else torch.float32
        out = q.new_empty(bsz, heads, tgt_len, v.size(-1))
        lse = torch.empty(bsz, heads, tgt_len, dtype=dt, device=q.device)
        groups = _split(inputs, counts)
        for i0 in range(0, tgt_len, rows):
            i1 = min(tgt_len, i0 + rows)
            probs, lse[:, :, i0:i1], empty = _block_probs(q, k, scale, blocked, fns, groups, i0, i1, dt)
            o = torch.matmul(probs.to(v.dtype), v)
            if value_emb is not None:
                o = o + torch.matmul(_bucket_sum(probs, bucket, i0, i1, value_emb.size(0)), value_emb.to(dt)).to(v.dtype)
            if empty is not None:
                o = o.masked_fill(empty, 0.0)
            out[:, :, i0:i1] = o
        ctx.scale, ctx.fns, ctx.counts, ctx.rows, ctx.dt = scale, fns, counts, rows, dt
        ctx.has_blocked, ctx.has_bucket, ctx.has_value = blocked is not None, bucket is not None, value_emb is not None
        ctx.save_for_backward(q, k, v, out, lse, blocked, bucket, value_emb, *inputs)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, blocked, bucket, value_emb, *inputs = ctx.saved_tensors
        blocked = blocked if ctx.has_blocked else None
        bucket = bucket if ctx.has_bucket else None
        value_emb = value_emb if ctx.has_value else None
        dt, scale, rows, fns = ctx.dt, ctx.scale, ctx.rows, ctx.fns
        tgt_len = q.size(2)
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
        groups = _split(leaves, ctx.counts)
        grad_out = grad_out.to(dt)
        delta = (grad_out * out.to(dt)).sum(-1, keepdim=True)  # B x H x Tq x 1
        grad_q = torch.zeros_like(q, dtype=dt)
        grad_k = torch.zeros_like(k, dtype=dt)
        grad_v = torch.zeros_like(v, dtype=dt)
        grad_value_emb = None if value_emb is None else torch.zeros_like(value_emb, dtype=dt)
        kd, vd = k.to(dt), v.to(dt)
        for i0 in range(0, tgt_len, rows):
            i1 = min(tgt_len, i0 + rows)
            qd = q[:, :, i0:i1].to(dt)
            with torch.enable_grad():
                scores, bias = _block_scores(q, k, scale, fns, groups, i0, i1, dt)
            blocked_i = None if blocked is None else _rows(blocked, i0, i1)
            masked = scores.detach()
            go = grad_out[:, :, i0:i1]
            if blocked_i is not None:
                empty = blocked_i.all(-1, keepdim=True)
                masked = masked.masked_fill(blocked_i & ~empty, float("-inf"))
                go = go.masked_fill(empty, 0.0)  # the forward pass zeroed these rows
            probs = torch.exp(masked - lse[:, :, i0:i1, None])
            grad_probs = torch.matmul(go, vd.transpose(-1, -2))
            if value_emb is not None:
                per_bucket = torch.matmul(go, value_emb.to(dt).t())  # B x H x rows x R
                index = bucket[i0:i1].expand(probs.shape)
                grad_probs = grad_probs + torch.gather(per_bucket, -1, index)
                grad_value_emb += torch.matmul(
                    _bucket_sum(probs, bucket, i0, i1, value_emb.size(0)).flatten(0, 2).t(), go.flatten(0, 2))
            grad_scores = probs * (grad_probs - delta[:, :, i0:i1])
            grad_v += torch.matmul(probs.transpose(-1, -2), go)
            grad_q[:, :, i0:i1] = torch.matmul(grad_scores, kd) * scale
            grad_k += torch.matmul(grad_scores.transpose(-1, -2), qd) * scale
            if bias is not None and bias.requires_grad:
                torch.autograd.backward(bias, _sum_to(grad_scores, bias.shape))
        grads = [None if not leaf.requires_grad else leaf.grad for leaf in leaves]
        return (grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None, None, None, None,
                None if grad_value_emb is None else grad_value_emb.to(value_emb.dtype), *grads)


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


def _block_probs(q, k, scale, blocked, fns, groups, i0, i1, dt):
    with torch.no_grad():
        scores, _ = _block_scores(q, k, scale, fns, groups, i0, i1, dt)
        empty = None
        if blocked is not None:
            blocked_i = _rows(blocked, i0, i1)
            empty = blocked_i.all(-1, keepdim=True)
            scores = scores.masked_fill(blocked_i & ~empty, float("-inf"))
            if empty.device.type == "cpu" and not bool(empty.any()):
                empty = None  # the common case: no repair (no host sync on accelerators)
        lse = torch.logsumexp(scores, -1)
        probs = torch.exp(scores - lse.unsqueeze(-1))
    return probs, lse, empty


def _bucket_sum(probs: Tensor, bucket: Tensor, i0: int, i1: int, num_buckets: int) -> Tensor:
    """``sum_j P_ij [b(i, j) = r]``: ``B x H x rows x R``."""
    per_bucket = probs.new_zeros(probs.shape[:-1] + (num_buckets,))
    return per_bucket.scatter_add_(-1, bucket[i0:i1].expand(probs.shape), probs)


def recomputed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    blocked: Optional[Tensor] = None,
    bias_terms: Sequence[BiasTerm] = (),
    bucket: Optional[Tensor] = None,
    value_embeddings: Optional[Tensor] = None,
) -> Tensor:
    """``softmax(q k^T * scale + sum of the bias terms, masked by blocked) (v + a^V)``,
    ``B x H x Tq x Dh`` (see the module docstring). ``blocked``: boolean,
    broadcastable to ``B x H x Tq x Tk``, True = masked. ``bucket`` (``Tq x Tk`` long)
    and ``value_embeddings`` (``R x Dh``): Shaw et al.'s value term, or None."""
    fns = tuple(fn for fn, _ in bias_terms)
    counts = tuple(len(inputs) for _, inputs in bias_terms)
    inputs = [x for _, group in bias_terms for x in group]
    return _RecomputedAttention.apply(q, k, v, scale, blocked, fns, counts, bucket, value_embeddings, *inputs)
