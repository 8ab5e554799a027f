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
Tq x Tk`` tensor kept for the backward pass, with its gradient (SDPA's memory-efficient
kernel computes it), where the fused call keeps nothing of that size. Which is faster
on a GPU is measured by ``scripts/gpu_attention_probe.py``'s ``dense`` variant and by
``fairseq-localness-bench --attention-impl auto dense`` (docs/benchmark.md); not yet
measured on one, so ``"auto"`` keeps the fused call there. On a CPU ``"auto"`` keeps the
kernels chosen there (the band, the CPU flash kernel, the recomputation per block).

What the path computes, per branch (:func:`dense_attention`):

* the branch's window, the call's padding and causality as one float mask of 0 and
  ``-inf`` in the query's dtype (none for the plain causal mask alone, which goes to
  SDPA as ``is_causal``), made once per window, lengths, dtype and padding mask
  and shared by the layers of a pass (:func:`~..context.of_mask`; without padding, by
  every call of that shape, :func:`~..context._unpadded`): no kernel per call. Its rows
  lie a multiple of 8 elements apart (SDPA's memory-efficient kernel copies a mask
  whose rows do not). A boolean mask would cost a conversion per call, and SDPA turns
  it into a finite minimum for cuDNN's kernel, which would give a row without keys a
  distribution.
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
return: a full pass with it takes the eager path (:func:`~.choice.use_fast_path`). One
query row (a decoding step) takes the kernels ``"auto"`` takes (:mod:`.step`; on CUDA
one fused call).
"""
from typing import Hashable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_localness.modules.context import AttentionContext, _unpadded, combine_masks, of_mask, window_mask
from fairseq_localness.modules.scores import BucketScore, Description, GaussianScore


def applies(ctx: AttentionContext, impl: str) -> bool:
    """Whether a call of a core with ``attention_impl`` ``impl`` takes this path: ``"dense"``
    and a full pass (``Tq > 1``)."""
    return impl == "dense" and ctx.tgt_len > 1


def dense_attention(ctx: AttentionContext, v: Tensor, description: Description, base_blocked: Optional[Tensor],
                    soft_bias: Optional[Tensor], dropout_p: float) -> Tensor:
    """One branch, ``B x H x Tq x Dh``: ``F.scaled_dot_product_attention`` with the
    branch's and the call's mask as a float mask (:func:`_float_mask`) and its score
    terms plus ``soft_bias`` added (see the module docstring). ``base_blocked``: the
    call's padding and causality (:func:`~..context.base_mask`); ``dropout_p``: the
    attention dropout drawn by the kernel."""
    bias = _score_bias(description, ctx.src_len)
    if soft_bias is not None:
        bias = soft_bias if bias is None else bias + soft_bias
    if bias is None and description.mask is None and description.window is None \
            and base_blocked is not None and base_blocked is ctx.cache.get("plain_causal"):
        # the plain causal mask alone: the kernels that skip the blocks above the diagonal
        return F.scaled_dot_product_attention(ctx.q, ctx.k, v, dropout_p=dropout_p, is_causal=True)
    mask, row_empty = _float_mask(ctx, description, base_blocked)
    if bias is not None:
        mask = _biased(bias, mask, ctx.q.dtype)
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


def _score_bias(description: Description, src_len: int) -> Optional[Tensor]:
    """The sum of the branch's score terms, ``B' x H' x Tq x Tk`` (float32), or None;
    Yang et al.'s Gaussian as ``(k_pos - P)^2 c`` (one subtraction, square and product;
    the eager reference divides by ``2 sigma^2``, the same to rounding)."""
    bias = None
    for term in description.scores:
        if isinstance(term, GaussianScore):
            value = (term.k_pos[:, None, None, :] - term.centre.unsqueeze(-1)).square() \
                * term.coefficient().unsqueeze(-1)
        elif isinstance(term, BucketScore):
            value = term.dense(src_len)
        else:
            value = term.dense()
        bias = value if bias is None else bias + value
    return bias


def _float_mask(ctx: AttentionContext, description: Description,
                base_blocked: Optional[Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The call's and the branch's mask as ``(float mask B' x 1 x Tq x Tk, rows without
    keys B' x 1 x Tq x 1)`` (:func:`_make_mask`), each None where nothing is blocked or
    no row is empty; made once per window, lengths, causality, dtype and padding mask
    where the mask is the window's, the padding's and causality's alone, else per call
    (a mask given whole, an ``attn_mask`` of the call's own)."""
    window = description.window
    own_window = window_mask(ctx, window) if window is not None else None
    if description.mask is not None or ctx.cache.get("extra_mask"):
        return _make_mask(combine_masks(base_blocked, combine_masks(description.mask, own_window)), ctx.q.dtype,
                          "always")
    key: Hashable = ("dense mask", None if window is None else (window.left, window.right), ctx.causal,
                     ctx.tgt_len, ctx.src_len, ctx.q.dtype)

    if ctx.key_padding_mask is None:  # the window and the lengths alone decide
        left, right = (None, None) if window is None else (window.left, window.right)
        repair = "always" if leaves_rows_empty(left, right, ctx.causal, ctx.tgt_len, ctx.src_len) else "never"
    else:  # padding alone leaves no row empty (every sentence has a real token); with a
        # window or causality it may, where the data decide
        repair = "always" if own_window is not None or ctx.causal else "never"

    def make():
        return _make_mask(combine_masks(base_blocked, own_window), ctx.q.dtype, repair)

    if ctx.key_padding_mask is not None:
        return of_mask(ctx.key_padding_mask, key, make)
    return _unpadded((key, ctx.q.device), make)


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


def _make_mask(blocked: Optional[Tensor], dtype: torch.dtype, repair: str) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``blocked`` (boolean, True = blocked) as SDPA's float mask of 0 and ``-inf`` in
    ``dtype``, its rows ``Tk`` rounded up to a multiple of 8 apart (a view of the first
    ``Tk`` columns), with rows whose every key is blocked unblocked; and those rows
    (``... x Tq x 1``), whose output the caller zeroes, where ``repair`` is
    ``"always"`` (a mask with such rows, or one that depends on data: testing it for
    them would wait for the device); ``"never"``: no row is empty (the keys' padding
    alone; a window that :func:`leaves_rows_empty` says leaves none)."""
    if blocked is None:
        return None, None
    with torch.no_grad():
        row_empty = None if repair == "never" else blocked.all(dim=-1, keepdim=True)
        if row_empty is not None:
            blocked = blocked & ~row_empty
        *lead, tgt_len, src_len = blocked.shape
        width = -(-src_len // 8) * 8
        mask = torch.zeros(*lead, tgt_len, width, dtype=dtype, device=blocked.device)
        mask[..., :src_len].masked_fill_(blocked, float("-inf"))
    return mask[..., :src_len], row_empty


def _biased(bias: Tensor, mask: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """``bias + mask`` in ``dtype`` (``mask`` 0 or ``-inf``, or None). float16: ``bias``
    shifted by its detached row maximum over the visible keys and floored at the lowest
    finite float16 first (softmax is shift invariant per row; the shift's gradient is
    zero), so that no visible key overflows to ``-inf`` (as :func:`~.sdpa._half_safe_bias`);
    bfloat16 and float32 have float32's range and are cast."""
    if dtype == torch.float16:
        with torch.no_grad():
            visible = bias if mask is None else bias + mask
            shift = visible.amax(dim=-1, keepdim=True)
            shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        bias = (bias - shift).clamp(min=torch.finfo(torch.float16).min)
    total = bias if mask is None else bias + mask
    return total.to(dtype)
