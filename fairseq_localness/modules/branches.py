"""Masked branches: windows and directions over real token positions (the bias/mask tier of the README's "Architecture").

Shape notation as in :mod:`.attention`. Every mask is a function of the distance
``j - i`` between real query and key positions (described as a
:class:`~.scores.Window`, the mask function of the kernels), returns a boolean tensor
with True where the key is *blocked*, and can :meth:`~WindowBranch.materialize` a small matrix
for tests and documentation. In self-attention the distance is taken between indices
(equal to the real-position distance for every row that is used, see
:func:`~.context.distance_table`), so a mask is built once per ``(Tq, Tk)`` and
device and reused.

The one class :class:`WindowBranch` keeps the keys with ``-left <= j - i <= right``;
``None`` means unbounded. It covers

===================  ==============  ===============================================
branch               (left, right)   source
===================  ==============  ===============================================
global               (None, None)    Vaswani et al. 2017
local, band m        (m, m)          Xu et al. 2019, eq. 3: ``|i - j| <= m``
forward              (None, 0)       Song et al. 2019, eq. 9: ``j <= i``
backward             (0, None)       Song et al. 2019, eq. 10: ``j >= i``
local k              (k, k)          Song et al. 2019, eq. 11 (encoder)
causal local k       (k, 0)          Song et al. 2019, eq. 11 ``M_d``: ``i-k <= j <= i``
===================  ==============  ===============================================

In decoder self-attention the core adds the causal mask on top, so (m, m) there
means ``i - m <= j <= i``.
"""
from typing import Optional

import torch
from torch import Tensor

from fairseq_localness.modules.context import AttentionBranch, AttentionContext, dense_mask_and_bias
from fairseq_localness.modules.scores import Description, Window


class WindowBranch(AttentionBranch):
    """Keep keys with ``-left <= j - i <= right`` (real positions).

    Example, ``WindowBranch(1, 1, "local").materialize(4, 4)`` (1 = blocked)::

        [[0, 0, 1, 1],
         [0, 0, 0, 1],
         [1, 0, 0, 0],
         [1, 1, 0, 0]]
    """

    window_alone = True

    def __init__(self, left: Optional[int], right: Optional[int], name: str):
        super().__init__()
        for side, value in (("left", left), ("right", right)):
            if value is not None and value < 0:
                raise ValueError(f"window {side} extent must be >= 0 (got {value})")
        self.left = left
        self.right = right
        self.name = name

    def extra_repr(self) -> str:
        return f"name={self.name}, left={self.left}, right={self.right}"

    def blocked_by_distance(self, distance: Tensor) -> Optional[Tensor]:
        """``distance`` = j - i (any shape) -> True where blocked, or None if nothing is."""
        return Window(self.left, self.right).blocked(distance)

    def describe(self, ctx: AttentionContext) -> Description:
        """The mask function ``-left <= j - i <= right`` (a :class:`~.scores.Window`) in
        self-attention, where index distances are the real-position distances it is
        defined on (:func:`~.context.distance_table`); elsewhere the mask over real
        positions, given whole (``B' x 1 x Tq x Tk``; None for the global branch)."""
        if ctx.self_attention:
            return Description(window=Window(self.left, self.right))
        if self.left is None and self.right is None:
            return Description()
        return Description(mask=self.blocked_by_distance(ctx.relative_distance()))

    def mask(self, ctx: AttentionContext) -> Optional[Tensor]:
        """The dense mask of :meth:`describe`: in self-attention ``1 x 1 x Tq x Tk``, a
        view of the table cached per ``(left, right, device)``."""
        return dense_mask_and_bias(ctx, self.describe(ctx), None)[0]

    @torch.no_grad()
    def materialize(self, tgt_len: int, src_len: Optional[int] = None) -> Tensor:
        """The mask for an unpadded sequence, ``Tq x Tk`` (bottom-right aligned queries)."""
        src_len = tgt_len if src_len is None else src_len
        q_pos = torch.arange(src_len - tgt_len, src_len).unsqueeze(1)
        k_pos = torch.arange(src_len).unsqueeze(0)
        blocked = self.blocked_by_distance(k_pos - q_pos)
        return torch.zeros(tgt_len, src_len, dtype=torch.bool) if blocked is None else blocked


def global_branch() -> WindowBranch:
    return WindowBranch(None, None, "global")


def local_branch(width: int, name: Optional[str] = None) -> WindowBranch:
    """``|i - j| <= width`` (made causal by the core in decoder self-attention)."""
    return WindowBranch(width, width, name or f"local{width}")


def forward_branch() -> WindowBranch:
    return WindowBranch(None, 0, "forward")


def backward_branch() -> WindowBranch:
    return WindowBranch(0, None, "backward")
