"""One query row: an incremental decoding step, the query at the last key position,
or a one-token pass.

Shape notation as in :mod:`~fairseq_localness.modules.attention`. Over the keys
``j >= Tk - 1 - left`` (all for ``left`` None): the energies of the last ``left + 1``
keys, a float32 softmax and one product, as fairseq's own attention computes a step.
(The fused kernels' per-call cost exceeds the arithmetic of one row.) A row without
keys gives 0. Shaw et al.'s terms have their own step,
:meth:`~fairseq_localness.modules.relative_position.RelativePositions.step_attention`.

Several windows of one row (HySAN's decoder branches, Song et al. 2019, eq. 11; the
hybrid's global and local branches, Xu et al. 2019, eq. 1-3) share the row's energies:
:func:`~.windows.windows_attention` computes them once for all windows.
"""
from typing import Optional

import torch
from torch import Tensor

from fairseq_localness.modules.context import one_row_softmax


def heads_bmm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` over the leading ``B x H`` dimensions (``B x H x M x K`` by ``B x H x K
    x N``) as one ``bmm`` of ``(B*H)``-batched views: what ``torch.matmul`` computes,
    in one operator call instead of its seven (an incremental step is a few dozen such
    calls, each costing more than its arithmetic). The caches' ``B x H x T x Dh`` views
    (:func:`~fairseq_localness.modules.incremental.append_steps`) and split heads merge
    their first two dimensions without a copy."""
    bsz, heads = a.shape[:2]
    out = torch.bmm(a.reshape(bsz * heads, a.size(2), a.size(3)), b.reshape(bsz * heads, b.size(2), b.size(3)))
    return out.view(bsz, heads, out.size(1), out.size(2))


def last_keys_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, key_padding_mask: Optional[Tensor], left: Optional[int]
) -> Tensor:
    """``q`` ``B x H x 1 x Dh`` (unscaled) over the last ``left + 1`` keys of ``k``, ``v``
    (``B x H x Tk x Dh``; all of them for ``left`` None), ``key_padding_mask``
    ``B x Tk`` (True at padding) or None; returns ``B x H x 1 x Dh`` in ``v``'s dtype."""
    if left is not None and left + 1 < k.size(2):
        k, v = k[:, :, -(left + 1) :], v[:, :, -(left + 1) :]
        key_padding_mask = None if key_padding_mask is None else key_padding_mask[:, -(left + 1) :]
    probs = one_row_softmax(heads_bmm(q, k.transpose(-1, -2)) * scale, key_padding_mask)  # B x H x 1 x W
    return heads_bmm(probs.to(v.dtype), v)
