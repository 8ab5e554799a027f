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
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fairseq_localness.modules.context import one_row_softmax
from fairseq_localness.modules.scores import Window


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


# (lefts, device) -> L x N: 0 where window b keeps the key, -inf before its window; the
# keys right-aligned (key j of Tk is column N - Tk + j): see _window_rows
_WINDOW_ROWS: Dict[Tuple[Tuple[Optional[int], ...], torch.device], Tensor] = {}
_WINDOW_ROWS_MIN = 64


def _window_rows(lefts: Sequence[Optional[int]], src_len: int, device) -> Tensor:
    """``L x Tk``: row b is 0 over the last ``lefts[b] + 1`` keys (all for None) and
    -inf before them (:class:`~fairseq_localness.modules.scores.Window` ``(lefts[b],
    None)`` seen from the last key); a view of a table cached per ``(lefts, device)`` and grown by
    doubling, so a step adds it to its energies (one broadcast addition) instead of
    copying them per window and filling each window's blocked keys."""
    key = (tuple(lefts), torch.device(device))
    table = _WINDOW_ROWS.get(key)
    if table is None or table.size(1) < src_len:
        size = max(src_len, _WINDOW_ROWS_MIN, 2 * table.size(1) if table is not None else 0)
        # built outside inference mode, so that a table made during generation can be
        # used by a later pass with gradients
        with torch.inference_mode(False), torch.no_grad():
            distance = torch.arange(1 - size, 1, device=device)  # j - i of column m to the last key i
            table = torch.zeros(len(lefts), size, device=device)
            for row, left in enumerate(lefts):
                blocked = Window(left, None).blocked(distance)
                if blocked is not None:
                    table[row].masked_fill_(blocked, float("-inf"))
        _WINDOW_ROWS[key] = table
    return table[:, table.size(1) - src_len :]


def last_keys_windows(
    q: Tensor, k: Tensor, v: Tensor, scale: float, key_padding_mask: Optional[Tensor], lefts: Sequence[Optional[int]]
) -> Tensor:
    """:func:`last_keys_attention` for L windows at once, window ``b`` over the last
    ``lefts[b] + 1`` keys (all for None): the energies of the row once, one row per
    window (the keys before its window at -inf, :func:`_window_rows`), one float32
    softmax and one product for all. Returns ``B x H x L x 1 x Dh`` in ``v``'s dtype
    (branch outputs on dim 2, as :class:`~fairseq_localness.modules.fusion.BranchOutputs`
    takes them)."""
    energies = heads_bmm(q, k.transpose(-1, -2)) * scale  # B x H x 1 x Tk
    rows = energies + _window_rows(lefts, k.size(2), energies.device)  # B x H x L x Tk (at least float32)
    probs = one_row_softmax(rows, key_padding_mask)
    return heads_bmm(probs.to(v.dtype), v).unsqueeze(3)
