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
:func:`last_keys_windows` computes them once and gives each window a row of its own,
so one softmax and one product serve all branches, and the outputs come stacked for a
fusion that takes them whole (HySAN's squeeze gate over all branches at once).
"""
from typing import Optional, Sequence

import torch
from torch import Tensor

from fairseq_localness.modules.context import one_row_softmax


def last_keys_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, key_padding_mask: Optional[Tensor], left: Optional[int]
) -> Tensor:
    """``q`` ``B x H x 1 x Dh`` (unscaled) over the last ``left + 1`` keys of ``k``, ``v``
    (``B x H x Tk x Dh``; all of them for ``left`` None), ``key_padding_mask``
    ``B x Tk`` (True at padding) or None; returns ``B x H x 1 x Dh`` in ``v``'s dtype."""
    if left is not None and left + 1 < k.size(2):
        k, v = k[:, :, -(left + 1) :], v[:, :, -(left + 1) :]
        key_padding_mask = None if key_padding_mask is None else key_padding_mask[:, -(left + 1) :]
    probs = one_row_softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, key_padding_mask)  # B x H x 1 x W
    return torch.matmul(probs.to(v.dtype), v)


def last_keys_windows(
    q: Tensor, k: Tensor, v: Tensor, scale: float, key_padding_mask: Optional[Tensor], lefts: Sequence[Optional[int]]
) -> Tensor:
    """:func:`last_keys_attention` for L windows at once, window ``b`` over the last
    ``lefts[b] + 1`` keys (all for None): the energies of the row once, one row per
    window (the keys before its window set to -inf), one float32 softmax and one product
    for all. Returns ``B x H x L x 1 x Dh`` in ``v``'s dtype (branch outputs on dim 2,
    as :class:`~fairseq_localness.modules.fusion.BranchOutputs` takes them)."""
    bsz, heads, _, head_dim = q.shape
    src_len = k.size(2)
    energies = torch.matmul(q, k.transpose(-1, -2)) * scale  # B x H x 1 x Tk
    rows = energies.expand(bsz, heads, len(lefts), src_len).contiguous()  # B x H x L x Tk
    for row, left in enumerate(lefts):
        if left is not None and left + 1 < src_len:
            rows[:, :, row, : src_len - 1 - left].fill_(float("-inf"))
    probs = one_row_softmax(rows, key_padding_mask)
    return torch.matmul(probs.to(v.dtype), v).unsqueeze(3)
