"""torch's fused attention kernels: ``F.scaled_dot_product_attention`` with a branch's
boolean mask and additive bias, and the CPU flash kernel with ``is_causal`` and a
padding mask.

Shape notation as in :mod:`~fairseq_localness.modules.attention`: B = batch size,
H = heads, Tq = query length, Tk = key length, Dh = head dimension. Queries ``q`` are
unscaled, ``B x H x Tq x Dh``; outputs are ``B x H x Tq x Dh`` in the input dtype.

One call per branch recomputes ``q k^T`` (and again in the backward pass) and keeps
the branch's output (``B x H x Tq x Dh``) for the backward pass instead of its
distribution (``B x H x Tq x Tk``). Which branch comes here is decided in
:mod:`.choice`.
"""
import re
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_localness.modules.context import AttentionContext, aligned_width, empty_rows, of_mask


def _torch_version() -> Tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


# From torch 2.5 on, F.scaled_dot_product_attention returns zeros, with zero
# gradients, for a query row whose keys are all masked (pytorch/pytorch#133882,
# "_safe_softmax"); before, such a row gave NaN. The fast path relies on it on CPUs,
# where tests/test_attention_core.py checks it; on accelerators (not checked here) and
# with older torch it repairs empty rows as the eager path does.
SDPA_ZEROES_EMPTY_ROWS_ON_CPU = _torch_version() >= (2, 5)

# The CPU flash attention kernel behind F.scaled_dot_product_attention, called directly
# where the core needs ``is_causal`` together with a padding mask (SDPA refuses an
# explicit mask with ``is_causal``; the kernel takes both). None where torch lacks it.
CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def masked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    blocked: Optional[Tensor],
    bias: Optional[Tensor],
    dropout_p: float,
    is_causal: bool,
) -> Tensor:
    """``F.scaled_dot_product_attention`` with a boolean mask ``blocked`` (True =
    blocked) and an additive ``bias``, both broadcastable to ``B x H x Tq x Tk``, and
    attention dropout ``dropout_p`` drawn by the kernel.

    * ``is_causal`` (with ``blocked`` None) for the plain causal mask (no padding, no
      bias, Tq = Tk), where top-left and bottom-right alignment coincide and the fused
      kernel skips the masked blocks; SDPA refuses an explicit ``attn_mask`` together
      with ``is_causal=True``, so a biased or windowed branch keeps the causal mask
      inside its own mask.
    * A bias goes in as a float mask of the input dtype with ``-inf`` at blocked keys
      (:func:`_half_safe_bias`).
    * Empty rows: on a CPU torch >= 2.5 returns zeros for them; elsewhere they are
      repaired as in the eager path (unblocked, output zeroed; on a CPU only when a row
      is empty, on an accelerator always, without waiting for the device; on CUDA five
      kernels a call). A call whose mask is the keys' padding alone, where every
      sentence has a real token, needs no repair: :func:`padding_attention`.
    """
    row_empty = None
    mask = None
    if blocked is not None and not (SDPA_ZEROES_EMPTY_ROWS_ON_CPU and q.device.type == "cpu"):
        row_empty = empty_rows(blocked)  # no host sync on accelerators: always repairs there
        if row_empty is not None:
            blocked = blocked & ~row_empty
    if bias is not None:
        mask = _half_safe_bias(bias, blocked, q.dtype)
        if blocked is not None:
            mask = mask.masked_fill(blocked, float("-inf"))
    elif blocked is not None:
        mask = ~blocked
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    if row_empty is not None:
        out = out.masked_fill(row_empty, 0.0)
    return out


def padding_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                      dropout_p: float) -> Tensor:
    """``F.scaled_dot_product_attention`` over the keys that are not padding
    (``key_padding_mask`` ``B x Tk``, True at padding, or None), with attention dropout
    ``dropout_p``, for queries that each keep a real key (the Dual Contextual module's
    encoder: every sentence of a fairseq batch has a real token), so no row needs
    :func:`masked_attention`'s repair. The mask is :func:`padding_bias`, made once per
    padding mask and dtype for all the layers of a pass: where a boolean mask costs
    SDPA a conversion per call (on CUDA a ``where`` and two fills) and its caller a
    ``bitwise_not``."""
    mask = None if key_padding_mask is None else padding_bias(key_padding_mask, q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def padding_bias(key_padding_mask: Tensor, dtype: torch.dtype, padded: bool = False) -> Tensor:
    """``B x 1 x 1 x Tk`` in ``dtype``: 0 at the real keys, ``-inf`` at padding
    (``key_padding_mask`` ``B x Tk``, True at padding), SDPA's float mask of the
    padding alone; made once per padding mask and dtype
    (:func:`~fairseq_localness.modules.context.of_mask`: a mask sliced per call is a
    new mask each time), shared: do not write into it. Its rows lie a multiple of 8
    elements apart (SDPA's memory-efficient kernel on CUDA copies a mask whose rows are
    not): ``padded``, the whole rows, ``Tk`` rounded up to a multiple of 8 with 0
    beyond ``Tk``."""

    def make() -> Tensor:
        bsz, src_len = key_padding_mask.shape
        width = aligned_width(src_len)
        bias = torch.zeros(bsz, 1, 1, width, dtype=dtype, device=key_padding_mask.device)
        bias[..., :src_len].masked_fill_(key_padding_mask.bool()[:, None, None, :], float("-inf"))
        return bias

    rows = of_mask(key_padding_mask, ("sdpa padding bias", dtype), make)
    return rows if padded else rows[..., : key_padding_mask.size(1)]


def _half_safe_bias(bias: Tensor, blocked: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """``bias`` in ``dtype`` for SDPA's float mask. float16: shifted by the detached
    row maximum over the visible keys (softmax is shift invariant per row, and the
    shift's gradient is zero) and floored at the lowest finite float16, so no visible
    key overflows to ``-inf``: a bias far below -65504 (a Gaussian window near 0 with
    ``min_window=0``) would otherwise overflow and empty its row, where the float32
    reference still has a distribution. bfloat16 and float32 have float32's range and
    are cast."""
    if dtype != torch.float16:
        return bias.to(dtype)
    with torch.no_grad():
        visible = bias if blocked is None else bias.masked_fill(blocked, float("-inf"))
        shift = visible.amax(dim=-1, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    low = torch.finfo(torch.float16).min
    return (bias - shift).clamp(min=low).to(dtype)


def causal_flash_attention(ctx: AttentionContext, v: Tensor, scale: float, reverse: bool) -> Tensor:
    """The keys ``j <= i`` of each query (a forward branch, or the causal core's own
    mask) through the CPU flash kernel with ``is_causal`` (it skips the blocks above
    the diagonal) and the padding as a ``B x 1 x 1 x Tk`` additive mask; with
    ``reverse``, the keys ``j >= i`` (a backward branch, Song et al. 2019, eq. 9) on the
    reversed sequence (``j >= i`` is ``j' <= i'`` for ``i' = T - 1 - i``). Full passes
    (``Tq = Tk``) without attention dropout (the CPU kernel has none)."""
    if not reverse:
        return CPU_FLASH(ctx.q, ctx.k, v, 0.0, True, attn_mask=_padding_bias(ctx), scale=scale)[0]
    flip = lambda t: t.flip(2)  # noqa: E731
    bias = _padding_bias(ctx)
    bias = None if bias is None else bias.flip(-1)
    out = CPU_FLASH(flip(ctx.q), flip(ctx.k), flip(v), 0.0, True, attn_mask=bias, scale=scale)[0]
    return flip(out)


def _padding_bias(ctx: AttentionContext) -> Optional[Tensor]:
    """The key padding mask as an additive ``B x 1 x 1 x Tk`` mask of the query dtype
    (``-inf`` at padding), once per attention call; None without padding."""
    if ctx.key_padding_mask is None:
        return None
    if "padding_bias" not in ctx.cache:
        bias = torch.zeros(ctx.key_padding_mask.shape, dtype=ctx.q.dtype, device=ctx.q.device)
        ctx.cache["padding_bias"] = bias.masked_fill_(ctx.key_padding_mask, float("-inf"))[:, None, None]
    return ctx.cache["padding_bias"]
