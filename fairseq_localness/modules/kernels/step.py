"""One query row: an incremental decoding step, the query at the last key position,
or a one-token pass.

Shape notation as in :mod:`~fairseq_localness.modules.attention`. Over the keys
``j >= Tk - 1 - left`` (all for ``left`` None): the energies of the last ``left + 1``
keys, a float32 softmax and one product, as fairseq's own attention computes a step.
(The fused kernels' per-call cost exceeds the arithmetic of one row.) A row without
keys gives 0. Shaw et al.'s terms have their own step,
:meth:`~fairseq_localness.modules.relative_position.RelativePositions.step_attention`.
"""
from typing import Optional

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
