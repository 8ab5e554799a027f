"""Shaw et al. (2018) relative-position attention on the CPU flash kernel: two fused
kernel calls and a band of ``2K - 1`` keys, nothing of size ``T x T`` written or kept.

Shape notation as in :mod:`.attention`; K = clipping distance, R = 2K + 1 buckets,
``s = 1 / sqrt(Dh)``.

Shaw et al. (2018), eq. 3-4 (eq. 2 for the values), over keys ``j`` of query ``i``::

    e_ij = s q_i (k_j + w^K_b)^T,   z_i = sum_j alpha_ij (v_j + w^V_b),   b = clip(j - i, -K, K) + K

The bucket is constant on the two far regions, ``j <= i - K`` (bucket 0) and
``j >= i + K`` (bucket 2K): there the relative term is a per-row constant
``c_i = s q_i w^K_b`` added to plain energies, so each far region is ordinary
attention, shifted by ``c_i`` in its log-normaliser. This module splits each row into

* the far left, ``j <= i - K``: the CPU flash kernel with ``is_causal`` on the queries
  ``K ..`` and the keys ``.. T - K - 1`` (its causal mask is then ``j <= i - K``);
* the far right, ``j >= i + K``: the same on the reversed sequence (absent in causal
  self-attention, where those keys are in the future);
* the band, ``|j - i| < K`` (``-K < j - i <= 0`` when causal): energies with their
  exact bucket terms over ``2K - 1`` (K) slots, as :mod:`.banded` computes a window,

and merges the three with their log-normalisers (as the blocks of flash attention
are merged, Dao et al. 2022): with ``a_r`` region r's log-normaliser (far regions:
the kernel's plus ``c_i``), ``L = logsumexp_r a_r`` and ``w_r = exp(a_r - L)``::

    z_i = w_left (o_left + w^V_0) + w_right (o_right + w^V_2K) + sum_band p_ij (v_j + w^V_b)

The backward pass calls the kernel's backward for each far region with the final
output and ``L - c_i`` as its log-sum-exp, so the kernel recomputes the global
probabilities ``p_ij = exp(e_ij - L)``; the value term's ``dO_i w^V_b`` (constant on
the region) enters through the output it is given (``z - w^V_b``: the kernel's
``rowsum(dO * out)`` then is ``delta_i - dO_i w^V_b``). The gradient of ``c_i`` is
``sum_j dS_ij = dO_i x_i - w_i delta_i`` with ``x_i`` the region's share of ``z_i``.
Kept for the backward pass: ``q, k, v, z``, ``L``, the band's ``T x (2K - 1)``
probabilities, and (not causal) the far-left share of ``z``.

Padding is an additive mask of the most negative finite value / 2, not ``-inf``: a far
region whose keys are all padding (left padding, first rows) would give the kernel's
backward pass ``NaN``; with a finite mask its probabilities are exactly 0, and its
weight ``w_r`` is set to 0. Index distances equal real-position distances for every
row that is used (:func:`~.attention.distance_table`).
"""
from typing import Optional

import torch
from torch import Tensor

from fairseq_localness.modules.banded import band_apply, band_apply_transposed, band_scores, band_slots_blocked

_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)

AVAILABLE = _FLASH is not None and _FLASH_BACKWARD is not None

# A log-normaliser at or below this belongs to a region whose keys are all masked.
_EMPTY = -1e30


def padding_bias(key_padding_mask: Optional[Tensor], dtype) -> Optional[Tensor]:
    """``B x 1 x 1 x T`` additive mask: 0 at keys, ``finfo.min / 2`` at padding."""
    if key_padding_mask is None:
        return None
    low = torch.finfo(dtype).min / 2
    return torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device).masked_fill_(
        key_padding_mask, low)[:, None, None]


def _far(q, k, v, scale, bias, k_clip):
    """The far-left region ``j <= i - K`` of every query ``i >= K``: the kernel's output
    and log-sum-exp over rows ``K .. T - 1``."""
    t = q.size(2)
    mask = None if bias is None else bias[..., : t - k_clip]
    return _FLASH(q[:, :, k_clip:], k[:, :, : t - k_clip], v[:, :, : t - k_clip], 0.0, True,
                  attn_mask=mask, scale=scale)


def _far_backward(grad, q, k, v, out, lse, scale, bias, k_clip):
    t = q.size(2)
    mask = None if bias is None else bias[..., : t - k_clip]
    dq, dk, dv = _FLASH_BACKWARD(
        grad[:, :, k_clip:].contiguous(), q[:, :, k_clip:], k[:, :, : t - k_clip], v[:, :, : t - k_clip],
        out[:, :, k_clip:].contiguous(), lse[:, :, k_clip:].contiguous(), 0.0, True, attn_mask=mask, scale=scale)
    return dq, dk, dv


class _ShawFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_emb, value_emb, scale, k_clip, causal, key_padding_mask):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        t = q.size(2)
        right = 0 if causal else k_clip - 1
        buckets = slice(1, k_clip + right + 1)  # the band's slots o = 0 .. : bucket o + 1
        bias = padding_bias(key_padding_mask, q.dtype)
        rel = torch.matmul(q, key_emb.t()) * scale  # B x H x T x R: s q_i w^K_b
        blocked = band_slots_blocked(key_padding_mask, t, t, k_clip - 1, right, q.device)
        band = band_scores(q, k, k_clip - 1, right) * scale + rel[..., buckets]
        band = band.masked_fill(blocked, float("-inf"))
        parts = [torch.logsumexp(band, -1)]  # B x H x T
        far = t > k_clip
        if far:
            left_out, left_lse = _far(q, k, v, scale, bias, k_clip)
            parts.append(_region_lse(left_lse, rel[:, :, k_clip:, 0], k_clip))
            if not causal:
                flipped = None if bias is None else bias.flip(-1)
                right_out, right_lse = _far(q.flip(2), k.flip(2), v.flip(2), scale, flipped, k_clip)
                parts.append(_region_lse(right_lse, rel[:, :, : t - k_clip, -1].flip(-1), k_clip).flip(-1))
        lse = torch.logsumexp(torch.stack(parts), 0)
        # a row without any key: +inf makes every probability (here and in the kernel's
        # backward pass) 0, so its output and gradients are 0, as in the reference path
        lse = torch.where(lse > _EMPTY, lse, float("inf"))
        probs = torch.exp(band - lse.unsqueeze(-1))  # global probabilities of the band slots
        out = band_apply(probs, v, k_clip - 1, right) + torch.matmul(probs, value_emb[buckets])
        weights = left_share = None
        if far:
            weights = torch.exp(torch.stack(parts[1:]) - lse)  # w_left (, w_right): 1|2 x B x H x T
            left_share = torch.zeros_like(out)
            left_share[:, :, k_clip:] = weights[0, ..., k_clip:, None] * (left_out + value_emb[0])
            out = out + left_share
            if not causal:
                out[:, :, : t - k_clip] += weights[1, ..., : t - k_clip, None] * (right_out.flip(2) + value_emb[-1])
        ctx.scale, ctx.k_clip, ctx.causal = scale, k_clip, causal
        ctx.save_for_backward(q, k, v, key_emb, value_emb, key_padding_mask, out, lse, probs, weights, left_share)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, key_emb, value_emb, key_padding_mask, out, lse, probs, weights, left_share = ctx.saved_tensors
        scale, k_clip, causal = ctx.scale, ctx.k_clip, ctx.causal
        t = q.size(2)
        right = 0 if causal else k_clip - 1
        buckets = slice(1, k_clip + right + 1)
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1)  # B x H x T
        grad_rel = torch.zeros(q.shape[:-1] + key_emb.shape[:1], dtype=q.dtype, device=q.device)
        mass = torch.zeros_like(grad_rel)  # sum of p_ij per bucket: the value term's weights
        # the band: dS = p (dP - delta), dP_ij = dO_i (v_j + w^V_b)
        grad_probs = band_scores(grad_out, v, k_clip - 1, right) + torch.matmul(grad_out, value_emb[buckets].t())
        grad_band = probs * (grad_probs - delta.unsqueeze(-1))
        grad_rel[..., buckets] = grad_band
        mass[..., buckets] = probs
        grad_q = band_apply(grad_band, k, k_clip - 1, right) * scale
        grad_k = band_apply_transposed(grad_band, q, k_clip - 1, right) * scale
        grad_v = band_apply_transposed(probs, grad_out, k_clip - 1, right)
        if weights is not None:
            bias = padding_bias(key_padding_mask, q.dtype)
            rel = torch.matmul(q, key_emb.t()) * scale
            shares = [left_share]
            if not causal:  # z minus the band's and the far left's shares
                band_out = band_apply(probs, v, k_clip - 1, right) + torch.matmul(probs, value_emb[buckets])
                shares.append(out - band_out - left_share)
            for region, share in enumerate(shares):
                bucket = -region  # 0 (far left) or -1 = 2K (far right)
                c = rel[..., bucket]
                # the kernel recomputes p_ij = exp(e_ij - (L - c_i)) and takes
                # rowsum(dO * (z - w^V_b)) = delta - dO w^V_b
                args = [grad_out, q, k, v, out - value_emb[bucket], lse - c]
                if region:
                    args = [x.flip(-1 if x.dim() == 3 else 2) for x in args]
                mask = None if bias is None else (bias.flip(-1) if region else bias)
                dq, dk, dv = _far_backward(*args, scale, mask, k_clip)
                if region:  # rows 0 .. T - K - 1 read keys K ..
                    grad_q[:, :, : t - k_clip] += dq.flip(2)
                    grad_k[:, :, k_clip:] += dk.flip(2)
                    grad_v[:, :, k_clip:] += dv.flip(2)
                else:  # rows K .. read keys .. T - K - 1
                    grad_q[:, :, k_clip:] += dq
                    grad_k[:, :, : t - k_clip] += dk
                    grad_v[:, :, : t - k_clip] += dv
                # c_i's gradient sum_j dS_ij = dO_i x_i - w_i delta_i (x_i: the share)
                grad_rel[..., bucket] = (grad_out * share).sum(-1) - weights[region] * delta
                mass[..., bucket] = weights[region]
        grad_q = grad_q + torch.matmul(grad_rel, key_emb) * scale
        flat = lambda x: x.reshape(-1, x.size(-1))  # noqa: E731
        grad_key_emb = flat(grad_rel).t().matmul(flat(q)) * scale
        grad_value_emb = flat(mass).t().matmul(flat(grad_out))
        return grad_q, grad_k, grad_v, grad_key_emb, grad_value_emb, None, None, None, None


def _region_lse(kernel_lse: Tensor, c: Tensor, k_clip: int) -> Tensor:
    """A far region's log-normaliser over all T rows: the kernel's plus ``c_i`` on rows
    ``K ..``, ``-inf`` where the region has no key (the first K rows, or all padding)."""
    a = torch.where(kernel_lse > _EMPTY, kernel_lse + c, float("-inf"))
    return torch.nn.functional.pad(a, (k_clip, 0), value=float("-inf"))


def shaw_flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    key_embeddings: Tensor,
    value_embeddings: Optional[Tensor],
    causal: bool = False,
    key_padding_mask: Optional[Tensor] = None,
) -> Tensor:
    """Self-attention with Shaw et al.'s key and value terms (see the module
    docstring): ``q``, ``k``, ``v`` ``B x H x T x Dh`` (``q`` unscaled), the clipping
    distance ``K = (key_embeddings.size(0) - 1) / 2``, ``value_embeddings`` None for
    no value term, ``causal`` for ``j <= i``, ``key_padding_mask`` ``B x T`` (True at
    padding) or None. Returns ``B x H x T x Dh``."""
    k_clip = (key_embeddings.size(0) - 1) // 2
    if value_embeddings is None:
        value_embeddings = key_embeddings.new_zeros(key_embeddings.shape)
    return _ShawFlash.apply(q, k, v, key_embeddings.to(q.dtype), value_embeddings.to(q.dtype), scale, k_clip,
                            causal, key_padding_mask)


def shaw_step_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    key_embeddings: Tensor,
    value_embeddings: Optional[Tensor],
    key_padding_mask: Optional[Tensor] = None,
) -> Tensor:
    """One incremental step of Shaw et al.'s self-attention: the query is the last
    position (``i' = Tk - 1``), ``q`` ``B x H x 1 x Dh`` (unscaled), ``k``, ``v`` ``B x H
    x Tk x Dh``. Every key is at distance ``j - i' <= 0``: the first ``Tk - K`` are in
    bucket 0, the last K in buckets ``1 .. K``, so the key term is one constant and K
    values concatenated, and the value term is bucket 0's summed probability times
    ``w^V_0`` plus the last K probabilities times ``w^V_1 .. w^V_K`` (no gather or
    scatter over the keys). Rows without keys give 0. Returns ``B x H x 1 x Dh``."""
    k_clip = (key_embeddings.size(0) - 1) // 2
    src_len = k.size(2)
    near = min(k_clip, src_len)  # keys in buckets K - near + 1 .. K
    far = src_len - near
    per_bucket = torch.matmul(q, key_embeddings.to(q.dtype).t()) * scale  # B x H x 1 x R
    near_buckets = slice(k_clip + 1 - near, k_clip + 1)
    terms = per_bucket[..., near_buckets]
    if far:
        terms = torch.cat([per_bucket[..., :1].expand(-1, -1, -1, far), terms], dim=-1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale + terms
    scores = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # a row without keys: 0
    out = torch.matmul(probs.to(v.dtype), v)
    if value_embeddings is not None:
        value = value_embeddings.to(probs.dtype)
        out = out + torch.matmul(probs[..., far:], value[near_buckets]).to(v.dtype)
        if far:
            out = out + (probs[..., :far].sum(-1, keepdim=True) * value[0]).to(v.dtype)
    return out
