"""A branch of a full pass as one call of SDPA's fused kernel with its mask and bias
given whole (``B' x H' x Tq x Tk``): ``attention_impl="dense"``, the alternative to the
fused FlexAttention call that ``"auto"`` takes on CUDA.

Shape notation as in :mod:`~fairseq_localness.modules.attention`: B = batch size,
H = heads, Tq = query length, Tk = key length, Dh = head dimension.

Why it exists. On an H200 a Transformer-base training step was bound by its host (13.9
ms of kernels in a 40 ms step, docs/benchmark.md), and each compiled FlexAttention call
is a wrapper of its own on the host, forward and backward; the H200 table puts 0.6 to
1.6 ms of a step's host time on each (an estimate, not measured call by call). Where
that holds, eager launches at about 33 us each are cheaper than a compiled call up to
tens of launches: Yang et al.'s Gaussian (eq. 5) as a dense bias costs three
element-wise kernels forward and a few more backward, a window a cached mask and
nothing per call. What this path pays instead is memory: a learned bias is a ``B x H x
Tq x Tk`` tensor in the query's dtype, which SDPA keeps for its backward pass and whose
gradient it computes there, where the fused call keeps nothing of that size (the
bias's own backward pass keeps nothing of it: :class:`_BiasedMask`). Which is faster
on a GPU is measured by ``scripts/gpu_attention_probe.py``'s ``dense`` variant and by
``fairseq-localness-bench --attention-impl auto dense`` (docs/benchmark.md); not yet
measured on one, so ``"auto"`` keeps the fused call there. On a CPU ``"auto"`` keeps the
kernels chosen there (the band, the CPU flash kernel, the recomputation per block).

What the path computes, per branch (:func:`dense_attention`):

* the branch's window, the call's padding and causality as one float mask of 0 and
  ``-inf`` in the query's dtype (none for the plain causal mask alone, which goes to
  SDPA as ``is_causal``): with padding, made once per window, lengths, dtype and
  padding mask and shared by the layers of a pass (:func:`~..context.of_mask`); without
  it, a view of one table of the window's distances (:func:`~..context.distance_table`,
  per window, causality and dtype): no kernel per call, and no memory per shape. Its
  rows, and those of a bias added to it, lie a multiple of 8 elements apart and start
  there (SDPA's memory-efficient kernel pads and copies a mask whose rows do not). A
  boolean mask would cost a conversion per call, and SDPA turns it into a finite
  minimum for cuDNN's kernel, which would give a row without keys a distribution; a
  float32 mask with half-precision queries cuDNN reads as half precision (pytorch
  pull request 191612): the mask is in the query's dtype.
* Rows without keys (a left-padded sentence's first queries under a window or
  causality) are unblocked in that mask and their output zeroed after the call, as
  the eager path's: one fill per call where padding meets a window or causality (the
  data decide, and testing them would wait for the device); without padding only where
  the window leaves a row empty (decided on the host, :func:`leaves_rows_empty`); never
  for padding alone (every sentence of a fairseq batch has a real token). Nothing here
  waits for the device.
* the branch's score terms (Yang et al.'s Gaussian as ``(k_pos - P)^2 c`` with ``c = -1
  / (2 sigma^2)``, the terms given whole) and the call's soft bias (the finite part of an
  ``attn_mask``; Shaw et al.'s key term, eq. 4, without a value term) added to the mask, in
  the query's dtype (float16 shifted as :func:`~.sdpa._half_safe_bias` does).

Several branches that are windows alone, for a fusion that takes their outputs stacked
(HySAN's squeeze gate, eq. 13-14, on CUDA), are handed over stacked in the layout the
gate merges them into, their rows without keys zeroed by one fill
(:func:`dense_windows`): one gate over the L*B rows of all branches, as after the fused
call, where a gate per branch made a training step's operators on CUDA's paths 2,545
instead of 1,881 (HySAN e1, counted on the CPU; ``docs/architecture.md``).

Shaw et al.'s value term (eq. 3) needs each row's distribution, which SDPA does not
return: a full pass with it is one autograd function instead (:func:`dense_relative`,
:class:`_RelativeAttention`), the key term, the mask and bias, the softmax, attention
dropout and both value products in one forward and one backward pass of its own
(a training step of localness + rel_pos counted on the CPU on CUDA's paths: 2,147
operators against 2,205 with the eager path, the transformer's 1,575), keeping less
for the backward pass than the eager path does. The same function takes such calls
with attention dropout on CUDA under every other setting but ``"eager"``, where the
fused call draws no dropout. One query row (a decoding step) takes the kernels
``"auto"`` takes (:mod:`.step`; on CUDA one fused call).

Not yet run on a GPU. Which of SDPA's kernels takes a float mask whose bias needs
gradients on an H100 or H200 (cuDNN's comes first there in recent torch) is for the
CUDA test (``tests/test_dense_path.py -k cuda``) to show; a reported fault of cuDNN's
backward pass with a mask (NaN in the queries' gradient where ``Tk`` is 64 more than a
multiple of 128 and a row's log-sum-exp is below about -88.7, pytorch issue 196678,
torch 2.11) is one to look for there: a Gaussian window far narrower than a token can
reach such rows.
"""
from typing import Hashable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from fairseq_localness.modules.context import (
    AttentionContext, _unpadded, aligned_width, combine_masks, distance_table, of_mask, window_mask,
)
from fairseq_localness.modules.kernels.sdpa import padding_bias
from fairseq_localness.modules.scores import BucketScore, Description, GaussianScore, Window


def takes(impl: str, tgt_len: int) -> bool:
    """Whether a call of ``tgt_len`` query rows with ``attention_impl`` ``impl`` takes
    this path: ``"dense"`` and a full pass (``Tq > 1``; one row is a beam-search step)."""
    return impl == "dense" and tgt_len > 1


def dense_attention(ctx: AttentionContext, v: Tensor, description: Description, base_blocked: Optional[Tensor],
                    soft_bias: Optional[Tensor], dropout_p: float) -> Tensor:
    """One branch, ``B x H x Tq x Dh``: ``F.scaled_dot_product_attention`` with the
    branch's and the call's mask as a float mask (:func:`_float_mask`) and its score
    terms plus ``soft_bias`` added (:func:`_with_bias`; see the module docstring).
    ``base_blocked``: the call's padding and causality as
    :func:`~..context.base_mask` makes them (the masks made from it are kept per padding
    mask and shape); ``dropout_p``: the attention dropout drawn by the kernel."""
    gaussian, extra = _terms(description, ctx.src_len, soft_bias)
    if gaussian is None and extra is None and description.mask is None and description.window is None \
            and base_blocked is not None and base_blocked is ctx.cache.get("plain_causal"):
        # the plain causal mask alone: the kernels that skip the blocks above the diagonal
        return F.scaled_dot_product_attention(ctx.q, ctx.k, v, dropout_p=dropout_p, is_causal=True)
    mask, row_empty = _float_mask(ctx, description, base_blocked)
    if gaussian is not None or extra is not None:
        mask = _with_bias(ctx, gaussian, extra, mask)
    elif mask is not None:
        mask = mask[..., :ctx.src_len]
    out = F.scaled_dot_product_attention(ctx.q, ctx.k, v, attn_mask=mask, dropout_p=dropout_p)
    return out if row_empty is None else out.masked_fill(row_empty, 0.0)


def dense_windows(ctx: AttentionContext, v: Tensor, descriptions: Sequence[Description],
                  base_blocked: Optional[Tensor], dropout_p: float) -> Tensor:
    """Several branches that are windows alone (HySAN's, the hybrid's), ``B x H x L x Tq
    x Dh``, for a fusion that takes them stacked (HySAN's squeeze gate over all L*B rows
    at once, :meth:`~..fusion.Fusion.takes_stacked`): one SDPA call per branch as
    :func:`dense_attention`, the outputs written side by side in the layout the fusion
    merges them into (``Tq x L x B x H x Dh``: one copy, and the fusion's merge a view),
    and the rows without keys of all branches zeroed by one fill (their masks stacked
    once per mask)."""
    outs, empties = [], []
    for description in descriptions:
        mask, row_empty = _float_mask(ctx, description, base_blocked)
        mask = None if mask is None else mask[..., :ctx.src_len]
        outs.append(F.scaled_dot_product_attention(ctx.q, ctx.k, v, attn_mask=mask, dropout_p=dropout_p))
        empties.append(row_empty)
    merged = torch.stack([out.permute(2, 0, 1, 3) for out in outs], dim=1)  # Tq x L x B x H x Dh
    if any(row_empty is not None for row_empty in empties):
        merged = merged.masked_fill(_stacked_rows(ctx, descriptions, empties), 0.0)
    return merged.permute(2, 3, 1, 0, 4)  # B x H x L x Tq x Dh, a view


def _stacked_rows(ctx: AttentionContext, descriptions: Sequence[Description], empties) -> Tensor:
    """The rows without keys of L branches (``B' x 1 x Tq x 1`` each, or None: none) as
    one ``Tq x L x B' x 1 x 1`` mask, made once per mask as :func:`_float_mask`'s."""
    windows = tuple(None if d.window is None else (d.window.left, d.window.right) for d in descriptions)
    key: Hashable = ("dense rows", windows, ctx.causal, ctx.tgt_len, ctx.src_len)

    def make():
        rows = max((e.size(0) for e in empties if e is not None))
        like = next(e for e in empties if e is not None)
        with torch.no_grad():
            parts = [like.new_zeros(rows, 1, ctx.tgt_len, 1) if e is None else e.expand(rows, 1, ctx.tgt_len, 1)
                     for e in empties]
            return torch.stack(parts).permute(3, 0, 1, 2, 4).reshape(ctx.tgt_len, len(parts), rows, 1, 1)

    if ctx.key_padding_mask is not None:
        return of_mask(ctx.key_padding_mask, key, make)
    return _unpadded((key, ctx.q.device), make)


def dense_relative(ctx: AttentionContext, v: Tensor, description: Description, base_blocked: Optional[Tensor],
                   soft_bias: Optional[Tensor], scale: float, dropout_p: float, relative_positions) -> Tensor:
    """One branch of a full pass with Shaw et al.'s key and value terms (2018, eq. 3-4),
    ``B x H x Tq x Dh``: :class:`_RelativeAttention` with the branch's and the call's
    mask and score terms as one bias (the mask of :func:`_float_mask`, in the query's
    dtype, alone; with score terms, float32: Yang et al.'s Gaussian by
    :class:`_BiasedMask`), the rows without keys unblocked in that mask and zeroed
    after the call as :func:`dense_attention` does. ``relative_positions``: the core's
    :class:`~..relative_position.RelativePositions` (with value embeddings)."""
    gaussian, extra = _terms(description, ctx.src_len, soft_bias)
    mask, row_empty = _float_mask(ctx, description, base_blocked)
    if gaussian is not None or extra is not None:
        bias = _with_bias(ctx, gaussian, extra, mask, torch.float32)
    else:
        bias = None if mask is None else mask[..., :ctx.src_len]
    rel = relative_positions
    out = _RelativeAttention.apply(ctx.q, ctx.k, v, bias, rel.key_embeddings, rel.value_embeddings,
                                   rel.bucket(ctx)[0], scale, dropout_p)
    return out if row_empty is None else out.masked_fill(row_empty, 0.0)


class _RelativeAttention(torch.autograd.Function):
    """Attention with Shaw et al.'s relative position terms (2018, eq. 3-4; the clipping
    of eq. 5; section 3.3's per-bucket products) as one autograd function, for a full
    pass: ``q``, ``k``, ``v`` ``B x H x T x Dh`` (``q`` unscaled), ``bias`` broadcastable
    to ``B x H x Tq x Tk`` (mask and score terms, float32 or the query's dtype; or None),
    ``w^K`` and ``w^V`` ``R x Dh`` (R = 2K + 1), ``buckets`` ``1 x Tq x Tk`` (``clip(j -
    i, K) + K``), ``scale`` ``1 / sqrt(Dh)``, ``dropout_p`` the attention dropout::

        e     = scale (q k^T + (q W^K^T)[buckets]) + bias      (eq. 4, gathered per pair)
        alpha = dropout(softmax(e))                             (float32)
        z     = alpha v + (sum of alpha per bucket) W^V         (eq. 3)

    Forward: two products for the key term and the energies (the key term the
    ``baddbmm``'s addend), the bias, the softmax, the dropout, a scatter of the
    distribution into its R buckets and two products; backward likewise. One decoder
    self-attention sublayer of localness + rel_pos (its projections included, float32,
    training) makes 69 operators with it against 74 on the eager path of
    :class:`~..attention.AttentionCore`, whose autograd graph of the readable form is
    nearly as short; what it saves is the eager path's repairs and casts, and memory:
    it keeps the float32 distribution before dropout, the dropout's mask, the bucket
    sums (``B x H x Tq x R``) and its inputs, where the eager path also keeps the
    dropped distribution in the values' dtype (one sublayer, 3 sentences of 40 tokens,
    attention dropout 0.1, float32 and bfloat16: 0.53 to 0.68 of the eager path's
    bytes, ``tests/test_dense_path.py``).

    The products with q, k and v run in the inputs' dtype (their sums over keys too,
    as SDPA's), the softmax in float32, and so do the sums per bucket, the products
    with ``W^V`` and ``W^K`` and their gradients, and the energies' gradient (under
    autocast the forward pass's products run in its dtype). Gradients come back in
    each input's dtype; the bias's is that of the energies (``sum_to_size`` of its
    shape), where it needs one.

    Every row must keep a key: a row whose bias is ``-inf`` throughout gives NaN,
    forward and backward (:func:`dense_relative` unblocks such rows and zeroes them
    after the call)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, key_embeddings, value_embeddings, buckets, scale, dropout_p):
        bsz, heads, tgt_len, head_dim = q.shape
        src_len, rows, dtype = k.size(2), bsz * heads, q.dtype
        wide = torch.float64 if dtype == torch.float64 else torch.float32  # (float64: the tests' gradcheck)
        q3, k3, v3 = (t.reshape(rows, -1, head_dim) for t in (q, k, v))
        index = buckets.expand(rows, tgt_len, src_len)
        per_bucket = torch.matmul(q3, key_embeddings.to(dtype).t())  # rows x Tq x R
        energies = torch.baddbmm(per_bucket.gather(-1, index), q3, k3.transpose(1, 2), beta=scale, alpha=scale)
        energies = energies.view(bsz, heads, tgt_len, src_len)
        if bias is not None:
            energies = energies + bias
        probs = torch.softmax(energies, -1, dtype=wide)  # B x H x Tq x Tk
        keep = None
        dropped = probs
        if dropout_p > 0:
            dropped, keep = torch.ops.aten.native_dropout(probs, dropout_p, True)
        dropped = dropped.view(rows, tgt_len, src_len)
        sums = dropped.new_zeros(rows, tgt_len, key_embeddings.size(0)).scatter_add_(-1, index, dropped)
        value_term = torch.matmul(sums, value_embeddings.to(wide)).to(v.dtype)  # rows x Tq x Dh
        out = torch.baddbmm(value_term, dropped.to(v.dtype), v3)
        ctx.save_for_backward(q3, k3, v3, probs, keep, sums, key_embeddings, value_embeddings, buckets)
        ctx.scale, ctx.dropout_p = scale, dropout_p
        ctx.bias_shape = None if bias is None else bias.shape
        return out.view(bsz, heads, tgt_len, head_dim)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q3, k3, v3, probs, keep, sums, key_embeddings, value_embeddings, buckets = ctx.saved_tensors
        bsz, heads, tgt_len, src_len = probs.shape
        rows, dtype, head_dim, buckets_n = bsz * heads, q3.dtype, q3.size(-1), sums.size(-1)
        wide = probs.dtype
        index = buckets.expand(rows, tgt_len, src_len)
        scale, dropout_p = ctx.scale, ctx.dropout_p
        needs = ctx.needs_input_grad
        grad = grad_out.reshape(rows, tgt_len, head_dim).to(v3.dtype)
        probs3 = probs.view(rows, tgt_len, src_len)
        grad_v = grad_value_embeddings = None
        if needs[2]:
            dropped = probs3 if keep is None else torch.ops.aten.native_dropout_backward(
                probs3, keep.view(rows, tgt_len, src_len), _kept_scale(dropout_p))
            grad_v = torch.bmm(dropped.to(v3.dtype).transpose(1, 2), grad).view(bsz, heads, src_len, head_dim)
        if needs[5]:
            grad_value_embeddings = sums.view(-1, buckets_n).t().mm(grad.reshape(-1, head_dim).to(wide))
            grad_value_embeddings = grad_value_embeddings.to(value_embeddings.dtype)
        if not (needs[0] or needs[1] or needs[3] or needs[4]):  # nothing before the softmax
            return None, None, grad_v, None, None, grad_value_embeddings, None, None, None
        # d alpha = grad v^T + (grad W^V^T)[buckets]
        per_bucket = torch.matmul(grad, value_embeddings.to(v3.dtype).t())  # rows x Tq x R
        grad_dropped = torch.baddbmm(per_bucket.gather(-1, index), grad, v3.transpose(1, 2)).to(wide)
        if keep is not None:
            grad_dropped = torch.ops.aten.native_dropout_backward(
                grad_dropped, keep.view(rows, tgt_len, src_len), _kept_scale(dropout_p))
        grad_energies = torch._softmax_backward_data(grad_dropped, probs3, -1, wide)  # rows x Tq x Tk
        grad_bias = None
        if needs[3]:
            grad_bias = grad_energies.view(bsz, heads, tgt_len, src_len).sum_to_size(ctx.bias_shape)
        grad_q = grad_k = grad_key_embeddings = None
        if needs[0] or needs[1] or needs[4]:
            grad_scaled = grad_energies * scale  # d(q k^T) and d(the key term)
            grad_products = grad_scaled.to(dtype)
            if needs[1]:
                grad_k = torch.bmm(grad_products.transpose(1, 2), q3).view(bsz, heads, src_len, head_dim)
            if needs[0] or needs[4]:
                per_bucket = grad_scaled.new_zeros(rows, tgt_len, buckets_n).scatter_add_(-1, index, grad_scaled)
                if needs[0]:
                    key_part = torch.matmul(per_bucket, key_embeddings.to(wide)).to(dtype)
                    grad_q = torch.baddbmm(key_part, grad_products, k3).view(bsz, heads, tgt_len, head_dim)
                if needs[4]:
                    grad_key_embeddings = per_bucket.view(-1, buckets_n).t().mm(q3.reshape(-1, head_dim).to(wide))
                    grad_key_embeddings = grad_key_embeddings.to(key_embeddings.dtype)
        return grad_q, grad_k, grad_v, grad_bias, grad_key_embeddings, grad_value_embeddings, None, None, None


def _kept_scale(dropout_p: float) -> float:
    """The factor of a kept entry under dropout ``p``: ``1 / (1 - p)`` (0 at ``p = 1``,
    where nothing is kept and no gradient flows, as the eager path's dropout)."""
    return 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p)


def _terms(description: Description, src_len: int,
           soft_bias: Optional[Tensor]) -> Tuple[Optional[GaussianScore], Optional[Tensor]]:
    """The branch's first Gaussian term (Yang et al.'s, computed by :class:`_BiasedMask`)
    and the sum of its other score terms and ``soft_bias`` (``B' x H' x Tq x Tk``,
    float32), each or both None."""
    gaussian, extra = None, soft_bias
    for term in description.scores:
        if isinstance(term, GaussianScore) and gaussian is None:
            gaussian = term
            continue
        value = term.dense(src_len) if isinstance(term, BucketScore) else term.dense()
        extra = value if extra is None else extra + value
    return gaussian, extra


def _with_bias(ctx: AttentionContext, gaussian: Optional[GaussianScore], extra: Optional[Tensor],
               mask: Optional[Tensor], dtype: Optional[torch.dtype] = None) -> Tensor:
    """SDPA's float mask ``G + extra + mask`` in the query's dtype (or ``dtype``), ``B x
    H x Tq x Tk``, a view whose rows lie ``W`` (``Tk`` rounded up to a multiple of 8)
    elements apart: :class:`_BiasedMask`, which keeps nothing of that size for the
    backward pass."""
    src_len = ctx.src_len
    width = aligned_width(src_len)
    k_pos = centre = coeff = None
    if gaussian is not None:
        k_pos = gaussian.k_pos
        if width != src_len:
            k_pos = F.pad(k_pos, (0, width - src_len))
        centre, coeff = gaussian.centre, gaussian.coefficient()
    return _BiasedMask.apply(k_pos, centre, coeff, extra, mask, dtype or ctx.q.dtype, src_len, width)


class _BiasedMask(torch.autograd.Function):
    """``(G + extra + mask)`` in ``dtype``, ``G = (k_pos - P)^2 c`` (Yang et al. 2018, eq.
    5, with ``c = -1 / (2 sigma^2)``; ``k_pos`` ``B' x W``, P and c ``B x H x Tq``; or no
    G), ``extra`` a float32 bias broadcastable to ``B x H x Tq x Tk`` (or None), ``mask``
    0 and ``-inf`` at ``W`` columns (or None): computed at ``W`` columns and returned as
    a view of the first ``Tk``, so that its rows start where SDPA's memory-efficient
    kernel wants them (a mask whose rows do not is padded and copied by SDPA).

    Nothing of size ``Tq x Tk`` is kept for the backward pass (autograd's product, square
    and difference would keep two float32 tensors of that size per branch): it computes
    ``d = k_pos - P`` again and gives ``dL/dc = sum_j g d^2``, ``dL/dP = -2 c sum_j g d``
    and ``dL/dextra = g`` (summed over its broadcast dimensions).

    float16: ``G + extra`` is shifted by its row maximum over the visible keys and floored
    at the lowest finite float16 before ``mask`` is added (softmax is shift invariant per
    row, and the shift's gradient is zero), so that no visible key overflows to ``-inf``
    (:func:`~.sdpa._half_safe_bias`); the floored entries get no gradient (a boolean
    ``Tq x Tk`` tensor kept, in float16 only)."""

    @staticmethod
    def forward(ctx, k_pos, centre, coeff, extra, mask, dtype, src_len, width):
        ctx.extra_shape = None if extra is None else extra.shape
        ctx.extra_dtype = None if extra is None else extra.dtype
        total = None
        if centre is not None:
            total = (k_pos[:, None, None, :].float() - centre.float().unsqueeze(-1)).square_()
            total.mul_(coeff.float().unsqueeze(-1))
        if extra is not None:  # (a tensor of its own: the steps below write into it)
            if total is None:
                extra = extra.expand(*extra.shape[:-1], src_len)  # (a bias broadcast over the keys)
                total = extra.to(torch.float32, copy=True) if width == src_len \
                    else F.pad(extra.float(), (0, width - src_len))
            else:
                total[..., :src_len].add_(extra)
        floored = None
        if dtype == torch.float16:
            visible = total if mask is None else total + mask
            shift = visible[..., :src_len].amax(dim=-1, keepdim=True)  # (the columns past Tk: unspecified)
            shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
            total = total - shift
            low = torch.finfo(torch.float16).min
            floored = total < low
            total = total.clamp_(min=low)
        if mask is not None:
            total = total + mask if total.shape != torch.broadcast_shapes(total.shape, mask.shape) \
                else total.add_(mask)
        out = total.to(dtype)[..., :src_len]
        ctx.src_len = src_len
        ctx.save_for_backward(k_pos, centre, coeff, floored)
        return out

    @staticmethod
    def backward(ctx, grad):
        k_pos, centre, coeff, floored = ctx.saved_tensors
        src_len = ctx.src_len
        g = grad.float()
        if floored is not None:
            g = g.masked_fill(floored[..., :src_len], 0.0)
        grad_centre = grad_coeff = grad_extra = None
        if centre is not None and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            d = k_pos[:, None, None, :src_len].float() - centre.float().unsqueeze(-1)
            gd = g * d
            if ctx.needs_input_grad[2]:
                grad_coeff = (gd * d).sum(-1).to(coeff.dtype)
            if ctx.needs_input_grad[1]:
                grad_centre = (gd.sum(-1) * (-2.0 * coeff.float())).to(centre.dtype)
        if ctx.needs_input_grad[3]:
            grad_extra = g.sum_to_size(ctx.extra_shape).to(ctx.extra_dtype)
        return None, grad_centre, grad_coeff, grad_extra, None, None, None, None


def _float_mask(ctx: AttentionContext, description: Description,
                base_blocked: Optional[Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The call's and the branch's mask as ``(float mask B' x 1 x Tq x W, rows without
    keys B' x 1 x Tq x 1)``, each None where nothing is blocked or no row is empty; ``W``
    is ``Tk`` rounded up to a multiple of 8 (the caller takes the first ``Tk`` columns),
    the columns past ``Tk`` unspecified. Without padding, and where no row is empty, a
    view of a table of the window's distances (:func:`~..context.distance_table`: one
    ``N x N`` table per window, causality and dtype, nothing per call); the padding
    alone, :func:`~.sdpa.padding_bias` (shared with the other calls over that padding);
    padding with a window or causality, made once per window, lengths, causality, dtype
    and padding mask (:func:`~..context.of_mask`, kept while the padding mask lives); a
    mask given whole or an ``attn_mask`` of the call's own, per call."""
    window = description.window
    own_window = window_mask(ctx, window) if window is not None else None
    if description.mask is not None or ctx.cache.get("extra_mask"):
        return _make_mask(combine_masks(base_blocked, combine_masks(description.mask, own_window)), ctx.q.dtype)
    dtype = ctx.q.dtype
    if own_window is None and not ctx.causal:
        # nothing, or the keys' padding alone, which leaves no row empty (every sentence
        # has a real token): the float mask of the padding that other calls share
        if ctx.key_padding_mask is None:
            return None, None
        return padding_bias(ctx.key_padding_mask, dtype, padded=True), None
    left, right = (None, None) if window is None else (window.left, window.right)
    key: Hashable = ("dense mask", left, right, ctx.causal, ctx.tgt_len, ctx.src_len, dtype)
    if ctx.key_padding_mask is None:  # the window and the lengths alone decide
        if not leaves_rows_empty(left, right, ctx.causal, ctx.tgt_len, ctx.src_len):
            bounds = window if window is not None else Window(None, None)
            return _table_mask(bounds.causal() if ctx.causal else bounds, dtype, ctx.tgt_len, ctx.src_len,
                               ctx.q.device), None
        return _unpadded((key, ctx.q.device), lambda: _make_mask(combine_masks(base_blocked, own_window), dtype))
    # padding with a window or causality may leave rows empty, where the data decide
    return of_mask(ctx.key_padding_mask, key, lambda: _make_mask(combine_masks(base_blocked, own_window), dtype))


def _table_mask(window: Window, dtype: torch.dtype, tgt_len: int, src_len: int, device) -> Tensor:
    """The window (the core's causal bound applied) as 0 and ``-inf`` in ``dtype``, ``1
    x 1 x Tq x W``: a view of a cached table of distances."""

    def fn(d: Tensor) -> Tensor:
        mask = torch.zeros(d.shape, dtype=dtype, device=d.device)
        blocked = window.blocked(d)
        return mask if blocked is None else mask.masked_fill_(blocked, float("-inf"))

    key = ("dense mask", window.left, window.right, dtype)
    return distance_table(key, fn, tgt_len, src_len, device, aligned_width(src_len))[None, None]


def leaves_rows_empty(left: Optional[int], right: Optional[int], causal: bool, tgt_len: int, src_len: int) -> bool:
    """Whether the window ``-left <= d <= right`` (``d = j - q'``, queries bottom-right
    aligned, ``q' = i + Tk - Tq``; None: unbounded), with causality ``d <= 0``, leaves a
    query of ``tgt_len`` over ``src_len`` keys without a key, decided on the host: query
    ``q'`` keeps ``max(-left, -q') <= d <= min(right, Tk - 1 - q')``, empty for some
    ``q'`` in ``[Tk - Tq, Tk - 1]`` exactly where ``left + right < 0``, ``left < 0`` (the
    last query) or ``right < Tq - Tk`` (the first)."""
    left = src_len if left is None else left
    right = src_len if right is None else right
    if causal:
        right = min(right, 0)
    return left + right < 0 or left < 0 or right < tgt_len - src_len


def _make_mask(blocked: Optional[Tensor], dtype: torch.dtype) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``blocked`` (boolean, True = blocked, ``... x Tq x Tk``) as SDPA's float mask of 0
    and ``-inf`` in ``dtype`` at ``W`` columns (``Tk`` rounded up to a multiple of 8, 0
    past ``Tk``), with rows whose every key is blocked unblocked; and those rows (``... x
    Tq x 1``), whose output the caller zeroes: the masks made here have such rows, or
    depend on data (testing them for such rows would wait for the device)."""
    if blocked is None:
        return None, None
    with torch.no_grad():
        row_empty = blocked.all(dim=-1, keepdim=True)
        blocked = blocked & ~row_empty
        *lead, tgt_len, src_len = blocked.shape
        mask = torch.zeros(*lead, tgt_len, aligned_width(src_len), dtype=dtype, device=blocked.device)
        mask[..., :src_len].masked_fill_(blocked, float("-inf"))
    return mask, row_empty
