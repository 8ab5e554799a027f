"""Attention with learned additive biases that keeps nothing of size ``Tq x Tk`` for the
backward pass: the energies, biases and distributions are recomputed there, one block
of queries at a time (the recomputation of flash attention, Dao et al. 2022, in plain
matrix products; on a CPU torch has no fused kernel that returns the gradient of an
additive mask, and ``scaled_dot_product_attention`` with a mask that needs one takes
its reference path, which keeps the ``B x H x Tq x Tk`` mask, energies and
distributions).

Shape notation as in :mod:`~fairseq_localness.modules.attention`; R = number of
relative-position buckets.

Per query block ``I`` (rows ``i0 .. i1 - 1``) the forward pass computes::

    S_I  = q_I k^T * scale + sum_t bias_t(I)             (masked keys: -inf)
    P_I  = softmax(S_I)                                  (float32)
    O_I  = P_I v [+ bucket_sum(P_I) W^V]                 (Shaw et al. 2018, eq. 3)

and keeps ``q, k, v, O`` and the small tensors the biases are
made of (per query: a centre and a width; per query and bucket: ``q a^K``). Shaw et
al.'s buckets ``clip(j - i, -K, K) + K`` are expanded to a block by one ``gather``
from each row's 2K + 1 values (:func:`expand_buckets`) and summed from it by one
masked sum for the far right (none in causal attention, where those keys are masked)
and 2K - 1 diagonals for the others (:func:`reduce_buckets`), not by a scatter over
``Tq x Tk`` indices. The far left's bucket 0 is one constant per row: it is left out
of the energies (a softmax ignores it) and out of ``dP`` (it moves into the row's
``rowsum(dO * O)``), and its sums are the rest of each row's known sum (1 for the
distribution, 0 for ``dS``). Expanded terms are added by the matrix product itself
(``baddbmm``). The
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
import functools
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

BiasFn = Callable[[Sequence[Tensor], int, int], Tensor]
BiasTerm = Tuple[BiasFn, Tuple[Tensor, ...]]

# Elements of one block's B x H x rows x Tk temporaries (float32: 4 MiB). Measured on
# a 2-core CPU (one layer's forward and backward pass, 2,048 tokens, d = 512, K = 16):
# 2^20 against 2^22 took 0.79 of the time at T = 256 and 0.84 at T = 1024, and
# against 2^18 and 2^19 the same or less.
BLOCK_ELEMENTS = 1 << 20


def block_rows(bsz: int, heads: int, tgt_len: int, src_len: int) -> int:
    """Query rows per block: as many as keep a block's energies within
    :data:`BLOCK_ELEMENTS` (at least 16, at most Tq)."""
    return max(16, min(tgt_len, BLOCK_ELEMENTS // max(1, bsz * heads * src_len)))


class _RecomputedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, blocked, causal, fns, counts, rel_k, key_emb, value_emb, *inputs):
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
        q_scaled = q * scale
        key_t = k.transpose(-1, -2)
        rel_key = None if key_emb is None else _relative_key(q_scaled, key_emb, dt)
        for i0 in range(0, tgt_len, rows):
            i1 = min(tgt_len, i0 + rows)
            with torch.no_grad():
                shift = None
                if rel_key is not None:
                    shift = expand_buckets(rel_key[:, :, i0:i1], i0, i1, src_len, offset, rel_k)
                scores, _ = _block_scores(q_scaled, key_t, fns, groups, i0, i1, dt, shift)
                probs, empty = _softmax_block(scores, blocked, i0, i1)
                o = torch.matmul(probs.to(v.dtype), v)
                if value_emb is not None:
                    sums = reduce_buckets(probs, i0, i1, offset, rel_k, causal)
                    per_bucket[:, :, i0:i1] = sums if empty is None else sums.masked_fill(empty, 0.0)
                    o = o + torch.matmul(sums, value_emb.to(dt)).to(v.dtype)
                if empty is not None:
                    o = o.masked_fill(empty, 0.0)
            out[:, :, i0:i1] = o
        ctx.scale, ctx.fns, ctx.counts, ctx.rows, ctx.dt, ctx.rel_k = scale, fns, counts, rows, dt, rel_k
        ctx.causal = causal
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
        dt, scale, rows, fns, rel_k, causal = ctx.dt, ctx.scale, ctx.rows, ctx.fns, ctx.rel_k, ctx.causal
        tgt_len, src_len = q.size(2), k.size(2)
        offset = src_len - tgt_len
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
        groups = _split(leaves, ctx.counts)
        grad_out = grad_out.to(dt)
        delta = (grad_out * out.to(dt)).sum(-1, keepdim=True)  # B x H x Tq x 1
        grad_q = torch.zeros_like(q, dtype=dt)
        grad_k = torch.zeros_like(k, dtype=dt)
        grad_v = torch.zeros_like(v, dtype=dt)
        q_scaled = q * scale
        key_t = k.transpose(-1, -2)
        rel_key = None if key_emb is None else _relative_key(q_scaled, key_emb, dt)
        grad_rel_key = None if rel_key is None else torch.zeros_like(rel_key)
        grad_value_emb = None
        kd, vd = k.to(dt), v.to(dt)
        for i0 in range(0, tgt_len, rows):
            i1 = min(tgt_len, i0 + rows)
            qd = q[:, :, i0:i1].to(dt)
            shift = None
            if rel_key is not None:
                shift = expand_buckets(rel_key[:, :, i0:i1], i0, i1, src_len, offset, rel_k)
            with torch.enable_grad():
                scores, bias = _block_scores(q_scaled, key_t, fns, groups, i0, i1, dt, shift)
            probs, empty = _softmax_block(scores.detach(), blocked, i0, i1)
            go = grad_out[:, :, i0:i1]
            if empty is not None:
                go = go.masked_fill(empty, 0.0)  # the forward pass zeroed these rows
            row_delta = delta[:, :, i0:i1]
            if value_emb is not None:
                # dP_ij = dO_i (v_j + w^V_b): bucket 0's term dO_i w^V_0 is one constant
                # per row, which dS = p (dP - delta) lets move into delta
                per_value = torch.matmul(go, value_emb.to(dt).t())  # B x H x rows x R
                row_delta = row_delta - per_value[..., :1]
                shift = expand_buckets(per_value, i0, i1, src_len, offset, rel_k)
                grad_probs = _product(shift, go, vd.transpose(-1, -2))
            else:
                grad_probs = torch.matmul(go, vd.transpose(-1, -2))
            grad_scores = grad_probs.sub_(row_delta).mul_(probs)
            grad_v += torch.matmul(probs.transpose(-1, -2), go)
            grad_q[:, :, i0:i1] = torch.matmul(grad_scores, kd) * scale
            grad_k += torch.matmul(grad_scores.transpose(-1, -2), qd) * scale
            if rel_key is not None:
                # every row of dS sums to 0 (sum_j p_ij dP_ij = delta_i): bucket 0's sum is
                # minus the other buckets' (reduce_buckets with the row sum 0)
                grad_rel_key[:, :, i0:i1] = reduce_buckets(grad_scores, i0, i1, offset, rel_k, causal, 0.0)
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
        return (grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None, None, None, None, None,
                grad_key_emb, grad_value_emb, *grads)


def _relative_key(q_scaled: Tensor, key_emb: Tensor, dt) -> Tensor:
    """Shaw et al.'s ``q_i w^K_r * scale`` per query and bucket, ``B x H x Tq x R``:
    recomputed from ``q`` in the backward pass rather than kept (R multiply-adds per
    query and channel)."""
    return torch.matmul(q_scaled, key_emb.to(q_scaled.dtype).t()).to(dt)


def _product(shift: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``shift + a b`` as one batched product with its addend (``baddbmm``: the
    product's output is the sum, no second pass over ``B x H x rows x Tk``)."""
    lead = shift.shape[:-2]
    out = torch.baddbmm(shift.to(a.dtype).reshape(-1, *shift.shape[-2:]), a.reshape(-1, *a.shape[-2:]),
                        b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:]))
    return out.view(*lead, *out.shape[-2:])


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


def _block_scores(q_scaled, key_t, fns, groups, i0, i1, dt, shift=None):
    """Energies of query rows i0..i1 (float32 or float64, plus ``shift``, a detached
    ``B x H x rows x Tk`` term added by the product itself) and their summed bias."""
    q_block = q_scaled[:, :, i0:i1]
    if shift is not None and q_block.dtype == dt:
        scores = _product(shift, q_block, key_t)
    else:
        scores = torch.matmul(q_block, key_t).to(dt)
        scores = scores if shift is None else scores + shift
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
    """``x_ij - x_i0`` with ``x_ij = per_bucket[i, clip(j - i', -K, K) + K]`` for query
    rows i0..i1 (``per_bucket``: ``... x rows x (2K + 1)``): the term less its value
    in bucket 0, which is one constant per row (a softmax ignores it, and the callers
    account for it where its gradient or its value term matters), by one ``gather``
    from the row's 2K + 1 values with a cached ``rows x Tk`` bucket table (measured
    2.5 times as fast as a ``where`` and 2K - 1 diagonal copies)."""
    shifted = per_bucket - per_bucket[..., :1]
    index = _bucket_index(i0, i1, src_len, offset, k, per_bucket.device)
    return shifted.gather(-1, index.expand(*shifted.shape[:-1], src_len))


@functools.lru_cache(maxsize=32)
def _bucket_index(i0: int, i1: int, src_len: int, offset: int, k: int, device) -> Tensor:
    """``clip(j - i', -K, K) + K`` for query rows i0..i1 and every key: ``rows x Tk``
    (int64), cached per block shape and device."""
    pos = torch.arange(offset + i0, offset + i1, device=device).unsqueeze(1)
    return (torch.arange(src_len, device=device).unsqueeze(0) - pos).clamp_(-k, k).add_(k)


def reduce_buckets(x: Tensor, i0: int, i1: int, offset: int, k: int, causal: bool = False,
                   row_sum=1.0) -> Tensor:
    """``sum_j x_ij [clip(j - i', -K, K) + K = r]``: ``... x rows x (2K + 1)`` (the
    transpose of the bucket expansion) for rows that sum to ``row_sum`` (a softmax's
    1; 0 for the gradient of its energies): the far right by one masked sum (none where
    ``causal``), the 2K - 1 diagonals, and the far left as the rest of the row sum."""
    out = x.new_zeros(x.shape[:-1] + (2 * k + 1,))
    if not causal:
        far_right = _bucket_index(i0, i1, x.size(-1), offset, k, x.device) == 2 * k  # j - i' >= K
        out[..., -1] = torch.where(far_right, x, x.new_zeros(())).sum(-1)
    for r, diag, r0, r1 in _diagonals(i0, i1, x.size(-1), offset, k):
        out[..., r0:r1, r] = x.diagonal(diag, -2, -1)
    out[..., 0] = row_sum - out[..., 1:].sum(-1)
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
    causal: bool = False,
) -> Tensor:
    """``softmax(q k^T * scale + bias, masked by blocked) (v + a^V)``, ``B x H x Tq x
    Dh`` (see the module docstring). ``blocked``: boolean, broadcastable to
    ``B x H x Tq x Tk``, True = masked. ``bias``: the sum of the ``bias_terms`` and of
    Shaw et al.'s key term ``q_i w^K_{clip(j - i', -K, K) + K} * scale``
    (``key_embeddings``: ``w^K``, ``(2K + 1) x Dh``, K = ``relative_k``);
    ``value_embeddings`` (``(2K + 1) x Dh``): Shaw et al.'s value term, or None;
    ``causal``: ``blocked`` masks every key after its query (then nothing is done
    for the far right's bucket).
    Queries are bottom-right aligned (``i' = Tk - Tq + i``)."""
    fns = tuple(fn for fn, _ in bias_terms)
    counts = tuple(len(inputs) for _, inputs in bias_terms)
    inputs = [x for _, group in bias_terms for x in group]
    return _RecomputedAttention.apply(
        q, k, v, scale, blocked, causal, fns, counts, relative_k, key_embeddings, value_embeddings, *inputs)


def whole_bias_term(inputs: Sequence[Tensor], i0: int, i1: int) -> Tensor:
    """A bias term given whole (``inputs[0]``: ``... x Tq x Tk``, or broadcast over the
    queries): its rows ``i0 .. i1 - 1``."""
    bias = inputs[0]
    return bias if bias.size(-2) == 1 else bias[..., i0:i1, :]
